//! Valid configurations: loading, profiles, prompts, Rust-built configs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};

use common::{dir_with, load_dir, load_str, no_env};
use loom_config::{
    AgentSpec, Budgets, Config, ConfigErrorKind, ContextItem, ContextName, ContextScope, Criterion,
    DEFAULT_TENANT, EventsBackend, HookPoint, JudgeSpec, JudgeWhen, LastTurnsContext, LogFormat,
    LogLevel, LoomConfig, ModelApi, ModelSpec, OnError, OnExceed, OnFailure, OutputContract,
    PolicyRef, Profile, REQUIRE_TOOL_POLICY, RepairSettings, RepairTools, RoleSpec, Sdk,
    SubAgentRef, TenantSpec, ToolRef, ToolResultsContext,
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
    assert_eq!(raw.execution.attachments.max_bytes, 5_242_880);
    assert_eq!(raw.execution.attachments.max_files, 10);
    assert_eq!(
        raw.execution.attachments.types,
        ["image/jpeg", "image/png", "image/gif", "image/webp"]
    );
    assert_eq!(raw.telemetry.logging.level(), Some(LogLevel::Info));
}

#[test]
fn attachment_limits_are_read() {
    let root = "\
version: 1
execution:
  attachments: {max_bytes: 1000, types: [image/png, application/pdf], max_files: 2}
";
    let config = load_str(root, &[], None, &no_env).unwrap();
    let attachments = &config.raw().execution.attachments;
    assert_eq!(attachments.max_bytes, 1000);
    assert_eq!(attachments.types, ["image/png", "application/pdf"]);
    assert_eq!(attachments.max_files, 2);
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

// ---------------------------------------------------------------------------------------------
// Delegation and guards.

const GUARDED_ROOT: &str = "\
version: 1
models:
  - {id: fake-1, sdk: fake, model: scripted, pricing: {input: 1.0, output: 2.0}}
  - {id: judge-1, sdk: fake, model: judge, capabilities: {vision: true}, pricing: {input: 1.0}}
budgets:
  run: {max_calls: 10, max_cost: 1.5}
  session: {max_tokens: 100000}
  tenant: {max_cost_per_day: 20}
  on_exceed: warn
tenants:
  - id: acme
    agents: [quotes]
    budgets:
      run: {max_cost: 2}
      tenant: {max_tokens_per_month: 1000000}
  - id: dupont.sa
";

const QUOTES_YAML: &str = "\
name: quotes
description: Builds quotes
main:
  model: fake-1
max_depth: 2
budget:
  run: {max_tokens: 5000}
  on_exceed: stop
tools:
  - tool: lookup
    output: {schema_file: schemas/price.yaml, repair: {max_attempts: 0}}
roles:
  - name: writer
    description: Writes the quote
    model: fake-1
    fallbacks: [judge-1]
    system_file: writer.md
    llm: {max_tokens: 300}
    input_schema:
      type: object
      properties:
        topic: {type: string}
      required: [topic]
    context: [user_input, {tool_results: [lookup], scope: session}, {last_turns: 3}]
    input_template: |-
      Topic: {{ args.topic }}
      Request: {{ context.user_input }}
      Prices: {{ context.tool_results.lookup }}
      History: {{ context.last_turns }}
    terminal: true
    timeout: 20
    output: {schema_file: schemas/quote.json, normalize: false}
    judge:
      model: judge-1
      criteria: [{name: complete, rule: Every line has a price}]
  - name: checker
    description: Checks a draft
    model: fake-1
    context: [caller_context]
subagents:
  - agent: helper
    budget_share: 0.5
  - {agent: helper, name: helper_bis, description: The helper again}
policies:
  - hook: loom.require_tool
  - hook: audit
    name: audit_calls
    points: [before_tool, after_tool]
    params: {level: 2}
    timeout: 1.5
    on_error: allow
    max_attempts: 2
output:
  must_match: 'Total: \\d+'
  must_not_match: '(?i)lorem'
  max_chars: 2000
  on_failure: fallback
  fallback_message: Sorry, no quote today.
judge:
  model: judge-1
  criteria:
    - {name: polite, rule: Greets the customer}
    - {name: short, rule: Fits in a page, min_score: 0.5, blocking: false}
  context: [user_input, attachments]
  when: {sample: 0.25, condition: weekdays, tenants: [acme], profiles: [prod]}
  repair: {max_attempts: 2, tools: none}
  on_failure: unverified
  timeout: 30
  on_error: allow
";

fn guarded_dir() -> tempfile::TempDir {
    dir_with(&[
        ("loom.yaml", GUARDED_ROOT),
        ("agents/quotes.yaml", QUOTES_YAML),
        (
            "agents/helper.yaml",
            "name: helper\ndescription: Finds prices\nmain: {model: fake-1}\n",
        ),
        ("prompts/writer.md", "You write quotes for {{ tenant }}."),
        (
            "schemas/quote.json",
            "{\"type\": \"object\", \"required\": [\"total\"]}",
        ),
        (
            "schemas/price.yaml",
            "type: object\nproperties:\n  price: {type: number}\n",
        ),
    ])
}

#[test]
fn guards_load_with_their_defaults() {
    let dir = guarded_dir();
    let config = load_dir(dir.path(), None).unwrap();
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());

    let quotes = config.agent("quotes").unwrap();
    assert_eq!(quotes.max_depth, 2);
    assert_eq!(config.agent("helper").unwrap().max_depth, 1, "default");

    // Tool output: the YAML schema file is loaded into `schema`.
    let price = quotes.tools[0].output.as_ref().unwrap();
    assert_eq!(
        serde_json::Value::Object(price.schema.clone().unwrap()),
        serde_json::json!({"type": "object", "properties": {"price": {"type": "number"}}})
    );
    assert_eq!(price.repair.max_attempts, 0);
    assert_eq!(price.repair.tools, RepairTools::Auto);
    assert!(price.normalize);

    // Roles.
    let writer = &quotes.roles[0];
    assert_eq!(writer.fallbacks, ["judge-1"]);
    assert_eq!(writer.llm.max_tokens, Some(300));
    assert_eq!(writer.argument_names(), ["topic"]);
    assert_eq!(
        writer.context,
        [
            ContextItem::Name(ContextName::UserInput),
            ContextItem::ToolResults(ToolResultsContext {
                tool_results: vec!["lookup".into()],
                scope: ContextScope::Session,
            }),
            ContextItem::LastTurns(LastTurnsContext { last_turns: 3 }),
        ]
    );
    assert!(writer.terminal);
    assert_eq!(writer.timeout, Some(20.0));
    let contract = writer.output.as_ref().unwrap();
    assert_eq!(
        contract.schema_file.as_deref(),
        Some(Path::new("schemas/quote.json"))
    );
    assert_eq!(
        serde_json::Value::Object(contract.schema.clone().unwrap()),
        serde_json::json!({"type": "object", "required": ["total"]})
    );
    assert!(!contract.normalize);
    let writer_judge = writer.judge.as_ref().unwrap();
    assert_eq!(
        writer_judge.name.as_deref(),
        Some("writer"),
        "a role's judge is named after it"
    );
    assert_eq!(writer_judge.criteria[0].min_score, 0.8);
    assert!(writer_judge.criteria[0].blocking);
    assert_eq!(writer_judge.when, JudgeWhen::default());
    assert_eq!(writer_judge.when.sample, 1.0);

    let checker = &quotes.roles[1];
    assert_eq!(
        serde_json::Value::Object(checker.input_schema.clone()),
        serde_json::json!({"type": "object", "properties": {}}),
        "default input schema"
    );
    assert!(checker.input_template.is_none());
    assert!(!checker.terminal);
    assert!(checker.output.is_none() && checker.judge.is_none());
    assert_eq!(config.role_system_prompt("quotes", "checker"), Some(""));

    // Role prompts and input templates.
    assert_eq!(
        config.role_system_prompt("quotes", "writer"),
        Some("You write quotes for {{ tenant }}.")
    );
    assert_eq!(
        config
            .render_role_system("quotes", "writer", "acme")
            .unwrap(),
        "You write quotes for acme."
    );
    let input = config
        .render_role_input(
            "quotes",
            "writer",
            &serde_json::json!({"topic": "roof"}),
            &serde_json::json!({
                "user_input": "a quote please",
                "tool_results": {"lookup": "12 €"},
                "last_turns": "none",
            }),
        )
        .unwrap();
    assert_eq!(
        input.as_deref(),
        Some("Topic: roof\nRequest: a quote please\nPrices: 12 €\nHistory: none")
    );
    assert_eq!(
        config
            .render_role_input(
                "quotes",
                "checker",
                &serde_json::json!({}),
                &serde_json::json!({})
            )
            .unwrap(),
        None
    );
    let err = config
        .render_role_input(
            "quotes",
            "writer",
            &serde_json::json!({}),
            &serde_json::json!({}),
        )
        .unwrap_err();
    assert_eq!(err.kind, ConfigErrorKind::Template);
    assert!(err.to_string().starts_with("agents/quotes.yaml:"), "{err}");
    let err = config
        .render_role_system("quotes", "nobody", "acme")
        .unwrap_err();
    assert_eq!(err.message, "agent 'quotes' has no role 'nobody'");

    // Sub-agents: name and description filled at load.
    let sub = &quotes.subagents[0];
    assert_eq!(sub.name.as_deref(), Some("helper"));
    assert_eq!(sub.tool_name(), "helper");
    assert_eq!(sub.description.as_deref(), Some("Finds prices"));
    assert_eq!(sub.budget_share, Some(0.5));
    let bis = &quotes.subagents[1];
    assert_eq!(bis.tool_name(), "helper_bis");
    assert_eq!(bis.description.as_deref(), Some("The helper again"));

    // Policies: names filled, defaults.
    let require = &quotes.policies[0];
    assert_eq!(require.hook, REQUIRE_TOOL_POLICY);
    assert_eq!(require.name.as_deref(), Some("loom.require_tool"));
    assert_eq!(require.points, None);
    assert_eq!(require.timeout, 5.0);
    assert_eq!(require.on_error, OnError::Block);
    assert_eq!(require.max_attempts, 1);
    let audit = &quotes.policies[1];
    assert_eq!(audit.policy_name(), "audit_calls");
    assert_eq!(
        audit.points.as_deref(),
        Some(&[HookPoint::BeforeTool, HookPoint::AfterTool][..])
    );
    assert_eq!(audit.params["level"], 2);
    assert_eq!(
        (audit.timeout, audit.on_error, audit.max_attempts),
        (1.5, OnError::Allow, 2)
    );

    // Output contract and judge of the final answer.
    let output = quotes.output.as_ref().unwrap();
    assert_eq!(output.must_match.as_deref(), Some("Total: \\d+"));
    assert_eq!(output.max_chars, Some(2000));
    assert_eq!(output.on_failure, OnFailure::Fallback);
    assert_eq!(
        output.fallback_message.as_deref(),
        Some("Sorry, no quote today.")
    );
    assert_eq!(output.repair, RepairSettings::default());
    let judge = quotes.judge.as_ref().unwrap();
    assert_eq!(
        judge.name.as_deref(),
        Some("output"),
        "an agent's judge is named output"
    );
    assert_eq!(judge.criteria.len(), 2);
    assert_eq!(judge.criteria[1].min_score, 0.5);
    assert!(!judge.criteria[1].blocking);
    assert_eq!(judge.when.sample, 0.25);
    assert_eq!(judge.when.condition.as_deref(), Some("weekdays"));
    assert_eq!(
        judge.when.tenants.as_deref(),
        Some(&["acme".to_owned()][..])
    );
    assert_eq!(judge.when.profiles.as_deref(), Some(&[Profile::Prod][..]));
    assert_eq!(judge.repair.tools, RepairTools::None);
    assert_eq!(judge.on_failure, OnFailure::Unverified);
    assert_eq!(judge.on_error, OnError::Allow);
    assert_eq!(judge.timeout, Some(30.0));

    // The file model as written stays available.
    assert!(config.raw().agents.is_empty());
}

#[test]
fn budgets_merge_key_by_key() {
    let dir = guarded_dir();
    let config = load_dir(dir.path(), None).unwrap();
    let root = &config.raw().budgets;
    assert_eq!(root.run.max_calls, Some(10));
    assert_eq!(root.exceed_action(), OnExceed::Warn);

    // quotes: root, then its own budget.
    let quotes = config.effective_budgets("quotes");
    assert_eq!(quotes.run.max_calls, Some(10), "kept from the root");
    assert_eq!(quotes.run.max_cost, Some(1.5), "kept from the root");
    assert_eq!(quotes.run.max_tokens, Some(5000), "the agent's");
    assert_eq!(quotes.session.max_tokens, Some(100_000));
    assert_eq!(quotes.tenant.max_cost_per_day, Some(20.0));
    assert_eq!(
        quotes.exceed_action(),
        OnExceed::Stop,
        "the agent's on_exceed"
    );
    assert_eq!(
        quotes.run.to_run_budget(),
        Some(loom_core::event::RunBudget {
            max_cost: Some(1.5),
            max_tokens: Some(5000),
            max_calls: Some(10),
        })
    );

    // helper has no budget: the root's.
    assert_eq!(config.effective_budgets("helper"), *root);
    assert_eq!(config.effective_budgets("nobody"), *root);

    // With a tenant: root, then tenant, then agent.
    let acme = config.effective_budgets_for("quotes", "acme");
    assert_eq!(acme.run.max_cost, Some(2.0), "the tenant's");
    assert_eq!(acme.run.max_tokens, Some(5000), "the agent's");
    assert_eq!(acme.tenant.max_tokens_per_month, Some(1_000_000));
    assert_eq!(acme.tenant.max_cost_per_day, Some(20.0));
    assert_eq!(config.effective_budgets_for("quotes", "dupont.sa"), quotes);

    // Defaults: no limit, stop.
    let none = Budgets::default();
    assert!(!none.run.has_limit());
    assert_eq!(none.run.to_run_budget(), None);
    assert_eq!(none.exceed_action(), OnExceed::Stop);
}

#[test]
fn tenants_are_a_closed_list() {
    let dir = guarded_dir();
    let config = load_dir(dir.path(), None).unwrap();
    let acme = config.tenant("acme").unwrap();
    assert!(acme.allows_agent("quotes"));
    assert!(!acme.allows_agent("helper"));
    assert!(
        config.tenant("dupont.sa").unwrap().allows_agent("helper"),
        "empty = all"
    );
    config.check_tenant("acme").unwrap();
    let err = config.check_tenant("default").unwrap_err();
    assert_eq!(
        err.to_string(),
        "tenant 'default' is not declared (tenants: acme, dupont.sa)"
    );
    assert_eq!(err.declared, ["acme", "dupont.sa"]);

    // Without a list, only `default` exists.
    let config = load_str("version: 1\n", &[], None, &no_env).unwrap();
    assert!(config.tenant("default").is_none());
    config.check_tenant(DEFAULT_TENANT).unwrap();
    assert_eq!(
        config.check_tenant("acme").unwrap_err().to_string(),
        "tenant 'acme' is not declared (without a 'tenants' list, only 'default' exists)"
    );
}

#[test]
fn self_judging_is_a_warning_outside_prod() {
    let root = "\
version: 1
models:
  - {id: fake-1, sdk: fake, model: scripted}
  - {id: twin, sdk: fake, model: scripted}
";
    let agent = "\
name: a
main: {model: fake-1}
judge:
  model: judge-x
  fallbacks: [twin]
  criteria: [{name: polite, rule: Be polite}]
";
    let root = format!("{root}  - {{id: judge-x, sdk: fake, model: other}}\n");
    let config = load_str(&root, &[("agents/a.yaml", agent)], None, &no_env).unwrap();
    assert_eq!(
        config.warnings(),
        [
            "agents/a.yaml:5:15 judge.fallbacks[0]: judge 'output' runs on model 'twin', the same \
             model (fake scripted) as 'fake-1' whose output it judges: a model grading itself is \
             lenient, use another model (an error under the prod profile)"
        ]
    );
    let err = load_str(
        &root,
        &[("agents/a.yaml", agent)],
        Some(Profile::Prod),
        &no_env,
    )
    .unwrap_err();
    assert!(
        err.message.ends_with("(refused under the prod profile)"),
        "{err}"
    );
}

#[test]
fn rust_built_guards_are_validated_too() {
    let dir = dir_with(&[]);
    let mut raw = LoomConfig::default();
    raw.models.push(ModelSpec::new("m", Sdk::Fake, "scripted"));
    raw.models.push(ModelSpec::new("j", Sdk::Fake, "judge"));
    raw.budgets.run.max_calls = Some(4);
    raw.tenants.push(TenantSpec::new("acme"));

    let mut helper = AgentSpec::new("helper", "m");
    helper.description = "Helps".into();
    let mut agent = AgentSpec::new("a", "m");
    let mut role = RoleSpec::new("writer", "Writes", "m");
    role.context.push(ContextItem::Name(ContextName::UserInput));
    role.judge = Some(JudgeSpec::new(
        "j",
        vec![Criterion::new("polite", "Be polite")],
    ));
    agent.roles.push(role);
    let mut sub = SubAgentRef::new("helper");
    sub.budget_share = Some(0.5);
    agent.subagents.push(sub);
    agent.policies.push(PolicyRef::new(REQUIRE_TOOL_POLICY));
    agent.output = Some(OutputContract {
        max_chars: Some(100),
        ..OutputContract::default()
    });
    agent.budget = Some(Budgets {
        on_exceed: Some(OnExceed::Warn),
        ..Budgets::default()
    });
    raw.agents.push(helper);
    raw.agents.push(agent);

    let config = Config::new(raw.clone(), dir.path().to_path_buf()).unwrap();
    let a = config.agent("a").unwrap();
    assert_eq!(
        a.roles[0].judge.as_ref().unwrap().name.as_deref(),
        Some("writer")
    );
    assert_eq!(a.subagents[0].description.as_deref(), Some("Helps"));
    assert_eq!(
        config.effective_budgets("a").exceed_action(),
        OnExceed::Warn
    );
    assert_eq!(config.effective_budgets("a").run.max_calls, Some(4));
    config.check_tenant("acme").unwrap();
    assert_eq!(config.raw(), &raw, "raw keeps what was given");

    // Same refusals, without locations.
    let mut bad = raw.clone();
    bad.agents[1].roles[0].context.clear();
    assert_eq!(
        Config::new(bad, dir.path().to_path_buf())
            .unwrap_err()
            .to_string(),
        "loom.yaml agents[1].roles[0]: role 'writer' has neither arguments nor context: it would \
         receive nothing (declare input_schema properties or context items)"
    );
    let mut bad = raw;
    bad.budgets.run.max_calls = None;
    assert_eq!(
        Config::new(bad, dir.path().to_path_buf())
            .unwrap_err()
            .to_string(),
        "loom.yaml agents[1].subagents[0].budget_share: budget_share needs a run budget: neither \
         the root budgets.run nor the budget.run of agent 'a' sets a limit to share"
    );
}

#[test]
fn a_money_budget_needs_every_model_it_bounds_priced() {
    let root = "\
version: 1
models:
  - {id: main-1, sdk: fake, model: main, pricing: {input: 1.0}}
  - {id: judge-1, sdk: fake, model: judge}
  - {id: child-1, sdk: fake, model: child}
";
    // A judge's model counts in the agent's cost: it must be priced.
    let judged = "\
name: a
main: {model: main-1}
judge:
  model: judge-1
  criteria: [{name: polite, rule: Be polite}]
budget:
  session: {max_cost: 0.5}
";
    let err = load_str(
        root,
        &[("agents/a.yaml", judged)],
        Some(Profile::Prod),
        &no_env,
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "agents/a.yaml:7:23 budget.session.max_cost: a money budget, but model 'judge-1' \
         (judge.model of agent 'a') has no pricing: its calls would count as 0 $ and the budget \
         might never be reached; declare the model's pricing (models[].pricing, dollars per \
         million tokens) (refused under the prod profile)"
    );
    // A sub-agent's cost rolls up into its caller's run: its models count too.
    let caller = "\
name: a
main: {model: main-1}
subagents: [{agent: b}]
budget:
  run: {max_cost: 0.5}
";
    let child = "name: b\ndescription: Helps.\nmain: {model: child-1}\n";
    let files = [("agents/a.yaml", caller), ("agents/b.yaml", child)];
    let err = load_str(root, &files, Some(Profile::Prod), &no_env).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "agents/a.yaml:5:19 budget.run.max_cost: a money budget, but model 'child-1' \
             (main.model of agent 'b') has no pricing"
        ),
        "{err}"
    );
    // Outside prod: loaded, with the warning.
    let config = load_str(root, &files, None, &no_env).unwrap();
    assert_eq!(config.warnings().len(), 1, "{:?}", config.warnings());
    assert!(config.warnings()[0].ends_with("(an error under the prod profile)"));
    // Without a money limit, an unpriced model is fine.
    let counted = "name: a\nmain: {model: child-1}\nbudget:\n  run: {max_calls: 3}\n";
    let config = load_str(
        root,
        &[("agents/a.yaml", counted)],
        Some(Profile::Prod),
        &no_env,
    )
    .unwrap();
    assert!(config.warnings().is_empty(), "{:?}", config.warnings());
}
