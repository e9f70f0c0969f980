//! Helper processes the tests start (moto, etcd, git daemon, lighttpd, an
//! OCI registry, a file server): their output goes to a log file, readiness
//! is polled with a deadline, and a helper that fails to start, dies, or
//! never gets ready fails the test with its exit status and the last line
//! of its output in the panic's first line, the rest of the log below.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Lines of a helper's log shown under a failure.
const TAIL_LINES: usize = 20;

/// A running helper process, killed on drop.
pub struct Helper {
    name: String,
    child: Child,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Helper {
    /// Start `command` as the helper `name`, its stdout and stderr in a log.
    pub fn start(name: &str, mut command: Command) -> Helper {
        let dir = super::tempdir();
        let log = dir.path().join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        command
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file);
        let child = command.spawn().unwrap_or_else(|e| {
            panic!(
                "{name} did not start: cannot run {:?}: {e}",
                command.get_program()
            )
        });
        Helper {
            name: name.to_string(),
            child,
            log,
            _dir: dir,
        }
    }

    /// Poll `ready` until it holds. The test fails, naming the cause in
    /// one line, when the helper exits first or `deadline` passes.
    pub fn wait_until(&mut self, what: &str, deadline: Duration, mut ready: impl FnMut() -> bool) {
        let until = Instant::now() + deadline;
        loop {
            if ready() {
                return;
            }
            if let Some(status) = self.child.try_wait().unwrap() {
                self.fail(&format!("exited ({}) before {what}", describe(status)));
            }
            if Instant::now() >= until {
                self.fail(&format!(
                    "did not get to {what} within {} s (still running)",
                    deadline.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Wait until something accepts TCP connections on `port` (loopback).
    pub fn wait_for_port(&mut self, port: u16, deadline: Duration) {
        self.wait_until(
            &format!("accepting connections on port {port}"),
            deadline,
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
    }

    /// Fail the test if the helper is no longer running.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            self.fail(&format!("died ({})", describe(status)));
        }
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Kill it and wait until it is gone.
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn fail(&mut self, what: &str) -> ! {
        self.stop();
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        let cause = lines.last().map_or("(it printed nothing)", |l| l.trim());
        let tail = lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n");
        panic!(
            "{} {what}: {cause}\n--- last lines of {} ---\n{tail}",
            self.name,
            self.log.display()
        );
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        self.stop();
    }
}

fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        _ => status.to_string(),
    }
}
