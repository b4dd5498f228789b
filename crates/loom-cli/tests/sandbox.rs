//! The sandbox (`sandbox:`) and skills (`skills:`) of an agent through the stock `loom`
//! binary, with the scripted fake model: a script written, run and read back; a skill loaded
//! and its script run in the sandbox; a skill's script refused without a sandbox; skill
//! folders refused at load with their location. Skipped with a notice when bubblewrap cannot
//! create namespaces here, failed instead under `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path};

use common::{journal, loom, loom_bin, run_in_env, server::Server, text};
use serde_json::Value;

/// A project with one agent `atelier` on a scripted model (`script`, YAML lines at the
/// script's indentation) and the agent's extra keys `agent_extra`.
fn project(script: &str, agent_extra: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        format!(
            r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
{script}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: atelier
    main: {{model: fake-1}}
{agent_extra}
"#
        ),
    )
    .unwrap();
    dir
}

/// The `tool.completed` outputs of a run, sorted by call id.
fn outputs(events: &[Value]) -> Vec<(String, Value)> {
    let mut outputs: Vec<(String, Value)> = events
        .iter()
        .filter(|e| e["type"] == "tool.completed")
        .map(|e| {
            (
                e["payload"]["call_id"].as_str().unwrap().to_owned(),
                e["payload"]["output"].clone(),
            )
        })
        .collect();
    // The calls of one batch complete in any order.
    outputs.sort_by(|a, b| a.0.cmp(&b.0));
    outputs
}

fn skill(dir: &Path, folder: &str, skill_md: &str, files: &[(&str, &str)]) {
    let root = dir.join(folder);
    fs::create_dir_all(&root).unwrap();
    fs::write(root.join("SKILL.md"), skill_md).unwrap();
    for (name, content) in files {
        let path = root.join(name);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, content).unwrap();
    }
}

#[test]
fn an_agent_writes_a_script_runs_it_in_its_sandbox_and_answers() {
    if !loom_testkit::services::namespaces("an_agent_writes_a_script_runs_it") {
        return;
    }
    let dir = project(
        r#"        - tool_calls:
            - name: sandbox__write
              arguments: {path: calc.py, content: "print(sum(i * i for i in range(1, 11)))\n"}
        - tool_calls:
            - name: sandbox__exec
              arguments: {command: "python3 calc.py > result.txt; cat /etc/shadow"}
        - tool_calls:
            - name: sandbox__read
              arguments: {path: ../../../loom.yaml}
            - name: sandbox__read
              arguments: {path: result.txt}
        - text: "Sum of squares: {{ tool_result }}""#,
        "    sandbox: {scope: run, limits: {wall_ms: 20000, output_bytes: 4096}}",
    );
    let out = loom(dir.path(), &["run", "atelier", "compute", "--run-id", "s1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "s1");
    let results = outputs(&events);
    let exec = &results[1].1["data"];
    // The exec is journaled: command, exit code, output sizes and flags, duration.
    assert_eq!(
        exec["command"],
        "python3 calc.py > result.txt; cat /etc/shadow"
    );
    assert_eq!(exec["exit_code"], 1, "{exec}");
    assert!(exec["stderr"].as_str().unwrap().contains("No such file"));
    assert_eq!(exec["stdout_bytes"], 0);
    assert_eq!(exec["stdout_truncated"], false);
    assert!(exec["duration_ms"].is_u64());
    assert_eq!(results[3].1["blocks"][0]["text"], "385\n");
    assert_eq!(results[2].1["is_error"], true);
    assert!(
        results[2].1["blocks"][0]["text"]
            .as_str()
            .unwrap()
            .contains("refused by rule 'sandbox-inside-folder'"),
        "{results:?}"
    );
    // The exec's call is journaled with its kind.
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| e["payload"]["tool_kind"].as_str().unwrap())
        .collect();
    assert!(kinds.iter().all(|k| *k == "builtin"), "{kinds:?}");
    assert!(
        text(&out.stdout).contains("Sum of squares: 385"),
        "{}",
        text(&out.stdout)
    );
    // The working folder is the run's, under the journal's directory.
    let folder = dir.path().join("data/.sandbox/default/run-s1");
    assert_eq!(
        fs::read_to_string(folder.join("result.txt")).unwrap(),
        "385\n"
    );
}

#[test]
fn a_skill_is_loaded_then_its_script_runs_in_the_sandbox() {
    if !loom_testkit::services::namespaces("a_skill_is_loaded_then_its_script_runs") {
        return;
    }
    let dir = project(
        r#"        - tool_calls:
            - name: skills__load
              arguments: {name: invoice-total}
        - tool_calls:
            - name: skills__run
              arguments: {name: invoice-total, script: scripts/total.py, args: ["120.5", "79.5"]}
        - text: "Total: {{ tool_result }}""#,
        "    sandbox: {scope: session}\n    skills: [{path: skills/invoice}]",
    );
    skill(
        dir.path(),
        "skills/invoice",
        "---\nname: invoice-total\ndescription: Adds invoice lines with VAT.\n---\nRun scripts/total.py with the amounts.\n",
        &[(
            "scripts/total.py",
            "import sys\nprint(round(sum(float(a) for a in sys.argv[1:]) * 1.2, 2))\n",
        )],
    );
    let out = loom(dir.path(), &["run", "atelier", "total", "--session", "k1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "k1");
    let results = outputs(&events);
    let loaded = &results[0].1["data"];
    assert_eq!(
        loaded["instructions"],
        "Run scripts/total.py with the amounts.\n"
    );
    assert_eq!(loaded["files"], serde_json::json!(["scripts/total.py"]));
    let ran = &results[1].1["data"];
    assert_eq!(ran["exit_code"], 0, "{ran}");
    assert_eq!(ran["stdout"], "240.0\n");
    let folder = dir.path().join("data/.sandbox/default/session-k1");
    assert!(
        folder
            .join("skills/invoice-total/scripts/total.py")
            .is_file()
    );
    let answer = text(&out.stdout);
    assert!(
        answer.contains("Total: ") && answer.contains("240.0"),
        "{answer}"
    );
}

#[test]
fn a_skills_script_is_refused_without_a_sandbox() {
    let dir = project(
        r#"        - tool_calls:
            - name: skills__run
              arguments: {name: hello, script: scripts/hi.sh}
        - text: "done""#,
        "    skills: [{path: hello}]",
    );
    skill(
        dir.path(),
        "hello",
        "---\nname: hello\ndescription: Says hello.\n---\nRun it.\n",
        &[("scripts/hi.sh", "echo hi > /tmp/pwned\n")],
    );
    let out = loom(dir.path(), &["run", "atelier", "go", "--run-id", "n1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = outputs(&journal(dir.path(), "n1"));
    assert_eq!(results[0].1["is_error"], true);
    let message = results[0].1["blocks"][0]["text"].as_str().unwrap();
    assert!(
        message.contains("refused by rule 'sandbox-required'"),
        "{message}"
    );
}

/// A refused skill setup: its folders, the files written, the message expected.
type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);

#[test]
fn skill_folders_are_refused_at_load_with_their_location() {
    let script = r#"        - text: "never""#;
    let cases: [Case; 5] = [
        ("one", &[], "has no SKILL.md"),
        (
            "one",
            &[("one/SKILL.md", "no front matter\n")],
            "must start with a front matter line",
        ),
        (
            "one",
            &[("one/SKILL.md", "---\nname: one\n---\nbody\n")],
            "bad front matter",
        ),
        (
            "one",
            &[("one/SKILL.md", "---\nname: Bad_Name\ndescription: x\n---\n")],
            "invalid skill name 'Bad_Name'",
        ),
        (
            "one, two",
            &[
                ("one/SKILL.md", "---\nname: same\ndescription: x\n---\n"),
                ("two/SKILL.md", "---\nname: same\ndescription: y\n---\n"),
            ],
            "duplicate skill name 'same'",
        ),
    ];
    for (folders, files, expected) in cases {
        let paths: Vec<String> = folders
            .split(", ")
            .map(|f| format!("{{path: {f}}}"))
            .collect();
        let dir = project(script, &format!("    skills: [{}]", paths.join(", ")));
        for folder in folders.split(", ") {
            fs::create_dir_all(dir.path().join(folder)).unwrap();
        }
        for (name, content) in files {
            fs::write(dir.path().join(name), content).unwrap();
        }
        let out = loom(dir.path(), &["validate"]);
        assert!(!out.status.success(), "{expected}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{expected}: {stderr}");
        // Located: the config file, its line, and the key.
        assert!(stderr.contains("loom.yaml:"), "{stderr}");
        assert!(stderr.contains("agents[0].skills["), "{stderr}");
    }
}

#[test]
fn sandbox_settings_are_checked_at_load() {
    let script = r#"        - text: "never""#;
    for (extra, expected) in [
        (
            "    sandbox: {backend: remote}",
            "backend: remote needs 'url'",
        ),
        (
            "    sandbox: {url: \"http://x\"}",
            "'url' is for backend: remote",
        ),
        (
            "    sandbox: {limits: {wall_ms: 0}}",
            "sandbox.limits.wall_ms",
        ),
        ("    sandbox: {limits: {cpu: 1}}", "unknown"),
    ] {
        let dir = project(script, extra);
        let out = loom(dir.path(), &["validate"]);
        assert!(!out.status.success(), "{extra}");
        let stderr = text(&out.stderr);
        assert!(stderr.contains(expected), "{extra}: {stderr}");
    }
}

#[test]
fn a_remote_sandbox_runs_commands_on_the_runner_with_the_same_refusals() {
    if !loom_testkit::services::namespaces("a_remote_sandbox_runs_commands_on_the_runner") {
        return;
    }
    let runner_dir = tempfile::tempdir().unwrap();
    let runner = Server::start_with(
        &loom_bin(),
        runner_dir.path(),
        &[
            "sandbox",
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--root",
            "folders",
        ],
        &[("LOOM_SANDBOX_TOKEN", "s3cret".into())],
    );
    let dir = project(
        r#"        - tool_calls:
            - name: sandbox__write
              arguments: {path: hello.sh, content: "echo remote $((6 * 7))\n"}
            - name: sandbox__list
              arguments: {path: ../}
        - tool_calls:
            - name: sandbox__exec
              arguments: {command: "sh hello.sh"}
        - text: "{{ tool_result }}""#,
        &format!(
            "    sandbox: {{backend: remote, url: \"http://{}\", token_env: RUNNER_TOKEN}}",
            runner.address
        ),
    );
    let run = |token: &str, id: &str| {
        run_in_env(
            &loom_bin(),
            dir.path(),
            &["run", "atelier", "go", "--run-id", id],
            &[("RUNNER_TOKEN", token)],
        )
    };
    let out = run("s3cret", "r1");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = outputs(&journal(dir.path(), "r1"));
    let by_call = |id: &str| results.iter().find(|r| r.0 == id).unwrap().1.clone();
    assert_eq!(by_call("fake_0_0")["data"]["bytes"], 23, "{results:?}");
    let refused = by_call("fake_0_1")["blocks"][0]["text"].clone();
    assert!(
        refused
            .as_str()
            .unwrap()
            .contains("refused by rule 'sandbox-inside-folder'"),
        "{refused}"
    );
    let exec = &by_call("fake_1_0")["data"];
    assert_eq!(exec["stdout"], "remote 42\n", "{exec}");
    assert_eq!(exec["exit_code"], 0);
    // The folder is on the runner's side.
    let folder = runner_dir.path().join("folders/default/run-r1");
    assert!(folder.join("hello.sh").is_file());
    // A wrong token is refused by the runner, and the model reads why.
    let out = run("wrong", "r2");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let results = outputs(&journal(dir.path(), "r2"));
    let message = results[0].1["blocks"][0]["text"].as_str().unwrap();
    assert!(message.contains("refused the bearer token"), "{message}");
    runner.stop();
}
