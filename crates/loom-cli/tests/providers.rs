//! Real provider adapters through the stock `loom` binary, against a local HTTP server on
//! 127.0.0.1 that replays the recorded wire transcripts of `../shared/fixtures/providers/`:
//! retries, Retry-After, fallbacks, the breaker, mid-stream errors and timeouts, end to end.
//! Nothing here reaches a real provider.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    collections::{HashMap, VecDeque},
    fs,
    io::{BufRead, BufReader, Read, Write},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::{Arc, Mutex},
    thread,
    time::Duration,
};

use serde_json::Value;

fn fixtures() -> PathBuf {
    loom_testkit::shared::root().join("fixtures/providers")
}

/// Whether the transcripts can be read: `false` (after a skip notice) on a clone without
/// `../shared`, where the test returns at once (see `loom_testkit::shared`).
fn fixtures_present() -> bool {
    loom_testkit::shared::path("fixtures/providers").is_some()
}

/// One canned HTTP response.
#[derive(Clone)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    /// Wait this long before answering (to trigger timeouts).
    delay: Duration,
    /// Send the body in pieces of this many bytes, pausing this long between them.
    trickle: Option<(usize, Duration)>,
}

/// A fixture stream, served as `text/event-stream`.
fn sse(path: &str) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), "text/event-stream".into())],
        body: fs::read(fixtures().join(path)).unwrap(),
        delay: Duration::ZERO,
        trickle: None,
    }
}

/// A fixture error body with the status and headers of its `.meta.json`.
fn error(path: &str) -> Reply {
    let meta: Value = serde_json::from_str(
        &fs::read_to_string(fixtures().join(path.replace(".json", ".meta.json"))).unwrap(),
    )
    .unwrap();
    Reply {
        status: meta["status"].as_u64().unwrap() as u16,
        headers: meta["headers"]
            .as_object()
            .unwrap()
            .iter()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_owned()))
            .collect(),
        body: fs::read(fixtures().join(path)).unwrap(),
        delay: Duration::ZERO,
        trickle: None,
    }
}

/// A local server answering each path from its own queue, recording request bodies.
struct Server {
    port: u16,
    requests: Arc<Mutex<Vec<(String, Value)>>>,
    /// The request bodies, byte for byte.
    raw: Arc<Mutex<Vec<Vec<u8>>>>,
    /// The `x-api-key` header of each request (Anthropic's key), in order.
    keys: Arc<Mutex<Vec<Option<String>>>>,
}

impl Server {
    fn start(replies: Vec<(&str, Reply)>) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut queues: HashMap<String, VecDeque<Reply>> = HashMap::new();
        for (path, reply) in replies {
            queues.entry(path.to_owned()).or_default().push_back(reply);
        }
        let queues = Arc::new(Mutex::new(queues));
        let requests = Arc::new(Mutex::new(Vec::new()));
        let recorded = requests.clone();
        let raw = Arc::new(Mutex::new(Vec::new()));
        let raw_recorded = raw.clone();
        let keys = Arc::new(Mutex::new(Vec::new()));
        let keys_recorded = keys.clone();
        thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { continue };
                let queues = queues.clone();
                let recorded = recorded.clone();
                let raw_recorded = raw_recorded.clone();
                let keys_recorded = keys_recorded.clone();
                thread::spawn(move || {
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut request_line = String::new();
                    if reader.read_line(&mut request_line).is_err() {
                        return;
                    }
                    let path = request_line
                        .split_whitespace()
                        .nth(1)
                        .unwrap_or("/")
                        .to_owned();
                    let mut length = 0usize;
                    let mut key = None;
                    loop {
                        let mut line = String::new();
                        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                            break;
                        }
                        if let Some((name, value)) = line.split_once(':') {
                            if name.eq_ignore_ascii_case("content-length") {
                                length = value.trim().parse().unwrap_or(0);
                            } else if name.eq_ignore_ascii_case("x-api-key") {
                                key = Some(value.trim().to_owned());
                            }
                        }
                    }
                    keys_recorded.lock().unwrap().push(key);
                    let mut body = vec![0; length];
                    let _ = reader.read_exact(&mut body);
                    raw_recorded.lock().unwrap().push(body.clone());
                    recorded.lock().unwrap().push((
                        path.clone(),
                        serde_json::from_slice(&body).unwrap_or(Value::Null),
                    ));
                    let reply = queues
                        .lock()
                        .unwrap()
                        .get_mut(&path)
                        .and_then(VecDeque::pop_front);
                    let reply = reply.unwrap_or(Reply {
                        status: 404,
                        headers: vec![],
                        body: b"{}".to_vec(),
                        delay: Duration::ZERO,
                        trickle: None,
                    });
                    thread::sleep(reply.delay);
                    let mut head = format!(
                        "HTTP/1.1 {} X\r\ncontent-length: {}\r\nconnection: close\r\n",
                        reply.status,
                        reply.body.len()
                    );
                    for (name, value) in &reply.headers {
                        head.push_str(&format!("{name}: {value}\r\n"));
                    }
                    head.push_str("\r\n");
                    let _ = stream.write_all(head.as_bytes());
                    match reply.trickle {
                        Some((size, pause)) => {
                            for piece in reply.body.chunks(size.max(1)) {
                                if stream
                                    .write_all(piece)
                                    .and_then(|()| stream.flush())
                                    .is_err()
                                {
                                    break;
                                }
                                thread::sleep(pause);
                            }
                        }
                        None => {
                            let _ = stream.write_all(&reply.body);
                        }
                    }
                });
            }
        });
        Server {
            port,
            requests,
            raw,
            keys,
        }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn requests(&self) -> Vec<(String, Value)> {
        self.requests.lock().unwrap().clone()
    }

    fn raw_bodies(&self) -> Vec<Vec<u8>> {
        self.raw.lock().unwrap().clone()
    }

    fn keys(&self) -> Vec<Option<String>> {
        self.keys.lock().unwrap().clone()
    }
}

fn project(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    dir
}

fn run(dir: &Path, run_id: &str) -> Output {
    Command::new(loom_bin())
        .current_dir(dir)
        .env("TEST_ANTHROPIC_KEY", "sk-ant-test")
        .env("TEST_OPENAI_KEY", "sk-test")
        .args([
            "--config",
            "loom.yaml",
            "run",
            "a",
            "Bonjour",
            "--run-id",
            run_id,
        ])
        .output()
        .unwrap()
}

fn types(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap().to_owned())
        .collect()
}

/// A configuration with a Claude model and an OpenAI model on the local server; `main` names
/// the agent's model and `extra` adds agent keys.
fn config(server: &Server, main: &str, fallbacks: &str) -> String {
    format!(
        r#"version: 1
models:
  - id: claude
    sdk: anthropic
    model: claude-sonnet-4-5
    base_url: {url}
    api_key_env: TEST_ANTHROPIC_KEY
    max_tokens: 1024
    pricing: {{input: 3.0, output: 15.0}}
    retry: {{max_attempts: 3, initial_delay: 0.01, max_delay: 5}}
    timeouts: {{first_token: 0.5, idle: 0.5, total: 5}}
    circuit_breaker: {{failures: 5, cooldown: 60}}
  - id: gpt
    sdk: openai
    api: chat
    model: gpt-4o-mini
    base_url: {url}/v1
    api_key_env: TEST_OPENAI_KEY
    pricing: {{input: 0.15, output: 0.6}}
    retry: {{max_attempts: 2, initial_delay: 0.01}}
  - id: gpt-responses
    sdk: openai
    api: responses
    model: gpt-4.1
    base_url: {url}/v1
    api_key_env: TEST_OPENAI_KEY
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main:
      model: {main}
      system: Tu es un assistant.
      fallbacks: [{fallbacks}]
"#,
        url = server.url()
    )
}

#[test]
fn claude_answers_and_the_request_follows_the_messages_api() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![(
        "/v1/messages",
        sse("anthropic/stream-text-basic.sse"),
    )]);
    let dir = project(&config(&server, "claude", ""));
    let out = run(dir.path(), "c1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");
    let events = journal(dir.path(), "c1");
    let responded = events
        .iter()
        .find(|e| e["type"] == "model.responded")
        .unwrap();
    assert_eq!(responded["payload"]["provider"], "anthropic");
    assert_eq!(responded["payload"]["model"], "claude");
    assert_eq!(responded["payload"]["usage"]["input_tokens"], 25);
    assert_eq!(responded["payload"]["usage"]["output_tokens"], 15);
    let (path, body) = &server.requests()[0];
    assert_eq!(path, "/v1/messages");
    insta::assert_json_snapshot!("anthropic_request", body);
}

#[test]
fn openai_chat_and_responses_answer() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        (
            "/v1/chat/completions",
            sse("openai-chat/stream-text-usage.sse"),
        ),
        ("/v1/responses", sse("openai-responses/stream-text.sse")),
    ]);
    let dir = project(&config(&server, "gpt", ""));
    let out = run(dir.path(), "o1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("I'm unable to provide real-time weather updates."));
    let dir = project(&config(&server, "gpt-responses", ""));
    let out = run(dir.path(), "r1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "2+2 = 4");
    let requests = server.requests();
    insta::assert_json_snapshot!("openai_chat_request", requests[0].1);
    insta::assert_json_snapshot!("openai_responses_request", requests[1].1);
}

#[test]
fn an_overloaded_claude_is_retried_then_answers() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", error("anthropic/error-529-overloaded.json")),
        (
            "/v1/messages",
            sse("anthropic/stream-error-overloaded-midstream.sse"),
        ),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let dir = project(&config(&server, "claude", ""));
    let out = run(dir.path(), "retry-1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");
    let events = journal(dir.path(), "retry-1");
    let retried: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.retried")
        .collect();
    assert_eq!(retried.len(), 2, "{:?}", types(&events));
    assert_eq!(retried[0]["payload"]["error_kind"], "overloaded");
    assert_eq!(retried[0]["payload"]["http_status"], 529);
    assert_eq!(retried[0]["payload"]["attempt"], 1);
    assert_eq!(retried[1]["payload"]["attempt"], 2);
    // The partial answer of the failed stream never reached the journal.
    let answers: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.responded")
        .collect();
    assert_eq!(answers.len(), 1);
    assert_eq!(
        answers[0]["payload"]["message"]["blocks"][0]["text"],
        "Hello!"
    );
}

#[test]
fn quota_switches_at_once_to_the_fallback_and_the_run_stays_there() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        (
            "/v1/chat/completions",
            error("openai-chat/error-429-insufficient-quota.json"),
        ),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let dir = project(&config(&server, "gpt", "claude"));
    let out = run(dir.path(), "q1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");
    let events = journal(dir.path(), "q1");
    assert!(
        !events.iter().any(|e| e["type"] == "model.retried"),
        "{:?}",
        types(&events)
    );
    let fell = events
        .iter()
        .find(|e| e["type"] == "model.fell_back")
        .unwrap();
    assert_eq!(fell["payload"]["from_model"], "gpt");
    assert_eq!(fell["payload"]["to_model"], "claude");
    assert_eq!(fell["payload"]["reason"], "quota_exhausted");
    let responded = events
        .iter()
        .find(|e| e["type"] == "model.responded")
        .unwrap();
    assert_eq!(responded["payload"]["model"], "claude");
    // The cost is the fallback's: 25 input and 15 output tokens at Claude's prices.
    let cost = responded["payload"]["cost_usd"].as_f64().unwrap();
    assert!(
        (cost - (25.0 * 3.0 + 15.0 * 15.0) / 1e6).abs() < 1e-12,
        "{cost}"
    );
}

#[test]
fn auth_errors_are_not_retried() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![(
        "/v1/messages",
        error("anthropic/error-401-authentication.json"),
    )]);
    let dir = project(&config(&server, "claude", ""));
    let out = run(dir.path(), "auth-1");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("(model.auth)"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(server.requests().len(), 1);
}

#[test]
fn a_silent_provider_hits_the_first_token_timeout_then_is_retried() {
    if !fixtures_present() {
        return;
    }
    let mut slow = sse("anthropic/stream-text-basic.sse");
    slow.delay = Duration::from_millis(1500);
    let server = Server::start(vec![
        ("/v1/messages", slow),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let dir = project(&config(&server, "claude", ""));
    let out = run(dir.path(), "t1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "t1");
    let retried = events
        .iter()
        .find(|e| e["type"] == "model.retried")
        .unwrap();
    assert_eq!(retried["payload"]["error_kind"], "transient");
    assert!(
        retried["payload"]["error"]
            .as_str()
            .unwrap()
            .contains("first"),
        "{retried}"
    );
}

#[test]
fn a_retry_after_beyond_max_delay_abandons_the_model_for_its_fallback() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", error("anthropic/error-429-rate-limit.json")),
        (
            "/v1/chat/completions",
            sse("openai-chat/stream-text-usage.sse"),
        ),
    ]);
    let dir = project(&config(&server, "claude", "gpt"));
    let out = run(dir.path(), "ra-1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Retry-After: 27 s is more than max_delay (5 s): no retry waits for it, Claude is asked
    // once, and the fallback answers.
    let events = journal(dir.path(), "ra-1");
    assert!(
        !events.iter().any(|e| e["type"] == "model.retried"),
        "a retry was scheduled"
    );
    let paths: Vec<String> = server.requests().into_iter().map(|(p, _)| p).collect();
    assert_eq!(paths, ["/v1/messages", "/v1/chat/completions"]);
    let fell = events
        .iter()
        .find(|e| e["type"] == "model.fell_back")
        .unwrap();
    assert_eq!(fell["payload"]["reason"], "transient");
    assert_eq!(fell["payload"]["to_model"], "gpt");
}

#[test]
fn stream_shows_retries_and_restarts_the_answer() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", error("anthropic/error-529-overloaded.json")),
        (
            "/v1/messages",
            sse("anthropic/stream-error-overloaded-midstream.sse"),
        ),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let dir = project(&config(&server, "claude", ""));
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env("TEST_ANTHROPIC_KEY", "sk-ant-test")
        .args(["--config", "loom.yaml", "run", "a", "Bonjour", "--stream"])
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("· claude failed (overloaded, attempt 1), retrying in"),
        "{stderr}"
    );
    assert!(stderr.contains("· answer restarted"), "{stderr}");
    assert!(stdout.trim_end().ends_with("Hello!"), "{stdout}");
}

#[test]
fn a_missing_api_key_variable_is_a_configuration_error() {
    let server = Server::start(vec![]);
    let dir = project(&config(&server, "claude", ""));
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("TEST_ANTHROPIC_KEY")
        .env("TEST_OPENAI_KEY", "sk-test")
        .args(["--config", "loom.yaml", "validate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains("loom.yaml:7:18 models[0].api_key_env: model 'claude': the environment variable TEST_ANTHROPIC_KEY is absent or empty"),
        "{}",
        text(&out.stderr)
    );
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn raw_exchanges_are_journaled_per_attempt_without_the_key() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", error("anthropic/error-529-overloaded.json")),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let captured = config(&server, "claude", "").replace(
        "storage:",
        "telemetry:\n  capture: {raw_exchanges: true, raw_max_bytes: 100}\nstorage:",
    );
    let dir = project(&captured);
    let out = run(dir.path(), "x1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");

    // The key is nowhere in the journal.
    let file = fs::read_to_string(dir.path().join("data/default/x1.jsonl")).unwrap();
    assert!(!file.contains("sk-ant-test"), "{file}");

    let events = journal(dir.path(), "x1");
    let kinds = types(&events);
    let exchanged: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.exchanged")
        .collect();
    assert_eq!(exchanged.len(), 2, "{kinds:?}");
    // One per attempt: the failed one before its retry, the good one just before the answer.
    let at = |t: &str| kinds.iter().position(|k| k == t).unwrap();
    assert_eq!(kinds[at("model.retried") - 1], "model.exchanged");
    assert_eq!(kinds[at("model.responded") - 1], "model.exchanged");

    let bodies = server.raw_bodies();
    for (i, (event, status)) in exchanged.iter().zip([529, 200]).enumerate() {
        let p = &event["payload"];
        assert_eq!(event["category"], "model");
        assert_eq!(event["role"], "main");
        assert_eq!(p["attempt"], i + 1);
        assert_eq!(p["status_code"], status);
        assert_eq!(p["model"], "claude");
        assert_eq!(p["model_id"], "claude-sonnet-4-5");
        assert_eq!(p["provider"], "anthropic");
        assert_eq!(p["synthetic"], false);
        assert_eq!(p["method"], "POST");
        assert_eq!(p["url"], format!("{}/v1/messages", server.url()));
        assert_eq!(p["request_headers"]["x-api-key"], "<redacted>");
        // Cut at 100 bytes, but measured and hashed whole.
        assert_eq!(p["request_truncated"], true);
        assert!(p["request_body"].as_str().unwrap().len() <= 100);
        assert_eq!(p["request_bytes"], bodies[i].len());
        assert_eq!(p["request_sha256"], sha256_hex(&bodies[i]));
        assert!(p["response_bytes"].as_u64().unwrap() > 0);
        assert_eq!(event["facets"]["status_code"], status);
        assert_eq!(event["facets"]["attempt"], i + 1);
        assert_eq!(event["facets"]["model"], "claude");
    }
    assert_eq!(exchanged[0]["status"], "warning");
    assert!(exchanged[0]["payload"]["error"].is_string());
    assert_eq!(exchanged[1]["status"], "ok");
    assert!(exchanged[1]["payload"]["error"].is_null());
    let sse_body = fs::read(fixtures().join("anthropic/stream-text-basic.sse")).unwrap();
    assert_eq!(
        exchanged[1]["payload"]["response_sha256"],
        sha256_hex(&sse_body)
    );
    assert_eq!(exchanged[1]["payload"]["response_truncated"], true);

    // Off by default: nothing of the kind.
    let dir = project(&config(&server, "claude", ""));
    let out = run(dir.path(), "x2");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "x2");
    assert!(!events.iter().any(|e| e["type"] == "model.exchanged"));
}

/// A tenant reads the model's API key from its own secret and captures its raw exchanges; the
/// other tenant uses the common key and captures nothing. No key reaches the journal.
#[test]
fn a_tenant_uses_its_own_api_key_and_its_own_capture() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let config = config(&server, "claude", "")
        + "tenants:
  - id: martin
    secrets: {TEST_ANTHROPIC_KEY: LOOM_TEST_MARTIN_ANTHROPIC_KEY}
    telemetry: {capture: {raw_exchanges: true}}
  - id: dupont
";
    let dir = project(&config);
    for (tenant, run_id) in [("martin", "m1"), ("dupont", "d1")] {
        let out = Command::new(loom_bin())
            .current_dir(dir.path())
            .env("TEST_ANTHROPIC_KEY", "sk-ant-test")
            .env("TEST_OPENAI_KEY", "sk-test")
            .env("LOOM_TEST_MARTIN_ANTHROPIC_KEY", "sk-ant-martin-own")
            .args(["--config", "loom.yaml", "run", "a", "Bonjour"])
            .args(["--run-id", run_id, "--tenant", tenant])
            .output()
            .unwrap();
        assert!(out.status.success(), "{tenant}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), "Hello!");
    }
    assert_eq!(
        server.keys(),
        [
            Some("sk-ant-martin-own".to_owned()),
            Some("sk-ant-test".to_owned())
        ]
    );
    let martin = fs::read_to_string(dir.path().join("data/martin/m1.jsonl")).unwrap();
    let dupont = fs::read_to_string(dir.path().join("data/dupont/d1.jsonl")).unwrap();
    assert!(martin.contains("\"model.exchanged\""), "{martin}");
    assert!(!dupont.contains("\"model.exchanged\""), "{dupont}");
    for journal in [&martin, &dupont] {
        assert!(!journal.contains("sk-ant-"), "{journal}");
    }
}

#[test]
fn a_stream_that_goes_silent_hits_the_idle_timeout_and_a_slow_one_the_total_timeout() {
    if !fixtures_present() {
        return;
    }
    // The first answer stops for 1.5 s in the middle (idle 0.5 s); the second trickles for
    // longer than the total (5 s) while never pausing more than the idle; the third is fine.
    let mut silent = sse("anthropic/stream-text-basic.sse");
    // Pause right after the first text delta, so the first chunk has arrived.
    let first_text = String::from_utf8_lossy(&silent.body)
        .find("text_delta")
        .unwrap()
        + 120;
    silent.trickle = Some((first_text, Duration::from_millis(1500)));
    let mut slow = sse("anthropic/stream-text-basic.sse");
    slow.trickle = Some((slow.body.len() / 20, Duration::from_millis(300)));
    let server = Server::start(vec![
        ("/v1/messages", silent),
        ("/v1/messages", slow),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let config = config(&server, "claude", "").replace(
        "first_token: 0.5, idle: 0.5, total: 5",
        "first_token: 3, idle: 0.5, total: 2",
    );
    let dir = project(&config);
    let out = run(dir.path(), "idle-1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");
    let events = journal(dir.path(), "idle-1");
    let retried: Vec<String> = events
        .iter()
        .filter(|e| e["type"] == "model.retried")
        .map(|e| e["payload"]["error"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(retried.len(), 2, "{retried:?}");
    assert!(
        retried[0].contains("idle") || retried[0].contains("between"),
        "{retried:?}"
    );
    assert!(retried[1].contains("total"), "{retried:?}");
}

#[test]
fn a_model_breaker_opens_within_a_run_and_the_fallback_answers() {
    if !fixtures_present() {
        return;
    }
    let server = Server::start(vec![
        ("/v1/messages", error("anthropic/error-500-api-error.json")),
        ("/v1/messages", error("anthropic/error-500-api-error.json")),
        (
            "/v1/chat/completions",
            sse("openai-chat/stream-text-usage.sse"),
        ),
    ]);
    let config = config(&server, "claude", "gpt")
        .replace("failures: 5, cooldown: 60", "failures: 2, cooldown: 60");
    let dir = project(&config);
    let out = run(dir.path(), "cb-1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "cb-1");
    let opened = events
        .iter()
        .find(|e| e["type"] == "circuit.opened")
        .expect("circuit.opened");
    assert_eq!(opened["payload"]["target_kind"], "model");
    assert_eq!(opened["payload"]["target"], "claude");
    assert_eq!(opened["payload"]["failures"], 2);
    let fell = events
        .iter()
        .find(|e| e["type"] == "model.fell_back")
        .unwrap();
    assert_eq!(fell["payload"]["to_model"], "gpt");
    // Two attempts reached Claude, none after the breaker opened.
    assert_eq!(
        server
            .requests()
            .iter()
            .filter(|r| r.0 == "/v1/messages")
            .count(),
        2
    );
}

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

#[test]
fn an_attached_image_reaches_a_vision_model_inline_and_never_the_journal() {
    if !fixtures_present() {
        return;
    }
    use base64::Engine as _;
    let server = Server::start(vec![
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let seeing = config(&server, "claude", "")
        .replace(
            "    model: claude-sonnet-4-5\n",
            "    model: claude-sonnet-4-5\n    capabilities: {vision: true}\n",
        )
        // Raw exchanges are captured too: their copy of the request keeps no file bytes either.
        .replace(
            "storage:",
            "telemetry:\n  capture: {raw_exchanges: true}\nstorage:",
        );
    let attach = |dir: &Path, run_id: &str| {
        fs::write(dir.join("photo.png"), PNG).unwrap();
        Command::new(loom_bin())
            .current_dir(dir)
            .env("TEST_ANTHROPIC_KEY", "sk-ant-test")
            .env("TEST_OPENAI_KEY", "sk-test")
            .args([
                "--config",
                "loom.yaml",
                "run",
                "a",
                "Qu'y a-t-il sur la photo ?",
            ])
            .args(["--run-id", run_id, "--attach", "photo.png"])
            .output()
            .unwrap()
    };
    let encoded = base64::engine::general_purpose::STANDARD.encode(PNG);
    let dir = project(&seeing);
    let out = attach(dir.path(), "v1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, body) = &server.requests()[0];
    assert_eq!(
        body["messages"][0]["content"],
        serde_json::json!([
            {"type": "text", "text": "Qu'y a-t-il sur la photo ?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": encoded}}
        ])
    );
    let events = journal(dir.path(), "v1");
    assert_eq!(
        types(&events)[..3],
        ["run.started", "artifact.stored", "message.user"]
    );
    let uri = format!("artifact://default/v1/{}.png", sha256_hex(PNG));
    assert_eq!(events[1]["payload"]["uri"], uri.as_str());
    assert_eq!(events[1]["payload"]["origin"], "attachment");
    assert_eq!(
        events[2]["payload"]["message"]["blocks"][1]["type"],
        "artifact"
    );
    let journal_text = fs::read_to_string(dir.path().join("data/default/v1.jsonl")).unwrap();
    assert!(
        !journal_text.contains(&encoded),
        "no file bytes in the journal"
    );
    let exchanged = events
        .iter()
        .find(|e| e["type"] == "model.exchanged")
        .unwrap();
    assert!(
        exchanged["payload"]["request_body"]
            .as_str()
            .unwrap()
            .contains("\"data\":\"<70 bytes>\""),
        "{exchanged}"
    );
    // The bytes live beside the journal, content-addressed.
    let stored = dir.path().join(format!(
        "data/.artifacts/default/v1/{}.png",
        sha256_hex(PNG)
    ));
    assert_eq!(fs::read(&stored).unwrap(), PNG, "{}", stored.display());

    // A model without vision is told a file was there, and is not sent its bytes.
    let dir = project(&config(&server, "claude", ""));
    let out = attach(dir.path(), "b1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, body) = &server.requests()[1];
    let content = body["messages"][0]["content"].to_string();
    assert!(!content.contains(&encoded), "{content}");
    assert!(
        content.contains("photo.png (image/png, 70 bytes)"),
        "{content}"
    );
}

#[test]
fn a_vision_role_on_claude_is_sent_the_attached_image() {
    if !fixtures_present() {
        return;
    }
    use base64::Engine as _;
    let server = Server::start(vec![(
        "/v1/messages",
        sse("anthropic/stream-text-basic.sse"),
    )]);
    let config = format!(
        r#"version: 1
models:
  - id: fake
    sdk: fake
    model: FAKE
    params:
      script:
        - {{text: "Pas d'image.", without_tool: decrit}}
        - {{tool_calls: [{{name: decrit, arguments: {{}}}}], with_tool: decrit}}
        - {{text: "Vu.", with_tool: decrit}}
  - id: claude
    sdk: anthropic
    model: claude-sonnet-4-5
    base_url: {url}
    api_key_env: TEST_ANTHROPIC_KEY
    capabilities: {{vision: true}}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main:
      model: fake
      system: Tu es un assistant.
    roles:
      - name: decrit
        description: Décrit l'image jointe.
        model: claude
        system: Tu décris des images.
        context: [attachments]
"#,
        url = server.url()
    );
    let dir = project(&config);
    fs::write(dir.path().join("photo.png"), PNG).unwrap();
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env("TEST_ANTHROPIC_KEY", "sk-ant-test")
        .args(["--config", "loom.yaml", "run", "a", "Décris la photo."])
        .args(["--run-id", "role-1", "--attach", "photo.png"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Vu.");
    let requests = server.requests();
    assert_eq!(requests.len(), 1, "only the role calls Claude");
    let body = &requests[0].1;
    assert_eq!(body["system"], "Tu décris des images.");
    assert!(body.get("tools").is_none(), "{body}");
    assert_eq!(
        body["messages"],
        serde_json::json!([{"role": "user", "content": [
            {"type": "text", "text": "<attachments>\n- photo.png (image/png)\n</attachments>\n\n<arguments>\n{}\n</arguments>"},
            {"type": "image", "source": {
                "type": "base64",
                "media_type": "image/png",
                "data": base64::engine::general_purpose::STANDARD.encode(PNG)
            }}
        ]}])
    );
    let events = journal(dir.path(), "role-1");
    let responded = events
        .iter()
        .find(|e| e["type"] == "model.responded" && e["role"] == "decrit")
        .unwrap();
    assert_eq!(responded["payload"]["call_id"], "fake_0_0");
    assert_eq!(responded["payload"]["provider"], "anthropic");
    let completed = events
        .iter()
        .find(|e| e["type"] == "tool.completed")
        .unwrap();
    assert_eq!(
        completed["payload"]["output"]["blocks"][0]["text"],
        "Hello!"
    );
}

/// A canned 200 reply of `content_type` with `body`.
fn reply(content_type: &str, body: String) -> Reply {
    Reply {
        status: 200,
        headers: vec![("content-type".into(), content_type.into())],
        body: body.into_bytes(),
        delay: Duration::ZERO,
        trickle: None,
    }
}

/// The `data:` lines of `events`, as a server-sent-events body (with their `event:` names
/// when `named`).
fn sse_body(events: &[Value], named: bool) -> String {
    let mut body = String::new();
    for event in events {
        if named && let Some(name) = event["type"].as_str() {
            body.push_str(&format!("event: {name}\n"));
        }
        body.push_str(&format!("data: {event}\n\n"));
    }
    body
}

/// What each provider streams for an answer whose whole text is `text`.
fn anthropic_text_stream(text: &str) -> Reply {
    let events = [
        serde_json::json!({"type": "message_start", "message": {"model": "claude-sonnet-4-5", "usage": {"input_tokens": 20, "output_tokens": 1}}}),
        serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}),
        serde_json::json!({"type": "content_block_stop", "index": 0}),
        serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 6}}),
        serde_json::json!({"type": "message_stop"}),
    ];
    reply("text/event-stream", sse_body(&events, true))
}

fn chat_text_stream(text: &str) -> Reply {
    let chunk = serde_json::json!({"model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": "stop"}]});
    reply(
        "text/event-stream",
        format!("data: {chunk}\n\ndata: [DONE]\n\n"),
    )
}

fn responses_text_stream(text: &str) -> Reply {
    let completed = serde_json::json!({"type": "response.completed", "response": {
        "status": "completed", "model": "gpt-4.1",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
        "usage": {"input_tokens": 20, "output_tokens": 6}
    }});
    reply("text/event-stream", sse_body(&[completed], true))
}

/// `config` with `capabilities` given to every model on the server, and the agent's final
/// output under a contract with a JSON schema.
fn with_capabilities_and_contract(config: &str, capabilities: &str) -> String {
    let config = config
        .replace(
            "    api_key_env: TEST_ANTHROPIC_KEY\n",
            &format!("    api_key_env: TEST_ANTHROPIC_KEY\n    capabilities: {capabilities}\n"),
        )
        .replace(
            "    api_key_env: TEST_OPENAI_KEY\n",
            &format!("    api_key_env: TEST_OPENAI_KEY\n    capabilities: {capabilities}\n"),
        );
    format!(
        "{config}    output:\n      schema:\n        type: object\n        properties: {{total: \
         {{type: integer}}}}\n        required: [total]\n        additionalProperties: false\n"
    )
}

/// The output contract's schema of [`with_capabilities_and_contract`].
fn total_schema() -> Value {
    serde_json::json!({
        "type": "object",
        "properties": {"total": {"type": "integer"}},
        "required": ["total"],
        "additionalProperties": false
    })
}

#[test]
fn a_contract_schema_is_sent_as_native_structured_output_to_models_that_declare_it() {
    let answer = "{\"total\": 10}";
    let server = Server::start(vec![
        ("/v1/messages", anthropic_text_stream(answer)),
        ("/v1/chat/completions", chat_text_stream(answer)),
        ("/v1/responses", responses_text_stream(answer)),
        ("/v1/chat/completions", chat_text_stream(answer)),
    ]);
    let mut bodies = Vec::new();
    for (main, run_id) in [
        ("claude", "nj-1"),
        ("gpt", "nj-2"),
        ("gpt-responses", "nj-3"),
    ] {
        let dir = project(&with_capabilities_and_contract(
            &config(&server, main, ""),
            "{native_json: true}",
        ));
        let out = run(dir.path(), run_id);
        assert!(out.status.success(), "{main}: {}", text(&out.stderr));
        let events = journal(dir.path(), run_id);
        let done = events
            .iter()
            .find(|e| e["type"] == "run.completed")
            .unwrap();
        assert_eq!(done["payload"]["data"], serde_json::json!({"total": 10}));
        bodies.push(server.requests().last().unwrap().1.clone());
    }
    let schema = total_schema();
    assert_eq!(
        bodies[0]["output_config"]["format"],
        serde_json::json!({"type": "json_schema", "schema": schema})
    );
    assert_eq!(
        bodies[1]["response_format"],
        serde_json::json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema, "strict": true}})
    );
    assert_eq!(
        bodies[2]["text"]["format"],
        serde_json::json!({"type": "json_schema", "name": "output", "schema": schema, "strict": true})
    );
    // A model that does not declare native JSON is not sent the schema.
    let dir = project(&with_capabilities_and_contract(
        &config(&server, "gpt", ""),
        "{native_json: false}",
    ));
    let out = run(dir.path(), "nj-4");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let body = server.requests().last().unwrap().1.clone();
    assert!(body.get("response_format").is_none(), "{body}");
}

#[test]
fn models_that_cannot_stream_are_asked_without_stream_and_answer() {
    let claude = serde_json::json!({
        "id": "msg_01", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "text", "text": "Bonjour de Claude."}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 12, "output_tokens": 5}
    });
    let chat = serde_json::json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Bonjour de GPT."}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
    });
    let responses = serde_json::json!({
        "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4.1",
        "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Bonjour des Responses."}]}],
        "usage": {"input_tokens": 12, "output_tokens": 5}
    });
    let server = Server::start(vec![
        (
            "/v1/messages",
            reply("application/json", claude.to_string()),
        ),
        (
            "/v1/chat/completions",
            reply("application/json", chat.to_string()),
        ),
        (
            "/v1/responses",
            reply("application/json", responses.to_string()),
        ),
    ]);
    for (main, run_id, answer) in [
        ("claude", "ns-1", "Bonjour de Claude."),
        ("gpt", "ns-2", "Bonjour de GPT."),
        ("gpt-responses", "ns-3", "Bonjour des Responses."),
    ] {
        let config = config(&server, main, "")
            .replace(
                "    api_key_env: TEST_ANTHROPIC_KEY\n",
                "    api_key_env: TEST_ANTHROPIC_KEY\n    capabilities: {streaming: false}\n",
            )
            .replace(
                "    api_key_env: TEST_OPENAI_KEY\n",
                "    api_key_env: TEST_OPENAI_KEY\n    capabilities: {streaming: false}\n",
            );
        let dir = project(&config);
        let out = run(dir.path(), run_id);
        assert!(out.status.success(), "{main}: {}", text(&out.stderr));
        assert_eq!(text(&out.stdout).trim(), answer);
        let events = journal(dir.path(), run_id);
        let responded = events
            .iter()
            .find(|e| e["type"] == "model.responded")
            .unwrap();
        assert_eq!(responded["payload"]["usage"]["output_tokens"], 5, "{main}");
        let body = server.requests().last().unwrap().1.clone();
        assert!(body.get("stream").is_none(), "{main}: {body}");
        assert!(body.get("stream_options").is_none(), "{main}: {body}");
    }
}

#[test]
fn an_openai_503_is_overloaded_retried_then_falls_back() {
    if !fixtures_present() {
        return;
    }
    let unavailable = Reply {
        status: 503,
        headers: vec![("content-type".into(), "text/html".into())],
        body: b"<html>Service Unavailable</html>".to_vec(),
        delay: Duration::ZERO,
        trickle: None,
    };
    let server = Server::start(vec![
        ("/v1/chat/completions", unavailable.clone()),
        ("/v1/chat/completions", unavailable),
        ("/v1/messages", sse("anthropic/stream-text-basic.sse")),
    ]);
    let dir = project(&config(&server, "gpt", "claude"));
    let out = run(dir.path(), "ov-1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Hello!");
    let events = journal(dir.path(), "ov-1");
    let retried: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "model.retried")
        .collect();
    assert_eq!(retried.len(), 1, "{:?}", types(&events));
    assert_eq!(retried[0]["payload"]["error_kind"], "overloaded");
    assert_eq!(retried[0]["payload"]["http_status"], 503);
    let fell = events
        .iter()
        .find(|e| e["type"] == "model.fell_back")
        .unwrap();
    assert_eq!(fell["payload"]["from_model"], "gpt");
    assert_eq!(fell["payload"]["to_model"], "claude");
    assert_eq!(fell["payload"]["reason"], "overloaded");
}
