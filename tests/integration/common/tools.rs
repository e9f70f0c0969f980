//! The external programs the tests drive, installed by the project's own
//! files and checked for the version the tests need. Presence proves
//! nothing: a machine image's older moto once failed every AWS test after a
//! minute each, without a word about why.
//!
//! - Python tools come from `tests/tools/requirements.txt` (every package
//!   pinned) in a virtual environment under `target/tmp/tools/`, made once
//!   per version of that file. The machine's global Python packages neither
//!   break the tests nor get changed by them.
//! - Debian programs are installed with apt-get when missing, then their
//!   `--version` is checked against the oldest version the tests work with.
//! - `terraform` and `git` come with the machine image; only checked.
//!
//! Every failure is one line naming the tool, what was found and what to do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, OnceLock};

/// A program from the system (the machine image or Debian's packages) and
/// the oldest version the tests work with.
pub struct SystemTool {
    /// The command.
    pub binary: &'static str,
    /// The Debian package that provides it; `None`: the machine image's.
    pub package: Option<&'static str>,
    /// Arguments that make it print its version.
    pub version_args: &'static [&'static str],
    /// The oldest version the tests work with…
    pub minimum: &'static str,
    /// …and what they need from it.
    pub needed_for: &'static str,
}

/// etcd, for the example etcd guest.
pub const ETCD: SystemTool = SystemTool {
    binary: "etcd",
    package: Some("etcd-server"),
    version_args: &["--version"],
    minimum: "3.4",
    needed_for: "the v3 JSON gateway at /v3/",
};

/// lighttpd, serving `git http-backend` behind HTTP Basic.
pub const LIGHTTPD: SystemTool = SystemTool {
    binary: "lighttpd",
    package: Some("lighttpd"),
    version_args: &["-v"],
    minimum: "1.4.46",
    needed_for: "mod_authn_file",
};

/// strace, to see which files and directories the server syncs.
pub const STRACE: SystemTool = SystemTool {
    binary: "strace",
    package: Some("strace"),
    version_args: &["-V"],
    minimum: "5.0",
    needed_for: "-y (paths of file descriptors)",
};

/// An OCI registry (distribution v2).
pub const DOCKER_REGISTRY: SystemTool = SystemTool {
    binary: "docker-registry",
    package: Some("docker-registry"),
    version_args: &["--version"],
    minimum: "2.8",
    needed_for: "OCI artifacts with custom media types",
};

/// Chromium, the browser the console's tests drive (headless).
pub const CHROMIUM: SystemTool = SystemTool {
    binary: "chromium",
    package: Some("chromium"),
    version_args: &["--version"],
    minimum: "120",
    needed_for: "headless mode and the WebDriver protocol",
};

/// ChromeDriver, the WebDriver server for Chromium (same version).
pub const CHROMEDRIVER: SystemTool = SystemTool {
    binary: "chromedriver",
    package: Some("chromium-driver"),
    version_args: &["--version"],
    minimum: "120",
    needed_for: "driving Chromium from selenium",
};

/// Terraform, the client everything is for.
pub const TERRAFORM: SystemTool = SystemTool {
    binary: "terraform",
    package: None,
    version_args: &["version"],
    minimum: "1.10",
    needed_for: "the s3 backend's use_lockfile, in the interoperability tests",
};

/// git, for remotes (`git daemon`, `git http-backend`) and checks.
pub const GIT: SystemTool = SystemTool {
    binary: "git",
    package: None,
    version_args: &["--version"],
    minimum: "2.28",
    needed_for: "init --initial-branch",
};

/// Make sure `tool` is on the PATH at a version the tests work with,
/// installing its Debian package when it is missing; its version. Each
/// tool is checked once per test process; one install runs at a time.
pub fn require(tool: &SystemTool) -> String {
    static CHECKED: Mutex<Option<HashMap<&'static str, Result<String, String>>>> = Mutex::new(None);
    let mut checked = CHECKED.lock().unwrap_or_else(|e| e.into_inner());
    let result = checked
        .get_or_insert_with(HashMap::new)
        .entry(tool.binary)
        .or_insert_with(|| check_or_install(tool))
        .clone();
    result.unwrap_or_else(|cause| panic!("{cause}"))
}

/// Install Debian's `package`; `Err` says why not, in one line.
pub fn apt_install(package: &str) -> Result<(), String> {
    let install = format!(
        "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq {package}"
    );
    let out = run_quietly(Command::new("sh").args(["-c", &install]));
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`apt-get install {package}` failed ({}): {}",
            out.status,
            last_line(&out)
        ))
    }
}

fn check_or_install(tool: &SystemTool) -> Result<String, String> {
    if version_of(tool).is_none() {
        let Some(package) = tool.package else {
            return Err(format!(
                "{} is not on the PATH; the tests need {} >= {} ({}), which comes with the machine image",
                tool.binary, tool.binary, tool.minimum, tool.needed_for
            ));
        };
        eprintln!("{} is missing: installing Debian's {package}", tool.binary);
        apt_install(package).map_err(|why| format!("{} is missing and {why}", tool.binary))?;
    }
    let (version, text) = version_of(tool).ok_or_else(|| {
        format!(
            "{} does not run or prints no version after installing it; check `{} {}`",
            tool.binary,
            tool.binary,
            tool.version_args.join(" ")
        )
    })?;
    if !at_least(&version, tool.minimum) {
        let fix = match tool.package {
            Some(package) => format!("upgrade the {package} package"),
            None => "upgrade it on this machine".to_string(),
        };
        return Err(format!(
            "{} {version} is older than the {} the tests need ({}; `{} {}` said {:?}); {fix}",
            tool.binary,
            tool.minimum,
            tool.needed_for,
            tool.binary,
            tool.version_args.join(" "),
            text.lines().next().unwrap_or_default()
        ));
    }
    Ok(version)
}

/// The version `tool` prints, and the text it was read from; `None` when
/// the command does not run or prints no version number.
fn version_of(tool: &SystemTool) -> Option<(String, String)> {
    let out = Command::new(tool.binary)
        .args(tool.version_args)
        .output()
        .ok()?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    Some((first_version(&text)?, text))
}

/// The first `N.N[.N…]` in `text` (`Terraform v1.11.4` → `1.11.4`).
pub fn first_version(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    (0..bytes.len()).find_map(|start| {
        if !bytes[start].is_ascii_digit() || (start > 0 && bytes[start - 1].is_ascii_digit()) {
            return None;
        }
        let end = start
            + text[start..]
                .find(|c: char| !c.is_ascii_digit() && c != '.')
                .unwrap_or(text.len() - start);
        let candidate = text[start..end].trim_end_matches('.');
        candidate.contains('.').then(|| candidate.to_string())
    })
}

/// Whether dotted version `version` is `minimum` or newer.
pub fn at_least(version: &str, minimum: &str) -> bool {
    let parse = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    let (mut have, mut need) = (parse(version), parse(minimum));
    let len = have.len().max(need.len());
    have.resize(len, 0);
    need.resize(len, 0);
    have >= need
}

/// The tests' pinned Python packages.
const REQUIREMENTS: &str = include_str!("../../tools/requirements.txt");

/// The project's Python environment for test tools.
pub struct PythonEnv {
    dir: PathBuf,
}

impl PythonEnv {
    /// Its interpreter.
    pub fn python(&self) -> PathBuf {
        self.dir.join("bin").join("python")
    }

    /// Where it lives.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The Python environment of `tests/tools/requirements.txt`, made (once per
/// version of that file, under a lock shared by every test process) and
/// checked against the pins.
pub fn python_env() -> &'static PythonEnv {
    static ENV: OnceLock<Result<PythonEnv, String>> = OnceLock::new();
    ENV.get_or_init(make_python_env)
        .as_ref()
        .unwrap_or_else(|cause| panic!("{cause}"))
}

fn make_python_env() -> Result<PythonEnv, String> {
    let dir = tool_dir(
        "python",
        REQUIREMENTS,
        |dir| {
            eprintln!(
                "making the tests' Python environment {} from tests/tools/requirements.txt",
                dir.display()
            );
            let python = Command::new("python3").arg("--version").output();
            let version = python
                .ok()
                .and_then(|o| first_version(&String::from_utf8_lossy(&o.stdout)))
                .ok_or("python3 is not on the PATH; the tests need Python >= 3.9 for moto")?;
            if !at_least(&version, "3.9") {
                return Err(format!(
                    "python3 {version} is older than the 3.9 the tests' moto needs; install a newer Python"
                ));
            }
            step(
                "python3 -m venv",
                Command::new("python3").arg("-m").arg("venv").arg(dir),
            )?;
            let requirements = dir.join("requirements.txt");
            std::fs::write(&requirements, REQUIREMENTS)
                .map_err(|e| format!("cannot write {}: {e}", requirements.display()))?;
            step(
                "pip install -r tests/tools/requirements.txt",
                Command::new(dir.join("bin").join("python"))
                    .args(["-m", "pip", "install", "--disable-pip-version-check"])
                    .args(["--no-input", "--quiet", "-r"])
                    .arg(&requirements),
            )
        },
        |dir| {
            check_pins(&PythonEnv {
                dir: dir.to_path_buf(),
            })
        },
    )?;
    Ok(PythonEnv { dir })
}

/// A folder of test tools under `target/tmp/tools`, named for the digest
/// of `pins` (the file that pins them), made by `make` once per version of
/// that file and checked by `check` every time. Test binaries and
/// benchmarks may start at once: one makes it under a lock, the others
/// wait; a folder half-made by an interrupted run is made again.
pub fn tool_dir(
    prefix: &str,
    pins: &str,
    make: impl FnOnce(&Path) -> Result<(), String>,
    check: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<PathBuf, String> {
    use sha2::Digest;
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tools");
    std::fs::create_dir_all(&root).map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    let digest = hex::encode(sha2::Sha256::digest(pins));
    let dir = root.join(format!("{prefix}-{}", &digest[..12]));
    let ready = dir.join(".ready");
    let lock = std::fs::File::create(root.join(".lock"))
        .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
    lock.lock()
        .map_err(|e| format!("cannot lock {}: {e}", root.display()))?;
    if !ready.exists() {
        let _ = std::fs::remove_dir_all(&dir);
        make(&dir)?;
    }
    check(&dir)?;
    std::fs::write(&ready, &digest)
        .map_err(|e| format!("cannot write {}: {e}", ready.display()))?;
    Ok(dir)
}

/// Every `name==version` of the requirements is what the environment holds.
fn check_pins(env: &PythonEnv) -> Result<(), String> {
    let pins: Vec<(&str, &str)> = REQUIREMENTS
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once("=="))
        .collect();
    let script = "import sys, importlib.metadata as m\n\
        for name in sys.argv[1:]:\n\
        \x20   try: print(name, m.version(name))\n\
        \x20   except m.PackageNotFoundError: print(name, 'missing')\n";
    let out = Command::new(env.python())
        .arg("-c")
        .arg(script)
        .args(pins.iter().map(|(name, _)| name))
        .output()
        .map_err(|e| format!("cannot run {}: {e}", env.python().display()))?;
    if !out.status.success() {
        return Err(format!(
            "the tests' Python environment {} is broken ({}): {}; delete it and run the tests again",
            env.dir.display(),
            out.status,
            last_line(&out)
        ));
    }
    let installed = String::from_utf8_lossy(&out.stdout);
    for ((name, pinned), line) in pins.iter().zip(installed.lines()) {
        let have = line.split_once(' ').map_or("?", |(_, v)| v);
        if have != *pinned {
            return Err(format!(
                "{name} {have} is installed in {}, but tests/tools/requirements.txt pins {pinned}; delete that folder and run the tests again",
                env.dir.display()
            ));
        }
    }
    Ok(())
}

/// The JavaScript guest template's npm packages, pinned by its lockfile.
const JS_PACKAGE: &str = include_str!("../../../host/templates/js/package.json");
const JS_LOCK: &str = include_str!("../../../host/templates/js/package-lock.json");
/// The componentize-js version the template pins (and the harness checks).
pub const COMPONENTIZE_JS: &str = "0.23.0";

/// The JavaScript template's `node_modules` (componentize-js and what it
/// needs), installed once per version of its lockfile, under
/// the same lock as the Python environment, and version-checked.
pub fn node_modules() -> &'static Path {
    static DIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    DIR.get_or_init(make_node_modules)
        .as_ref()
        .unwrap_or_else(|cause| panic!("{cause}"))
}

fn make_node_modules() -> Result<PathBuf, String> {
    let dir = tool_dir(
        "node",
        JS_LOCK,
        |dir| {
            let node = Command::new("node").arg("--version").output();
            let version = node
                .ok()
                .and_then(|o| first_version(&String::from_utf8_lossy(&o.stdout)))
                .ok_or("node is not on the PATH; the JavaScript guest tests need Node.js >= 18 and npm")?;
            if !at_least(&version, "18") {
                return Err(format!(
                    "node {version} is older than the 18 componentize-js needs"
                ));
            }
            eprintln!(
                "installing the JavaScript template's packages into {}",
                dir.display()
            );
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
            for (name, text) in [("package.json", JS_PACKAGE), ("package-lock.json", JS_LOCK)] {
                std::fs::write(
                    dir.join(name),
                    text.replace("{{guest-name}}", "wasmstate-template-tools"),
                )
                .map_err(|e| format!("cannot write {name}: {e}"))?;
            }
            // `npm install`, not `npm ci`: jco-node-fs 0.3.2 names optional
            // platform packages that were never published, which `npm ci`
            // refuses as a lockfile out of sync; install keeps the lock's pins.
            step(
                "npm install (host/templates/js/package-lock.json)",
                Command::new("npm")
                    .args(["install", "--no-audit", "--no-fund", "--loglevel=error"])
                    .current_dir(dir),
            )
        },
        |dir| {
            let installed = dir.join("node_modules/@bytecodealliance/componentize-js/package.json");
            let text = std::fs::read_to_string(&installed).map_err(|e| {
                format!(
                    "{}: {e}; delete {} and run the tests again",
                    installed.display(),
                    dir.display()
                )
            })?;
            let have: serde_json::Value = serde_json::from_str(&text).map_err(|e| e.to_string())?;
            if have["version"] == COMPONENTIZE_JS {
                return Ok(());
            }
            Err(format!(
                "componentize-js {} is installed in {}, but the template pins {COMPONENTIZE_JS}; delete that folder and run the tests again",
                have["version"],
                dir.display()
            ))
        },
    )?;
    Ok(dir.join("node_modules"))
}

/// Run one step of making an environment; its last output line on failure.
fn step(what: &str, command: &mut Command) -> Result<(), String> {
    let out = run_quietly(command);
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{what} failed ({}): {}",
            out.status,
            last_line(&out)
        ))
    }
}

fn run_quietly(command: &mut Command) -> Output {
    command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"))
}

/// The last line of a failed command's output that says something: its
/// error, usually.
fn last_line(out: &Output) -> String {
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    lines
        .iter()
        .rev()
        .find(|l| l.starts_with("ERROR") || l.starts_with("E:") || l.starts_with("error"))
        .or(lines.last())
        .map_or_else(|| "(no output)".to_string(), |l| l.to_string())
}

#[cfg(test)]
mod tests {
    use super::{at_least, first_version};

    #[test]
    fn versions_are_read_from_what_tools_print() {
        assert_eq!(
            first_version("Terraform v1.11.4\non linux").as_deref(),
            Some("1.11.4")
        );
        assert_eq!(
            first_version("etcd Version: 3.4.23\nGit SHA: Not provided").as_deref(),
            Some("3.4.23")
        );
        assert_eq!(
            first_version("lighttpd/1.4.69 (ssl) - a light and fast webserver").as_deref(),
            Some("1.4.69")
        );
        assert_eq!(
            first_version("docker-registry github.com/docker/distribution 2.8.2+ds1").as_deref(),
            Some("2.8.2")
        );
        assert_eq!(first_version("no version here 42"), None);
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(at_least("1.11.4", "1.10"));
        assert!(at_least("3.4", "3.4.0"));
        assert!(!at_least("1.9.8", "1.10"));
        assert!(!at_least("5.2.1", "5.2.5"));
    }
}
