//! Stage 2: from the file model to a validated [`Config`].

mod agents;
mod at_rest;
mod compaction;
mod delegation;
mod env;
mod pricing;
mod profile;
mod refusals;
mod sections;
mod server;
mod services;
mod skills;

pub use skills::{MAX_SKILL_FILES, Skill};
mod state;
mod storage;
mod telemetry;
mod tenants;
mod tools;
mod triggers;

pub use agents::MCP_CONTROL_TOOLS;
pub use compaction::COMPACTION_AGENT;
pub use refusals::APPROVAL_POLICY;
pub use tools::BUILTIN_TOOLS;

use agents::{agent_files, check_agent, read_system_prompt};
use profile::{apply_profile, select_profile};
use refusals::{not_yet, not_yet_value};
use sections::{check_models, check_sections, check_version};
use tools::{check_mcp_servers, check_tool_ref, check_tool_sources};

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::env_file::{EnvFile, EnvVars, LoadOptions};
use crate::error::{ConfigError, ConfigErrorKind};
use crate::files::{self, FileProblem};
use crate::guards::Budgets;
use crate::model::{
    AgentSpec, ArtifactsBackend, EventsBackend, LoomConfig, McpServerSpec, ModelSpec, Profile,
    ToolSourceSpec,
};
use crate::prompt;
use crate::tenant::TenantSpec;
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
pub(crate) struct Doc {
    display: PathBuf,
    tree: Node,
    /// Whether unknown keys get the configuration's hints (a key not implemented yet, …): off
    /// for other documents read the same way ([`crate::YamlDocument`]).
    config_hints: bool,
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
    pub(crate) fn error(
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
    pub(crate) fn key_error(
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
    pub(crate) fn parse(text: &str, display: PathBuf) -> Result<Doc, ConfigError> {
        match yaml::parse(text) {
            Ok(tree) => Ok(Doc {
                display,
                tree,
                config_hints: true,
            }),
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

    /// Leaves out the configuration's hints on unknown keys and values.
    pub(crate) fn without_config_hints(&mut self) {
        self.config_hints = false;
    }

    /// Deserializes the whole document into the typed file model.
    pub(crate) fn typed<T: DeserializeOwned>(&self) -> Result<T, ConfigError> {
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
                format!(
                    "unknown key '{field}'{expected}{}",
                    if self.config_hints {
                        not_yet(&path, field)
                    } else {
                        ""
                    }
                ),
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
                    if self.config_hints {
                        not_yet_value(&path, value)
                    } else {
                        ""
                    }
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
    /// The agent's skills, loaded from their folders.
    skills: Vec<skills::Skill>,
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
    /// The summarizer's system prompt read from `sessions.compaction.system_file`.
    compaction_system: Option<String>,
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

    /// The skills of agent `name`, loaded from their folders (none for an unknown agent).
    pub fn skills(&self, name: &str) -> &[Skill] {
        self.index_of(name)
            .map(|i| self.meta[i].skills.as_slice())
            .unwrap_or_default()
    }

    /// The root of the working folders of agent `name`'s local sandbox: its `sandbox.root`,
    /// else `<journal directory>/.sandbox` (`jsonl`), `<database file>.sandbox` (`sqlite`), or
    /// `.loom-sandbox` beside the config file.
    pub fn sandbox_root(&self, name: &str) -> Option<PathBuf> {
        let sandbox = self.agent(name)?.sandbox.as_ref()?;
        if let Some(root) = &sandbox.root {
            return Some(self.base_dir.join(root));
        }
        let events = self.events_path();
        Some(match self.raw.storage.events.backend {
            EventsBackend::Jsonl => events.map_or_else(
                || self.base_dir.join(".loom-sandbox"),
                |dir| dir.join(".sandbox"),
            ),
            EventsBackend::Sqlite => events.map_or_else(
                || self.base_dir.join(".loom-sandbox"),
                |file| {
                    let mut name = file.into_os_string();
                    name.push(".sandbox");
                    PathBuf::from(name)
                },
            ),
            EventsBackend::Memory | EventsBackend::Postgres => self.base_dir.join(".loom-sandbox"),
        })
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
            EventsBackend::Memory | EventsBackend::Postgres => None,
        }
    }

    /// Whether artifacts are kept in the `postgres` journal's database (`storage.artifacts.backend:
    /// postgres`, the default beside a `postgres` journal).
    pub fn artifacts_in_postgres(&self) -> bool {
        let storage = &self.raw.storage;
        match storage.artifacts.backend {
            Some(backend) => backend == ArtifactsBackend::Postgres,
            None => {
                storage.artifacts.path.is_none()
                    && storage.events.backend == EventsBackend::Postgres
            }
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
            (Some(ArtifactsBackend::Memory | ArtifactsBackend::Postgres), _) => None,
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

    /// The tool source called `name`, with its index in `tool_sources`.
    pub fn tool_source(&self, name: &str) -> Option<(usize, &ToolSourceSpec)> {
        self.raw
            .tool_sources
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
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
        prompt::render(&meta.system, agent, tenant, self.variables(tenant)).map_err(|issue| {
            self.template_error_at(
                i,
                &KeyPath::root().key("main"),
                meta.system_file.as_deref(),
                issue,
            )
        })
    }

    /// The summarizer's system prompt of `sessions.compaction.system_file` (`None`: the
    /// built-in one, or no compaction).
    pub fn compaction_system(&self) -> Option<&str> {
        self.compaction_system.as_deref()
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
        prompt::render(&prompt.system, agent, tenant, self.variables(tenant)).map_err(|issue| {
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
        config_hints: true,
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
    at_rest::check(&doc, &raw)?;
    check_mcp_servers(&doc, &mut raw, &origin.base_dir)?;
    check_tool_sources(&doc, &mut raw, &origin.base_dir)?;
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
            skills: Vec::new(),
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
            skills: Vec::new(),
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
        compaction_system: None,
    };
    delegation::check_tenants(&config)?;
    for i in 0..config.agents.len() {
        check_agent(&mut config, i)?;
    }
    tenants::check_overrides(&config)?;
    pricing::check_money_budgets(&mut config)?;
    delegation::check_security(&config)?;
    triggers::check_triggers(&config)?;
    config.compaction_system = compaction::check(&config)?;
    Ok(config)
}

const NOT_POSITIVE: &str = "must be greater than 0";

fn positive_seconds(value: Option<f64>) -> bool {
    value.is_none_or(|v| v > 0.0 && v.is_finite())
}
