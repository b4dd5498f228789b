//! Helpers of the integration tests: the built binary, run in a clean environment on a
//! temporary data directory, and the Python MCP client.

#![allow(dead_code, unreachable_pub, clippy::unwrap_used, clippy::expect_used)]

use std::{
    io::{BufRead, BufReader, Write},
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
};

use serde_json::Value;

/// The `loom-notes` binary built for these tests.
pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_loom-notes"))
}

/// A command on the binary, in an environment holding only PATH, HOME (the data directory's
/// parent, so that nothing of the real user is read) and `vars`.
pub fn command(home: &Path, vars: &[(&str, &str)]) -> Command {
    let mut command = Command::new(bin());
    command.env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    command.env("HOME", home);
    for (name, value) in vars {
        command.env(name, value);
    }
    command
}

/// What a run printed and how it ended.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    fn of(output: Output) -> Self {
        Self {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The run succeeded; its stdout.
    pub fn ok(self) -> String {
        assert_eq!(self.code, 0, "{self:#?}");
        self.stdout
    }

    /// The run succeeded; its stdout as JSON.
    pub fn json(self) -> Value {
        let stdout = self.ok();
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
    }

    /// The run failed with `code`; its stderr.
    pub fn failed(self, code: i32) -> String {
        assert_eq!(self.code, code, "{self:#?}");
        self.stderr
    }
}

/// A data directory and the runs of `loom-notes --fake --data-dir DIR …` on it.
pub struct Notes {
    pub home: tempfile::TempDir,
    pub vars: Vec<(String, String)>,
}

impl Notes {
    pub fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
            vars: Vec::new(),
        }
    }

    /// With this environment variable set on every run.
    pub fn with(mut self, name: &str, value: &str) -> Self {
        self.vars.push((name.to_owned(), value.to_owned()));
        self
    }

    pub fn data_dir(&self) -> PathBuf {
        self.home.path().join("data")
    }

    fn vars(&self) -> Vec<(&str, &str)> {
        self.vars
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect()
    }

    /// `loom-notes [--fake] --data-dir DIR args…`.
    pub fn command(&self, fake: bool, args: &[&str]) -> Command {
        let mut command = command(self.home.path(), &self.vars());
        if fake {
            command.arg("--fake");
        }
        command.arg("--data-dir").arg(self.data_dir()).args(args);
        command
    }

    /// Runs `loom-notes --fake --data-dir DIR args…`.
    pub fn run(&self, args: &[&str]) -> Run {
        Run::of(self.command(true, args).output().unwrap())
    }

    /// Runs it with `stdin` as input.
    pub fn run_with_stdin(&self, args: &[&str], stdin: &str) -> Run {
        let mut child = self
            .command(true, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        Run::of(child.wait_with_output().unwrap())
    }

    /// Runs without `--fake`.
    pub fn run_real(&self, args: &[&str]) -> Run {
        Run::of(self.command(false, args).output().unwrap())
    }

    /// Adds a text; its doc_id.
    pub fn add(&self, project: &str, title: &str, text: &str) -> String {
        let result = self.run(&["add-text", project, title, text]).json();
        result["doc_id"].as_str().unwrap().to_owned()
    }

    /// How a stdio MCP client starts the server on this data directory.
    pub fn stdio_spec(&self) -> Value {
        let mut env = serde_json::Map::new();
        env.insert("HOME".into(), self.home.path().to_str().unwrap().into());
        for (name, value) in &self.vars {
            env.insert(name.clone(), value.clone().into());
        }
        serde_json::json!({
            "command": bin(),
            "args": ["--fake", "--data-dir", self.data_dir(), "serve"],
            "env": env,
        })
    }

    /// Starts `serve --http 127.0.0.1:0` on this data directory.
    pub fn http_server(&self) -> HttpServer {
        let mut child = self
            .command(true, &["serve", "--http", "127.0.0.1:0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let mut lines = BufReader::new(stderr).lines();
        let url = loop {
            let line = lines
                .next()
                .unwrap_or_else(|| panic!("the server stopped before listening"))
                .unwrap();
            if let Some(url) = line.strip_prefix("loom-notes: MCP over streamable HTTP at ") {
                break url.to_owned();
            }
        };
        // Keep draining stderr so that the server never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        HttpServer { child, url }
    }
}

/// A running `loom-notes serve --http`, stopped when dropped.
pub struct HttpServer {
    child: Child,
    pub url: String,
}

impl HttpServer {
    pub fn spec(&self) -> Value {
        serde_json::json!({"url": self.url})
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a scenario of `tests/mcp_client.py` (the official Python MCP SDK); what it observed.
pub fn mcp_client(scenario: &str, arguments: Value) -> Value {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp_client.py");
    let output = Command::new("python3")
        .arg(script)
        .arg(scenario)
        .arg(arguments.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "scenario {scenario} failed:\n{}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// Whether the official Python MCP SDK is installed (the MCP tests say so and return when not).
pub fn python_mcp() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        eprintln!("skipped: the Python MCP SDK is not installed (pip install mcp)");
    }
    ok
}
