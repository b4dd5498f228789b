//! Roles end to end through the `devis` example binary on the fake model, asserting on the
//! journal: a role receives exactly the context it declares (the role models' scripts answer
//! only when their single user message holds it, and lacks what is not declared), `$ref`
//! between results, a terminal role whose answer is the run's, a vision role offered only to a
//! run that carries an image (`loom run --attach`), a role that reads tool results offered only
//! once one exists (in the run, or in the session), `--attach` refusals, and roles refused when
//! the configuration is loaded. Each test works on a copy of examples/devis in its own
//! temporary directory, its `loom.yaml` rewritten with more fake models and its agent given
//! `roles:`.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use serde_json::{Value, json};

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

/// What `prix_ttc` answers for the question.
const PRICE: &str = "1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %)";

/// The first words of the orchestrator's system prompt (examples/devis/prompts/devis.md).
const ORCHESTRATOR_PROMPT: &str = "Tu es l'assistant « devis »";

/// A 1×1 PNG.
const PNG: &[u8] = &[
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52,
    0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x08, 0x06, 0x00, 0x00, 0x00, 0x1f, 0x15, 0xc4,
    0x89, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xf8, 0xcf, 0xc0, 0xf0,
    0x1f, 0x00, 0x05, 0x00, 0x01, 0xff, 0x89, 0x99, 0x3d, 0x1d, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45,
    0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
];

/// A fake model declaration for `models:` (its provider name is its id in capitals).
fn model(id: &str, script: Value, vision: bool) -> String {
    let capabilities = if vision {
        "    capabilities: {vision: true}\n"
    } else {
        ""
    };
    format!(
        "  - id: {id}\n    sdk: fake\n    model: {}\n{capabilities}    params:\n      script: {script}\n",
        id.to_uppercase()
    )
}

/// A copy of examples/devis whose orchestrator `fake-1` follows `orchestrator`, with the other
/// `models` and the agent's `roles` (YAML items under `roles:`).
fn project(
    orchestrator: Value,
    models: &[String],
    roles: &str,
    extra_root: &str,
) -> tempfile::TempDir {
    let dir = copy_example("devis");
    let root = format!(
        "version: 1\nmodels:\n{}{}storage:\n  events:\n    backend: jsonl\n    path: data\n\
         telemetry:\n  logging: {{level: WARN}}\n{extra_root}",
        model("fake-1", orchestrator, false),
        models.concat()
    );
    fs::write(dir.path().join("loom.yaml"), root).unwrap();
    let agent_file = dir.path().join("agents/devis.yaml");
    let agent = fs::read_to_string(&agent_file).unwrap();
    assert!(agent.ends_with("    side_effects: none\n"), "{agent}");
    fs::write(&agent_file, format!("{agent}roles:\n{roles}")).unwrap();
    dir
}

fn devis(dir: &Path, args: &[&str]) -> Output {
    Command::new(devis_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

/// `devis run devis QUESTION --run-id <run_id> <extra>`, which must complete; its stdout.
fn completed_run(dir: &Path, run_id: &str, extra: &[&str]) -> String {
    let out = devis(
        dir,
        &[&["run", "devis", QUESTION, "--run-id", run_id], extra].concat(),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(stderr.contains("Status     : completed"), "{stderr}");
    stdout
}

fn of_type<'a>(events: &'a [Value], kind: &str) -> Vec<&'a Value> {
    events.iter().filter(|e| e["type"] == kind).collect()
}

/// The event of `kind` for the call `call_id`.
fn for_call<'a>(events: &'a [Value], kind: &str, call_id: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["type"] == kind && e["payload"]["call_id"] == call_id)
        .unwrap_or_else(|| panic!("no {kind} for {call_id}"))
}

/// The text of a `tool.completed` event's output.
fn output_text(completed: &Value) -> String {
    completed["payload"]["output"]["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

#[test]
fn a_role_receives_exactly_its_declared_context() {
    let orchestrator = json!([
        {"tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"tool_calls": [
            {"name": "redige", "arguments": {"ton": "cordial"}},
            {"name": "verifie", "arguments": {}},
            {"name": "indiscret", "arguments": {}}
        ]},
        {"text": "Fini."}
    ]);
    // Each role model answers only a message that is exactly what its role declares.
    let redige = json!([{
        "text": "Madame, votre devis s'élève à 1 375 € TTC.",
        "with_text": format!("Demande : {QUESTION}\nMontant : {PRICE}\nTon : cordial"),
        "without_text": ORCHESTRATOR_PROMPT
    }]);
    let verifie = json!([{
        "text": "Montant vérifié.",
        "with_text": format!("<tool_results>\nprix_ttc: {PRICE}\n</tool_results>\n\n<arguments>\n{{}}\n</arguments>"),
        "without_text": "rénovation"
    }]);
    // Declares the user's input, but answers only without it: its call must fail.
    let indiscret = json!([{"text": "Je n'ai rien lu.", "without_text": "rénovation"}]);
    let roles = r#"  - name: redige
    description: Rédige la réponse au client.
    model: fake-redige
    system: Tu rédiges des lettres.
    input_schema:
      type: object
      properties: {ton: {type: string}}
      required: [ton]
    context: [user_input, {tool_results: [prix_ttc]}]
    input_template: "Demande : {{ context.user_input }}\nMontant : {{ context.tool_results.prix_ttc }}\nTon : {{ args.ton }}"
  - name: verifie
    description: Vérifie le montant.
    model: fake-verifie
    context: [{tool_results: [prix_ttc]}]
  - name: indiscret
    description: Lit la demande.
    model: fake-indiscret
    context: [user_input]
"#;
    let dir = project(
        orchestrator,
        &[
            model("fake-redige", redige, false),
            model("fake-verifie", verifie, false),
            model("fake-indiscret", indiscret, false),
        ],
        roles,
        "",
    );
    let stdout = completed_run(dir.path(), "ctx-1", &[]);
    assert_eq!(stdout, "Fini.\n");
    let events = journal(dir.path(), "ctx-1");

    for (call_id, role, answer) in [
        (
            "fake_1_0",
            "redige",
            "Madame, votre devis s'élève à 1 375 € TTC.",
        ),
        ("fake_1_1", "verifie", "Montant vérifié."),
    ] {
        let called = for_call(&events, "tool.called", call_id);
        assert_eq!(called["payload"]["tool_kind"], "role");
        assert_eq!(called["payload"]["tool_name"], role);
        let responded = for_call(&events, "model.responded", call_id);
        assert_eq!(responded["role"], role);
        assert_eq!(responded["payload"]["model"], format!("fake-{role}"));
        assert_eq!(responded["parent_span_id"], called["span_id"]);
        let completed = for_call(&events, "tool.completed", call_id);
        assert_eq!(completed["payload"]["output"]["is_error"], false);
        assert_eq!(output_text(completed), answer);
    }
    // The role that would have read the user's input got it, so its script had no answer.
    assert!(
        of_type(&events, "model.responded")
            .iter()
            .all(|e| e["payload"]["call_id"] != "fake_1_2")
    );
    let refused = for_call(&events, "tool.completed", "fake_1_2");
    assert_eq!(refused["payload"]["output"]["is_error"], true);
    assert_eq!(
        output_text(refused),
        "The role indiscret failed: script of model 'FAKE-INDISCRET' exhausted: reply #1 \
         requested, 0 planned with these tools"
    );
    // Role calls are not orchestrator iterations.
    let done = of_type(&events, "run.completed");
    assert_eq!(done[0]["payload"]["iterations"], 3);
}

/// The role `verifie`, which reads the results of `prix_ttc` (in the run, or with
/// `scope: session` in the whole session), on the fake model `fake-verifie`.
fn verifie(scope: &str) -> (String, String) {
    let role = format!(
        "  - name: verifie\n    description: Vérifie le montant.\n    model: fake-verifie\n    \
         context: [{{tool_results: [prix_ttc]{scope}}}]\n"
    );
    let model = model(
        "fake-verifie",
        json!([{"text": "Montant vérifié.", "with_text": PRICE}]),
        false,
    );
    (role, model)
}

/// The names of the tools called in a run, in order.
fn called(events: &[Value]) -> Vec<&str> {
    of_type(events, "tool.called")
        .iter()
        .map(|e| e["payload"]["tool_name"].as_str().unwrap())
        .collect()
}

#[test]
fn a_role_that_reads_tool_results_is_offered_once_one_exists_in_the_run() {
    // The orchestrator's script keeps each reply only while `verifie` is (or is not) offered:
    // its first two requests must not offer it (no result yet, then only a failed call), the
    // third must.
    let orchestrator = json!([
        {"without_tool": "verifie", "tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": -5, "taux_tva": 10}}]},
        {"without_tool": "verifie", "tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"with_tool": "verifie", "text": "verifie offered before any result"},
        {"with_tool": "verifie", "text": "verifie offered after a failed call"},
        {"with_tool": "verifie", "tool_calls": [{"name": "verifie", "arguments": {}}]},
        {"with_tool": "verifie", "text": "Fini."}
    ]);
    let (role, verifie_model) = verifie("");
    let dir = project(orchestrator, &[verifie_model], &role, "");
    assert_eq!(completed_run(dir.path(), "res-1", &[]), "Fini.\n");
    let events = journal(dir.path(), "res-1");
    assert_eq!(called(&events), ["prix_ttc", "prix_ttc", "verifie"]);
    let failed = for_call(&events, "tool.completed", "fake_0_0");
    assert_eq!(failed["payload"]["output"]["is_error"], true);
    let checked = for_call(&events, "tool.completed", "fake_2_0");
    assert_eq!(output_text(checked), "Montant vérifié.");
}

#[test]
fn a_role_that_reads_session_results_is_offered_at_once_after_an_earlier_run_had_one() {
    // `rappel` reads prix_ttc's results of the whole session, `verifie` those of its run. In
    // the second run of the session, only `rappel` is offered at the first request; in a new
    // session, neither.
    let orchestrator = json!([
        {"without_text": "Rappelle", "tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"without_text": "Rappelle", "text": "Calculé."},
        {"with_text": "Rappelle", "with_tool": "rappel", "without_tool": "verifie", "text": "rappel offert"},
        {"with_text": "Rappelle", "without_tool": "rappel", "text": "rappel absent"}
    ]);
    let (verifie_role, verifie_model) = verifie("");
    let rappel = "  - name: rappel\n    description: Rappelle le montant.\n    model: fake-verifie\n    \
                  context: [{tool_results: [prix_ttc], scope: session}]\n";
    let dir = project(
        orchestrator,
        &[verifie_model],
        &format!("{verifie_role}{rappel}"),
        "",
    );
    let session = ["--session", "chantier"];
    assert_eq!(completed_run(dir.path(), "s-1", &session), "Calculé.\n");
    let out = devis(
        dir.path(),
        &[
            "run",
            "devis",
            "Rappelle le montant.",
            "--run-id",
            "s-2",
            "--session",
            "chantier",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "rappel offert\n");
    let out = devis(
        dir.path(),
        &[
            "run",
            "devis",
            "Rappelle le montant.",
            "--run-id",
            "s-3",
            "--session",
            "autre",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "rappel absent\n");
}

/// The roles of the `$ref` and terminal tests: `lettre` writes from the price it is passed.
fn lettre(terminal: bool) -> String {
    format!(
        r#"  - name: lettre
    description: Rédige la lettre du devis à partir du prix.
    model: fake-lettre
    system: Tu rédiges des lettres.
    input_schema:
      type: object
      properties: {{montant: {{type: string}}}}
      required: [montant]
    input_template: "Lettre pour : {{{{ args.montant }}}}"
    terminal: {terminal}
"#
    )
}

const LETTER: &str = "Madame, votre devis de rénovation s'élève à 1 375 € TTC.";

fn lettre_model() -> String {
    // Answers only when the whole result reached it through the reference.
    model(
        "fake-lettre",
        json!([{"text": LETTER, "with_text": format!("Lettre pour : {PRICE}")}]),
        false,
    )
}

#[test]
fn a_ref_passes_a_whole_earlier_result_to_a_role() {
    let orchestrator = json!([
        {"tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"tool_calls": [{"name": "lettre", "arguments": {"montant": {"$ref": "result:1"}}}]},
        {"text": "Lettre envoyée."}
    ]);
    let dir = project(orchestrator, &[lettre_model()], &lettre(false), "");
    assert_eq!(completed_run(dir.path(), "ref-1", &[]), "Lettre envoyée.\n");
    let events = journal(dir.path(), "ref-1");
    let called = for_call(&events, "tool.called", "fake_1_0");
    assert_eq!(
        called["payload"]["arguments"],
        json!({"montant": {"$ref": "result:1"}}),
        "the journal keeps the model's reference"
    );
    assert_eq!(
        called["payload"]["refs"],
        json!([{"ref": "result:1", "call_id": "fake_0_0", "path": "/montant"}])
    );
    let responded = for_call(&events, "model.responded", "fake_1_0");
    assert_eq!(responded["role"], "lettre");
    assert_eq!(
        output_text(for_call(&events, "tool.completed", "fake_1_0")),
        LETTER
    );
    // The orchestrator was told how to reference results.
    let first = &of_type(&events, "model.responded")[0];
    assert_eq!(first["role"], "main");
}

#[test]
fn a_terminal_role_alone_in_its_turn_answers_for_the_run() {
    let orchestrator = json!([
        {"tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"tool_calls": [{"name": "lettre", "arguments": {"montant": {"$ref": "result:1"}}}]},
        {"text": "never: the terminal role ends the run"}
    ]);
    let dir = project(orchestrator, &[lettre_model()], &lettre(true), "");
    assert_eq!(
        completed_run(dir.path(), "term-1", &[]),
        format!("{LETTER}\n")
    );
    let events = journal(dir.path(), "term-1");
    let completed = for_call(&events, "tool.completed", "fake_1_0");
    let done = of_type(&events, "run.completed");
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["payload"]["output"], Value::Null);
    assert_eq!(done[0]["payload"]["output_event_id"], completed["event_id"]);
    assert_eq!(done[0]["payload"]["iterations"], 2);
    assert_eq!(
        of_type(&events, "model.responded")
            .iter()
            .filter(|e| e["role"] == "main")
            .count(),
        2,
        "no orchestrator call after the terminal role"
    );
    let last: Vec<&str> = events[events.len() - 2..]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(last, ["run.transitioned", "run.completed"]);

    // The facade's result, as --json prints it.
    let stdout = completed_run(dir.path(), "term-2", &["--json"]);
    let result: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(result["text"], LETTER);
    assert_eq!(result["output"]["role"], "assistant");
}

/// A project whose agent has the vision role `decrit`.
fn vision_project(extra_root: &str) -> tempfile::TempDir {
    let orchestrator = json!([
        {"text": "Pas d'image.", "without_tool": "decrit"},
        {"tool_calls": [{"name": "decrit", "arguments": {}}], "with_tool": "decrit"},
        {"text": "Image décrite.", "with_tool": "decrit"}
    ]);
    let eyes = json!([{
        "text": "un point rouge",
        "with_text": "<attachments>\n- photo.png (image/png)\n</attachments>\n\n<arguments>\n{}\n</arguments>"
    }]);
    let roles = r#"  - name: decrit
    description: Décrit l'image jointe.
    model: fake-eyes
    system: Tu décris des images.
    context: [attachments]
"#;
    let dir = project(
        orchestrator,
        &[model("fake-eyes", eyes, true)],
        roles,
        extra_root,
    );
    fs::write(dir.path().join("photo.png"), PNG).unwrap();
    dir
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_vision_role_is_offered_only_when_the_run_carries_an_image() {
    let dir = vision_project("");
    // Without an image, the role is not offered: the orchestrator's script takes its
    // `without_tool` reply.
    assert_eq!(completed_run(dir.path(), "blind-1", &[]), "Pas d'image.\n");
    let events = journal(dir.path(), "blind-1");
    assert!(of_type(&events, "tool.called").is_empty());
    assert!(of_type(&events, "artifact.stored").is_empty());

    assert_eq!(
        completed_run(dir.path(), "eyes-1", &["--attach", "photo.png"]),
        "Image décrite.\n"
    );
    let events = journal(dir.path(), "eyes-1");
    let kinds: Vec<&str> = events[..3]
        .iter()
        .map(|e| e["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["run.started", "artifact.stored", "message.user"]);
    let uri = format!("artifact://default/eyes-1/{}.png", sha256_hex(PNG));
    assert_eq!(
        events[1]["payload"],
        json!({
            "type": "artifact.stored",
            "uri": uri,
            "media_type": "image/png",
            "size": PNG.len(),
            "name": "photo.png",
            "origin": "attachment",
            "call_id": null
        })
    );
    let blocks = &events[2]["payload"]["message"]["blocks"];
    assert_eq!(blocks[0]["text"], QUESTION);
    assert_eq!(blocks[1]["type"], "artifact");
    assert_eq!(blocks[1]["uri"], uri.as_str());
    assert_eq!(
        fs::read(dir.path().join(format!(
            "data/.artifacts/default/eyes-1/{}.png",
            sha256_hex(PNG)
        )))
        .unwrap(),
        PNG
    );
    // The role was offered and called; its message listed the image (its script checks it),
    // and its model, which reads images, was sent the image itself.
    let called = for_call(&events, "tool.called", "fake_0_0");
    assert_eq!(called["payload"]["tool_name"], "decrit");
    let responded = for_call(&events, "model.responded", "fake_0_0");
    assert_eq!(responded["role"], "decrit");
    assert_eq!(
        output_text(for_call(&events, "tool.completed", "fake_0_0")),
        "un point rouge"
    );
    let journal_text = fs::read_to_string(dir.path().join("data/default/eyes-1.jsonl")).unwrap();
    assert!(
        !journal_text.contains("inline_data"),
        "no file bytes in the journal"
    );
}

#[test]
fn a_judge_reads_the_runs_attachments_when_its_context_declares_them() {
    // The vision project, its final answer judged by a judge that declares `attachments`: the
    // judge's model answers only when its message lists the run's images (or says there are
    // none) before the output.
    let verdict = |reason: &str, reads: String| {
        json!({"with_text": reads, "tool_calls": [{"name": "verdict", "arguments": {"criteria": [
            {"name": "fidele", "score": 0.9, "reason": reason}
        ]}}]})
    };
    let criteria = "<criteria>\nfidele: La réponse dit si une image est jointe.\n</criteria>";
    let regard = json!([
        verdict(
            "l'image est décrite",
            format!(
                "{criteria}\n<attachments>\n- photo.png (image/png)\n</attachments>\n\
                 <output>\nImage décrite.\n</output>"
            )
        ),
        verdict(
            "pas d'image à décrire",
            format!(
                "{criteria}\n<attachments>\n(none)\n</attachments>\n<output>\nPas d'image.\n</output>"
            )
        )
    ]);
    let dir = vision_project("");
    let root = fs::read_to_string(dir.path().join("loom.yaml")).unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        root.replacen(
            "models:\n",
            &format!("models:\n{}", model("fake-regard", regard, true)),
            1,
        ),
    )
    .unwrap();
    let agent_file = dir.path().join("agents/devis.yaml");
    let agent = fs::read_to_string(&agent_file).unwrap();
    fs::write(
        &agent_file,
        format!(
            "{agent}judge:\n  model: fake-regard\n  criteria:\n    - {{name: fidele, rule: \
             \"La réponse dit si une image est jointe.\"}}\n  context: [attachments]\n"
        ),
    )
    .unwrap();

    assert_eq!(
        completed_run(dir.path(), "vu-1", &["--attach", "photo.png"]),
        "Image décrite.\n"
    );
    let events = journal(dir.path(), "vu-1");
    let evaluated = &of_type(&events, "judge.evaluated")[0]["payload"];
    assert_eq!(evaluated["passed"], true);
    assert_eq!(evaluated["criteria"][0]["reason"], "l'image est décrite");

    assert_eq!(completed_run(dir.path(), "vu-2", &[]), "Pas d'image.\n");
    let events = journal(dir.path(), "vu-2");
    let evaluated = &of_type(&events, "judge.evaluated")[0]["payload"];
    assert_eq!(evaluated["criteria"][0]["reason"], "pas d'image à décrire");
}

#[test]
fn attach_refusals_name_the_file_and_the_limit_and_write_nothing() {
    let dir = vision_project("execution:\n  attachments: {max_bytes: 50}\n");
    fs::write(dir.path().join("notes.txt"), "bonjour").unwrap();
    fs::write(dir.path().join("blob"), [1u8, 2, 3]).unwrap();
    for (file, message) in [
        (
            "photo.png",
            "error: request refused: attachment 'photo.png' is 70 bytes, more than the limit of \
             50 bytes (execution.attachments.max_bytes)",
        ),
        (
            "notes.txt",
            "error: request refused: attachment 'notes.txt': type text/plain is not accepted \
             (execution.attachments.types: image/jpeg, image/png, image/gif, image/webp)",
        ),
        (
            "blob",
            "error: request refused: attachment 'blob': unsupported type (recognised neither \
             from its content nor from its extension; execution.attachments.types: image/jpeg, \
             image/png, image/gif, image/webp)",
        ),
    ] {
        let out = devis(
            dir.path(),
            &["run", "devis", QUESTION, "--run-id", "r", "--attach", file],
        );
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert_eq!(text(&out.stderr).trim_end(), message);
        assert_eq!(text(&out.stdout), "");
    }
    let out = devis(
        dir.path(),
        &["run", "devis", QUESTION, "--attach", "missing.png"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr)
            .starts_with("error: request refused: attachment 'missing.png' cannot be read: "),
        "{}",
        text(&out.stderr)
    );
    assert!(!dir.path().join("data").exists(), "nothing was written");
}

/// The reference's quote scenario: the orchestrator computes the price with `prix_ttc`, then
/// asks the terminal role `redige_devis` for the quote; the role's judge checks its amount
/// against the computed price.
fn quote_project(redacteur: Value, judge_extra: &str) -> tempfile::TempDir {
    let orchestrator = json!([
        {"tool_calls": [{"name": "prix_ttc", "arguments": {"montant_ht": 1250, "taux_tva": 10}}]},
        {"tool_calls": [{"name": "redige_devis", "arguments": {"client": "Mme Martin"}}]},
        {"text": "Le devis n'a pas pu être rédigé."}
    ]);
    // The judge reads the role's draft: it refuses the invented amount.
    let verificateur = json!([
        {"with_text": "1 500 €", "tool_calls": [{"name": "verdict", "arguments": {"criteria": [
            {"name": "montant_exact", "score": 0.1, "reason": "1 500 € n'est pas le prix calculé"}
        ]}}]},
        {"without_text": "1 500 €", "tool_calls": [{"name": "verdict", "arguments": {"criteria": [
            {"name": "montant_exact", "score": 1.0, "reason": "le prix calculé"}
        ]}}]}
    ]);
    let roles = format!(
        r#"  - name: redige_devis
    description: Rédige le devis pour le client.
    model: fake-redacteur
    system: Tu rédiges des devis.
    input_schema:
      type: object
      properties: {{client: {{type: string}}}}
      required: [client]
    context: [{{tool_results: [prix_ttc]}}]
    input_template: "Client : {{{{ args.client }}}}\nPrix : {{{{ context.tool_results.prix_ttc }}}}"
    terminal: true
    judge:
      model: fake-verificateur
      criteria:
        - {{name: montant_exact, rule: "Le montant du devis est le prix calculé par prix_ttc."}}
      context: [{{tool_results: [prix_ttc]}}]
{judge_extra}"#
    );
    project(
        orchestrator,
        &[
            model("fake-redacteur", redacteur, false),
            model("fake-verificateur", verificateur, false),
        ],
        &roles,
        "",
    )
}

const INVENTED: &str = "Madame Martin, votre devis s'élève à 1 500 € TTC.";
const CORRECTED: &str = "Madame Martin, votre devis s'élève à 1\u{202f}375 € TTC.";

#[test]
fn a_role_judge_makes_the_role_correct_an_invented_amount() {
    // The role's model: an invented amount first, then (asked again with the judge's
    // diagnostic, in its own conversation) the computed one.
    let dir = quote_project(json!([{"text": INVENTED}, {"text": CORRECTED}]), "");
    let stdout = completed_run(dir.path(), "juge-1", &[]);
    assert_eq!(stdout, format!("{CORRECTED}\n"));
    let events = journal(dir.path(), "juge-1");

    // The role's call: its answer, judged at after_tool in the call's span, refused, repaired
    // by the role's model, judged again, then the call's result.
    let called = for_call(&events, "tool.called", "fake_1_0");
    let start = events.iter().position(|e| e == called).unwrap();
    let end = events
        .iter()
        .position(|e| e["type"] == "tool.completed" && e["payload"]["call_id"] == "fake_1_0")
        .unwrap();
    let story: Vec<String> = events[start..=end]
        .iter()
        .map(|e| {
            format!(
                "{} {}",
                e["type"].as_str().unwrap(),
                e["role"].as_str().unwrap_or("-")
            )
        })
        .collect();
    assert_eq!(
        story,
        [
            "tool.called -",
            "model.responded redige_devis",
            "model.responded judge:redige_devis",
            "judge.evaluated -",
            "guard.checked -",
            "policy.decided -",
            "model.responded redige_devis",
            "model.responded judge:redige_devis",
            "judge.evaluated -",
            "guard.checked -",
            "tool.completed -"
        ]
    );
    for event in &events[start + 1..end] {
        assert_eq!(event["payload"]["call_id"], "fake_1_0", "{event}");
    }
    // The judge's model call has its span under the call's; its verdict is in the call's span.
    let judge_calls: Vec<&Value> = of_type(&events, "model.responded")
        .into_iter()
        .filter(|e| e["role"] == "judge:redige_devis")
        .collect();
    assert_eq!(judge_calls[0]["parent_span_id"], called["span_id"]);
    assert_eq!(judge_calls[0]["payload"]["judge"], "redige_devis");
    assert_eq!(judge_calls[0]["payload"]["model"], "fake-verificateur");
    let evaluations = of_type(&events, "judge.evaluated");
    assert_eq!(evaluations[0]["span_id"], called["span_id"]);
    assert_eq!(
        (
            &evaluations[0]["payload"]["target"],
            &evaluations[0]["payload"]["passed"],
            &evaluations[0]["payload"]["attempt"]
        ),
        (&json!("role:redige_devis"), &json!(false), &json!(1))
    );
    assert_eq!(
        (
            &evaluations[1]["payload"]["passed"],
            &evaluations[1]["payload"]["attempt"]
        ),
        (&json!(true), &json!(2))
    );
    let checks: Vec<(&Value, &Value)> = of_type(&events, "guard.checked")
        .iter()
        .map(|e| (&e["payload"]["outcome"], &e["payload"]["resolution"]))
        .collect();
    assert_eq!(
        checks,
        [
            (&json!("failed"), &json!("retry")),
            (&json!("passed"), &Value::Null)
        ]
    );
    let decided = &of_type(&events, "policy.decided")[0]["payload"];
    assert_eq!(
        (
            &decided["policy"],
            &decided["point"],
            &decided["decision"],
            &decided["attempt"]
        ),
        (
            &json!("loom.judge.redige_devis"),
            &json!("after_tool"),
            &json!("retry"),
            &json!(1)
        )
    );
    assert_eq!(
        decided["reason"],
        "The judge redige_devis refuses the output:\n- montant_exact (score 0.10, threshold \
         0.80): 1 500 € n'est pas le prix calculé\nFix the output on these points and give it \
         again in full."
    );
    // The role repaired in its own conversation: the orchestrator got no repair message.
    assert!(
        of_type(&events, "message.user")
            .iter()
            .all(|m| m["payload"]["kind"] != "repair")
    );
    // The corrected draft is the call's result, and the run's answer (a terminal role).
    let completed = &events[end];
    assert_eq!(completed["payload"]["output"]["is_error"], false);
    assert_eq!(output_text(completed), CORRECTED);
    let done = &of_type(&events, "run.completed")[0]["payload"];
    assert_eq!(done["output_event_id"], completed["event_id"]);
    assert_eq!(done["iterations"], 2);
}

#[test]
fn a_role_judge_still_refusing_gives_the_orchestrator_an_error_result() {
    let dir = quote_project(
        json!([{"text": INVENTED}, {"text": "Madame Martin, c'est bien 1 500 € TTC."}]),
        "",
    );
    let stdout = completed_run(dir.path(), "juge-2", &[]);
    assert_eq!(stdout, "Le devis n'a pas pu être rédigé.\n");
    let events = journal(dir.path(), "juge-2");
    let resolutions: Vec<&Value> = of_type(&events, "guard.checked")
        .iter()
        .map(|e| &e["payload"]["resolution"])
        .collect();
    assert_eq!(resolutions, [&json!("retry"), &json!("fail")]);
    let completed = for_call(&events, "tool.completed", "fake_1_0");
    assert_eq!(completed["payload"]["output"]["is_error"], true);
    assert_eq!(
        output_text(completed),
        "The result of redige_devis was refused by its judge redige_devis (a rule of the \
         configuration, not a failure): montant_exact (score 0.10, threshold 0.80): 1 500 € \
         n'est pas le prix calculé"
    );
    // An error result does not end the run: the orchestrator answered.
    assert_eq!(
        of_type(&events, "run.completed")[0]["payload"]["iterations"],
        3
    );

    // `validate` names the role's judge.
    let out = devis(dir.path(), &["validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains(
            "role redige_devis: model fake-redacteur, terminal, context tool_results, judge \
             redige_devis (model fake-verificateur)"
        ),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn roles_refused_at_load_are_located() {
    // A role's judge that reads the run's images needs a model that sees them.
    let blind_judge = r#"  - name: lettre
    description: Rédige la lettre.
    model: fake-lettre
    input_schema:
      type: object
      properties: {montant: {type: string}}
    judge:
      model: fake-juge
      criteria: [{name: poli, rule: La lettre est polie.}]
      context: [attachments]
"#;
    let undeclared = r#"  - name: lettre
    description: Rédige la lettre.
    model: fake-lettre
    input_schema:
      type: object
      properties: {montant: {type: string}}
    input_template: "{{ context.user_input }} : {{ args.montant }}"
"#;
    let orchestrator = json!([{"text": "never"}]);
    for (roles, message) in [
        (
            blind_judge,
            "config error: agents/devis.yaml:21:17 roles[0].judge.context[0]: judge 'lettre' \
             receives attachments, but its model 'fake-juge' cannot see images \
             (capabilities.vision: false)",
        ),
        (
            undeclared,
            "config error: agents/devis.yaml:18:21 roles[0].input_template: input_template uses \
             'context.user_input', but the context of role 'lettre' does not declare 'user_input'",
        ),
    ] {
        let dir = project(
            orchestrator.clone(),
            &[
                model("fake-lettre", json!([{"text": "x"}]), false),
                model("fake-juge", json!([{"text": "x"}]), false),
            ],
            roles,
            "",
        );
        for args in [&["validate"][..], &["run", "devis", QUESTION]] {
            let out = devis(dir.path(), args);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{args:?}: {}",
                text(&out.stderr)
            );
            assert_eq!(text(&out.stderr).trim_end(), message, "{args:?}");
        }
    }
}
