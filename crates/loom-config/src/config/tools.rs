//! Tools: the `mcp_servers` section, the built-in tools, and the tool references of an agent
//! with their overrides and output contracts.

use std::path::Path;

use crate::error::{ConfigError, ConfigErrorKind};
use crate::model::{LoomConfig, McpScope, McpTransport, ToolOverrides, ToolRef};
use crate::yaml::KeyPath;

use super::{Config, Doc, NOT_POSITIVE, delegation, display_path, positive_seconds};

/// The built-in tools an agent may reference with `tool: loom.<name>`.
pub const BUILTIN_TOOLS: &[&str] = &[
    "loom.current_datetime",
    "loom.local_files",
    "loom.fetch_page",
    "loom.sql",
    "loom.excel",
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

pub(super) fn check_mcp_servers(
    doc: &Doc,
    raw: &mut LoomConfig,
    base: &Path,
) -> Result<(), ConfigError> {
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
                        "'url' is for transports 'http' and 'sse'".into(),
                    ));
                }
                if !server.headers_env.is_empty() {
                    return Err(invalid(
                        &sp.key("headers_env"),
                        "'headers_env' is for transports 'http' and 'sse'".into(),
                    ));
                }
            }
            McpTransport::Http | McpTransport::Sse => {
                let transport = if server.transport == McpTransport::Http {
                    "http"
                } else {
                    "sse"
                };
                let Some(url) = &server.url else {
                    return Err(invalid(
                        &sp.key("transport"),
                        format!("transport '{transport}' requires 'url'"),
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
        if !positive_seconds(server.idle_timeout) {
            return Err(invalid(&sp.key("idle_timeout"), NOT_POSITIVE.into()));
        }
        if server.idle_timeout.is_some() && server.scope == McpScope::Run {
            return Err(invalid(
                &sp.key("idle_timeout"),
                "'idle_timeout' applies to 'shared' and 'tenant' connections: a run's connection \
                 closes when the run ends"
                    .into(),
            ));
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
pub(super) fn check_tool_ref(
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
    let given = [
        tool.tool.is_some(),
        tool.mcp.is_some(),
        tool.source.is_some(),
    ];
    if given.iter().filter(|g| **g).count() != 1 {
        return Err(invalid(
            tp,
            "a tool reference needs exactly one of 'tool', 'mcp' and 'source'".into(),
        ));
    }
    match (&tool.tool, &tool.mcp, &tool.source) {
        (None, Some(server), _) => {
            if config.mcp_server(server).is_none() {
                let declared = names(config.raw.mcp_servers.iter().map(|m| m.name.as_str()));
                return Err(doc.error(
                    &tp.key("mcp"),
                    ConfigErrorKind::Reference,
                    format!("unknown MCP server '{server}' (declared servers: {declared})"),
                ));
            }
            check_many(doc, tp, tool, server, prefixes)
        }
        (None, None, Some(source)) => {
            if config.tool_source(source).is_none() {
                let declared = names(config.raw.tool_sources.iter().map(|s| s.name.as_str()));
                return Err(doc.error(
                    &tp.key("source"),
                    ConfigErrorKind::Reference,
                    format!("unknown tool source '{source}' (declared sources: {declared})"),
                ));
            }
            check_many(doc, tp, tool, source, prefixes)
        }
        (Some(name), _, _) => {
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
                        format!("'{key}' applies to an 'mcp' or 'source' reference"),
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
            let excel = name == "loom.excel";
            let with_folders = name == "loom.local_files" || excel;
            let fetch_page = name == "loom.fetch_page";
            if with_folders && tool.folders.as_ref().is_none_or(Vec::is_empty) {
                return Err(invalid(
                    &tp.key("tool"),
                    format!("{name} needs 'folders' (at least one)"),
                ));
            }
            if !with_folders && tool.folders.is_some() {
                return Err(invalid(
                    &tp.key("folders"),
                    "'folders' applies to loom.local_files and loom.excel".into(),
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
            check_sql_params(config, doc, tp, tool, name == "loom.sql")?;
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
                if excel && folder.rights.contains(&crate::FolderRight::Delete) {
                    let at = folder
                        .rights
                        .iter()
                        .position(|right| *right == crate::FolderRight::Delete)
                        .unwrap_or_default();
                    return Err(invalid(
                        &fp.key("rights").index(at),
                        "loom.excel never deletes a file: grant read, write or overwrite".into(),
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
        (None, None, None) => Ok(()),
    }
}

/// `names` joined for a message, or `none`.
fn names<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}

/// The keys of a reference to the many tools of an MCP server or a tool source (`origin`):
/// per-tool keys refused at its level, `include` xor `exclude`, and a prefix unique in the
/// agent.
fn check_many(
    doc: &Doc,
    tp: &KeyPath,
    tool: &ToolRef,
    origin: &str,
    prefixes: &mut Vec<String>,
) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    for (key, present) in [
        ("description", tool.description.is_some()),
        ("timeout", tool.timeout.is_some()),
        ("side_effects", tool.side_effects.is_some()),
        ("approval", tool.approval.is_some()),
        ("idempotent", tool.idempotent.is_some()),
        ("offload_over", tool.offload_over.is_some()),
        ("folders", tool.folders.is_some()),
        ("database", tool.database.is_some()),
        ("tables", tool.tables.is_some()),
        ("max_rows", tool.max_rows.is_some()),
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
    let prefix = tool.alias.clone().unwrap_or_else(|| origin.to_owned());
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
            format!("the prefix '{prefix}__' is used twice in this agent: give one an 'alias'"),
        ));
    }
    prefixes.push(prefix);
    Ok(())
}

/// Checks `tool_sources`: names (a prefix no MCP server has), kinds, and the overrides of their
/// tools.
pub(super) fn check_tool_sources(
    doc: &Doc,
    raw: &mut LoomConfig,
    base: &Path,
) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    for (i, source) in raw.tool_sources.iter().enumerate() {
        let sp = KeyPath::root().key("tool_sources").index(i);
        if !valid_mcp_name(&source.name) {
            return Err(invalid(
                &sp.key("name"),
                format!(
                    "invalid tool source name '{}' (letters, digits, '-', single '_' between them; at most 40)",
                    source.name
                ),
            ));
        }
        if raw.tool_sources[..i].iter().any(|s| s.name == source.name) {
            return Err(invalid(
                &sp.key("name"),
                format!("duplicate tool source name '{}'", source.name),
            ));
        }
        if raw.mcp_servers.iter().any(|m| m.name == source.name) {
            return Err(invalid(
                &sp.key("name"),
                format!(
                    "'{}' is already the name of an MCP server: the prefix '{}__' would be ambiguous",
                    source.name, source.name
                ),
            ));
        }
        if source.kind.trim().is_empty() {
            return Err(invalid(&sp.key("kind"), "must not be empty".into()));
        }
    }
    for (i, source) in raw.tool_sources.iter_mut().enumerate() {
        let sp = KeyPath::root().key("tool_sources").index(i);
        for (tool, overrides) in &mut source.tools {
            check_overrides(doc, &sp.key("tools").key(tool), overrides, base)?;
        }
    }
    Ok(())
}

/// The parameters of `loom.sql` (`database`, `tables`, `max_rows`), refused on any other tool.
fn check_sql_params(
    config: &Config,
    doc: &Doc,
    tp: &KeyPath,
    tool: &ToolRef,
    sql: bool,
) -> Result<(), ConfigError> {
    let invalid = |path: &KeyPath, msg: String| doc.error(path, ConfigErrorKind::Invalid, msg);
    if !sql {
        for (key, present) in [
            ("database", tool.database.is_some()),
            ("tables", tool.tables.is_some()),
            ("max_rows", tool.max_rows.is_some()),
        ] {
            if present {
                return Err(invalid(
                    &tp.key(key),
                    format!("'{key}' applies to loom.sql"),
                ));
            }
        }
        return Ok(());
    }
    if tool.max_rows == Some(0) {
        return Err(invalid(&tp.key("max_rows"), NOT_POSITIVE.into()));
    }
    let Some(database) = &tool.database else {
        return Err(invalid(&tp.key("tool"), "loom.sql needs 'database'".into()));
    };
    let dp = tp.key("database");
    match database.backend {
        crate::SqlBackend::Sqlite => {
            if database.dsn_env.is_some() {
                return Err(invalid(
                    &dp.key("dsn_env"),
                    "'dsn_env' applies to backend postgres".into(),
                ));
            }
            let Some(path) = &database.path else {
                return Err(invalid(&dp, "backend sqlite needs 'path'".into()));
            };
            let file = config.base_dir.join(path);
            if !file.is_file() {
                return Err(doc.error(
                    &dp.key("path"),
                    ConfigErrorKind::MissingFile,
                    format!(
                        "the SQLite file does not exist: {}",
                        display_path(&config.base_dir, &file).display()
                    ),
                ));
            }
        }
        crate::SqlBackend::Postgres => {
            if database.path.is_some() {
                return Err(invalid(
                    &dp.key("path"),
                    "'path' applies to backend sqlite".into(),
                ));
            }
            if database.dsn_env.as_deref().is_none_or(str::is_empty) {
                return Err(invalid(
                    &dp,
                    "backend postgres needs 'dsn_env' (the variable holding the DSN)".into(),
                ));
            }
        }
    }
    let tables = tool.tables.as_deref().unwrap_or_default();
    if tables.is_empty() {
        return Err(invalid(
            &tp.key("tables"),
            "loom.sql needs 'tables' (at least one)".into(),
        ));
    }
    for (t, table) in tables.iter().enumerate() {
        let path = tp.key("tables").index(t);
        if table.name.trim().is_empty() {
            return Err(invalid(&path.key("name"), "must not be empty".into()));
        }
        if tables[..t].iter().any(|other| other.name == table.name) {
            return Err(invalid(
                &path.key("name"),
                format!("the table '{}' is declared twice", table.name),
            ));
        }
        if table.columns.as_ref().is_some_and(Vec::is_empty) {
            return Err(invalid(
                &path.key("columns"),
                "an empty column list allows nothing: omit 'columns' to allow them all".into(),
            ));
        }
    }
    Ok(())
}
