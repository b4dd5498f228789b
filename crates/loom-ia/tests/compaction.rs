//! Compaction through the facade, on the memory journal: `blocking: true` compacts at the next
//! run's opening (the run's result says so), and a compaction run belongs to its session's
//! agents for a key limited to them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Loom, RunOptions, RunRef,
    config::{AgentSpec, CompactionConfig, Config, EventsBackend, LoomConfig, ModelSpec, Sdk},
    core::event::Payload,
};
use serde_json::json;

fn loom(blocking: bool) -> Loom {
    let main = ModelSpec::new("main", Sdk::Fake, "MAIN");
    let mut summarizer = ModelSpec::new("summarizer", Sdk::Fake, "SUM");
    summarizer.params.insert(
        "script".into(),
        json!([{"text": "Quote DEV-2041, then more messages."}]),
    );
    let mut raw = LoomConfig {
        models: vec![main, summarizer],
        agents: vec![AgentSpec::new("suivi", "main")],
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Memory;
    raw.sessions.compaction = Some(CompactionConfig {
        model: "summarizer".into(),
        over_tokens: 40,
        hard_tokens: 100_000,
        keep_last: 1,
        fidelity_check: true,
        blocking,
        system_file: None,
    });
    Loom::new(Config::new(raw, std::env::temp_dir()).unwrap()).unwrap()
}

fn in_session(run_id: &str) -> RunOptions {
    RunOptions {
        session_id: Some("client".into()),
        run_id: Some(run_id.into()),
        ..RunOptions::default()
    }
}

#[tokio::test]
async fn blocking_compaction_runs_at_the_next_opening() {
    let loom = loom(true);
    for (message, run_id) in [("Devis DEV-2041.", "r1"), ("Second message.", "r2")] {
        let result = loom
            .run("suivi", message, in_session(run_id))
            .await
            .unwrap();
        assert!(result.compaction.is_none(), "{:?}", result.compaction);
    }
    assert!(!loom.compactions_idle().await, "nothing in the background");
    let third = loom
        .run("suivi", "Third message.", in_session("r3"))
        .await
        .unwrap();
    let note = third.compaction.clone().unwrap();
    assert_eq!(
        (note.when.as_deref(), note.outcome.as_str()),
        (Some("before"), "applied")
    );
    let session = loom.session("client", None).await.unwrap();
    let compaction = session
        .runs
        .iter()
        .find(|r| r.agent == loom_ia::COMPACTION_AGENT)
        .unwrap();
    // Triggered by the last turn before the opening.
    let run = RunRef {
        tenant_id: "default".into(),
        session_id: "client".into(),
        run_id: compaction.run_id.clone(),
    };
    let opened = loom.events(&run).await.unwrap();
    match &opened[0].payload {
        Payload::RunStarted(p) => assert_eq!(p.triggered_by.as_deref(), Some("r2")),
        other => panic!("{other:?}"),
    }
    // A key limited to `suivi` may read the compaction run: it is the session's agent's.
    let agents = loom.tree_agents(&run).await.unwrap();
    assert_eq!(agents.into_iter().collect::<Vec<_>>(), ["suivi"]);
}

#[tokio::test]
async fn compacting_without_sessions_compaction_or_an_unknown_session_is_refused() {
    let loom = loom(false);
    let error = loom.compact(None, "nobody").await.unwrap_err();
    assert!(
        matches!(error, loom_ia::LoomError::UnknownSession(ref s) if s == "nobody"),
        "{error}"
    );
    let mut raw = LoomConfig::default();
    raw.storage.events.backend = EventsBackend::Memory;
    let bare = Loom::new(Config::new(raw, std::env::temp_dir()).unwrap()).unwrap();
    let error = bare.compact(None, "client").await.unwrap_err();
    assert!(
        error.to_string().contains("compaction is not configured"),
        "{error}"
    );
}
