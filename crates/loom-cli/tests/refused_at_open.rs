//! "Refused at load" means at load: what the configuration alone decides is refused when it is
//! opened (`Loom::from_config`, every command), and `loom serve` and `loom mcp` resolve every
//! agent against the registered code before they serve, so a server never starts on a
//! configuration a run would refuse.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{
    fs,
    path::Path,
    process::{Command, Output, Stdio},
    time::Duration,
};

use common::loom_bin;
use loom_ia::{Loom, LoomError};

const ROOT: &str = "\
version: 1
models:
  - id: fake-1
    sdk: fake
    model: FAKE
    params: {script: [{text: ok}]}
storage:
  events: {backend: jsonl, path: data}
mcp_servers:
  - {name: notes, transport: stdio, command: notes-mcp-that-is-never-started}
";

const AGENT: &str = "\
name: a
description: An agent.
main:
  model: fake-1
  system: Tu réponds.
";

/// A project whose agent `a` ends with `rest`.
fn project(rest: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("loom.yaml"), ROOT).unwrap();
    fs::create_dir_all(dir.path().join("agents")).unwrap();
    fs::create_dir_all(dir.path().join("docs")).unwrap();
    fs::write(dir.path().join("agents/a.yaml"), format!("{AGENT}{rest}")).unwrap();
    dir
}

/// `loom <args>` in `dir`; a command still running after a minute (a server that started) is
/// killed and fails the test.
fn loom(dir: &Path, args: &[&str]) -> Output {
    let mut child = Command::new(loom_bin())
        .current_dir(dir)
        .args(["--config", "loom.yaml"])
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let exited = loom_testkit::wait::blocking_poll_within(
        format!("loom {args:?} to exit"),
        Duration::from_secs(60),
        || child.try_wait().unwrap(),
    );
    if exited.is_err() {
        child.kill().unwrap();
        let output = child.wait_with_output().unwrap();
        panic!(
            "loom {args:?} is still running (it started):\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    child.wait_with_output().unwrap()
}

fn refused_by(dir: &Path, args: &[&str], line: &str) {
    let out = loom(dir, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "loom {args:?}: {stderr}");
    assert!(
        stderr.lines().any(|l| l == line),
        "loom {args:?} should print\n{line}\nbut printed\n{stderr}"
    );
    assert!(!stderr.contains("Listening on"), "{stderr}");
}

/// The refusals of issue 13 that used to wait for a first run (the fourth, a judge on a role,
/// is implemented since).
const CASES: &[(&str, &str, &str)] = &[
    (
        "a tool contract's on_failure",
        "tools:
  - tool: chercher
    output: {max_chars: 20, on_failure: unverified}
",
        "agents/a.yaml:8:41 tools[0].output.on_failure: tool 'chercher': on_failure 'unverified' \
         is not supported for a tool's output contract in this version (a result that breaks \
         it becomes an error result the model reads); use on_failure: fail",
    ),
    (
        "an MCP tool's contract's on_failure",
        "tools:
  - mcp: notes
    tools:
      find: {output: {max_chars: 10, on_failure: unverified}}
",
        "agents/a.yaml:9:50 tools[0].tools.find.output.on_failure: tool 'notes__find': \
         on_failure 'unverified' is not supported for a tool's output contract in this version \
         (a result that breaks it becomes an error result the model reads); use on_failure: fail",
    ),
    (
        "local_files overwrite rights",
        "tools:
  - tool: loom.local_files
    folders: [{name: docs, path: docs, rights: [read, overwrite]}]
",
        "agents/a.yaml:7:11 tools[0].tool: folder 'docs': the rights overwrite need human \
         approval by default, which this version cannot provide yet; grant read and write only",
    ),
];

#[test]
fn refusals_of_the_configuration_alone_happen_when_it_is_opened() {
    for (case, rest, expected) in CASES {
        let dir = project(rest);
        match Loom::from_config(dir.path().join("loom.yaml")) {
            Err(LoomError::Config(error)) => {
                let shown = error.to_string();
                assert_eq!(shown, *expected, "{case}");
            }
            Err(other) => panic!("{case}: not a configuration error: {other}"),
            Ok(_) => panic!("{case}: the configuration was opened"),
        }
        let line = format!("config error: {expected}");
        refused_by(dir.path(), &["validate"], &line);
        refused_by(dir.path(), &["serve", "--port", "0"], &line);
        refused_by(dir.path(), &["mcp"], &line);
    }
}

/// What depends on code registered after opening (a tool name, a policy) is checked by
/// `loom serve` and `loom mcp` before they serve, not at their first request.
#[test]
fn servers_resolve_every_agent_against_the_registered_code_before_serving() {
    let dir = project("tools:\n  - tool: envoyer_mail\n");
    // Opening is fine: the tool may still be registered in code.
    Loom::from_config(dir.path().join("loom.yaml")).unwrap();
    let line = "config error: agents/a.yaml:7:11 tools[0].tool: unknown tool 'envoyer_mail' \
                (registered tools: none)";
    refused_by(dir.path(), &["serve", "--port", "0"], line);
    refused_by(dir.path(), &["mcp"], line);
    refused_by(dir.path(), &["validate"], line);
}
