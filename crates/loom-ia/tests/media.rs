//! Rust tools that return files (`#[tool] fn …() -> Image`, `ToolFile`, or a `ToolOutput` with
//! a file beside its text): the bytes go to the artifact store, the journal names them by URI
//! (`artifact.stored` origin `tool_output` before `tool.completed`), and the run's result lists
//! them.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Image, Loom, RunOptions, ToolFile, ToolOutput,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::{BlockKind, event::Payload},
};
use serde_json::{Value, json};

/// A 1x1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89,
];

/// Draws the chart of a quote's lines.
#[loom_ia::tool]
fn chart(numero: String) -> Image {
    Image::png(PNG.to_vec()).named(format!("{numero}.png"))
}

/// Exports a quote's lines as CSV.
#[loom_ia::tool]
fn export(numero: String) -> Result<ToolFile, String> {
    if numero.is_empty() {
        return Err("numero is required".into());
    }
    Ok(ToolFile::detect(
        format!("{numero}.csv"),
        b"ligne;montant\nPose;1250\n".to_vec(),
    ))
}

/// Describes a quote, with its chart.
#[loom_ia::tool]
fn describe(numero: String) -> ToolOutput {
    let mut output = ToolOutput::text(format!("Devis {numero} : 1 ligne."));
    output.blocks.push(Image::png(PNG.to_vec()).block());
    output
}

fn loom(dir: &std::path::Path, script: Value) -> Loom {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert("script".into(), script);
    let mut agent = AgentSpec::new("devis", "fake-1");
    agent.main.system = "Tu prépares des devis.".into();
    agent.tools = ["chart", "export", "describe"].map(ToolRef::new).to_vec();
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    let loom = Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap();
    loom.register("chart", chart_tool()).unwrap();
    loom.register("export", export_tool()).unwrap();
    loom.register("describe", describe_tool()).unwrap();
    loom
}

#[tokio::test]
async fn files_a_rust_tool_returns_are_stored_journaled_by_uri_and_listed() {
    let dir = tempfile::tempdir().unwrap();
    let script = json!([
        {"tool_calls": [
            {"name": "chart", "arguments": {"numero": "D-1"}},
            {"name": "export", "arguments": {"numero": "D-1"}},
            {"name": "describe", "arguments": {"numero": "D-1"}}
        ]},
        {"text": "Voici : {{ tool_result }}"}
    ]);
    let loom = loom(dir.path(), script);
    let result = loom
        .run("devis", "Le devis D-1 ?", RunOptions::default())
        .await
        .unwrap();
    assert!(result.ok(), "{result:?}");
    let run = result.run_ref("default");
    let events = loom.events(&run).await.unwrap();

    // Each file's `artifact.stored` comes before its call's `tool.completed`, in the call's
    // span; the same bytes (the chart and the description's image) are stored under one URI.
    let mut stored = Vec::new();
    for (at, event) in events.iter().enumerate() {
        if let Payload::ArtifactStored(artifact) = &event.payload {
            let completed = events[at..]
                .iter()
                .find_map(|e| match &e.payload {
                    Payload::ToolCompleted(c) if Some(&c.call_id) == artifact.call_id.as_ref() => {
                        Some((e, c))
                    }
                    _ => None,
                })
                .expect("the call's tool.completed follows");
            assert_eq!(completed.0.span_id, event.span_id);
            assert_eq!(artifact.origin, "tool_output");
            let output = &completed.1.output;
            assert!(output.artifacts.contains(&artifact.uri), "{output:?}");
            assert!(output.blocks.iter().any(|b| matches!(
                &b.kind,
                BlockKind::Artifact { uri, size, .. } if *uri == artifact.uri && *size == artifact.size
            )));
            stored.push(artifact.clone());
        }
    }
    assert_eq!(stored.len(), 3, "{stored:?}");
    let png = stored
        .iter()
        .find(|s| s.name.as_deref() == Some("D-1.png"))
        .unwrap();
    assert_eq!(png.media_type, "image/png");
    assert_eq!(png.size, PNG.len() as u64);
    let csv = stored
        .iter()
        .find(|s| s.name.as_deref() == Some("D-1.csv"))
        .unwrap();
    assert_eq!(csv.media_type, "text/csv");
    assert!(csv.uri.ends_with(".csv"), "{}", csv.uri);

    // The bytes are in the artifact store, not in the journal.
    assert_eq!(
        loom.artifact("default", &png.uri).await.unwrap().as_deref(),
        Some(PNG)
    );
    let journal = std::fs::read_to_string(
        dir.path()
            .join("journal/default")
            .join(format!("{}.jsonl", result.run_id)),
    )
    .unwrap();
    assert!(!journal.contains("inline_data"), "{journal}");

    // The result lists the run's files as they were stored (the calls ran together: in any
    // order); the same bytes are one URI.
    let mut listed: Vec<(&str, Option<&str>, &str, &str, u64)> = result
        .artifacts
        .iter()
        .map(|a| {
            let name = a.name.as_deref();
            (
                a.media_type.as_str(),
                name,
                a.uri.as_str(),
                a.origin.as_str(),
                a.size,
            )
        })
        .collect();
    listed.sort();
    let size = PNG.len() as u64;
    assert_eq!(
        listed,
        [
            ("image/png", None, png.uri.as_str(), "tool_output", size),
            (
                "image/png",
                Some("D-1.png"),
                png.uri.as_str(),
                "tool_output",
                size
            ),
            (
                "text/csv",
                Some("D-1.csv"),
                csv.uri.as_str(),
                "tool_output",
                csv.size
            ),
        ]
    );
    // The model read the last result, the description, with the image by its URI.
    assert_eq!(
        result.text,
        format!("Voici : Devis D-1 : 1 ligne.\n{}", png.uri)
    );
    // Read back, or resumed, the run gives the same result.
    assert_eq!(loom.result(&run).await.unwrap(), result);
    assert_eq!(loom.resume(&run).await.unwrap(), result);
}
