//! What a tenant overrides (`tenants[]`): each refusal is located at the offending value, and
//! what is accepted reads back through `Config`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{load_str, no_env};
use loom_config::{Profile, SecretSource};

const ROOT: &str = "\
version: 1
models:
  - {id: fake-1, sdk: fake, model: scripted}
  - {id: fake-2, sdk: fake, model: other}
  - {id: blind, sdk: fake, model: blind, capabilities: {tools: false}}
  - {id: claude, sdk: anthropic, model: claude-x, api_key_env: ANTHROPIC_KEY}
mcp_servers:
  - name: crm
    transport: http
    url: http://127.0.0.1:9/mcp
    scope: tenant
    headers_env: {Authorization: CRM_TOKEN}
  - name: notes
    transport: stdio
    command: notes
    env_from: {NOTES_KEY: NOTES_KEY}
storage:
  events: {backend: jsonl, path: data}
";

const AGENT: &str = "\
name: a
main:
  model: fake-1
  system: \"You help {{ company }} ({{ tenant }}).\"
tools:
  - tool: lookup
  - tool: loom.current_datetime
  - mcp: crm
roles:
  - name: writer
    model: fake-1
    description: Writes
    context: [user_input]
subagents:
  - agent: helper
";

const HELPER: &str = "name: helper\ndescription: Helps\nmain: {model: fake-1}\n";

fn load(tenants: &str) -> Result<loom_config::Config, loom_config::ConfigError> {
    load_with(ROOT, tenants)
}

fn load_with(root: &str, tenants: &str) -> Result<loom_config::Config, loom_config::ConfigError> {
    load_str(
        &format!("{root}tenants:\n{tenants}"),
        &[("agents/a.yaml", AGENT), ("agents/helper.yaml", HELPER)],
        None,
        &no_env,
    )
}

/// Every tenant refusal, one line each: the file, line, column, key path and reason.
#[test]
fn tenant_refusals_snapshot() {
    let v = "    variables: {company: Acme}\n";
    let cases: Vec<(&str, String)> = vec![
        (
            "secret named nowhere",
            format!("  - id: acme\n{v}    secrets: {{CRM: ACME_CRM}}\n"),
        ),
        (
            "secret variable name",
            format!("  - id: acme\n{v}    secrets: {{CRM_TOKEN: \"acme crm\"}}\n"),
        ),
        (
            "secret empty file",
            format!("  - id: acme\n{v}    secrets: {{CRM_TOKEN: {{file: \"\"}}}}\n"),
        ),
        (
            "secret unknown shape",
            format!("  - id: acme\n{v}    secrets: {{CRM_TOKEN: {{env: X}}}}\n"),
        ),
        (
            "variable used by a prompt defined by no tenant",
            "  - id: acme\n    variables: {tone: dry}\n".into(),
        ),
        (
            "variable used by a prompt undefined for one tenant",
            format!("  - id: acme\n{v}  - id: dupont\n    variables: {{tone: dry}}\n"),
        ),
        (
            "variable reserved",
            "  - id: acme\n    variables: {company: A, tenant: x}\n".into(),
        ),
        (
            "variable not an identifier",
            "  - id: acme\n    variables: {company: A, my-var: x}\n".into(),
        ),
        (
            "model from undeclared",
            format!("  - id: acme\n{v}    models: {{gpt-9: fake-2}}\n"),
        ),
        (
            "model to undeclared",
            format!("  - id: acme\n{v}    models: {{fake-1: gpt-9}}\n"),
        ),
        (
            "model to itself",
            format!("  - id: acme\n{v}    models: {{fake-1: fake-1}}\n"),
        ),
        (
            "model to a lesser model",
            format!("  - id: acme\n{v}    models: {{fake-1: blind}}\n"),
        ),
        (
            "deny unknown tool",
            format!("  - id: acme\n{v}    tools_deny: [delete_all]\n"),
        ),
        (
            "deny twice",
            format!("  - id: acme\n{v}    tools_deny: [lookup, lookup]\n"),
        ),
        (
            "deny a tool of an agent the tenant may not run",
            format!("  - id: b\n{v}  - id: acme\n    agents: [helper]\n    tools_deny: [lookup]\n"),
        ),
        (
            "approval unknown tool",
            format!("  - id: acme\n{v}    approvals: {{delete_all: always}}\n"),
        ),
        (
            "approval of a sub-agent",
            format!("  - id: acme\n{v}    approvals: {{helper: always}}\n"),
        ),
        (
            "approval unknown value",
            format!("  - id: acme\n{v}    approvals: {{lookup: sometimes}}\n"),
        ),
        (
            "capture exports",
            format!("  - id: acme\n{v}    telemetry: {{capture: {{exports: content}}}}\n"),
        ),
        (
            "capture zero bytes",
            format!("  - id: acme\n{v}    telemetry: {{capture: {{raw_max_bytes: 0}}}}\n"),
        ),
        (
            "capture unknown key",
            format!("  - id: acme\n{v}    telemetry: {{redaction: {{}}}}\n"),
        ),
        (
            "storage without events",
            format!("  - id: acme\n{v}    storage: {{artifacts: {{backend: memory}}}}\n"),
        ),
        (
            "storage idempotency",
            format!(
                "  - id: acme\n{v}    storage: {{events: {{backend: jsonl, path: acme}}, idempotency: {{backend: sqlite}}}}\n"
            ),
        ),
        (
            "storage jsonl without path",
            format!("  - id: acme\n{v}    storage: {{events: {{backend: jsonl}}}}\n"),
        ),
        (
            "storage postgres",
            format!("  - id: acme\n{v}    storage: {{events: {{backend: postgres}}}}\n"),
        ),
        (
            "retention zero",
            format!("  - id: acme\n{v}    retention: {{events_days: 0}}\n"),
        ),
        (
            "retention unknown key",
            format!("  - id: acme\n{v}    retention: {{days: 3}}\n"),
        ),
    ];
    let mut transcript = String::new();
    let mut accepted = Vec::new();
    for (name, tenants) in &cases {
        match load(tenants) {
            Ok(_) => accepted.push(*name),
            Err(err) => transcript.push_str(&format!("{name}\n  {err}\n")),
        }
    }
    assert!(
        accepted.is_empty(),
        "accepted, expected refusals: {accepted:?}"
    );
    insta::assert_snapshot!("tenant_refusals", transcript);
}

/// A server read through a secret some tenant redirects cannot share one connection between
/// tenants.
#[test]
fn a_shared_server_whose_secret_a_tenant_redirects_is_refused() {
    let root = ROOT.replace("    scope: tenant\n", "");
    let error = load_with(
        &root,
        "  - id: acme\n    variables: {company: Acme}\n    secrets: {CRM_TOKEN: ACME_CRM}\n",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        "loom.yaml:8:5 mcp_servers[0].scope: server 'crm' reads the secret CRM_TOKEN, which \
         tenant 'acme' redirects (tenants[0].secrets.CRM_TOKEN): one shared connection would \
         carry one tenant's credentials for all; set scope: tenant (or scope: run)"
    );
    // The same server with the stdio secret of another server is fine: only `crm` is shared.
    let notes = load_with(
        &ROOT.replace(
            "    command: notes\n",
            "    command: notes\n    scope: run\n",
        ),
        "  - id: acme\n    variables: {company: Acme}\n    secrets: {NOTES_KEY: {file: keys/notes}}\n",
    );
    assert!(notes.is_ok(), "{notes:?}");
}

/// `approval: always` pauses the tenant's runs: refused on the memory journal outside `dev`.
#[test]
fn an_always_approval_needs_a_durable_journal() {
    let root = ROOT.replace("storage:\n  events: {backend: jsonl, path: data}\n", "");
    let tenants =
        "  - id: acme\n    variables: {company: Acme}\n    approvals: {crm__delete: always}\n";
    let error = load_with(&root, tenants).unwrap_err().to_string();
    assert!(
        error.starts_with("loom.yaml:") && error.contains(" tenants[0].approvals.crm__delete: tool 'crm__delete' would pause tenant 'acme''s runs"),
        "{error}"
    );
    let dev = load_str(
        &format!("{root}tenants:\n{tenants}"),
        &[("agents/a.yaml", AGENT), ("agents/helper.yaml", HELPER)],
        Some(Profile::Dev),
        &no_env,
    );
    assert!(dev.is_ok(), "{dev:?}");
}

/// An agent no tenant may run has no tenant variables.
#[test]
fn a_prompt_variable_of_an_agent_no_tenant_may_run_is_refused() {
    let error = load("  - id: acme\n    agents: [helper]\n    variables: {company: Acme}\n")
        .unwrap_err()
        .to_string();
    assert_eq!(
        error,
        "agents/a.yaml:4:11 main.system: template variable 'company' is defined by no tenant \
         that may run agent 'a' (no tenant lists it in its agents, nor an agent delegating to it)"
    );
}

/// What is accepted reads back: secrets by name, variables, mapping, capture, storage,
/// retention.
#[test]
fn accepted_overrides_read_back() {
    let config = load(
        "  - id: acme
    variables: {company: Acme Corp}
    secrets: {CRM_TOKEN: ACME_CRM, ANTHROPIC_KEY: {file: keys/acme}}
    models: {fake-1: fake-2}
    tools_deny: [current_datetime, crm__delete, writer, helper]
    approvals: {lookup: always, crm__send: never}
    telemetry: {capture: {raw_exchanges: true}}
    storage: {events: {backend: jsonl, path: tenants/acme}}
    retention: {events_days: 30}
  - id: dupont
    variables: {company: Dupont}
",
    )
    .unwrap();
    assert_eq!(
        config.tenant_secret("acme", "CRM_TOKEN"),
        Some(&SecretSource::Env("ACME_CRM".into()))
    );
    assert_eq!(config.tenant_secret("dupont", "CRM_TOKEN"), None);
    assert_eq!(config.tenant_model("acme", "fake-1"), "fake-2");
    assert_eq!(config.tenant_model("dupont", "fake-1"), "fake-1");
    assert!(config.capture_for("acme").raw_exchanges);
    assert!(!config.capture_for("dupont").raw_exchanges);
    assert_eq!(
        config.tenant_events_path("acme"),
        Some(config.base_dir().join("tenants/acme"))
    );
    assert_eq!(
        config.tenant_artifacts_path("acme"),
        Some(config.base_dir().join("tenants/acme/.artifacts"))
    );
    assert_eq!(config.tenant_events_path("dupont"), None);
    assert_eq!(
        config
            .tenant("acme")
            .unwrap()
            .retention
            .as_ref()
            .and_then(|r| r.events_days),
        Some(30)
    );
    assert_eq!(
        config.render_system("a", "acme").unwrap(),
        "You help Acme Corp (acme)."
    );
    assert_eq!(
        config.render_system("a", "dupont").unwrap(),
        "You help Dupont (dupont)."
    );
    let names: Vec<String> = config.secret_names().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["ANTHROPIC_KEY", "CRM_TOKEN", "NOTES_KEY"]);
}

/// A sub-agent runs for its parent's tenant: its prompt's variables must be that tenant's too.
#[test]
fn a_sub_agent_prompt_variable_is_checked_for_the_tenants_of_its_parent() {
    let helper =
        "name: helper\ndescription: Helps\nmain: {model: fake-1, system: \"For {{ region }}\"}\n";
    let load = |tenants: &str| {
        load_str(
            &format!("{ROOT}tenants:\n{tenants}"),
            &[("agents/a.yaml", AGENT), ("agents/helper.yaml", helper)],
            None,
            &no_env,
        )
    };
    let error = load(
        "  - id: acme\n    agents: [a]\n    variables: {company: Acme}\n  - id: other\n    agents: [helper]\n    variables: {region: Nord}\n",
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        error,
        "agents/helper.yaml:3:31 main.system: template variable 'region' is not defined for \
         tenant 'acme', whose runs may use agent 'helper' (tenants[0].variables: company)"
    );
    let both = load("  - id: acme\n    agents: [a]\n    variables: {company: Acme, region: Sud}\n");
    assert!(both.is_ok(), "{both:?}");
}
