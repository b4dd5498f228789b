//! `loom inspect` and `loom report` of a run that does everything a trace shows, through the
//! `equipe` example binary: the orchestrator hands a question to a sub-agent (which calls a
//! tool), has a role draft the answer, and a judge scores the final answer. The JSON trace is
//! the reference's `Trace` (spans nested by the journal's span ids, the sub-run's spans under the
//! tool call that opened it, OpenTelemetry GenAI attributes), snapshotted with its ids and
//! times replaced; the text is the same tree for people.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{collections::HashMap, fs, path::Path, process::Output};

use serde_json::{Value, json};

const QUESTION: &str = "Quel est le solde du compte bancaire 512 ?";

const CONFIG: &str = r#"version: 1
models:
  - id: fake-secretariat
    sdk: fake
    model: FAKE-SECRETARIAT
    pricing: {input: 3.0, output: 15.0}
    params:
      script:
        - text: "Je transmets la question au service comptable."
          tool_calls:
            - name: comptable
              arguments: {message: "Donne le solde du compte 512."}
        - text: "Je fais rédiger la réponse."
          tool_calls:
            - name: rediger
              arguments: {solde: "12 480,50 €"}
        - text: "Bonjour, {{ tool_result }}"
  - id: fake-comptable
    sdk: fake
    model: FAKE-COMPTABLE
    pricing: {input: 1.0, output: 5.0}
    params:
      script:
        - text: "Je lis le grand livre."
          tool_calls:
            - name: solde_compte
              arguments: {compte: "512"}
        - text: "{{ tool_result }}"
  - id: fake-redacteur
    sdk: fake
    model: FAKE-REDACTEUR
    pricing: {input: 1.0, output: 5.0}
    params:
      script:
        - text: "le solde du compte 512 est débiteur de 12 480,50 €."
  - id: fake-juge
    sdk: fake
    model: FAKE-JUGE
    pricing: {input: 1.0, output: 5.0}
    params:
      script:
        - tool_calls:
            - name: verdict
              arguments: {criteria: [{name: poli, score: 0.9, reason: "le client est salué"}]}
storage:
  events:
    backend: jsonl
    path: data
telemetry:
  logging: {level: ERROR}
"#;

const SECRETARIAT: &str = r#"name: secretariat
description: Accueille les demandes et confie la comptabilité au service comptable.
main:
  model: fake-secretariat
  system: Tu es le secrétariat. Tout ce qui touche aux comptes passe par le comptable.
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
      properties: {solde: {type: string}}
      required: [solde]
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
  system: Tu es le comptable. Tout montant vient de tes outils.
max_iterations: 3
tools:
  - tool: solde_compte
"#;

/// A project for the `equipe` binary: the orchestrator, its sub-agent, a role and a judge.
fn project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), CONFIG).unwrap();
    fs::create_dir(dir.path().join("agents")).unwrap();
    fs::write(dir.path().join("agents/secretariat.yaml"), SECRETARIAT).unwrap();
    fs::write(dir.path().join("agents/comptable.yaml"), COMPTABLE).unwrap();
    dir
}

fn equipe(dir: &Path, args: &[&str]) -> Output {
    std::process::Command::new(example_bin("equipe"))
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

/// Runs `args`, which must succeed; its stdout.
fn ok(dir: &Path, args: &[&str]) -> String {
    let out = equipe(dir, args);
    assert!(
        out.status.success(),
        "{args:?}\nstdout: {}\nstderr: {}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// Keys whose values change from one run to the next: instants and measured durations.
const TIMES: &[&str] = &["start_time", "end_time", "time", "expire_at"];
const DURATIONS: &[&str] = &[
    "duration_ms",
    "active_ms",
    "loom.active_ms",
    "loom.latency_ms",
];

/// `trace` with its times, durations and generated ids replaced: each id by `<kind>-<n>` in
/// the order it first appears.
fn stable(trace: &Value, child: &str) -> Value {
    fn walk(value: &mut Value) {
        match value {
            Value::Object(map) => {
                for (key, inner) in map.iter_mut() {
                    if TIMES.contains(&key.as_str()) {
                        *inner = json!("[time]");
                    } else if DURATIONS.contains(&key.as_str()) {
                        *inner = json!("[ms]");
                    } else {
                        walk(inner);
                    }
                }
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let mut trace = trace.clone();
    walk(&mut trace);
    let mut ids: HashMap<String, String> = HashMap::new();
    for span in trace["spans"].as_array().unwrap() {
        let id = span["span_id"].as_str().unwrap().to_owned();
        let name = format!("span-{}", ids.len() + 1);
        ids.entry(id).or_insert(name);
    }
    let mut text = serde_json::to_string_pretty(&trace).unwrap();
    for (id, name) in &ids {
        text = text.replace(id, name);
    }
    serde_json::from_str(&text.replace(child, "child-run")).unwrap()
}

#[test]
fn a_run_with_a_sub_agent_a_role_and_a_judge_is_one_trace() {
    let dir = project();
    let answer = ok(
        dir.path(),
        &["run", "secretariat", QUESTION, "--run-id", "t1"],
    );
    assert_eq!(
        answer.trim(),
        "Bonjour, le solde du compte 512 est débiteur de 12 480,50 €."
    );
    let events = journal(dir.path(), "t1");
    let child = events
        .iter()
        .find(|e| e["type"] == "run.started" && e["run_id"] != "t1")
        .map(|e| e["run_id"].as_str().unwrap().to_owned())
        .unwrap();

    let trace: Value = serde_json::from_str(&ok(dir.path(), &["inspect", "t1", "--json"])).unwrap();
    let spans = trace["spans"].as_array().unwrap();
    let by_id = |id: &Value| spans.iter().find(|s| &s["span_id"] == id);
    let kind_of = |span: &Value| span["kind"].as_str().unwrap().to_owned();
    // Every kind the run went through, each span after its parent.
    let kinds: Vec<String> = spans.iter().map(kind_of).collect();
    for kind in ["run", "step", "chat", "tool", "model", "judge"] {
        assert!(kinds.iter().any(|k| k == kind), "{kind} in {kinds:?}");
    }
    for (index, span) in spans.iter().enumerate() {
        if let Some(parent) = by_id(&span["parent_span_id"]) {
            let at = spans.iter().position(|s| s == parent).unwrap();
            assert!(at < index, "{span}");
        } else {
            assert_eq!(index, 0, "only the run has no parent in its trace: {span}");
        }
    }
    // The sub-run is in the same trace, under the tool call that opened it, and its own tool
    // call under its own step.
    let child_run = spans
        .iter()
        .find(|s| s["kind"] == "run" && s["run_id"] == child.as_str())
        .unwrap();
    let opened_by = by_id(&child_run["parent_span_id"]).unwrap();
    assert_eq!(opened_by["attributes"]["gen_ai.tool.name"], "comptable");
    assert_eq!(opened_by["attributes"]["loom.child_run_id"], child.as_str());
    assert_eq!(trace["trace_id"], "t1");
    let ledger = spans
        .iter()
        .find(|s| s["attributes"]["gen_ai.tool.name"] == "solde_compte")
        .unwrap();
    let step = by_id(&ledger["parent_span_id"]).unwrap();
    assert_eq!(
        (&step["kind"], &step["run_id"]),
        (&json!("step"), &json!(child))
    );
    // The role's model call under the role's call; the judge's under the run, with its verdict.
    let role_model = spans.iter().find(|s| s["kind"] == "model").unwrap();
    let role_call = by_id(&role_model["parent_span_id"]).unwrap();
    assert_eq!(
        (
            &role_call["attributes"]["gen_ai.tool.name"],
            &role_call["attributes"]["loom.tool_kind"]
        ),
        (&json!("rediger"), &json!("role"))
    );
    let judge = spans.iter().find(|s| s["kind"] == "judge").unwrap();
    assert_eq!(judge["parent_span_id"], spans[0]["span_id"]);
    assert_eq!(judge["attributes"]["loom.judge.passed"], true);
    // The spans' tokens add up to the run's (input tokens include the cache's).
    let summed: u64 = spans
        .iter()
        .filter(|s| ["chat", "model", "judge"].contains(&s["kind"].as_str().unwrap()))
        .map(|s| {
            s["attributes"]["gen_ai.usage.input_tokens"]
                .as_u64()
                .unwrap()
        })
        .sum();
    assert_eq!(Some(summed), trace["usage"]["input_tokens"].as_u64());
    insta::assert_json_snapshot!("inspect_json", stable(&trace, &child));

    // The same tree for people, the sub-run nested under the call that opened it.
    let shown = ok(dir.path(), &["inspect", "t1"]).replace(&child, "child-run");
    for line in [
        "  step 2 (tool_batch) — ",
        "    sub-agent comptable — ",
        "      sub-run comptable (child-run) — completed, ",
        "          tool solde_compte — ",
        "    role rediger — ",
        "      model fake-redacteur (FAKE-REDACTEUR) (rediger) — ",
        "  judge output: model fake-juge (FAKE-JUGE) (judge:output) — ",
        "    · verdict output: poli 0.90 — accepted (attempt 1)",
        "  · check judge output: passed",
        "Summary    : 7 model call(s), 3 tool call(s), 1 sub-run(s)",
    ] {
        assert!(shown.contains(line), "{line:?} in\n{shown}");
    }

    // The report of the run: every run of its tree with its own calls, then by role, agent
    // and model; each breakdown adds up to the total.
    let report: Value = serde_json::from_str(&ok(dir.path(), &["report", "t1", "--json"])).unwrap();
    assert_eq!(report["run_id"], "t1");
    assert_eq!(report["total"]["calls"], 7);
    let runs = report["runs"].as_object().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(
        (
            &runs["t1"]["calls"],
            &runs[&child]["calls"],
            &runs[&child]["call_id"]
        ),
        (
            &json!(5),
            &json!(2),
            &opened_by["attributes"]["gen_ai.tool.call.id"]
        )
    );
    assert_eq!(runs["t1"]["with_sub_runs"], report["total"]);
    for breakdown in ["roles", "agents", "models"] {
        let calls: u64 = report[breakdown]
            .as_object()
            .unwrap()
            .values()
            .map(|l| l["calls"].as_u64().unwrap())
            .sum();
        assert_eq!(calls, 7, "{breakdown}");
    }
    assert_eq!(
        report["roles"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["judge:output", "main", "rediger"]
    );
}
