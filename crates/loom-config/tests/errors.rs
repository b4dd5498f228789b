//! Broken configurations: each refusal names the file, line, column, key path and reason.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{load_str, no_env, refused, refused_with};
use loom_config::{ConfigErrorKind, Profile};

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
    let root = "version: 1\nbudgets: {}\n";
    assert_eq!(
        refused(root, &[]),
        "loom.yaml:2:1 budgets: unknown key 'budgets' (expected one of: version, \
         profile, profiles, agents_dir, prompts_dir, models, mcp_servers, agents, storage, execution, \
         telemetry) — this part of the Loom-IA format is not implemented in this version yet"
    );
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
         (expected one of: model, fallbacks, system, system_file, llm)"
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
         python, tool, mcp, alias, include, exclude, required, tools, description, timeout, \
         side_effects, approval, idempotent, offload_over, folders, allow_private, max_bytes)"
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
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.excel\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:11 tools[0].tool: unknown built-in tool 'loom.excel' (built-in tools: \
         loom.current_datetime, loom.local_files, loom.fetch_page)"
    );
    let agent = "name: a\nmain:\n  model: fake-1\ntools:\n  - tool: loom.local_files\n";
    assert_eq!(
        refused(MCP_SERVERS, &[("agents/a.yaml", agent)]),
        "agents/a.yaml:5:11 tools[0].tool: loom.local_files needs 'folders' (at least one)"
    );
}
