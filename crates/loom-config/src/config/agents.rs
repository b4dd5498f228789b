//! Agents: the files of `agents_dir`, the checks of one agent (name, roles, tools, limits)
//! and its system prompts (inline or read from `prompts_dir`).

use std::{
    fs, io,
    path::{Path, PathBuf},
};

use crate::error::{ConfigError, ConfigErrorKind};
use crate::files::{self, FileProblem};
use crate::model::AgentSpec;
use crate::prompt;
use crate::yaml::KeyPath;

use super::{
    Config, Doc, NOT_POSITIVE, RolePrompt, check_tool_ref, delegation, display_path,
    positive_seconds,
};

/// The names of the MCP server's control tools: no agent offered over MCP may take them.
pub const MCP_CONTROL_TOOLS: [&str; 3] = ["run_status", "run_report", "cancel"];

/// Agent files of `agents_dir`, sorted by file name; none when the directory is missing.
pub(super) fn agent_files(
    root: &Doc,
    base: &Path,
    dir: &Path,
) -> Result<Vec<PathBuf>, ConfigError> {
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

pub(super) fn check_agent(config: &mut Config, i: usize) -> Result<(), ConfigError> {
    // Checked on a copy, which receives what loading fills in (schema files, default names).
    let mut spec = config.agents[i].clone();
    let (role_prompts, warnings) = check_agent_spec(config, i, &mut spec)?;
    let skills = {
        let meta = &config.meta[i];
        super::skills::load_skills(
            &config.docs[meta.doc],
            &config.base_dir,
            &meta.prefix,
            &spec,
        )?
    };
    config.meta[i].skills = skills;
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
    if spec.name == super::compaction::COMPACTION_AGENT {
        return Err(invalid(
            &p.key("name"),
            format!(
                "the agent name '{}' is reserved for the agent that writes session summaries \
                 (sessions.compaction): rename the agent",
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
    check_http_exposure(config, doc, p, spec)?;
    super::skills::check_sandbox(doc, p, spec)?;
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
    // The variables some tenant defines are known here; whether each tenant that may run the
    // agent defines those its prompts use is checked with the tenants (`tenants.rs`).
    let defined = super::tenants::defined_variables(config);
    let defined: Vec<&str> = defined.iter().map(String::as_str).collect();
    if let Err(issue) = prompt::check(&config.meta[i].system, &defined) {
        let file = config.meta[i].system_file.clone();
        return Err(config.template_error_at(
            i,
            &KeyPath::root().key("main"),
            file.as_deref(),
            issue,
        ));
    }
    for (r, role) in role_prompts.iter().enumerate() {
        if let Err(issue) = prompt::check(&role.system, &defined) {
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

/// `expose.http` of an agent: an agent that opts in needs a usable authenticator (`auth:
/// keys` and a key of `security.api_keys` that may run it) unless it allows anonymous callers
/// (`allow_anonymous: true`); `heartbeat_ms` is positive.
fn check_http_exposure(
    config: &Config,
    doc: &Doc,
    p: &KeyPath,
    spec: &AgentSpec,
) -> Result<(), ConfigError> {
    let Some(http) = spec.expose.http_endpoints() else {
        return Ok(());
    };
    let hp = p.key("expose").key("http");
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    if let Some(ms) = http.heartbeat_ms
        && !(1..=3_600_000).contains(&ms)
    {
        return Err(invalid(
            &hp.key("heartbeat_ms"),
            format!(
                "agent '{}': heartbeat_ms must be between 1 and 3600000 (got {ms})",
                spec.name
            ),
        ));
    }
    if http.allow_anonymous {
        return Ok(());
    }
    let keys = &config.raw.security.api_keys;
    let problem = match http.auth {
        crate::model::HttpAuth::None => {
            Some("auth: none leaves its endpoints without an authenticator".to_owned())
        }
        crate::model::HttpAuth::Keys if keys.is_empty() => Some(
            "auth: keys needs at least one API key in security.api_keys, and none is declared"
                .to_owned(),
        ),
        crate::model::HttpAuth::Keys => {
            let usable = keys
                .iter()
                .any(|key| key.allows(crate::security::Scope::Run) && key.allows_agent(&spec.name));
            (!usable).then(|| {
                format!(
                    "auth: keys, but no key of security.api_keys has the scope 'run' on the \
                     agent '{}'",
                    spec.name
                )
            })
        }
    };
    match problem {
        None => Ok(()),
        Some(problem) => Err(invalid(
            &hp.key("auth"),
            format!(
                "agent '{}' opts in to its own HTTP endpoints (expose.http.enabled) but {problem}: \
                 declare a key, or set expose.http.allow_anonymous: true to serve anyone",
                spec.name
            ),
        )),
    }
}

/// A system prompt: inline text or a file under `prompts_dir`, never both. `role` is the key
/// path of the role (`main`, `roles[0]`) in `doc`. Returns the text and the file's display path.
pub(super) fn read_system_prompt(
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
