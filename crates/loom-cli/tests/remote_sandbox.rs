//! The remote sandbox client ([`RemoteSandbox`]) driven through the `loom_core` [`Sandbox`]
//! port, against a real runner (`loom sandbox serve`, started as a subprocess):
//!
//! - a file written, read back and listed, the folder on the runner's side, bytes that are not
//!   UTF-8 unchanged both ways, a write over the file cap refused by `sandbox-size-cap` and one
//!   of the whole cap accepted; commands run with
//!   their outcome fields (exit code, stdout and stderr with their sizes and truncation flags,
//!   signal, limit, duration);
//! - `..` and absolute paths refused to `read`, `write` and `list` by rule
//!   `sandbox-inside-folder`, as structured refusals across the wire;
//! - the limits the client passes: a sleeper killed by `sandbox-wall-time`, a flood of output
//!   cut at `output_bytes` (the `sandbox-output-size` flags);
//! - a wrong bearer token refused as [`SandboxError::Unavailable`] for every operation, nothing
//!   written, and a request without it answered 401 before its body is read; the client's debug
//!   output never shows the token; a runner that is down gives the same kind; a URL that is not http(s) refused at
//!   construction.
//!
//! Skipped with a notice when bubblewrap cannot create namespaces here, failed instead under
//! `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::PathBuf;

use common::{loom_bin, server::Server};
use loom_core::sandbox::{
    EntryKind, ExecOutcome, ExecRequest, Limits, Sandbox, SandboxError, Workspace, rules,
};
use loom_sandbox::{SetupError, remote::RemoteSandbox};

/// The bearer token the runners of these tests expect.
const TOKEN: &str = "s3cret-runner-token";

/// A `loom sandbox serve` process over a fresh root, killed if the test fails.
struct Runner {
    server: Option<Server>,
    root: tempfile::TempDir,
}

impl Runner {
    /// Starts a runner, or `None` (skipped) when bubblewrap cannot create namespaces.
    fn start(test: &str) -> Option<Runner> {
        if !loom_testkit::services::namespaces(test) {
            return None;
        }
        let root = tempfile::tempdir().unwrap();
        let folders = root.path().join("folders");
        let server = Server::start_with(
            &loom_bin(),
            root.path(),
            &[
                "sandbox",
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--root",
                folders.to_str().unwrap(),
            ],
            &[("LOOM_SANDBOX_TOKEN", TOKEN.into())],
        );
        Some(Runner {
            server: Some(server),
            root,
        })
    }

    fn url(&self) -> String {
        format!("http://{}", self.server.as_ref().unwrap().address)
    }

    /// A client of this runner with `token`.
    fn client(&self, token: &str) -> RemoteSandbox {
        RemoteSandbox::new(&self.url(), token.to_owned()).unwrap()
    }

    /// The working folder `acme/<scope>` on the runner's side.
    fn folder(&self, scope: &str) -> PathBuf {
        self.root.path().join("folders/acme").join(scope)
    }

    /// Stops the runner (SIGTERM) and waits for it to exit.
    fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.stop();
        }
    }
}

impl Drop for Runner {
    fn drop(&mut self) {
        if let Some(mut server) = self.server.take() {
            server.kill();
        }
    }
}

fn workspace(scope: &str) -> Workspace {
    Workspace::new("acme", scope).unwrap()
}

/// Runs `command` under `limits` through `client`, without the network.
async fn exec(client: &RemoteSandbox, w: &Workspace, command: &str, limits: Limits) -> ExecOutcome {
    let request = ExecRequest {
        command: command.into(),
        limits,
        network: false,
    };
    client.exec(w, request).await.unwrap()
}

/// Asserts that `outcome` carries the fields a journaled exec has, with their JSON types.
fn journaled_style(outcome: &ExecOutcome, command: &str) {
    assert_eq!(outcome.command, command);
    let json = serde_json::to_value(outcome).unwrap();
    assert!(
        json["exit_code"].is_i64() || json["signal"].is_i64(),
        "{json}"
    );
    for key in ["stdout_bytes", "stderr_bytes", "duration_ms"] {
        assert!(json[key].is_u64(), "{key}: {json}");
    }
    for key in ["stdout_truncated", "stderr_truncated"] {
        assert!(json[key].is_boolean(), "{key}: {json}");
    }
}

#[tokio::test]
async fn the_client_writes_reads_lists_and_runs_commands_on_the_runner() {
    let Some(mut runner) = Runner::start("the_client_writes_reads_lists_and_runs_commands") else {
        return;
    };
    let client = runner.client(TOKEN);
    let w = workspace("run-1");
    let script = "echo remote $((6 * 7))\n";
    let written = client
        .write(&w, "scripts/hello.sh", script.as_bytes().to_vec())
        .await
        .unwrap();
    assert_eq!(written, script.len() as u64);
    let back = client.read(&w, "scripts/hello.sh").await.unwrap();
    assert_eq!(back, script.as_bytes());
    // The folder is on the runner's side.
    let on_runner = std::fs::read_to_string(runner.folder("run-1").join("scripts/hello.sh"));
    assert_eq!(on_runner.unwrap(), script);

    let entries = client.list(&w, "").await.unwrap();
    let seen: Vec<(&str, EntryKind, u64)> = entries
        .iter()
        .map(|e| (e.path.as_str(), e.kind, e.size))
        .collect();
    assert_eq!(
        seen,
        [
            ("scripts", EntryKind::Dir, 0),
            ("scripts/hello.sh", EntryKind::File, script.len() as u64),
        ]
    );
    let missing = client.read(&w, "nope.txt").await.unwrap_err();
    assert!(matches!(missing, SandboxError::NotFound(_)), "{missing:?}");

    let outcome = exec(&client, &w, "sh scripts/hello.sh", Limits::default()).await;
    journaled_style(&outcome, "sh scripts/hello.sh");
    assert_eq!(outcome.exit_code, Some(0));
    assert_eq!(outcome.signal, None);
    assert_eq!(outcome.limit, None);
    assert_eq!(outcome.stdout, "remote 42\n");
    assert_eq!(outcome.stdout_bytes, 10);
    assert!(!outcome.stdout_truncated && !outcome.stderr_truncated);

    let command = "echo out; echo oops >&2; exit 3";
    let outcome = exec(&client, &w, command, Limits::default()).await;
    journaled_style(&outcome, command);
    assert_eq!(outcome.exit_code, Some(3));
    assert_eq!(
        (outcome.stdout.as_str(), outcome.stdout_bytes),
        ("out\n", 4)
    );
    assert_eq!(
        (outcome.stderr.as_str(), outcome.stderr_bytes),
        ("oops\n", 5)
    );
    // What a command writes lands in the same folder the client reads.
    exec(&client, &w, "echo made > made.txt", Limits::default()).await;
    assert_eq!(client.read(&w, "made.txt").await.unwrap(), b"made\n");

    // Bytes that are not UTF-8 cross both ways as they are.
    let binary: Vec<u8> = (0..=255u8).rev().collect();
    client.write(&w, "blob.bin", binary.clone()).await.unwrap();
    assert_eq!(
        std::fs::read(runner.folder("run-1").join("blob.bin")).unwrap(),
        binary
    );
    assert_eq!(client.read(&w, "blob.bin").await.unwrap(), binary);
    // A write over the file cap is refused by rule, as the local backend refuses it.
    let over = loom_sandbox::FILE_CAP_BYTES as usize + 1;
    let error = client
        .write(&w, "big.bin", vec![0; over])
        .await
        .unwrap_err();
    assert_eq!(error.rule(), Some(rules::SIZE_CAP), "{error:?}");
    // A write of the whole cap fits the runner's body limit.
    let cap = loom_sandbox::FILE_CAP_BYTES as usize;
    assert_eq!(
        client.write(&w, "cap.bin", vec![0xff; cap]).await.unwrap(),
        cap as u64
    );
    // The client's debug output never shows its token.
    assert!(!format!("{client:?}").contains(TOKEN));
    runner.stop();
}

#[tokio::test]
async fn paths_out_of_the_folder_are_refused_by_rule_through_the_client() {
    let Some(mut runner) = Runner::start("paths_out_of_the_folder_are_refused_by_rule") else {
        return;
    };
    let client = runner.client(TOKEN);
    let w = workspace("run-1");
    // The neighbour folder exists, so a refusal is not a mere "not found".
    client
        .write(&workspace("run-2"), "secret.txt", b"neighbour".to_vec())
        .await
        .unwrap();
    for path in [
        "../run-2/secret.txt",
        "../../../etc/passwd",
        "/etc/passwd",
        "scripts/../../run-2/secret.txt",
    ] {
        let read = client.read(&w, path).await.unwrap_err();
        let write = client.write(&w, path, b"x".to_vec()).await.unwrap_err();
        let list = client.list(&w, path).await.unwrap_err();
        for error in [read, write, list] {
            assert_eq!(
                error.rule(),
                Some(rules::INSIDE_FOLDER),
                "{path}: {error:?}"
            );
            assert!(matches!(error, SandboxError::Refused { .. }), "{error:?}");
        }
    }
    let neighbour = std::fs::read_to_string(runner.folder("run-2").join("secret.txt"));
    assert_eq!(neighbour.unwrap(), "neighbour");
    runner.stop();
}

#[tokio::test]
async fn limits_passed_by_the_client_stop_or_cut_commands() {
    let Some(mut runner) = Runner::start("limits_passed_by_the_client_stop_or_cut") else {
        return;
    };
    let client = runner.client(TOKEN);
    let w = workspace("run-1");

    let sleeper = Limits {
        wall_ms: 300,
        ..Limits::default()
    };
    let outcome = exec(&client, &w, "echo started; sleep 30", sleeper).await;
    journaled_style(&outcome, "echo started; sleep 30");
    assert_eq!(outcome.limit.as_deref(), Some(rules::WALL_TIME));
    assert_eq!(outcome.exit_code, None);
    assert_eq!(outcome.signal, Some(9));

    let small = Limits {
        output_bytes: 1_000,
        ..Limits::default()
    };
    let command = "head -c 100000 /dev/zero | tr '\\0' a";
    let outcome = exec(&client, &w, command, small).await;
    journaled_style(&outcome, command);
    assert_eq!(outcome.exit_code, Some(0));
    // A cut is not a stop: no limit ended the command, only its kept output was capped.
    assert_eq!(outcome.limit, None);
    assert!(outcome.stdout_truncated, "{outcome:?}");
    assert!(!outcome.stderr_truncated, "{outcome:?}");
    assert_eq!(outcome.stdout.len(), 1_000);
    assert!(outcome.stdout.bytes().all(|b| b == b'a'));
    assert_eq!(outcome.stdout_bytes, 100_000);
    runner.stop();
}

#[tokio::test]
async fn a_wrong_token_is_refused_as_unavailable_and_changes_nothing() {
    let Some(mut runner) = Runner::start("a_wrong_token_is_refused_as_unavailable") else {
        return;
    };
    let w = workspace("run-1");
    for token in ["wrong", "", &TOKEN[1..], &format!("{TOKEN}x")] {
        let client = runner.client(token);
        let errors = [
            client.write(&w, "x.txt", b"x".to_vec()).await.unwrap_err(),
            client.read(&w, "x.txt").await.unwrap_err(),
            client.list(&w, "").await.unwrap_err(),
            client
                .exec(
                    &w,
                    ExecRequest {
                        command: "touch y.txt".into(),
                        limits: Limits::default(),
                        network: false,
                    },
                )
                .await
                .unwrap_err(),
        ];
        for error in errors {
            assert!(
                matches!(error, SandboxError::Unavailable(_)),
                "{token:?}: {error:?}"
            );
            assert_eq!(error.rule(), None);
        }
    }
    assert!(!runner.folder("run-1").join("x.txt").exists());
    assert!(!runner.folder("run-1").join("y.txt").exists());
    // The right token still works on the same runner.
    runner.client(TOKEN).list(&w, "").await.unwrap();

    // Without the token, the body is not even read: garbage is answered 401, not 422.
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/write", runner.url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 401);

    // A runner that is down gives the same kind of error.
    let client = runner.client(TOKEN);
    runner.stop();
    let down = client.list(&w, "").await.unwrap_err();
    assert!(matches!(down, SandboxError::Unavailable(_)), "{down:?}");

    let bad = RemoteSandbox::new("ftp://127.0.0.1:1", TOKEN.into()).unwrap_err();
    assert!(matches!(bad, SetupError::Remote(_)), "{bad:?}");
}
