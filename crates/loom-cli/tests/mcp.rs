//! MCP servers and built-in tools through the stock `loom` binary, with servers written with the
//! official Python SDK (`pip install mcp`; `.ci/run` installs it).

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

/// Whether the Python MCP SDK is importable; when it is not, the test is skipped in a quick
/// developer run and fails when services are required (CI).
fn python_mcp() -> bool {
    python_has("mcp.server.mcpserver", "pip install 'mcp>=2,<3'")
}

/// A copy of examples/mcp-notes in a fresh directory.
fn notes_project() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let source = repo().join("examples/mcp-notes");
    for file in ["loom.yaml", "notes_server.py"] {
        fs::copy(source.join(file), dir.path().join(file)).unwrap();
    }
    for sub in ["agents", "prompts"] {
        fs::create_dir_all(dir.path().join(sub)).unwrap();
        for entry in fs::read_dir(source.join(sub)).unwrap() {
            let entry = entry.unwrap();
            fs::copy(entry.path(), dir.path().join(sub).join(entry.file_name())).unwrap();
        }
    }
    dir
}

fn run_in(dir: &Path, args: &[&str]) -> Output {
    Command::new(loom_bin())
        .current_dir(dir)
        .env_remove("LOOM_PROFILE")
        .args(["--config", "loom.yaml"])
        .args(args)
        .output()
        .unwrap()
}

fn rewrite(dir: &Path, file: &str, from: &str, to: &str) {
    let path = dir.join(file);
    let content = fs::read_to_string(&path).unwrap();
    assert!(content.contains(from), "{file} has no {from:?}");
    fs::write(path, content.replace(from, to)).unwrap();
}

#[test]
fn an_mcp_only_agent_runs_on_the_stock_binary() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    let out = run_in(
        dir.path(),
        &[
            "run",
            "suivi",
            "Note pour Martin : relancer le devis D-2026-118 jeudi.",
            "--run-id",
            "n1",
        ],
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "stdout: {stdout}\nstderr: {stderr}");
    assert!(
        stdout.contains("Notes pour Martin :\n- Relancer le devis D-2026-118 jeudi."),
        "{stdout}"
    );
    let events = journal(dir.path(), "n1");
    let called: Vec<(&str, &str)> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| {
            (
                e["payload"]["tool_name"].as_str().unwrap(),
                e["payload"]["tool_kind"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        called,
        [("notes__add_note", "mcp"), ("notes__search_notes", "mcp")]
    );
    // The server wrote its notes where the configuration said (relative to the config file).
    assert!(dir.path().join("data/notes.json").exists());
}

/// A stdio MCP server inherits the env file's variables (as in Loom-IA, where `.env` is loaded
/// into the process environment), the process's own winning: the server's command writes what
/// it sees before it starts.
#[test]
fn a_stdio_server_inherits_the_env_file() {
    if !python_mcp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let config = format!(
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
mcp_servers:
  - name: py
    transport: stdio
    command: sh
    args: ["-c", "printf '%s' \"$FROM_DOTENV\" > seen.txt; exec python3 {server}"]
agents:
  - name: a
    main: {{model: fake-1}}
    tools:
      - mcp: py
"#,
        server = server.display()
    );
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    fs::write(dir.path().join(".env"), "FROM_DOTENV=from the file\n").unwrap();
    for (set, seen) in [
        (None, "from the file"),
        (Some("from the process"), "from the process"),
    ] {
        let mut command = Command::new(loom_bin());
        command
            .current_dir(dir.path())
            .env_remove("LOOM_PROFILE")
            .env_remove("FROM_DOTENV")
            .args(["--config", "loom.yaml", "validate"]);
        if let Some(value) = set {
            command.env("FROM_DOTENV", value);
        }
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert!(
            text(&out.stdout).contains("  · mcp py: 12 tool(s)"),
            "{}",
            text(&out.stdout)
        );
        assert_eq!(
            fs::read_to_string(dir.path().join("seen.txt")).unwrap(),
            seen
        );
    }
}

#[test]
fn validate_connects_and_lists_the_server_tools() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    let out = run_in(dir.path(), &["validate"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("MCP        : notes"), "{stdout}");
    assert!(
        stdout.contains("  · mcp notes, required: 2 tool(s)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "      notes__add_note: side_effects reversible, approval never, idempotent false"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "      notes__search_notes: side_effects none, approval never, idempotent false"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("  · tool current_datetime: side_effects none"),
        "{stdout}"
    );
}

#[test]
fn an_unreachable_server_is_withdrawn_or_fails_the_run_when_required() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    rewrite(
        dir.path(),
        "loom.yaml",
        "args: [notes_server.py]",
        "args: [no_such_server.py]",
    );
    // Required: the run fails at once, with the reason journaled.
    let out = run_in(
        dir.path(),
        &["run", "suivi", "bonjour", "--run-id", "down-1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("(tool.source_unavailable)"),
        "{}",
        text(&out.stderr)
    );
    let events = journal(dir.path(), "down-1");
    let unavailable = events
        .iter()
        .find(|e| e["type"] == "tool.source_unavailable")
        .unwrap();
    assert_eq!(unavailable["payload"]["source"], "notes");
    assert_eq!(unavailable["payload"]["required"], true);
    assert_eq!(events.last().unwrap()["type"], "run.failed");

    // Not required: its tools are withdrawn and the run goes on without them.
    rewrite(
        dir.path(),
        "agents/suivi.yaml",
        "required: true",
        "required: false",
    );
    rewrite(
        dir.path(),
        "loom.yaml",
        "      script:\n",
        "      script:\n        - text: \"Le carnet de notes est indisponible.\"\n          with_text: bonjour\n",
    );
    let out = run_in(
        dir.path(),
        &["run", "suivi", "bonjour", "--run-id", "down-2"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout).trim(),
        "Le carnet de notes est indisponible."
    );
    let events = journal(dir.path(), "down-2");
    let unavailable = events
        .iter()
        .find(|e| e["type"] == "tool.source_unavailable")
        .unwrap();
    assert_eq!(unavailable["payload"]["required"], false);
    assert_eq!(unavailable["status"], "warning");
}

#[test]
fn include_alias_and_overrides_shape_what_the_model_sees() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    rewrite(
        dir.path(),
        "agents/suivi.yaml",
        "  - mcp: notes\n    required: true\n",
        "  - mcp: notes\n    alias: carnet\n    include: [search_notes]\n    tools:\n      search_notes: {timeout: 5, idempotent: true}\n",
    );
    let out = run_in(dir.path(), &["validate"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", text(&out.stderr));
    assert!(stdout.contains("  · mcp carnet: 1 tool(s)"), "{stdout}");
    assert!(stdout.contains("      carnet__search_notes: side_effects none, approval never, idempotent true, timeout 5 s"), "{stdout}");
    assert!(!stdout.contains("add_note"), "{stdout}");
}

#[test]
fn a_large_mcp_result_is_offloaded_with_a_preview() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    rewrite(
        dir.path(),
        "agents/suivi.yaml",
        "  - mcp: notes\n    required: true\n",
        "  - mcp: notes\n    tools:\n      search_notes: {offload_over: 30}\n",
    );
    assert_offloaded(dir.path(), "big-1");
}

/// `offload_over` declared on the server (`mcp_servers[].tools`) applies to every agent that
/// uses the server; so does an output contract there: a result that breaks it becomes an error
/// result the model reads (`guard.checked` failed), and the agent's own contract replaces it.
#[test]
fn server_declarations_of_mcp_tools_are_applied() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    rewrite(
        dir.path(),
        "loom.yaml",
        "    scope: shared\n",
        "    scope: shared\n    tools:\n      search_notes: {offload_over: 30}\n",
    );
    assert_offloaded(dir.path(), "big-2");

    rewrite(
        dir.path(),
        "loom.yaml",
        "      search_notes: {offload_over: 30}\n",
        "      search_notes: {output: {max_chars: 1}}\n",
    );
    let out = run_in(
        dir.path(),
        &["run", "suivi", "Note pour Martin.", "--run-id", "c1"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("was refused by its output contract"),
        "{}",
        text(&out.stdout)
    );
    let checks = |run: &str| -> Vec<(Value, Value)> {
        journal(dir.path(), run)
            .iter()
            .filter(|e| e["type"] == "guard.checked")
            .map(|e| {
                (
                    e["payload"]["target"].clone(),
                    e["payload"]["outcome"].clone(),
                )
            })
            .collect()
    };
    assert_eq!(
        checks("c1"),
        [(json!("tool:notes__search_notes"), json!("failed"))]
    );
    // The agent's own contract on the tool replaces the server's.
    rewrite(
        dir.path(),
        "agents/suivi.yaml",
        "  - mcp: notes\n",
        "  - mcp: notes\n    tools:\n      search_notes: {output: {max_chars: 5000}}\n",
    );
    let out = run_in(
        dir.path(),
        &["run", "suivi", "Note pour Martin.", "--run-id", "c2"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        checks("c2"),
        [(json!("tool:notes__search_notes"), json!("passed"))]
    );
}

/// Runs the notes agent as `run_id` and checks that the search result went to an artifact.
fn assert_offloaded(dir: &Path, run_id: &str) {
    let out = run_in(
        dir,
        &["run", "suivi", "Note pour Martin.", "--run-id", run_id],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir, run_id);
    let stored = events
        .iter()
        .position(|e| e["type"] == "artifact.stored")
        .expect("an artifact.stored event");
    assert_eq!(events[stored]["payload"]["origin"], "offload");
    assert_eq!(
        events[stored]["payload"]["name"],
        "notes__search_notes.json"
    );
    let completed = &events[stored + 1];
    assert_eq!(completed["type"], "tool.completed");
    assert_eq!(completed["facets"]["offloaded"], true);
    let uri = events[stored]["payload"]["uri"].as_str().unwrap();
    assert!(
        uri.starts_with(&format!("artifact://default/{run_id}/")),
        "{uri}"
    );
    // The full result sits beside the journal, content-addressed.
    let file = uri.trim_start_matches("artifact://");
    assert!(dir.join("data/.artifacts").join(file).exists());
}

#[test]
fn built_in_tools_refuse_with_the_rule_that_refused() {
    let dir = tempfile::tempdir().unwrap();
    fs::create_dir_all(dir.path().join("docs")).unwrap();
    fs::write(dir.path().join("docs/devis.txt"), "Devis D-1 : 1 250 € HT").unwrap();
    fs::write(dir.path().join("secret.txt"), "do not read").unwrap();
    fs::write(
        dir.path().join("loom.yaml"),
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls:
            - name: local_files
              arguments: {op: read, folder: docs, path: devis.txt}
            - name: local_files
              arguments: {op: read, folder: docs, path: ../secret.txt}
            - name: fetch_page
              arguments: {url: "http://127.0.0.1:9/"}
            - name: current_datetime
              arguments: {}
        - text: "fini"
storage:
  events: {backend: jsonl, path: data}
agents:
  - name: outils
    main: {model: fake-1}
    tools:
      - tool: loom.local_files
        folders: [{name: docs, path: docs, rights: [read]}]
      - tool: loom.fetch_page
      - tool: loom.current_datetime
"#,
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "outils", "lis", "--run-id", "b1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "b1");
    let results = common::tool_results(&events);
    let by_call = |id: &str| results.iter().find(|r| r.0 == id).unwrap();
    assert!(!by_call("fake_0_0").1);
    assert!(by_call("fake_0_0").2.contains("1 250 € HT"), "{results:?}");
    assert!(by_call("fake_0_1").1);
    assert!(by_call("fake_0_1").2.contains("no-parent"), "{results:?}");
    assert!(by_call("fake_0_2").1);
    assert!(
        by_call("fake_0_2").2.contains("public-address"),
        "{results:?}"
    );
    assert!(!by_call("fake_0_3").1, "{results:?}");
    // Built-in tools are journaled with their kind.
    let kinds: Vec<&str> = events
        .iter()
        .filter(|e| e["type"] == "tool.called")
        .map(|e| e["payload"]["tool_kind"].as_str().unwrap())
        .collect();
    assert!(kinds.iter().all(|k| *k == "builtin"), "{kinds:?}");
}

/// A project whose agent uses the Python test server of `loom-mcp` over stdio.
fn py_server_project(script: &str, overrides: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let config = format!(
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
{script}
mcp_servers:
  - name: py
    transport: stdio
    command: python3
    args: ["{server}"]
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1}}
    tools:
      - mcp: py
{overrides}
"#,
        server = server.display()
    );
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    dir
}

fn completions(events: &[Value]) -> Vec<(String, bool, String)> {
    events
        .iter()
        .filter(|e| e["type"] == "tool.completed")
        .map(|e| {
            let output = &e["payload"]["output"];
            (
                e["payload"]["tool_name"].as_str().unwrap().to_owned(),
                output["is_error"].as_bool().unwrap(),
                output["blocks"][0]["text"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect()
}

#[test]
fn parallel_mcp_calls_return_to_the_model_in_call_order() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__slow
              arguments: {seconds: 0.4}
            - name: py__echo
              arguments: {text: vite}
        - text: "{{ tool_result }}""#;
    let dir = py_server_project(script, "");
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "p1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Journaled as they finished: echo first.
    let done = completions(&journal(dir.path(), "p1"));
    assert_eq!(
        done.iter().map(|d| d.0.as_str()).collect::<Vec<_>>(),
        ["py__echo", "py__slow"]
    );
    // Sent back in call order: the last result the model reads is echo's, the second call.
    assert_eq!(text(&out.stdout).trim(), "vite");
}

#[test]
fn the_server_receives_the_idempotency_key_and_survives_a_crash() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__send_mail
              arguments: {to: martin@example.com}
        - tool_calls:
            - name: py__crash
              arguments: {}
        - tool_calls:
            - name: py__echo
              arguments: {text: "toujours là"}
        - text: "{{ tool_result }}""#;
    let dir = py_server_project(script, "");
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "k1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done = completions(&journal(dir.path(), "k1"));
    let key = Command::new("python3")
        .args([
            "-c",
            "import hashlib; print(hashlib.sha256(b'k1:fake_0_0').hexdigest())",
        ])
        .output()
        .unwrap();
    let key = text(&key.stdout).trim().to_owned();
    assert_eq!(
        done[0],
        (
            "py__send_mail".into(),
            false,
            format!("sent to martin@example.com; key={key}")
        )
    );
    assert_eq!(done[1].0, "py__crash");
    assert!(done[1].1, "a crash mid-call is an error result: {done:?}");
    // The next call reconnects.
    assert_eq!(done[2], ("py__echo".into(), false, "toujours là".into()));
    assert_eq!(text(&out.stdout).trim(), "toujours là");
}

#[test]
fn a_slow_mcp_tool_hits_its_timeout() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__slow
              arguments: {seconds: 30}
        - text: "{{ tool_result }}""#;
    let dir = py_server_project(script, "        tools:\n          slow: {timeout: 0.3}");
    // The answer can only be the timeout's: the tool would have answered after 30 s.
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "t1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "Timed out: no answer in 0.3 s.");
}

#[test]
fn an_mcp_server_over_streamable_http() {
    if !python_mcp() {
        return;
    }
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let mut child = Command::new("python3")
        .args([server.to_str().unwrap(), "--http", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().strip_prefix("PORT ").unwrap().to_owned();
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
        - tool_calls:
            - name: py__add
              arguments: {{a: 40, b: 2}}
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: py
    transport: http
    url: http://127.0.0.1:{port}/mcp
    headers_env: {{X-Loom-Test: LOOM_TEST_MCP_TOKEN}}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1}}
    tools: [{{mcp: py}}]
"#
        ),
    )
    .unwrap();
    let out = Command::new(loom_bin())
        .current_dir(dir.path())
        .env("LOOM_TEST_MCP_TOKEN", "secret-token-value")
        .args(["--config", "loom.yaml", "run", "a", "go", "--run-id", "h1"])
        .output()
        .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("42"), "{}", text(&out.stdout));
    // The header value never reaches the journal.
    let raw = fs::read_to_string(dir.path().join("data/default/h1.jsonl")).unwrap();
    assert!(!raw.contains("secret-token-value"));
    // A header variable that is absent is a configuration error naming the key.
    let missing = Command::new(loom_bin())
        .current_dir(dir.path())
        .env_remove("LOOM_TEST_MCP_TOKEN")
        .args(["--config", "loom.yaml", "validate"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        text(&missing.stderr).contains("mcp_servers[0].headers_env.X-Loom-Test: the environment variable LOOM_TEST_MCP_TOKEN is absent or empty"),
        "{}",
        text(&missing.stderr)
    );
}

#[test]
fn a_breaker_that_opens_is_journaled() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    rewrite(
        dir.path(),
        "loom.yaml",
        "args: [notes_server.py]",
        "args: [no_such_server.py]\n    circuit_breaker: {failures: 1, cooldown: 30}",
    );
    rewrite(
        dir.path(),
        "agents/suivi.yaml",
        "required: true",
        "required: false",
    );
    rewrite(
        dir.path(),
        "loom.yaml",
        "      script:\n",
        "      script:\n        - text: \"indisponible\"\n          with_text: bonjour\n",
    );
    let out = run_in(dir.path(), &["run", "suivi", "bonjour", "--run-id", "c1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "c1");
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let opened = types
        .iter()
        .position(|t| *t == "circuit.opened")
        .expect("circuit.opened");
    assert_eq!(types[opened + 1], "tool.source_unavailable");
    assert_eq!(events[opened]["payload"]["target_kind"], "mcp");
    assert_eq!(events[opened]["payload"]["target"], "mcp:notes");
    assert_eq!(events[opened]["payload"]["failures"], 1);
}

/// An MCP tool's image, sound and embedded PDF are stored as artifacts (`artifact.stored`,
/// origin `tool_output`, before the call's `tool.completed`), journaled as `artifact` blocks by
/// URI (never as bytes), listed in the run's result, and the run reads back the same on resume.
#[test]
fn files_of_an_mcp_result_become_artifacts_listed_in_the_result() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__image
              arguments: {}
            - name: py__sound
              arguments: {}
            - name: py__document
              arguments: {}
        - text: "Reçu : {{ tool_result }}""#;
    let dir = py_server_project(script, "");
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "m1", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let result: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(result["status"], "completed");

    let events = journal(dir.path(), "m1");
    let mut listed = Vec::new();
    for (at, event) in events.iter().enumerate() {
        if event["type"] != "artifact.stored" {
            continue;
        }
        let stored = &event["payload"];
        assert_eq!(stored["origin"], "tool_output", "{stored}");
        let completed = events[at..]
            .iter()
            .find(|e| e["type"] == "tool.completed" && e["payload"]["call_id"] == stored["call_id"])
            .expect("the call's tool.completed follows its artifact.stored");
        let output = &completed["payload"]["output"];
        assert_eq!(
            output["blocks"][0],
            json!({
                "cache_breakpoint": false, "provider_meta": {}, "type": "artifact",
                "uri": stored["uri"], "media_type": stored["media_type"], "size": stored["size"],
                "name": stored["name"],
            })
        );
        assert_eq!(output["artifacts"], json!([stored["uri"]]));
        // The bytes are beside the journal, content-addressed.
        let uri = stored["uri"].as_str().unwrap();
        assert!(uri.starts_with("artifact://default/m1/"), "{uri}");
        let file = dir
            .path()
            .join("data/.artifacts")
            .join(uri.trim_start_matches("artifact://"));
        assert_eq!(
            fs::metadata(&file).unwrap().len(),
            stored["size"].as_u64().unwrap()
        );
        let mut artifact = json!({
            "uri": uri, "origin": "tool_output", "media_type": stored["media_type"],
            "size": stored["size"],
        });
        if !stored["name"].is_null() {
            artifact["name"] = stored["name"].clone();
        }
        listed.push(artifact);
    }
    let mut types: Vec<&str> = listed
        .iter()
        .map(|a| a["media_type"].as_str().unwrap())
        .collect();
    types.sort_unstable();
    assert_eq!(types, ["application/pdf", "audio/wav", "image/png"]);
    let pdf = listed
        .iter()
        .find(|a| a["media_type"] == "application/pdf")
        .unwrap();
    assert_eq!(pdf["name"], "devis-D-1.pdf");
    let journal_text = fs::read_to_string(dir.path().join("data/default/m1.jsonl")).unwrap();
    assert!(!journal_text.contains("inline_data"), "{journal_text}");
    // The result lists them as the journal stored them; the model read the last one by URI.
    assert_eq!(result["artifacts"], json!(listed));
    assert_eq!(
        result["text"],
        format!("Reçu : {}", pdf["uri"].as_str().unwrap())
    );
    // Resumed, the closed run is the same result.
    let again = run_in(dir.path(), &["resume", "m1", "--json"]);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(
        serde_json::from_str::<Value>(&text(&again.stdout)).unwrap(),
        result
    );

    // A crash after the calls started, before their results: resumed, the (read-only) calls
    // run again and their files are stored as the first time.
    let lines: Vec<&str> = journal_text.lines().collect();
    let last_called = lines
        .iter()
        .rposition(|l| l.contains(r#""type":"tool.called""#))
        .unwrap();
    let cut: Vec<String> = lines[..=last_called]
        .iter()
        .map(|line| {
            let mut event: Value = serde_json::from_str(line).unwrap();
            if event["type"] == "run.claimed" {
                // The crashed driver's lease is over.
                event["payload"]["lease_until"] = json!("2000-01-01T00:00:00Z");
            }
            event.to_string()
        })
        .collect();
    fs::write(
        dir.path().join("data/default/m1.jsonl"),
        cut.join("\n") + "\n",
    )
    .unwrap();
    let resumed = run_in(dir.path(), &["resume", "m1", "--json"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let resumed: Value = serde_json::from_str(&text(&resumed.stdout)).unwrap();
    assert_eq!(resumed["status"], "completed");
    let uris = |r: &Value| {
        let mut uris: Vec<String> = r["artifacts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a["uri"].as_str().unwrap().to_owned())
            .collect();
        uris.sort();
        uris
    };
    assert_eq!(uris(&resumed), uris(&result));
    let events = journal(dir.path(), "m1");
    let relaunched = events
        .iter()
        .filter(|e| e["type"] == "tool.called" && e["payload"]["resumed"] == true)
        .count();
    assert_eq!(relaunched, 3);
}

/// A call to an image tool that waited for approval runs once granted: `loom approve --json`
/// gives the completed run with the image listed.
#[test]
fn an_approved_mcp_image_call_completes_with_its_artifact() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__image
              arguments: {}
        - text: "Image : {{ tool_result }}""#;
    let dir = py_server_project(
        script,
        "        tools:\n          image: {approval: always}",
    );
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "m2", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let paused: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(paused["status"], "paused");
    assert_eq!(paused["artifacts"], json!([]));
    let out = run_in(dir.path(), &["approve", "m2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(done["status"], "completed");
    let image = &done["artifacts"][0];
    assert_eq!(
        (&image["origin"], &image["media_type"]),
        (&json!("tool_output"), &json!("image/png"))
    );
    assert_eq!(
        done["text"],
        format!("Image : {}", image["uri"].as_str().unwrap())
    );
}

/// `approval` declared on the server (`mcp_servers[].tools`) is honoured like an agent tool's:
/// the call waits for a human and runs once approved; an agent's own declaration of the tool
/// overrides it.
#[test]
fn an_approval_declared_on_the_server_waits_for_a_human_unless_the_agent_overrides_it() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - tool_calls:
            - name: py__image
              arguments: {}
        - text: "Image : {{ tool_result }}""#;
    let dir = py_server_project(script, "");
    rewrite(
        dir.path(),
        "loom.yaml",
        "storage:\n",
        "    tools:\n      image: {approval: always}\nstorage:\n",
    );
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "s1", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let paused: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(paused["status"], "paused");
    let events = journal(dir.path(), "s1");
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(types.contains(&"approval.requested"), "{types:?}");
    assert!(!types.contains(&"tool.completed"), "{types:?}");
    let opened = events
        .iter()
        .find(|e| e["type"] == "tool.source_opened")
        .unwrap();
    let image = opened["payload"]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "py__image")
        .unwrap();
    assert_eq!(image["approval"], "always");
    let out = run_in(dir.path(), &["approve", "s1", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let done: Value = serde_json::from_str(&text(&out.stdout)).unwrap();
    assert_eq!(done["status"], "completed");

    rewrite(
        dir.path(),
        "loom.yaml",
        "      - mcp: py\n",
        "      - mcp: py\n        tools:\n          image: {approval: never}\n",
    );
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "s2", "--json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let types: Vec<String> = journal(dir.path(), "s2")
        .iter()
        .filter_map(|e| e["type"].as_str().map(str::to_owned))
        .collect();
    assert!(
        !types.iter().any(|t| t == "approval.requested"),
        "{types:?}"
    );
}

/// A stdio server's `env_from` secret, redirected per tenant (`tenants[].secrets`): each tenant's
/// server process starts with that tenant's value (scope `tenant`: one process per tenant), and
/// neither value reaches the journal.
#[test]
fn a_stdio_server_gets_each_tenants_own_secret() {
    if !python_mcp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let config = format!(
        r#"version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params:
      script:
        - tool_calls: [{{name: py__add, arguments: {{a: 40, b: 2}}}}]
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: py
    transport: stdio
    command: sh
    args: ["-c", "printf '%s\n' \"$CRM_KEY\" >> seen.txt; exec python3 {server}"]
    env_from: {{CRM_KEY: CRM_TOKEN}}
    scope: tenant
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1}}
    tools: [{{mcp: py, required: true}}]
tenants:
  - id: martin
    secrets: {{CRM_TOKEN: LOOM_TEST_MARTIN_KEY}}
  - id: dupont
    secrets: {{CRM_TOKEN: {{file: dupont.key}}}}
"#,
        server = server.display()
    );
    fs::write(dir.path().join("loom.yaml"), config).unwrap();
    fs::write(dir.path().join("dupont.key"), "dupont-stdio-key-2\n").unwrap();
    for (tenant, run_id) in [("martin", "m1"), ("dupont", "d1")] {
        let out = Command::new(loom_bin())
            .current_dir(dir.path())
            .env_remove("LOOM_PROFILE")
            .env_remove("CRM_TOKEN")
            .env("LOOM_TEST_MARTIN_KEY", "martin-stdio-key-1")
            .args([
                "--config",
                "loom.yaml",
                "run",
                "a",
                "go",
                "--run-id",
                run_id,
            ])
            .args(["--tenant", tenant])
            .output()
            .unwrap();
        assert!(out.status.success(), "{tenant}: {}", text(&out.stderr));
        assert!(text(&out.stdout).contains("42"), "{}", text(&out.stdout));
    }
    assert_eq!(
        fs::read_to_string(dir.path().join("seen.txt")).unwrap(),
        "martin-stdio-key-1\ndupont-stdio-key-2\n"
    );
    for (tenant, run_id) in [("martin", "m1"), ("dupont", "d1")] {
        let journal =
            fs::read_to_string(dir.path().join(format!("data/{tenant}/{run_id}.jsonl"))).unwrap();
        assert!(!journal.contains("stdio-key"), "{journal}");
    }
}

/// A run of an agent with MCP tools journals what each server offered (`tool.source_opened`),
/// so that `loom replay` re-drives it identically with the server gone: the tools are offered
/// as recorded and answered from the journal.
#[test]
fn an_mcp_agents_run_replays_identical_without_its_server() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    let out = run_in(
        dir.path(),
        &[
            "run",
            "suivi",
            "Note pour Martin : relancer le devis.",
            "--run-id",
            "r1",
        ],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let events = journal(dir.path(), "r1");
    let opened: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "tool.source_opened")
        .collect();
    assert_eq!(opened.len(), 1, "{events:?}");
    let payload = &opened[0]["payload"];
    assert_eq!(payload["source"], "notes");
    let tools: Vec<(&str, &str)> = payload["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap(),
                t["side_effects"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        tools,
        [
            ("notes__add_note", "reversible"),
            ("notes__search_notes", "none")
        ]
    );
    assert_eq!(
        payload["tools"][0]["input_schema"]["properties"]["client"]["type"],
        "string"
    );
    let notes_before = fs::read_to_string(dir.path().join("data/notes.json")).unwrap();

    // The server cannot start any more: the replay must not need it.
    fs::remove_file(dir.path().join("notes_server.py")).unwrap();
    let out = run_in(dir.path(), &["replay", "r1", "--json"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["outcome"], "identical", "{report}");
    assert_eq!(report["misses"], json!([]), "{report}");
    assert_eq!(report["counts"]["tools_served"], 2, "{report}");
    assert_eq!(
        fs::read_to_string(dir.path().join("data/notes.json")).unwrap(),
        notes_before,
        "the replay touched the server's notes"
    );

    // A variant opens the live server: a call of its side-effect tool that the journal did not
    // record is answered by the double, never by the server.
    fs::copy(
        repo().join("examples/mcp-notes/notes_server.py"),
        dir.path().join("notes_server.py"),
    )
    .unwrap();
    rewrite(
        dir.path(),
        "loom.yaml",
        "mcp_servers:",
        "  - id: fake-2\n    sdk: fake\n    model: FAKE\n    params:\n      script:\n        - text: \"Je note.\"\n          tool_calls:\n            - name: notes__add_note\n              arguments: {client: Dupont, text: \"Appeler Dupont.\"}\n        - text: \"{{ tool_result }}\"\n\nmcp_servers:",
    );
    let out = run_in(
        dir.path(),
        &[
            "replay",
            "r1",
            "--mode",
            "variant",
            "--model",
            "main=fake-2",
            "--double",
            "notes__add_note=\"noté (double)\"",
            "--json",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["counts"]["tools_doubled"], 1, "{report}");
    assert_eq!(report["counts"]["tools_refused"], 0, "{report}");
    assert_eq!(report["variant"]["text"], "noté (double)", "{report}");
    assert_eq!(
        fs::read_to_string(dir.path().join("data/notes.json")).unwrap(),
        notes_before,
        "the variant ran the server's add_note"
    );
}

/// An evaluation of an agent with MCP tools asks the server for its tools, runs the read-only
/// one, and answers the one with side effects by the suite's double: the server never writes.
#[test]
fn an_eval_answers_an_mcp_tool_with_side_effects_by_its_double() {
    if !python_mcp() {
        return;
    }
    let dir = notes_project();
    fs::write(
        dir.path().join("suite.yaml"),
        r#"version: 1
name: notes
agent: suivi
doubles:
  notes__add_note: "Note ajoutée (double)."
cases:
  - name: relance
    input: "Note pour Martin : relancer le devis D-2026-118 jeudi."
    expect:
      called:
        - {name: notes__add_note, arguments: {client: Martin}}
        - notes__search_notes
"#,
    )
    .unwrap();
    let out = run_in(dir.path(), &["eval", "suite.yaml", "--json"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    let notes = fs::read_to_string(dir.path().join("data/notes.json")).unwrap_or_default();
    assert!(
        !notes.contains("D-2026-118"),
        "the server's add_note ran during an evaluation: {notes}"
    );

    // Without the double, the call is refused and the case fails; the server still never
    // writes.
    let suite = fs::read_to_string(dir.path().join("suite.yaml")).unwrap();
    fs::write(
        dir.path().join("suite.yaml"),
        suite.replace(
            "doubles:\n  notes__add_note: \"Note ajoutée (double).\"\n",
            "",
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["eval", "suite.yaml"]);
    let stdout = text(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(1),
        "{stdout}\n{}",
        text(&out.stderr)
    );
    assert!(
        stdout.contains("tool notes__add_note has side effects and no double"),
        "{stdout}"
    );
    let notes = fs::read_to_string(dir.path().join("data/notes.json")).unwrap_or_default();
    assert!(!notes.contains("D-2026-118"), "{notes}");
}

/// `idle_timeout` through the binary: `py` (closed after 1 s unused) is left idle while another
/// server answers a slow call, and the next call starts it again; its own slow call, longer
/// than the timeout, is not cut.
#[test]
fn an_idle_mcp_server_is_stopped_and_restarted_at_the_next_call() {
    if !python_mcp() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let starts = dir.path().join("starts");
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
        - tool_calls: [{{name: py__pid, arguments: {{}}}}]
        - tool_calls: [{{name: py__slow, arguments: {{seconds: 2.2}}}}]
        - tool_calls: [{{name: py__pid, arguments: {{}}}}]
        - tool_calls: [{{name: other__slow, arguments: {{seconds: 2.5}}}}]
        - tool_calls: [{{name: py__pid, arguments: {{}}}}]
        - text: done
mcp_servers:
  - name: py
    transport: stdio
    command: python3
    args: ["{server}", "--connections", "{starts}"]
    idle_timeout: 1
  - name: other
    transport: stdio
    command: python3
    args: ["{server}"]
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1}}
    tools: [{{mcp: other}}, {{mcp: py}}]
"#,
            server = server.display(),
            starts = starts.display()
        ),
    )
    .unwrap();
    let out = run_in(dir.path(), &["run", "a", "go", "--run-id", "i1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "done");
    let done = completions(&journal(dir.path(), "i1"));
    let results: Vec<&str> = done.iter().map(|d| d.2.as_str()).collect();
    assert!(done.iter().all(|d| !d.1), "{done:?}");
    assert_eq!(results[1], "slept 2.2");
    assert_eq!(results[3], "slept 2.5");
    // The call in flight for 2.2 s kept the first process; the 2.5 s without calls ended it.
    assert_eq!(results[0], results[2], "{results:?}");
    assert_ne!(results[2], results[4], "{results:?}");
    // One start per connection: the run's two, after any the run's opening began with (closed
    // as idle already when starting the other server took longer than the timeout).
    let started = fs::read_to_string(&starts).unwrap();
    let started: Vec<&str> = started.lines().collect();
    assert!(started.ends_with(&[results[0], results[4]]), "{started:?}");
}

/// `tools/list_changed` through `loom serve`: the first run calls `unlock`, which adds the
/// tool `secret`; the next run is offered it (journaled in its `tool.source_opened`), calls
/// it, has the server withdraw it (`lock`), and its next call to it is an error naming it.
#[test]
fn a_tool_list_change_is_offered_from_the_next_run() {
    if !python_mcp() {
        return;
    }
    let script = r#"        - with_tool: py__secret
          tool_calls: [{name: py__secret, arguments: {}}]
        - with_tool: py__secret
          tool_calls: [{name: py__lock, arguments: {}}]
        - with_tool: py__secret
          tool_calls: [{name: py__secret, arguments: {}}]
        - without_tool: py__secret
          tool_calls: [{name: py__unlock, arguments: {}}]
        - text: "{{ tool_result }}""#;
    let dir = py_server_project(script, "");
    let server = common::server::Server::start(
        &loom_bin(),
        dir.path(),
        &["--config", "loom.yaml", "serve", "--port", "0"],
    );
    let mut texts = Vec::new();
    for session in ["s1", "s2"] {
        let body = json!({"message": "go", "session_id": session}).to_string();
        let (status, body) =
            common::server::request(&server.address, "POST", "/v1/agents/a/runs", &body);
        assert_eq!(status, 201, "{body}");
        let result: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(result["status"], "completed", "{result}");
        texts.push(result["text"].as_str().unwrap().to_owned());
    }
    let (_, log) = server.stop();
    assert_eq!(texts[0], "unlocked");
    assert!(
        texts[1].contains(
            "MCP server 'py' no longer offers the tool 'secret': it changed its tool list after \
             this run opened it"
        ),
        "{}\n{log}",
        texts[1]
    );
    let offered = |session: &str| -> Vec<String> {
        journal(dir.path(), session)
            .iter()
            .filter(|e| e["type"] == "tool.source_opened")
            .flat_map(|e| e["payload"]["tools"].as_array().unwrap().clone())
            .map(|tool| tool["name"].as_str().unwrap().to_owned())
            .collect()
    };
    assert!(!offered("s1").contains(&"py__secret".to_owned()));
    assert!(offered("s2").contains(&"py__secret".to_owned()));
    let done = completions(&journal(dir.path(), "s2"));
    assert_eq!(
        done[0],
        ("py__secret".into(), false, "the secret is 42".into())
    );
    assert_eq!(done[1], ("py__lock".into(), false, "locked".into()));
    assert_eq!(done[2].0, "py__secret");
    assert!(done[2].1, "{done:?}");
}

/// `transport: sse` through the binary, against the Python SDK's own HTTP+SSE server.
#[test]
fn an_mcp_server_over_the_older_http_sse_transport() {
    if !python_mcp() {
        return;
    }
    let server = repo().join("crates/loom-mcp/tests/servers/py_server.py");
    let mut child = Command::new("python3")
        .args([server.to_str().unwrap(), "--sse", "--port", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let port = line.trim().strip_prefix("PORT ").unwrap().to_owned();
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
        - tool_calls:
            - name: legacy__add
              arguments: {{a: 40, b: 2}}
        - text: "{{{{ tool_result }}}}"
mcp_servers:
  - name: legacy
    transport: sse
    url: http://127.0.0.1:{port}/sse
    headers_env: {{X-Loom-Test: LOOM_TEST_MCP_TOKEN}}
storage:
  events: {{backend: jsonl, path: data}}
agents:
  - name: a
    main: {{model: fake-1}}
    tools: [{{mcp: legacy}}]
"#
        ),
    )
    .unwrap();
    let run = |args: &[&str]| {
        Command::new(loom_bin())
            .current_dir(dir.path())
            .env("LOOM_TEST_MCP_TOKEN", "secret-token-value")
            .args(["--config", "loom.yaml"])
            .args(args)
            .output()
            .unwrap()
    };
    let validated = run(&["validate"]);
    let out = run(&["run", "a", "go", "--run-id", "l1"]);
    let _ = child.kill();
    let _ = child.wait();
    assert!(validated.status.success(), "{}", text(&validated.stderr));
    assert!(
        text(&validated.stdout).contains("legacy__add"),
        "{}",
        text(&validated.stdout)
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("42"), "{}", text(&out.stdout));
    let raw = fs::read_to_string(dir.path().join("data/default/l1.jsonl")).unwrap();
    assert!(!raw.contains("secret-token-value"));
}
