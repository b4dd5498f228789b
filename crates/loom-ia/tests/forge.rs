//! The built-in `forge` tool source through the Rust API: a run defines a tool and calls it
//! through `forge__call`, the next run is offered it by name, both runs replay identical from
//! the journal (the tools offered come from `tool.source_opened`, nothing is run again), and
//! the kind `forge` cannot be registered over. Skipped with a notice when bubblewrap cannot
//! create namespaces here, failed instead under `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_ia::{
    Loom, LoomError, RunOptions, SourceFactoryError, SourceRequest, ToolSource,
    testing::{Script, assert_tool_called},
};
use serde_json::json;

const CONFIG: &str = r#"
version: 1
storage:
  events: {backend: jsonl, path: journal}
models:
  - {id: claude, sdk: fake, model: claude-x}
tool_sources:
  - name: forge
    kind: forge
    params: {catalog_dir: catalog, sandbox: {limits: {wall_ms: 20000}}}
agents:
  - name: smith
    main: {model: claude, system: Tu forges des outils.}
    tools:
      - source: forge
"#;

const TRIPLE: &str =
    "import json, sys\nn = json.load(sys.stdin)['n']\nprint(json.dumps({'r': n * 3}))\n";

#[tokio::test]
async fn a_forged_tool_is_defined_called_offered_and_replayed_identical() {
    if !loom_testkit::services::namespaces("a_forged_tool_is_defined_called_offered") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    let loom = Loom::from_config(dir.path().join("loom.yaml")).unwrap();
    let definition = json!({
        "name": "triple",
        "description": "Triples n.",
        "input_schema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]},
        "code": TRIPLE,
        "examples": [{"input": {"n": 2}, "output": {"r": 6}}],
    });
    loom.register_model(
        "claude",
        Script::new()
            .tool_call("Je le définis.", "forge__define", definition)
            .tool_call(
                "Je l'essaie.",
                "forge__call",
                json!({"name": "triple", "input": {"n": 7}}),
            )
            .text("Triple : {{ tool_result }}")
            .model("first")
            .unwrap(),
    )
    .unwrap();
    let first = loom
        .run("smith", "Un outil qui triple.", RunOptions::default())
        .await
        .unwrap();
    assert!(first.ok(), "{first:?}");
    assert_eq!(first.text, "Triple : {\"r\":21}");
    assert!(dir.path().join("catalog/default/triple/tool.py").exists());

    loom.register_model(
        "claude",
        Script::new()
            .tool_call("J'utilise l'outil.", "forge__triple", json!({"n": 5}))
            .text("Triple : {{ tool_result }}")
            .model("second")
            .unwrap(),
    )
    .unwrap();
    let second = loom
        .run("smith", "Triple 5.", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(second.text, "Triple : {\"r\":15}", "{second:?}");
    let events = loom.events(&second.run_ref("default")).await.unwrap();
    assert_tool_called(&events, "forge__triple", &json!({"n": 5}));

    for run in [first.run_ref("default"), second.run_ref("default")] {
        let report = loom.replay(&run).await.unwrap();
        assert_eq!(report.outcome, "identical", "{report:?}");
    }
}

#[test]
fn the_forge_kind_is_built_in() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    let loom = Loom::from_config(dir.path().join("loom.yaml")).unwrap();
    let factory = |_: &SourceRequest<'_>| -> Result<Arc<dyn ToolSource>, SourceFactoryError> {
        Err(SourceFactoryError::new("never built"))
    };
    let again = loom.register_source("forge", Arc::new(factory));
    assert!(
        matches!(again, Err(LoomError::Registration(_))),
        "{again:?}"
    );
}
