//! Stage 2: from the file model to a validated [`Config`].

mod delegation;
mod env;
mod pricing;
mod server;
mod triggers;

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::de::DeserializeOwned;

use crate::env_file::{EnvFile, EnvVars, LoadOptions};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::files::{self, FileProblem};
use crate::guards::{Budgets, TenantSpec};
use crate::model::{
    AgentSpec, ArtifactsBackend, EventsBackend, LoomConfig, McpServerSpec, McpTransport, ModelSpec,
    Profile, Sdk, ToolOverrides, ToolRef,
};
use crate::prompt;
use crate::yaml::{self, KeyPath, Kind, Loc, Node, ParseError};

/// Where the root document comes from.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    /// The config file (possibly virtual, for strings and Rust values).
    pub(crate) file: PathBuf,
    /// How the config file is shown in errors.
    pub(crate) display: PathBuf,
    /// Directory relative paths resolve against.
    pub(crate) base_dir: PathBuf,
}

/// One YAML document and the name shown in its errors.
#[derive(Debug, Clone)]
struct Doc {
    display: PathBuf,
    tree: Node,
}

fn make_error(
    file: &Path,
    loc: Option<Loc>,
    path: &KeyPath,
    kind: ConfigErrorKind,
    message: impl Into<String>,
) -> ConfigError {
    ConfigError {
        file: file.to_path_buf(),
        line: loc.map(|l| l.line),
        column: loc.map(|l| l.column),
        key_path: path.to_string(),
        message: message.into(),
        kind,
    }
}

impl Doc {
    /// An error located at the value under `path` (or its deepest existing ancestor).
    fn error(
        &self,
        path: &KeyPath,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        make_error(
            &self.display,
            self.tree.locate(path, false),
            path,
            kind,
            message,
        )
    }

    /// An error located at the key of the last segment of `path`.
    fn key_error(
        &self,
        path: &KeyPath,
        kind: ConfigErrorKind,
        message: impl Into<String>,
    ) -> ConfigError {
        make_error(
            &self.display,
            self.tree.locate(path, true),
            path,
            kind,
            message,
        )
    }

    /// Parses YAML text into a document.
    fn parse(text: &str, display: PathBuf) -> Result<Doc, ConfigError> {
        match yaml::parse(text) {
            Ok(tree) => Ok(Doc { display, tree }),
            Err(ParseError::Syntax { message, loc }) => Err(make_error(
                &display,
                loc,
                &KeyPath::root(),
                ConfigErrorKind::Syntax,
                message,
            )),
            Err(ParseError::Duplicate {
                path,
                key,
                first,
                second,
            }) => {
                let lines = match (first, second) {
                    (Some(a), Some(b)) => format!(" (lines {} and {})", a.line, b.line),
                    _ => String::new(),
                };
                Err(make_error(
                    &display,
                    second,
                    &path,
                    ConfigErrorKind::DuplicateKey,
                    format!(
                        "key '{key}' given twice in the same mapping{lines}: the second would silently override the first"
                    ),
                ))
            }
        }
    }

    /// Deserializes the whole document into the typed file model.
    fn typed<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
        if self.tree.kind == Kind::Null {
            return Err(make_error(
                &self.display,
                None,
                &KeyPath::root(),
                ConfigErrorKind::Invalid,
                "empty document (expected a mapping)",
            ));
        }
        let value = self.tree.to_json();
        serde_path_to_error::deserialize(value).map_err(|err| {
            let path = KeyPath::from_serde(err.path());
            let text = err.inner().to_string();
            self.serde_error(path, &text)
        })
    }

    /// Turns a serde message into a located error with our wording.
    ///
    /// serde reports no structured error kinds, so its message is rephrased here; the
    /// resulting [`ConfigError`] carries a [`ConfigErrorKind`] that callers match on.
    fn serde_error(&self, path: KeyPath, text: &str) -> ConfigError {
        let ticked: Vec<&str> = text.split('`').skip(1).step_by(2).collect();
        if text.starts_with("unknown field `") {
            let field = ticked.first().copied().unwrap_or_default();
            // serde_path_to_error stops at the struct holding the unknown key.
            let path = match path.0.last() {
                Some(yaml::Seg::Key(k)) if k == field => path,
                _ => path.key(field),
            };
            let expected = if ticked.len() > 1 {
                format!(" (expected one of: {})", ticked[1..].join(", "))
            } else {
                String::new()
            };
            return self.key_error(
                &path,
                ConfigErrorKind::UnknownKey,
                format!("unknown key '{field}'{expected}{}", not_yet(&path, field)),
            );
        }
        if text.starts_with("missing field `") {
            let field = ticked.first().copied().unwrap_or_default();
            let loc = self.tree.locate(&path, false);
            return make_error(
                &self.display,
                loc,
                &path.key(field),
                ConfigErrorKind::Invalid,
                format!("missing required key '{field}'"),
            );
        }
        if text.starts_with("duplicate field `") {
            let field = ticked.first().copied().unwrap_or_default();
            return self.error(
                &path,
                ConfigErrorKind::DuplicateKey,
                format!("key '{field}' given twice (directly or through its alias)"),
            );
        }
        if text.starts_with("unknown variant `") {
            let value = ticked.first().copied().unwrap_or_default();
            return self.error(
                &path,
                ConfigErrorKind::Invalid,
                format!(
                    "unknown value '{value}' (expected one of: {}){}",
                    ticked[1.min(ticked.len())..].join(", "),
                    not_yet_value(&path, value)
                ),
            );
        }
        self.error(&path, ConfigErrorKind::Invalid, text)
    }
}

/// Per-agent bookkeeping: where it was declared and its system prompt.
#[derive(Debug, Clone)]
struct AgentMeta {
    /// Index into [`Config::docs`] (0: the config file).
    doc: usize,
    /// Key path of the agent inside its document (`agents[2]` for inline agents).
    prefix: KeyPath,
    /// System prompt template text.
    system: String,
    /// Prompt file (display path) when the prompt comes from `system_file`.
    system_file: Option<PathBuf>,
    /// System prompts of the agent's roles, in the order of `roles`.
    roles: Vec<RolePrompt>,
}

/// The system prompt of a role: template text, and its file when read from `system_file`.
#[derive(Debug, Clone)]
struct RolePrompt {
    system: String,
    system_file: Option<PathBuf>,
}

/// A loaded and validated configuration.
///
/// Built by [`crate::load`], [`crate::from_yaml_str`] or [`Config::new`]; every rule of the
/// format has been checked, every prompt file read and every template analysed.
#[derive(Debug, Clone)]
pub struct Config {
    raw: LoomConfig,
    file: PathBuf,
    base_dir: PathBuf,
    agents_dir: PathBuf,
    prompts_dir: PathBuf,
    docs: Vec<Doc>,
    agents: Vec<AgentSpec>,
    meta: Vec<AgentMeta>,
    warnings: Vec<String>,
    env_file: EnvVars,
}

/// A tenant that the configuration does not declare (see [`Config::check_tenant`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", unknown_tenant_message(.tenant, .declared))]
pub struct UnknownTenant {
    /// The tenant asked for.
    pub tenant: String,
    /// The declared tenant ids (empty without a `tenants` list: then only `default` exists).
    pub declared: Vec<String>,
}

fn unknown_tenant_message(tenant: &str, declared: &[String]) -> String {
    if declared.is_empty() {
        format!(
            "tenant '{tenant}' is not declared (without a 'tenants' list, only 'default' exists)"
        )
    } else {
        format!(
            "tenant '{tenant}' is not declared (tenants: {})",
            declared.join(", ")
        )
    }
}

/// The tenant that exists when no `tenants` list is declared.
pub const DEFAULT_TENANT: &str = "default";

impl Config {
    /// Validates a configuration built in Rust, exactly as if it had been read from
    /// `base_dir/loom.yaml` (agent files in `agents_dir` and prompt files are read too; the
    /// profile is `raw.profile`, `LOOM_PROFILE` is not consulted). Errors carry no line or
    /// column and name the file `loom.yaml`.
    pub fn new(raw: LoomConfig, base_dir: PathBuf) -> Result<Config, ConfigError> {
        let base_dir = normalize_base(base_dir);
        let origin = Origin {
            file: base_dir.join("loom.yaml"),
            display: PathBuf::from("loom.yaml"),
            base_dir,
        };
        let value = serde_json::to_value(&raw).map_err(|err| {
            make_error(
                &origin.display,
                None,
                &KeyPath::root(),
                ConfigErrorKind::Invalid,
                err.to_string(),
            )
        })?;
        build(Node::from_json(&value), origin, None, None, &|_| None)
    }

    /// The config file (`base_dir/loom.yaml` for configurations not read from a file).
    pub fn file(&self) -> &Path {
        &self.file
    }

    /// The directory relative paths resolve against (the config file's directory).
    pub fn base_dir(&self) -> &Path {
        &self.base_dir
    }

    /// The env file read with the configuration and its variables ([`EnvFile`]): a
    /// variable of the process environment wins over the file's.
    pub fn env_file(&self) -> &EnvVars {
        &self.env_file
    }

    /// The active profile, if any.
    pub fn profile(&self) -> Option<Profile> {
        self.raw.profile
    }

    /// The file model after the profile merge (`profile` set to the active profile; `agents`
    /// holds the inline agents only, see [`Config::agents`] for all of them).
    pub fn raw(&self) -> &LoomConfig {
        &self.raw
    }

    /// All agents: those of `agents_dir` (sorted by file name), then the inline ones.
    ///
    /// Loading fills in what their files leave implicit: the content of every output contract's
    /// `schema_file` is in its `schema`, and judges, policies and sub-agents have their default
    /// `name` (and sub-agents their default `description`) set.
    pub fn agents(&self) -> &[AgentSpec] {
        &self.agents
    }

    /// The agent called `name`.
    pub fn agent(&self, name: &str) -> Option<&AgentSpec> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// The model whose id is `id`.
    pub fn model(&self, id: &str) -> Option<&ModelSpec> {
        self.raw.models.iter().find(|m| m.id == id)
    }

    /// The agents directory, resolved against [`Config::base_dir`].
    pub fn agents_dir(&self) -> &Path {
        &self.agents_dir
    }

    /// The prompts directory, resolved against [`Config::base_dir`].
    pub fn prompts_dir(&self) -> &Path {
        &self.prompts_dir
    }

    /// The journal's location, resolved: the directory of a `jsonl` journal, the database file of
    /// a `sqlite` one (`None` for `memory`).
    pub fn events_path(&self) -> Option<PathBuf> {
        let events = &self.raw.storage.events;
        match events.backend {
            EventsBackend::Jsonl | EventsBackend::Sqlite => {
                events.path.as_ref().map(|p| self.base_dir.join(p))
            }
            EventsBackend::Memory => None,
        }
    }

    /// The idempotency database file, resolved: `storage.idempotency.path`, else the `sqlite`
    /// journal's file; `None` without `storage.idempotency` (or without a usable path).
    pub fn idempotency_path(&self) -> Option<PathBuf> {
        let idempotency = self.raw.storage.idempotency.as_ref()?;
        match &idempotency.path {
            Some(path) => Some(self.base_dir.join(path)),
            None if self.raw.storage.events.backend == EventsBackend::Sqlite => self.events_path(),
            None => None,
        }
    }

    /// The artifact directory, resolved, when artifacts are kept in files: `storage.artifacts.path`
    /// for the `local` backend, else `<journal dir>/.artifacts` beside a `jsonl` journal and
    /// `<directory of the database>/.artifacts` beside a `sqlite` one.
    pub fn artifacts_path(&self) -> Option<PathBuf> {
        let artifacts = &self.raw.storage.artifacts;
        match (artifacts.backend, &artifacts.path) {
            (Some(ArtifactsBackend::Memory), _) => None,
            (_, Some(path)) => Some(self.base_dir.join(path)),
            (Some(ArtifactsBackend::Local), None) | (None, None) => {
                let events = self.events_path()?;
                match self.raw.storage.events.backend {
                    EventsBackend::Sqlite => events
                        .parent()
                        .map(|dir| dir.join(".artifacts"))
                        .or_else(|| Some(PathBuf::from(".artifacts"))),
                    _ => Some(events.join(".artifacts")),
                }
            }
        }
    }

    /// The folders a `file://` attachment given over MCP must be in (`server.mcp.file_roots`),
    /// resolved against [`Config::base_dir`].
    pub fn mcp_file_roots(&self) -> Vec<PathBuf> {
        self.raw
            .server
            .mcp
            .file_roots
            .iter()
            .map(|root| self.base_dir.join(root))
            .collect()
    }

    /// The MCP server called `name`.
    pub fn mcp_server(&self, name: &str) -> Option<&McpServerSpec> {
        self.raw.mcp_servers.iter().find(|m| m.name == name)
    }

    /// The raw system prompt template of `agent` (file content or inline text).
    pub fn system_prompt(&self, agent: &str) -> Option<&str> {
        self.index_of(agent).map(|i| self.meta[i].system.as_str())
    }

    /// Renders the system prompt of `agent` for `tenant` (strict: an undefined variable is
    /// an error, although load-time checks already refuse unknown variables).
    pub fn render_system(&self, agent: &str, tenant: &str) -> Result<String, ConfigError> {
        let Some(i) = self.index_of(agent) else {
            return Err(make_error(
                &self.docs[0].display,
                None,
                &KeyPath::root(),
                ConfigErrorKind::Reference,
                format!("unknown agent '{agent}'"),
            ));
        };
        let meta = &self.meta[i];
        prompt::render(&meta.system, agent, tenant).map_err(|issue| {
            self.template_error_at(
                i,
                &KeyPath::root().key("main"),
                meta.system_file.as_deref(),
                issue,
            )
        })
    }

    /// Warnings found at load: located messages (`file:line:col key.path: message`) about
    /// setups that work but are doubtful, such as a judge on the model it judges or a money
    /// budget over a model without `pricing` (errors under the `prod` profile).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The tenant `id`, when the configuration declares a `tenants` list holding it.
    pub fn tenant(&self, id: &str) -> Option<&TenantSpec> {
        self.raw.tenants.iter().find(|t| t.id == id)
    }

    /// Whether runs may be opened for tenant `id`: without a `tenants` list only
    /// [`DEFAULT_TENANT`] exists; with one, the list is closed.
    pub fn check_tenant(&self, id: &str) -> Result<(), UnknownTenant> {
        let known = if self.raw.tenants.is_empty() {
            id == DEFAULT_TENANT
        } else {
            self.tenant(id).is_some()
        };
        if known {
            Ok(())
        } else {
            Err(UnknownTenant {
                tenant: id.to_owned(),
                declared: self.raw.tenants.iter().map(|t| t.id.clone()).collect(),
            })
        }
    }

    /// The budgets of `agent`: its `budget` merged key by key over the root `budgets` (the
    /// root ones alone for an unknown agent).
    pub fn effective_budgets(&self, agent: &str) -> Budgets {
        match self.agent(agent).and_then(|a| a.budget.as_ref()) {
            Some(own) => self.raw.budgets.overlay(own),
            None => self.raw.budgets.clone(),
        }
    }

    /// The budgets of `agent` run for `tenant`: the root `budgets`, then the tenant's
    /// `budgets`, then the agent's `budget`, each merged key by key over the previous ones (the
    /// most specific wins). An undeclared tenant adds nothing: check it first with
    /// [`Config::check_tenant`].
    pub fn effective_budgets_for(&self, agent: &str, tenant: &str) -> Budgets {
        let mut budgets = self.raw.budgets.clone();
        if let Some(own) = self.tenant(tenant).and_then(|t| t.budgets.as_ref()) {
            budgets = budgets.overlay(own);
        }
        if let Some(own) = self.agent(agent).and_then(|a| a.budget.as_ref()) {
            budgets = budgets.overlay(own);
        }
        budgets
    }

    /// The raw system prompt template of role `role` of `agent` (file content or inline text).
    pub fn role_system_prompt(&self, agent: &str, role: &str) -> Option<&str> {
        let (i, r) = self.role_index(agent, role)?;
        Some(self.meta[i].roles[r].system.as_str())
    }

    /// Renders the system prompt of role `role` of `agent` for `tenant` (same variables and
    /// strictness as [`Config::render_system`]).
    pub fn render_role_system(
        &self,
        agent: &str,
        role: &str,
        tenant: &str,
    ) -> Result<String, ConfigError> {
        let Some((i, r)) = self.role_index(agent, role) else {
            return Err(self.unknown_role(agent, role));
        };
        let prompt = &self.meta[i].roles[r];
        prompt::render(&prompt.system, agent, tenant).map_err(|issue| {
            self.template_error_at(
                i,
                &KeyPath::root().key("roles").index(r),
                prompt.system_file.as_deref(),
                issue,
            )
        })
    }

    /// Renders the `input_template` of role `role` of `agent` with `args` (the call's
    /// arguments) and `context` (a JSON object holding the declared context items, e.g.
    /// `{"user_input": "…", "tool_results": {"lookup": […]}}`); `None` when the role has no
    /// template. Strict: a variable missing from `args` or `context` is an error.
    pub fn render_role_input(
        &self,
        agent: &str,
        role: &str,
        args: &serde_json::Value,
        context: &serde_json::Value,
    ) -> Result<Option<String>, ConfigError> {
        let Some((i, r)) = self.role_index(agent, role) else {
            return Err(self.unknown_role(agent, role));
        };
        let Some(template) = &self.agents[i].roles[r].input_template else {
            return Ok(None);
        };
        prompt::render_input(template, args, context)
            .map(Some)
            .map_err(|issue| {
                let path = self.meta[i]
                    .prefix
                    .key("roles")
                    .index(r)
                    .key("input_template");
                self.docs[self.meta[i].doc].error(&path, ConfigErrorKind::Template, issue.message)
            })
    }

    fn role_index(&self, agent: &str, role: &str) -> Option<(usize, usize)> {
        let i = self.index_of(agent)?;
        let r = self.agents[i].roles.iter().position(|x| x.name == role)?;
        Some((i, r))
    }

    fn unknown_role(&self, agent: &str, role: &str) -> ConfigError {
        let message = if self.index_of(agent).is_some() {
            format!("agent '{agent}' has no role '{role}'")
        } else {
            format!("unknown agent '{agent}'")
        };
        make_error(
            &self.docs[0].display,
            None,
            &KeyPath::root(),
            ConfigErrorKind::Reference,
            message,
        )
    }

    /// An error located in `agent`'s declaration at `key_path` (like `tools[0].tool`,
    /// relative to the agent): in its agent file, or in the config file for an inline agent
    /// (the key path then starts with `agents[i]`). Falls back to the nearest existing
    /// ancestor's location, or to no location for an unknown agent. The kind is
    /// [`ConfigErrorKind::Reference`]: this is how the facade reports unresolved tools.
    pub fn error_at_agent(
        &self,
        agent: &str,
        key_path: &str,
        message: impl Into<String>,
    ) -> ConfigError {
        let rel = KeyPath::parse(key_path);
        match self.index_of(agent) {
            Some(i) => {
                let meta = &self.meta[i];
                self.docs[meta.doc].error(
                    &meta.prefix.join(&rel),
                    ConfigErrorKind::Reference,
                    message,
                )
            }
            None => make_error(
                &self.docs[0].display,
                None,
                &rel,
                ConfigErrorKind::Reference,
                message,
            ),
        }
    }

    /// An error located in the root config file at `key_path` (like `models[0].sdk`), for
    /// rules the facade checks (model adapters available in this build, fake-model scripts).
    /// Falls back to the nearest existing ancestor's location.
    pub fn error_at_root(&self, key_path: &str, message: impl Into<String>) -> ConfigError {
        self.docs[0].error(&KeyPath::parse(key_path), ConfigErrorKind::Invalid, message)
    }

    fn index_of(&self, agent: &str) -> Option<usize> {
        self.agents.iter().position(|a| a.name == agent)
    }

    /// A template error of the system prompt of `role` (`main` or `roles[r]`, relative to
    /// agent `i`): inside the prompt file when there is one, else at the inline `system`.
    fn template_error_at(
        &self,
        i: usize,
        role: &KeyPath,
        system_file: Option<&Path>,
        issue: prompt::TemplateIssue,
    ) -> ConfigError {
        let meta = &self.meta[i];
        let doc = &self.docs[meta.doc];
        let role = meta.prefix.join(role);
        match system_file {
            Some(file) => {
                let loc = issue.line.map(|line| Loc {
                    line,
                    column: issue.column.unwrap_or(1),
                });
                make_error(
                    file,
                    loc,
                    &role.key("system_file"),
                    ConfigErrorKind::Template,
                    issue.message,
                )
            }
            None => doc.error(
                &role.key("system"),
                ConfigErrorKind::Template,
                issue.message,
            ),
        }
    }
}

/// `""` (the parent of a bare file name) becomes `.`.
pub(crate) fn normalize_base(base: PathBuf) -> PathBuf {
    if base.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base
    }
}

/// Shows `path` relative to `base` when inside it.
fn display_path(base: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix(base) {
        Ok(rel) if !rel.as_os_str().is_empty() => rel.to_path_buf(),
        _ => path.to_path_buf(),
    }
}

/// Loads from YAML text.
pub(crate) fn build_from_text(
    text: &str,
    origin: Origin,
    options: &LoadOptions,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let doc = Doc::parse(text, origin.display.clone())?;
    build(
        doc.tree,
        origin,
        options.profile,
        Some(&options.env_file),
        env,
    )
}

/// The whole pipeline after parsing: env file, profile, typed model, agents, prompts, rules.
/// `env_file` `None` reads only the file `env_file:` names (a configuration built in Rust).
fn build(
    root: Node,
    origin: Origin,
    override_profile: Option<Profile>,
    env_file: Option<&EnvFile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigError> {
    let mut doc = Doc {
        display: origin.display.clone(),
        tree: root,
    };
    let env_vars = env::read_env_file(&doc, &origin.base_dir, env_file, env)?;
    // The environment wins over the env file.
    let env = |name: &str| env(name).or_else(|| env_vars.get(name).map(str::to_owned));
    let profile = select_profile(&doc, override_profile, &env)?;
    if let Some(profile) = profile {
        apply_profile(&mut doc, profile)?;
    }
    check_version(&doc)?;
    let mut raw: LoomConfig = doc.typed()?;
    if raw.version != 1 {
        return Err(doc.error(
            &KeyPath::root().key("version"),
            ConfigErrorKind::Invalid,
            format!("unsupported config version {} (expected 1)", raw.version),
        ));
    }
    check_models(&doc, &raw)?;
    check_sections(&doc, &raw)?;
    check_mcp_servers(&doc, &mut raw, &origin.base_dir)?;
    delegation::check_budgets(&doc, &KeyPath::root().key("budgets"), &raw.budgets)?;

    let base = origin.base_dir.clone();
    let agents_dir = base.join(&raw.agents_dir);
    let prompts_dir = base.join(&raw.prompts_dir);

    let mut docs = vec![doc];
    let mut agents = Vec::new();
    let mut meta = Vec::new();
    for path in agent_files(&docs[0], &base, &agents_dir)? {
        let display = display_path(&base, &path);
        let text = files::read_under(&agents_dir, &files::inside(&agents_dir, &path)).map_err(
            |problem| {
                let (kind, message) = match problem {
                    FileProblem::Io(err) => (
                        ConfigErrorKind::Io,
                        format!("cannot read agent file: {err}"),
                    ),
                    problem => (
                        ConfigErrorKind::Invalid,
                        format!(
                            "agent file: {problem}; an agent file is a regular file of at most \
                             1 MiB under agents_dir"
                        ),
                    ),
                };
                make_error(&display, None, &KeyPath::root(), kind, message)
            },
        )?;
        let doc = Doc::parse(&text, display)?;
        let spec: AgentSpec = doc.typed()?;
        docs.push(doc);
        agents.push(spec);
        meta.push(AgentMeta {
            doc: docs.len() - 1,
            prefix: KeyPath::root(),
            system: String::new(),
            system_file: None,
            roles: Vec::new(),
        });
    }
    for (i, spec) in raw.agents.iter().enumerate() {
        agents.push(spec.clone());
        meta.push(AgentMeta {
            doc: 0,
            prefix: KeyPath::root().key("agents").index(i),
            system: String::new(),
            system_file: None,
            roles: Vec::new(),
        });
    }

    let mut config = Config {
        raw,
        file: origin.file,
        base_dir: base,
        agents_dir,
        prompts_dir,
        docs,
        agents,
        meta,
        warnings: Vec::new(),
        env_file: env_vars,
    };
    delegation::check_tenants(&config)?;
    for i in 0..config.agents.len() {
        check_agent(&mut config, i)?;
    }
    pricing::check_money_budgets(&mut config)?;
    delegation::check_security(&config)?;
    triggers::check_triggers(&config)?;
    Ok(config)
}

fn select_profile(
    doc: &Doc,
    override_profile: Option<Profile>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Profile>, ConfigError> {
    if let Some(profile) = override_profile {
        return Ok(Some(profile));
    }
    let path = KeyPath::root().key("profile");
    if let Some(value) = env("LOOM_PROFILE") {
        let value = value.trim();
        if !value.is_empty() {
            return value.parse().map(Some).map_err(|msg: String| {
                make_error(
                    &doc.display,
                    None,
                    &path,
                    ConfigErrorKind::Reference,
                    format!("{msg}, from LOOM_PROFILE"),
                )
            });
        }
    }
    match doc.tree.get("profile").map(|n| &n.kind) {
        Some(Kind::Str(name)) => name
            .parse()
            .map(Some)
            .map_err(|msg: String| doc.error(&path, ConfigErrorKind::Reference, msg)),
        // Null or absent: no profile; another type is reported by the typed stage.
        _ => Ok(None),
    }
}

/// Deep-merges `profiles.<profile>` over the root and records the active profile.
fn apply_profile(doc: &mut Doc, profile: Profile) -> Result<(), ConfigError> {
    let over = doc
        .tree
        .get("profiles")
        .and_then(|p| p.get(profile.as_str()))
        .cloned();
    if let Some(over) = over
        && let Kind::Map(entries) = &over.kind
    {
        for (key, _) in entries {
            if key.name == "profile" || key.name == "profiles" {
                let path = KeyPath::root()
                    .key("profiles")
                    .key(profile.as_str())
                    .key(&key.name);
                return Err(doc.key_error(
                    &path,
                    ConfigErrorKind::Invalid,
                    format!("'{}' cannot be set inside a profile", key.name),
                ));
            }
        }
        yaml::merge(&mut doc.tree, &over);
    }
    if let Kind::Map(entries) = &mut doc.tree.kind {
        let value = Kind::Str(profile.as_str().to_owned());
        match entries.iter_mut().find(|(k, _)| k.name == "profile") {
            Some((_, node)) => node.kind = value,
            None => entries.push((
                yaml::Key {
                    name: "profile".to_owned(),
                    loc: None,
                },
                Node::bare(value),
            )),
        }
    }
    Ok(())
}

/// `version` is checked before the rest, so that a newer file gets a clear message.
fn check_version(doc: &Doc) -> Result<(), ConfigError> {
    let version = match doc.tree.get("version").map(|n| &n.kind) {
        Some(Kind::UInt(v)) => i128::from(*v),
        Some(Kind::Int(v)) => i128::from(*v),
        _ => return Ok(()),
    };
    if version == 1 {
        return Ok(());
    }
    Err(doc.error(
        &KeyPath::root().key("version"),
        ConfigErrorKind::Invalid,
        format!("unsupported config version {version} (expected 1)"),
    ))
}

const NOT_POSITIVE: &str = "must be greater than 0";

fn positive_seconds(value: Option<f64>) -> bool {
    value.is_none_or(|v| v > 0.0 && v.is_finite())
}

fn check_models(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    for (i, model) in raw.models.iter().enumerate() {
        let p = KeyPath::root().key("models").index(i);
        if model.id.is_empty() {
            return Err(invalid(&p.key("id"), "must not be empty".into()));
        }
        if let Some(j) = raw.models[..i].iter().position(|m| m.id == model.id) {
            return Err(invalid(
                &p.key("id"),
                format!(
                    "duplicate model id '{}' (already declared at models[{j}])",
                    model.id
                ),
            ));
        }
        if model.model.is_empty() {
            return Err(invalid(&p.key("model"), "must not be empty".into()));
        }
        if model.api.is_some() && model.sdk != Sdk::Openai {
            return Err(invalid(
                &p.key("api"),
                format!(
                    "'api' is only valid with sdk 'openai' (model '{}' uses sdk '{}')",
                    model.id,
                    model.sdk.as_str()
                ),
            ));
        }
        if model.max_tokens == Some(0) {
            return Err(invalid(&p.key("max_tokens"), NOT_POSITIVE.into()));
        }
        if model.capabilities.context_window == Some(0) {
            return Err(invalid(
                &p.key("capabilities").key("context_window"),
                NOT_POSITIVE.into(),
            ));
        }
        check_pricing(doc, &p.key("pricing"), model)?;
        if model.cache.is_some() && model.sdk != Sdk::Anthropic {
            return Err(invalid(
                &p.key("cache"),
                format!(
                    "'cache' (prompt-cache breakpoints) is only valid with sdk 'anthropic' (model '{}')",
                    model.id
                ),
            ));
        }
        if let Some(ttl) = model.cache.as_ref().and_then(|c| c.ttl.as_deref())
            && ttl != "5m"
            && ttl != "1h"
        {
            return Err(invalid(
                &p.key("cache").key("ttl"),
                format!("unknown cache ttl '{ttl}' (expected 5m or 1h)"),
            ));
        }
        let tp = p.key("timeouts");
        for (key, value) in [
            ("first_token", model.timeouts.first_token),
            ("idle", model.timeouts.idle),
            ("total", model.timeouts.total),
        ] {
            if !positive_seconds(value) {
                return Err(invalid(&tp.key(key), NOT_POSITIVE.into()));
            }
        }
        let rp = p.key("retry");
        let retry = &model.retry;
        if retry.max_attempts == 0 {
            return Err(invalid(&rp.key("max_attempts"), NOT_POSITIVE.into()));
        }
        if !(retry.multiplier.is_finite() && retry.multiplier >= 1.0) {
            return Err(invalid(&rp.key("multiplier"), "must be at least 1".into()));
        }
        for (key, value) in [
            ("initial_delay", retry.initial_delay),
            ("max_delay", retry.max_delay),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(
                    &rp.key(key),
                    "must be a number of seconds, 0 or more".into(),
                ));
            }
        }
        if let Some(breaker) = &model.circuit_breaker {
            if breaker.failures == 0 {
                return Err(invalid(
                    &p.key("circuit_breaker").key("failures"),
                    NOT_POSITIVE.into(),
                ));
            }
            if !(breaker.cooldown.is_finite() && breaker.cooldown > 0.0) {
                return Err(invalid(
                    &p.key("circuit_breaker").key("cooldown"),
                    NOT_POSITIVE.into(),
                ));
            }
        }
    }
    Ok(())
}

fn check_pricing(doc: &Doc, p: &KeyPath, model: &ModelSpec) -> Result<(), ConfigError> {
    let pricing = &model.pricing;
    let bad_rate = |r: f64| r < 0.0 || !r.is_finite();
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let rates = [
        ("input", pricing.input),
        ("output", pricing.output),
        ("cache_read", pricing.cache_read),
        ("cache_write", pricing.cache_write),
    ];
    for (name, rate) in rates {
        if bad_rate(rate) {
            return Err(invalid(
                &p.key(name),
                "prices must be finite and not negative".into(),
            ));
        }
    }
    for (t, tier) in pricing.tiers.iter().enumerate() {
        let tp = p.key("tiers").index(t);
        if tier.above == 0 {
            return Err(invalid(&tp.key("above"), NOT_POSITIVE.into()));
        }
        let rates = [
            ("input", tier.input),
            ("output", tier.output),
            ("cache_read", tier.cache_read),
            ("cache_write", tier.cache_write),
        ];
        for (name, rate) in rates {
            if rate.is_some_and(bad_rate) {
                return Err(invalid(
                    &tp.key(name),
                    "prices must be finite and not negative".into(),
                ));
            }
        }
    }
    if let Err(msg) = pricing.check() {
        // Point at the first tier that breaks the order.
        let at = pricing
            .tiers
            .windows(2)
            .position(|w| w[1].above <= w[0].above)
            .map_or_else(|| p.clone(), |t| p.key("tiers").index(t + 1).key("above"));
        let detail = pricing
            .tiers
            .windows(2)
            .find(|w| w[1].above <= w[0].above)
            .map(|w| format!(" ({} follows {})", w[1].above, w[0].above))
            .unwrap_or_default();
        return Err(invalid(&at, format!("{msg}{detail}")));
    }
    Ok(())
}

fn check_sections(doc: &Doc, raw: &LoomConfig) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    let events = &raw.storage.events;
    let ep = KeyPath::root().key("storage").key("events");
    if events.backend == EventsBackend::Jsonl && events.path.is_none() {
        return Err(invalid(
            &ep.key("backend"),
            "backend 'jsonl' requires 'path' (the journal directory)".into(),
        ));
    }
    if events.backend == EventsBackend::Sqlite && events.path.is_none() {
        return Err(invalid(
            &ep.key("backend"),
            "backend 'sqlite' requires 'path' (the database file)".into(),
        ));
    }
    if !(raw.execution.lease.is_finite() && raw.execution.lease > 0.0) {
        return Err(invalid(
            &KeyPath::root().key("execution").key("lease"),
            NOT_POSITIVE.into(),
        ));
    }
    let shutdown = raw.execution.shutdown_timeout;
    if !(shutdown.is_finite() && shutdown >= 0.0) {
        return Err(invalid(
            &KeyPath::root().key("execution").key("shutdown_timeout"),
            "must be a number of seconds, 0 or more".into(),
        ));
    }
    let tp = KeyPath::root().key("execution").key("tools");
    let tools = &raw.execution.tools;
    if !positive_seconds(tools.timeout) {
        return Err(invalid(&tp.key("timeout"), NOT_POSITIVE.into()));
    }
    if tools.offload_over == Some(0) {
        return Err(invalid(&tp.key("offload_over"), NOT_POSITIVE.into()));
    }
    let ap = KeyPath::root().key("execution").key("attachments");
    let attachments = &raw.execution.attachments;
    if attachments.max_bytes == 0 {
        return Err(invalid(&ap.key("max_bytes"), NOT_POSITIVE.into()));
    }
    for (i, media_type) in attachments.types.iter().enumerate() {
        if !is_media_type(media_type) {
            return Err(invalid(
                &ap.key("types").index(i),
                format!(
                    "'{media_type}' is not a media type (expected type/subtype, e.g. image/png)"
                ),
            ));
        }
        if attachments.types[..i].contains(media_type) {
            return Err(invalid(
                &ap.key("types").index(i),
                format!("media type '{media_type}' is listed twice"),
            ));
        }
    }
    if raw.telemetry.capture.raw_max_bytes == 0 {
        return Err(invalid(
            &KeyPath::root()
                .key("telemetry")
                .key("capture")
                .key("raw_max_bytes"),
            NOT_POSITIVE.into(),
        ));
    }
    let http = &raw.server.http;
    let hp = KeyPath::root().key("server").key("http");
    let usable_prefix = |path: &str| {
        path.starts_with('/') && !path.ends_with('/') && !path.contains(['?', '#', ' '])
    };
    if !http.base_path.is_empty() && !usable_prefix(&http.base_path) {
        return Err(invalid(
            &hp.key("base_path"),
            format!(
                "base_path '{}' must be empty or a path starting with '/' (without a trailing '/')",
                http.base_path
            ),
        ));
    }
    if http.host.trim().is_empty() {
        return Err(invalid(&hp.key("host"), "host must not be empty".into()));
    }
    if http.max_body_bytes == 0 {
        return Err(invalid(&hp.key("max_body_bytes"), NOT_POSITIVE.into()));
    }
    server::check_http_limits(doc, raw)?;
    server::check_mcp_access(doc, raw)?;
    let logging = &raw.telemetry.logging;
    if logging.level().is_none() {
        return Err(invalid(
            &KeyPath::root().key("telemetry").key("logging").key("level"),
            format!(
                "unknown log level '{}' (expected one of: ERROR, WARNING, WARN, INFO, DEBUG, TRACE)",
                logging.level
            ),
        ));
    }
    Ok(())
}

/// The names of the MCP server's control tools: no agent offered over MCP may take them.
pub const MCP_CONTROL_TOOLS: [&str; 3] = ["run_status", "run_report", "cancel"];

/// Whether `text` reads as a media type `type/subtype` (RFC 6838 restricted names, lowercase).
fn is_media_type(text: &str) -> bool {
    let name = |part: &str| {
        part.chars()
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
            && part.len() <= 127
            && part
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "!#$&^_.+-".contains(c))
    };
    text.split_once('/')
        .is_some_and(|(kind, sub)| name(kind) && name(sub))
}

/// Agent files of `agents_dir`, sorted by file name; none when the directory is missing.
fn agent_files(root: &Doc, base: &Path, dir: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir_error = |msg: String| {
        let path = KeyPath::root().key("agents_dir");
        let mut err = root.error(&path, ConfigErrorKind::Io, msg);
        if root.tree.get("agents_dir").is_none() {
            err.line = None;
            err.column = None;
        }
        err
    };
    let shown = display_path(base, dir);
    match fs::metadata(dir) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(dir_error(format!(
                "cannot read agents directory {}: {err}",
                shown.display()
            )));
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(dir_error(format!("{} is not a directory", shown.display())));
        }
        Ok(_) => {}
    }
    let entries = fs::read_dir(dir).map_err(|err| {
        dir_error(format!(
            "cannot read agents directory {}: {err}",
            shown.display()
        ))
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|err| {
            dir_error(format!(
                "cannot read agents directory {}: {err}",
                shown.display()
            ))
        })?;
        let path = entry.path();
        let is_yaml = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| e == "yaml" || e == "yml");
        // Directories are skipped; anything else named *.yaml is read under the rules of
        // `files` (a link out of the folder, a FIFO or a device is refused, not skipped).
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_yaml && !is_dir {
            files.push(path);
        }
    }
    files.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(files)
}

fn valid_agent_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Where an agent was declared, for messages.
fn declared_at(config: &Config, i: usize) -> String {
    let meta = &config.meta[i];
    let doc = &config.docs[meta.doc];
    if meta.prefix.0.is_empty() {
        doc.display.display().to_string()
    } else {
        format!("{} at {}", doc.display.display(), meta.prefix)
    }
}

fn check_agent(config: &mut Config, i: usize) -> Result<(), ConfigError> {
    // Checked on a copy, which receives what loading fills in (schema files, default names).
    let mut spec = config.agents[i].clone();
    let (role_prompts, warnings) = check_agent_spec(config, i, &mut spec)?;
    config.agents[i] = spec;
    config.meta[i].roles = role_prompts;
    config.warnings.extend(warnings);
    Ok(())
}

/// Checks agent `i` (given as `spec`, filled in place); returns its roles' system prompts and
/// the warnings found.
fn check_agent_spec(
    config: &mut Config,
    i: usize,
    spec: &mut AgentSpec,
) -> Result<(Vec<RolePrompt>, Vec<String>), ConfigError> {
    let meta = &config.meta[i];
    let doc = &config.docs[meta.doc];
    let p = &meta.prefix;
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);

    if !valid_agent_name(&spec.name) {
        return Err(invalid(
            &p.key("name"),
            format!(
                "invalid agent name '{}' (expected ^[A-Za-z0-9_-]{{1,64}}$)",
                spec.name
            ),
        ));
    }
    if spec.expose.mcp && MCP_CONTROL_TOOLS.contains(&spec.name.as_str()) {
        return Err(invalid(
            &p.key("name"),
            format!(
                "the agent name '{}' is taken by a control tool of the MCP server ({}): rename \
                 the agent, or keep it off MCP with expose: {{mcp: false}}",
                spec.name,
                MCP_CONTROL_TOOLS.join(", ")
            ),
        ));
    }
    if let Some(j) = config.agents[..i].iter().position(|a| a.name == spec.name) {
        return Err(invalid(
            &p.key("name"),
            format!(
                "duplicate agent name '{}' (already defined in {})",
                spec.name,
                declared_at(config, j)
            ),
        ));
    }
    let main = p.key("main");
    if config.model(&spec.main.model).is_none() {
        let declared: Vec<&str> = config.raw.models.iter().map(|m| m.id.as_str()).collect();
        let declared = if declared.is_empty() {
            "none".to_owned()
        } else {
            declared.join(", ")
        };
        return Err(doc.error(
            &main.key("model"),
            ConfigErrorKind::Reference,
            format!(
                "unknown model '{}' (declared models: {declared})",
                spec.main.model
            ),
        ));
    }
    for (f, fallback) in spec.main.fallbacks.iter().enumerate() {
        let fp = main.key("fallbacks").index(f);
        if config.model(fallback).is_none() {
            return Err(doc.error(
                &fp,
                ConfigErrorKind::Reference,
                format!("unknown model '{fallback}' in the fallback chain"),
            ));
        }
        if *fallback == spec.main.model || spec.main.fallbacks[..f].contains(fallback) {
            return Err(invalid(
                &fp,
                format!("model '{fallback}' appears twice in the chain"),
            ));
        }
    }
    if spec.main.llm.max_tokens == Some(0) {
        return Err(invalid(
            &main.key("llm").key("max_tokens"),
            NOT_POSITIVE.into(),
        ));
    }
    if spec.max_iterations == 0 {
        return Err(invalid(&p.key("max_iterations"), NOT_POSITIVE.into()));
    }
    if !positive_seconds(spec.timeout) {
        return Err(invalid(&p.key("timeout"), NOT_POSITIVE.into()));
    }
    if !positive_seconds(spec.approval.expires_in) {
        return Err(invalid(
            &p.key("approval").key("expires_in"),
            NOT_POSITIVE.into(),
        ));
    }
    let mut prefixes: Vec<String> = Vec::new();
    for (t, tool) in spec.tools.iter_mut().enumerate() {
        let tp = p.key("tools").index(t);
        check_tool_ref(config, doc, &tp, tool, &mut prefixes)?;
    }

    let (system, system_file) = read_system_prompt(
        config,
        doc,
        &main,
        &spec.main.system,
        spec.main.system_file.as_ref(),
    )?;
    let mut warnings = Vec::new();
    let role_prompts = delegation::check_guards(config, i, spec, &mut warnings)?;
    let meta = &mut config.meta[i];
    meta.system = system;
    meta.system_file = system_file;
    if let Err(issue) = prompt::check(&config.meta[i].system) {
        let file = config.meta[i].system_file.clone();
        return Err(config.template_error_at(
            i,
            &KeyPath::root().key("main"),
            file.as_deref(),
            issue,
        ));
    }
    for (r, role) in role_prompts.iter().enumerate() {
        if let Err(issue) = prompt::check(&role.system) {
            return Err(config.template_error_at(
                i,
                &KeyPath::root().key("roles").index(r),
                role.system_file.as_deref(),
                issue,
            ));
        }
    }
    Ok((role_prompts, warnings))
}

/// A system prompt: inline text or a file under `prompts_dir`, never both. `role` is the key
/// path of the role (`main`, `roles[0]`) in `doc`. Returns the text and the file's display path.
fn read_system_prompt(
    config: &Config,
    doc: &Doc,
    role: &KeyPath,
    system: &str,
    system_file: Option<&PathBuf>,
) -> Result<(String, Option<PathBuf>), ConfigError> {
    match system_file {
        Some(_) if !system.is_empty() => Err(doc.error(
            &role.key("system_file"),
            ConfigErrorKind::Invalid,
            "'system' and 'system_file' are mutually exclusive",
        )),
        Some(file) => {
            let full = config.prompts_dir.join(file);
            let shown = display_path(&config.base_dir, &full);
            let at = role.key("system_file");
            match files::read_under(&config.prompts_dir, file) {
                Ok(text) => Ok((text, Some(shown))),
                Err(FileProblem::NotFound) => Err(doc.error(
                    &at,
                    ConfigErrorKind::MissingFile,
                    format!("system prompt file not found: {}", shown.display()),
                )),
                Err(FileProblem::Io(err)) => Err(doc.error(
                    &at,
                    ConfigErrorKind::Io,
                    format!("cannot read system prompt file {}: {err}", shown.display()),
                )),
                Err(problem) => Err(doc.error(
                    &at,
                    ConfigErrorKind::Invalid,
                    format!(
                        "system prompt file {}: {problem}; a prompt file is a regular file of \
                         at most 1 MiB under prompts_dir ({})",
                        shown.display(),
                        display_path(&config.base_dir, &config.prompts_dir).display()
                    ),
                )),
            }
        }
        None => Ok((system.to_owned(), None)),
    }
}

/// Why `approval: policy` is refused on an agent without a policy that can ask a human.
pub const APPROVAL_POLICY: &str = "approval: policy means a policy decides when a human is asked, \
but no policy of the agent is hooked on before_tool with the decision 'pause'; hook one, or use \
always (a human decides every call) or never";

/// Why a key of the Loom-IA format is refused: Rust tools are registered in code, and some
/// sections of the reference are not implemented yet (refused rather than silently ignored).
/// `path` is the key path of the unknown key, `field` its name.
fn not_yet(path: &KeyPath, field: &str) -> &'static str {
    const LATER: &[&str] = &[
        "tool_sources",
        "sessions",
        "stream_output",
        "state",
        "idle_timeout",
    ];
    // Keys of a tenant (`tenants[i]`) that the reference has and Loom does not yet.
    const TENANT_LATER: &[&str] = &[
        "tools_deny",
        "models",
        "approvals",
        "secrets",
        "variables",
        "storage",
        "retention",
        "telemetry",
    ];
    // Keys of `storage` (the Postgres, Redis and RabbitMQ backends, encryption, retention)
    // and of `telemetry` (OpenTelemetry export, redaction) that Loom does not have yet.
    const STORAGE_LATER: &[&str] = &[
        "queue",
        "bus",
        "encryption",
        "retention",
        "dsn_env",
        "url_env",
        "role",
        "pool",
    ];
    const TELEMETRY_LATER: &[&str] = &["exporters", "redaction"];
    let parent = &path.0[..path.0.len().saturating_sub(1)];
    let under = |section: &str| matches!(parent.first(), Some(yaml::Seg::Key(k)) if k == section);
    if (under("storage") && STORAGE_LATER.contains(&field))
        || (under("telemetry") && TELEMETRY_LATER.contains(&field))
    {
        return NOT_YET;
    }
    let in_tenant = matches!(parent, [yaml::Seg::Key(k), yaml::Seg::Index(_)] if k == "tenants");
    let in_main = matches!(parent.last(), Some(yaml::Seg::Key(k)) if k == "main");
    let in_tool = matches!(
        parent,
        [.., yaml::Seg::Key(k), yaml::Seg::Index(_)] if k == "tools"
    );
    if field == "imports" {
        " — Rust has no runtime imports: register tools in code (Loom::register, loom_cli::App::tool)"
    } else if in_tool && field == "judge" {
        " — a tool's results are not judged: judges apply to an agent's answer or a role's; \
give the tool an 'output' contract"
    } else if in_tenant {
        if TENANT_LATER.contains(&field) {
            NOT_YET
        } else {
            ""
        }
    } else if (in_main && field == "context") || LATER.contains(&field) {
        NOT_YET
    } else {
        ""
    }
}

/// Why a key or value of the Loom-IA format is refused: Loom does not have it yet.
const NOT_YET: &str = " — this part of the Loom-IA format is not implemented in this version yet";

/// Why a value of the Loom-IA format is refused (`value` at `path`): the backends of the
/// reference that Loom does not have yet (Postgres, Redis, the journal and memory idempotency
/// stores).
fn not_yet_value(path: &KeyPath, value: &str) -> &'static str {
    let later: &[&str] = match path.to_string().as_str() {
        "storage.events.backend" => &["postgres"],
        "storage.idempotency.backend" => &["journal", "memory", "postgres", "redis"],
        _ => &[],
    };
    if later.contains(&value) { NOT_YET } else { "" }
}

/// The built-in tools an agent may reference with `tool: loom.<name>`.
pub const BUILTIN_TOOLS: &[&str] = &[
    "loom.current_datetime",
    "loom.local_files",
    "loom.fetch_page",
];

fn valid_mcp_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 40
        && !name.contains("__")
        && !name.starts_with('_')
        && !name.ends_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

fn check_mcp_servers(doc: &Doc, raw: &mut LoomConfig, base: &Path) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    for (i, server) in raw.mcp_servers.iter().enumerate() {
        let sp = KeyPath::root().key("mcp_servers").index(i);
        if !valid_mcp_name(&server.name) {
            return Err(invalid(
                &sp.key("name"),
                format!(
                    "invalid MCP server name '{}' (letters, digits, '-', single '_' between them; at most 40)",
                    server.name
                ),
            ));
        }
        if raw.mcp_servers[..i].iter().any(|m| m.name == server.name) {
            return Err(invalid(
                &sp.key("name"),
                format!("duplicate MCP server name '{}'", server.name),
            ));
        }
        match server.transport {
            McpTransport::Stdio => {
                if server
                    .command
                    .as_deref()
                    .is_none_or(|c| c.trim().is_empty())
                {
                    return Err(invalid(
                        &sp.key("transport"),
                        "transport 'stdio' requires 'command'".into(),
                    ));
                }
                if server.url.is_some() {
                    return Err(invalid(
                        &sp.key("url"),
                        "'url' is for transport 'http'".into(),
                    ));
                }
                if !server.headers_env.is_empty() {
                    return Err(invalid(
                        &sp.key("headers_env"),
                        "'headers_env' is for transport 'http'".into(),
                    ));
                }
            }
            McpTransport::Http => {
                let Some(url) = &server.url else {
                    return Err(invalid(
                        &sp.key("transport"),
                        "transport 'http' requires 'url'".into(),
                    ));
                };
                let usable = url::Url::parse(url).is_ok_and(|url| {
                    matches!(url.scheme(), "http" | "https")
                        && url.host_str().is_some_and(|host| !host.is_empty())
                });
                if !usable {
                    return Err(invalid(
                        &sp.key("url"),
                        format!("'{url}' is not an http(s) URL"),
                    ));
                }
                for (key, present) in [
                    ("command", server.command.is_some()),
                    ("args", !server.args.is_empty()),
                    ("env", !server.env.is_empty()),
                    ("env_from", !server.env_from.is_empty()),
                    ("cwd", server.cwd.is_some()),
                ] {
                    if present {
                        return Err(invalid(
                            &sp.key(key),
                            format!("'{key}' is for transport 'stdio'"),
                        ));
                    }
                }
            }
        }
        if !(server.connect_timeout.is_finite() && server.connect_timeout > 0.0) {
            return Err(invalid(&sp.key("connect_timeout"), NOT_POSITIVE.into()));
        }
        if let Some(breaker) = &server.circuit_breaker {
            if breaker.failures == 0 {
                return Err(invalid(
                    &sp.key("circuit_breaker").key("failures"),
                    NOT_POSITIVE.into(),
                ));
            }
            if !(breaker.cooldown.is_finite() && breaker.cooldown > 0.0) {
                return Err(invalid(
                    &sp.key("circuit_breaker").key("cooldown"),
                    NOT_POSITIVE.into(),
                ));
            }
        }
    }
    for (i, server) in raw.mcp_servers.iter_mut().enumerate() {
        let sp = KeyPath::root().key("mcp_servers").index(i);
        for (tool, overrides) in &mut server.tools {
            check_overrides(doc, &sp.key("tools").key(tool), overrides, base)?;
        }
    }
    Ok(())
}

/// Checks the overrides of one tool at `path`, loading the schema file of its `output`
/// contract (relative to `base`).
fn check_overrides(
    doc: &Doc,
    path: &KeyPath,
    overrides: &mut ToolOverrides,
    base: &Path,
) -> Result<(), ConfigError> {
    if let Some(output) = &mut overrides.output {
        delegation::check_output(doc, &path.key("output"), base, output)?;
    }
    if !positive_seconds(overrides.timeout) {
        return Err(doc.error(&path.key("timeout"), ConfigErrorKind::Invalid, NOT_POSITIVE));
    }
    if overrides.offload_over == Some(0) {
        return Err(doc.error(
            &path.key("offload_over"),
            ConfigErrorKind::Invalid,
            NOT_POSITIVE,
        ));
    }
    Ok(())
}

/// Checks a tool reference at `tp`, loading the schema files of its `output` contracts.
fn check_tool_ref(
    config: &Config,
    doc: &Doc,
    tp: &KeyPath,
    tool: &mut ToolRef,
    prefixes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    check_tool_ref_shape(config, doc, tp, tool, prefixes)?;
    if let Some(output) = &mut tool.output {
        delegation::check_output(doc, &tp.key("output"), &config.base_dir, output)?;
    }
    for (name, overrides) in &mut tool.tools {
        check_overrides(doc, &tp.key("tools").key(name), overrides, &config.base_dir)?;
    }
    Ok(())
}

fn check_tool_ref_shape(
    config: &Config,
    doc: &Doc,
    tp: &KeyPath,
    tool: &ToolRef,
    prefixes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    if !positive_seconds(tool.timeout) {
        return Err(invalid(&tp.key("timeout"), NOT_POSITIVE.into()));
    }
    if tool.offload_over == Some(0) {
        return Err(invalid(&tp.key("offload_over"), NOT_POSITIVE.into()));
    }
    match (&tool.tool, &tool.mcp) {
        (Some(_), Some(_)) | (None, None) => Err(invalid(
            tp,
            "a tool reference needs exactly one of 'tool' and 'mcp'".into(),
        )),
        (Some(name), None) => {
            if name.trim().is_empty() {
                return Err(invalid(&tp.key("tool"), "must not be empty".into()));
            }
            for (key, present) in [
                ("alias", tool.alias.is_some()),
                ("include", tool.include.is_some()),
                ("exclude", tool.exclude.is_some()),
                ("required", tool.required),
                ("tools", !tool.tools.is_empty()),
            ] {
                if present {
                    return Err(invalid(
                        &tp.key(key),
                        format!("'{key}' applies to an 'mcp' reference"),
                    ));
                }
            }
            if name.starts_with("loom.") && !BUILTIN_TOOLS.contains(&name.as_str()) {
                return Err(doc.error(
                    &tp.key("tool"),
                    ConfigErrorKind::Reference,
                    format!(
                        "unknown built-in tool '{name}' (built-in tools: {})",
                        BUILTIN_TOOLS.join(", ")
                    ),
                ));
            }
            let local_files = name == "loom.local_files";
            let fetch_page = name == "loom.fetch_page";
            if local_files && tool.folders.as_ref().is_none_or(Vec::is_empty) {
                return Err(invalid(
                    &tp.key("tool"),
                    "loom.local_files needs 'folders' (at least one)".into(),
                ));
            }
            if !local_files && tool.folders.is_some() {
                return Err(invalid(
                    &tp.key("folders"),
                    "'folders' applies to loom.local_files".into(),
                ));
            }
            for (key, present) in [
                ("allow_private", tool.allow_private.is_some()),
                ("max_bytes", tool.max_bytes.is_some()),
            ] {
                if present && !fetch_page {
                    return Err(invalid(
                        &tp.key(key),
                        format!("'{key}' applies to loom.fetch_page"),
                    ));
                }
            }
            if tool.max_bytes == Some(0) {
                return Err(invalid(&tp.key("max_bytes"), NOT_POSITIVE.into()));
            }
            for (f, folder) in tool.folders.iter().flatten().enumerate() {
                let fp = tp.key("folders").index(f);
                let ok = folder.name.len() <= 32
                    && folder
                        .name
                        .bytes()
                        .next()
                        .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                    && folder.name.bytes().all(|b| {
                        b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                    });
                if !ok {
                    return Err(invalid(
                        &fp.key("name"),
                        format!(
                            "invalid folder name '{}' (expected ^[a-z0-9][a-z0-9_-]{{0,31}}$)",
                            folder.name
                        ),
                    ));
                }
                if folder.rights.is_empty() {
                    return Err(invalid(
                        &fp.key("rights"),
                        "at least one right is needed (read, write, overwrite, delete)".into(),
                    ));
                }
                let dir = config.base_dir.join(&folder.path);
                if !dir.is_dir() {
                    return Err(doc.error(
                        &fp.key("path"),
                        ConfigErrorKind::MissingFile,
                        format!(
                            "folder '{}' does not exist: {}",
                            folder.name,
                            display_path(&config.base_dir, &dir).display()
                        ),
                    ));
                }
            }
            Ok(())
        }
        (None, Some(server)) => {
            if config.mcp_server(server).is_none() {
                let declared: Vec<&str> = config
                    .raw
                    .mcp_servers
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect();
                let declared = if declared.is_empty() {
                    "none".to_owned()
                } else {
                    declared.join(", ")
                };
                return Err(doc.error(
                    &tp.key("mcp"),
                    ConfigErrorKind::Reference,
                    format!("unknown MCP server '{server}' (declared servers: {declared})"),
                ));
            }
            for (key, present) in [
                ("description", tool.description.is_some()),
                ("timeout", tool.timeout.is_some()),
                ("side_effects", tool.side_effects.is_some()),
                ("approval", tool.approval.is_some()),
                ("idempotent", tool.idempotent.is_some()),
                ("offload_over", tool.offload_over.is_some()),
                ("folders", tool.folders.is_some()),
                ("allow_private", tool.allow_private.is_some()),
                ("max_bytes", tool.max_bytes.is_some()),
                ("output", tool.output.is_some()),
            ] {
                if present {
                    return Err(invalid(
                        &tp.key(key),
                        format!("'{key}' applies to one tool: set it per tool under 'tools'"),
                    ));
                }
            }
            if tool.include.is_some() && tool.exclude.is_some() {
                return Err(invalid(
                    &tp.key("exclude"),
                    "'include' and 'exclude' are mutually exclusive".into(),
                ));
            }
            let prefix = tool.alias.clone().unwrap_or_else(|| server.clone());
            if let Some(alias) = &tool.alias
                && !valid_mcp_name(alias)
            {
                return Err(invalid(
                    &tp.key("alias"),
                    format!("invalid alias '{alias}'"),
                ));
            }
            if prefixes.contains(&prefix) {
                return Err(invalid(
                    tp,
                    format!(
                        "the prefix '{prefix}__' is used twice in this agent: give one an 'alias'"
                    ),
                ));
            }
            prefixes.push(prefix);
            Ok(())
        }
    }
}
