//! The attack list of the local sandbox: each attempt gets its exact refusal or a contained
//! outcome. Skipped with a notice when bubblewrap cannot create namespaces on the machine,
//! failed instead under `LOOM_REQUIRE_SERVICES=1`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use loom_core::sandbox::{ExecOutcome, ExecRequest, Limits, Sandbox, Workspace, rules};
use loom_sandbox::LocalSandbox;

struct Lab {
    _root: tempfile::TempDir,
    sandbox: LocalSandbox,
    workspace: Workspace,
}

/// A sandbox under a fresh root, or `None` (skipped) without namespaces.
fn lab(test: &str) -> Option<Lab> {
    if !loom_testkit::services::namespaces(test) {
        return None;
    }
    let root = tempfile::tempdir().unwrap();
    let sandbox = LocalSandbox::new(root.path().join("sandbox")).unwrap();
    Some(Lab {
        _root: root,
        sandbox,
        workspace: Workspace::new("acme", "run-1").unwrap(),
    })
}

impl Lab {
    async fn exec_with(&self, command: &str, limits: Limits, network: bool) -> ExecOutcome {
        self.sandbox
            .exec(
                &self.workspace,
                ExecRequest {
                    command: command.into(),
                    limits,
                    network,
                },
            )
            .await
            .unwrap()
    }

    async fn exec(&self, command: &str) -> ExecOutcome {
        self.exec_with(command, Limits::default(), false).await
    }

    fn folder(&self) -> std::path::PathBuf {
        self.sandbox.root().join("acme/run-1")
    }
}

#[tokio::test]
async fn dot_dot_and_absolute_paths_are_refused_in_read_write_and_list() {
    let Some(lab) = lab("dot_dot_and_absolute_paths") else {
        return;
    };
    let w = &lab.workspace;
    for path in [
        "../run-2/x",
        "../../../etc/passwd",
        "/etc/passwd",
        "a/../../x",
    ] {
        let read = lab.sandbox.read(w, path).await.unwrap_err();
        let write = lab.sandbox.write(w, path, b"x".to_vec()).await.unwrap_err();
        let list = lab.sandbox.list(w, path).await.unwrap_err();
        for error in [read, write, list] {
            assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{path}: {error}");
            assert!(
                error.to_string().contains("sandbox-inside-folder"),
                "{error}"
            );
        }
    }
    assert!(!lab.sandbox.root().join("acme/x").exists());
}

#[tokio::test]
async fn a_symlink_planted_by_exec_does_not_lead_a_host_read_out() {
    let Some(lab) = lab("a_symlink_planted_by_exec") else {
        return;
    };
    let outcome = lab
        .exec("ln -s /etc/passwd leak && ln -s ../../../../../../ up && ls")
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    for path in ["leak", "up/etc/passwd"] {
        let error = lab.sandbox.read(&lab.workspace, path).await.unwrap_err();
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{path}: {error}");
        let error = lab
            .sandbox
            .write(&lab.workspace, path, b"pwned".to_vec())
            .await
            .unwrap_err();
        assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{path}: {error}");
    }
    let error = lab.sandbox.list(&lab.workspace, "up").await.unwrap_err();
    assert_eq!(error.rule(), Some(rules::INSIDE_FOLDER), "{error}");
    // The listing shows the links as links.
    let entries = lab.sandbox.list(&lab.workspace, "").await.unwrap();
    assert!(
        entries
            .iter()
            .all(|e| e.kind == loom_core::sandbox::EntryKind::Link)
    );
}

#[tokio::test]
async fn exec_cannot_read_host_secrets_nor_write_outside_its_folder() {
    let Some(lab) = lab("exec_cannot_read_host_secrets") else {
        return;
    };
    let outcome = lab.exec("cat /etc/shadow").await;
    assert_ne!(outcome.exit_code, Some(0), "{outcome:?}");
    assert!(outcome.stderr.contains("No such file"), "{outcome:?}");
    let outcome = lab.exec("cat /etc/passwd; ls /root /home 2>&1; true").await;
    assert!(!outcome.stdout.contains("root:x:0"), "{outcome:?}");
    for target in [
        "/x",
        "/usr/x",
        "/etc/x",
        "/work/../escape",
        "/proc/x",
        "/tmp/x",
    ] {
        let outcome = lab.exec(&format!("echo pwned > {target}")).await;
        assert_ne!(outcome.exit_code, Some(0), "{target}: {outcome:?}");
    }
    assert!(!lab.sandbox.root().join("acme/escape").exists());
    // The environment is the sandbox's, not the host's.
    let outcome = lab.exec("env").await;
    assert!(!outcome.stdout.contains("CARGO"), "{outcome:?}");
    assert!(outcome.stdout.contains("HOME=/work"), "{outcome:?}");
    // Writing inside works, and the host sees it.
    let outcome = lab.exec("echo inside > ok.txt && id -u").await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout.trim(), "1000");
    assert_eq!(
        std::fs::read_to_string(lab.folder().join("ok.txt")).unwrap(),
        "inside\n"
    );
}

#[tokio::test]
async fn proc_is_the_sandboxes_own() {
    let Some(lab) = lab("proc_is_the_sandboxes_own") else {
        return;
    };
    let outcome = lab
        .exec(
            "ls /proc | grep -c '^[0-9]'; tr '\\0' ' ' < /proc/1/cmdline; echo; ps ax 2>&1 | wc -l",
        )
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    let lines: Vec<&str> = outcome.stdout.lines().collect();
    let pids: u32 = lines[0].trim().parse().unwrap();
    assert!(pids <= 6, "host processes visible: {outcome:?}");
    // PID 1 is the sandbox's own init (bubblewrap), not the host's.
    assert!(
        lines[1].contains("bwrap") || lines[1].contains("sh"),
        "{outcome:?}"
    );
    let host_pid = std::process::id();
    let outcome = lab
        .exec(&format!(
            "test -e /proc/{host_pid}/environ && cat /proc/{host_pid}/environ"
        ))
        .await;
    assert!(!outcome.stdout.contains("CARGO"), "{outcome:?}");
}

#[tokio::test]
async fn a_fork_bomb_is_bounded_and_the_host_is_unaffected() {
    let Some(lab) = lab("a_fork_bomb_is_bounded") else {
        return;
    };
    let limits = Limits {
        processes: 16,
        wall_ms: 5_000,
        ..Limits::default()
    };
    let outcome = lab
        .exec_with(
            "bomb() { bomb | bomb & }; bomb; sleep 1; echo survived",
            limits,
            false,
        )
        .await;
    // Forks beyond the cap fail ("Cannot fork"); whatever is left dies with the sandbox.
    assert!(outcome.duration_ms <= 5_000 + 3_000, "{outcome:?}");
    assert!(
        outcome.stderr.contains("fork") || outcome.limit.as_deref() == Some(rules::WALL_TIME),
        "{outcome:?}"
    );
    // The host still forks, and the sandbox runs the next command.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
    let next = lab.exec("echo next").await;
    assert_eq!(next.stdout, "next\n", "{next:?}");
}

#[tokio::test]
async fn the_network_is_cut_unless_allowed() {
    let Some(lab) = lab("the_network_is_cut_unless_allowed") else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        "python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {port}), 3); print(\"connected\")'"
    );
    let cut = lab.exec(&probe).await;
    assert_ne!(cut.exit_code, Some(0), "{cut:?}");
    assert!(cut.stderr.contains("ConnectionRefusedError"), "{cut:?}");
    // PostgreSQL of the host, when it runs, is unreachable the same way.
    let pg = lab
        .exec("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 5432), 3)'")
        .await;
    assert_ne!(pg.exit_code, Some(0), "{pg:?}");
    let allowed = lab.exec_with(&probe, Limits::default(), true).await;
    assert_eq!(allowed.exit_code, Some(0), "{allowed:?}");
    assert_eq!(allowed.stdout, "connected\n");
}

#[tokio::test]
async fn huge_output_is_cut_at_the_cap_and_counted() {
    let Some(lab) = lab("huge_output_is_cut") else {
        return;
    };
    let limits = Limits {
        output_bytes: 1000,
        ..Limits::default()
    };
    let outcome = lab
        .exec_with("yes | head -c 100000000", limits, false)
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(outcome.stdout.len(), 1000);
    assert_eq!(outcome.stdout_bytes, 100_000_000);
    assert!(outcome.stdout_truncated);
    assert!(!outcome.stderr_truncated);
    let result = loom_sandbox::exec_output(&outcome).unwrap();
    assert!(
        result
            .visible_text()
            .contains("output cut by rule 'sandbox-output-size'")
    );
}

#[tokio::test]
async fn cpu_loops_and_sleepers_are_stopped_at_their_limits() {
    let Some(lab) = lab("cpu_loops_and_sleepers") else {
        return;
    };
    // A wall time far above the CPU time: on a loaded machine the loop may get its CPU second
    // slowly, and the CPU limit must still be what stops it.
    let cpu = Limits {
        cpu_ms: 1_000,
        wall_ms: 600_000,
        ..Limits::default()
    };
    let outcome = lab.exec_with("while :; do :; done", cpu, false).await;
    assert_eq!(
        outcome.limit.as_deref(),
        Some(rules::CPU_TIME),
        "{outcome:?}"
    );
    assert_eq!(outcome.signal, Some(24));
    assert_eq!(outcome.exit_code, None);
    let wall = Limits {
        wall_ms: 500,
        ..Limits::default()
    };
    let outcome = lab.exec_with("sleep 30 & sleep 30", wall, false).await;
    assert_eq!(
        outcome.limit.as_deref(),
        Some(rules::WALL_TIME),
        "{outcome:?}"
    );
    assert_eq!(outcome.signal, Some(9));
    let result = loom_sandbox::exec_output(&outcome).unwrap();
    assert!(
        result
            .visible_text()
            .contains("stopped by rule 'sandbox-wall-time'")
    );
}

#[tokio::test]
async fn memory_hogs_and_huge_files_are_stopped() {
    let Some(lab) = lab("memory_hogs_and_huge_files") else {
        return;
    };
    let limits = Limits {
        memory_mb: 256,
        file_mb: 1,
        ..Limits::default()
    };
    let outcome = lab
        .exec_with(
            "python3 -c 'x = bytearray(1024 * 1024 * 1024)'",
            limits,
            false,
        )
        .await;
    assert_ne!(outcome.exit_code, Some(0), "{outcome:?}");
    assert!(outcome.stderr.contains("MemoryError"), "{outcome:?}");
    let outcome = lab
        .exec_with("head -c 3000000 /dev/zero > big", limits, false)
        .await;
    assert_eq!(
        outcome.limit.as_deref(),
        Some(rules::FILE_SIZE),
        "{outcome:?}"
    );
    let size = std::fs::metadata(lab.folder().join("big")).unwrap().len();
    assert!(size <= 1024 * 1024, "{size}");
}

#[tokio::test]
async fn host_side_files_are_the_commands_files() {
    let Some(lab) = lab("host_side_files_are_the_commands_files") else {
        return;
    };
    let w = &lab.workspace;
    lab.sandbox
        .write(w, "scripts/sum.py", b"print(sum(range(10)))\n".to_vec())
        .await
        .unwrap();
    let outcome = lab
        .exec("python3 scripts/sum.py > out.txt && echo again >> scripts/sum.py")
        .await;
    assert_eq!(outcome.exit_code, Some(0), "{outcome:?}");
    assert_eq!(lab.sandbox.read(w, "out.txt").await.unwrap(), b"45\n");
    let paths: Vec<String> = lab
        .sandbox
        .list(w, "")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect();
    assert_eq!(paths, ["out.txt", "scripts", "scripts/sum.py"]);
    // Another working folder sees none of it.
    let other = Workspace::new("acme", "run-2").unwrap();
    assert!(lab.sandbox.list(&other, "").await.unwrap().is_empty());
}
