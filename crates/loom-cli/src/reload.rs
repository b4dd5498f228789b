//! `loom serve --reload` (development): a supervisor that binds the listening socket once and
//! runs the server as a child process, restarted when the configuration changes.
//!
//! - The child is this same binary with the same arguments but `--reload`; it receives the
//!   listening socket as its standard input (inetd's convention: no fd juggling, no unsafe
//!   code) and `LOOM_LISTEN_FD=0` says so. It writes [`READY`] on its standard output (a pipe
//!   to the supervisor) once its configuration is loaded and it serves.
//! - The supervisor polls `loom.yaml`, the agents directory and the prompts directory every
//!   [`POLL`] (sizes and modification times). On a change it starts a new child on the same
//!   socket; when the new child is ready, the old one gets [`HAND_OVER`] (SIGUSR1): it stops
//!   accepting, answers the requests in flight (up to `execution.shutdown_timeout`), then
//!   stops its remaining runs at a safe point, open ([`loom_http::Shutdown::Drain`]); once it
//!   has exited the new one gets SIGHUP and resumes them ([`loom_ia::Loom::recover_all`]). A new child that exits before it is ready (a
//!   broken configuration: its `config error: …` line is on the shared stderr) is refused and
//!   the old one keeps serving.
//! - SIGTERM or Ctrl-C stops the supervisor: the child gets SIGTERM and its exit code is the
//!   supervisor's. During a hand-over both children get it: the old one's drain becomes a
//!   stop (its runs stop after their step instead of running to their end). A new child that
//!   exits during a hand-over is noticed (the next configuration change starts another).
//!
//! Refused under the `prod` profile. A supervisor killed with SIGKILL leaves its child
//! serving: stop the child by its pid.

use std::{
    ffi::OsString,
    net::TcpListener,
    os::fd::OwnedFd,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::{Duration, SystemTime},
};

use loom_ia::{Loom, Profile};
use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader},
    process::Command,
    sync::{mpsc, oneshot},
};

use crate::{FAILED, OK, REFUSED};

/// The environment variable naming the file descriptor of the inherited listening socket
/// (only `0`, standard input, is used).
pub(crate) const LISTEN_FD: &str = "LOOM_LISTEN_FD";

/// The line a child writes on its standard output once it serves.
pub(crate) const READY: &str = "loom-serve-ready";

/// The signal that tells the old server to hand over to a new one: stop accepting, answer
/// the requests in flight (up to `execution.shutdown_timeout`), then stop its runs
/// ([`loom_http::Shutdown::Drain`]). SIGTERM keeps its meaning: stop the runs at once.
pub(crate) const HAND_OVER: Signal = Signal::SIGUSR1;

/// How often the configuration files are compared.
const POLL: Duration = Duration::from_millis(500);

/// A child server: its pid, and whether it reported ready.
struct Child {
    pid: u32,
    ready: oneshot::Receiver<()>,
}

/// Why a new child did not take over.
enum Start {
    /// It serves.
    Ready(u32),
    /// It exited first, with this status.
    Exited(ExitStatus),
    /// The supervisor was asked to stop meanwhile.
    Stopping(u32),
}

/// Runs the supervisor until SIGTERM or Ctrl-C; its exit code.
pub(crate) async fn supervise(
    loom: &Loom,
    args: &[OsString],
    host: &str,
    port: u16,
    stop: impl std::future::Future<Output = ()>,
) -> u8 {
    if loom.config().profile() == Some(Profile::Prod) {
        eprintln!(
            "error: loom serve --reload is refused under the prod profile: reloading is for \
             development (restart the server to change its configuration)"
        );
        return REFUSED;
    }
    let listener = match TcpListener::bind((host, port)) {
        Ok(listener) => listener,
        Err(error) => {
            eprintln!("error: cannot listen on {host}:{port}: {error}");
            return FAILED;
        }
    };
    let address = match listener.local_addr() {
        Ok(address) => address,
        Err(error) => {
            eprintln!("error: cannot read the listening address: {error}");
            return FAILED;
        }
    };
    let config = loom.config();
    let watched = vec![
        config.file().to_path_buf(),
        config.agents_dir().to_path_buf(),
        config.prompts_dir().to_path_buf(),
    ];
    let child_args: Vec<OsString> = args
        .iter()
        .skip(1)
        .filter(|a| a.as_os_str() != "--reload")
        .cloned()
        .collect();
    let (exits, mut exited) = mpsc::unbounded_channel::<(u32, ExitStatus)>();
    let mut stop = std::pin::pin!(stop);

    let mut seen = fingerprint(&watched);
    let mut current = match start(&listener, &child_args, &exits) {
        Ok(child) => child,
        Err(error) => {
            eprintln!("error: cannot start the server process: {error}");
            return FAILED;
        }
    };
    let mut current_pid = Some(current.pid);
    match wait_ready(&mut current, &mut current_pid, &mut exited, &mut stop).await {
        Start::Ready(_) => {}
        Start::Exited(status) => return code(status),
        Start::Stopping(pid) => return stop_child(pid, &mut exited).await,
    }
    eprintln!("Listening on http://{address}");
    eprintln!(
        "Reloading when {} change (--reload: development only).",
        watched
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut tick = tokio::time::interval(POLL);
    loop {
        tokio::select! {
            () = &mut stop => {
                return match current_pid {
                    Some(pid) => stop_child(pid, &mut exited).await,
                    None => OK,
                };
            }
            Some((pid, status)) = exited.recv() => {
                if Some(pid) == current_pid {
                    eprintln!(
                        "the server process stopped ({status}); a new one starts at the next \
                         configuration change"
                    );
                    current_pid = None;
                }
            }
            _ = tick.tick() => {
                let now = fingerprint(&watched);
                if now == seen {
                    continue;
                }
                seen = now;
                eprintln!("Configuration changed: starting a server with it.");
                let mut next = match start(&listener, &child_args, &exits) {
                    Ok(child) => child,
                    Err(error) => {
                        eprintln!("reload refused: cannot start a server process: {error}");
                        continue;
                    }
                };
                match wait_ready(&mut next, &mut current_pid, &mut exited, &mut stop).await {
                    Start::Ready(pid) => {
                        if let Some(old) = current_pid.replace(pid)
                            && signal(old, HAND_OVER)
                        {
                            match hand_over(old, pid, &mut exited, &mut stop).await {
                                HandOver::Done { new_alive: true } => {}
                                HandOver::Done { new_alive: false } => {
                                    current_pid = None;
                                    continue;
                                }
                                HandOver::Stopping => {
                                    // The old server was told to stop too: its drain ends.
                                    // Either may exit first.
                                    let mut stopping = vec![old];
                                    if signal(pid, Signal::SIGTERM) {
                                        stopping.push(pid);
                                    }
                                    return wait_exits(&stopping, &mut exited)
                                        .await
                                        .into_iter()
                                        .map(|status| status.map_or(FAILED, code))
                                        .max()
                                        .unwrap_or(OK);
                                }
                            }
                        }
                        // The runs the old server stopped are open: the new one resumes them.
                        signal(pid, Signal::SIGHUP);
                        eprintln!("Reloaded: the new configuration serves (pid {pid}).");
                    }
                    Start::Exited(status) => {
                        eprintln!(
                            "reload refused: the new configuration does not load ({status}); \
                             the previous one keeps serving"
                        );
                    }
                    Start::Stopping(pid) => {
                        // Both children stop, in whatever order; the current one's code is
                        // the supervisor's.
                        let current = current_pid.filter(|current| signal(*current, Signal::SIGTERM));
                        let mut stopping: Vec<u32> = current.into_iter().collect();
                        if signal(pid, Signal::SIGTERM) {
                            stopping.push(pid);
                        }
                        let statuses = wait_exits(&stopping, &mut exited).await;
                        return match (current, statuses.first()) {
                            (Some(_), Some(status)) => status.map_or(FAILED, code),
                            _ => OK,
                        };
                    }
                }
            }
        }
    }
}

/// Starts a child server on `listener`.
fn start(
    listener: &TcpListener,
    args: &[OsString],
    exits: &mpsc::UnboundedSender<(u32, ExitStatus)>,
) -> std::io::Result<Child> {
    let socket = OwnedFd::from(listener.try_clone()?);
    let mut process = Command::new(std::env::current_exe()?)
        .args(args)
        .env(LISTEN_FD, "0")
        .stdin(Stdio::from(socket))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(false)
        .spawn()?;
    let pid = process
        .id()
        .ok_or_else(|| std::io::Error::other("the server process has no pid"))?;
    let (ready_tx, ready) = oneshot::channel();
    if let Some(stdout) = process.stdout.take() {
        // The ready line is the supervisor's; anything else the child prints goes on.
        tokio::spawn(async move {
            let mut ready_tx = Some(ready_tx);
            let mut lines = BufReader::new(stdout).lines();
            let mut out = tokio::io::stdout();
            while let Ok(Some(line)) = lines.next_line().await {
                if line.trim() == READY {
                    if let Some(tx) = ready_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                let _ = out.write_all(format!("{line}\n").as_bytes()).await;
            }
        });
    }
    let exits = exits.clone();
    tokio::spawn(async move {
        if let Ok(status) = process.wait().await {
            let _ = exits.send((pid, status));
        }
    });
    Ok(Child { pid, ready })
}

/// Waits until `child` is ready, exits, or the supervisor is asked to stop; the current
/// child (`current`) keeps serving meanwhile, and is forgotten if it exits.
async fn wait_ready(
    child: &mut Child,
    current: &mut Option<u32>,
    exited: &mut mpsc::UnboundedReceiver<(u32, ExitStatus)>,
    stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> Start {
    loop {
        tokio::select! {
            ready = &mut child.ready => {
                if ready.is_ok() {
                    return Start::Ready(child.pid);
                }
                // Its stdout closed without the line: it is exiting.
                return match wait_exit(child.pid, exited).await {
                    Some(status) => Start::Exited(status),
                    None => Start::Stopping(child.pid),
                };
            }
            Some((pid, status)) = exited.recv() => {
                if pid == child.pid {
                    return Start::Exited(status);
                }
                if *current == Some(pid) {
                    *current = None;
                }
                eprintln!("the server process {pid} stopped ({status})");
            }
            () = stop.as_mut() => return Start::Stopping(child.pid),
        }
    }
}

/// How a hand-over ended.
enum HandOver {
    /// The old server exited; whether the new one still serves.
    Done { new_alive: bool },
    /// The supervisor was asked to stop meanwhile: the old server got SIGTERM (its drain
    /// becomes a stop) and the new one is still to be stopped.
    Stopping,
}

/// Waits for the old server to answer its requests in flight and exit, noticing meanwhile
/// an exit of the new one and a stop of the supervisor (which the old server is told too, so
/// it does not drain to its timeout).
async fn hand_over(
    old: u32,
    new: u32,
    exited: &mut mpsc::UnboundedReceiver<(u32, ExitStatus)>,
    stop: &mut std::pin::Pin<&mut impl std::future::Future<Output = ()>>,
) -> HandOver {
    let mut new_alive = true;
    loop {
        tokio::select! {
            exit = exited.recv() => match exit {
                Some((pid, _)) if pid == old => return HandOver::Done { new_alive },
                Some((pid, status)) => {
                    if pid == new {
                        new_alive = false;
                        eprintln!(
                            "the new server process stopped ({status}) while the old one handed \
                             over; a new one starts at the next configuration change"
                        );
                    }
                }
                None => return HandOver::Done { new_alive },
            },
            () = stop.as_mut() => {
                signal(old, Signal::SIGTERM);
                return HandOver::Stopping;
            }
        }
    }
}

/// Waits for the exit of `pid`.
async fn wait_exit(
    pid: u32,
    exited: &mut mpsc::UnboundedReceiver<(u32, ExitStatus)>,
) -> Option<ExitStatus> {
    while let Some((exited_pid, status)) = exited.recv().await {
        if exited_pid == pid {
            return Some(status);
        }
    }
    None
}

/// Waits for the exits of all of `pids`, in whatever order they come (waiting for one, then
/// the other, would miss the other's exit if it came first); their statuses, in the order of
/// `pids` (`None` when the channel closed first).
async fn wait_exits(
    pids: &[u32],
    exited: &mut mpsc::UnboundedReceiver<(u32, ExitStatus)>,
) -> Vec<Option<ExitStatus>> {
    let mut statuses = vec![None; pids.len()];
    while statuses.iter().any(Option::is_none) {
        let Some((pid, status)) = exited.recv().await else {
            break;
        };
        if let Some(index) = pids.iter().position(|p| *p == pid) {
            statuses[index] = Some(status);
        }
    }
    statuses
}

/// Stops the child gracefully; its exit code.
async fn stop_child(pid: u32, exited: &mut mpsc::UnboundedReceiver<(u32, ExitStatus)>) -> u8 {
    if !signal(pid, Signal::SIGTERM) {
        return OK;
    }
    match wait_exit(pid, exited).await {
        Some(status) => code(status),
        None => FAILED,
    }
}

/// Sends `signal` to `pid`; `false` when the process is gone.
fn signal(pid: u32, signal: Signal) -> bool {
    let Ok(raw) = i32::try_from(pid) else {
        return false;
    };
    match kill(Pid::from_raw(raw), signal) {
        Ok(()) => true,
        Err(error) => {
            tracing::warn!(pid, %error, "cannot signal the server process");
            false
        }
    }
}

fn code(status: ExitStatus) -> u8 {
    status
        .code()
        .and_then(|c| u8::try_from(c).ok())
        .unwrap_or(FAILED)
}

/// Sizes and modification times of the files under `paths` (directories walked, a few levels
/// deep), sorted: two equal fingerprints mean nothing changed.
fn fingerprint(paths: &[PathBuf]) -> Vec<(PathBuf, u64, Option<SystemTime>)> {
    let mut out = Vec::new();
    for path in paths {
        walk(path, 0, &mut out);
    }
    out.sort();
    out
}

fn walk(path: &Path, depth: usize, out: &mut Vec<(PathBuf, u64, Option<SystemTime>)>) {
    let Ok(meta) = std::fs::metadata(path) else {
        return;
    };
    if meta.is_dir() {
        if depth > 4 {
            return;
        }
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        for entry in entries.flatten() {
            walk(&entry.path(), depth + 1, out);
        }
    } else {
        out.push((path.to_path_buf(), meta.len(), meta.modified().ok()));
    }
}

/// The listening socket inherited from a supervisor (`LOOM_LISTEN_FD=0`: standard input), when
/// this process is one of its children.
pub(crate) fn inherited_listener() -> Option<std::io::Result<tokio::net::TcpListener>> {
    let fd = std::env::var(LISTEN_FD).ok()?;
    Some(take_listener(&fd))
}

fn take_listener(fd: &str) -> std::io::Result<tokio::net::TcpListener> {
    use std::os::fd::AsFd;
    if fd != "0" {
        return Err(std::io::Error::other(format!(
            "{LISTEN_FD}={fd}: only 0 (standard input) is supported"
        )));
    }
    let socket = std::io::stdin().as_fd().try_clone_to_owned()?;
    let listener = TcpListener::from(socket);
    // Not a socket (or not a listening one): refused here rather than at the first accept.
    listener.local_addr()?;
    listener.set_nonblocking(true)?;
    tokio::net::TcpListener::from_std(listener)
}

/// Tells the supervisor this child serves.
pub(crate) fn report_ready() {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{READY}");
    let _ = out.flush();
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    use super::*;

    /// Two children stopped together: the second one's exit may come first; both are seen.
    #[tokio::test]
    async fn exits_are_collected_in_whatever_order_they_come() {
        let (exits, mut exited) = mpsc::unbounded_channel();
        exits.send((7, ExitStatus::from_raw(0))).unwrap();
        exits.send((99, ExitStatus::from_raw(0))).unwrap();
        exits.send((5, ExitStatus::from_raw(256))).unwrap();
        let statuses =
            tokio::time::timeout(Duration::from_secs(10), wait_exits(&[5, 7], &mut exited))
                .await
                .expect("an exit that came first was missed");
        assert_eq!(
            statuses
                .iter()
                .map(|s| s.and_then(|s| s.code()))
                .collect::<Vec<_>>(),
            [Some(1), Some(0)]
        );
        // A closed channel ends the wait.
        drop(exits);
        assert_eq!(wait_exits(&[8], &mut exited).await, [None]);
    }
}
