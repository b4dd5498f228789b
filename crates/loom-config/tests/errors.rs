//! Broken configurations: each refusal names the file, line, column, key path and reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{load_str, no_env, refused, refused_with};
use loom_config::{ConfigErrorKind, Profile, Scope};

const MODELS: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: scripted
";

const AGENT_OK: &str = "\
name: devis
main:
  model: fake-1
";

#[test]
fn unknown_root_key() {
    let root = "version: 1\ntool_source: []\n";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:2:1 tool_source: unknown key 'tool_source' (expected one of: version, \
         profile, profiles, env_file, agents_dir, prompts_dir, models, mcp_servers, tool_sources, \
         agents, storage, execution, budgets, sessions, telemetry, tenants, server, security, \
         triggers)"
    );
}

#[test]
fn tool_sources_are_checked_and_referenced_by_declared_name() {
    let mcp = "mcp_servers:\n  - {name: shop, transport: stdio, command: x}\n";
    let cases = [
        (
            format!(
                "{MODELS}tool_sources:\n  - {{name: shop, kind: k}}\n  - {{name: shop, kind: k}}\n"
            ),
            "tool_sources[1].name: duplicate tool source name 'shop'",
        ),
        (
            format!("{MODELS}{mcp}tool_sources:\n  - {{name: shop, kind: k}}\n"),
            "tool_sources[0].name: 'shop' is already the name of an MCP server: the \
             prefix 'shop__' would be ambiguous",
        ),
        (
            format!("{MODELS}tool_sources:\n  - {{name: a__b, kind: k}}\n"),
            "tool_sources[0].name: invalid tool source name 'a__b' (letters, digits, \
             '-', single '_' between them; at most 40)",
        ),
        (
            format!("{MODELS}tool_sources:\n  - {{name: shop, kind: ' '}}\n"),
            "tool_sources[0].kind: must not be empty",
        ),
    ];
    for (root, expected) in &cases {
        let shown = refused(root, &[]);
        assert!(shown.starts_with("loom.yaml:"), "{shown}");
        assert!(shown.contains(expected), "{shown}");
    }
    let root = format!("{MODELS}tool_sources:\n  - {{name: shop, kind: k}}\n");
    let agent = "name: devis\nmain: {model: fake-1}\ntools:\n  - source: stock\n";
    assert!(
        refused(&root, &[("agents/devis.yaml", agent)])
            .contains("tools[0].source: unknown tool source 'stock' (declared sources: shop)")
    );
    let agent = "name: devis\nmain: {model: fake-1}\ntools:\n  - source: shop\n    timeout: 3\n";
    assert!(refused(&root, &[("agents/devis.yaml", agent)]).contains(
        "tools[0].timeout: 'timeout' applies to one tool: set it per tool under 'tools'"
    ));
    let agent = "name: devis\nmain: {model: fake-1}\ntools:\n  - source: shop\n    mcp: shop\n";
    assert!(
        refused(&root, &[("agents/devis.yaml", agent)])
            .contains("a tool reference needs exactly one of 'tool', 'mcp' and 'source'")
    );
    // `entry_point`, the reference's name of the key, is read as `kind`.
    let root =
        format!("{MODELS}tool_sources:\n  - {{name: shop, entry_point: k, params: {{a: 1}}}}\n");
    let agent = "name: devis\nmain: {model: fake-1}\ntools:\n  - source: shop\n";
    let config = load_str(&root, &[("agents/devis.yaml", agent)], None, &no_env).unwrap();
    let (index, source) = config.tool_source("shop").unwrap();
    assert_eq!((index, source.kind.as_str()), (0, "k"));
    assert_eq!(source.params["a"], 1);
}

#[test]
fn imports_are_replaced_by_registration_in_code() {
    let root = "version: 1\nimports: [mes_outils]\n";
    assert!(refused(root, &[]).ends_with(
        "— Rust has no runtime imports: register tools in code (Loom::register, loom_cli::App::tool)"
    ));
}

#[test]
fn unknown_key_inside_agent_file() {
    let agent = "\
name: devis
main:
  model: fake-1
  temperature: 0.2
";
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", agent)]),
        "agents/devis.yaml:4:3 main.temperature: unknown key 'temperature' \
         (expected one of: model, fallbacks, system, system_file, llm, context)"
    );
}

#[test]
fn unknown_key_in_tool_reference() {
    let agent = "\
name: devis
main:
  model: fake-1
tools:
  - tool: a
  - tool: b
    retries: 3
";
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", agent)]),
        "agents/devis.yaml:7:5 tools[1].retries: unknown key 'retries' (expected one of: \
         python, tool, mcp, source, alias, include, exclude, required, tools, description, timeout, \
         side_effects, approval, idempotent, offload_over, folders, database, tables, max_rows, allow_private, max_bytes, output)"
    );
}

#[test]
fn duplicate_yaml_key_gives_both_lines() {
    let err = load_str("version: 1\nversion: 1\n", &[], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::DuplicateKey);
    assert_eq!(
        err.to_string(),
        "loom.yaml:2:1 version: key 'version' given twice in the same mapping (lines 1 and 2): \
         the second would silently override the first"
    );

    let agent = "\
name: devis
main:
  model: fake-1
  model: fake-2
";
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", agent)]),
        "agents/devis.yaml:4:3 main.model: key 'model' given twice in the same mapping \
         (lines 3 and 4): the second would silently override the first"
    );
}

#[test]
fn unsupported_version() {
    assert_eq!(
        refused("version: 2\nmcp_servers: []\n", &[]),
        "loom.yaml:1:10 version: unsupported config version 2 (expected 1)"
    );
}

#[test]
fn missing_version() {
    assert_eq!(
        refused("models: []\n", &[]),
        "loom.yaml:1:1 version: missing required key 'version'"
    );
}

#[test]
fn unknown_model_in_agent_file() {
    let agent = "\
# Quotes
name: devis
description: Builds quotes

main:
  system: hello
  model:   X
";
    let err = load_str(MODELS, &[("agents/devis.yaml", agent)], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Reference);
    assert_eq!(
        err.to_string(),
        "agents/devis.yaml:7:12 main.model: unknown model 'X' (declared models: fake-1)"
    );
}

#[test]
fn system_and_system_file_together() {
    let agent = "\
name: devis
main:
  model: fake-1
  system: inline
  system_file: devis.md
";
    assert_eq!(
        refused(
            MODELS,
            &[("agents/devis.yaml", agent), ("prompts/devis.md", "hi")]
        ),
        "agents/devis.yaml:5:16 main.system_file: 'system' and 'system_file' are mutually exclusive"
    );
}

#[test]
fn missing_system_file() {
    let agent = "\
name: devis
main:
  model: fake-1
  system_file: nope.md
";
    let err = load_str(MODELS, &[("agents/devis.yaml", agent)], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::MissingFile);
    assert_eq!(
        err.to_string(),
        "agents/devis.yaml:4:16 main.system_file: system prompt file not found: prompts/nope.md"
    );
}

#[test]
fn unknown_variable_in_prompt_file() {
    let agent = "\
name: devis
main:
  model: fake-1
  system_file: devis.md
";
    let prompt = "You are {{ agent }}.\nYou work for {{ client.name }} ({{ tenant }}).\n";
    let err = load_str(
        MODELS,
        &[("agents/devis.yaml", agent), ("prompts/devis.md", prompt)],
        None,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Template);
    assert_eq!(
        err.to_string(),
        "prompts/devis.md:2:17 main.system_file: unknown template variable 'client' \
         (known variables: agent, tenant)"
    );
}

#[test]
fn unknown_variable_in_inline_system() {
    let root = "\
version: 1
models:
  - {id: fake-1, sdk: fake, model: scripted}
agents:
  - name: helper
    main:
      model: fake-1
      system: \"Hello {{ user }}\"
";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:8:15 agents[0].main.system: unknown template variable 'user' \
         (known variables: agent, tenant)"
    );
}

#[test]
fn template_syntax_error_in_prompt_file() {
    let agent = "name: devis\nmain:\n  model: fake-1\n  system_file: devis.md\n";
    let prompt = "Line one\n{% if agent %}unterminated\n";
    let err = load_str(
        MODELS,
        &[("agents/devis.yaml", agent), ("prompts/devis.md", prompt)],
        None,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Template);
    assert_eq!(err.file, std::path::Path::new("prompts/devis.md"));
    assert!(err.message.starts_with("template syntax error: "), "{err}");
}

#[test]
fn jsonl_without_path() {
    let root = "\
version: 1
storage:
  events:
    backend: jsonl
";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:4:14 storage.events.backend: backend 'jsonl' requires 'path' (the journal directory)"
    );
}

#[test]
fn api_on_a_fake_model() {
    let root = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: scripted
    api: responses
";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:6:10 models[0].api: 'api' is only valid with sdk 'openai' \
         (model 'fake-1' uses sdk 'fake')"
    );
}

#[test]
fn duplicate_agent_names_across_files() {
    let second = "\
description: copy
name: devis
main:
  model: fake-1
";
    assert_eq!(
        refused(
            MODELS,
            &[("agents/a.yaml", AGENT_OK), ("agents/b.yml", second)]
        ),
        "agents/b.yml:2:7 name: duplicate agent name 'devis' (already defined in agents/a.yaml)"
    );

    // A file agent and an inline agent.
    let root = format!("{MODELS}agents:\n  - name: devis\n    main: {{model: fake-1}}\n");
    assert_eq!(
        refused(&root, &[("agents/a.yaml", AGENT_OK)]),
        "loom.yaml:7:11 agents[0].name: duplicate agent name 'devis' \
         (already defined in agents/a.yaml)"
    );
}

#[test]
fn duplicate_model_ids() {
    let root = format!("{MODELS}  - id: fake-1\n    sdk: fake\n    model: other\n");
    assert_eq!(
        refused(&root, &[]),
        "loom.yaml:6:9 models[1].id: duplicate model id 'fake-1' (already declared at models[0])"
    );
}

#[test]
fn invalid_agent_name() {
    let agent = "name: \"devis v2\"\nmain:\n  model: fake-1\n";
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", agent)]),
        "agents/devis.yaml:1:7 name: invalid agent name 'devis v2' (expected ^[A-Za-z0-9_-]{1,64}$)"
    );
}

#[test]
fn max_iterations_zero() {
    let agent = format!("{AGENT_OK}max_iterations: 0\n");
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", &agent)]),
        "agents/devis.yaml:4:17 max_iterations: must be greater than 0"
    );
}

#[test]
fn type_error() {
    let agent = format!("{AGENT_OK}max_iterations: \"ten\"\n");
    let err = load_str(MODELS, &[("agents/devis.yaml", &agent)], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Invalid);
    assert_eq!(
        err.to_string(),
        "agents/devis.yaml:4:17 max_iterations: invalid type: string \"ten\", expected u32"
    );
}

#[test]
fn unknown_enum_value() {
    let root = "version: 1\nmodels:\n  - id: a\n    sdk: gemini\n    model: x\n";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:4:10 models[0].sdk: unknown value 'gemini' (expected one of: anthropic, openai, fake)"
    );
}

#[test]
fn missing_required_key() {
    let agent = "name: devis\nmain:\n  system: hi\n";
    assert_eq!(
        refused(MODELS, &[("agents/devis.yaml", agent)]),
        "agents/devis.yaml:3:3 main.model: missing required key 'model'"
    );
}

#[test]
fn pricing_tiers_not_increasing() {
    let root = "\
version: 1
models:
  - id: m
    sdk: anthropic
    model: claude
    pricing:
      input: 3
      tiers:
        - above: 200000
          input: 6
        - above: 100000
          input: 9
";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:11:18 models[0].pricing.tiers[1].above: pricing tiers must have strictly \
         increasing 'above' (100000 follows 200000)"
    );
}

#[test]
fn unknown_profile() {
    // In the file.
    let err = load_str("version: 1\nprofile: staging\n", &[], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Reference);
    assert_eq!(
        err.to_string(),
        "loom.yaml:2:10 profile: unknown profile 'staging' (expected one of: dev, prod)"
    );

    // From LOOM_PROFILE.
    let env = |name: &str| (name == "LOOM_PROFILE").then(|| "qa".to_owned());
    assert_eq!(
        refused_with("version: 1\n", &[], None, &env),
        "loom.yaml profile: unknown profile 'qa' (expected one of: dev, prod), from LOOM_PROFILE"
    );

    // Under `profiles`.
    assert_eq!(
        refused("version: 1\nprofiles:\n  staging: {}\n", &[]),
        "loom.yaml:3:3 profiles.staging: unknown key 'staging' (expected one of: dev, prod)"
    );
}

#[test]
fn attachment_limits_are_checked() {
    assert_eq!(
        refused(
            "version: 1\nexecution:\n  attachments: {max_bytes: 0}\n",
            &[]
        ),
        "loom.yaml:3:28 execution.attachments.max_bytes: must be greater than 0"
    );
    assert_eq!(
        refused(
            "version: 1\nexecution:\n  attachments:\n    types: [image/png, png]\n",
            &[]
        ),
        "loom.yaml:4:24 execution.attachments.types[1]: 'png' is not a media type (expected \
         type/subtype, e.g. image/png)"
    );
    assert_eq!(
        refused(
            "version: 1\nexecution:\n  attachments:\n    types: [image/png, image/png]\n",
            &[]
        ),
        "loom.yaml:4:24 execution.attachments.types[1]: media type 'image/png' is listed twice"
    );
}

#[test]
fn profile_override_errors_point_into_the_profile_block() {
    let root = "\
version: 1
profiles:
  prod:
    execution:
      tools:
        timeout: 0
";
    assert_eq!(
        refused_with(root, &[], Some(Profile::Prod), &no_env),
        "loom.yaml:6:18 execution.tools.timeout: must be greater than 0"
    );
    // The same file is fine in dev.
    load_str(root, &[], Some(Profile::Dev), &no_env).unwrap();

    let nested = "version: 1\nprofiles:\n  dev:\n    profile: prod\n";
    assert_eq!(
        refused_with(nested, &[], Some(Profile::Dev), &no_env),
        "loom.yaml:4:5 profiles.dev.profile: 'profile' cannot be set inside a profile"
    );
}

#[test]
fn yaml_syntax_error() {
    let err = load_str("version: 1\nmodels: [\n", &[], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Syntax);
    assert_eq!(
        err.to_string(),
        "loom.yaml:2:9 (root): unclosed bracket '['"
    );
}

#[test]
fn bad_log_level() {
    let root = "version: 1\ntelemetry:\n  logging:\n    level: verbose\n";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:4:12 telemetry.logging.level: unknown log level 'verbose' \
         (expected one of: ERROR, WARNING, WARN, INFO, DEBUG, TRACE)"
    );
}

#[test]
fn raw_capture_limit_must_be_positive() {
    let root = "version: 1\ntelemetry:\n  capture: {raw_exchanges: true, raw_max_bytes: 0}\n";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:3:49 telemetry.capture.raw_max_bytes: must be greater than 0"
    );
    let ok = "version: 1\ntelemetry:\n  capture: {raw_exchanges: true}\n";
    let config = load_str(ok, &[], None, &no_env).unwrap();
    assert_eq!(config.raw().telemetry.capture.raw_limit(), Some(262_144));
    let off = load_str("version: 1\n", &[], None, &no_env).unwrap();
    assert_eq!(off.raw().telemetry.capture.raw_limit(), None);
}

#[test]
fn agents_dir_not_a_directory() {
    let root = "version: 1\nagents_dir: loom.txt\n";
    let err = load_str(root, &[("loom.txt", "x")], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Io);
    assert_eq!(
        err.to_string(),
        "loom.yaml:2:13 agents_dir: loom.txt is not a directory"
    );
}

#[test]
fn empty_agent_file() {
    assert_eq!(
        refused(MODELS, &[("agents/empty.yaml", "# nothing\n")]),
        "agents/empty.yaml (root): empty document (expected a mapping)"
    );
}

const MCP_SERVERS: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
mcp_servers:
  - name: notes
    transport: stdio
    command: python3
    args: [notes.py]
";

#[test]
fn mcp_reference_to_an_undeclared_server() {
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - mcp: crm\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:10 tools[0].mcp: unknown MCP server 'crm' (declared servers: notes)"
    );
}

#[test]
fn mcp_server_needs_its_transport_settings() {
    let root = format!("{MCP_SERVERS}  - name: crm\n    transport: http\n");
    assert_eq!(
        refused(&root, &[]),
        "loom.yaml:12:16 mcp_servers[1].transport: transport 'http' requires 'url'"
    );
    // The URL is read by the url crate: a scheme is not enough.
    for url in ["ftp://crm.example/mcp", "http://", "https:// crm.example"] {
        let root = format!("{MCP_SERVERS}  - name: crm\n    transport: http\n    url: \"{url}\"\n");
        let message = refused(&root, &[]);
        assert!(
            message.ends_with(&format!(
                "mcp_servers[1].url: '{url}' is not an http(s) URL"
            )),
            "{url}: {message}"
        );
    }
}

/// The older HTTP+SSE transport takes a URL and headers like `http`, and nothing of `stdio`.
#[test]
fn an_sse_server_is_checked_like_an_http_one() {
    let root = format!(
        "{MCP_SERVERS}  - name: legacy\n    transport: sse\n    url: http://127.0.0.1:8931/sse\n    \
         headers_env: {{Authorization: LEGACY_TOKEN}}\n"
    );
    let config = load_str(&root, &[], None, &no_env).unwrap();
    let legacy = &config.raw().mcp_servers[1];
    assert_eq!(legacy.transport, loom_config::McpTransport::Sse);
    assert_eq!(legacy.url.as_deref(), Some("http://127.0.0.1:8931/sse"));
    let cases = [
        (
            format!("{MCP_SERVERS}  - name: legacy\n    transport: sse\n"),
            "loom.yaml:12:16 mcp_servers[1].transport: transport 'sse' requires 'url'",
        ),
        (
            format!("{MCP_SERVERS}  - name: legacy\n    transport: sse\n    url: ftp://x/sse\n"),
            "loom.yaml:13:10 mcp_servers[1].url: 'ftp://x/sse' is not an http(s) URL",
        ),
        (
            format!(
                "{MCP_SERVERS}  - name: legacy\n    transport: sse\n    url: http://x/sse\n    command: x\n"
            ),
            "loom.yaml:14:14 mcp_servers[1].command: 'command' is for transport 'stdio'",
        ),
        (
            format!("{MCP_SERVERS}    url: http://x/sse\n"),
            "loom.yaml:11:10 mcp_servers[0].url: 'url' is for transports 'http' and 'sse'",
        ),
    ];
    for (root, expected) in cases {
        assert_eq!(refused(&root, &[]), expected, "{root}");
    }
}

/// `idle_timeout`: seconds, positive, for the connections that outlive a run.
#[test]
fn idle_timeout_is_positive_and_not_for_run_connections() {
    let config = load_str(MCP_SERVERS, &[], None, &no_env).unwrap();
    assert_eq!(config.raw().mcp_servers[0].idle_timeout, None);
    let root = format!("{MCP_SERVERS}    idle_timeout: 1.5\n");
    let config = load_str(&root, &[], None, &no_env).unwrap();
    assert_eq!(config.raw().mcp_servers[0].idle_timeout, Some(1.5));
    let root = format!("{MCP_SERVERS}    scope: tenant\n    idle_timeout: 60\n");
    assert!(load_str(&root, &[], None, &no_env).is_ok());
    for bad in ["0", "-3"] {
        let root = format!("{MCP_SERVERS}    idle_timeout: {bad}\n");
        assert_eq!(
            refused(&root, &[]),
            "loom.yaml:11:19 mcp_servers[0].idle_timeout: must be greater than 0",
            "{bad}"
        );
    }
    let root = format!("{MCP_SERVERS}    scope: run\n    idle_timeout: 60\n");
    assert_eq!(
        refused(&root, &[]),
        "loom.yaml:12:19 mcp_servers[0].idle_timeout: 'idle_timeout' applies to 'shared' and \
         'tenant' connections: a run's connection closes when the run ends"
    );
}

#[test]
fn mcp_reference_mixing_tool_keys() {
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - mcp: notes\n    timeout: 3\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:6:14 tools[0].timeout: 'timeout' applies to one tool: set it per tool under 'tools'"
    );
}

#[test]
fn mcp_include_and_exclude_together() {
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - mcp: notes\n    include: [a]\n    exclude: [b]\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:7:14 tools[0].exclude: 'include' and 'exclude' are mutually exclusive"
    );
}

#[test]
fn unknown_builtin_and_missing_folders() {
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.word\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:11 tools[0].tool: unknown built-in tool 'loom.word' (built-in tools: \
         loom.current_datetime, loom.local_files, loom.fetch_page, loom.sql, loom.excel)"
    );
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.excel\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:11 tools[0].tool: loom.excel needs 'folders' (at least one)"
    );
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.local_files\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:11 tools[0].tool: loom.local_files needs 'folders' (at least one)"
    );
}

#[test]
fn excel_keys_are_checked_where_they_stand() {
    let refused_agent = |tool: &str| {
        let agent = format!("name: a\nmain:\n  model: fake-1\ntools:\n{tool}");
        refused(
            MCP_SERVERS,
            &[("agents/a.yaml", agent.as_str()), ("classeurs/f.xlsx", "")],
        )
    };
    // LibreOffice recalculation is not implemented: its keys are unknown.
    assert_eq!(
        refused_agent(
            "  - tool: loom.excel\n    folders: [{name: c, path: classeurs, rights: [read]}]\n    recalc: true\n"
        )
        .split(" (expected")
        .next()
        .unwrap(),
        "agents/a.yaml:7:5 tools[0].recalc: unknown key 'recalc'"
    );
    assert_eq!(
        refused_agent(
            "  - tool: loom.excel\n    folders:\n      - {name: c, path: classeurs, rights: [read, delete]}\n"
        ),
        "agents/a.yaml:7:51 tools[0].folders[0].rights[1]: loom.excel never deletes a file: \
         grant read, write or overwrite"
    );
    assert_eq!(
        refused_agent(
            "  - tool: loom.excel\n    folders:\n      - {name: c, path: absents, rights: [read]}\n"
        ),
        "agents/a.yaml:7:25 tools[0].folders[0].path: folder 'c' does not exist: absents"
    );
    assert_eq!(
        refused_agent(
            "  - tool: loom.sql\n    folders: [{name: c, path: classeurs, rights: [read]}]\n"
        ),
        "agents/a.yaml:6:14 tools[0].folders: 'folders' applies to loom.local_files and loom.excel"
    );
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.excel\n    folders: [{name: c, path: classeurs, rights: [read, write]}]\n";
    let files = [("agents/a.yaml", agent), ("classeurs/f.xlsx", "")];
    assert!(load_str(MCP_SERVERS, &files, None, &no_env).is_ok());
}

// ---------------------------------------------------------------------------------------------
// Delegation and guards: roles, sub-agents, policies, judges, output contracts, budgets, tenants.

const GUARD_ROOT: &str = "\
version: 1
models:
  - {id: fake-1, sdk: fake, model: scripted}
  - {id: judge-1, sdk: fake, model: judge}
  - {id: eyes, sdk: fake, model: eyes, capabilities: {vision: true}}
  - {id: stubborn, sdk: fake, model: stubborn, capabilities: {forced_tool_choice: false}}
  - {id: blind, sdk: fake, model: blind, capabilities: {tools: false}}
mcp_servers:
  - name: notes
    transport: stdio
    command: notes
";

/// Agent `a`, with a registered tool and an MCP server; the cases append to it.
const GUARD_AGENT: &str = "\
name: a
main:
  model: fake-1
tools:
  - tool: lookup
  - mcp: notes
";

const ROLE: &str = "\
roles:
  - name: writer
    description: Writes
    model: fake-1
";

/// A role with one argument, for the cases that add keys to it.
fn role(extra: &str) -> String {
    format!(
        "{ROLE}    input_schema: {{type: object, properties: {{topic: {{type: string}}}}}}\n{extra}"
    )
}

/// Loads the guard fixture with `root_extra` appended to the config file and `agent_extra`
/// appended to agent `a` (or replacing it when it starts with `name:`), and returns the refusal.
fn guard_refusal(root_extra: &str, agent_extra: &str) -> String {
    guard_refusal_with(root_extra, agent_extra, None)
}

fn guard_refusal_with(root_extra: &str, agent_extra: &str, profile: Option<Profile>) -> String {
    match guard_load(root_extra, agent_extra, profile) {
        Ok(_) => panic!("configuration accepted, expected a refusal:\n{root_extra}{agent_extra}"),
        Err(err) => err.to_string(),
    }
}

fn guard_load(
    root_extra: &str,
    agent_extra: &str,
    profile: Option<Profile>,
) -> Result<loom_config::Config, loom_config::ConfigError> {
    let root = format!("{GUARD_ROOT}{root_extra}");
    // A whole agent replaces `a`; anything else is appended to it.
    let agent = if agent_extra.starts_with("name:") {
        agent_extra.to_owned()
    } else {
        format!("{GUARD_AGENT}{agent_extra}")
    };
    load_str(
        &root,
        &[
            ("agents/a.yaml", &agent),
            (
                "agents/helper.yaml",
                "name: helper\ndescription: Helps\nmain: {model: fake-1}\n",
            ),
            (
                "agents/silent.yaml",
                "name: silent\nmain: {model: fake-1}\n",
            ),
            ("prompts/role.md", "Role of {{ agent }}"),
            ("prompts/bad.md", "Line\n{{ nope }}\n"),
            (
                "schemas/bad.json",
                "{\n  \"type\": \"object\",\n  \"properties\": {,}\n}\n",
            ),
            ("schemas/s.txt", "type: object\n"),
            ("schemas/list.yaml", "- a\n- b\n"),
        ],
        profile,
        &no_env,
    )
}

#[test]
fn guard_refusals_snapshot() {
    let cases: Vec<(&str, &str, String)> = vec![
        // Budgets and tenants.
        ("negative run cost", "budgets: {run: {max_cost: -1}}\n", String::new()),
        ("unknown budget key", "budgets: {run: {max_dollars: 1}}\n", String::new()),
        ("unknown on_exceed", "budgets: {on_exceed: pause}\n", String::new()),
        ("negative token limit", "budgets: {session: {max_tokens: -5}}\n", String::new()),
        ("invalid tenant id", "tenants: [{id: \"bad id\"}]\n", String::new()),
        ("duplicate tenant", "tenants: [{id: acme}, {id: acme}]\n", String::new()),
        ("tenant unknown agent", "tenants: [{id: acme, agents: [nobody]}]\n", String::new()),
        ("tenant agent twice", "tenants: [{id: acme, agents: [a, a]}]\n", String::new()),
        ("tenant storage encryption", "tenants: [{id: acme, storage: {events: {backend: jsonl, path: t}, encryption: {keys: [K]}}}]\n", String::new()),
        ("tenant unknown key", "tenants: [{id: acme, colour: blue}]\n", String::new()),
        (
            "tenant budget negative",
            "tenants: [{id: acme, budgets: {tenant: {max_cost_per_day: -2}}}]\n",
            String::new(),
        ),
        // Agent.
        ("max_depth zero", "", "max_depth: 0\n".into()),
        ("agent budget negative", "", "budget: {session: {max_cost: -0.5}}\n".into()),
        (
            "orchestrator cannot call tools",
            "",
            GUARD_AGENT.replace("model: fake-1", "model: blind") + ROLE + "    context: [user_input]\n",
        ),
        (
            "main context without state keys",
            "",
            GUARD_AGENT.replace("  model: fake-1\n", "  model: fake-1\n  context: [session_state]\n"),
        ),
        // Policies.
        ("empty hook", "", "policies: [{hook: \"\"}]\n".into()),
        ("unknown built-in policy", "", "policies: [{hook: loom.audit}]\n".into()),
        ("reserved policy name", "", "policies: [{hook: audit, name: loom.audit}]\n".into()),
        ("invalid default policy name", "", "policies: [{hook: \"my hook\"}]\n".into()),
        (
            "duplicate policy names",
            "",
            "policies: [{hook: audit}, {hook: other, name: audit}]\n".into(),
        ),
        ("empty points", "", "policies: [{hook: audit, points: []}]\n".into()),
        (
            "point twice",
            "",
            "policies: [{hook: audit, points: [before_tool, before_tool]}]\n".into(),
        ),
        ("unknown point", "", "policies: [{hook: audit, points: [before_all]}]\n".into()),
        (
            "require_tool on another point",
            "",
            "policies:\n  - hook: loom.require_tool\n    points: [before_model, after_tool]\n".into(),
        ),
        (
            "require_tool with params",
            "",
            "policies: [{hook: loom.require_tool, params: {tool: x}}]\n".into(),
        ),
        ("policy timeout zero", "", "policies: [{hook: audit, timeout: 0}]\n".into()),
        ("policy attempts zero", "", "policies: [{hook: audit, max_attempts: 0}]\n".into()),
        // Roles.
        ("invalid role name", "", ROLE.replace("name: writer", "name: \"the writer\"")),
        ("role named main", "", ROLE.replace("name: writer", "name: main")),
        ("role named like a tool", "", ROLE.replace("name: writer", "name: lookup")),
        ("role under an MCP prefix", "", ROLE.replace("name: writer", "name: notes__x")),
        ("two roles, one name", "", role("") + "  - name: writer\n    description: Again\n    model: fake-1\n    context: [user_input]\n"),
        ("empty description", "", role("").replace("description: Writes", "description: \" \"")),
        ("role unknown model", "", role("").replace("model: fake-1", "model: gpt-9")),
        ("role fallback twice", "", role("    fallbacks: [judge-1, judge-1]\n")),
        ("role llm max_tokens zero", "", role("    llm: {max_tokens: 0}\n")),
        ("role timeout zero", "", role("    timeout: 0\n")),
        ("role system and file", "", role("    system: hi\n    system_file: role.md\n")),
        ("role system file missing", "", role("    system_file: nope.md\n")),
        ("role prompt variable", "", role("    system_file: bad.md\n")),
        ("role inline prompt variable", "", role("    system: \"{{ client }}\"\n")),
        ("input_schema not an object", "", ROLE.to_owned() + "    input_schema: {type: string}\n"),
        (
            "input_schema invalid",
            "",
            ROLE.to_owned() + "    input_schema: {type: object, properties: {a: {type: 12}}}\n",
        ),
        ("role receives nothing", "", ROLE.into()),
        ("session_state context without state keys", "", ROLE.to_owned() + "    context: [session_state]\n"),
        (
            "session_state mapping",
            "",
            ROLE.to_owned() + "    context: [{session_state: [cart]}]\n",
        ),
        ("unknown context item", "", ROLE.to_owned() + "    context: [history]\n"),
        (
            "unknown key in tool_results",
            "",
            ROLE.to_owned() + "    context: [{tool_results: [lookup], scop: run}]\n",
        ),
        (
            "tool_results of an unknown tool",
            "",
            ROLE.to_owned() + "    context: [{tool_results: [lookup, nope]}]\n",
        ),
        (
            "tool_results of an excluded MCP tool",
            "",
            GUARD_AGENT.replace("  - mcp: notes\n", "") + "  - {mcp: notes, exclude: [secret]}\n" + ROLE
                + "    context: [{tool_results: [notes__secret]}]\n",
        ),
        ("context item twice", "", ROLE.to_owned() + "    context: [user_input, user_input]\n"),
        ("last_turns zero", "", ROLE.to_owned() + "    context: [{last_turns: 0}]\n"),
        ("attachments without vision", "", ROLE.to_owned() + "    context: [attachments]\n"),
        ("unknown template variable", "", role("    input_template: \"{{ user }}\"\n")),
        ("template argument not declared", "", role("    input_template: \"{{ args.topic }} {{ args.tone }}\"\n")),
        ("template with no arguments", "", ROLE.to_owned() + "    context: [user_input]\n    input_template: \"{{ context.user_input }} {{ args.x }}\"\n"),
        (
            "template context not declared",
            "",
            role("    input_template: \"{{ args.topic }} {{ context.user_input }}\"\n"),
        ),
        (
            "template tool not declared",
            "",
            role("    context: [{tool_results: [lookup]}]\n    input_template: \"{{ args.topic }} {{ context.tool_results.lookup }} {{ context.tool_results.notes }}\"\n"),
        ),
        (
            "template unknown context variable",
            "",
            role("    input_template: \"{{ args.topic }} {{ context.history }}\"\n"),
        ),
        (
            "template session_state not declared",
            "",
            role("    input_template: \"{{ args.topic }} {{ context.session_state.cart }}\"\n"),
        ),
        (
            "declared context unused",
            "",
            role("    context: [user_input, caller_context]\n    input_template: \"{{ args.topic }} {{ context.user_input }}\"\n"),
        ),
        (
            "template session_summary",
            "",
            role("    input_template: \"{{ args.topic }} {{ context.session_summary }}\"\n"),
        ),
        (
            "declared tool_results unused",
            "",
            role("    context: [{tool_results: [lookup, notes__find]}]\n    input_template: \"{{ args.topic }} {{ context.tool_results.lookup }}\"\n"),
        ),
        ("template syntax", "", role("    input_template: \"{{ args.topic \"\n")),
        // Sub-agents.
        ("unknown sub-agent", "", "subagents: [{agent: nobody}]\n".into()),
        ("own sub-agent", "", "subagents: [{agent: a}]\n".into()),
        ("sub-agent without description", "", "subagents: [{agent: silent}]\n".into()),
        ("sub-agent named like a role", "", role("") + "subagents: [{agent: helper, name: writer}]\n"),
        (
            "budget_share out of range",
            "budgets: {run: {max_calls: 10}}\n",
            "subagents: [{agent: helper, budget_share: 1.5}]\n".into(),
        ),
        (
            "budget_share without run budget",
            "budgets: {session: {max_cost: 1}}\n",
            "subagents: [{agent: helper, budget_share: 0.5}]\n".into(),
        ),
        // Output contracts.
        (
            "schema and schema_file",
            "",
            "output: {schema: {type: object}, schema_file: schemas/ok.yaml}\n".into(),
        ),
        ("schema_file missing", "", "output: {schema_file: schemas/nope.json}\n".into()),
        ("schema_file bad JSON", "", "output: {schema_file: schemas/bad.json}\n".into()),
        ("schema_file not an object", "", "output: {schema_file: schemas/list.yaml}\n".into()),
        ("schema_file extension", "", "output: {schema_file: schemas/s.txt}\n".into()),
        ("schema invalid", "", "output: {schema: {type: objekt}}\n".into()),
        (
            "schema pattern needing backtracking",
            "",
            "output: {schema: {type: string, pattern: \"^(a+)+(?!b)$\"}}\n".into(),
        ),
        ("must_match regex", "", "output: {must_match: \"total: (\\\\d+\"}\n".into()),
        ("must_not_match empty", "", "output: {must_not_match: \"\"}\n".into()),
        ("max_chars zero", "", "output: {max_chars: 0}\n".into()),
        ("fallback without message", "", "output: {on_failure: fallback}\n".into()),
        ("message without fallback", "", "output: {fallback_message: sorry}\n".into()),
        ("role output regex", "", role("    output: {must_match: \"[\"}\n")),
        (
            "tool output on an MCP reference",
            "",
            GUARD_AGENT.replace("  - mcp: notes\n", "") + "  - {mcp: notes, output: {max_chars: 10}}\n",
        ),
        (
            "MCP tool output",
            "",
            GUARD_AGENT.replace("  - mcp: notes\n", "") + "  - mcp: notes\n    tools:\n      find: {output: {max_chars: 0}}\n",
        ),
        (
            "server tool output",
            "    tools:\n      find: {output: {on_failure: fallback}}\n",
            String::new(),
        ),
        ("tool output schema", "", GUARD_AGENT.replace("  - tool: lookup\n", "") + "  - {tool: lookup, output: {schema: {type: 3}}}\n"),
        // Judges.
        ("judge without criteria", "", "judge: {model: judge-1, criteria: []}\n".into()),
        ("judge criteria missing", "", "judge: {model: judge-1}\n".into()),
        (
            "judge criterion twice",
            "",
            "judge:\n  model: judge-1\n  criteria: [{name: polite, rule: Be polite}, {name: polite, rule: Again}]\n".into(),
        ),
        (
            "judge min_score",
            "",
            "judge: {model: judge-1, criteria: [{name: polite, rule: Be polite, min_score: 1.5}]}\n".into(),
        ),
        ("judge empty rule", "", "judge: {model: judge-1, criteria: [{name: polite, rule: \"\"}]}\n".into()),
        ("judge unknown model", "", "judge: {model: gpt-9, criteria: [{name: polite, rule: Be polite}]}\n".into()),
        ("judge model without tools", "", "judge: {model: blind, criteria: [{name: polite, rule: Be polite}]}\n".into()),
        (
            "judge names clash",
            "",
            "judge: {model: judge-1, criteria: [{name: c, rule: r}]}\n".to_owned()
                + &role("    judge: {model: judge-1, name: output, criteria: [{name: c, rule: r}]}\n"),
        ),
        ("judge sample", "", "judge: {model: judge-1, criteria: [{name: c, rule: r}], when: {sample: 2}}\n".into()),
        ("judge unknown tenant", "tenants: [{id: acme}]\n", "judge: {model: judge-1, criteria: [{name: c, rule: r}], when: {tenants: [acme, dupont]}}\n".into()),
        ("judge tenant without tenants", "", "judge: {model: judge-1, criteria: [{name: c, rule: r}], when: {tenants: [acme]}}\n".into()),
        ("judge unknown profile", "", "judge: {model: judge-1, criteria: [{name: c, rule: r}], when: {profiles: [staging]}}\n".into()),
        (
            "judge attachments without vision",
            "",
            "judge: {model: judge-1, criteria: [{name: c, rule: r}], context: [attachments]}\n".into(),
        ),
        (
            "judge fallback without message",
            "",
            "judge: {model: judge-1, criteria: [{name: c, rule: r}], on_failure: fallback}\n".into(),
        ),
        ("judge timeout", "", "judge: {model: judge-1, criteria: [{name: c, rule: r}], timeout: -1}\n".into()),
        ("unknown key in judge", "", "judge: {model: judge-1, criteria: [{name: c, rule: r}], sample: 1}\n".into()),
        ("unknown key in role", "", role("    tools: [lookup]\n")),
        // Sessions: compaction and history caps.
        ("compaction model unknown", "sessions: {compaction: {model: summarizer}}\n", String::new()),
        (
            "compaction hard_tokens not above over_tokens",
            "sessions: {compaction: {model: judge-1, over_tokens: 5000, hard_tokens: 5000}}\n",
            String::new(),
        ),
        (
            "compaction system_file missing",
            "sessions: {compaction: {model: judge-1, system_file: summary.md}}\n",
            String::new(),
        ),
        ("compaction without model", "sessions: {compaction: {over_tokens: 10}}\n", String::new()),
        ("history max_turns zero", "sessions: {history: {max_turns: 0}}\n", String::new()),
        ("reserved agent name", "", "name: _compaction\nmain: {model: fake-1}\n".into()),
    ];
    let mut transcript = String::new();
    let mut accepted = Vec::new();
    for (name, root_extra, agent_extra) in &cases {
        match guard_load(root_extra, agent_extra, None) {
            Ok(_) => accepted.push(*name),
            Err(err) => transcript.push_str(&format!("{name}\n  {err}\n")),
        }
    }
    assert!(
        accepted.is_empty(),
        "accepted, expected refusals: {accepted:?}"
    );
    insta::assert_snapshot!("guard_refusals", transcript);
}

/// Agent `a`'s state: one key filled from `lookup`, one with a default.
const STATE: &str = "\
state:
  client: {schema: {type: string}, from: [{tool: lookup, path: /client}]}
  lang: {schema: {type: string}, default: fr}
";

/// The refusals of session state: its keys (schemas, required and default, limits, sources)
/// and the contexts that read it.
#[test]
fn state_refusals_snapshot() {
    let key = |extra: &str| format!("state:\n  client: {{schema: {{type: string}}{extra}}}\n");
    let cases: Vec<(&str, &str, String)> = vec![
        ("schema missing", "", "state:\n  client: {description: who}\n".into()),
        ("schema invalid", "", "state:\n  client: {schema: {type: objekt}}\n".into()),
        ("invalid key name", "", "state:\n  \"the client\": {schema: {type: string}}\n".into()),
        ("required with default", "", key(", required: true, default: C-1")),
        ("default off schema", "", key(", default: 12")),
        (
            "default over max_value_bytes",
            "sessions: {state: {max_value_bytes: 8}}\n",
            key(", default: a rather long client name"),
        ),
        (
            "defaults over max_total_bytes",
            "sessions: {state: {max_value_bytes: 100, max_total_bytes: 30}}\n",
            "state:\n  a: {schema: {type: string}, default: abcdefghij}\n  b: {schema: {type: string}, default: abcdefghij}\n".into(),
        ),
        ("from unknown tool", "", key(", from: [{tool: nope, path: /client}]")),
        ("from excluded MCP tool", "", GUARD_AGENT.replace("  - mcp: notes\n", "") + "  - {mcp: notes, exclude: [secret]}\n" + &key(", from: [{tool: notes__secret, path: /x}]")),
        ("from path and value", "", key(", from: [{tool: lookup, path: /client, value: x}]")),
        ("from neither path nor value", "", key(", from: [{tool: lookup}]")),
        ("from path not a pointer", "", key(", from: [{tool: lookup, path: client}]")),
        ("from value off schema", "", key(", from: [{tool: lookup, value: 3}]")),
        ("from unknown on_missing", "", key(", from: [{tool: lookup, path: /c, on_missing: skip}]")),
        ("unknown key in a state key", "", key(", kind: text")),
        (
            "main context other than state",
            "",
            GUARD_AGENT.replace("  model: fake-1\n", "  model: fake-1\n  context: [user_input]\n") + STATE,
        ),
        (
            "main context unknown key",
            "",
            GUARD_AGENT.replace("  model: fake-1\n", "  model: fake-1\n  context: [{session_state: [cart]}]\n") + STATE,
        ),
        (
            "main context twice",
            "",
            GUARD_AGENT.replace("  model: fake-1\n", "  model: fake-1\n  context: [session_state, {session_state: [lang]}]\n") + STATE,
        ),
        (
            "role session_state unknown key",
            "",
            STATE.to_owned() + ROLE + "    context: [{session_state: [client, cart]}]\n",
        ),
        (
            "role session_state key twice",
            "",
            STATE.to_owned() + ROLE + "    context: [{session_state: [client, client]}]\n",
        ),
        (
            "role session_state empty list",
            "",
            STATE.to_owned() + ROLE + "    context: [{session_state: []}]\n",
        ),
        (
            "template state key not read",
            "",
            STATE.to_owned() + &role("    context: [{session_state: [client]}]\n    input_template: \"{{ args.topic }} {{ context.session_state.lang }}\"\n"),
        ),
        (
            "declared session_state unused",
            "",
            STATE.to_owned() + &role("    context: [session_state]\n    input_template: \"{{ args.topic }}\"\n"),
        ),
        (
            "judge session_state",
            "",
            STATE.to_owned() + "judge: {model: judge-1, criteria: [{name: c, rule: r}], context: [session_state]}\n",
        ),
    ];
    let mut transcript = String::new();
    let mut accepted = Vec::new();
    for (name, root_extra, agent_extra) in &cases {
        match guard_load(root_extra, agent_extra, None) {
            Ok(_) => accepted.push(*name),
            Err(err) => transcript.push_str(&format!("{name}\n  {err}\n")),
        }
    }
    assert!(
        accepted.is_empty(),
        "accepted, expected refusals: {accepted:?}"
    );
    insta::assert_snapshot!("state_refusals", transcript);
}

/// Declared state, read by the orchestrator, a role's context and its template, loads.
#[test]
fn session_state_is_accepted_where_the_reference_allows_it() {
    let agent = GUARD_AGENT.replace(
        "  model: fake-1\n",
        "  model: fake-1\n  context: [{session_state: [client]}]\n",
    ) + STATE
        + &role(
            "    context: [session_state]\n    input_template: \"{{ args.topic }} {{ context.session_state.client }} {{ context.session_state.lang }}\"\n",
        );
    let config = guard_load("", &agent, None).expect("accepted");
    let spec = config.agent("a").expect("agent a");
    assert_eq!(spec.state.len(), 2);
    assert_eq!(spec.state["lang"].default, Some(serde_json::json!("fr")));
    assert_eq!(
        spec.state["client"].from[0].path.as_deref(),
        Some("/client")
    );
    assert_eq!(spec.main.context[0].key(), "session_state");
}

#[test]
fn session_summary_and_compaction_are_accepted() {
    // A role's and a judge's context, and a template, may read the session summary.
    let agent = role(
        "    context: [session_summary]\n    input_template: \"{{ args.topic }} {{ context.session_summary }}\"\n",
    ) + "judge: {model: judge-1, criteria: [{name: c, rule: r}], context: [session_summary]}\n";
    let root = "sessions:\n  compaction: {model: judge-1, over_tokens: 100, hard_tokens: 101, system_file: role.md}\n  history: {max_turns: 4}\n";
    let config = guard_load(root, &agent, None).unwrap();
    assert_eq!(config.compaction_system(), Some("Role of {{ agent }}"));
    let compaction = config.raw().sessions.compaction.clone().unwrap();
    assert_eq!((compaction.keep_last, compaction.blocking), (6, false));
}

#[test]
fn policy_on_a_point_it_does_not_declare() {
    let agent = "policies:\n  - hook: loom.require_tool\n    points: [after_tool]\n";
    assert_eq!(
        guard_refusal("", agent),
        "agents/a.yaml:9:14 policies[0].points[0]: policy 'loom.require_tool' does not apply to \
         after_tool (declared points: before_model)"
    );
}

#[test]
fn require_tool_needs_a_model_that_can_be_forced() {
    let agent = "policies: [{hook: loom.require_tool}]\n";
    // `fake-1` can be forced (the default): accepted.
    guard_load("", agent, None).unwrap();
    // `stubborn` declares `forced_tool_choice: false`: refused.
    let stubborn = GUARD_AGENT.replace("model: fake-1", "model: stubborn");
    let err = load_str(
        GUARD_ROOT,
        &[("agents/a.yaml", &format!("{stubborn}{agent}"))],
        None,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "agents/a.yaml:7:19 policies[0].hook: policy 'loom.require_tool' forces a tool call, but \
         model 'stubborn' cannot be forced (capabilities.forced_tool_choice: false)"
    );
}

#[test]
fn role_that_would_receive_nothing() {
    let err = load_str(
        GUARD_ROOT,
        &[("agents/a.yaml", &format!("{GUARD_AGENT}{ROLE}"))],
        None,
        &no_env,
    )
    .unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Invalid);
    assert_eq!(
        err.to_string(),
        "agents/a.yaml:8:5 roles[0]: role 'writer' has neither arguments nor context: it would \
         receive nothing (declare input_schema properties or context items)"
    );
}

#[test]
fn template_refusals_are_template_errors() {
    let agent = format!(
        "{GUARD_AGENT}{}",
        role(
            "    context: [{tool_results: [lookup]}]\n    input_template: \"{{ args.topic }} {{ context.tool_results.foo }}\"\n"
        )
    );
    let err = load_str(GUARD_ROOT, &[("agents/a.yaml", &agent)], None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Template);
    assert_eq!(
        err.to_string(),
        "agents/a.yaml:13:21 roles[0].input_template: input_template uses \
         'context.tool_results.foo', but 'foo' is not in the tool_results of role 'writer' \
         (declared: lookup)"
    );
}

#[test]
fn budget_share_needs_a_run_budget() {
    let message = guard_refusal("", "subagents: [{agent: helper, budget_share: 0.5}]\n");
    assert_eq!(
        message,
        "agents/a.yaml:7:43 subagents[0].budget_share: budget_share needs a run budget: neither \
         the root budgets.run nor the budget.run of agent 'a' sets a limit to share"
    );
    // The agent's own run budget is enough.
    let agent = format!(
        "{GUARD_AGENT}budget: {{run: {{max_cost: 0.5}}}}\nsubagents: [{{agent: helper, budget_share: 0.5}}]\n"
    );
    load_str(
        GUARD_ROOT,
        &[
            ("agents/a.yaml", &agent),
            (
                "agents/helper.yaml",
                "name: helper\ndescription: Helps\nmain: {model: fake-1}\n",
            ),
        ],
        None,
        &no_env,
    )
    .unwrap();
}

#[test]
fn self_judging_is_an_error_under_prod() {
    let agent = "judge: {model: fake-1, criteria: [{name: polite, rule: Be polite}]}\n";
    assert_eq!(
        guard_refusal_with("", agent, Some(Profile::Prod)),
        "agents/a.yaml:7:16 judge.model: judge 'output' runs on model 'fake-1', the model whose \
         output it judges: a model grading itself is lenient, use another model (refused under \
         the prod profile)"
    );
}

#[test]
fn judge_on_a_tool_is_explained() {
    let agent = GUARD_AGENT.replace(
        "  - tool: lookup\n",
        "  - tool: lookup\n    judge: {model: judge-1}\n",
    );
    assert_eq!(
        guard_refusal("", &agent),
        "agents/a.yaml:6:5 tools[0].judge: unknown key 'judge' (expected one of: python, tool, mcp, source, \
         alias, include, exclude, required, tools, description, timeout, side_effects, approval, \
         idempotent, offload_over, folders, database, tables, max_rows, allow_private, max_bytes, output) — a tool's results \
         are not judged: judges apply to an agent's answer or a role's; give the tool an 'output' \
         contract"
    );
}

#[test]
fn server_http_is_read_with_defaults() {
    let config = load_str(
        &format!("{MODELS}server:\n  http:\n    port: 9001\n"),
        &[],
        None,
        &no_env,
    )
    .unwrap();
    let http = &config.raw().server.http;
    assert_eq!((http.host.as_str(), http.port), ("127.0.0.1", 9001));
    assert_eq!(http.base_path, "");
    assert_eq!(http.max_body_bytes, 134_217_728);
}

#[test]
fn server_base_path_must_start_with_a_slash() {
    let message = refused(
        &format!("{MODELS}server:\n  http:\n    base_path: api\n"),
        &[],
    );
    assert!(
        message.starts_with("loom.yaml:8:16 server.http.base_path: base_path 'api' must be empty or a path starting with '/'"),
        "{message}"
    );
}

#[test]
fn expose_and_server_mcp_are_read_with_defaults() {
    let agents = "agents:\n  - {name: open, main: {model: fake-1}}\n  - {name: hidden, main: {model: fake-1}, expose: {rest: false}}\n";
    let config = load_str(&format!("{MODELS}{agents}"), &[], None, &no_env).unwrap();
    let open = config.agent("open").unwrap().expose;
    assert!(open.rest && open.mcp);
    let hidden = config.agent("hidden").unwrap().expose;
    assert!(!hidden.rest && hidden.mcp);
    let mcp = &config.raw().server.mcp;
    assert!(!mcp.http && mcp.file_roots.is_empty() && mcp.allowed_origins.is_empty());

    let root = format!(
        "{MODELS}server:\n  mcp:\n    file_roots: [docs]\n    allowed_origins: [\"https://app.example.com:*\", \"null\", \"http://[::1]:8080\"]\n    allowed_hosts: [\"example.com:8443\"]\n"
    );
    let config = load_str(&root, &[], None, &no_env).unwrap();
    assert_eq!(config.mcp_file_roots().len(), 1);
    assert!(config.mcp_file_roots()[0].ends_with("docs"));
}

#[test]
fn mcp_over_http_needs_an_api_key() {
    let message = refused(&format!("{MODELS}server:\n  mcp:\n    http: true\n"), &[]);
    assert!(
        message.starts_with("loom.yaml:8:11 server.mcp.http: MCP over HTTP needs at least one API key in security.api_keys"),
        "{message}"
    );
    let with_key = format!(
        "{MODELS}server:\n  mcp:\n    http: true\nsecurity:\n  api_keys:\n    - {{id: k, hash: \"sha256:{KEY_HASH}\"}}\n"
    );
    assert!(
        load_str(&with_key, &[], None, &no_env)
            .unwrap()
            .raw()
            .server
            .mcp
            .http
    );
}

#[test]
fn mcp_origins_and_hosts_must_be_readable() {
    for (mcp, expected) in [
        (
            "allowed_origins: [app.example.com]",
            "server.mcp.allowed_origins[0]: 'app.example.com' is not an origin",
        ),
        (
            "allowed_origins: [\"https://a.example:port\"]",
            "server.mcp.allowed_origins[0]: 'https://a.example:port' is not an origin",
        ),
        (
            "allowed_hosts: [\"http://example.com\"]",
            "server.mcp.allowed_hosts[0]: 'http://example.com' is not a host",
        ),
        (
            "allowed_origins: [\"https://a.example:443:*\"]",
            "server.mcp.allowed_origins[0]: 'https://a.example:443:*' is not an origin",
        ),
        (
            "allowed_origins: [\"https://a.example/app\"]",
            "server.mcp.allowed_origins[0]: 'https://a.example/app' is not an origin",
        ),
        (
            "file_roots: [\"\"]",
            "server.mcp.file_roots[0]: a file root must not be empty",
        ),
    ] {
        let message = refused(&format!("{MODELS}server:\n  mcp:\n    {mcp}\n"), &[]);
        assert!(message.contains(expected), "{mcp}: {message}");
    }
}

#[test]
fn server_http_limits_hosts_and_origins_are_read_and_checked() {
    let http = load_str(MODELS, &[], None, &no_env)
        .unwrap()
        .raw()
        .server
        .http
        .clone();
    assert_eq!(
        (http.header_timeout, http.body_timeout, http.max_connections),
        (10.0, 60.0, 512)
    );
    assert!(http.allowed_hosts.is_empty() && http.allowed_origins.is_empty());
    let root = format!(
        "{MODELS}server:\n  http:\n    header_timeout: 2.5\n    body_timeout: 30\n    max_connections: 64\n    allowed_hosts: [\"loom.example.com\", \"::1\"]\n    allowed_origins: [\"https://front.example\"]\n"
    );
    let http = load_str(&root, &[], None, &no_env)
        .unwrap()
        .raw()
        .server
        .http
        .clone();
    assert_eq!(
        (http.header_timeout, http.body_timeout, http.max_connections),
        (2.5, 30.0, 64)
    );
    for (http, expected) in [
        (
            "header_timeout: 0",
            "server.http.header_timeout: must be greater than 0",
        ),
        (
            "body_timeout: -1",
            "server.http.body_timeout: must be greater than 0",
        ),
        (
            "max_connections: 0",
            "server.http.max_connections: must be greater than 0",
        ),
        (
            "allowed_hosts: [\"a/b\"]",
            "server.http.allowed_hosts[0]: 'a/b' is not a host",
        ),
        (
            "allowed_origins: [\"front.example\"]",
            "server.http.allowed_origins[0]: 'front.example' is not an origin",
        ),
    ] {
        let message = refused(&format!("{MODELS}server:\n  http:\n    {http}\n"), &[]);
        assert!(message.contains(expected), "{http}: {message}");
    }
}

#[test]
fn an_agent_offered_over_mcp_cannot_take_a_control_tool_name() {
    for name in ["run_status", "run_report", "cancel"] {
        let message = refused(
            &format!("{MODELS}agents:\n  - {{name: {name}, main: {{model: fake-1}}}}\n"),
            &[],
        );
        assert!(
            message.contains(&format!(
                "agents[0].name: the agent name '{name}' is taken by a control tool of the MCP server (run_status, run_report, cancel)"
            )),
            "{message}"
        );
    }
    // Kept off MCP, the name is free.
    let root = format!(
        "{MODELS}agents:\n  - {{name: cancel, main: {{model: fake-1}}, expose: {{mcp: false}}}}\n"
    );
    assert!(load_str(&root, &[], None, &no_env).is_ok());
}

#[test]
fn expose_keys_are_checked() {
    let message = refused(
        &format!(
            "{MODELS}agents:\n  - {{name: a, main: {{model: fake-1}}, expose: {{grpc: true}}}}\n"
        ),
        &[],
    );
    assert!(
        message.contains(
            "agents[0].expose.grpc: unknown key 'grpc' (expected one of: rest, mcp, http)"
        ),
        "{message}"
    );
}

#[test]
fn expose_http_is_read_with_its_defaults() {
    let agents = "agents:\n  - {name: plain, main: {model: fake-1}}\n  - {name: front, main: {model: fake-1}, expose: {http: {enabled: true, allow_anonymous: true, heartbeat_ms: 250}}}\n  - {name: dormant, main: {model: fake-1}, expose: {http: {auth: none}}}\n";
    let config = load_str(&format!("{MODELS}{agents}"), &[], None, &no_env).unwrap();
    let plain = config.agent("plain").unwrap().expose;
    assert!(plain.rest && plain.mcp && plain.http.is_none());
    assert!(plain.http_endpoints().is_none());
    let front = config
        .agent("front")
        .unwrap()
        .expose
        .http_endpoints()
        .unwrap();
    assert_eq!(front.auth, loom_config::HttpAuth::Keys);
    assert!(front.allow_anonymous);
    assert_eq!(front.heartbeat_ms(), 250);
    // A block without `enabled: true` mounts nothing, so it needs no authenticator.
    let dormant = config.agent("dormant").unwrap().expose;
    assert!(dormant.http.is_some() && dormant.http_endpoints().is_none());
}

#[test]
fn expose_http_without_an_authenticator_is_refused_where_written() {
    let key = |extra: &str| {
        format!("security:\n  api_keys:\n    - {{id: k1, hash: \"sha256:{KEY_HASH}\"{extra}}}\n")
    };
    let agent = |http: &str| {
        format!(
            "agents:\n  - name: front\n    main: {{model: fake-1}}\n    expose:\n      http: {http}\n"
        )
    };
    let cases: Vec<(String, &str)> = vec![
        (
            agent("{enabled: true}"),
            "loom.yaml:10:13 agents[0].expose.http.auth: agent 'front' opts in to its own HTTP endpoints (expose.http.enabled) but auth: keys needs at least one API key in security.api_keys, and none is declared: declare a key, or set expose.http.allow_anonymous: true to serve anyone",
        ),
        (
            agent("{enabled: true, auth: none}"),
            "agents[0].expose.http.auth: agent 'front' opts in to its own HTTP endpoints (expose.http.enabled) but auth: none leaves its endpoints without an authenticator",
        ),
        (
            format!("{}{}", agent("{enabled: true}"), key(", scopes: [read]")),
            "agents[0].expose.http.auth: agent 'front' opts in to its own HTTP endpoints (expose.http.enabled) but auth: keys, but no key of security.api_keys has the scope 'run' on the agent 'front'",
        ),
        (
            format!("{}{}", agent("{enabled: true}"), key(", agents: [other]")),
            "no key of security.api_keys has the scope 'run' on the agent 'front'",
        ),
        (
            agent("{enabled: true, allow_anonymous: true, heartbeat_ms: 0}"),
            "agents[0].expose.http.heartbeat_ms: agent 'front': heartbeat_ms must be between 1 and 3600000 (got 0)",
        ),
        (
            agent("{enabled: true, auth: basic}"),
            "agents[0].expose.http.auth: unknown value 'basic' (expected one of: keys, none)",
        ),
    ];
    for (text, expected) in cases {
        let message = refused(&format!("{MODELS}{text}"), &[]);
        assert!(message.contains(expected), "{expected}\n---\n{message}");
    }
    // A usable key, or anonymous callers allowed: accepted.
    for ok in [
        format!(
            "{}{}",
            agent("{enabled: true}"),
            key(", scopes: [run, read]")
        ),
        agent("{enabled: true, auth: none, allow_anonymous: true}"),
        agent("{enabled: true, allow_anonymous: true}"),
    ] {
        let text = format!("{MODELS}{ok}");
        assert!(load_str(&text, &[], None, &no_env).is_ok(), "{text}");
    }
    // In an agent file, the error names the file.
    let message = refused(
        MODELS,
        &[(
            "agents/front.yaml",
            "name: front\nmain: {model: fake-1}\nexpose: {http: {enabled: true}}\n",
        )],
    );
    assert!(
        message.starts_with("agents/front.yaml:3:")
            && message.contains("expose.http.auth: agent 'front'"),
        "{message}"
    );
}

/// A well-formed key hash (`sha256:` + 64 hex).
const KEY_HASH: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn api_keys_are_typed_and_checked_where_written() {
    let key = |body: &str| format!("{MODELS}security:\n  api_keys:\n    - {body}\n");
    let ok = format!("id: k1, hash: \"sha256:{KEY_HASH}\"");
    let cases: Vec<(String, &str)> = vec![
        (
            key("{id: k1, hash: \"sha256:abc\"}"),
            "loom.yaml:8:22 security.api_keys[0].hash: expected 'sha256:' followed by 64 lowercase hex digits",
        ),
        (
            key(&format!("{{id: k1, hash: \"{KEY_HASH}\"}}")),
            "security.api_keys[0].hash: expected 'sha256:'",
        ),
        (
            key(&format!(
                "{{{ok}}}\n    - {{id: k1, hash: \"sha256:{}\"}}",
                KEY_HASH.replace('0', "f")
            )),
            "loom.yaml:9:12 security.api_keys[1].id: duplicate key id 'k1' (already declared at security.api_keys[0])",
        ),
        (
            key(&format!("{{{ok}, tenant: acme}}")),
            "security.api_keys[0].tenant: tenant 'acme' is not declared (without a 'tenants' list, only 'default' exists)",
        ),
        (
            format!("{}tenants: [{{id: acme}}]\n", key(&format!("{{{ok}}}"))),
            "security.api_keys[0].tenant: tenant 'default' is not declared (tenants: acme)",
        ),
        (
            key(&format!("{{{ok}, scopes: [run, write]}}")),
            "security.api_keys[0].scopes[1]: unknown value 'write' (expected one of: run, read, read_content, approve, admin)",
        ),
        (
            key(&format!("{{{ok}, scopes: []}}")),
            "security.api_keys[0].scopes: a key needs at least one scope",
        ),
        (
            key(&format!("{{{ok}, agents: [nobody]}}")),
            "security.api_keys[0].agents[0]: unknown agent 'nobody'",
        ),
        (
            key(&format!("{{{ok}, expires: soon}}")),
            "security.api_keys[0].expires: unreadable expiry 'soon'",
        ),
        (
            key(&format!("{{{ok}, colour: blue}}")),
            "security.api_keys[0].colour: unknown key 'colour' (expected one of: id, hash, tenant, expires, scopes, agents, rate_limit)",
        ),
    ];
    for (root, expected) in cases {
        let message = refused(&root, &[]);
        assert!(
            message.contains(expected),
            "expected {expected:?} in:\n{message}"
        );
    }
}

#[test]
fn api_keys_default_to_tenant_default_and_run_read() {
    let root = format!(
        "{MODELS}tenants: [{{id: acme}}, {{id: default}}]\nsecurity:\n  api_keys:\n    - {{id: k1, hash: \"sha256:{KEY_HASH}\"}}\n    - {{id: k2, hash: \"sha256:{}\", tenant: acme, expires: 2027-01-01, scopes: [approve]}}\n",
        KEY_HASH.replace('1', "e")
    );
    let config = load_str(&root, &[], None, &no_env).unwrap();
    let keys = &config.raw().security.api_keys;
    assert_eq!(keys[0].tenant, "default");
    assert_eq!(keys[0].scopes, vec![Scope::Run, Scope::Read]);
    assert_eq!(keys[0].expires_at(), None);
    assert_eq!(keys[1].tenant, "acme");
    assert!(keys[1].allows(Scope::Approve) && !keys[1].allows(Scope::Run));
    assert_eq!(
        keys[1].expires_at().map(|t| t.to_rfc3339()),
        Some("2027-01-01T00:00:00+00:00".to_owned())
    );
}

#[test]
fn the_docs_switch_and_the_shutdown_timeout_are_read() {
    let root = format!(
        "{MODELS}execution: {{shutdown_timeout: 2.5}}\nserver: {{http: {{docs: false}}}}\n"
    );
    let config = load_str(&root, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    assert_eq!(config.raw().execution.shutdown_timeout, 2.5);
    assert_eq!(config.raw().server.http.docs, Some(false));
    let defaults = load_str(MODELS, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    assert_eq!(defaults.raw().execution.shutdown_timeout, 30.0);
    assert_eq!(defaults.raw().server.http.docs, None);
}

#[test]
fn the_ui_switch_is_read_and_a_non_boolean_is_refused_where_it_is() {
    let root = format!("{MODELS}server: {{http: {{ui: true}}}}\n");
    let config = load_str(&root, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    assert_eq!(config.raw().server.http.ui, Some(true));
    let defaults = load_str(MODELS, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    assert_eq!(defaults.raw().server.http.ui, None);
    let root = format!("{MODELS}server:\n  http:\n    ui: sometimes\n");
    assert_eq!(
        refused(&root, &[("agents/devis.yaml", AGENT_OK)]),
        "loom.yaml:8:9 server.http.ui: invalid type: string \"sometimes\", expected a boolean"
    );
}

#[test]
fn a_negative_shutdown_timeout_is_refused() {
    let root = format!("{MODELS}execution: {{shutdown_timeout: -1}}\n");
    assert_eq!(
        refused(&root, &[("agents/devis.yaml", AGENT_OK)]),
        "loom.yaml:6:31 execution.shutdown_timeout: must be a number of seconds, 0 or more"
    );
}

/// The reference's backends that Loom has no code for yet (the journal idempotency store) are
/// refused as "not yet", at the value.
#[test]
fn reference_backends_without_code_are_refused_as_not_yet() {
    const NOT_YET: &str =
        " — this part of the Loom-IA format is not implemented in this version yet";
    let cases = [(
        "storage:\n  idempotency: {backend: journal}\n",
        "loom.yaml:7:26 storage.idempotency.backend: unknown value 'journal' (expected one of: sqlite, postgres, redis)",
    )];
    for (section, expected) in cases {
        let root = format!("{MODELS}{section}");
        assert_eq!(
            refused(&root, &[]),
            format!("{expected}{NOT_YET}"),
            "{section}"
        );
    }
    // A value the reference does not have either is only unknown.
    let root = format!("{MODELS}storage:\n  events: {{backend: s3}}\n");
    assert_eq!(
        refused(&root, &[]),
        "loom.yaml:7:21 storage.events.backend: unknown value 's3' (expected one of: memory, jsonl, sqlite, postgres)"
    );
}

/// Sections Loom implements are never hinted as "not yet" when written in the wrong place:
/// `circuit_breaker` under an agent and `mcp_servers` under `execution` are plain unknown keys.
#[test]
fn implemented_sections_in_the_wrong_place_are_only_unknown() {
    let root = format!("{MODELS}execution:\n  mcp_servers: []\n");
    let error = refused(&root, &[]);
    assert!(
        error.starts_with("loom.yaml:7:3 execution.mcp_servers: unknown key 'mcp_servers'"),
        "{error}"
    );
    assert!(!error.contains("not implemented"), "{error}");
    let agent = format!("{AGENT_OK}circuit_breaker: {{failures: 3}}\n");
    let error = refused(MODELS, &[("agents/devis.yaml", &agent)]);
    assert!(error.contains("unknown key 'circuit_breaker'"), "{error}");
    assert!(!error.contains("not implemented"), "{error}");
}

#[test]
fn exporters_and_redaction_are_read() {
    let root = format!(
        "{MODELS}telemetry:\n  capture: {{exports: content}}\n  exporters:\n    - {{type: otel, endpoint_env: MY_OTLP, headers_env: MY_HEADERS, service_name: shop, timeout: 3}}\n  redaction:\n    patterns: [email, {{name: dossier, regex: 'DOS-[0-9]+'}}]\n"
    );
    let config = load_str(&root, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    let telemetry = &config.raw().telemetry;
    assert_eq!(telemetry.exporters.len(), 1);
    let exporter = &telemetry.exporters[0];
    assert_eq!(exporter.endpoint_env, "MY_OTLP");
    assert_eq!(exporter.headers_env.as_deref(), Some("MY_HEADERS"));
    assert_eq!(exporter.service_name, "shop");
    assert_eq!(exporter.timeout, 3.0);
    assert_eq!(
        telemetry.capture.exports,
        loom_config::CaptureExports::Content
    );
    assert_eq!(
        telemetry.redaction.patterns,
        vec![
            loom_config::RedactionPattern::Named("email".into()),
            loom_config::RedactionPattern::Custom {
                name: "dossier".into(),
                regex: "DOS-[0-9]+".into()
            }
        ]
    );
    // Defaults: no exporter, metadata only, the four built-in patterns.
    let defaults = load_str(MODELS, &[("agents/devis.yaml", AGENT_OK)], None, &no_env).unwrap();
    let telemetry = &defaults.raw().telemetry;
    assert!(telemetry.exporters.is_empty());
    assert_eq!(
        telemetry.capture.exports,
        loom_config::CaptureExports::Metadata
    );
    assert_eq!(telemetry.redaction.patterns.len(), 4);
}

#[test]
fn bad_exporters_and_redaction_patterns_are_refused_where_written() {
    let cases = [
        (
            "telemetry:\n  exporters: [{protocol: grpc}]\n",
            "loom.yaml:7:26 telemetry.exporters[0].protocol: protocol 'grpc' is not supported: Loom exports over OTLP/HTTP (protocol: http/protobuf, port 4318)",
        ),
        (
            "telemetry:\n  exporters: [{endpoint_env: 'not a name'}]\n",
            "loom.yaml:7:30 telemetry.exporters[0].endpoint_env: 'not a name' is not an environment variable name",
        ),
        (
            "telemetry:\n  exporters: [{headers_env: 'a-b'}]\n",
            "loom.yaml:7:29 telemetry.exporters[0].headers_env: 'a-b' is not an environment variable name",
        ),
        (
            "telemetry:\n  exporters: [{timeout: 0}]\n",
            "loom.yaml:7:25 telemetry.exporters[0].timeout: timeout must be a positive number of seconds",
        ),
        (
            "telemetry:\n  capture: {exports: content}\n",
            "loom.yaml:7:22 telemetry.capture.exports: exports: content without an exporter: declare telemetry.exporters, or leave exports at metadata",
        ),
        (
            "telemetry:\n  redaction: {patterns: [email, phones]}\n",
            "loom.yaml:7:33 telemetry.redaction.patterns[1]: unknown redaction pattern 'phones' (built-in: secret, email, phone, iban; or {name, regex})",
        ),
        (
            "telemetry:\n  redaction: {patterns: [{name: x, regex: '('}]}\n",
            "loom.yaml:7:43 telemetry.redaction.patterns[0].regex: regex of pattern 'x' does not compile",
        ),
        (
            "telemetry:\n  redaction: {patterns: [email, email]}\n",
            "loom.yaml:7:33 telemetry.redaction.patterns[1]: redaction pattern 'email' is listed twice",
        ),
    ];
    for (section, expected) in cases {
        let root = format!("{MODELS}{section}");
        let error = refused(&root, &[("agents/devis.yaml", AGENT_OK)]);
        assert!(
            error.starts_with(expected),
            "{section}\n got: {error}\nwant: {expected}"
        );
    }
}
