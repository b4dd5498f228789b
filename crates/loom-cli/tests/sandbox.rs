//! The sandbox (`sandbox:`) and skills (`skills:`) of an agent through the stock `loom`
//! binary, with the scripted fake model, each `sandbox__exec` checked to be journaled in
//! `tool.completed` (command, exit code or signal, output sizes and flags, duration):
//!
//! - a script written, run and read back, `..` refused (and a remote runner: the same tools
//!   and refusals, its bearer token checked);
//! - a skill loaded, one of its files read (`skills__read`), its script run in the sandbox; a
//!   skill's script refused without a sandbox; skill folders refused at load with their
//!   location; sandbox settings checked at load;
//! - the attacks of `loom-sandbox/tests/attacks.rs`, through the binary: links planted by
//!   `exec` (to `/etc/passwd`, to `/`, to a host file) refused to `sandbox__read`, `__write`
//!   and `__list` by `sandbox-inside-folder`, the host file untouched; `/proc` showing only the
//!   sandbox's few processes and no host environment; the network cut (a host listener and
//!   PostgreSQL's port refused) unless `network: true`; a fork bomb under `processes` contained,
//!   the run and the host going on; a sleeper stopped by `sandbox-wall-time`, a CPU loop by
//!   `sandbox-cpu-time`, a flood of output cut at `output_bytes` (`sandbox-output-size`), a
//!   memory hog held to `memory_mb`, a file stopped at `file_mb` (`sandbox-file-size`).
//!
//! Skipped with a notice when bubblewrap cannot create namespaces here, failed instead under
//! `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{fs, path::Path};

use common::{journal, loom, loom_bin, run_in_env, server::Server, text};
use serde_json::{Value, json};

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

/// The journaled output of the call `id`.
fn output<'a>(results: &'a [(String, Value)], id: &str) -> &'a Value {
    &results
        .iter()
        .find(|r| r.0 == id)
        .unwrap_or_else(|| panic!("no result for {id}: {results:?}"))
        .1
}

/// The journaled result of the exec `id`, checked to carry its command, its exit code or
/// signal, its output sizes and truncation flags, and its duration.
fn journaled_exec(results: &[(String, Value)], id: &str, command: &str) -> Value {
    let data = output(results, id)["data"].clone();
    assert_eq!(data["command"], command, "{id}: {data}");
    assert!(
        data["exit_code"].is_i64() || data["signal"].is_i64(),
        "{id}: {data}"
    );
    for key in ["stdout_bytes", "stderr_bytes", "duration_ms"] {
        assert!(data[key].is_u64(), "{id}.{key}: {data}");
    }
    for key in ["stdout_truncated", "stderr_truncated"] {
        assert!(data[key].is_boolean(), "{id}.{key}: {data}");
    }
    data
}

/// Asserts that the call `id` was refused by `rule`.
fn refused(results: &[(String, Value)], id: &str, rule: &str) {
    let result = output(results, id);
    assert_eq!(result["is_error"], true, "{id}: {result}");
    let message = result["blocks"][0]["text"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("refused by rule '{rule}'")),
        "{id}: {result}"
    );
}

/// A script: one turn per item of `turns`, each calling its tools (`(name, arguments)`, written
/// as JSON, which YAML reads), then the answer `done`.
fn script(turns: &[Vec<(&str, Value)>]) -> String {
    let mut script = String::new();
    for calls in turns {
        let calls: Vec<Value> = calls
            .iter()
            .map(|(name, arguments)| json!({"name": name, "arguments": arguments}))
            .collect();
        script.push_str(&format!("        - tool_calls: {}\n", Value::Array(calls)));
    }
    script.push_str("        - text: done");
    script
}

/// A `sandbox__exec` call of `command`.
fn exec(command: &str) -> (&'static str, Value) {
    ("sandbox__exec", json!({ "command": command }))
}

/// Runs `atelier` in `dir` as run `id`, checks it finished, and returns its journaled results.
fn run(dir: &Path, id: &str) -> Vec<(String, Value)> {
    let out = loom(dir, &["run", "atelier", "attack", "--run-id", id]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("done"), "{}", text(&out.stdout));
    outputs(&journal(dir, id))
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
    // The exec is journaled: command, exit code, output sizes and flags, duration.
    let exec = journaled_exec(
        &results,
        "fake_1_0",
        "python3 calc.py > result.txt; cat /etc/shadow",
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
fn a_skill_is_loaded_and_read_then_its_script_runs_in_the_sandbox() {
    const SCRIPT: &str = "import sys\nprint(round(sum(float(a) for a in sys.argv[1:]) * 1.2, 2))\n";
    if !loom_testkit::services::namespaces("a_skill_is_loaded_and_read_then_its_script_runs") {
        return;
    }
    let dir = project(
        r#"        - tool_calls:
            - name: skills__load
              arguments: {name: invoice-total}
            - name: skills__read
              arguments: {name: invoice-total, file: scripts/total.py}
            - name: skills__read
              arguments: {name: invoice-total, file: ../../loom.yaml}
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
        &[("scripts/total.py", SCRIPT)],
    );
    let out = loom(dir.path(), &["run", "atelier", "total", "--session", "k1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "k1");
    let results = outputs(&events);
    let loaded = &output(&results, "fake_0_0")["data"];
    assert_eq!(
        loaded["instructions"],
        "Run scripts/total.py with the amounts.\n"
    );
    assert_eq!(loaded["files"], json!(["scripts/total.py"]));
    // A skill's file read through the tool: its text, and only the files the skill lists.
    let read = output(&results, "fake_0_1");
    assert_eq!(read["is_error"], false, "{read}");
    assert_eq!(read["blocks"][0]["text"], SCRIPT, "{read}");
    let outside = output(&results, "fake_0_2");
    assert_eq!(outside["is_error"], true, "{outside}");
    assert!(
        outside["blocks"][0]["text"]
            .as_str()
            .unwrap()
            .contains("has no file '../../loom.yaml'"),
        "{outside}"
    );
    let command = "python3 'skills/invoice-total/scripts/total.py' '120.5' '79.5'";
    let ran = journaled_exec(&results, "fake_1_0", command);
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
    let exec = journaled_exec(&results, "fake_1_0", "sh hello.sh");
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

#[test]
fn links_planted_by_exec_lead_no_tool_out_and_proc_shows_only_the_sandbox() {
    if !loom_testkit::services::namespaces("links_planted_by_exec_lead_no_tool_out") {
        return;
    }
    let host = tempfile::tempdir().unwrap();
    let host_file = host.path().join("host.txt");
    fs::write(&host_file, "host\n").unwrap();
    let plant = format!(
        "ln -s /etc/passwd leak && ln -s ../../../../../../ up && ln -s {} trap && ls",
        host_file.display()
    );
    let proc = "ls /proc | grep -c '^[0-9]'; tr '\\0' ' ' < /proc/1/cmdline; echo";
    let pid = std::process::id();
    let environ = format!("test -e /proc/{pid}/environ && cat /proc/{pid}/environ; true");
    let write = |path: &str| ("sandbox__write", json!({"path": path, "content": "pwned"}));
    let read = |path: &str| ("sandbox__read", json!({ "path": path }));
    let dir = project(
        &script(&[
            vec![exec(&plant)],
            vec![
                read("leak"),
                write("leak"),
                read("up/etc/passwd"),
                ("sandbox__list", json!({"path": "up"})),
                write("trap"),
                ("sandbox__list", json!({})),
            ],
            vec![exec(proc), exec(&environ)],
        ]),
        "    sandbox: {scope: run, limits: {wall_ms: 20000}}",
    );
    let results = run(dir.path(), "l1");
    let planted = journaled_exec(&results, "fake_0_0", &plant);
    assert_eq!(planted["exit_code"], 0, "{planted}");
    assert_eq!(planted["stdout"], "leak\ntrap\nup\n", "{planted}");
    // Read, written or listed host-side, a link out is refused by rule.
    for id in ["fake_1_0", "fake_1_1", "fake_1_2", "fake_1_3", "fake_1_4"] {
        refused(&results, id, "sandbox-inside-folder");
    }
    assert_eq!(fs::read_to_string(&host_file).unwrap(), "host\n");
    assert!(!fs::read_to_string("/etc/passwd").unwrap().contains("pwned"));
    // The listing shows the links as links.
    let entries = output(&results, "fake_1_5")["data"]["entries"].clone();
    let kinds: Vec<(&str, &str)> = entries
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["path"].as_str().unwrap(), e["kind"].as_str().unwrap()))
        .collect();
    assert_eq!(
        kinds,
        [("leak", "link"), ("trap", "link"), ("up", "link")],
        "{entries}"
    );
    // `/proc` is the sandbox's own: a few pids, PID 1 its own init, no host process.
    let seen = journaled_exec(&results, "fake_2_0", proc);
    assert_eq!(seen["exit_code"], 0, "{seen}");
    let stdout = seen["stdout"].as_str().unwrap();
    let lines: Vec<&str> = stdout.lines().collect();
    let pids: u32 = lines[0].trim().parse().unwrap();
    assert!(pids <= 6, "host processes visible: {seen}");
    assert!(
        lines[1].contains("bwrap") || lines[1].contains("sh"),
        "{seen}"
    );
    let environ = journaled_exec(&results, "fake_2_1", &environ);
    assert!(!environ.to_string().contains("CARGO"), "{environ}");
}

#[test]
fn the_network_is_cut_unless_the_agent_allows_it() {
    if !loom_testkit::services::namespaces("the_network_is_cut_unless_the_agent_allows_it") {
        return;
    }
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let connect = |port: u16| {
        format!(
            "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 3); print(\"connected\")'"
        )
    };
    let (probe, postgres) = (connect(port), connect(5432));
    let limits = "limits: {wall_ms: 20000}";
    let cut = project(
        &script(&[vec![exec(&probe), exec(&postgres)]]),
        &format!("    sandbox: {{{limits}}}"),
    );
    let results = run(cut.path(), "n1");
    for (id, command) in [("fake_0_0", &probe), ("fake_0_1", &postgres)] {
        let cut = journaled_exec(&results, id, command);
        assert_ne!(cut["exit_code"], 0, "{cut}");
        assert_eq!(cut["stdout"], "", "{cut}");
        assert!(
            cut["stderr"]
                .as_str()
                .unwrap()
                .contains("ConnectionRefusedError"),
            "{cut}"
        );
    }
    // With `network: true` the same probe reaches the host's listener.
    let allowed = project(
        &script(&[vec![exec(&probe)]]),
        &format!("    sandbox: {{network: true, {limits}}}"),
    );
    let results = run(allowed.path(), "n2");
    let connected = journaled_exec(&results, "fake_0_0", &probe);
    assert_eq!(connected["exit_code"], 0, "{connected}");
    assert_eq!(connected["stdout"], "connected\n", "{connected}");
    drop(listener);
}

#[test]
fn a_fork_bomb_and_a_sleeper_are_bounded_and_the_run_goes_on() {
    if !loom_testkit::services::namespaces("a_fork_bomb_and_a_sleeper_are_bounded") {
        return;
    }
    let bomb = "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived";
    let sleeper = "sleep 30 & sleep 30";
    let dir = project(
        &script(&[
            vec![exec(bomb)],
            vec![exec(sleeper)],
            vec![exec("echo next")],
        ]),
        "    sandbox: {limits: {processes: 16, wall_ms: 5000}}",
    );
    let results = run(dir.path(), "b1");
    // Forks beyond the cap fail ("Cannot fork"); whatever is left dies with the sandbox.
    let bombed = journaled_exec(&results, "fake_0_0", bomb);
    assert!(
        bombed["stderr"].as_str().unwrap().contains("fork")
            || bombed["limit"] == "sandbox-wall-time",
        "{bombed}"
    );
    // A sleeper past `wall_ms` is killed with its process group.
    let slept = journaled_exec(&results, "fake_1_0", sleeper);
    assert_eq!(slept["limit"], "sandbox-wall-time", "{slept}");
    assert_eq!(slept["signal"], 9, "{slept}");
    assert_eq!(slept["exit_code"], Value::Null, "{slept}");
    let note = slept["note"].as_str().unwrap();
    assert!(
        note.contains("stopped by rule 'sandbox-wall-time'"),
        "{note}"
    );
    // The sandbox runs the next command, and the host still forks.
    let next = journaled_exec(&results, "fake_2_0", "echo next");
    assert_eq!(next["exit_code"], 0, "{next}");
    assert_eq!(next["stdout"], "next\n", "{next}");
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn output_cpu_memory_and_file_limits_stop_commands_by_rule() {
    if !loom_testkit::services::namespaces("output_cpu_memory_and_file_limits") {
        return;
    }
    let flood = "yes | head -c 50000000";
    let spin = "while :; do :; done";
    let hog = "python3 -c 'x = bytearray(1024 * 1024 * 1024)'";
    let big = "head -c 3000000 /dev/zero > big";
    // A wall time far above the CPU time: on a loaded machine the loop may get its CPU second
    // slowly, and the CPU limit must still be what stops it.
    let dir = project(
        &script(&[
            vec![exec(flood)],
            vec![exec(spin)],
            vec![exec(hog)],
            vec![exec(big)],
        ]),
        "    sandbox: {limits: {output_bytes: 1000, cpu_ms: 1000, wall_ms: 600000, memory_mb: 256, file_mb: 1}}",
    );
    let results = run(dir.path(), "c1");
    // Output past `output_bytes` is cut, counted, and flagged with its rule.
    let flooded = journaled_exec(&results, "fake_0_0", flood);
    assert_eq!(flooded["exit_code"], 0, "{flooded}");
    assert_eq!(flooded["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(flooded["stdout_bytes"], 50_000_000);
    assert_eq!(flooded["stdout_truncated"], true);
    assert_eq!(flooded["stderr_truncated"], false);
    let note = flooded["note"].as_str().unwrap();
    assert!(
        note.contains("output cut by rule 'sandbox-output-size'"),
        "{note}"
    );
    // A CPU loop is stopped by SIGXCPU.
    let spun = journaled_exec(&results, "fake_1_0", spin);
    assert_eq!(spun["limit"], "sandbox-cpu-time", "{spun}");
    assert_eq!(spun["signal"], 24, "{spun}");
    assert_eq!(spun["exit_code"], Value::Null, "{spun}");
    let note = spun["note"].as_str().unwrap();
    assert!(
        note.contains("stopped by rule 'sandbox-cpu-time'"),
        "{note}"
    );
    // A memory hog gets no more than `memory_mb`.
    let hogged = journaled_exec(&results, "fake_2_0", hog);
    assert_ne!(hogged["exit_code"], 0, "{hogged}");
    assert!(
        hogged["stderr"].as_str().unwrap().contains("MemoryError"),
        "{hogged}"
    );
    // A file past `file_mb` is stopped there.
    let wrote = journaled_exec(&results, "fake_3_0", big);
    assert_eq!(wrote["limit"], "sandbox-file-size", "{wrote}");
    let note = wrote["note"].as_str().unwrap();
    assert!(
        note.contains("stopped by rule 'sandbox-file-size'"),
        "{note}"
    );
    let folder = dir.path().join("data/.sandbox/default/run-c1");
    let size = fs::metadata(folder.join("big")).unwrap().len();
    assert!(size <= 1024 * 1024, "{size}");
}
