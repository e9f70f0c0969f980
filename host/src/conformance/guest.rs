//! Run the kit against a guest component through the real runtime, as
//! `wasmstate guest test` does.

use super::{Outcome, Report};
use crate::capabilities::git::{GitAuth, GitGrant};
use crate::config::cloud::{CloudLists, take_cloud_grants};
use crate::config::{BackendConfig, Config, GuestSource, Limits, Overrides};
use crate::guests;
use crate::loader::{self, Ungranted};
use crate::policy::Origin;
use crate::runtime::{GuestBackend, Runtime};
use std::path::PathBuf;
use std::sync::Arc;

/// A guest to test and what to grant it.
#[derive(Debug, Clone)]
pub struct GuestUnderTest {
    /// Which component.
    pub guest: GuestSource,
    /// Its configuration.
    pub config: Vec<(String, String)>,
    /// Directory granted at `/data`; `None`: a fresh temporary one.
    pub dir: Option<PathBuf>,
    /// Origins it may call.
    pub allow_http: Vec<Origin>,
    /// Origins whose requests the host signs with AWS credentials (the
    /// embedded AWS guests: all of theirs when empty).
    pub aws_sign: Vec<Origin>,
    /// Git repositories it may use (the embedded git guest: its
    /// configured `repository` when empty).
    pub allow_git: Vec<String>,
    /// Refs it may update there (the embedded git guest: its own when
    /// empty).
    pub git_refs: Vec<String>,
    /// Paths its commits may touch (likewise).
    pub git_paths: Vec<String>,
    /// Sandbox limits.
    pub limits: Limits,
}

/// A key no guest knows, to check that unknown keys are reported.
const UNKNOWN_KEY: &str = "wasmstate-conformance-unknown-key";

/// A guest loaded for the kit or the bench, through the pipeline `serve`
/// runs (verified, narrowed to its manifest).
pub struct LoadedGuest {
    /// The guest, as the host's storage.
    pub storage: Arc<GuestBackend>,
    config: Config,
    runtime: Runtime,
    /// Holds the data directory (and the guest's, unless given) until the
    /// guest is dropped.
    _scratch: tempfile::TempDir,
}

impl LoadedGuest {
    /// The largest state the host takes (`max_body_mib`).
    pub fn max_body_bytes(&self) -> usize {
        self.config.max_body_bytes
    }

    /// The same guest loaded again with one more configuration pair.
    async fn with_config(&self, key: &str, value: &str) -> anyhow::Result<GuestBackend> {
        let mut backend = self.config.backends[0].clone();
        backend
            .guest_config
            .push((key.to_string(), value.to_string()));
        loader::load(&self.config, &backend, &self.runtime, Ungranted::Withhold).await
    }
}

/// Load the guest under test with what `subject` grants it.
pub async fn load_guest(subject: &GuestUnderTest) -> anyhow::Result<LoadedGuest> {
    let scratch = tempfile::Builder::new()
        .prefix("wasmstate-guest-test-")
        .tempdir()?;
    // A first-party guest is granted its configured endpoints and
    // repository, as `serve` does, unless the flags say otherwise.
    let (default_http, default_git) = guests::default_grants(&subject.guest, &subject.config);
    let mut allow_http = subject.allow_http.clone();
    if allow_http.is_empty() {
        allow_http = default_http.clone();
    }
    // Cloud requests are signed by the host, as under `serve`: the
    // credential settings leave the guest's config.
    let mut guest_config = subject.config.clone();
    let lists = CloudLists {
        aws_sign: (!subject.aws_sign.is_empty()).then(|| subject.aws_sign.clone()),
        ..CloudLists::default()
    };
    let base = std::env::current_dir()?;
    let clouds = take_cloud_grants(
        &subject.guest,
        lists,
        &default_http,
        &mut guest_config,
        &mut allow_http,
        &base,
    )
    .map_err(|e| anyhow::anyhow!("--{e}"))?;
    let postgres = crate::capabilities::postgres::PgGrant::take(
        subject.guest == GuestSource::Embedded("postgres"),
        &mut guest_config,
    )
    .map_err(|e| anyhow::anyhow!("--config {e}"))?;
    let mut git_urls = subject.allow_git.clone();
    if git_urls.is_empty() {
        git_urls = default_git.urls;
    }
    let or_default = |given: &Vec<String>, default: Vec<String>| {
        if given.is_empty() {
            default
        } else {
            given.clone()
        }
    };
    let refs = or_default(&subject.git_refs, default_git.refs);
    let paths = or_default(&subject.git_paths, default_git.paths);
    let allow_git: Vec<GitGrant> = git_urls
        .into_iter()
        .map(|url| GitGrant {
            url,
            auth: GitAuth::default(),
            refs: refs.clone(),
            paths: paths.clone(),
        })
        .collect();
    let dir = subject
        .dir
        .clone()
        .unwrap_or_else(|| scratch.path().join("data"));
    let backend = BackendConfig {
        name: "under-test".into(),
        guest: subject.guest.clone(),
        dir: Some(dir.clone()),
        limits: subject.limits,
        guest_config: guest_config.clone(),
        allow_http: allow_http.clone(),
        allow_http_addresses: Vec::new(),
        aws: clouds.aws.clone(),
        azure: clouds.azure.clone(),
        gcp: clouds.gcp.clone(),
        postgres: postgres.clone(),
        allow_force_push: false,
        // The kit builds no host history; a guest that keeps versions by
        // this setting (`postgres`) keeps some, for the history case.
        history: 10,
        encryption: None,
        allow_git: allow_git.clone(),
        secrets: Vec::new(),
        max_instances: None,
        memory_budget_bytes: None,
        disk_quota_bytes: None,
        max_cores: None,
        lock_ttl: None,
    };
    let mut config = Config::default_with(Overrides {
        data_dir: Some(scratch.path().to_path_buf()),
        ..Overrides::default()
    });
    config.backends = vec![backend];
    let runtime = Runtime::new(&config, Arc::new(crate::metrics::Metrics::new([])))?;
    // The same pipeline `serve` runs: verified, narrowed to its manifest
    // (what it asks for beyond the flags is refused where it is used).
    let storage = loader::load(&config, &config.backends[0], &runtime, Ungranted::Withhold).await?;
    Ok(LoadedGuest {
        storage: Arc::new(storage),
        config,
        runtime,
        _scratch: scratch,
    })
}

/// Load the guest, run every case, the big state, then check it reports a
/// bad configuration as a diagnostic. `Err` when the guest cannot even load.
pub async fn run_guest(subject: GuestUnderTest) -> anyhow::Result<Report> {
    let loaded = load_guest(&subject).await?;
    let storage = loaded.storage.clone();
    let run_id = super::run_id();
    let mut report = super::run(storage.clone(), &run_id).await;
    report.outcomes.push(Outcome::of(
        "a state larger than the memory cap round-trips both ways (it streams)",
        super::big_state(
            &*storage,
            &run_id,
            subject.limits.memory_bytes,
            loaded.max_body_bytes(),
        )
        .await,
    ));
    let result = match loaded.with_config(UNKNOWN_KEY, "1").await {
        Ok(_) => Err(format!(
            "the guest accepted the unknown key {UNKNOWN_KEY:?}"
        )),
        Err(e) => {
            let text = format!("{e:#}");
            if text.contains("invalid configuration") && text.contains(UNKNOWN_KEY) {
                Ok(())
            } else {
                Err(format!(
                    "expected a diagnostic naming {UNKNOWN_KEY:?}, got: {text}"
                ))
            }
        }
    };
    report.outcomes.push(Outcome::of(
        "an unknown configuration key is reported as a diagnostic, not a trap",
        result,
    ));
    Ok(report)
}
