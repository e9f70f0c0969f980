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
/// How many sets of ports [`Helper::start_on_free_ports`] tries.
const PORT_ATTEMPTS: usize = 5;

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

    /// Start the helper `name` on `count` loopback ports, which it must be
    /// told (it cannot bind port 0 and report what it got): `command(ports)`
    /// makes its command, `ready(ports)` tells when it serves. The ports
    /// were free a moment before it starts, but on a busy machine another
    /// process (another test's helper, a client's ephemeral port) can take
    /// one in between; the helper then exits, unable to bind, and is started
    /// again on other ports, up to [`PORT_ATTEMPTS`] times. Otherwise fails
    /// the test as [`Helper::wait_until`] does.
    pub fn start_on_free_ports(
        name: &str,
        count: usize,
        what: &str,
        deadline: Duration,
        mut command: impl FnMut(&[u16]) -> Command,
        mut ready: impl FnMut(&[u16]) -> bool,
    ) -> (Helper, Vec<u16>) {
        let mut attempt = 1;
        loop {
            // All held open at once, so the `count` ports differ.
            let listeners: Vec<std::net::TcpListener> = (0..count)
                .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
                .collect();
            let ports: Vec<u16> = listeners
                .iter()
                .map(|l| l.local_addr().unwrap().port())
                .collect();
            drop(listeners);
            let mut helper = Helper::start(name, command(&ports));
            let what = format!("{what} on port(s) {ports:?}");
            let result = helper.poll(&what, deadline, || ready(&ports));
            let exited = result.is_err() && helper.exited();
            match result {
                Ok(()) => return (helper, ports),
                Err(why) if exited && attempt < PORT_ATTEMPTS => {
                    eprintln!("{name} {why}; starting it again on other ports");
                    helper.stop();
                    attempt += 1;
                }
                Err(why) => helper.fail(&why),
            }
        }
    }

    /// Poll `ready` until it holds. The test fails, naming the cause in
    /// one line, when the helper exits first or `deadline` passes.
    pub fn wait_until(&mut self, what: &str, deadline: Duration, ready: impl FnMut() -> bool) {
        if let Err(why) = self.poll(what, deadline, ready) {
            self.fail(&why);
        }
    }

    /// Poll `ready` until it holds while the helper runs; why not, when it
    /// exits first (even if something else answers in its place) or
    /// `deadline` passes.
    fn poll(
        &mut self,
        what: &str,
        deadline: Duration,
        mut ready: impl FnMut() -> bool,
    ) -> Result<(), String> {
        let until = Instant::now() + deadline;
        loop {
            let is_ready = ready();
            if let Some(status) = self.child.try_wait().unwrap() {
                return Err(format!("exited ({}) before {what}", describe(status)));
            }
            if is_ready {
                return Ok(());
            }
            if Instant::now() >= until {
                return Err(format!(
                    "did not get to {what} within {} s (still running)",
                    deadline.as_secs()
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether it has exited.
    fn exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
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
