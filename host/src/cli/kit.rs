//! The guest author's two measuring commands, which load a guest the way
//! `serve` does and grant it what their flags say: `wasmstate guest test`
//! (the conformance kit) and `wasmstate guest bench` (latency per state
//! size and the guest's peak memory, storage-level, without HTTP).

use crate::backend::Storage;
use crate::config::{GuestSource, Limits};
use crate::conformance::{GuestUnderTest, load_guest, run_guest};
use crate::policy::Origin;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The kit's memory cap without a manifest: what the templates ask for.
const WITHOUT_MANIFEST_MIB: u64 = 64;

/// What a guest under test or bench is, and what it is granted.
#[derive(Debug, clap::Args)]
pub struct GuestArgs {
    /// An embedded guest (`local`) or a path to a `.wasm` component.
    guest: String,
    /// Configuration handed to the guest (repeatable).
    #[arg(long = "config", value_name = "KEY=VALUE")]
    config: Vec<String>,
    /// Directory granted to the guest at /data [default: a fresh
    /// temporary directory].
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Origin the guest may send HTTP requests to, e.g.
    /// http://127.0.0.1:2379 (repeatable).
    #[arg(long = "allow-http", value_name = "ORIGIN")]
    allow_http: Vec<String>,
    /// Origin whose requests the host signs with AWS credentials from
    /// the --config credential settings (repeatable; the embedded AWS
    /// guests: all of theirs).
    #[arg(long = "aws-sign", value_name = "ORIGIN")]
    aws_sign: Vec<String>,
    /// Git repository URL the guest may use through the host (repeatable;
    /// the embedded git guest gets its --config repository=URL).
    #[arg(long = "allow-git", value_name = "URL")]
    allow_git: Vec<String>,
    /// Ref the guest may update in those repositories, `*` within a
    /// segment, `**` across (repeatable; the embedded git guest: its
    /// branch and refs/heads/locks/**).
    #[arg(long = "git-ref", value_name = "PATTERN")]
    git_refs: Vec<String>,
    /// Path its commits may touch (repeatable; the embedded git guest:
    /// its state and lock files).
    #[arg(long = "git-path", value_name = "PATTERN")]
    git_paths: Vec<String>,
    /// Memory cap per call; the kit also round-trips a state 1 MiB larger
    /// than it [default: the memory_mib the guest's manifest asks for,
    /// else 64].
    #[arg(long)]
    memory_mib: Option<u64>,
    /// Deadline per call.
    #[arg(long, default_value_t = 30_000)]
    timeout_ms: u64,
    /// Also print the host's log lines (guest loading, the guest's own
    /// log, crashes) on stderr; WASMSTATE_LOG=LEVEL chooses them instead.
    #[arg(long, short)]
    verbose: bool,
}

impl GuestArgs {
    /// Whether the host's log lines were asked for.
    pub fn verbose(&self) -> bool {
        self.verbose
    }

    /// The guest and its grants, checked; its memory cap is printed.
    fn subject(&self) -> anyhow::Result<GuestUnderTest> {
        let source = guest_source(&self.guest)?;
        let memory_mib = self
            .memory_mib
            .unwrap_or_else(|| manifest_memory_mib(&source));
        println!("memory cap: {memory_mib} MiB per call");
        Ok(GuestUnderTest {
            guest: source,
            config: self
                .config
                .iter()
                .map(|kv| {
                    kv.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .ok_or_else(|| anyhow::anyhow!("--config {kv:?}: write KEY=VALUE"))
                })
                .collect::<Result<_, _>>()?,
            dir: self.dir.clone(),
            allow_http: origins(&self.allow_http, "--allow-http")?,
            aws_sign: origins(&self.aws_sign, "--aws-sign")?,
            allow_git: self.allow_git.clone(),
            git_refs: self.git_refs.clone(),
            git_paths: self.git_paths.clone(),
            limits: Limits {
                memory_bytes: memory_mib
                    .checked_mul(1 << 20)
                    .ok_or_else(|| anyhow::anyhow!("--memory-mib {memory_mib} is too large"))?,
                timeout: Duration::from_millis(self.timeout_ms),
            },
        })
    }
}

/// `wasmstate guest test`: the kit's report; exit status 1 on a failure.
pub async fn test(args: &GuestArgs) -> anyhow::Result<()> {
    let report = run_guest(args.subject()?).await?;
    print!("{}", report.render());
    if !report.all_passed() {
        if !args.verbose && std::env::var_os("WASMSTATE_LOG").is_none() {
            println!("(the host's log lines, with the guest's own: add --verbose)");
        }
        std::process::exit(1);
    }
    Ok(())
}

/// `wasmstate guest bench`: for each size, `runs` writes and reads of a
/// state that size (each a fresh instance, as a request is), their median
/// and slowest time, and the most linear memory one instance used.
pub async fn bench(args: &GuestArgs, sizes_kib: &[u64], runs: usize) -> anyhow::Result<()> {
    let subject = args.subject()?;
    let loaded = load_guest(&subject).await?;
    let storage = &loaded.storage;
    let max_body = loaded.max_body_bytes() as u64;
    if let Some(kib) = sizes_kib
        .iter()
        .find(|&&kib| kib.saturating_mul(1024) > max_body)
    {
        anyhow::bail!(
            "--size-kib {kib}: larger than the largest state the host takes ({} KiB, max_body_mib)",
            max_body >> 10
        );
    }
    let workspace = format!("bench-{}", crate::conformance::run_id());
    println!(
        "{runs} runs per size, each call a fresh instance (as a request is); storage-level, no HTTP"
    );
    println!(
        "{:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}",
        "state", "write median", "write max", "read median", "read max", "peak memory"
    );
    let mut result = Ok(());
    for &kib in sizes_kib {
        let state = bench_state(kib.saturating_mul(1024));
        storage.take_memory_peak();
        let (mut writes, mut reads) = (Vec::new(), Vec::new());
        for _ in 0..runs.max(1) {
            let started = Instant::now();
            if let Err(e) = storage.write(&workspace, state.clone(), None).await {
                result = Err(anyhow::anyhow!("writing {kib} KiB: {e}"));
                break;
            }
            writes.push(started.elapsed());
            let started = Instant::now();
            match storage.read(&workspace).await {
                Ok(Some(got)) if got.len() == state.len() => reads.push(started.elapsed()),
                Ok(got) => {
                    result = Err(anyhow::anyhow!(
                        "reading {kib} KiB back gave {} bytes",
                        got.map_or(0, |g| g.len())
                    ));
                    break;
                }
                Err(e) => {
                    result = Err(anyhow::anyhow!("reading {kib} KiB: {e}"));
                    break;
                }
            }
        }
        if result.is_err() {
            break;
        }
        println!(
            "{:>10}  {:>12}  {:>12}  {:>12}  {:>12}  {:>12}",
            size_label(kib),
            millis(median(&mut writes)),
            millis(writes.iter().max().copied().unwrap_or_default()),
            millis(median(&mut reads)),
            millis(reads.iter().max().copied().unwrap_or_default()),
            format!(
                "{:.1} MiB",
                storage.take_memory_peak() as f64 / (1 << 20) as f64
            ),
        );
    }
    crate::conformance::clean_up(&**storage, &workspace).await;
    result
}

/// A Terraform-shaped state of `len` bytes (the host reads its serial).
fn bench_state(len: u64) -> bytes::Bytes {
    let head = r#"{"version":4,"serial":1,"lineage":"bench","outputs":{},"resources":[],"pad":""#;
    let pad = usize::try_from(len)
        .unwrap_or(usize::MAX)
        .saturating_sub(head.len() + 2);
    let mut text = String::with_capacity(head.len() + pad + 2);
    text.push_str(head);
    text.extend(std::iter::repeat_n('x', pad));
    text.push_str("\"}");
    text.into()
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples.get(samples.len() / 2).copied().unwrap_or_default()
}

fn millis(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

fn size_label(kib: u64) -> String {
    if kib >= 1024 && kib.is_multiple_of(1024) {
        format!("{} MiB", kib / 1024)
    } else {
        format!("{kib} KiB")
    }
}

/// Origins given with `flag`, each parsed.
fn origins(given: &[String], flag: &str) -> anyhow::Result<Vec<Origin>> {
    given
        .iter()
        .map(|o| Origin::parse(o).map_err(|e| anyhow::anyhow!("{flag} {e}")))
        .collect()
}

/// The memory cap when none is given: what the guest's manifest asks for
/// (a guest should pass at what it says it needs), else 64 MiB.
fn manifest_memory_mib(source: &GuestSource) -> u64 {
    let GuestSource::File(path) = source else {
        return WITHOUT_MANIFEST_MIB;
    };
    std::fs::read(path)
        .ok()
        .and_then(|wasm| crate::marketplace::manifest::inspect(&wasm).ok())
        .and_then(|info| info.manifest)
        .and_then(|m| m.capabilities.memory_mib)
        .unwrap_or(WITHOUT_MANIFEST_MIB)
}

/// An embedded guest's name or a component file.
fn guest_source(text: &str) -> anyhow::Result<GuestSource> {
    if let Some(embedded) = crate::guests::embedded(text) {
        return Ok(GuestSource::Embedded(embedded.name));
    }
    let path = PathBuf::from(text);
    anyhow::ensure!(
        path.is_file(),
        "{text:?} is neither an embedded guest ({}) nor a component file",
        crate::guests::embedded_names().join(", ")
    );
    Ok(GuestSource::File(path))
}
