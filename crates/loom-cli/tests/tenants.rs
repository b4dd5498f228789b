//! `loom validate` shows what each tenant gets: its agents, denied tools, model mapping,
//! approvals, secret names (whether each has a value, never the value), variables' names,
//! journal, retention and capture.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, process::Command};

use common::*;

const CONFIG: &str = r#"version: 1
models:
  - {id: fake-1, sdk: fake, model: FAKE}
  - {id: fake-2, sdk: fake, model: FAKE-2}
mcp_servers:
  - name: crm
    transport: http
    url: http://127.0.0.1:9/mcp
    scope: tenant
    headers_env: {Authorization: CRM_TOKEN}
storage:
  events: {backend: jsonl, path: data}
agents:
  - name: devis
    main: {model: fake-1, system: "Tu chiffres pour {{ company }}."}
    tools: [{tool: loom.current_datetime}]
  - name: relance
    main: {model: fake-1, system: "Tu relances pour {{ company }}."}
tenants:
  - id: martin
    variables: {company: Martin SA, tone: direct}
    secrets: {CRM_TOKEN: LOOM_TEST_MARTIN_CRM}
    models: {fake-1: fake-2}
    approvals: {current_datetime: always}
    storage: {events: {backend: jsonl, path: tenants/martin}}
    retention: {events_days: 30}
    telemetry: {capture: {raw_exchanges: true}}
  - id: dupont
    agents: [devis]
    variables: {company: Dupont}
    secrets: {CRM_TOKEN: {file: secrets/dupont-crm}}
    tools_deny: [current_datetime]
"#;

#[test]
fn validate_shows_what_each_tenant_gets_and_no_secret_value() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env("LOOM_TEST_MARTIN_CRM", "Bearer martin-secret-value")
        .args(["--config", "loom.yaml", "validate"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!stdout.contains("martin-secret-value"), "{stdout}");
    insta::assert_snapshot!("validate_tenants", stdout);
}

#[test]
fn a_refused_tenant_override_is_located() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        CONFIG.replace("models: {fake-1: fake-2}", "models: {fake-1: fake-1}"),
    )
    .unwrap();
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .args(["--config", "loom.yaml", "validate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(
            "loom.yaml:23:22 tenants[0].models.fake-1: tenant 'martin' maps the model 'fake-1' to itself"
        ),
        "{}",
        text(&out.stderr)
    );
}
