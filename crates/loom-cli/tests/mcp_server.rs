//! Loom as an MCP server, driven by the official Python MCP client (`pip install 'mcp>=2,<3'`;
//! `.ci/run` installs it): `guichet mcp` over stdio (the `guichet` example: scripted fake models,
//! a JSONL journal in a temporary directory) and `/mcp` of `guichet serve` over streamable HTTP.
//! The client scenarios are in `mcp_client.py`; each prints what it observed as JSON.
//!
//! Build the example first: `cargo build -p loom-cli --example guichet`.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::Path,
    process::{Child, Command, Stdio},
    time::Duration,
};

use common::{copy_example, example_bin, mcp_client, python_has, repo, text};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// Whether the Python MCP client is importable; when it is not, the test is skipped in a quick
/// developer run and fails when services are required (CI).
fn python_client() -> bool {
    python_has("mcp.client, httpx2, mcp_types", "pip install 'mcp>=2,<3'")
}

/// A copy of examples/guichet (with its documents folder).
fn guichet() -> tempfile::TempDir {
    let dir = copy_example("guichet");
    let documents = dir.path().join("documents");
    fs::create_dir_all(&documents).unwrap();
    fs::copy(
        repo().join("examples/guichet/documents/plan.png"),
        documents.join("plan.png"),
    )
    .unwrap();
    dir
}

/// The arguments of a stdio scenario: `guichet --config <dir>/loom.yaml mcp [--tenant t]`.
fn stdio(dir: &Path, tenant: Option<&str>, mode: &str) -> Value {
    let mut args = vec![
        "--config".to_owned(),
        dir.join("loom.yaml").display().to_string(),
        "mcp".to_owned(),
    ];
    if let Some(tenant) = tenant {
        args.extend(["--tenant".to_owned(), tenant.to_owned()]);
    }
    json!({
        "command": example_bin("guichet"),
        "args": args,
        "cwd": dir,
        "mode": mode,
    })
}

fn with(mut base: Value, extra: Value) -> Value {
    for (key, value) in extra.as_object().unwrap() {
        base[key] = value.clone();
    }
    base
}

/// The events of a session's journal of `tenant`.
fn journal(dir: &Path, tenant: &str, session: &str) -> Vec<Value> {
    let path = dir
        .join("data")
        .join(tenant)
        .join(format!("{session}.jsonl"));
    fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The text of a tool result's first content block.
fn first_text(call: &Value) -> &str {
    call["texts"][0].as_str().unwrap_or_default()
}

#[test]
fn agents_are_tools_over_stdio_with_progress_control_tools_resources_and_attachments() {
    if !python_client() {
        return;
    }
    let dir = guichet();
    let outside = tempfile::tempdir().unwrap();
    fs::copy(
        dir.path().join("documents/plan.png"),
        outside.path().join("plan.png"),
    )
    .unwrap();
    let seen = mcp_client(
        "basics",
        with(
            stdio(dir.path(), None, "auto"),
            json!({
                "inside": format!("file://{}", dir.path().join("documents/plan.png").display()),
                "outside": format!("file://{}", outside.path().join("plan.png").display()),
            }),
        ),
    );
    assert_eq!(seen["server"], "loom");
    // One tool per agent offered over MCP (not `interne`), then the control tools.
    assert_eq!(
        seen["tools"],
        json!([
            "attente",
            "devis",
            "paiement",
            "run_status",
            "run_report",
            "cancel"
        ])
    );
    assert_eq!(seen["devis_input"]["required"], json!(["message"]));
    // The result's fields that are never content (content fields are absent from a masked
    // result) are required.
    assert_eq!(
        seen["devis_output_required"],
        json!([
            "run_id",
            "session_id",
            "agent",
            "status",
            "iterations",
            "usage",
            "cost_usd",
            "artifacts",
            "unverified",
            "fallback",
            "report",
            "verdicts",
            "skipped_judges",
            "pending_approvals"
        ])
    );

    // The agent's answer as text, the run result as structured content.
    let devis = &seen["devis"];
    assert_eq!(devis["is_error"], false);
    assert_eq!(devis["texts"], json!(["Le prix est de 1375,00 € TTC."]));
    assert_eq!(devis["structured"]["status"], "completed");
    assert_eq!(devis["structured"]["session_id"], "s-devis");
    let run_id = devis["structured"]["run_id"].as_str().unwrap();
    // One progress notification per progress event, with the lines of `loom run --stream`.
    assert_eq!(
        seen["progress"],
        json!([
            {"progress": 1.0, "message": "· prix_ttc({\"montant_ht\":1250,\"taux_tva\":10})"},
            {"progress": 2.0, "message": "· prix_ttc: done"},
        ])
    );
    // The session goes on: the second call re-reads the first.
    assert_eq!(seen["again"]["structured"]["session_id"], "s-devis");
    let events = journal(dir.path(), "default", "s-devis");
    let started: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "run.started")
        .collect();
    assert_eq!(started.len(), 2);
    assert_eq!(
        started[0]["payload"]["context"]["metadata"],
        json!({"access": "mcp"})
    );

    // Control tools.
    let status = &seen["run_status"];
    assert_eq!(status["is_error"], false, "{status}");
    assert_eq!(status["structured"]["run_id"], run_id);
    assert_eq!(
        status["structured"]["text"],
        "Le prix est de 1375,00 € TTC."
    );
    // A run of a named session is addressed with its session_id, as REST's GET /runs/{run_id}
    // and the reference do: without it, the run is unknown, whatever the run index knows.
    let unknown = format!("run {run_id} not found");
    for asked in ["run_status_no_session", "run_report_no_session"] {
        assert_eq!(seen[asked]["is_error"], true, "{asked}: {}", seen[asked]);
        assert_eq!(first_text(&seen[asked]), unknown, "{asked}");
    }
    for resource in [
        "run_no_session",
        "run_events_no_session",
        "trace_no_session",
    ] {
        let error = seen[resource]["error"].as_str().unwrap_or_default();
        assert!(error.contains(&unknown), "{resource}: {}", seen[resource]);
    }
    assert_eq!(seen["run_report"]["structured"]["run_id"], run_id);
    assert_eq!(seen["run_report"]["structured"]["total"]["calls"], 2);
    assert_eq!(
        seen["session_report"]["structured"]["session_id"],
        "s-devis"
    );
    assert_eq!(
        seen["session_report"]["structured"]["runs"]
            .as_object()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(seen["report_nothing"]["is_error"], true);
    assert_eq!(
        first_text(&seen["report_nothing"]),
        "give run_id or session_id"
    );

    // Resources.
    assert_eq!(seen["resources"], json!(["loom://runs", "loom://sessions"]));
    assert_eq!(
        seen["templates"],
        json!([
            "loom://runs{?agent,status,since,until,limit,sessions}",
            "loom://runs/{run_id}{?session_id}",
            "loom://runs/{run_id}/events{?session_id}",
            "loom://traces/{run_id}{?session_id}",
            "loom://sessions/{session_id}",
            "loom://sessions/{session_id}/events",
            "loom://sessions/{session_id}/state",
            "loom://artifacts/{tenant}/{session_id}/{file}",
        ])
    );
    // loom://runs is the REST run page: the runs, most recent first, the sessions read.
    let page = &seen["runs"]["json"];
    let runs = page["runs"].as_array().unwrap();
    assert!(
        runs.iter()
            .any(|r| r["run_id"] == run_id && r["agent"] == "devis"),
        "{page}"
    );
    assert_eq!(page["truncated"], false, "{page}");
    assert_eq!(page["scanned"], 1, "{page}");
    assert!(runs[0]["started_at"].is_string(), "{page}");
    // Filtered and cut: the most recent of the two devis runs, the rest left out.
    let again = seen["again"]["structured"]["run_id"].as_str().unwrap();
    let filtered = &seen["runs_filtered"]["json"];
    assert_eq!(filtered["runs"].as_array().unwrap().len(), 1, "{filtered}");
    assert_eq!(filtered["runs"][0]["run_id"], again);
    assert_eq!(filtered["truncated"], true);
    // Repeated statuses matching nothing; a window after every run.
    assert_eq!(
        seen["runs_none"]["json"],
        json!({"runs": [], "scanned": 1, "truncated": false})
    );
    assert_eq!(
        seen["runs_since"]["json"],
        json!({"runs": [], "scanned": 0, "truncated": false})
    );
    // Unusable values are refused, naming the parameter.
    for (read, expected) in [
        (
            "runs_bad_status",
            "status: unknown value 'done' (expected: ready_for_model,",
        ),
        ("runs_bad_limit", "limit: must be between 1 and 200 (got 0)"),
        (
            "runs_bad_since",
            "since: 'hier' is neither an RFC 3339 instant nor a YYYY-MM-DD date",
        ),
        (
            "runs_unknown",
            "tenant: unknown parameter (expected: agent, status,",
        ),
    ] {
        let error = seen[read]["error"].as_str().unwrap_or_default();
        assert!(error.contains(expected), "{read}: {}", seen[read]);
    }
    assert_eq!(seen["sessions"]["json"][0]["session_id"], "s-devis");
    assert_eq!(seen["run"]["json"]["status"], "completed");
    let run_events = seen["run_events"]["json"].as_array().unwrap();
    assert_eq!(run_events.first().unwrap()["type"], "run.started");
    assert_eq!(run_events.last().unwrap()["type"], "run.completed");
    assert!(run_events.iter().all(|e| e["run_id"] == run_id));
    assert_eq!(seen["trace"]["json"]["run_id"], run_id);
    // A model call, the tool call, the model call that answers: three steps.
    let spans = seen["trace"]["json"]["spans"].as_array().unwrap();
    assert_eq!(spans.iter().filter(|s| s["kind"] == "step").count(), 3);
    assert_eq!(seen["session"]["json"]["runs"].as_array().unwrap().len(), 2);
    assert_eq!(seen["session_events"]["mime_type"], "application/x-ndjson");
    assert_eq!(
        seen["session_events"]["text"]
            .as_str()
            .unwrap()
            .lines()
            .count(),
        events.len()
    );
    assert!(
        seen["unknown_resource"]["error"]
            .as_str()
            .unwrap()
            .contains("unknown resource loom://nothing"),
        "{}",
        seen["unknown_resource"]
    );

    // A base64 image becomes an artifact of the session, readable as a blob by either URI and
    // attachable again by its artifact:// link.
    assert_eq!(seen["with_image"]["is_error"], false);
    let stored = seen["stored"].as_array().unwrap();
    assert_eq!(stored.len(), 1);
    assert!(
        stored[0]
            .as_str()
            .unwrap()
            .starts_with("artifact://default/s-files/"),
        "{stored:?}"
    );
    assert_eq!(seen["artifact_by_loom_uri"]["blob"], seen["png"]);
    assert_eq!(seen["artifact_by_loom_uri"]["mime_type"], "image/png");
    assert_eq!(seen["artifact_by_uri"]["blob"], seen["png"]);
    assert_eq!(seen["with_artifact_link"]["is_error"], false);
    let files = journal(dir.path(), "default", "s-files");
    let attached = files
        .iter()
        .filter(|e| e["type"] == "artifact.stored")
        .count();
    assert_eq!(attached, 2, "{:?}", types(&files));

    // file:// only under server.mcp.file_roots.
    assert_eq!(
        seen["with_file"]["is_error"], false,
        "{}",
        seen["with_file"]
    );
    // A run opened without a session is addressed by its id alone.
    let lone = &seen["with_file"]["structured"]["run_id"];
    assert_eq!(seen["with_file_status"]["structured"]["run_id"], *lone);
    assert_eq!(seen["with_file_trace"]["json"]["run_id"], *lone);
    assert_eq!(seen["outside_file"]["is_error"], true);
    assert!(
        first_text(&seen["outside_file"]).contains("is outside server.mcp.file_roots"),
        "{}",
        seen["outside_file"]
    );
    assert!(first_text(&seen["bad_base64"]).starts_with("attachments[0].data is not base64"));
    assert_eq!(
        first_text(&seen["bad_arguments"]),
        "unknown argument 'text' (expected message, session_id, attachments, state)"
    );
    // An agent kept off MCP is not a tool.
    assert!(
        seen["hidden_agent"]["protocol_error"]
            .as_str()
            .unwrap()
            .contains("unknown tool 'interne'")
    );

    // cancel stops a run in flight; the call that started it returns the cancelled run.
    let running = seen["running"]
        .as_str()
        .expect("the long run was seen running");
    assert_eq!(
        seen["cancel"]["structured"],
        json!({"run_id": running, "cancelled": true})
    );
    assert_eq!(seen["cancelled_call"]["structured"]["status"], "cancelled");
    assert_eq!(seen["cancelled_call"]["is_error"], false);
    assert_eq!(
        seen["cancel_again"]["structured"],
        json!({"run_id": running, "cancelled": false})
    );
    assert_eq!(first_text(&seen["cancel_unknown"]), "run nope not found");
    let waited = journal(dir.path(), "default", "s-wait");
    let cancelled = waited
        .iter()
        .find(|e| e["type"] == "run.cancelled" && e["run_id"] == running)
        .expect("the run closed as cancelled in its journal");
    // The tool call in flight was stopped: it never completed.
    assert!(
        !waited.iter().any(|e| e["type"] == "tool.completed"
            && e["payload"]["tool_name"] == "patienter"
            && !e["payload"]["output"]["is_error"]
                .as_bool()
                .unwrap_or(false)),
        "{:?}",
        types(&waited)
    );
    assert_eq!(cancelled["payload"]["reason"], "requested");
    // Stopped by this process's pilot, the run records who cancelled it.
    assert_eq!(cancelled["payload"]["by"], "test");
    // A call the client cancels (notifications/cancelled) cancels its run.
    let abandoned = seen["abandoned_running"]
        .as_str()
        .expect("the second long run ran");
    assert_eq!(seen["abandoned"], abandoned);
    let events = journal(dir.path(), "default", "s-abandon");
    let cancelled = events
        .iter()
        .find(|e| e["type"] == "run.cancelled" && e["run_id"] == abandoned)
        .unwrap_or_else(|| panic!("{:?}", types(&events)));
    // Cancelled on behalf of the client that gave up the call.
    assert_eq!(cancelled["payload"]["by"], "mcp:mcp");
}

#[test]
fn an_approval_is_asked_by_elicitation_and_the_run_goes_on() {
    if !python_client() {
        return;
    }
    let dir = guichet();
    // Before protocol 2026-07-28: a server-to-client elicitation request during the call.
    let legacy = mcp_client(
        "approval",
        with(
            stdio(dir.path(), None, "legacy"),
            json!({"answer": "approve"}),
        ),
    );
    assert_eq!(legacy["protocol"], "2025-11-25");
    let asked = legacy["asked"].as_array().unwrap();
    assert_eq!(asked.len(), 1);
    assert!(
        asked[0]["message"]
            .as_str()
            .unwrap()
            .contains("call virement"),
        "{}",
        asked[0]
    );
    assert_eq!(
        asked[0]["schema"]["properties"]["decision"]["enum"],
        json!(["approve", "reject"])
    );
    let result = &legacy["result"];
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    assert_eq!(
        result["texts"],
        json!(["Résultat : virement de 1250 € vers FR76…123 enregistré"])
    );
    let session = result["structured"]["session_id"].as_str().unwrap();
    let events = journal(dir.path(), "default", session);
    let granted = events
        .iter()
        .find(|e| e["type"] == "approval.granted")
        .unwrap();
    assert_eq!(granted["payload"]["by"], "mcp:mcp");
    assert_eq!(granted["payload"]["reason"], "vu avec la compta");

    // Since 2026-07-28: the call answers with an input request, the client retries with the
    // user's answer (here a rejection, which the model is told).
    let modern = mcp_client(
        "approval",
        with(stdio(dir.path(), None, "auto"), json!({"answer": "reject"})),
    );
    assert_eq!(modern["protocol"], "2026-07-28");
    assert_eq!(modern["asked"].as_array().unwrap().len(), 1);
    let result = &modern["result"];
    assert_eq!(result["structured"]["status"], "completed", "{result}");
    assert!(
        first_text(result).contains("rejected by mcp:mcp"),
        "{result}"
    );
    let session = result["structured"]["session_id"].as_str().unwrap();
    let events = journal(dir.path(), "default", session);
    assert!(events.iter().any(|e| e["type"] == "approval.rejected"
        && e["payload"]["by"] == "mcp:mcp"
        && e["payload"]["reason"] == "vu avec la compta"));
    assert!(!types(&events).contains(&"approval.granted"));
}

#[test]
fn without_elicitation_the_run_waits_paused_for_loom_approve() {
    if !python_client() {
        return;
    }
    let dir = guichet();
    for (mode, answer) in [("auto", "none"), ("legacy", "none"), ("auto", "cancel")] {
        let seen = mcp_client(
            "approval",
            with(stdio(dir.path(), None, mode), json!({"answer": answer})),
        );
        let result = &seen["result"];
        assert_eq!(result["is_error"], false, "{result}");
        assert_eq!(
            result["structured"]["status"], "paused",
            "{mode} {answer}: {result}"
        );
        let pending = result["structured"]["pending_approvals"]
            .as_array()
            .unwrap();
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0]["tool_name"], "virement");
        let run_id = result["structured"]["run_id"].as_str().unwrap();
        assert!(
            first_text(result).contains(&format!("loom approve {run_id}")),
            "{result}"
        );
        // Nothing was decided through MCP: a human approves with the CLI, and the run goes on.
        let events = journal(dir.path(), "default", run_id);
        assert!(!types(&events).contains(&"approval.granted"));
        let approved = Command::new(example_bin("guichet"))
            .current_dir(dir.path())
            .args(["--config", "loom.yaml", "approve", run_id, "--by", "alice"])
            .output()
            .unwrap();
        assert!(approved.status.success(), "{}", text(&approved.stderr));
        let status = mcp_client(
            "status",
            with(stdio(dir.path(), None, "auto"), json!({"run_id": run_id})),
        );
        assert_eq!(status["status"]["structured"]["status"], "completed");
        assert_eq!(
            status["status"]["structured"]["text"],
            "Résultat : virement de 1250 € vers FR76…123 enregistré"
        );
    }
}

#[test]
fn a_stdio_server_serves_one_tenant_and_sees_nothing_of_another() {
    if !python_client() {
        return;
    }
    let dir = guichet();
    let acme = mcp_client(
        "basics",
        with(
            stdio(dir.path(), Some("acme"), "auto"),
            json!({"inside": "file:///nowhere.png", "outside": "file:///nowhere.png"}),
        ),
    );
    assert_eq!(acme["devis"]["structured"]["status"], "completed");
    assert!(dir.path().join("data/acme/s-devis.jsonl").exists());
    assert!(!dir.path().join("data/default").exists());
    let run_id = acme["devis"]["structured"]["run_id"].as_str().unwrap();
    let artifact = acme["stored"][0].as_str().unwrap();
    assert!(
        artifact.starts_with("artifact://acme/s-files/"),
        "{artifact}"
    );
    let globex = mcp_client(
        "tenant_view",
        with(
            stdio(dir.path(), Some("globex"), "auto"),
            json!({"run_id": run_id, "session_id": "s-devis", "artifact": artifact}),
        ),
    );
    assert_sees_nothing(&globex, run_id, "s-devis");

    let unknown = Command::new(example_bin("guichet"))
        .current_dir(dir.path())
        .args(["--config", "loom.yaml", "mcp", "--tenant", "initech"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(unknown.status.code(), Some(2));
    assert!(
        text(&unknown.stderr).contains("initech"),
        "{}",
        text(&unknown.stderr)
    );
    assert!(unknown.stdout.is_empty(), "stdout is the protocol only");
}

/// What a caller of another tenant sees of `run_id` (in `session`): nothing.
fn assert_sees_nothing(seen: &Value, run_id: &str, session: &str) {
    for tool in ["run_status", "run_status_search", "run_report", "cancel"] {
        assert_eq!(seen[tool]["is_error"], true, "{tool}: {}", seen[tool]);
        assert_eq!(
            first_text(&seen[tool]),
            format!("run {run_id} not found"),
            "{tool}"
        );
    }
    assert_eq!(seen["session_report"]["is_error"], true);
    assert_eq!(
        first_text(&seen["session_report"]),
        format!("session {session} not found")
    );
    let listed = |key: &str| seen[key]["json"].as_array().cloned().unwrap_or_default();
    let runs = seen["runs"]["json"]["runs"].as_array().expect("a run page");
    assert!(
        runs.iter().all(|r| r["run_id"] != run_id),
        "{}",
        seen["runs"]
    );
    assert!(
        listed("sessions")
            .iter()
            .all(|s| s["session_id"] != session),
        "{}",
        seen["sessions"]
    );
    for resource in ["run", "run_events", "trace", "session", "session_events"] {
        let error = seen[resource]["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("not found"),
            "{resource} was readable: {}",
            seen[resource]
        );
    }
    for artifact in ["artifact", "artifact_by_loom_uri"] {
        let error = seen[artifact]["error"].as_str().unwrap_or_default();
        assert!(
            error.starts_with("no artifact"),
            "{artifact}: {}",
            seen[artifact]
        );
    }
    assert_eq!(seen["artifact_attached"]["is_error"], true);
    assert!(
        first_text(&seen["artifact_attached"]).starts_with("attachments[0]: no artifact"),
        "{}",
        seen["artifact_attached"]
    );
}

// --- Streamable HTTP -------------------------------------------------------------------------

/// Keys of the HTTP tests: `(id, tenant, scopes)`; the key itself is `lk_test_<id>`.
const KEYS: [(&str, &str, &str); 5] = [
    ("acme", "acme", "run, read, read_content"),
    ("globex", "globex", "run, read, read_content"),
    ("lecteur", "acme", "read"),
    ("approbateur", "acme", "approve"),
    ("devis-seul", "acme", "run, read, read_content"),
];

/// The guichet project with `server.mcp.http`, the test keys and an allowed origin.
fn http_project() -> tempfile::TempDir {
    let dir = guichet();
    let path = dir.path().join("loom.yaml");
    let mut config = fs::read_to_string(&path).unwrap().replace(
        "    file_roots: [documents]\n",
        "    file_roots: [documents]\n    http: true\n    allowed_origins: [\"https://app.example.com\"]\n",
    );
    config.push_str("\nsecurity:\n  api_keys:\n");
    for (id, tenant, scopes) in KEYS {
        let hash = Sha256::digest(format!("lk_test_{id}").as_bytes());
        let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
        let agents = if id == "devis-seul" {
            ", agents: [devis]"
        } else {
            ""
        };
        config.push_str(&format!(
            "    - {{id: {id}, hash: \"sha256:{hex}\", tenant: {tenant}, scopes: [{scopes}]{agents}}}\n"
        ));
    }
    fs::write(&path, config).unwrap();
    dir
}

/// `guichet serve` on a free port; killed when dropped.
struct Served {
    child: Child,
    address: String,
    log: std::sync::mpsc::Receiver<String>,
}

impl Served {
    fn start(dir: &Path) -> Served {
        let mut child = Command::new(example_bin("guichet"))
            .current_dir(dir)
            .args(["--config", "loom.yaml", "serve", "--port", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = BufReader::new(child.stderr.take().unwrap());
        let (sender, log) = std::sync::mpsc::channel();
        // Drained to the end, so a chatty server never blocks on a full pipe.
        std::thread::spawn(move || {
            for line in stderr.lines() {
                let Ok(line) = line else { break };
                if sender.send(plain(&line)).is_err() {
                    break;
                }
            }
        });
        let mut address = None;
        for line in log.iter() {
            if let Some(rest) = line.trim().strip_prefix("Listening on http://") {
                address = Some(rest.to_owned());
                break;
            }
        }
        let Some(address) = address else {
            let _ = child.kill();
            panic!("no 'Listening on' line on stderr");
        };
        Served {
            child,
            address,
            log,
        }
    }

    fn url(&self) -> String {
        format!("http://{}/mcp", self.address)
    }

    /// Stops the server and returns everything it logged after its address.
    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.iter().collect()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `line` without ANSI escape sequences (colours of the console log format).
fn plain(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for next in chars.by_ref() {
                if next.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// One MCP `initialize` POST on a fresh connection with extra header lines; the status code and
/// the body.
fn post_mcp(address: &str, headers: &str) -> (u16, String) {
    let body = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "1"}},
    })
    .to_string();
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let host = if headers.contains("Host:") {
        String::new()
    } else {
        format!("Host: {address}\r\n")
    };
    write!(
        stream,
        "POST /mcp HTTP/1.1\r\n{host}Content-Type: application/json\r\n\
         Accept: application/json, text/event-stream\r\n{headers}Content-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    let status = response[9..12].parse().unwrap();
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// `GET path` with an API key on a fresh connection; the status code and the body.
fn get_json(address: &str, path: &str, key: &str) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {address}\r\nAuthorization: Bearer {key}\r\n\
         Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, body.to_owned())
}

#[test]
fn mcp_over_http_needs_a_key_with_its_scopes_and_checks_origin_and_host() {
    if !python_client() {
        return;
    }
    let dir = http_project();
    let served = Served::start(dir.path());
    let address = served.address.clone();
    // A key on every request.
    let (status, body) = post_mcp(&address, "");
    assert_eq!(status, 401, "{body}");
    assert!(body.contains("\"missing_key\""), "{body}");
    let (status, _) = post_mcp(&address, "Authorization: Bearer lk_test_nope\r\n");
    assert_eq!(status, 401);
    // A key that can neither run nor read has nothing to do over MCP.
    let (status, body) = post_mcp(&address, "X-API-Key: lk_test_approbateur\r\n");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("\"missing_scope\""), "{body}");
    // DNS rebinding: Origin and Host are checked.
    let key = "Authorization: Bearer lk_test_acme\r\n";
    let (status, body) = post_mcp(&address, &format!("{key}Origin: https://evil.example\r\n"));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Origin"), "{body}");
    let (status, body) = post_mcp(&address, &format!("{key}Host: evil.example\r\n"));
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Host"), "{body}");
    let (status, body) = post_mcp(
        &address,
        &format!("{key}Origin: https://app.example.com\r\n"),
    );
    assert_eq!(status, 200, "{body}");
    let port = address.rsplit(':').next().unwrap();
    let (status, body) = post_mcp(&address, &format!("{key}Host: localhost:{port}\r\n"));
    assert_eq!(status, 200, "{body}");

    // A full key: tools, a call with progress (no elicitation over HTTP: approvals pause).
    let full = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_acme", "call": true, "paiement": true}),
    );
    assert_eq!(
        full["tools"],
        json!([
            "attente",
            "devis",
            "paiement",
            "run_status",
            "run_report",
            "cancel"
        ])
    );
    assert_eq!(
        full["devis"]["texts"],
        json!(["Le prix est de 1375,00 € TTC."])
    );
    assert_eq!(full["progress"].as_array().unwrap().len(), 2);
    assert_eq!(full["run_status"]["structured"]["status"], "completed");
    assert_eq!(full["paiement"]["structured"]["status"], "paused");
    let run_id = full["devis"]["structured"]["run_id"].as_str().unwrap();
    assert!(dir.path().join("data/acme/s-http.jsonl").exists());

    // Read only, without read_content: no agent tool, no cancel, content removed.
    let reader = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_lecteur", "call": true}),
    );
    assert_eq!(reader["tools"], json!(["run_status", "run_report"]));
    assert_eq!(reader["devis"]["is_error"], true);
    assert_eq!(
        first_text(&reader["devis"]),
        "key 'lecteur' lacks the scope 'run'"
    );
    let run_lists = ["/runs", "/runs?agent=devis&status=completed"];
    let foreign = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_lecteur",
               "foreign": {"run_id": run_id, "session_id": "s-http"},
               "reads": run_lists.map(|list| format!("loom:/{list}"))}),
    );
    let status = &foreign["foreign"]["run_status"]["structured"];
    assert_eq!(status["status"], "completed");
    assert!(status.get("text").is_none(), "{status}");
    assert!(
        status["redacted"]
            .as_array()
            .unwrap()
            .contains(&json!("text"))
    );
    assert_eq!(
        foreign["foreign"]["cancel"]["texts"],
        json!(["key 'lecteur' lacks the scope 'run'"])
    );
    // MCP masks exactly as REST does: the same run read by the same key over
    // `GET /v1/runs/{id}` lists the same removed fields, and is the same JSON.
    let (code, body) = get_json(
        &address,
        &format!("/v1/runs/{run_id}?session_id=s-http"),
        "lk_test_lecteur",
    );
    assert_eq!(code, 200, "{body}");
    let rest: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status["redacted"], rest["redacted"], "{status} {rest}");
    assert_eq!(status, &rest);
    assert_eq!(foreign["foreign"]["run"]["json"], rest);
    let events = foreign["foreign"]["run_events"]["json"].as_array().unwrap();
    let user = events.iter().find(|e| e["type"] == "message.user").unwrap();
    assert!(user["payload"].get("message").is_none(), "{user}");
    assert_eq!(user["redacted"], json!(["payload.message"]));
    // No content anywhere a reader without read_content looks: the question, the answer.
    for resource in ["run", "run_events", "trace", "session", "session_events"] {
        let seen = foreign["foreign"][resource].to_string();
        assert!(!seen.contains("Prix TTC"), "{resource}: {seen}");
        assert!(!seen.contains("1375"), "{resource}: {seen}");
    }
    // loom://runs is GET /v1/runs: the same page for the same key, filters included.
    for list in run_lists {
        let (code, body) = get_json(&address, &format!("/v1{list}"), "lk_test_lecteur");
        assert_eq!(code, 200, "{body}");
        let rest: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            foreign["reads"][format!("loom:/{list}")]["json"],
            rest,
            "{list}"
        );
    }
    // loom://sessions is GET /v1/sessions.
    let (code, body) = get_json(&address, "/v1/sessions", "lk_test_lecteur");
    assert_eq!(code, 200, "{body}");
    let rest: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(foreign["foreign"]["sessions"]["json"], rest);
    assert!(!rest.as_array().unwrap().is_empty(), "{rest}");
    let all_runs = foreign["reads"]["loom://runs"]["json"]["runs"]
        .as_array()
        .unwrap();
    assert!(
        all_runs.iter().any(|r| r["agent"] == "paiement"),
        "{all_runs:?}"
    );
    // A report holds no content: without read_content it is whole, and the session's is the
    // one GET /v1/sessions/{id}/report gives.
    let report = &foreign["foreign"]["run_report"];
    let session_report = &foreign["foreign"]["session_report"];
    for seen in [report, session_report] {
        assert_eq!(seen["is_error"], false, "{seen}");
        assert!(seen["structured"].get("redacted").is_none(), "{seen}");
        let shown = seen.to_string();
        assert!(
            !shown.contains("Prix TTC") && !shown.contains("1375"),
            "{shown}"
        );
    }
    assert_eq!(report["structured"]["run_id"], run_id);
    assert_eq!(report["structured"]["total"]["calls"], 2);
    let (code, body) = get_json(&address, "/v1/sessions/s-http/report", "lk_test_lecteur");
    assert_eq!(code, 200, "{body}");
    let rest: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(session_report["structured"], rest);
    let trace = &foreign["foreign"]["trace"]["json"];
    assert_eq!(trace["run_id"], run_id);
    assert!(
        trace["redacted"]
            .as_array()
            .unwrap()
            .contains(&json!("output")),
        "{trace}"
    );

    // A key limited to one agent sees only that agent.
    let limited = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_devis-seul",
               "reads": ["loom://runs", "loom://runs?agent=paiement"],
               "calls": [["run_report", {"run_id": run_id, "session_id": "s-http"}]]}),
    );
    // The same report as read with read_content.
    assert_eq!(limited["calls"][0]["structured"], report["structured"]);
    // Its runs are its agents' only, as GET /v1/runs shows them to it.
    let (code, body) = get_json(&address, "/v1/runs", "lk_test_devis-seul");
    assert_eq!(code, 200, "{body}");
    let rest: Value = serde_json::from_str(&body).unwrap();
    let own = &limited["reads"]["loom://runs"]["json"];
    assert_eq!(own, &rest);
    let own_runs = own["runs"].as_array().unwrap();
    assert!(
        !own_runs.is_empty() && own_runs.iter().all(|r| r["agent"] == "devis"),
        "{own}"
    );
    assert!(
        limited["reads"]["loom://runs?agent=paiement"]["error"]
            .as_str()
            .unwrap_or_default()
            .contains("key 'devis-seul' is not allowed on the agent 'paiement'"),
        "{}",
        limited["reads"]["loom://runs?agent=paiement"]
    );
    assert_eq!(
        limited["tools"],
        json!(["devis", "run_status", "run_report", "cancel"])
    );
    assert_eq!(limited["resources"], json!(["loom://runs"]));
    // Each exposed agent was logged once at start, with its security state.
    let startup = served.stop();
    for (agent, access) in [("devis", "rest"), ("devis", "mcp"), ("interne", "rest")] {
        let lines = startup
            .iter()
            .filter(|l| {
                l.contains("WARN")
                    && l.contains("agent exposed")
                    && l.contains(&format!("agent={agent} "))
                    && l.contains(&format!("access=\"{access}\""))
                    && l.contains("API key required")
            })
            .count();
        assert_eq!(lines, 1, "{agent} {access}: {startup:#?}");
    }
    assert!(
        !startup
            .iter()
            .any(|l| l.contains("agent=interne ") && l.contains("access=\"mcp\"")),
        "{startup:#?}"
    );
}

#[test]
fn a_key_of_one_tenant_never_sees_another_tenants_runs_over_mcp() {
    if !python_client() {
        return;
    }
    let dir = http_project();
    let served = Served::start(dir.path());
    let globex = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_globex", "call": true, "session": "s-globex"}),
    );
    assert_eq!(globex["devis"]["structured"]["status"], "completed");
    let run_id = globex["devis"]["structured"]["run_id"].as_str().unwrap();
    let artifact = globex["run_events"]["json"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "artifact.stored")
        .and_then(|e| e["payload"]["uri"].as_str())
        .unwrap()
        .to_owned();
    assert!(artifact.starts_with("artifact://globex/s-globex/"));
    assert!(dir.path().join("data/globex/s-globex.jsonl").exists());

    let acme = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_acme",
               "foreign": {"run_id": run_id, "session_id": "s-globex", "artifact": artifact}}),
    );
    assert_sees_nothing(&acme["foreign"], run_id, "s-globex");
    // The attempted cancellation wrote nothing in the other tenant's journal.
    let events = journal(dir.path(), "globex", "s-globex");
    assert!(!types(&events).contains(&"run.cancelled"));
}

/// The HTTP project with an agent `accueil` that hands quotes to `devis` (a sub-run), and a
/// key `lk_test_accueil-seul` limited to `accueil`.
fn delegating_project() -> tempfile::TempDir {
    let dir = http_project();
    let path = dir.path().join("loom.yaml");
    let hash = Sha256::digest(b"lk_test_accueil-seul");
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    let mut config = fs::read_to_string(&path).unwrap().replacen(
        "models:\n",
        "models:\n  - id: fake-accueil\n    sdk: fake\n    model: FAKE-ACCUEIL\n    params:\n      script:\n        - text: \"Je transmets au service devis.\"\n          tool_calls:\n            - name: devis\n              arguments: {message: \"Prix TTC de 1 250 € HT ?\"}\n        - text: \"{{ tool_result }}\"\n",
        1,
    );
    config.push_str(&format!(
        "    - {{id: accueil-seul, hash: \"sha256:{hex}\", tenant: acme, scopes: [run, read, read_content], agents: [accueil]}}\n"
    ));
    fs::write(&path, config).unwrap();
    fs::write(
        dir.path().join("agents/accueil.yaml"),
        "name: accueil\ndescription: Accueille les clients et confie les devis au service devis.\n\
         main:\n  model: fake-accueil\nsubagents:\n  - agent: devis\n",
    )
    .unwrap();
    dir
}

#[test]
fn a_key_limited_to_an_agent_does_not_see_the_sub_runs_of_other_agents_over_mcp() {
    if !python_client() {
        return;
    }
    let dir = delegating_project();
    let served = Served::start(dir.path());
    let opened = mcp_client(
        "http",
        json!({"url": served.url(), "key": "lk_test_accueil-seul",
               "calls": [["accueil", {"message": "Un devis, s'il vous plaît.", "session_id": "s-tree"}]]}),
    );
    let result = &opened["calls"][0]["structured"];
    assert_eq!(result["status"], "completed", "{opened}");
    let run_id = result["run_id"].as_str().unwrap();
    let session = "s-tree";
    let events = journal(dir.path(), "acme", session);
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "run.started" && e["agent"] == "devis"),
        "devis ran as a sub-run"
    );

    let trace = format!("loom://traces/{run_id}?session_id={session}");
    let seen_by = |key: &str| {
        mcp_client(
            "http",
            json!({"url": served.url(), "key": key,
                   "reads": [trace],
                   "calls": [["run_status", {"run_id": run_id, "session_id": session}],
                             ["run_report", {"run_id": run_id, "session_id": session}]]}),
        )
    };
    // The limited key reads its own run's result, but not the trace or the report, which show
    // the devis sub-run: refused as REST's GET /v1/traces refuses it (403).
    let limited = seen_by("lk_test_accueil-seul");
    assert_eq!(limited["calls"][0]["structured"]["status"], "completed");
    let refusal = "key 'accueil-seul' is not allowed on the agent 'devis'";
    assert!(
        limited["reads"][&trace]["error"]
            .as_str()
            .unwrap_or_default()
            .contains(refusal),
        "{}",
        limited["reads"][&trace]
    );
    assert_eq!(
        limited["calls"][1]["is_error"], true,
        "{}",
        limited["calls"][1]
    );
    assert_eq!(first_text(&limited["calls"][1]), refusal);
    let (code, body) = get_json(
        &served.address,
        &format!("/v1/traces/{run_id}?session_id={session}"),
        "lk_test_accueil-seul",
    );
    assert_eq!(code, 403, "{body}");
    // A key of the tenant without an agent limit reads both, sub-run included.
    let whole = seen_by("lk_test_acme");
    let steps = whole["reads"][&trace]["json"].to_string();
    assert!(steps.contains("devis"), "{steps}");
    assert_eq!(
        whole["calls"][1]["is_error"], false,
        "{}",
        whole["calls"][1]
    );
}
