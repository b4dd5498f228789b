//! Retention through the Rust API (`Loom::retention_at`): the bound is the session's last
//! write, a session past it goes whole (journal, files) even with an approval pending, a dry
//! run touches nothing, a tenant that is not declared is refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_ia::{
    Attachment, Loom, LoomError, RunOptions, RunStatus,
    config::{AgentSpec, Config, EventsBackend, LoomConfig, ModelSpec, Sdk, ToolRef},
};
use serde_json::json;

/// Sends a quote (a human approves every call: each run pauses).
#[loom_ia::tool(side_effects = "irreversible", approval = "always")]
fn envoyer(client: String) -> String {
    format!("devis envoyé à {client}")
}

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR";

fn loom(dir: &std::path::Path, events_days: Option<u32>) -> Loom {
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
        ..LoomConfig::default()
    };
    raw.storage.events.backend = EventsBackend::Jsonl;
    raw.storage.events.path = Some("journal".into());
    raw.storage.retention.events_days = events_days;
    let loom = Loom::new(Config::new(raw, dir.to_path_buf()).unwrap()).unwrap();
    loom.register("envoyer", envoyer_tool()).unwrap();
    loom
}

async fn paused_run(loom: &Loom, session: &str) {
    let options = RunOptions {
        session_id: Some(session.into()),
        attachments: vec![Attachment {
            name: "plan.png".into(),
            media_type: "image/png".into(),
            bytes: PNG.to_vec(),
        }],
        ..RunOptions::default()
    };
    let result = loom
        .run("devis", "Envoie le devis.", options)
        .await
        .unwrap();
    assert_eq!(result.status, RunStatus::Paused);
}

#[tokio::test]
async fn sessions_past_the_bound_go_whole_even_with_an_approval_pending() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), Some(30));
    paused_run(&loom, "older").await;
    paused_run(&loom, "newer").await;
    let sessions = loom.sessions(None).await.unwrap();
    let last_write = |id: &str| {
        sessions
            .iter()
            .find(|s| s.session_id == id)
            .and_then(|s| s.updated_at)
            .unwrap()
    };
    // 30 days after the older session's last write, and a microsecond: only it is past.
    let now = last_write("older") + chrono::Duration::days(30) + chrono::Duration::microseconds(1);
    assert!(last_write("newer") > now - chrono::Duration::days(30));

    let listed = loom.retention_at(None, false, now).await.unwrap();
    assert!(!listed.applied);
    let tenant = &listed.tenants[0];
    assert_eq!(
        (tenant.tenant_id.as_str(), tenant.events_days),
        ("default", Some(30))
    );
    assert_eq!(tenant.cutoff, Some(now - chrono::Duration::days(30)));
    let gone: Vec<&str> = tenant
        .sessions
        .iter()
        .map(|s| s.session_id.as_str())
        .collect();
    assert_eq!((gone, tenant.kept), (vec!["older"], 1));
    assert_eq!(tenant.sessions[0].updated_at, last_write("older"));
    assert!(tenant.sessions[0].deleted.is_none());
    // A dry run touched nothing.
    assert_eq!(
        loom.session("older", None)
            .await
            .unwrap()
            .pending_approvals
            .len(),
        1
    );

    let applied = loom.retention_at(Some("default"), true, now).await.unwrap();
    let deleted = applied.tenants[0].sessions[0].deleted.clone().unwrap();
    assert_eq!(deleted.session_id, "older");
    assert!(deleted.events_deleted > 0);
    assert_eq!(deleted.files_deleted, 1);
    assert!(matches!(
        loom.session("older", None).await.unwrap_err(),
        LoomError::UnknownSession(_)
    ));
    assert!(!dir.path().join("journal/.artifacts/default/older").exists());
    assert_eq!(
        loom.session("newer", None)
            .await
            .unwrap()
            .pending_approvals
            .len(),
        1
    );

    // Nothing left past the bound; an undeclared tenant is refused.
    assert_eq!(
        loom.retention_at(None, true, now).await.unwrap().sessions(),
        0
    );
    assert!(matches!(
        loom.retention(Some("nobody"), false).await.unwrap_err(),
        LoomError::Refused(_)
    ));
}

#[tokio::test]
async fn without_a_bound_nothing_goes() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path(), None);
    paused_run(&loom, "kept").await;
    let far = chrono::Utc::now() + chrono::Duration::days(10_000);
    let report = loom.retention_at(None, true, far).await.unwrap();
    assert_eq!(report.tenants[0].events_days, None);
    assert_eq!(report.tenants[0].cutoff, None);
    assert_eq!((report.sessions(), report.tenants[0].kept), (0, 1));
    assert!(loom.session("kept", None).await.is_ok());
}
