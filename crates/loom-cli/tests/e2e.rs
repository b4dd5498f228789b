//! End-to-end tests through the binaries: the stock `loom` and the `devis` example (the CLI
//! embedding a Rust tool). Each test works in its own temporary directory.

// Helpers outside #[test] functions unwrap too: a panic there is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use std::{
    fs,
    path::Path,
    process::{Command, Output},
};

use serde_json::Value;

const QUESTION: &str = "Quel prix TTC pour un devis de 1 250 € HT en rénovation (TVA à 10 %) ?";

fn run_in(bin: &Path, dir: &Path, args: &[&str]) -> Output {
    Command::new(bin)
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn keys(value: &Value) -> Vec<String> {
    value
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn devis_run_answers_from_the_tool_and_journals_the_reference_sequence() {
    let Some(reference) = reference_journal("plain-run.jsonl") else {
        return;
    };
    let dir = devis_project();
    let out = run_in(&devis_bin(), dir.path(), &["run", "devis", QUESTION]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert_eq!(
        stdout.trim(),
        "Pour ce devis de rénovation, le prix est de 1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %)."
    );
    assert!(
        stderr.contains("Status     : completed · iterations: 2 · tokens: "),
        "{stderr}"
    );
    assert!(stderr.contains(" · cost: 0.00"), "{stderr}");
    let run_id = run_id_of(&stderr);

    let ours = journal(dir.path(), &run_id);
    assert_eq!(ours.len(), 17);
    let types = |j: &[Value]| {
        j.iter()
            .map(|e| e["type"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert_eq!(types(&ours), types(&reference));
    for (mine, theirs) in ours.iter().zip(&reference) {
        let what = mine["type"].as_str().unwrap();
        assert_eq!(keys(mine), keys(theirs), "envelope of {what}");
        assert_eq!(
            keys(&mine["payload"]),
            expected_payload_keys(theirs),
            "payload of {what}"
        );
        assert_eq!(
            keys(&mine["facets"]),
            keys(&theirs["facets"]),
            "facets of {what}"
        );
        assert_eq!(mine["schema_version"], 1);
        assert_eq!(mine["run_id"].as_str(), Some(run_id.as_str()));
    }
    let seqs: Vec<u64> = ours.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (1..=17).collect::<Vec<_>>());
    // Ids chosen by Loom are UUIDv7.
    for event in &ours {
        let id = event["event_id"].as_str().unwrap();
        assert_eq!(id.len(), 36);
        assert_eq!(&id[14..15], "7", "{id} is not a UUIDv7");
    }
    assert_eq!(
        ours[9]["payload"]["output"]["blocks"][0]["text"],
        "1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %)"
    );
}

/// Replaces what varies between runs (durations) in rendered output.
fn stable(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let mut line = line.to_owned();
        for unit in [" ms", " s"] {
            while let Some(end) = line
                .find(unit)
                .filter(|&i| i > 0 && line[..i].chars().last().is_some_and(|c| c.is_ascii_digit()))
            {
                let start = line[..end]
                    .rfind(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .map_or(0, |i| i + 1);
                line.replace_range(start..end + unit.len(), "[time]");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[test]
fn inspect_and_report_render_the_run() {
    let dir = devis_project();
    let bin = devis_bin();
    let out = run_in(
        &bin,
        dir.path(),
        &["run", "devis", QUESTION, "--run-id", "devis-1"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    let inspect = run_in(&bin, dir.path(), &["inspect", "devis-1"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    insta::assert_snapshot!("inspect", stable(&text(&inspect.stdout)));

    let full = text(&run_in(&bin, dir.path(), &["inspect", "devis-1", "--full"]).stdout);
    assert!(full.contains("· answers   : Pour ce devis de rénovation, le prix est de 1\u{202f}375 € TTC (1\u{202f}250 € HT + 125 € de TVA à 10 %)."));

    let json: Value =
        serde_json::from_slice(&run_in(&bin, dir.path(), &["inspect", "devis-1", "--json"]).stdout)
            .unwrap();
    assert_eq!(json["run_id"], "devis-1");
    assert_eq!(json["status"], "completed");
    assert_eq!(json["content"], true);
    let spans = json["spans"].as_array().unwrap();
    let kinds: Vec<&str> = spans.iter().map(|s| s["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        ["run", "step", "chat", "step", "tool", "step", "chat"]
    );
    assert_eq!(spans[4]["attributes"]["gen_ai.tool.name"], "prix_ttc");
    assert_eq!(spans[4]["parent_span_id"], spans[3]["span_id"]);
    assert_eq!(spans[2]["attributes"]["loom.model"], "fake-1");

    let report = run_in(&bin, dir.path(), &["report", "devis-1"]);
    assert!(report.status.success());
    insta::assert_snapshot!("report", text(&report.stdout));
    let json: Value =
        serde_json::from_slice(&run_in(&bin, dir.path(), &["report", "devis-1", "--json"]).stdout)
            .unwrap();
    assert_eq!(json["total"]["calls"], 2);
    assert_eq!(json["roles"]["main"]["calls"], 2);
    assert_eq!(json["models"]["fake-1 (FAKE)"]["calls"], 2);

    let missing = run_in(&bin, dir.path(), &["inspect", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(text(&missing.stderr).trim(), "error: run nope not found");
}

#[test]
fn run_json_stream_and_sessions() {
    let dir = devis_project();
    let bin = devis_bin();
    let out = run_in(
        &bin,
        dir.path(),
        &["run", "devis", QUESTION, "--json", "--session", "client-42"],
    );
    assert!(out.status.success());
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["status"], "completed");
    assert_eq!(result["session_id"], "client-42");
    assert_eq!(result["iterations"], 2);
    assert!(result["text"].as_str().unwrap().contains("375 € TTC"));
    assert!(result["usage"]["input_tokens"].as_u64().unwrap() > 0);
    assert!(result.get("error").is_none());

    let streamed = run_in(
        &bin,
        dir.path(),
        &[
            "run",
            "devis",
            "Et pour 2 000 € HT ?",
            "--stream",
            "--session",
            "client-42",
        ],
    );
    assert!(streamed.status.success(), "{}", text(&streamed.stderr));
    let (stdout, stderr) = (text(&streamed.stdout), text(&streamed.stderr));
    assert!(
        stdout.contains("Je calcule le prix TTC avec l'outil prix_ttc."),
        "{stdout}"
    );
    assert!(stdout.contains("375 € TTC"), "{stdout}");
    assert!(
        stderr.contains("· prix_ttc({\"montant_ht\":1250,\"taux_tva\":10})"),
        "{stderr}"
    );
    assert!(stderr.contains("· prix_ttc: done"), "{stderr}");
    assert!(stderr.contains("Session    : client-42"), "{stderr}");
    // Both runs share the session's journal, seq continuing.
    let events = journal(dir.path(), "client-42");
    assert_eq!(events.len(), 34);
    assert_eq!(events[33]["seq"], 34);
    let runs: std::collections::BTreeSet<&str> = events
        .iter()
        .map(|e| e["run_id"].as_str().unwrap())
        .collect();
    assert_eq!(runs.len(), 2);

    // A chosen run id that exists is refused with exit code 2, and nothing is written.
    let first = events[0]["run_id"].as_str().unwrap().to_owned();
    let again = run_in(
        &bin,
        dir.path(),
        &[
            "run",
            "devis",
            "x",
            "--session",
            "client-42",
            "--run-id",
            &first,
        ],
    );
    assert_eq!(again.status.code(), Some(2));
    assert!(text(&again.stderr).contains("already exists in session client-42"));
    assert_eq!(journal(dir.path(), "client-42").len(), 34);
}

fn project(files: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (path, content) in files {
        let path = dir.path().join(path);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
    dir
}

const MODELS: &str = "version: 1\nmodels:\n  - id: fake-1\n    sdk: fake\n    model: FAKE\n";

#[test]
fn broken_configurations_are_refused_with_file_line_and_key() {
    let agent = "name: a\nmain:\n  model: fake-1\n";
    let cases: Vec<(&str, Vec<(&str, String)>)> = vec![
        ("unknown root key", vec![("loom.yaml", format!("{MODELS}colour: blue\n"))]),
        ("unsupported version", vec![("loom.yaml", "version: 2\n".into())]),
        ("duplicate key", vec![("loom.yaml", format!("{MODELS}agents_dir: a\nagents_dir: b\n"))]),
        ("unknown model", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", "name: a\nmain:\n  model: gpt-9\n".into())]),
        ("unknown key in agent", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", format!("{agent}temperature: 0.2\n"))]),
        ("system and system_file", vec![
            ("loom.yaml", MODELS.into()),
            ("agents/a.yaml", "name: a\nmain:\n  model: fake-1\n  system: hi\n  system_file: a.md\n".into()),
            ("prompts/a.md", "hi".into()),
        ]),
        ("missing system_file", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", "name: a\nmain:\n  model: fake-1\n  system_file: nope.md\n".into())]),
        ("unknown prompt variable", vec![
            ("loom.yaml", MODELS.into()),
            ("agents/a.yaml", "name: a\nmain:\n  model: fake-1\n  system_file: a.md\n".into()),
            ("prompts/a.md", "Bonjour.\nClient : {{ client }}\n".into()),
        ]),
        ("jsonl without path", vec![("loom.yaml", format!("{MODELS}storage:\n  events:\n    backend: jsonl\n"))]),
        ("wrong type", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", format!("{agent}max_iterations: ten\n"))]),
        ("unregistered tool", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", format!("{agent}tools:\n  - tool: envoyer_mail\n"))]),
        ("api key variable missing", vec![
            ("loom.yaml", "version: 1\nmodels:\n  - id: claude\n    sdk: anthropic\n    model: claude-sonnet\n    api_key_env: LOOM_TEST_NO_SUCH_KEY\n".into()),
            ("agents/a.yaml", "name: a\nmain:\n  model: claude\n".into()),
        ]),
        ("prompt cache on an openai model", vec![("loom.yaml", "version: 1\nmodels:\n  - id: gpt\n    sdk: openai\n    model: gpt-4o\n    cache: {system: true}\n".into())]),
        ("bad fake script", vec![("loom.yaml", format!("{MODELS}    params:\n      script:\n        - txt: oops\n"))]),
        ("invalid agent name", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", "name: mon agent\nmain:\n  model: fake-1\n".into())]),
        ("duplicate agents", vec![("loom.yaml", MODELS.into()), ("agents/a.yaml", agent.into()), ("agents/b.yaml", agent.into())]),
    ];
    let mut transcript = String::new();
    for (name, files) in &cases {
        let files: Vec<(&str, &str)> = files.iter().map(|(p, c)| (*p, c.as_str())).collect();
        let dir = project(&files);
        let out = run_in(&loom_bin(), dir.path(), &["validate"]);
        assert_eq!(out.status.code(), Some(2), "{name}: {}", text(&out.stderr));
        let stderr = text(&out.stderr);
        assert!(stderr.starts_with("config error: "), "{name}: {stderr}");
        transcript.push_str(&format!("{name}\n  {}", stderr));
    }
    insta::assert_snapshot!("broken_configs", transcript);
}

#[test]
fn validate_prints_what_it_understood() {
    let dir = devis_project();
    let out = run_in(&devis_bin(), dir.path(), &["validate"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    insta::assert_snapshot!("validate", text(&out.stdout));
}

#[test]
fn a_failed_run_exits_1_with_its_error() {
    let dir = project(&[
        (
            "loom.yaml",
            &format!("{MODELS}    params:\n      script:\n        - error: auth\n"),
        ),
        ("agents/a.yaml", "name: a\nmain:\n  model: fake-1\n"),
    ]);
    let out = run_in(&loom_bin(), dir.path(), &["run", "a", "bonjour"]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("Status     : failed"), "{stderr}");
    assert!(
        stderr.contains("Error      : scripted auth error (model.auth)"),
        "{stderr}"
    );
    let unknown = run_in(&loom_bin(), dir.path(), &["run", "zz", "bonjour"]);
    assert_eq!(unknown.status.code(), Some(2));
    assert_eq!(
        text(&unknown.stderr).trim(),
        "error: unknown agent 'zz' (agents: a)"
    );
}

#[test]
fn version_schema_and_profiles() {
    let out = Command::new(loom_bin()).arg("--version").output().unwrap();
    assert_eq!(
        text(&out.stdout).trim(),
        format!("loom {}", env!("CARGO_PKG_VERSION"))
    );
    let schema = Command::new(loom_bin()).arg("schema").output().unwrap();
    let printed: Value = serde_json::from_slice(&schema.stdout).unwrap();
    let committed: Value =
        serde_json::from_str(&fs::read_to_string(repo().join("schema/loom.schema.json")).unwrap())
            .unwrap();
    assert_eq!(printed, committed);
    // --profile wins over LOOM_PROFILE and the file.
    let dir = project(&[(
        "loom.yaml",
        &format!(
            "{MODELS}profile: dev\nprofiles:\n  prod:\n    storage:\n      events:\n        backend: jsonl\n        path: prod-data\n"
        ),
    )]);
    let plain = text(&run_in(&loom_bin(), dir.path(), &["validate"]).stdout);
    assert!(
        plain.contains("Profile    : dev") && plain.contains("Journal    : memory"),
        "{plain}"
    );
    let prod = text(&run_in(&loom_bin(), dir.path(), &["validate", "--profile", "prod"]).stdout);
    assert!(
        prod.contains("Profile    : prod") && prod.contains("prod-data"),
        "{prod}"
    );
    let env = Command::new(loom_bin())
        .current_dir(dir.path())
        .env("LOOM_PROFILE", "prod")
        .args(["validate"])
        .output()
        .unwrap();
    assert!(text(&env.stdout).contains("Profile    : prod"));
}

/// `loom validate` in `dir` with `args` (global flags before or after the subcommand): its
/// exit code, stdout and stderr. `HOOK_SECRET` is never in the test's own environment.
fn validate_with(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String, String) {
    let out = Command::new(loom_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .env_remove("HOOK_SECRET")
        .envs(env.iter().copied())
        .args(args)
        .output()
        .unwrap();
    (out.status.code(), text(&out.stdout), text(&out.stderr))
}

/// The env file: `.env` beside the configuration by default, `env_file:` instead, `--env-file`
/// instead of both, `--no-env-file` for none; a variable already set in the environment wins;
/// its variables are those the configuration names (a trigger's `secret_env`) and
/// `LOOM_PROFILE`; a named file that is missing is refused.
#[test]
fn the_env_file_fills_in_the_environment() {
    let config = format!(
        "{MODELS}agents:\n  - name: a\n    main: {{model: fake-1}}\ntriggers:\n  - name: orders\n    \
         agent: a\n    message: \"{{{{ payload }}}}\"\n    secret_env: HOOK_SECRET\n"
    );
    let dir = project(&[
        ("conf/loom.yaml", &config),
        (
            "conf/.env",
            "# beside the configuration\nexport HOOK_SECRET=s3cret\nLOOM_PROFILE=prod\n",
        ),
        ("other.env", "HOOK_SECRET='from other'\nLOOM_PROFILE=dev\n"),
    ]);
    let path = dir.path();
    // Without an env file, the trigger's secret is missing: refused at load.
    let (code, _, stderr) = validate_with(
        path,
        &["--config", "conf/loom.yaml", "validate", "--no-env-file"],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("triggers[0].secret_env: trigger 'orders': the environment variable HOOK_SECRET is absent or empty"),
        "{stderr}"
    );
    // `.env` beside the configuration (not in the working directory) gives both variables.
    let (code, stdout, stderr) =
        validate_with(path, &["--config", "conf/loom.yaml", "validate"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("Profile    : prod\nEnv        : .env (2 variable(s))\n"),
        "{stdout}"
    );
    // The environment wins over the file.
    let (_, stdout, _) = validate_with(
        path,
        &["validate", "--config", "conf/loom.yaml"],
        &[("LOOM_PROFILE", "dev")],
    );
    assert!(stdout.contains("Profile    : dev\n"), "{stdout}");
    // --env-file replaces it, before or after the subcommand.
    for args in [
        [
            "--env-file",
            "other.env",
            "--config",
            "conf/loom.yaml",
            "validate",
        ],
        [
            "--config",
            "conf/loom.yaml",
            "validate",
            "--env-file",
            "other.env",
        ],
    ] {
        let (code, stdout, stderr) = validate_with(path, &args, &[]);
        assert_eq!(code, Some(0), "{stderr}");
        assert!(
            stdout.contains("Profile    : dev\nEnv        : other.env (2 variable(s))\n"),
            "{stdout}"
        );
    }
    let (code, _, stderr) = validate_with(
        path,
        &[
            "--config",
            "conf/loom.yaml",
            "validate",
            "--env-file",
            "missing.env",
        ],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "config error: missing.env (env file): cannot read env file: not found"
    );
    let (code, _, stderr) = validate_with(
        path,
        &["validate", "--env-file", "other.env", "--no-env-file"],
        &[],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("cannot be used with"), "{stderr}");

    // `env_file:` names another file, relative to the configuration; it must exist.
    fs::write(
        path.join("conf/loom.yaml"),
        format!("env_file: ../other.env\n{config}"),
    )
    .unwrap();
    let (code, stdout, stderr) =
        validate_with(path, &["--config", "conf/loom.yaml", "validate"], &[]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stdout.contains("Profile    : dev\nEnv        : ../other.env (2 variable(s))\n"),
        "{stdout}"
    );
    fs::write(
        path.join("conf/loom.yaml"),
        format!("env_file: gone.env\n{config}"),
    )
    .unwrap();
    let (code, _, stderr) = validate_with(path, &["--config", "conf/loom.yaml", "validate"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "config error: conf/loom.yaml:1:11 env_file: env file gone.env not found"
    );
    // --no-env-file reads none, not even `env_file:`.
    let (code, _, stderr) = validate_with(
        path,
        &["--config", "conf/loom.yaml", "validate", "--no-env-file"],
        &[("HOOK_SECRET", "x")],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // A profile cannot name one: the file is read before the profile is chosen.
    fs::write(
        path.join("conf/loom.yaml"),
        format!("{config}profiles:\n  prod:\n    env_file: prod.env\n"),
    )
    .unwrap();
    let (code, _, stderr) = validate_with(path, &["--config", "conf/loom.yaml", "validate"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("profiles.prod.env_file: 'env_file' cannot be set inside a profile"),
        "{stderr}"
    );
    // A line the file cannot hold is refused with its line.
    fs::write(path.join("conf/loom.yaml"), &config).unwrap();
    fs::write(path.join("conf/.env"), "HOOK_SECRET=x\nnot a pair\n").unwrap();
    let (code, _, stderr) = validate_with(path, &["--config", "conf/loom.yaml", "validate"], &[]);
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim(),
        "config error: .env:2:1 (env file): expected '=' after not, found 'a pair'"
    );
}

/// A chosen run id names one run of its tenant, whatever the session: opening it again in
/// another session (or in the session named after it) is refused, exit code 2, naming the
/// session that holds it, and nothing is written; another tenant may use the id.
#[test]
fn a_run_id_is_unique_in_its_tenant_whatever_the_session() {
    let dir = devis_project();
    let config = dir.path().join("loom.yaml");
    let mut yaml = fs::read_to_string(&config).unwrap();
    yaml.push_str("\ntenants:\n  - id: default\n  - id: acme\n");
    fs::write(&config, yaml).unwrap();
    let bin = devis_bin();
    let first = run_in(
        &bin,
        dir.path(),
        &[
            "run",
            "devis",
            QUESTION,
            "--run-id",
            "rest-1",
            "--session",
            "rest-s",
        ],
    );
    assert!(first.status.success(), "{}", text(&first.stderr));
    for session in [Some("other"), None] {
        let mut args = vec!["run", "devis", "x", "--run-id", "rest-1"];
        args.extend(session.map(|s| ["--session", s]).into_iter().flatten());
        let again = run_in(&bin, dir.path(), &args);
        assert_eq!(again.status.code(), Some(2), "{session:?}");
        assert_eq!(
            text(&again.stderr).trim(),
            "error: request refused: run rest-1 already exists in session rest-s",
            "{session:?}"
        );
        assert_eq!(text(&again.stdout), "");
    }
    assert!(!dir.path().join("data/default/other.jsonl").exists());
    assert!(!dir.path().join("data/default/rest-1.jsonl").exists());
    assert_eq!(journal(dir.path(), "rest-s").len(), 17);
    // Run ids are unique per tenant: another tenant has its own.
    let elsewhere = run_in(
        &bin,
        dir.path(),
        &[
            "run",
            "devis",
            QUESTION,
            "--run-id",
            "rest-1",
            "--session",
            "other",
            "--tenant",
            "acme",
        ],
    );
    assert!(elsewhere.status.success(), "{}", text(&elsewhere.stderr));
    assert!(dir.path().join("data/acme/other.jsonl").exists());
}

/// `report` text with the UTC date of today replaced (the tenant report names its window).
fn dated(text: &str) -> String {
    let today = chrono::Utc::now();
    text.replace(&today.format("%Y-%m-%d").to_string(), "<today>")
        .replace(&today.format("%Y-%m").to_string(), "<month>")
}

#[test]
fn session_and_tenant_reports_render_their_runs() {
    let dir = devis_project();
    let bin = devis_bin();
    for (run_id, session) in [("r1", "s1"), ("r2", "s1"), ("r3", "s2")] {
        let out = run_in(
            &bin,
            dir.path(),
            &[
                "run",
                "devis",
                QUESTION,
                "--run-id",
                run_id,
                "--session",
                session,
            ],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
    }

    let session = run_in(&bin, dir.path(), &["report", "--session", "s1"]);
    assert!(session.status.success(), "{}", text(&session.stderr));
    insta::assert_snapshot!("report_session", text(&session.stdout));
    let json: Value = serde_json::from_slice(
        &run_in(&bin, dir.path(), &["report", "--session", "s1", "--json"]).stdout,
    )
    .unwrap();
    assert_eq!(json["total"]["calls"], 4);
    assert_eq!(json["session_id"], "s1");
    let runs = json["runs"].as_object().unwrap();
    assert_eq!(runs.keys().collect::<Vec<_>>(), ["r1", "r2"]);
    assert_eq!(runs["r2"]["status"], "completed");
    assert_eq!(runs["r2"]["calls"], 2);
    assert_eq!(runs["r2"]["with_sub_runs"]["calls"], 2);

    let tenant = run_in(
        &bin,
        dir.path(),
        &["report", "--tenant", "default", "--period", "day"],
    );
    assert!(tenant.status.success(), "{}", text(&tenant.stderr));
    insta::assert_snapshot!("report_tenant_day", dated(&text(&tenant.stdout)));
    let json: Value = serde_json::from_slice(
        &run_in(&bin, dir.path(), &["report", "--period", "month", "--json"]).stdout,
    )
    .unwrap();
    assert_eq!(json["period"], "month");
    let runs = json["runs"].as_object().unwrap();
    assert_eq!(runs.keys().collect::<Vec<_>>(), ["r1", "r2", "r3"]);
    assert_eq!(runs["r3"]["session_id"], "s2");
    assert_eq!(json["total"]["calls"], 6);

    // A period names a window of the tenant, not of a run or a session.
    let both = run_in(&bin, dir.path(), &["report", "r1", "--period", "day"]);
    assert_eq!(both.status.code(), Some(2));
    let missing = run_in(&bin, dir.path(), &["report", "--session", "nope"]);
    assert_eq!(missing.status.code(), Some(2));
    assert_eq!(
        text(&missing.stderr).trim(),
        "error: session nope not found"
    );
}

#[test]
fn a_judge_on_the_model_it_judges_is_a_warning_and_an_error_in_prod() {
    let dir = devis_project();
    let agent_file = dir.path().join("agents/devis.yaml");
    let agent = fs::read_to_string(&agent_file).unwrap();
    fs::write(
        &agent_file,
        format!(
            "{agent}judge:\n  model: fake-1\n  criteria:\n    - {{name: exact, rule: \"Le montant vient de l'outil.\"}}\n"
        ),
    )
    .unwrap();
    let out = run_in(&devis_bin(), dir.path(), &["validate"]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.starts_with("warning: agents/devis.yaml:"),
        "{stderr}"
    );
    assert!(stderr.contains("judge"), "{stderr}");
    let out = run_in(&devis_bin(), dir.path(), &["--profile", "prod", "validate"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("config error: agents/devis.yaml:"));
}

/// `args` run with a stdout whose reader is already closed (`loom … | head` once `head`
/// exited): every write fails with `BrokenPipe`.
fn run_with_closed_stdout(bin: &Path, dir: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(bin)
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .env_remove("LOOM_LOG")
        .args(["--config", "loom.yaml"])
        .args(args)
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .unwrap()
}

#[test]
fn a_closed_stdout_ends_the_output_quietly_and_keeps_the_exit_code() {
    let dir = devis_project();
    let out = run_with_closed_stdout(
        &devis_bin(),
        dir.path(),
        &["run", "devis", QUESTION, "--json", "--session", "pipe-1"],
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(!stderr.contains("error"), "{stderr}");
    // The run happened, whether or not its output was read.
    let events = journal(dir.path(), "pipe-1");
    assert_eq!(events.last().unwrap()["type"], "run.completed");

    let schema = run_with_closed_stdout(&devis_bin(), dir.path(), &["schema"]);
    assert_eq!(schema.status.code(), Some(0));
    assert!(!text(&schema.stderr).contains("panicked"));

    let failing = project(&[
        (
            "loom.yaml",
            &format!("{MODELS}    params:\n      script:\n        - error: auth\n"),
        ),
        ("agents/a.yaml", "name: a\nmain:\n  model: fake-1\n"),
    ]);
    let failed = run_with_closed_stdout(
        &loom_bin(),
        failing.path(),
        &["run", "a", "bonjour", "--stream"],
    );
    let stderr = text(&failed.stderr);
    assert_eq!(failed.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}
