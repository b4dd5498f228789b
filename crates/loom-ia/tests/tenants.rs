//! What each tenant gets at run time (`tenants[]`): its prompt variables, its model mapping
//! (journaled model ids show the mapped one), its denied tools (never offered; a model asking
//! anyway gets the unknown-tool error), its approvals, and its own journal.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use loom_ia::{Attachment, Loom, RunOptions, RunResult, RunStatus, core::event::Payload};

/// Looks up a customer.
#[loom_ia::tool]
fn lookup() -> String {
    "client 42".to_owned()
}

const CONFIG: &str = r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE-ONE
    params:
      script:
        - {with_tool: lookup, tool_calls: [{name: lookup, arguments: {}}]}
        - {without_tool: lookup, text: "one without lookup | {{ system }}", tool_calls: [{name: lookup, arguments: {}}]}
        - text: "one: {{ tool_result }} | {{ system }}"
  - id: fake-2
    sdk: fake
    model: FAKE-TWO
    params:
      script:
        - tool_calls: [{name: lookup, arguments: {}}]
        - text: "two: {{ tool_result }} | {{ system }}"
storage:
  events: {backend: jsonl, path: data}
agents:
  - name: a
    main: {model: fake-1, system: "You help {{ company }} ({{ tenant }})."}
    tools: [{tool: lookup}]
tenants:
  - id: martin
    variables: {company: Martin SA}
    models: {fake-1: fake-2}
    storage: {events: {backend: jsonl, path: martin-data}}
  - id: dupont
    variables: {company: Dupont & fils}
    tools_deny: [lookup]
  - id: durand
    variables: {company: Durand}
    approvals: {lookup: always}
"#;

async fn loom(dir: &Path) -> Loom {
    std::fs::write(dir.join("loom.yaml"), CONFIG).unwrap();
    let loom = Loom::open_config(dir.join("loom.yaml"), None)
        .await
        .unwrap();
    loom.register("lookup", lookup_tool()).unwrap();
    loom
}

async fn run(loom: &Loom, tenant: &str) -> RunResult {
    loom.run(
        "a",
        "Qui est le client ?",
        RunOptions {
            tenant_id: Some(tenant.into()),
            ..RunOptions::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test]
async fn a_tenant_runs_with_its_variables_and_its_model_mapping_in_its_own_journal() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path()).await;
    let martin = run(&loom, "martin").await;
    assert_eq!(martin.status, RunStatus::Completed, "{martin:?}");
    // The mapped model answered, with the tenant's variables in its system prompt.
    assert_eq!(martin.text, "two: client 42 | You help Martin SA (martin).");
    let events = loom.events(&martin.run_ref("martin")).await.unwrap();
    let models: Vec<(String, Option<String>)> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ModelResponded(p) => Some((p.model_id.clone(), p.model.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(
        models,
        [
            ("FAKE-TWO".to_owned(), Some("fake-2".to_owned())),
            ("FAKE-TWO".to_owned(), Some("fake-2".to_owned()))
        ]
    );
    // Martin's events are in its own journal; the root journal has none of its sessions.
    let own = dir
        .path()
        .join("martin-data/martin")
        .join(format!("{}.jsonl", martin.session_id));
    assert!(own.exists(), "{}", own.display());
    assert!(!dir.path().join("data/martin").exists());
    // Another tenant without a journal of its own writes to the root one, with the configured
    // model.
    let dupont = run(&loom, "dupont").await;
    assert!(dir.path().join("data/dupont").exists());
    assert!(!dir.path().join("martin-data/dupont").exists());
    assert!(dupont.text.starts_with("one"), "{}", dupont.text);
    // Reads go to the right journal too.
    assert_eq!(loom.sessions(Some("martin")).await.unwrap().len(), 1);
    assert_eq!(loom.sessions(Some("dupont")).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_denied_tool_is_never_offered_and_a_call_to_it_is_an_unknown_tool() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path()).await;
    let dupont = run(&loom, "dupont").await;
    assert_eq!(dupont.status, RunStatus::Completed, "{dupont:?}");
    // The model was not offered `lookup` (the reply kept `without_tool: lookup`), asked for it
    // anyway, and got the unknown-tool error as its result.
    let events = loom.events(&dupont.run_ref("dupont")).await.unwrap();
    let results: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.payload {
            Payload::ToolCompleted(p) => Some(serde_json::to_string(p).unwrap()),
            _ => None,
        })
        .collect();
    assert_eq!(results.len(), 1, "{results:?}");
    assert!(results[0].contains("Unknown tool: 'lookup'"), "{results:?}");
    assert!(
        dupont.text.starts_with("one: Unknown tool: 'lookup'"),
        "{}",
        dupont.text
    );
}

#[tokio::test]
async fn a_tenant_approval_pauses_its_runs_only() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path()).await;
    let durand = run(&loom, "durand").await;
    assert_eq!(durand.status, RunStatus::Paused, "{durand:?}");
    assert_eq!(durand.pending_approvals.len(), 1, "{durand:?}");
    assert_eq!(durand.pending_approvals[0].tool_name, "lookup");
    // The same agent for another tenant does not ask.
    let martin = run(&loom, "martin").await;
    assert_eq!(martin.status, RunStatus::Completed);
}

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

#[tokio::test]
async fn a_tenant_files_are_kept_beside_its_own_journal_and_read_and_erased_there() {
    let dir = tempfile::tempdir().unwrap();
    let loom = loom(dir.path()).await;
    let attached = |tenant: &str| RunOptions {
        tenant_id: Some(tenant.into()),
        attachments: vec![Attachment {
            name: "plan.png".into(),
            media_type: "image/png".into(),
            bytes: PNG.to_vec(),
        }],
        ..RunOptions::default()
    };
    let martin = loom
        .run("a", "Voici le plan.", attached("martin"))
        .await
        .unwrap();
    let dupont = loom
        .run("a", "Voici le plan.", attached("dupont"))
        .await
        .unwrap();
    let own = dir
        .path()
        .join("martin-data/.artifacts/martin")
        .join(&martin.session_id);
    assert_eq!(
        std::fs::read_dir(&own).unwrap().count(),
        1,
        "{}",
        own.display()
    );
    assert!(!dir.path().join("data/.artifacts/martin").exists());
    assert!(
        dir.path()
            .join("data/.artifacts/dupont")
            .join(&dupont.session_id)
            .exists()
    );
    // Read back through the tenant's store, by its URI.
    let files = loom
        .session_files(&martin.session_id, &[], Some("martin"))
        .await
        .unwrap();
    assert_eq!(files.len(), 1);
    let (_, bytes) = loom
        .session_file(&martin.session_id, &files[0].file, Some("martin"))
        .await
        .unwrap();
    assert_eq!(bytes, PNG);
    // Erased from the tenant's own journal and files.
    let deleted = loom
        .delete_session(&martin.session_id, Some("martin"))
        .await
        .unwrap();
    assert!(deleted.events_deleted > 0, "{deleted:?}");
    assert_eq!(deleted.files_deleted, 1, "{deleted:?}");
    assert!(!own.exists());
    assert!(
        !dir.path()
            .join("martin-data/martin")
            .join(format!("{}.jsonl", martin.session_id))
            .exists()
    );
}

const DELEGATING: &str = r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - {with_tool: helper, text: "helper offered"}
        - {with_tool: writer, text: "writer offered"}
        - {text: "neither offered"}
agents:
  - name: a
    main: {model: fake-1}
    roles:
      - {name: writer, model: fake-1, description: Writes, context: [user_input]}
    subagents:
      - {agent: helper}
  - name: helper
    description: Helps
    main: {model: fake-1}
tenants:
  - id: martin
    tools_deny: [helper]
  - id: dupont
    tools_deny: [helper, writer]
  - id: durand
"#;

#[tokio::test]
async fn a_tenant_may_be_denied_a_sub_agent_and_a_role() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), DELEGATING).unwrap();
    let loom = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap();
    let mut seen = Vec::new();
    for tenant in ["durand", "martin", "dupont"] {
        let result = loom
            .run(
                "a",
                "Bonjour",
                RunOptions {
                    tenant_id: Some(tenant.into()),
                    ..RunOptions::default()
                },
            )
            .await
            .unwrap();
        seen.push((tenant, result.text));
    }
    assert_eq!(
        seen,
        [
            ("durand", "helper offered".to_owned()),
            ("martin", "writer offered".to_owned()),
            ("dupont", "neither offered".to_owned())
        ]
    );
}

/// `approval: policy` for a tenant needs a policy of the agent that can ask a human: refused
/// when the configuration is opened, at the tenant's key.
#[tokio::test]
async fn a_tenant_policy_approval_without_a_pausing_policy_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loom.yaml"),
        CONFIG.replace("approvals: {lookup: always}", "approvals: {lookup: policy}"),
    )
    .unwrap();
    let error = Loom::open_config(dir.path().join("loom.yaml"), None)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("loom.yaml:34:25 tenants[2].approvals.lookup: tenant 'durand', tool 'lookup' of agent 'a': approval: policy means a policy decides"),
        "{error}"
    );
}
