//! A YAML agent driven by a scripted model built in Rust (`loom_ia::testing::Script`) plugged in
//! place of the model its YAML names (`Loom::register_model`), through the public API only, as an
//! agent's own crate tests it with `cargo test`: no network, the run's journal checked with the
//! kit's assertions; an error step failing the run; an undeclared model refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom, LoomError, RunOptions, ToolOutput,
    testing::{
        ModelErrorKind, Script, ToolDouble, assert_cost_below, assert_event_types,
        assert_tool_called,
    },
};
use serde_json::json;

/// The agent's model `claude` is declared as the configuration's own (`sdk: fake`, no script:
/// it echoes); the tests plug their script in its place.
const CONFIG: &str = r#"
version: 1
models:
  - id: claude
    sdk: fake
    model: claude-x
    pricing: {input: 3.0, output: 15.0}
    retry: {max_attempts: 1}
agents:
  - name: reminders
    main: {model: claude, system: Tu relances les devis.}
    tools:
      - tool: send_reminder
        side_effects: irreversible
"#;

fn open() -> (tempfile::TempDir, Loom, ToolDouble) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    let loom = Loom::from_config(&file).unwrap();
    let send = ToolDouble::returning("send_reminder", ToolOutput::text("sent to D-1"));
    loom.register("send_reminder", send.clone()).unwrap();
    (dir, loom, send)
}

#[tokio::test]
async fn a_yaml_agent_runs_on_a_script_built_in_rust() {
    let (_dir, loom, send) = open();
    // Before: the declared model answers (an echo).
    let echo = loom
        .run("reminders", "Relance D-1", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(echo.text, "Echo: Relance D-1");
    assert!(send.calls().is_empty());

    let script = Script::new()
        .tool_call(
            "Je relance.",
            "send_reminder",
            json!({"number": "D-1", "urgent": true}),
        )
        .text("Fait : {{ tool_result }}.");
    loom.register_model("claude", script.model("scripted").unwrap())
        .unwrap();
    let result = loom
        .run("reminders", "Relance D-1", RunOptions::default())
        .await
        .unwrap();
    assert!(result.ok(), "{result:?}");
    assert_eq!(result.text, "Fait : sent to D-1.");
    assert_eq!(send.calls(), vec![json!({"number": "D-1", "urgent": true})]);

    let events = loom.events(&result.run_ref("default")).await.unwrap();
    let step = |kind: &'static str| ["step.started", kind, "step.completed", "run.transitioned"];
    let mut expected = vec!["run.started", "message.user", "run.claimed"];
    expected.extend(step("model.responded"));
    expected.extend([
        "step.started",
        "tool.called",
        "tool.completed",
        "step.completed",
        "run.transitioned",
    ]);
    expected.extend(step("model.responded"));
    expected.push("run.completed");
    assert_event_types(&events, &expected);
    assert_tool_called(&events, "send_reminder", &json!({"number": "D-1"}));
    // The declared pricing still applies: the scripted calls cost something, below a cent.
    assert_cost_below(&events, 0.01);
    let free = std::panic::catch_unwind(|| assert_cost_below(&events, 0.0));
    assert!(
        free.is_err(),
        "the scripted calls are priced as the declared model"
    );
    let model_calls = events
        .iter()
        .filter(|e| e.event_type == "model.responded")
        .count();
    assert_eq!(model_calls, 2);
}

#[tokio::test]
async fn an_error_step_fails_the_run_and_an_undeclared_model_is_refused() {
    let (_dir, loom, send) = open();
    loom.register_model(
        "claude",
        Script::new()
            .error(ModelErrorKind::Auth)
            .model("x")
            .unwrap(),
    )
    .unwrap();
    let result = loom
        .run("reminders", "Relance D-1", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(result.status.as_str(), "failed", "{result:?}");
    let events = loom.events(&result.run_ref("default")).await.unwrap();
    assert_event_types(
        &events,
        &[
            "run.started",
            "message.user",
            "run.claimed",
            "step.started",
            "step.completed",
            "run.transitioned",
            "run.failed",
        ],
    );
    assert_eq!(events.last().unwrap().facets["error_type"], "model.auth");
    assert!(send.calls().is_empty());

    let refused = loom.register_model("gpt", Script::new().model("x").unwrap());
    match refused {
        Err(LoomError::Registration(message)) => assert_eq!(
            message,
            "no model 'gpt' is declared (declared models: claude)"
        ),
        other => panic!("{other:?}"),
    }
    let bad = Script::new()
        .tool_call("x", "send_reminder", json!("not an object"))
        .model("x");
    match bad {
        Err(LoomError::Invalid(message)) => assert_eq!(
            message,
            "script[0].tool_calls[0].arguments: a tool's arguments are a JSON object"
        ),
        other => panic!("{other:?}"),
    }
}
