//! Tenant budgets through `loom_cli::App`: a tenant that reached its day ceiling is refused
//! with exit code 2 and nothing is written.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{fs, path::Path};

use loom_cli::{App, OK, REFUSED};
use loom_ia::TenantBudget;

const CONFIG: &str = r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    pricing: {input: 3.0, output: 15.0}
    params:
      script:
        - text: "Bonjour."
agents:
  - name: hello
    main:
      model: fake-1
      system: "Tu salues."
storage:
  events:
    backend: jsonl
    path: data
telemetry:
  logging: {level: ERROR}
"#;

/// Every journal file (`*.jsonl`) under `dir/data`, with its content, sorted.
fn journal(dir: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    for tenant in fs::read_dir(dir.join("data")).unwrap() {
        for file in fs::read_dir(tenant.unwrap().path()).unwrap() {
            let path = file.unwrap().path();
            if path.extension() != Some("jsonl".as_ref()) {
                continue;
            }
            files.push((
                path.display().to_string(),
                fs::read_to_string(&path).unwrap(),
            ));
        }
    }
    files.sort();
    files
}

fn app() -> App {
    App::new().tenant_budget(
        "default",
        TenantBudget {
            max_tokens_per_day: Some(1),
            ..TenantBudget::default()
        },
    )
}

#[test]
fn a_tenant_over_its_day_ceiling_is_refused_with_exit_code_2() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("loom.yaml");
    fs::write(&config, CONFIG).unwrap();
    let config = config.to_str().unwrap();
    let run = |session: &str| {
        app().run_from([
            "loom",
            "--config",
            config,
            "run",
            "hello",
            "Salut",
            "--session",
            session,
        ])
    };
    // Nothing spent yet today: the run goes through, and spends more than one token.
    assert_eq!(run("s1"), OK);
    let before = journal(dir.path());
    assert_eq!(before.len(), 1);
    assert_eq!(run("s1"), REFUSED);
    assert_eq!(run("s2"), REFUSED);
    assert_eq!(journal(dir.path()), before, "a refused run writes nothing");
    // Without the ceiling, the same command runs.
    assert_eq!(
        App::new().run_from([
            "loom",
            "--config",
            config,
            "run",
            "hello",
            "Salut",
            "--session",
            "s2"
        ]),
        OK
    );
}
