//! Tenant budgets through `loom_cli::App`: a tenant that reached its day ceiling is refused
//! with exit code 2 and nothing is written. A money budget over a model without pricing,
//! through the `loom` binary: a warning, refused under `prod`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path};

use common::{loom, text};

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

/// A configuration whose model `fake-1` has no pricing, with `extra` appended.
fn unpriced(extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let config = CONFIG.replace("    pricing: {input: 3.0, output: 15.0}\n", "");
    fs::write(dir.path().join("loom.yaml"), format!("{config}{extra}")).unwrap();
    dir
}

#[test]
fn a_money_budget_over_a_model_without_pricing_is_refused_under_prod() {
    let dir = unpriced("budgets:\n  run: {max_cost: 0.05}\n");
    let because = "budgets.run.max_cost: a money budget, but model 'fake-1' (main.model of agent \
                   'hello') has no pricing: its calls would count as 0 $ and the budget might \
                   never be reached; declare the model's pricing (models[].pricing, dollars per \
                   million tokens)";
    // Outside prod, a setup warning said once.
    let out = loom(dir.path(), &["validate"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr).trim_end(),
        format!("warning: loom.yaml:21:19 {because} (an error under the prod profile)")
    );
    // Under prod, refused when the configuration is opened: by `validate` and by `run`, which
    // writes nothing.
    for args in [
        &["validate", "--profile", "prod"][..],
        &["run", "hello", "Salut", "--profile", "prod"],
    ] {
        let out = loom(dir.path(), args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            text(&out.stderr)
        );
        assert_eq!(
            text(&out.stderr).trim_end(),
            format!("config error: loom.yaml:21:19 {because} (refused under the prod profile)"),
            "{args:?}"
        );
    }
    assert!(!dir.path().join("data").exists());

    // A tenant's money ceiling bounds the agents it may run.
    let dir =
        unpriced("tenants:\n  - id: dupont\n    budgets: {tenant: {max_cost_per_day: 1.0}}\n");
    let out = loom(dir.path(), &["validate", "--profile", "prod"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).starts_with(
            "config error: loom.yaml:22:42 tenants[0].budgets.tenant.max_cost_per_day: a money \
             budget, but model 'fake-1' (main.model of agent 'hello')"
        ),
        "{}",
        text(&out.stderr)
    );

    // Every model priced: accepted under prod, without a warning.
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        format!("{CONFIG}budgets:\n  run: {{max_cost: 0.05}}\n"),
    )
    .unwrap();
    let out = loom(dir.path(), &["validate", "--profile", "prod"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stderr), "");
}
