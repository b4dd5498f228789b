//! Operations of `loom serve` through the real binaries: a graceful stop keeps the runs in
//! flight open and resumable (SIGTERM mid-run, the journal checked, a restart finishes the
//! run), past `execution.shutdown_timeout` the step is abandoned and still resumed,
//! `--reload` restarts the server on configuration changes and refuses a broken one, and a
//! running server takes over the run of another one killed with SIGKILL once its lease expires.
//!
//! The run that waits is the `equipe` example's bank statement: the sub-agent's tool waits for
//! a file the test writes, so every step happens when the test says.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use common::{
    copy_example, example_bin, loom_bin,
    server::{Server, request},
};
use loom_testkit::wait;
use serde_json::Value;

const RELEVE: &str = "Récupère le relevé de la banque pour le rapprochement.";

/// The equipe example's servers read the bank's files in `<dir>/releves`.
fn start(program: &Path, dir: &Path, args: &[&str]) -> Server {
    Server::start_with(program, dir, args, &[("RELEVES_DIR", dir.join("releves"))])
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

fn wait_for(path: &Path) {
    wait::blocking_until(format!("{} to appear", path.display()), || path.exists());
}

/// The events of a session's journal.
fn journal(dir: &Path, session: &str) -> Vec<Value> {
    let path: PathBuf = dir.join("data/default").join(format!("{session}.jsonl"));
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn of_run<'a>(events: &'a [Value], run: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["run_id"] == run).collect()
}

/// The run is open (no closing event) and its last event hands the lease back.
fn open_with_lease_handed_back(events: &[Value], run: &str) {
    let mine = of_run(events, run);
    assert!(
        !mine.iter().any(|e| matches!(
            e["type"].as_str(),
            Some("run.completed" | "run.failed" | "run.cancelled")
        )),
        "run {run} was closed"
    );
    let last = mine.last().unwrap();
    assert_eq!(last["type"], "run.claimed", "{last}");
    let until =
        chrono::DateTime::parse_from_rfc3339(last["payload"]["lease_until"].as_str().unwrap())
            .unwrap();
    let ts = chrono::DateTime::parse_from_rfc3339(last["ts"].as_str().unwrap()).unwrap();
    assert!(until <= ts, "the lease is not handed back: {last}");
}

/// Polls `GET /v1/runs/{run}` until it is completed; its result.
fn wait_completed(address: &str, run: &str) -> Value {
    wait::blocking_until(format!("run {run} to complete"), || {
        let (status, body) = request(address, "GET", &format!("/v1/runs/{run}"), "");
        if status == 200 && json(&body)["status"] == "completed" {
            Ok(json(&body))
        } else {
            Err(format!("{status} {body}"))
        }
    })
}

/// The `equipe` example in a fresh directory, with its bank folder.
fn equipe(extra: &str) -> tempfile::TempDir {
    let dir = copy_example("equipe");
    std::fs::create_dir(dir.path().join("releves")).unwrap();
    if !extra.is_empty() {
        let path = dir.path().join("loom.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, format!("{text}{extra}")).unwrap();
    }
    dir
}

/// Starts a synchronous run of the secretariat on the bank statement, in a thread.
fn start_run(address: &str, run: &str) -> std::thread::JoinHandle<(u16, String)> {
    let address = address.to_owned();
    let body = serde_json::json!({"message": RELEVE, "run_id": run}).to_string();
    std::thread::spawn(move || request(&address, "POST", "/v1/agents/secretariat/runs", &body))
}

const SERVE: &[&str] = &["--config", "loom.yaml", "serve", "--port", "0"];

#[test]
fn sigterm_stops_the_runs_at_a_safe_point_and_the_next_start_resumes_them() {
    let dir = equipe("");
    let releves = dir.path().join("releves");
    let server = start(&example_bin("equipe"), dir.path(), SERVE);
    let answer = start_run(&server.address, "g1");
    // The sub-agent's tool is waiting for the bank when the server is told to stop.
    wait_for(&releves.join("demande-cic.txt"));
    server.terminate();
    server.wait_log("Stopping.");
    // The step in progress ends (the bank answers), then the runs let go.
    std::fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{body}");
    let error = json(&body);
    assert_eq!(error["error"]["kind"], "interrupted", "{body}");
    assert_eq!(error["error"]["run_id"], "g1");
    assert_eq!(error["error"]["session_id"], "g1");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");

    // The journal: nothing closed, the step's results written, the lease handed back.
    let events = journal(dir.path(), "g1");
    open_with_lease_handed_back(&events, "g1");
    let child = events
        .iter()
        .find(|e| e["type"] == "run.started" && e["payload"]["parent_run_id"] == "g1")
        .unwrap()["run_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let sub = of_run(&events, &child);
    assert!(sub.iter().any(|e| e["type"] == "tool.completed"));
    assert!(
        !sub.iter()
            .any(|e| e["type"] == "run.completed" || e["type"] == "run.cancelled"),
        "the child was closed"
    );

    // The next start resumes the run, which completes with the bank's statement (read once).
    let server = start(&example_bin("equipe"), dir.path(), SERVE);
    server.wait_log("Resuming 1 run(s)");
    let result = wait_completed(&server.address, "g1");
    assert!(
        result["text"]
            .as_str()
            .unwrap()
            .contains("relevé CIC de novembre"),
        "{result}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    let events = journal(dir.path(), "g1");
    let calls = events
        .iter()
        .filter(|e| e["type"] == "tool.called" && e["payload"]["tool_name"] == "releve_bancaire")
        .count();
    assert_eq!(calls, 1, "the bank was asked again");
}

#[test]
fn past_the_shutdown_timeout_the_step_is_abandoned_and_still_resumed() {
    let dir = equipe("execution: {shutdown_timeout: 0.2}\n");
    let releves = dir.path().join("releves");
    let server = start(&example_bin("equipe"), dir.path(), SERVE);
    let answer = start_run(&server.address, "g2");
    wait_for(&releves.join("demande-cic.txt"));
    // The bank never answers before the timeout: the step is abandoned.
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["error"]["kind"], "interrupted");
    let events = journal(dir.path(), "g2");
    open_with_lease_handed_back(&events, "g2");
    assert!(
        !events.iter().any(
            |e| e["type"] == "tool.completed" && e["payload"]["tool_name"] == "releve_bancaire"
        ),
        "the abandoned call has no result"
    );

    // Restarted: the call is made again (the tool is idempotent), the bank answers, done.
    std::fs::remove_file(releves.join("demande-cic.txt")).unwrap();
    let server = start(&example_bin("equipe"), dir.path(), SERVE);
    wait_for(&releves.join("demande-cic.txt"));
    std::fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let result = wait_completed(&server.address, "g2");
    assert!(
        result["text"].as_str().unwrap().contains("relevé CIC"),
        "{result}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
    let events = journal(dir.path(), "g2");
    assert!(events.iter().any(|e| e["type"] == "tool.called"
        && e["payload"]["tool_name"] == "releve_bancaire"
        && e["payload"]["resumed"] == true));
}

const RELOAD_CONFIG: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: Bonjour.
storage:
  events: {backend: jsonl, path: data}
telemetry:
  logging: {level: WARN}
";

fn agent_file(description: &str) -> String {
    format!("name: hello\ndescription: {description}\nmain: {{model: fake-1}}\n")
}

/// Polls `GET /v1/agents` until the agent's description is `expected`.
fn wait_description(address: &str, expected: &str) {
    wait::blocking_until(format!("the description {expected:?}"), || {
        let (status, body) = request(address, "GET", "/v1/agents", "");
        if status == 200 && json(&body)[0]["description"] == expected {
            Ok(())
        } else {
            Err(format!("{status} {body}"))
        }
    });
}

#[test]
fn reload_serves_a_changed_configuration_and_keeps_the_old_one_when_the_new_is_broken() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), RELOAD_CONFIG).unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    let agent = dir.path().join("agents/hello.yaml");
    std::fs::write(&agent, agent_file("Says hello.")).unwrap();
    let mut args = SERVE.to_vec();
    args.push("--reload");
    let server = start(&loom_bin(), dir.path(), &args);
    wait_description(&server.address, "Says hello.");

    // A change: the new configuration serves, on the same address.
    std::fs::write(&agent, agent_file("Says hello, reloaded.")).unwrap();
    wait_description(&server.address, "Says hello, reloaded.");
    server.wait_log("Reloaded");

    // A broken change: refused with its reason, the previous configuration keeps serving.
    std::fs::write(&agent, "name: hello\ndescription: [unclosed\n").unwrap();
    server.wait_log("reload refused");
    let log = server.log();
    assert!(log.contains("config error: "), "{log}");
    assert!(log.contains("agents/hello.yaml"), "{log}");
    let (status, body) = request(&server.address, "GET", "/v1/agents", "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(json(&body)[0]["description"], "Says hello, reloaded.");
    let (status, body) = request(
        &server.address,
        "POST",
        "/v1/agents/hello/runs",
        r#"{"message": "Salut"}"#,
    );
    assert_eq!(status, 201, "{body}");

    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn reload_is_refused_under_prod() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), RELOAD_CONFIG).unwrap();
    std::fs::create_dir(dir.path().join("agents")).unwrap();
    std::fs::write(
        dir.path().join("agents/hello.yaml"),
        agent_file("Says hello."),
    )
    .unwrap();
    let output = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_PROFILE")
        .args([
            "--config",
            "loom.yaml",
            "--profile",
            "prod",
            "serve",
            "--port",
            "0",
            "--reload",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--reload is refused under the prod profile"),
        "{stderr}"
    );
}

#[test]
fn a_reload_hands_the_runs_in_flight_to_the_new_server() {
    let dir = equipe("execution: {shutdown_timeout: 0.2}\n");
    let releves = dir.path().join("releves");
    let mut args = SERVE.to_vec();
    args.push("--reload");
    let server = start(&example_bin("equipe"), dir.path(), &args);
    let answer = start_run(&server.address, "g3");
    wait_for(&releves.join("demande-cic.txt"));
    std::fs::remove_file(releves.join("demande-cic.txt")).unwrap();

    // A change while the run waits for the bank: the new server takes over, the old one stops
    // the run (its step abandoned past the timeout) and the new one resumes it.
    let agent = dir.path().join("agents/comptable.yaml");
    let text = std::fs::read_to_string(&agent).unwrap();
    std::fs::write(
        &agent,
        text.replace("description: Tient", "description: Désormais, tient"),
    )
    .unwrap();
    server.wait_log("Reloaded");
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["error"]["run_id"], "g3");
    wait_for(&releves.join("demande-cic.txt"));
    std::fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let result = wait_completed(&server.address, "g3");
    assert!(
        result["text"].as_str().unwrap().contains("relevé CIC"),
        "{result}"
    );
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

/// `equipe serve --reload` (a 60 s shutdown timeout), a synchronous run `run` waiting for the
/// bank, then a configuration change: returns once the old server hands over, with the
/// request still in flight.
fn hand_over_mid_run(
    run: &str,
) -> (
    tempfile::TempDir,
    Server,
    std::thread::JoinHandle<(u16, String)>,
) {
    let dir = equipe("execution: {shutdown_timeout: 60}\n");
    let mut args = SERVE.to_vec();
    args.push("--reload");
    let server = start(&example_bin("equipe"), dir.path(), &args);
    let answer = start_run(&server.address, run);
    wait_for(&dir.path().join("releves/demande-cic.txt"));
    let agent = dir.path().join("agents/comptable.yaml");
    let text = std::fs::read_to_string(&agent).unwrap();
    std::fs::write(
        &agent,
        text.replace("description: Tient", "description: Désormais, tient"),
    )
    .unwrap();
    server.wait_log("Handing over: the requests in flight are answered first.");
    (dir, server, answer)
}

#[test]
fn a_reload_answers_the_requests_in_flight_before_the_old_server_stops() {
    // A change while the run waits for the bank: the new server takes over the socket, the
    // old one keeps the request it is answering.
    let (dir, server, answer) = hand_over_mid_run("g4");
    let releves = dir.path().join("releves");
    // New requests go to the new server meanwhile.
    let (status, body) = request(&server.address, "GET", "/v1/agents", "");
    assert_eq!(status, 200, "{body}");
    // The bank answers: the old server finishes the run and answers the request itself.
    std::fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 201, "{body}");
    let result = json(&body);
    assert_eq!(result["status"], "completed", "{body}");
    assert!(
        result["text"].as_str().unwrap().contains("relevé CIC"),
        "{result}"
    );
    server.wait_log("Reloaded");
    let (code, log) = server.stop();
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn a_stop_during_a_hand_over_stops_the_old_server_instead_of_draining() {
    // A change while the run waits for the bank: the new server takes over the socket, the
    // old one keeps the request it is answering.
    let (dir, server, answer) = hand_over_mid_run("g5");
    let releves = dir.path().join("releves");
    // Stopping the supervisor mid-drain: the old server stops its run at the end of the step
    // (a drain would have completed it), and everything exits.
    server.terminate();
    server.wait_log("Stopping.");
    std::fs::write(releves.join("releve-cic.txt"), "relevé CIC de novembre\n").unwrap();
    let (status, body) = answer.join().unwrap();
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["error"]["kind"], "interrupted", "{body}");
    let (code, log) = server.wait();
    assert_eq!(code, Some(0), "{log}");
    assert!(!log.contains("Reloaded"), "{log}");
}

/// The chaos example's tools in one agent: a line appended once (irreversible, deduplicated by
/// its idempotency key), then a wait for the gate file; a two-second lease.
const TAKEOVER_CONFIG: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - text: J'écris.
          tool_calls:
            - name: append_line
              arguments: {text: relance envoyée}
        - text: J'attends le feu vert.
          tool_calls:
            - name: attendre
              arguments: {}
        - text: 'Fini : {{ tool_result }}'
agents:
  - name: relance
    main: {model: fake-1}
    tools:
      - tool: append_line
      - tool: attendre
storage:
  events: {backend: jsonl, path: data}
execution: {lease: 2}
telemetry:
  logging: {level: WARN}
";

#[test]
fn a_running_server_resumes_the_run_of_a_server_killed_with_sigkill_once_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("loom.yaml"), TAKEOVER_CONFIG).unwrap();
    let lines = dir.path().join("lines.txt");
    let gate = dir.path().join("gate");
    let env = [("CHAOS_FILE", lines.clone()), ("CHAOS_GATE", gate.clone())];
    // B serves the same journal before A is killed.
    let b = Server::start_with(&example_bin("chaos"), dir.path(), SERVE, &env);
    let mut a = Server::start_with(&example_bin("chaos"), dir.path(), SERVE, &env);
    let body =
        serde_json::json!({"message": "Relance le client.", "run_id": "k1", "background": true});
    let (status, answer) = request(
        &a.address,
        "POST",
        "/v1/agents/relance/runs",
        &body.to_string(),
    );
    assert_eq!(status, 202, "{answer}");

    // A wrote the line, then waits at the gate: SIGKILL, no lease handed back.
    wait::blocking_until("the run to reach the gate", || {
        journal(dir.path(), "k1")
            .iter()
            .any(|e| e["type"] == "tool.called" && e["payload"]["tool_name"] == "attendre")
    });
    a.kill();
    std::fs::write(&gate, "").unwrap();

    // B finishes the run, after A's lease (checked on the journal below).
    let result = wait_completed(&b.address, "k1");
    assert_eq!(result["text"], "Fini : feu vert", "{result}");
    b.wait_log("lease expired");
    let (code, log) = b.stop();
    assert_eq!(code, Some(0), "{log}");

    // The line was written once: the completed call was not made again.
    let written = std::fs::read_to_string(&lines).unwrap();
    assert_eq!(written.lines().count(), 1, "{written}");
    let events = journal(dir.path(), "k1");
    let calls = |tool: &str| {
        events
            .iter()
            .filter(|e| e["type"] == "tool.called" && e["payload"]["tool_name"] == tool)
            .count()
    };
    assert_eq!(calls("append_line"), 1);
    // The call A left without a result was made again by B (safe: no side effect).
    assert_eq!(calls("attendre"), 2);
    // One driver at a time: A's claims, then B's only, and nothing of A after B's first claim.
    let mut drivers: Vec<&str> = Vec::new();
    for event in of_run(&events, "k1") {
        if event["type"] == "run.claimed" {
            let worker = event["payload"]["worker_id"].as_str().unwrap();
            if drivers.last() != Some(&worker) {
                drivers.push(worker);
            }
        }
    }
    assert_eq!(drivers.len(), 2, "{drivers:?}");
    assert_ne!(drivers[0], drivers[1]);
    let taken = events
        .iter()
        .position(|e| e["type"] == "run.claimed" && e["payload"]["worker_id"] == drivers[1])
        .unwrap();
    let last_of_a = events
        .iter()
        .rposition(|e| e["type"] == "run.claimed" && e["payload"]["worker_id"] == drivers[0])
        .unwrap();
    assert!(last_of_a < taken);
    let until = chrono::DateTime::parse_from_rfc3339(
        events[last_of_a]["payload"]["lease_until"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    let ts = chrono::DateTime::parse_from_rfc3339(events[taken]["ts"].as_str().unwrap()).unwrap();
    assert!(
        until <= ts,
        "B claimed at {ts}, before A's lease ran out at {until}"
    );
}
