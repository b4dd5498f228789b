//! `loom_ia::testing` through the public API only, as an agent's own crate uses it: the scripted
//! model of the configuration, a double in place of a tool with a side effect, and assertions on
//! the run's journal; then a variant replay of that run with the double.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom, RunOptions, ToolOutput, VariantOptions,
    testing::{ToolDouble, assert_cost_below, assert_event_types, assert_tool_called},
};
use serde_json::json;

const CONFIG: &str = r#"
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: "Je relance."
          tool_calls:
            - name: send_reminder
              arguments: {number: "D-1", urgent: true}
        - text: "{{ tool_result }}"
  - id: fake-2
    sdk: fake
    model: FAKE
    params:
      script:
        - text: "Je relance autrement."
          tool_calls:
            - name: send_reminder
              arguments: {number: "D-2"}
        - text: "Autre : {{ tool_result }}"
agents:
  - name: reminders
    main: {model: fake-1, system: Tu relances les devis.}
    tools:
      - tool: send_reminder
        side_effects: irreversible
"#;

#[tokio::test]
async fn an_agent_is_tested_with_a_double_and_assertions_on_its_journal() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loom.yaml");
    std::fs::write(&file, CONFIG).unwrap();
    let loom = Loom::from_config(&file).unwrap();
    let send = ToolDouble::returning("send_reminder", ToolOutput::text("sent"));
    loom.register("send_reminder", send.clone()).unwrap();

    let result = loom
        .run("reminders", "Relance D-1", RunOptions::default())
        .await
        .unwrap();
    assert!(result.ok(), "{result:?}");
    assert_eq!(result.text, "sent");
    assert_eq!(send.calls(), vec![json!({"number": "D-1", "urgent": true})]);

    let run = result.run_ref("default");
    let events = loom.export_run(&run).await.unwrap();
    let step = |kind: &'static str| ["step.started", kind, "step.completed", "run.transitioned"];
    let mut expected = vec!["run.started", "message.user", "run.claimed"];
    expected.extend(step("model.responded"));
    expected.extend([
        "step.started",
        "tool.called",
        "tool.completed",
        "step.completed",
    ]);
    expected.push("run.transitioned");
    expected.extend(step("model.responded"));
    expected.push("run.completed");
    assert_event_types(&events, &expected);
    let shorter = std::panic::catch_unwind(|| assert_event_types(&events, &expected[..3]));
    assert!(shorter.is_err(), "a sequence that differs fails");
    assert_tool_called(&events, "send_reminder", &json!({"number": "D-1"}));
    assert_cost_below(&events, 0.01);
    let wrong = std::panic::catch_unwind(|| {
        assert_tool_called(&events, "send_reminder", &json!({"number": "D-9"}))
    });
    assert!(wrong.is_err(), "another quote was never chased");

    // A variant chasing another quote: answered by a double, the registered tool not called.
    let options = VariantOptions::default()
        .model("main", "fake-2")
        .double_result("send_reminder", ToolOutput::text("simulated"));
    let report = loom.replay_variant(&run, &options).await.unwrap();
    assert!(report.is_success(), "{report:?}");
    assert_eq!(report.variant.text, "Autre : simulated");
    assert_eq!(report.counts.tools_doubled, 1);
    assert_eq!(send.calls().len(), 1, "the tool ran once, in the real run");
}
