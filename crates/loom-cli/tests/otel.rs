//! OpenTelemetry export through the stock `loom` binary, checked by a receiver nobody here
//! wrote the decoding of: `otlp_receiver.py` decodes each POSTed `ExportTraceServiceRequest`
//! with the official OpenTelemetry protobuf definitions (PyPI `opentelemetry-proto`) and writes
//! the spans as JSON. A run with a sub-agent (calling a built-in tool), a role and a judge is
//! exported as one trace: names, kinds, nesting (the sub-run under the tool call that opened
//! it), GenAI attributes, tokens and cost, the journal's times, the ids derived from the run's;
//! the e-mail and IBAN of the conversation never reach the receiver. One INFO log line per
//! model and tool call is written (JSON logs).

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::{fs, str};

use serde_json::Value;
use sha2::{Digest, Sha256};

const EMAIL: &str = "jean.dupont@exemple.fr";
const IBAN: &str = "FR76 3000 6000 0112 3456 7890 189";

fn config(content: bool) -> String {
    let capture = if content {
        "  capture: {exports: content}\n"
    } else {
        ""
    };
    format!(
        r#"version: 1
models:
  - id: fake-secretariat
    sdk: fake
    model: FAKE-SECRETARIAT
    pricing: {{input: 3.0, output: 15.0}}
    params:
      script:
        - text: "Je transmets la question au service comptable."
          tool_calls:
            - name: comptable
              arguments: {{message: "Client {EMAIL}, IBAN {IBAN} : quelle date est-il ?"}}
        - text: "Je fais rédiger la réponse."
          tool_calls:
            - name: rediger
              arguments: {{date: "aujourd'hui"}}
        - text: "Bonjour, {{{{ tool_result }}}}"
  - id: fake-comptable
    sdk: fake
    model: FAKE-COMPTABLE
    pricing: {{input: 1.0, output: 5.0}}
    params:
      script:
        - tool_calls:
            - name: loom.current_datetime
              arguments: {{}}
        - text: "Nous sommes le {{{{ tool_result }}}}"
  - id: fake-redacteur
    sdk: fake
    model: FAKE-REDACTEUR
    pricing: {{input: 1.0, output: 5.0}}
    params:
      script:
        - text: "votre dossier est à jour."
  - id: fake-juge
    sdk: fake
    model: FAKE-JUGE
    pricing: {{input: 1.0, output: 5.0}}
    params:
      script:
        - tool_calls:
            - name: verdict
              arguments: {{criteria: [{{name: poli, score: 0.9, reason: "le client est salué"}}]}}
storage:
  events:
    backend: jsonl
    path: data
telemetry:
  logging: {{level: INFO, format: json}}
{capture}  exporters:
    - {{type: otel, endpoint_env: TEST_OTLP_ENDPOINT, headers_env: TEST_OTLP_HEADERS, service_name: shop, timeout: 5}}
"#
    )
}

const SECRETARIAT: &str = r#"name: secretariat
description: Accueille les demandes et confie la comptabilité au service comptable.
main:
  model: fake-secretariat
  system: Tu es le secrétariat.
max_iterations: 5
subagents:
  - agent: comptable
roles:
  - name: rediger
    description: Rédige la réponse au client.
    model: fake-redacteur
    system: Tu rédiges des réponses brèves.
    input_schema:
      type: object
      properties: {date: {type: string}}
      required: [date]
judge:
  model: fake-juge
  criteria:
    - name: poli
      rule: La réponse salue le client.
      min_score: 0.8
"#;

const COMPTABLE: &str = r#"name: comptable
description: Tient les comptes de l'entreprise.
main:
  model: fake-comptable
  system: Tu es le comptable.
max_iterations: 3
tools:
  - tool: loom.current_datetime
"#;

/// The receiver, killed when dropped.
struct Receiver {
    child: Child,
    port: u16,
    out: PathBuf,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Receiver {
    fn start(dir: &Path) -> Receiver {
        let out = dir.join("received.jsonl");
        let script = repo().join("crates/loom-cli/tests/otlp_receiver.py");
        let mut child = Command::new("python3")
            .arg(script)
            .arg(&out)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().parse().expect("the receiver prints its port");
        Receiver { child, port, out }
    }

    /// The spans received so far for `trace_id`.
    fn spans(&self, trace_id: &str) -> Vec<Value> {
        fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).unwrap())
            .filter(|span| span["trace_id"] == trace_id)
            .collect()
    }

    /// Every byte POSTed so far.
    fn raw(&self) -> Vec<u8> {
        fs::read(self.out.with_extension("jsonl.raw")).unwrap_or_default()
    }
}

fn project(content: bool) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), config(content)).unwrap();
    fs::create_dir(dir.path().join("agents")).unwrap();
    fs::write(dir.path().join("agents/secretariat.yaml"), SECRETARIAT).unwrap();
    fs::write(dir.path().join("agents/comptable.yaml"), COMPTABLE).unwrap();
    dir
}

fn run(dir: &Path, receiver: &Receiver, run_id: &str) -> Output {
    let out = Command::new(loom_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env(
            "TEST_OTLP_ENDPOINT",
            format!("http://127.0.0.1:{}/", receiver.port),
        )
        .env("TEST_OTLP_HEADERS", "Authorization=Bearer otlp-test")
        .args(["--config", "loom.yaml", "run", "secretariat"])
        .arg(format!("Bonjour, je suis {EMAIL}, mon IBAN est {IBAN}."))
        .args(["--run-id", run_id])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "stdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    out
}

/// The trace id Loom derives for root run `run` of tenant `default`: the first 16 bytes of
/// SHA-256 over "loom/trace", the tenant and the run, each followed by a NUL.
fn trace_id(run: &str) -> String {
    let digest = Sha256::digest(format!("loom/trace\0default\0{run}\0").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

fn span_id(journal_span: &str) -> String {
    let digest = Sha256::digest(format!("loom/span\0{journal_span}\0").as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

fn named<'a>(spans: &'a [Value], prefix: &str) -> Vec<&'a Value> {
    spans
        .iter()
        .filter(|s| s["name"].as_str().unwrap().starts_with(prefix))
        .collect()
}

fn nanos(ts: &str) -> u64 {
    let at = chrono::DateTime::parse_from_rfc3339(ts).unwrap();
    u64::try_from(at.timestamp_nanos_opt().unwrap()).unwrap()
}

/// OTLP's span kinds.
const INTERNAL: u64 = 1;
const CLIENT: u64 = 3;

#[test]
fn a_run_tree_is_exported_as_one_redacted_trace() {
    if !python_has(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        "pip install opentelemetry-proto",
    ) {
        return;
    }
    let dir = project(true);
    let receiver = Receiver::start(dir.path());
    let out = run(dir.path(), &receiver, "t1");
    let spans = receiver.spans(&trace_id("t1"));
    assert!(!spans.is_empty(), "no span received");
    let names: Vec<&str> = spans.iter().map(|s| s["name"].as_str().unwrap()).collect();

    // Every span belongs to the trace; every parent was received, and only the run is a root.
    let ids: Vec<&str> = spans
        .iter()
        .map(|s| s["span_id"].as_str().unwrap())
        .collect();
    let roots: Vec<&Value> = spans.iter().filter(|s| s["parent_span_id"] == "").collect();
    assert_eq!(roots.len(), 1, "{names:?}");
    for span in &spans {
        let parent = span["parent_span_id"].as_str().unwrap();
        assert!(
            parent.is_empty() || ids.contains(&parent),
            "orphan {}",
            span["name"]
        );
        assert_eq!(span["resource"]["service.name"], "shop");
        assert_eq!(span["authorization"], "Bearer otlp-test");
        assert_eq!(span["content_type"], "application/x-protobuf");
        assert!(span["end"].as_u64().unwrap() >= span["start"].as_u64().unwrap());
    }

    // The root: the orchestrator's run, with the journal's run span id, start time and totals.
    let events = journal(dir.path(), "t1");
    let started = events
        .iter()
        .find(|e| e["type"] == "run.started" && e["run_id"] == "t1")
        .unwrap();
    let root = roots[0];
    assert_eq!(root["name"], "invoke_agent secretariat");
    assert_eq!(root["kind"], INTERNAL);
    assert_eq!(
        root["span_id"],
        span_id(started["span_id"].as_str().unwrap())
    );
    assert_eq!(root["start"], nanos(started["ts"].as_str().unwrap()));
    assert_eq!(root["status"]["code"], 1, "OK");
    assert_eq!(root["attributes"]["gen_ai.agent.name"], "secretariat");
    assert_eq!(root["attributes"]["gen_ai.operation.name"], "invoke_agent");
    let root_cost = root["attributes"]["loom.cost_usd"].as_f64().unwrap();
    assert!(root_cost > 0.0);

    // Steps under the root; chat spans (client) under steps, with model, tokens and cost.
    let steps = named(&spans, "step ");
    assert!(steps.len() >= 3, "{names:?}");
    let chats = named(&spans, "chat ");
    assert!(
        chats.len() >= 5,
        "three orchestrator and two sub-agent calls: {names:?}"
    );
    for chat in &chats {
        assert_eq!(chat["kind"], CLIENT);
        let a = &chat["attributes"];
        assert_eq!(a["gen_ai.operation.name"], "chat");
        assert!(a["gen_ai.request.model"].is_string(), "{chat}");
        assert!(a["gen_ai.provider.name"].is_string(), "{chat}");
        assert!(a["gen_ai.usage.input_tokens"].as_i64().unwrap() > 0);
        assert!(a["gen_ai.usage.output_tokens"].as_i64().unwrap() >= 0);
        assert!(a["loom.cost_usd"].as_f64().unwrap() > 0.0);
    }
    let chat_cost: f64 = chats
        .iter()
        .map(|c| c["attributes"]["loom.cost_usd"].as_f64().unwrap())
        .sum();
    assert!(chat_cost <= root_cost + 1e-9, "{chat_cost} > {root_cost}");

    // The sub-agent: its run is a child of the tool call that opened it, with its own steps,
    // model calls and built-in tool call under it.
    let call = named(&spans, "execute_tool comptable");
    assert_eq!(call.len(), 1, "{names:?}");
    assert_eq!(call[0]["attributes"]["gen_ai.tool.name"], "comptable");
    let sub = named(&spans, "invoke_agent comptable");
    assert_eq!(sub.len(), 1, "{names:?}");
    assert_eq!(sub[0]["parent_span_id"], call[0]["span_id"]);
    let builtin = named(&spans, "execute_tool loom.current_datetime");
    assert_eq!(builtin.len(), 1, "{names:?}");
    let mut up = builtin[0]["parent_span_id"].as_str().unwrap();
    let mut chain = vec![];
    while !up.is_empty() {
        let span = spans.iter().find(|s| s["span_id"] == up).unwrap();
        chain.push(span["name"].as_str().unwrap());
        up = span["parent_span_id"].as_str().unwrap();
    }
    assert!(chain.contains(&"invoke_agent comptable"), "{chain:?}");
    assert_eq!(chain.last(), Some(&"invoke_agent secretariat"));

    // The role's model call and the judge.
    let role = named(&spans, "execute_tool rediger");
    assert_eq!(role.len(), 1, "{names:?}");
    assert!(
        spans
            .iter()
            .any(|s| s["parent_span_id"] == role[0]["span_id"] && s["kind"] == CLIENT),
        "the role's model call under its tool call: {names:?}"
    );
    let judges = named(&spans, "judge ");
    assert_eq!(judges.len(), 1, "{names:?}");
    assert_eq!(judges[0]["kind"], CLIENT);

    // Content was exported (capture.exports: content), redacted before it left the process.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(
        all.contains("[REDACTED:email]"),
        "content exported and redacted"
    );
    assert!(
        all.contains("[REDACTED:iban]"),
        "content exported and redacted"
    );
    let raw = receiver.raw();
    for secret in [EMAIL, IBAN, "FR7630006000", "jean.dupont"] {
        assert!(
            !raw.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "{secret} reached the receiver"
        );
    }

    // One INFO line per model call and per tool call, as JSON, without content.
    let stderr = text(&out.stderr);
    let lines: Vec<Value> = stderr
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["target"] == "loom::calls")
        .collect();
    let count = |kind: &str| events.iter().filter(|e| e["type"] == kind).count();
    let models: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "model call")
        .collect();
    let tools: Vec<&Value> = lines
        .iter()
        .filter(|l| l["fields"]["message"] == "tool call")
        .collect();
    assert_eq!(models.len(), count("model.responded"), "{stderr}");
    assert_eq!(tools.len(), count("tool.completed"), "{stderr}");
    assert!(models.iter().all(|l| l["level"] == "INFO"));
    assert!(
        models
            .iter()
            .any(|l| l["fields"]["model_id"] == "FAKE-SECRETARIAT"
                && l["fields"]["input_tokens"].as_u64().unwrap() > 0)
    );
    assert!(tools.iter().any(|l| l["fields"]["tool"] == "comptable"));
    assert!(
        !stderr.contains(EMAIL) && !stderr.contains("FR76"),
        "{stderr}"
    );
}

#[test]
fn without_content_capture_no_message_leaves_the_process() {
    if !python_has(
        "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
        "pip install opentelemetry-proto",
    ) {
        return;
    }
    let dir = project(false);
    let receiver = Receiver::start(dir.path());
    run(dir.path(), &receiver, "t2");
    let spans = receiver.spans(&trace_id("t2"));
    assert!(named(&spans, "chat ").len() >= 5);
    for span in &spans {
        for key in [
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        ] {
            assert!(
                span["attributes"].get(key).is_none(),
                "{key} in {}",
                span["name"]
            );
        }
    }
    let all = serde_json::to_string(&spans).unwrap();
    assert!(!all.contains("REDACTED"), "nothing to redact: no content");
    assert!(!all.contains("Bonjour"), "no message text");
}
