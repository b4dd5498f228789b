//! A `loom serve` process for the end-to-end tests: started on a free port (`--port 0`, the
//! address read from its `Listening on` line), its stderr kept, stopped with SIGTERM; and plain
//! HTTP/1.1 requests to it.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex, mpsc},
    time::Duration,
};

/// How long a test waits for something that must happen (a bound, not a measure).
pub(crate) const PATIENCE: Duration = loom_testkit::wait::PATIENCE;

/// A server process, its address, and what it wrote on stderr so far.
pub(crate) struct Server {
    child: Child,
    /// Where it listens (`127.0.0.1:<port>`).
    pub(crate) address: String,
    log: Arc<Mutex<String>>,
    /// Taken when the server is waited for.
    reader: Option<std::thread::JoinHandle<()>>,
}

/// A server a test drops without stopping it (a failed assertion, or a test that needs it no
/// more) is killed: no `loom serve` outlives its test.
impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Server {
    /// Starts `program args` in `dir` and waits for its `Listening on` line.
    pub(crate) fn start(program: &Path, dir: &Path, args: &[&str]) -> Server {
        Server::start_with(program, dir, args, &[])
    }

    /// [`Server::start`] with more environment variables.
    pub(crate) fn start_with(
        program: &Path,
        dir: &Path,
        args: &[&str],
        env: &[(&str, PathBuf)],
    ) -> Server {
        let mut child = Command::new(program)
            .current_dir(dir)
            .env_remove("LOOM_PROFILE")
            .env_remove("LOOM_LOG")
            .envs(env.iter().map(|(k, v)| (*k, v)))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (found, address) = mpsc::channel();
        let reader = {
            let log = log.clone();
            std::thread::spawn(move || {
                let mut lines = BufReader::new(stderr);
                let mut line = String::new();
                while lines.read_line(&mut line).unwrap_or(0) > 0 {
                    if let Some(rest) = line.trim().strip_prefix("Listening on http://") {
                        let _ = found.send(rest.to_owned());
                    }
                    log.lock().unwrap().push_str(&line);
                    line.clear();
                }
            })
        };
        let Ok(address) = address.recv_timeout(PATIENCE) else {
            let _ = child.kill();
            panic!("no 'Listening on' line:\n{}", log.lock().unwrap());
        };
        Server {
            child,
            address,
            log,
            reader: Some(reader),
        }
    }

    /// What it wrote on stderr so far.
    pub(crate) fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Waits until its stderr contains `text`.
    pub(crate) fn wait_log(&self, text: &str) {
        loom_testkit::wait::blocking_until(format!("the log line {text:?}"), || {
            let log = self.log();
            if log.contains(text) {
                Ok(())
            } else {
                Err(format!("the log so far:\n{log}"))
            }
        });
    }

    /// Sends SIGTERM.
    pub(crate) fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// SIGKILL (a crash), and waits for the process to end.
    pub(crate) fn kill(&mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then its exit code and its whole stderr.
    pub(crate) fn stop(self) -> (Option<i32>, String) {
        self.terminate();
        self.wait()
    }

    /// Waits for it to exit (killed, and the test failed, after [`PATIENCE`]); its exit code
    /// and its whole stderr.
    pub(crate) fn wait(mut self) -> (Option<i32>, String) {
        let exited = loom_testkit::wait::blocking_poll_within(
            format!("the server (pid {}) to exit", self.child.id()),
            PATIENCE,
            || self.child.try_wait().unwrap(),
        );
        let status = match exited {
            Ok(status) => status,
            Err(timed_out) => {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!("{timed_out}; its log:\n{}", self.log());
            }
        };
        // The reader thread ends with the pipe (a supervisor's children share it: they have
        // exited too).
        let log = self.log.clone();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let log = log.lock().unwrap().clone();
        (status.code(), log)
    }
}

/// One HTTP/1.1 request on a fresh connection: the status code and the body.
pub(crate) fn request(address: &str, method: &str, path: &str, body: &str) -> (u16, String) {
    request_with(address, method, path, "", body)
}

/// Same, with extra header lines (each ending with `\r\n`).
pub(crate) fn request_with(
    address: &str,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(address).unwrap();
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\n\
         {headers}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (_, body) = response.split_once("\r\n\r\n").unwrap();
    (status, body.to_owned())
}
