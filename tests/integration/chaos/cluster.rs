//! The hosts of a run and the faults injected into them.

use super::Setup;
use super::clients::{Hosts, Rng};
use super::history::{NO_WORKSPACE, Op, Outcome, Recorder};
use crate::common::Server;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The "client" that injects faults, in the history.
const FAULTS: usize = usize::MAX;

/// The hosts of a run: each with its own data directory (history, cache
/// key), all serving one config, so they share only the guest's storage.
pub struct Cluster {
    dir: PathBuf,
    configs: Vec<PathBuf>,
    env: Vec<(&'static str, &'static str)>,
    /// Configs a reload rewrites the host's config file to, one at random
    /// (the same backend said another way, e.g. a new `conn_str`).
    reload_variants: Vec<String>,
    /// The hosts; `None` while one is being restarted.
    pub servers: Vec<Option<Server>>,
    /// Where clients find them.
    pub hosts: Arc<Hosts>,
}

impl Cluster {
    /// Start `setup.hosts` hosts in `dir`.
    pub fn start(dir: &Path, setup: &Setup) -> Cluster {
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
            reload_variants: setup.reload_variants.clone(),
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

    /// SIGHUP host `i`: it reloads its config while serving (one of the
    /// reload variants, if any, written to its config file first).
    fn reload(&self, i: usize, rng: &mut Rng) {
        if !self.reload_variants.is_empty() {
            let variant = &self.reload_variants[rng.below(self.reload_variants.len())];
            std::fs::write(&self.configs[i % self.configs.len()], variant).unwrap();
        }
        if let Some(server) = &self.servers[i] {
            let _ = std::process::Command::new("kill")
                .args(["-HUP", &server.pid().to_string()])
                .status();
        }
    }
}

/// Inject faults until `stop`: every 0.3–1.5 s (seeded) a host is killed
/// and restarted, or reloaded, each recorded in the history (in no
/// workspace). Returns what it did.
pub fn inject_faults(
    cluster: &mut Cluster,
    kills: bool,
    mut rng: Rng,
    recorder: &Recorder,
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
        let kill = rng.below(10) < 6 && kills;
        recorder.record(FAULTS, host, NO_WORKSPACE, Op::Fault(kill), || {
            if kill {
                cluster.kill_and_restart(host);
            } else {
                cluster.reload(host, &mut rng);
            }
            Outcome::Answered(200, None)
        });
        done.push(match kill {
            true => format!("kill -9 host {host}, restarted"),
            false => format!("SIGHUP host {host}"),
        });
        next = Instant::now() + Duration::from_millis(300 + rng.next() % 1200);
    }
    done
}
