//! Human approval through the Rust API: a paused run and its `pending_approvals`,
//! `Loom::approve` / `Loom::reject` (with `no_wait`), an inline approver in `RunOptions`,
//! the cancel of a paused run, and the load-time refusal on a memory journal.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use loom_ia::{
    Decision, Loom, LoomError, PendingApproval, Profile, RunOptions, RunStatus,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
    core::event::Payload,
};
use serde_json::json;

/// Sends a quote to a customer (irreversible: a human approves every call).
#[loom_ia::tool(side_effects = "irreversible", approval = "always")]
fn envoyer(client: String) -> String {
    format!("devis envoyé à {client}")
}

fn config(dir: &std::path::Path, backend: EventsBackend, profile: Option<Profile>) -> Config {
    let mut model = ModelSpec::new("fake-1", Sdk::Fake, "FAKE");
    model.params.insert(
        "script".into(),
        json!([
            {"text": "J'envoie.", "tool_calls": [{"name": "envoyer", "arguments": {"client": "Martin"}}]},
            {"text": "Résultat : {{ tool_result }}"}
        ]),
    );
    let mut agent = AgentSpec::new("devis", "fake-1");
    agent.tools = vec![ToolRef::new("envoyer")];
    let mut raw = LoomConfig {
        models: vec![model],
        agents: vec![agent],
        profile,
        ..LoomConfig::default()
    };
    raw.storage.events.backend = backend;
    raw.storage.events.path = Some("journal".into());
    Config::new(raw, dir.to_path_buf()).unwrap()
}

fn loom(dir: &std::path::Path) -> Loom {
    let loom = Loom::new(config(dir, EventsBackend::Jsonl, None)).unwrap();
    loom.register("envoyer", envoyer_tool()).unwrap();
    loom
}

#[tokio::test]
async fn a_paused_run_lists_its_pending_approvals_and_is_approved_later() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let result = loom
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Paused);
    assert!(!result.ok());
    assert_eq!(result.pending_approvals.len(), 1);
    let pending = &result.pending_approvals[0];
    assert_eq!(pending.tool_name, "envoyer");
    assert_eq!(pending.arguments, json!({"client": "Martin"}));
    let run = loom.locate(&result.run_id, None, None).await.unwrap();

    // Another Loom (another process) decides, without driving.
    let other = self::loom(dir.path());
    let decided = other
        .approve(
            &run,
            Some(&pending.call_id),
            "denis",
            Some("ok"),
            Some(json!({"client": "Dupont"})),
            true,
        )
        .await
        .unwrap();
    assert_eq!(decided.calls, std::slice::from_ref(&pending.call_id));
    assert_eq!(decided.result.status, RunStatus::Paused);
    assert!(decided.result.pending_approvals.is_empty());

    let done = other.resume(&run).await.unwrap();
    assert!(done.ok());
    assert_eq!(done.text, "Résultat : devis envoyé à Dupont");

    // Nothing waits any more.
    let again = other.reject(&run, None, "denis", None, false).await;
    assert!(
        matches!(&again, Err(LoomError::UnknownApproval(m)) if m.contains("nothing is waiting"))
    );
    assert!(again.unwrap_err().is_refusal());
}

#[tokio::test]
async fn a_rejection_is_driven_on_and_an_inline_approver_never_pauses() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let result = loom
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    let decided = loom
        .reject(&run, None, "denis", Some("pas encore"), false)
        .await
        .unwrap();
    assert!(decided.result.ok());
    assert!(
        decided
            .result
            .text
            .contains("rejected by denis: pas encore"),
        "{}",
        decided.result.text
    );

    let approver = |pending: PendingApproval| async move {
        assert_eq!(pending.tool_name, "envoyer");
        Decision::approved("script")
    };
    let result = loom
        .run(
            "devis",
            "Envoie le devis.",
            RunOptions {
                approver: Some(Arc::new(approver)),
                ..RunOptions::default()
            },
        )
        .await
        .unwrap();
    assert!(result.ok());
    assert_eq!(result.text, "Résultat : devis envoyé à Martin");
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    let events = loom.events(&run).await.unwrap();
    assert!(
        events
            .iter()
            .any(|e| matches!(&e.payload, Payload::ApprovalGranted(p) if p.by == "script"))
    );
}

#[tokio::test]
async fn cancelling_a_paused_run_withdraws_what_waits() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path());
    let result = loom
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    let run = loom.locate(&result.run_id, None, None).await.unwrap();
    assert!(loom.cancel(&run, Some("denis".into())).await.unwrap());
    let events = loom.events(&run).await.unwrap();
    let Some(Payload::RunCancelled(cancelled)) = events.last().map(|e| &e.payload) else {
        panic!("the run ends cancelled");
    };
    assert_eq!(
        cancelled.withdrawn,
        [result.pending_approvals[0].call_id.clone()]
    );
    let after = loom.result(&run).await.unwrap();
    assert_eq!(after.status, RunStatus::Cancelled);
    assert!(after.pending_approvals.is_empty());
}

#[tokio::test]
async fn a_tool_that_can_pause_needs_a_durable_journal_outside_dev() {
    let dir = tempfile::tempdir().unwrap();
    let memory = Loom::new(config(dir.path(), EventsBackend::Memory, None)).unwrap();
    memory.register("envoyer", envoyer_tool()).unwrap();
    let refused = memory
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap_err();
    let message = refused.to_string();
    assert!(matches!(refused, LoomError::Config(_)), "{message}");
    assert!(message.contains("tools[0].tool"), "{message}");
    assert!(
        message.contains("tool 'envoyer' can pause the run"),
        "{message}"
    );

    let dev = Loom::new(config(
        dir.path(),
        EventsBackend::Memory,
        Some(Profile::Dev),
    ))
    .unwrap();
    dev.register("envoyer", envoyer_tool()).unwrap();
    let result = dev
        .run("devis", "Envoie le devis.", RunOptions::default())
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Paused);
}
