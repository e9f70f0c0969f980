//! The fault-injection checker: concurrent Terraform-like clients against
//! several hosts sharing one storage, while hosts are killed (`kill -9`)
//! and restarted, reloaded (SIGHUP) and sent bodies cut short; then a check
//! of the whole history for lost writes, older states coming back, double
//! lock holders, torn states and workspaces left stuck ([`check`]).
//!
//! Each run prints its seed; `WASMSTATE_CHAOS_SEED=N` replays the same
//! schedule of choices (which client does what, where, which fault when;
//! the threads' interleaving is the machine's). `WASMSTATE_CHAOS_SECONDS`
//! makes runs longer than the suite's short ones:
//!
//! ```sh
//! WASMSTATE_CHAOS_SECONDS=300 cargo test --release chaos -- --nocapture
//! ```

mod check;
mod clients;
mod history;

use crate::common::*;
use check::Anomaly;
use clients::{Client, Hosts};
use history::{Event, Op, Outcome, Recorder};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The backend every run writes.
const BACKEND: &str = "chaos";

/// One run: the backend's config, how many of everything, how long.
struct Setup {
    /// `[backends.chaos]` and what follows.
    config: String,
    hosts: usize,
    clients: usize,
    workspaces: usize,
    seconds: u64,
    faults: bool,
    /// Whether faults include `kill -9` (else only reloads).
    kills: bool,
    /// Every choice of the run follows from it (see [`seed`]).
    seed: u64,
    /// Environment of every host (credentials a config names by variable).
    env: Vec<(&'static str, &'static str)>,
    /// Host `i` serves `per_host[i % len]` instead of `config` (a rolling
    /// change of keys: hosts that seal with different keys).
    per_host: Vec<String>,
    /// Whether a `wasmstate state reseal` runs against random hosts all
    /// along, racing the clients.
    resealer: bool,
}

impl Setup {
    fn new(config: String) -> Setup {
        Setup {
            config,
            hosts: 3,
            clients: 6,
            workspaces: 2,
            seconds: std::env::var("WASMSTATE_CHAOS_SECONDS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(10),
            faults: true,
            kills: true,
            seed: seed(),
            env: Vec::new(),
            per_host: Vec::new(),
            resealer: false,
        }
    }
}

/// What a run did and found.
struct Report {
    seed: u64,
    events: Vec<Event>,
    faults: Vec<String>,
    anomalies: Vec<Anomaly>,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unknown = self
            .events
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Unknown(_)))
            .count();
        let acknowledged = self
            .events
            .iter()
            .filter(|e| matches!(e.op, Op::Post(_)) && e.outcome.is(200))
            .count();
        writeln!(
            f,
            "seed {} (replay: WASMSTATE_CHAOS_SEED={}): {} operations ({acknowledged} writes acknowledged, {unknown} without an answer), {} faults, {} anomalies",
            self.seed,
            self.seed,
            self.events.len(),
            self.faults.len(),
            self.anomalies.len()
        )?;
        for anomaly in self.anomalies.iter().take(5) {
            writeln!(f, "\nANOMALY: {}", anomaly.what)?;
            for event in context(&self.events, anomaly) {
                let mark = if anomaly.events.contains(&event.index) {
                    ">>"
                } else {
                    "  "
                };
                writeln!(f, "{mark} {event}")?;
            }
        }
        Ok(())
    }
}

/// The events of an anomaly's workspace around it: from shortly before
/// the first involved event began to its last one's end.
fn context<'a>(events: &'a [Event], anomaly: &Anomaly) -> Vec<&'a Event> {
    let involved: Vec<&Event> = anomaly.events.iter().map(|&i| &events[i]).collect();
    let Some(workspace) = involved.first().map(|e| e.workspace.as_str()) else {
        return Vec::new();
    };
    let from = involved.iter().map(|e| e.start).min().unwrap_or(0);
    let to = involved.iter().map(|e| e.end).max().unwrap_or(0);
    let mut shown: Vec<&Event> = events
        .iter()
        .filter(|e| e.workspace == workspace && e.end + 200_000 >= from && e.start <= to)
        .collect();
    shown.sort_by_key(|e| (e.start, e.index));
    if shown.len() > 40 {
        shown.retain(|e| anomaly.events.contains(&e.index) || !matches!(e.op, Op::Get));
    }
    shown
}

/// The seed: `WASMSTATE_CHAOS_SEED`, or a new one.
fn seed() -> u64 {
    std::env::var("WASMSTATE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        })
}

/// The hosts of a run: each with its own data directory (history, cache
/// key), all serving one config, so they share only the guest's storage.
struct Cluster {
    dir: PathBuf,
    configs: Vec<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
    servers: Vec<Option<Server>>,
    hosts: Arc<Hosts>,
}

impl Cluster {
    fn start(dir: &Path, setup: &Setup) -> Cluster {
        let texts = if setup.per_host.is_empty() {
            vec![setup.config.clone()]
        } else {
            setup.per_host.clone()
        };
        let configs = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let config = dir.join(format!("wasmstate-{i}.toml"));
                std::fs::write(&config, text).unwrap();
                config
            })
            .collect();
        let mut cluster = Cluster {
            dir: dir.to_path_buf(),
            configs,
            env: setup.env.clone(),
            servers: (0..setup.hosts).map(|_| None).collect(),
            hosts: Arc::new(Hosts::new(setup.hosts)),
        };
        for i in 0..setup.hosts {
            cluster.restart(i);
        }
        cluster
    }

    /// Start host `i` (again).
    fn restart(&mut self, i: usize) {
        let config = &self.configs[i % self.configs.len()];
        let server =
            Server::with_config_env(&self.dir.join(format!("host-{i}")), config, &self.env);
        self.hosts.set(i, Some(server.url.clone()));
        self.servers[i] = Some(server);
    }

    /// `kill -9` host `i` with whatever it had under way, then start it again.
    fn kill_and_restart(&mut self, i: usize) {
        self.hosts.set(i, None);
        // Dropping a server kills it with SIGKILL and reaps it.
        drop(self.servers[i].take());
        self.restart(i);
    }

    /// SIGHUP host `i`: it reloads its config while serving.
    fn reload(&self, i: usize) {
        if let Some(server) = &self.servers[i] {
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &server.pid().to_string()])
                .status();
        }
    }
}

/// Inject faults until `stop`: every 0.3–1.5 s (seeded) a host is killed
/// and restarted, or reloaded. Returns what it did.
fn inject_faults(
    cluster: &mut Cluster,
    kills: bool,
    mut rng: Rng,
    stop: &AtomicBool,
) -> Vec<String> {
    let mut done = Vec::new();
    let mut next = Instant::now();
    while !stop.load(Ordering::Acquire) {
        if Instant::now() < next {
            // The fault schedule's clock, not a wait for anything.
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        let host = rng.below(cluster.servers.len());
        if rng.below(10) < 6 && kills {
            cluster.kill_and_restart(host);
            done.push(format!("kill -9 host {host}, restarted"));
        } else {
            cluster.reload(host);
            done.push(format!("SIGHUP host {host}"));
        }
        next = Instant::now() + Duration::from_millis(300 + rng.next() % 1200);
    }
    done
}

/// After the faults: every workspace, through every host, must take the
/// lock, read, write and unlock again within a minute (a lock left behind
/// by a client whose host was killed is force-unlocked, as an operator
/// would). What does not is stuck.
fn settle(setup: &Setup, recorder: &Arc<Recorder>, cluster: &Cluster, seed: u64) -> Vec<Anomaly> {
    let mut stuck = Vec::new();
    let workspaces = workspace_names(setup);
    for (i, server) in cluster.servers.iter().enumerate() {
        // A client that reaches only host `i`.
        let only = Arc::new(Hosts::new(setup.hosts));
        only.set(i, server.as_ref().map(|s| s.url.clone()));
        let mut client = Client::new(
            setup.clients + i,
            seed + i as u64,
            recorder.clone(),
            only,
            BACKEND,
            workspaces.clone(),
        );
        for workspace in &workspaces {
            let deadline = Instant::now() + Duration::from_secs(60);
            let settled = loop {
                let from = recorder.events().len();
                client.locked_write(workspace);
                let wrote = recorder.events()[from..]
                    .iter()
                    .any(|e| matches!(e.op, Op::Post(_)) && e.outcome.is(200));
                if wrote {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                client.force_unlock(workspace);
            };
            if !settled {
                let last = recorder.events().len() - 1;
                // What the host says now, for the report: the history
                // keeps statuses only.
                let says = server.as_ref().map_or_else(
                    || "host down".to_string(),
                    |s| {
                        let get = send("GET", &s.state_url(BACKEND, workspace), None);
                        let lock = send(
                            "LOCK",
                            &s.state_url(BACKEND, workspace),
                            Some(&lock_info("settle-probe", "chaos@checker")),
                        );
                        let shown = |a: &Answer| {
                            let text = a.text();
                            format!(
                                "{} {}",
                                a.status,
                                text.trim().chars().take(300).collect::<String>()
                            )
                        };
                        format!("GET {}; LOCK {}", shown(&get), shown(&lock))
                    },
                );
                stuck.push(Anomaly {
                    what: format!(
                        "workspace {workspace} is stuck on host {i}: no write within 60 s of the faults stopping (a LOCK now: {says})"
                    ),
                    events: vec![last],
                });
            }
        }
    }
    stuck
}

fn workspace_names(setup: &Setup) -> Vec<String> {
    (0..setup.workspaces).map(|i| format!("ws{i}")).collect()
}

/// Run `setup`: clients and faults for its time, then settle and check.
fn run(setup: Setup) -> Report {
    let seed = setup.seed;
    // Said before anything runs, so a run that hangs can be replayed too.
    println!("chaos run: seed {seed} (replay: WASMSTATE_CHAOS_SEED={seed})");
    let dir = tempdir();
    let mut cluster = Cluster::start(dir.path(), &setup);
    let recorder = Arc::new(Recorder::new());
    let mut rng = Rng::new(seed);
    let until = Instant::now() + Duration::from_secs(setup.seconds);
    let stop = AtomicBool::new(false);
    let faults_done = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..setup.clients)
            .map(|id| {
                let mut client = Client::new(
                    id,
                    rng.next(),
                    recorder.clone(),
                    cluster.hosts.clone(),
                    BACKEND,
                    workspace_names(&setup),
                );
                scope.spawn(move || client.run(until))
            })
            .collect();
        let fault_rng = Rng::new(rng.next());
        let kills = setup.kills;
        let cluster = &mut cluster;
        let stop = &stop;
        let resealer = setup.resealer.then(|| {
            let (hosts, rng, workspaces) = (
                cluster.hosts.clone(),
                Rng::new(rng.next()),
                workspace_names(&setup),
            );
            scope.spawn(move || clients::reseal_along(&hosts, rng, &workspaces, BACKEND, until))
        });
        let faults = setup
            .faults
            .then(|| scope.spawn(move || inject_faults(cluster, kills, fault_rng, stop)));
        for client in clients {
            client.join().unwrap();
        }
        if let Some(resealer) = resealer {
            let (answered, resealed) = resealer.join().unwrap();
            println!(
                "resealer: {answered} re-seals answered 200, {resealed} of them sealed a state again"
            );
            assert!(resealed > 0, "the resealer never sealed a state again");
        }
        stop.store(true, Ordering::Release);
        faults.map(|f| f.join().unwrap()).unwrap_or_default()
    });
    let mut anomalies = settle(&setup, &recorder, &cluster, rng.next());
    let events = recorder.events();
    anomalies.splice(0..0, check::check(&events));
    Report {
        seed,
        events,
        faults: faults_done,
        anomalies,
    }
}

/// Run and require a clean history, printing the report either way.
fn run_clean(setup: Setup) {
    let report = run(setup);
    println!("{report}");
    assert!(report.anomalies.is_empty(), "{report}");
    assert!(!report.faults.is_empty(), "no fault was injected: {report}");
}

fn sealed(key: &Path) -> String {
    format!("encryption = {{ keys = [{{ id = \"k1\", file = {key:?} }}] }}\n")
}

#[test]
fn chaos_local_on_a_shared_directory_sealed_and_plain() {
    let dir = tempdir();
    let key = key_file(dir.path());
    for encryption in [sealed(&key), String::new()] {
        let store = dir.path().join(format!("store-{}", unique()));
        run_clean(Setup::new(format!(
            "[backends.{BACKEND}]\nguest = \"local\"\ndir = {store:?}\n{encryption}"
        )));
    }
}

/// A key rotation under way on a shared directory: the hosts seal with
/// different first keys (as while replicas are reloaded one by one), and
/// `reseal` runs against random hosts all along, so states are sealed
/// again, back and forth, while clients lock, write and read, and hosts
/// are killed. A re-seal must never lose a write, bring an older state
/// back, or leave a workspace stuck.
#[test]
fn chaos_local_sealed_while_keys_rotate_and_reseal_runs() {
    let dir = tempdir();
    let k1 = key_file(dir.path());
    let second = dir.path().join("second");
    std::fs::create_dir_all(&second).unwrap();
    let k2 = key_file(&second);
    let store = dir.path().join("store");
    let with = |first: (&str, &Path), then: (&str, &Path)| {
        format!(
            "[backends.{BACKEND}]\nguest = \"local\"\ndir = {store:?}\n\
             encryption = {{ keys = [{{ id = \"{}\", file = {:?} }}, {{ id = \"{}\", file = {:?} }}] }}\n",
            first.0, first.1, then.0, then.1
        )
    };
    let mut setup = Setup::new(with(("k1", &k1), ("k2", &k2)));
    setup.per_host = vec![
        with(("k2", &k2), ("k1", &k1)),
        with(("k1", &k1), ("k2", &k2)),
    ];
    setup.resealer = true;
    run_clean(setup);
}

/// Both AWS guests on moto, behind a proxy that throttles, fails, and
/// applies-then-drops a share of their storage requests, with the hosts
/// killed and reloaded as for every guest; `s3-lockfile` sealed, on a
/// bucket with versioning.
#[test]
fn chaos_s3_lockfile_and_dynamodb_on_moto() {
    let dir = tempdir();
    let key = key_file(dir.path());
    for (locking, encryption) in [
        (crate::aws::Locking::LockFile, sealed(&key)),
        (crate::aws::Locking::DynamoDb, String::new()),
    ] {
        let moto = crate::aws::start_moto(locking);
        // Sealed, the hosts started afresh seed their rollback check from
        // the bucket's versions: under faults and kills too, it must never
        // refuse a state the history allows.
        if locking == crate::aws::Locking::LockFile {
            moto.enable_versioning(crate::aws::BUCKET);
        }
        let mut setup = Setup::new(String::new());
        let proxy = FaultProxy::random(&moto.url, setup.seed, 3);
        setup.config = backend_table(
            BACKEND,
            locking.guest(),
            &encryption,
            &crate::aws::settings(&proxy.url, locking),
        );
        run_clean(setup);
        let injected = proxy.injected.lock().unwrap();
        println!(
            "{} storage faults injected, the first: {:?}",
            injected.len(),
            injected.iter().take(5).collect::<Vec<_>>()
        );
        assert!(!injected.is_empty(), "the proxy injected no storage fault");
    }
}

#[test]
fn chaos_git_on_git_daemon() {
    let dir = tempdir();
    let daemon = GitDaemon::start(dir.path());
    bare_repo(dir.path(), "chaos");
    let key = key_file(dir.path());
    run_clean(Setup::new(format!(
        "[backends.{BACKEND}]\nguest = \"git\"\n{}[backends.{BACKEND}.config]\nrepository = {:?}\n",
        sealed(&key),
        daemon.url("chaos")
    )));
}

/// `git` over smart HTTP (lighttpd and `git http-backend`, with
/// credentials only the hosts hold) behind the fault proxy: fetches and
/// pushes that fail, are throttled, or are applied and their answer lost.
///
/// It found three ways a host got stuck on a workspace after the faults
/// stopped, each fixed: a clone left without objects by a cut-off fetch,
/// a clone whose creation a kill cut off, and ref lock files a killed host
/// left in its clone (every fetch then failed as "locked").
#[test]
fn chaos_git_over_http_behind_a_fault_proxy() {
    let dir = tempdir();
    let web = GitHttp::start(dir.path(), "ci", "s3cret");
    bare_repo(&dir.path().join("repos"), "chaos");
    let mut setup = Setup::new(String::new());
    let proxy = FaultProxy::random(&format!("http://127.0.0.1:{}", web.port), setup.seed, 3);
    let repository = format!("{}/git/chaos.git", proxy.url);
    setup.config = format!(
        "[backends.{BACKEND}]\nguest = \"git\"\n\
         git_auth = {{ username_env = \"GIT_USER\", password_env = \"GIT_TOKEN\" }}\n\
         [backends.{BACKEND}.config]\nrepository = {repository:?}\n"
    );
    setup.env = vec![("GIT_USER", "ci"), ("GIT_TOKEN", "s3cret")];
    run_clean(setup);
    let injected = proxy.injected.lock().unwrap();
    println!("{} storage faults injected", injected.len());
    assert!(!injected.is_empty(), "the proxy injected no storage fault");
}

/// `postgres` on a real PostgreSQL: three hosts holding Terraform's
/// advisory locks in their lock sessions, killed (`-9`: the session and
/// its locks die with the host; another host takes them over) and
/// reloaded under concurrent clients; sealed, so the rollback check runs
/// too.
#[test]
fn chaos_postgres_with_advisory_locks() {
    let dir = tempdir();
    let pg = Postgres::start();
    let key = key_file(dir.path());
    run_clean(Setup::new(format!(
        "[backends.{BACKEND}]\nguest = \"postgres\"\n{}[backends.{BACKEND}.config]\nconn_str = {:?}\n",
        sealed(&key),
        pg.conn_str()
    )));
}

/// `azure` on Azurite behind the fault proxy (throttled, failed, and
/// applied-then-dropped blob requests), sealed with snapshots as the
/// history, three hosts killed and reloaded under concurrent clients.
#[test]
fn chaos_azure_on_azurite_behind_a_fault_proxy() {
    let dir = tempdir();
    let azurite = crate::azure::start();
    let key = key_file(dir.path());
    let mut setup = Setup::new(String::new());
    let upstream = azurite.endpoint();
    let origin = upstream.trim_end_matches(&format!("/{}", crate::common::azurite::ACCOUNT));
    let proxy = FaultProxy::random(origin, setup.seed, 3);
    let settings: Vec<(String, String)> = crate::azure::settings(&azurite, true)
        .into_iter()
        .map(|(k, v)| match k.as_str() {
            "blob_endpoint" => (k, upstream.replace(origin, &proxy.url)),
            _ => (k, v),
        })
        .collect();
    setup.config = backend_table(BACKEND, "azure", &sealed(&key), &settings);
    run_clean(setup);
    let injected = proxy.injected.lock().unwrap();
    println!("{} storage faults injected", injected.len());
    assert!(!injected.is_empty(), "the proxy injected no storage fault");
}

/// The checker finds what it is for: with the stale-write guard off
/// (`allow_force_push`), unlocked writers from one serial overwrite each
/// other, and the history shows the lost write.
#[test]
fn chaos_finds_lost_writes_when_the_guard_is_off() {
    let dir = tempdir();
    let store = dir.path().join("store");
    let mut setup = Setup::new(format!(
        "[backends.{BACKEND}]\nguest = \"local\"\ndir = {store:?}\nallow_force_push = true\n"
    ));
    setup.faults = false;
    setup.workspaces = 1;
    setup.seconds = 8;
    let report = run(setup);
    println!("{report}");
    assert!(
        report
            .anomalies
            .iter()
            .any(|a| a.what.contains("same serial") || a.what.contains("older state")),
        "the checker found no anomaly with the guard off: {report}"
    );
    assert!(report.to_string().contains(">> #"), "{report}");
}
