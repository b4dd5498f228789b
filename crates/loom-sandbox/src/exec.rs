//! One command in Linux namespaces: `prlimit` (the resource limits) execs `bwrap` (the
//! namespaces), which runs `/bin/sh -c <command>` in the working folder.
//!
//! What the command sees (`bwrap_args`): a read-only minimal root (`/usr`, the `/bin`, `/lib*`
//! links or folders, a few files of `/etc`, `--remount-ro /`), fresh `/proc` and `/dev`, the
//! working folder bind-mounted read-write at `/work` as its only writable path, every
//! namespace unshared (the network too unless allowed), `--die-with-parent`, `--new-session`
//! (no terminal to inject input into), and a cleared environment.
//!
//! The limits: `RLIMIT_CPU`, `RLIMIT_AS`, `RLIMIT_NPROC` and `RLIMIT_FSIZE` are set by
//! util-linux `prlimit(1)` on itself before it execs `bwrap`, soft equal to hard so nothing
//! inside can raise them (setting them in a `pre_exec` hook would need `unsafe`, which the
//! workspace forbids); the CPU limit's soft value comes first (`SIGXCPU`), its hard one a
//! second later (`SIGKILL`). The wall-clock limit kills the whole process group (`prlimit`
//! became `bwrap`, whose sandboxed child dies with it, taking its PID namespace along). Each
//! output stream is kept up to `output_bytes` and counted past it.
//! Run as root, the command runs as an unprivileged host user of its own (see
//! [`crate::LocalSandbox`]), so that `RLIMIT_NPROC` applies (root is exempt from it).

use std::{
    path::Path,
    process::Stdio,
    time::{Duration, Instant},
};

use loom_core::sandbox::{ExecOutcome, ExecRequest, SandboxError, rules};
use tokio::{io::AsyncReadExt, process::Command};

/// The folder the working folder is mounted at inside the sandbox.
pub const MOUNT_POINT: &str = "/work";
/// How long the output pipes are still read once the command ended (a process that escaped
/// its group cannot exist: its PID namespace is gone; this is only a bound).
const DRAIN_AFTER_EXIT: Duration = Duration::from_secs(2);

/// The programs a command needs on the host.
#[derive(Debug, Clone)]
pub(crate) struct Programs {
    pub(crate) bwrap: std::path::PathBuf,
    pub(crate) prlimit: std::path::PathBuf,
}

/// The arguments of `bwrap` for a command in `folder`.
pub(crate) fn bwrap_args(folder: &Path, network: bool) -> Vec<String> {
    let mut args: Vec<String> = ["--unshare-all", "--die-with-parent", "--new-session"]
        .into_iter()
        .map(str::to_owned)
        .collect();
    if network {
        args.push("--share-net".into());
    }
    args.extend(["--ro-bind", "/usr", "/usr"].map(str::to_owned));
    // Merged-/usr systems have links (`/bin -> usr/bin`), others folders.
    for top in ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"] {
        match std::fs::symlink_metadata(top) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(top) {
                    args.extend([
                        "--symlink".to_owned(),
                        target.to_string_lossy().into_owned(),
                        top.to_owned(),
                    ]);
                }
            }
            Ok(meta) if meta.is_dir() => {
                args.extend(["--ro-bind".to_owned(), top.to_owned(), top.to_owned()]);
            }
            _ => {}
        }
    }
    let mut etc = vec![
        "/etc/alternatives",
        "/etc/ld.so.cache",
        "/etc/localtime",
        "/etc/ssl",
        "/etc/ca-certificates",
    ];
    if network {
        etc.extend(["/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf"]);
    }
    for path in etc {
        args.extend(["--ro-bind-try".to_owned(), path.to_owned(), path.to_owned()]);
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--bind"].map(str::to_owned));
    args.push(folder.to_string_lossy().into_owned());
    args.push(MOUNT_POINT.to_owned());
    args.extend(
        [
            "--chdir",
            MOUNT_POINT,
            "--uid",
            "1000",
            "--gid",
            "1000",
            "--hostname",
            "sandbox",
            "--clearenv",
            "--setenv",
            "PATH",
            "/usr/local/bin:/usr/bin:/bin",
            "--setenv",
            "HOME",
            MOUNT_POINT,
            "--setenv",
            "TMPDIR",
            MOUNT_POINT,
            "--setenv",
            "LANG",
            "C.UTF-8",
            "--remount-ro",
            "/",
        ]
        .map(str::to_owned),
    );
    args
}

/// The arguments of `prlimit` for `request`'s limits (soft equal to hard, except the CPU
/// time's: `SIGXCPU` at the limit, `SIGKILL` a second later).
pub(crate) fn prlimit_args(request: &ExecRequest) -> Vec<String> {
    let limits = request.limits;
    let cpu = limits.cpu_ms.div_ceil(1000).max(1);
    let memory = limits.memory_mb.saturating_mul(1024 * 1024);
    let file = limits.file_mb.saturating_mul(1024 * 1024);
    vec![
        format!("--cpu={cpu}:{}", cpu + 1),
        format!("--as={memory}"),
        format!("--nproc={}", limits.processes),
        format!("--fsize={file}"),
        "--core=0".to_owned(),
        "--".to_owned(),
    ]
}

/// Runs `request` in `folder` as `identity` (uid, gid) when given.
pub(crate) async fn run(
    programs: &Programs,
    folder: &Path,
    identity: Option<(u32, u32)>,
    request: ExecRequest,
) -> Result<ExecOutcome, SandboxError> {
    let mut command = Command::new(&programs.prlimit);
    command
        .args(prlimit_args(&request))
        .arg(&programs.bwrap)
        .args(bwrap_args(folder, request.network))
        .args(["/bin/sh", "-c", &request.command])
        .env_clear()
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some((uid, gid)) = identity {
        command.uid(uid).gid(gid);
    }
    let started = Instant::now();
    let mut child = command.spawn().map_err(|error| {
        SandboxError::Unavailable(format!(
            "cannot start {} with {}: {error}",
            programs.prlimit.display(),
            programs.bwrap.display()
        ))
    })?;
    let pgid = child.id();
    let cap = request.limits.output_bytes;
    let stdout = child
        .stdout
        .take()
        .map(|pipe| tokio::spawn(capture(pipe, cap)));
    let stderr = child
        .stderr
        .take()
        .map(|pipe| tokio::spawn(capture(pipe, cap)));
    let wall = Duration::from_millis(request.limits.wall_ms);
    let (status, wall_killed) = match tokio::time::timeout(wall, child.wait()).await {
        Ok(status) => (status, false),
        Err(_) => {
            kill_group(pgid);
            (child.wait().await, true)
        }
    };
    let status =
        status.map_err(|error| SandboxError::Io(format!("waiting for the command: {error}")))?;
    let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let (stdout, stdout_bytes, stdout_truncated) = collect(stdout).await;
    let (stderr, stderr_bytes, stderr_truncated) = collect(stderr).await;
    // `bwrap` exits with the command's code, or 128 + the signal that ended it.
    let (exit_code, signal) = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (_, Some(signal)) => (None, Some(signal)),
        (Some(code), None) if code > 128 && code < 128 + 65 => (None, Some(code - 128)),
        (code, None) => (code, None),
    };
    let limit = if wall_killed {
        Some(rules::WALL_TIME)
    } else {
        match signal {
            Some(24) => Some(rules::CPU_TIME),
            Some(25) => Some(rules::FILE_SIZE),
            _ => None,
        }
    };
    let outcome = ExecOutcome {
        command: request.command,
        exit_code: if wall_killed { None } else { exit_code },
        signal: if wall_killed { Some(9) } else { signal },
        limit: limit.map(str::to_owned),
        stdout,
        stderr,
        stdout_bytes,
        stderr_bytes,
        stdout_truncated,
        stderr_truncated,
        duration_ms,
    };
    tracing::info!(
        folder = %folder.display(),
        exit_code = ?outcome.exit_code,
        signal = ?outcome.signal,
        limit = ?outcome.limit,
        stdout_bytes,
        stderr_bytes,
        duration_ms,
        "sandbox command ended"
    );
    Ok(outcome)
}

/// Kills the process group `pgid` (the command's `prlimit`, then `bwrap`, and its sandbox).
fn kill_group(pgid: Option<u32>) {
    if let Some(pgid) = pgid.and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pgid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

/// What one output stream gave: the bytes kept (at most `cap`), the bytes written, whether
/// they were cut.
type Captured = (Vec<u8>, u64, bool);

/// Reads `pipe` to its end, keeping the first `cap` bytes and counting the rest.
async fn capture(mut pipe: impl tokio::io::AsyncRead + Unpin, cap: u64) -> Captured {
    let mut kept = Vec::new();
    let mut total: u64 = 0;
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room =
                    usize::try_from(cap.saturating_sub(kept.len() as u64)).unwrap_or(usize::MAX);
                kept.extend_from_slice(&buffer[..n.min(room)]);
                total = total.saturating_add(n as u64);
            }
        }
    }
    let truncated = total > kept.len() as u64;
    (kept, total, truncated)
}

/// The text of a captured stream (lossy UTF-8), its size, whether it was cut.
async fn collect(task: Option<tokio::task::JoinHandle<Captured>>) -> (String, u64, bool) {
    let Some(task) = task else {
        return (String::new(), 0, false);
    };
    match tokio::time::timeout(DRAIN_AFTER_EXIT, task).await {
        Ok(Ok((bytes, total, truncated))) => (
            String::from_utf8_lossy(&bytes).into_owned(),
            total,
            truncated,
        ),
        _ => (String::new(), 0, true),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use loom_core::sandbox::Limits;

    #[test]
    fn the_folder_is_the_only_writable_mount_and_the_network_is_off_by_default() {
        let args = bwrap_args(Path::new("/data/t/run-1"), false);
        let joined = args.join(" ");
        assert!(joined.contains("--bind /data/t/run-1 /work"), "{joined}");
        assert_eq!(args.iter().filter(|a| *a == "--bind").count(), 1);
        assert!(joined.starts_with("--unshare-all --die-with-parent --new-session"));
        assert!(!joined.contains("--share-net"));
        assert!(joined.ends_with("--remount-ro /"));
        assert!(joined.contains("--clearenv"));
        assert!(bwrap_args(Path::new("/f"), true).contains(&"--share-net".to_owned()));
    }

    #[test]
    fn limits_become_prlimit_arguments() {
        let request = ExecRequest {
            command: "true".into(),
            limits: Limits {
                cpu_ms: 1500,
                memory_mb: 2,
                processes: 7,
                file_mb: 1,
                ..Limits::default()
            },
            network: false,
        };
        assert_eq!(
            prlimit_args(&request),
            [
                "--cpu=2:3",
                "--as=2097152",
                "--nproc=7",
                "--fsize=1048576",
                "--core=0",
                "--"
            ]
        );
    }
}
