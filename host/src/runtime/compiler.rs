//! Compiling a guest in a child process. Cranelift's working memory (about
//! 330 MiB for a JavaScript guest) stays with the process that compiled:
//! glibc keeps freed arenas, and even `malloc_trim` hands back only part
//! of it (measured in docs/benchmarks.md). So a server whose compile cache
//! is empty (a new pod) re-executes its own binary with a hidden first
//! argument; the child builds the engine from the same
//! [`EngineSettings`], compiles, writes the cache entry (atomically, with
//! the host's MAC) and exits, and the server loads the entry as on a warm
//! start.
//!
//! The cache key goes to the child on its stdin, never in its arguments
//! or environment (which other local users can read in `/proc`), followed
//! by the guest's bytes.

use super::cache::{self, CacheKey};
use super::engine::EngineSettings;
use anyhow::Context;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use wasmtime::Engine;
use wasmtime::component::Component;

/// The hidden first argument that makes `wasmstate` a compiler child.
const SUBCOMMAND: &str = "__compile-guest";

/// The child's exit status when it compiled but could not write the cache.
const CANNOT_CACHE: u8 = 3;

/// Whether this process is the `wasmstate` binary (it called
/// [`child_main_if_asked`] first thing), which can re-execute itself as a
/// compiler child. A library user or a test binary cannot.
static CAN_REEXEC: AtomicBool = AtomicBool::new(false);

/// What became of a compilation handed to a child.
pub(super) enum Child {
    /// The cache entry is written.
    Compiled,
    /// No child could be started: why.
    Unavailable(String),
    /// The child compiled but could not write the cache: why, and the
    /// compiled bytes it sent on its stdout instead (empty when it could
    /// not send them either).
    CannotCache(String, Vec<u8>),
}

/// Run as a compiler child when this process was started as one (its
/// first argument is the hidden subcommand): compile, write the cache
/// entry, and return the exit code. Otherwise mark this process as able to
/// start such children and return `None`. `main` calls this first.
pub fn child_main_if_asked() -> Option<ExitCode> {
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(SUBCOMMAND.as_ref()) {
        CAN_REEXEC.store(true, Ordering::Relaxed);
        return None;
    }
    let args: Vec<OsString> = args.collect();
    Some(match child(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::CannotCache(e, artifact)) => {
            // The server takes the machine code from here instead, so it
            // need not compile (and keep the compiler's memory) itself.
            let sent = std::io::stdout()
                .lock()
                .write_all(&artifact)
                .and_then(|()| std::io::stdout().lock().flush());
            match sent {
                Ok(()) => eprintln!("cannot write the compile cache: {e:#}"),
                Err(s) => eprintln!("cannot write the compile cache: {e:#}; nor send it: {s}"),
            }
            ExitCode::from(CANNOT_CACHE)
        }
        Err(Failure::Other(e)) => {
            // Read by the server, which puts it in its own error.
            eprintln!("{e:#}");
            ExitCode::FAILURE
        }
    })
}

enum Failure {
    /// Compiled, but the entry could not be written: why, and the bytes.
    CannotCache(anyhow::Error, Vec<u8>),
    Other(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Failure {
        Failure::Other(e)
    }
}

/// The child's arguments, in order, for `settings`, `dir` and `sha256`.
fn arguments(settings: &EngineSettings, dir: &Path, sha256: &str) -> Vec<OsString> {
    vec![
        SUBCOMMAND.into(),
        dir.into(),
        sha256.into(),
        settings.max_instances.to_string().into(),
        settings.max_memory_bytes.to_string().into(),
        u8::from(settings.swap_possible).to_string().into(),
    ]
}

/// The cache directory, digest and engine settings a child was given.
fn parse(args: &[OsString]) -> anyhow::Result<(PathBuf, String, EngineSettings)> {
    let [dir, sha256, instances, memory, swap] = args else {
        anyhow::bail!(
            "{SUBCOMMAND} is internal: the server starts it with 5 arguments, not {}",
            args.len()
        );
    };
    let text = |arg: &OsString| {
        arg.to_str()
            .map(str::to_owned)
            .context("an argument is not UTF-8")
    };
    let settings = EngineSettings {
        max_instances: text(instances)?.parse().context("max_instances")?,
        max_memory_bytes: text(memory)?.parse().context("max_memory_bytes")?,
        swap_possible: match text(swap)?.as_str() {
            "0" => false,
            "1" => true,
            other => anyhow::bail!("swap_possible must be 0 or 1, not {other:?}"),
        },
    };
    Ok((PathBuf::from(dir), text(sha256)?, settings))
}

/// The child: read the key and the guest from stdin, compile with an
/// engine built as the server's is, write the cache entry.
fn child(args: &[OsString]) -> Result<(), Failure> {
    let (dir, sha256, settings) = parse(args)?;
    let mut input = Vec::new();
    std::io::stdin()
        .read_to_end(&mut input)
        .context("cannot read the guest from stdin")?;
    let Some((key, wasm)) = input.split_first_chunk::<32>() else {
        return Err(anyhow::anyhow!("stdin holds no cache key").into());
    };
    if crate::digest::sha256_hex(wasm) != sha256 {
        return Err(anyhow::anyhow!("the guest on stdin does not have digest {sha256}").into());
    }
    let engine = settings.build()?;
    let artifact = cache::precompile(&engine, wasm)?;
    let path = cache::artifact_path(&engine, &sha256, &dir);
    cache::store(&path, &sha256, &artifact, &CacheKey::from_bytes(*key))
        .map_err(|e| Failure::CannotCache(e, artifact))
}

/// The binary to re-execute: `/proc/self/exe` names this process's own
/// image even after an upgrade replaced the file on disk.
fn own_binary() -> std::io::Result<PathBuf> {
    let proc = Path::new("/proc/self/exe");
    if proc.exists() {
        return Ok(proc.to_path_buf());
    }
    std::env::current_exe()
}

/// Compile `wasm` (digest `sha256`) in a child process that writes its
/// cache entry under `dir`. An error is a guest the child could not
/// compile (or a child that died), with the child's own message.
fn in_child(
    settings: &EngineSettings,
    wasm: &[u8],
    sha256: &str,
    dir: &Path,
    key: &CacheKey,
) -> anyhow::Result<Child> {
    if !CAN_REEXEC.load(Ordering::Relaxed) {
        return Ok(Child::Unavailable(
            "this process is not the wasmstate binary".into(),
        ));
    }
    let started = std::time::Instant::now();
    let binary = match own_binary() {
        Ok(binary) => binary,
        Err(e) => return Ok(Child::Unavailable(format!("cannot find its binary: {e}"))),
    };
    let mut command = Command::new(&binary);
    command
        .args(arguments(settings, dir, sha256))
        .stdin(Stdio::piped())
        // Only a child that cannot cache writes here: the compiled bytes.
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    dies_with_this_process(&mut command);
    let spawned = command.spawn();
    let mut process = match spawned {
        Ok(process) => process,
        Err(e) => return Ok(Child::Unavailable(format!("{}: {e}", binary.display()))),
    };
    // A child that stops reading has failed; its stderr says why, so a
    // broken pipe here is left for the exit status to report.
    if let Some(mut stdin) = process.stdin.take() {
        let _ = stdin
            .write_all(key.bytes())
            .and_then(|()| stdin.write_all(wasm));
    }
    let output = process
        .wait_with_output()
        .context("cannot wait for the compiler process")?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said = one_line(&stderr);
    match output.status.code() {
        Some(0) => {
            tracing::info!(
                sha256,
                ms = started.elapsed().as_millis() as u64,
                "compiled guest in a child process"
            );
            Ok(Child::Compiled)
        }
        Some(code) if code == i32::from(CANNOT_CACHE) => {
            Ok(Child::CannotCache(said, output.stdout))
        }
        _ => anyhow::bail!("the compiler process failed ({}): {said}", output.status),
    }
}

/// Compile `wasm` (whose digest is `sha256`) for `engine` (built from
/// `settings`), or load its cached compilation from `dir` if it carries
/// `key`'s MAC. A miss is compiled in a child process; only where no child
/// can be started, or it cannot write the cache, is it compiled here (and
/// the log says so). A cache that cannot be read or written only costs
/// time: it is reported and bypassed. A guest the child cannot compile is
/// an error carrying the child's own message.
pub fn compile(
    engine: &Engine,
    settings: &EngineSettings,
    wasm: &[u8],
    sha256: &str,
    dir: &Path,
    key: &CacheKey,
) -> anyhow::Result<Component> {
    let path = cache::artifact_path(engine, sha256, dir);
    if let Some(component) = cache::load(engine, &path, sha256, key) {
        return Ok(component);
    }
    match in_child(settings, wasm, sha256, dir, key)? {
        Child::Compiled => {
            if let Some(component) = cache::load(engine, &path, sha256, key) {
                return Ok(component);
            }
            tracing::warn!(
                path = %path.display(),
                "the compiler process's cache entry cannot be loaded (replaced meanwhile?): compiling in this process"
            );
        }
        Child::Unavailable(why) => tracing::warn!(
            "cannot start a compiler process ({why}): compiling in this process, which keeps the memory the compiler used"
        ),
        Child::CannotCache(why, artifact) => {
            if !artifact.is_empty() {
                // SAFETY: `deserialize` trusts its input to be wasmtime's
                // own output: these bytes come over a pipe from this very
                // binary (`/proc/self/exe`), which compiled them from
                // `wasm` with an engine built from the same settings.
                #[allow(unsafe_code)]
                match unsafe { Component::deserialize(engine, &artifact) } {
                    Ok(component) => {
                        tracing::warn!(
                            path = %path.display(),
                            "could not cache compiled guest ({why}): using the compiler process's output, so the next start compiles again"
                        );
                        return Ok(component);
                    }
                    Err(e) => tracing::warn!(
                        "the compiler process's output is unusable ({e:#}): compiling in this process"
                    ),
                }
            } else {
                tracing::warn!(
                    path = %path.display(),
                    "could not cache compiled guest ({why}): compiling in this process, which keeps the memory the compiler used"
                );
            }
        }
    }
    compile_here(engine, wasm, sha256, &path, key)
}

/// Compile in this process, caching the result at `path` when possible.
fn compile_here(
    engine: &Engine,
    wasm: &[u8],
    sha256: &str,
    path: &Path,
    key: &CacheKey,
) -> anyhow::Result<Component> {
    let artifact = cache::precompile(engine, wasm)?;
    if let Err(e) = cache::store(path, sha256, &artifact, key) {
        tracing::warn!(path = %path.display(), "could not cache compiled guest: {e:#}");
    }
    // SAFETY: `artifact` was produced by `precompile_component` just above.
    #[allow(unsafe_code)]
    let component = unsafe { Component::deserialize(engine, &artifact) }?;
    Ok(component)
}

/// Have the kernel kill the child when the thread that starts it ends:
/// a server killed mid-start (a restart, an operator's `kill -9`) would
/// otherwise leave an orphan compiling for seconds, holding the compiler's
/// memory beside the restarted server's own child. That thread waits for
/// the child ([`in_child`]), so it ends first only when the process dies.
fn dies_with_this_process(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = rustix::process::getpid();
    // SAFETY: runs in the forked child before exec, and makes only two
    // system calls (async-signal-safe, no allocation, no lock).
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
            // The parent died before the signal was asked for: it will
            // never come, so give up now.
            if rustix::process::getppid() != Some(parent) {
                return Err(std::io::ErrorKind::BrokenPipe.into());
            }
            Ok(())
        });
    }
}

/// The child's stderr on one line, its end kept when long.
fn one_line(stderr: &str) -> String {
    const MOST: usize = 2000;
    let line = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ");
    if line.is_empty() {
        return "(no output)".into();
    }
    match line.char_indices().rev().nth(MOST) {
        Some((at, _)) => format!("…{}", &line[at..]),
        None => line,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_child_builds_its_engine_from_the_same_settings() {
        for swap_possible in [false, true] {
            let settings = EngineSettings {
                max_instances: 129,
                max_memory_bytes: 5 << 30,
                swap_possible,
            };
            let args = arguments(&settings, Path::new("/var/cache/w s"), "ab12");
            assert_eq!(args[0], SUBCOMMAND);
            let (dir, sha256, parsed) = parse(&args[1..]).unwrap();
            assert_eq!(parsed, settings);
            assert_eq!(dir, Path::new("/var/cache/w s"));
            assert_eq!(sha256, "ab12");
        }
        assert!(parse(&[]).is_err());
    }

    #[test]
    fn the_childs_message_is_one_line_and_bounded() {
        assert_eq!(one_line("error: a\n\n  b\n"), "error: a | b");
        assert_eq!(one_line(""), "(no output)");
        let long = "x".repeat(5000);
        assert!(one_line(&long).chars().count() <= 2002);
    }
}

#[cfg(test)]
mod cache_tests {
    //! The cache as `compile` uses it: hits, corrupt and foreign entries.
    use super::cache::{artifact_path, vouched};
    use super::*;
    use wasmtime::Engine;

    fn settings() -> EngineSettings {
        EngineSettings {
            max_instances: 2,
            max_memory_bytes: 64 << 20,
            swap_possible: false,
        }
    }

    fn engine() -> Engine {
        settings().build().unwrap()
    }

    fn key() -> CacheKey {
        CacheKey::from_bytes([7; 32])
    }

    fn digest() -> String {
        crate::digest::sha256_hex(local_guest())
    }

    fn local_guest() -> &'static [u8] {
        crate::guests::embedded("local").unwrap().wasm
    }

    #[test]
    fn a_second_load_maps_the_cached_artifact() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        compile(
            &engine,
            &settings(),
            local_guest(),
            &digest(),
            dir.path(),
            &key(),
        )
        .unwrap();
        let path = artifact_path(&engine, &digest(), dir.path());
        let first = std::fs::metadata(&path).unwrap().modified().unwrap();

        compile(
            &engine,
            &settings(),
            local_guest(),
            &digest(),
            dir.path(),
            &key(),
        )
        .unwrap();
        let second = std::fs::metadata(&path).unwrap().modified().unwrap();
        assert_eq!(
            first, second,
            "a cache hit must not compile and write again"
        );
        assert!(
            path.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&digest())
        );
    }

    #[test]
    fn a_corrupt_artifact_is_replaced_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        let path = artifact_path(&engine, &digest(), dir.path());
        std::fs::write(&path, b"not machine code").unwrap();
        compile(
            &engine,
            &settings(),
            local_guest(),
            &digest(),
            dir.path(),
            &key(),
        )
        .unwrap();
        assert_ne!(std::fs::read(&path).unwrap(), b"not machine code");
    }

    #[test]
    fn an_entry_without_our_mac_is_compiled_again_never_run() {
        let dir = tempfile::tempdir().unwrap();
        let engine = engine();
        compile(
            &engine,
            &settings(),
            local_guest(),
            &digest(),
            dir.path(),
            &key(),
        )
        .unwrap();
        let path = artifact_path(&engine, &digest(), dir.path());
        let ours = std::fs::read(&path).unwrap();
        // Another host's key: its MAC does not verify, so the entry is
        // replaced by a fresh compilation (with a MAC that does).
        compile(
            &engine,
            &settings(),
            local_guest(),
            &digest(),
            dir.path(),
            &CacheKey::from_bytes([9; 32]),
        )
        .unwrap();
        assert!(vouched(&path, &digest(), &CacheKey::from_bytes([9; 32])).is_some());
        assert!(vouched(&path, &digest(), &key()).is_none());
        // The same bytes claimed for another component are not vouched for.
        std::fs::write(&path, &ours).unwrap();
        assert!(vouched(&path, "another-digest", &key()).is_none());
    }

    #[test]
    fn garbage_is_refused_with_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = compile(
            &engine(),
            &settings(),
            b"\0asm garbage",
            "garbage",
            dir.path(),
            &key(),
        )
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("not a valid WebAssembly component"),
            "{err:#}"
        );
    }
}
