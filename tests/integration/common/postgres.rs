//! A real PostgreSQL server for the tests: Debian's `postgresql` (15 here),
//! a fresh cluster in a temporary directory on a free loopback port, with
//! `trust` authentication for the role `wasmstate`. PostgreSQL refuses to
//! run as root, so under root the cluster belongs to the `postgres` user
//! and its programs run as that user (`setpriv`, which execs: killing it
//! kills the server).

use super::process::Helper;
use super::tempdir;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// How long a cluster may take to start.
const START_DEADLINE: Duration = Duration::from_secs(60);

/// A running PostgreSQL server; stopped when dropped.
pub struct Postgres {
    _helper: Helper,
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    _dir: tempfile::TempDir,
}

/// The directory of PostgreSQL's server programs (installing Debian's
/// `postgresql` when there is none), checked to be version 13 or later.
fn bin_dir() -> PathBuf {
    static FOUND: std::sync::OnceLock<Result<PathBuf, String>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let dir = match find_bin_dir() {
                Some(dir) => dir,
                None => {
                    eprintln!("PostgreSQL's server is missing: installing Debian's postgresql");
                    super::tools::apt_install("postgresql")?;
                    find_bin_dir().ok_or("postgresql is installed but its server programs are not under /usr/lib/postgresql")?
                }
            };
            let out = Command::new(dir.join("postgres"))
                .arg("--version")
                .output()
                .map_err(|e| format!("{}/postgres does not run: {e}", dir.display()))?;
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            let major: u32 = text
                .split_whitespace()
                .find_map(|w| w.split('.').next()?.parse().ok())
                .unwrap_or(0);
            if major < 13 {
                return Err(format!(
                    "PostgreSQL {} is older than the 13 the tests need (Terraform's pg backend's SQL); `postgres --version` said {text:?}",
                    major
                ));
            }
            Ok(dir)
        })
        .clone()
        .unwrap_or_else(|why| panic!("{why}"))
}

/// Where `postgres` on the PATH really is, else the newest of Debian's
/// `/usr/lib/postgresql/*/bin`.
fn find_bin_dir() -> Option<PathBuf> {
    if let Ok(out) = Command::new("sh")
        .args(["-c", "command -v postgres"])
        .output()
        && out.status.success()
    {
        let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        if let Some(dir) = std::fs::canonicalize(&path)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            return Some(dir);
        }
    }
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.flatten()
                .map(|e| e.path().join("bin"))
                .filter(|p| p.join("postgres").exists())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    dirs.pop()
}

fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program` from `bin`, as the `postgres` user when this runs as root.
fn command(bin: &Path, program: &str) -> Command {
    if running_as_root() {
        let mut command = Command::new("setpriv");
        command
            .args([
                "--reuid=postgres",
                "--regid=postgres",
                "--init-groups",
                "--",
            ])
            .arg(bin.join(program));
        command
    } else {
        Command::new(bin.join(program))
    }
}

impl Postgres {
    /// A fresh cluster, started and accepting connections.
    pub fn start() -> Postgres {
        let bin = bin_dir();
        let dir = tempdir();
        if running_as_root() {
            let chown = Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap();
            assert!(
                chown.success(),
                "cannot give {} to the postgres user",
                dir.path().display()
            );
        }
        let data = dir.path().join("data");
        let init = command(&bin, "initdb")
            .args(["-A", "trust", "-U", "wasmstate", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            init.status.success(),
            "initdb failed: {}{}",
            String::from_utf8_lossy(&init.stdout),
            String::from_utf8_lossy(&init.stderr)
        );
        let socket_dir = dir.path().to_path_buf();
        let (helper, ports) = Helper::start_on_free_ports(
            "postgres",
            1,
            "accepting connections",
            START_DEADLINE,
            |ports: &[u16]| {
                let mut server = command(&bin, "postgres");
                server
                    .arg("-D")
                    .arg(&data)
                    .args(["-p", &ports[0].to_string(), "-k"])
                    .arg(&socket_dir)
                    .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
                    .args(["-c", "max_connections=200"]);
                server
            },
            |ports: &[u16]| {
                Command::new("psql")
                    .args(["-h", "127.0.0.1", "-p", &ports[0].to_string()])
                    .args(["-U", "wasmstate", "-d", "postgres", "-Atc", "select 1"])
                    .output()
                    .is_ok_and(|o| o.status.success())
            },
        );
        Postgres {
            _helper: helper,
            port: ports[0],
            _dir: dir,
        }
    }

    /// A connection string, as Terraform's `conn_str` takes one.
    pub fn conn_str(&self) -> String {
        format!(
            "postgres://wasmstate@127.0.0.1:{}/postgres?sslmode=disable",
            self.port
        )
    }

    /// Run `sql` with psql; its rows, `|`-separated, one per line.
    pub fn query(&self, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args([
                "-U",
                "wasmstate",
                "-d",
                "postgres",
                "-v",
                "ON_ERROR_STOP=1",
                "-Atc",
                sql,
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "psql {sql:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    }
}
