//! Valid configurations: loading, profiles, prompts, Rust-built configs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{dir_with, load_dir, load_str, no_env};
use loom_config::{
    AgentSpec, Config, ConfigErrorKind, EventsBackend, LogFormat, LogLevel, LoomConfig, ModelApi,
    ModelSpec, Profile, Sdk, ToolRef,
};
use loom_core::tool::{Approval, SideEffects};

const LOOM_YAML: &str = "\
version: 1
profile: dev
models:
  - id: fake-1
    sdk: fake
    model: scripted
    params:
      script: [hello]
  - id: gpt
    sdk: openai
    api: responses
    model: gpt-5
    api_key_env: OPENAI_API_KEY
    capabilities:
      thinking: true
      context_window: 400000
    pricing:
      input: 1.25
      output: 10
      tiers:
        - above: 200000
          input: 2.5
storage:
  events:
    backend: jsonl
    path: data/events
execution:
  tools:
    timeout: 10
telemetry:
  logging:
    level: debug
    format: json
agents:
  - name: helper
    main:
      model: fake-1
      system: \"You help {{ tenant }}.\"
profiles:
  dev:
    execution:
      tools:
        offload_over: 1000
  prod:
    telemetry:
      logging:
        level: WARNING
    models:
      - id: fake-1
        sdk: fake
        model: prod-scripted
      - id: gpt
        sdk: openai
        model: gpt-5-mini
";

const DEVIS_YAML: &str = "\
name: devis
description: Builds quotes
main:
  model: fake-1
  system_file: devis.md
  llm:
    max_tokens: 512
max_iterations: 5
timeout: 120
tools:
  - tool: lookup_price
    side_effects: none
  - python: send_quote
    approval: always
    side_effects: irreversible
    timeout: 5
";

const ZETA_YML: &str = "\
name: zeta
main: {model: gpt}
";

const DEVIS_MD: &str = "You are {{ agent }}, quoting for {{ tenant }}.\n";

fn valid_dir() -> tempfile::TempDir {
    dir_with(&[
        ("loom.yaml", LOOM_YAML),
        ("agents/devis.yaml", DEVIS_YAML),
        ("agents/zeta.yml", ZETA_YML),
        ("agents/notes.txt", "not an agent"),
        ("prompts/devis.md", DEVIS_MD),
    ])
}

#[test]
fn valid_directory_loads() {
    let dir = valid_dir();
    let config = load_dir(dir.path(), None).unwrap();

    assert_eq!(config.file(), dir.path().join("loom.yaml"));
    assert_eq!(config.base_dir(), dir.path());
    assert_eq!(config.profile(), Some(Profile::Dev));
    assert_eq!(config.agents_dir(), dir.path().join("agents"));
    assert_eq!(config.prompts_dir(), dir.path().join("prompts"));
    assert_eq!(config.events_path(), Some(dir.path().join("data/events")));

    let names: Vec<&str> = config.agents().iter().map(|a| a.name.as_str()).collect();
    assert_eq!(names, ["devis", "zeta", "helper"]);

    let devis = config.agent("devis").unwrap();
    assert_eq!(devis.description, "Builds quotes");
    assert_eq!(devis.max_iterations, 5);
    assert_eq!(devis.timeout, Some(120.0));
    assert_eq!(devis.main.llm.max_tokens, Some(512));
    assert_eq!(devis.tools.len(), 2);
    assert_eq!(devis.tools[0].tool.as_deref(), Some("lookup_price"));
    assert_eq!(devis.tools[0].side_effects, Some(SideEffects::None));
    assert_eq!(
        devis.tools[1].tool.as_deref(),
        Some("send_quote"),
        "alias `python`"
    );
    assert_eq!(devis.tools[1].approval, Some(Approval::Always));
    assert_eq!(devis.tools[1].timeout, Some(5.0));
    assert_eq!(config.agent("zeta").unwrap().max_iterations, 10);

    let gpt = config.model("gpt").unwrap();
    assert_eq!(gpt.sdk, Sdk::Openai);
    assert_eq!(gpt.effective_api(), ModelApi::Responses);
    assert!(gpt.capabilities.reasoning, "alias `thinking`");
    assert!(gpt.capabilities.tools);
    assert_eq!(gpt.capabilities.context_window, Some(400_000));
    assert_eq!(gpt.pricing.tiers[0].input, Some(2.5));
    let fake = config.model("fake-1").unwrap();
    assert_eq!(fake.effective_api(), ModelApi::Chat);
    assert_eq!(fake.params["script"], serde_json::json!(["hello"]));

    let raw = config.raw();
    assert_eq!(raw.storage.events.backend, EventsBackend::Jsonl);
    assert_eq!(raw.execution.tools.timeout, Some(10.0));
    assert!(raw.execution.tools.validate_arguments);
    assert_eq!(raw.execution.tools.offload_over, Some(1000), "dev profile");
    assert_eq!(raw.telemetry.logging.level(), Some(LogLevel::Debug));
    assert_eq!(raw.telemetry.logging.format, LogFormat::Json);
    assert_eq!(raw.agents.len(), 1, "raw keeps the inline agents only");

    assert_eq!(config.system_prompt("devis"), Some(DEVIS_MD));
    assert_eq!(
        config.system_prompt("helper"),
        Some("You help {{ tenant }}.")
    );
    assert_eq!(config.system_prompt("zeta"), Some(""));
    assert_eq!(config.system_prompt("nobody"), None);
    assert_eq!(
        config.render_system("devis", "acme").unwrap(),
        "You are devis, quoting for acme."
    );
    assert_eq!(
        config.render_system("helper", "acme").unwrap(),
        "You help acme."
    );
    let err = config.render_system("nobody", "acme").unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Reference);
}

#[test]
fn defaults_apply() {
    let config = load_str("version: 1\n", &[], None, &no_env).unwrap();
    let raw = config.raw();
    assert_eq!(raw, &LoomConfig::default());
    assert_eq!(config.profile(), None);
    assert!(config.agents().is_empty(), "missing agents_dir is fine");
    assert_eq!(config.events_path(), None);
    assert_eq!(raw.execution.tools.timeout, Some(30.0));
    assert_eq!(raw.execution.tools.offload_over, Some(50_000));
    assert_eq!(raw.telemetry.logging.level(), Some(LogLevel::Info));
}

#[test]
fn yaml_merge_keys_are_allowed() {
    let root = "\
version: 1
models:
  - &base
    id: a
    sdk: openai
    model: gpt-5
    api: responses
  - <<: *base
    id: b
";
    let config = load_str(root, &[], None, &no_env).unwrap();
    let b = config.model("b").unwrap();
    assert_eq!(b.model, "gpt-5");
    assert_eq!(b.api, Some(ModelApi::Responses));
}

#[test]
fn profile_precedence_override_then_env_then_file() {
    let dir = valid_dir();
    let path = dir.path().join("loom.yaml");
    let env_prod = |name: &str| (name == "LOOM_PROFILE").then(|| "prod".to_owned());
    let env_dev = |name: &str| (name == "LOOM_PROFILE").then(|| "dev".to_owned());

    // File only: dev.
    let config = loom_config::load(&path, None, &no_env).unwrap();
    assert_eq!(config.profile(), Some(Profile::Dev));

    // LOOM_PROFILE beats the file.
    let config = loom_config::load(&path, None, &env_prod).unwrap();
    assert_eq!(config.profile(), Some(Profile::Prod));
    assert_eq!(config.raw().profile, Some(Profile::Prod));

    // The explicit override beats LOOM_PROFILE.
    let config = loom_config::load(&path, Some(Profile::Dev), &env_prod).unwrap();
    assert_eq!(config.profile(), Some(Profile::Dev));
    let config = loom_config::load(&path, Some(Profile::Prod), &env_dev).unwrap();
    assert_eq!(config.profile(), Some(Profile::Prod));

    // An empty LOOM_PROFILE counts as unset.
    let env_empty = |name: &str| (name == "LOOM_PROFILE").then(String::new);
    let config = loom_config::load(&path, None, &env_empty).unwrap();
    assert_eq!(config.profile(), Some(Profile::Dev));
}

#[test]
fn profile_deep_merge() {
    let dir = valid_dir();
    let config = load_dir(dir.path(), Some(Profile::Prod)).unwrap();
    let raw = config.raw();
    // Mappings are merged key by key: level overridden, format kept.
    assert_eq!(raw.telemetry.logging.level(), Some(LogLevel::Warn));
    assert_eq!(raw.telemetry.logging.format, LogFormat::Json);
    // Lists are replaced whole.
    let ids: Vec<&str> = raw.models.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["fake-1", "gpt"]);
    assert_eq!(raw.models[0].model, "prod-scripted");
    assert!(raw.models[0].params.is_empty());
    assert_eq!(raw.models[1].api, None);
    assert!(raw.models[1].pricing.tiers.is_empty());
    // The dev block does not apply.
    assert_eq!(raw.execution.tools.offload_over, Some(50_000));
    assert_eq!(raw.execution.tools.timeout, Some(10.0));
}

#[test]
fn profile_merges_scalars_inside_mappings() {
    let root = "\
version: 1
models:
  - id: m
    sdk: fake
    model: x
execution:
  tools:
    timeout: 5
    offload_over: 10
profiles:
  prod:
    execution:
      tools:
        timeout: 7
";
    let config = load_str(root, &[], Some(Profile::Prod), &no_env).unwrap();
    assert_eq!(config.raw().execution.tools.timeout, Some(7.0));
    assert_eq!(config.raw().execution.tools.offload_over, Some(10));
}

#[test]
fn relative_config_path_is_displayed_as_given() {
    let dir = dir_with(&[("cfg/loom.yaml", "version: 1\nagents_dir: agents\n")]);
    let path = dir.path().join("cfg/loom.yaml");
    loom_config::load(&path, None, &no_env).unwrap();

    let dir = dir_with(&[("loom.yaml", "version: 2\n")]);
    let path = dir.path().join("loom.yaml");
    let err = loom_config::load(&path, None, &no_env).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{}:1:10 version: unsupported config version 2 (expected 1)",
            path.display()
        )
    );

    let missing = dir.path().join("nope.yaml");
    let err = loom_config::load(&missing, None, &no_env).unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::MissingFile);
    assert_eq!(err.file, missing);
}

#[test]
fn error_at_agent_locates_in_agent_file_or_root() {
    let dir = valid_dir();
    let config = load_dir(dir.path(), None).unwrap();

    let err = config.error_at_agent("devis", "tools[1].tool", "unknown tool 'send_quote'");
    assert_eq!(
        err.to_string(),
        "agents/devis.yaml:13:13 tools[1].tool: unknown tool 'send_quote'"
    );
    assert_eq!(err.kind, ConfigErrorKind::Reference);

    // Inline agent: located in the config file, key path from the root.
    let err = config.error_at_agent("helper", "main.model", "boom");
    let root = dir.path().join("loom.yaml");
    assert_eq!(
        err.to_string(),
        format!("{}:37:14 agents[0].main.model: boom", root.display())
    );

    // A path that does not exist falls back to the nearest ancestor.
    let err = config.error_at_agent("zeta", "tools[0].tool", "x");
    assert_eq!(err.to_string(), "agents/zeta.yml:1:1 tools[0].tool: x");

    // Unknown agent: no location.
    let err = config.error_at_agent("nobody", "tools[0]", "x");
    assert_eq!(err.to_string(), format!("{} tools[0]: x", root.display()));
}

#[test]
fn rust_built_config_is_validated_the_same_way() {
    let dir = dir_with(&[("prompts/p.md", "Hi {{ agent }}")]);
    let mut raw = LoomConfig::default();
    raw.models.push(ModelSpec::new("m", Sdk::Fake, "scripted"));
    let mut agent = AgentSpec::new("a", "m");
    agent.main.system_file = Some(PathBuf::from("p.md"));
    agent.tools.push(ToolRef::new("t"));
    raw.agents.push(agent);

    let config = Config::new(raw.clone(), dir.path().to_path_buf()).unwrap();
    assert_eq!(config.render_system("a", "t1").unwrap(), "Hi a");
    assert_eq!(config.raw(), &raw);
    assert_eq!(config.file(), dir.path().join("loom.yaml"));

    // Same refusals, without locations.
    let mut bad = raw.clone();
    bad.agents[0].main.model = "X".into();
    let err = Config::new(bad, dir.path().to_path_buf()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "loom.yaml agents[0].main.model: unknown model 'X' (declared models: m)"
    );

    let mut bad = raw.clone();
    bad.models[0].api = Some(ModelApi::Chat);
    let err = Config::new(bad, dir.path().to_path_buf()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "loom.yaml models[0].api: 'api' is only valid with sdk 'openai' (model 'm' uses sdk 'fake')"
    );

    let mut bad = raw;
    bad.version = 3;
    let err = Config::new(bad, Path::new("").to_path_buf()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "loom.yaml version: unsupported config version 3 (expected 1)"
    );
}

#[test]
fn rust_config_with_profiles() {
    let mut raw = LoomConfig {
        profile: Some(Profile::Prod),
        ..LoomConfig::default()
    };
    let overrides = serde_json::json!({"telemetry": {"logging": {"level": "error"}}});
    raw.profiles.prod = Some(overrides.as_object().unwrap().clone());
    let config = Config::new(raw, PathBuf::from("/nonexistent")).unwrap();
    assert_eq!(
        config.raw().telemetry.logging.level(),
        Some(LogLevel::Error)
    );
}
