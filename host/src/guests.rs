//! Where a guest's component comes from, and the first-party guests
//! compiled into this binary with what each is granted by default. A leaf:
//! loading the bytes is the loader's work ([`crate::loader`]).

use crate::policy::Origin;
use std::path::PathBuf;

/// Where a guest's component comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuestSource {
    /// One of the guests compiled into this binary.
    Embedded(&'static str),
    /// A component file on disk.
    File(PathBuf),
    /// A guest from the store (`wasmstate guest install`), pinned by digest.
    Installed {
        /// Name from its manifest.
        name: String,
        /// The sha256 it must have.
        sha256: String,
    },
}

impl std::fmt::Display for GuestSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GuestSource::Embedded(name) => write!(f, "{name} (embedded)"),
            GuestSource::File(path) => write!(f, "{}", path.display()),
            GuestSource::Installed { name, sha256 } => write!(f, "{name}@sha256:{sha256}"),
        }
    }
}

/// A guest component shipped inside the `wasmstate` binary.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedGuest {
    /// The name used in config files: `guest = "local"`.
    pub name: &'static str,
    /// One line on what it stores and where.
    pub summary: &'static str,
    /// The component's bytes.
    pub wasm: &'static [u8],
    /// Outbound HTTP granted when the operator grants none explicitly,
    /// derived from the guest's configuration.
    pub default_http: fn(&[(String, String)]) -> Vec<Origin>,
    /// Whose credentials the host adds to its requests (to every endpoint
    /// it is granted by default), if any.
    pub cloud: Cloud,
    /// Git repositories granted when the operator grants none explicitly,
    /// and the refs and paths it may change there, derived from the
    /// guest's configuration.
    pub default_git: fn(&[(String, String)]) -> GitDefaults,
}

/// The cloud whose credentials the host holds for a first-party guest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cloud {
    /// None: the guest's requests leave as it sends them.
    None,
    /// AWS: SigV4 with the backend's AWS credentials.
    Aws,
    /// Azure Storage: Shared Key or a SAS token.
    Azure,
    /// Google Cloud: an OAuth2 access token.
    Gcp,
}

/// What a first-party guest is granted in git by default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GitDefaults {
    /// Repository URLs.
    pub urls: Vec<String>,
    /// Refs it may update (patterns: `*` within a segment, `**` across).
    pub refs: Vec<String>,
    /// Paths its commits may touch (same patterns).
    pub paths: Vec<String>,
}

/// The value of `key` in a guest's configuration.
fn setting<'a>(config: &'a [(String, String)], key: &str) -> Option<&'a str> {
    config
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The git guest's grants: its repository, its branch and the lock
/// branches, the state and lock files in its directory.
fn git_guest_grants(config: &[(String, String)]) -> GitDefaults {
    let get = |key: &str| setting(config, key);
    let branch = get("ref").unwrap_or("main");
    let branch = branch.strip_prefix("refs/heads/").unwrap_or(branch);
    let dir = get("dir").map(|d| d.trim_matches('/')).unwrap_or("");
    let within = |name: &str| {
        if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        }
    };
    GitDefaults {
        urls: get("repository").map(str::to_owned).into_iter().collect(),
        refs: vec![
            format!("refs/heads/{branch}"),
            "refs/heads/locks/**".to_string(),
        ],
        // The states, their locks, and each workspace's metadata file.
        paths: vec![
            within("*.tfstate"),
            within("*.tfstate.lock"),
            within(".wasmstate/metadata/*.json"),
        ],
    }
}

/// Every embedded guest. The build script compiles each from `guests/<name>`.
pub const EMBEDDED: &[EmbeddedGuest] = &[
    EmbeddedGuest {
        name: "local",
        summary: "state files in a directory on this machine (the default)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_LOCAL")),
        default_http: |_| Vec::new(),
        cloud: Cloud::None,
        default_git: |_| GitDefaults::default(),
    },
    EmbeddedGuest {
        name: "s3-lockfile",
        summary: "S3, locked with .tflock objects (Terraform's use_lockfile layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_S3_LOCKFILE")),
        default_http: aws_grants,
        cloud: Cloud::Aws,
        default_git: |_| GitDefaults::default(),
    },
    EmbeddedGuest {
        name: "dynamodb",
        summary: "S3, locked with a DynamoDB table (Terraform's dynamodb_table layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_DYNAMODB")),
        default_http: aws_grants,
        cloud: Cloud::Aws,
        default_git: |_| GitDefaults::default(),
    },
    EmbeddedGuest {
        name: "git",
        summary: "a git repository: state files on a branch, locks as branches (terraform-backend-git's layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_GIT")),
        // No HTTP: it reaches its repository through the host's git
        // capability, granted from its `repository` setting.
        default_http: |_| Vec::new(),
        cloud: Cloud::None,
        default_git: git_guest_grants,
    },
    EmbeddedGuest {
        name: "gcs",
        summary: "Google Cloud Storage, locked with .tflock objects (Terraform's gcs layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_GCS")),
        default_http: gcs_grants,
        cloud: Cloud::Gcp,
        default_git: |_| GitDefaults::default(),
    },
    EmbeddedGuest {
        name: "azure",
        summary: "Azure Blob Storage, locked with blob leases (Terraform's azurerm layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_AZURE")),
        default_http: azure_grants,
        cloud: Cloud::Azure,
        default_git: |_| GitDefaults::default(),
    },
    EmbeddedGuest {
        name: "postgres",
        summary: "PostgreSQL rows, locked with advisory locks (Terraform's pg layout)",
        wasm: include_bytes!(env!("WASMSTATE_GUEST_POSTGRES")),
        // No HTTP: it reaches its database through the host's postgres
        // capability, granted by its `conn_str`.
        default_http: |_| Vec::new(),
        cloud: Cloud::None,
        default_git: |_| GitDefaults::default(),
    },
];

/// The blob endpoint an Azure guest's configuration points at: its
/// `blob_endpoint`, else the account's on Azure's public cloud.
fn azure_grants(config: &[(String, String)]) -> Vec<Origin> {
    match setting(config, "blob_endpoint") {
        Some(url) => origin_of(url).into_iter().collect(),
        None => origin_of(&format!(
            "https://{}.blob.core.windows.net",
            setting(config, "storage_account_name").unwrap_or("account")
        ))
        .into_iter()
        .collect(),
    }
}

/// The endpoint a GCS guest's configuration points at: its
/// `storage_custom_endpoint`, else Google's.
fn gcs_grants(config: &[(String, String)]) -> Vec<Origin> {
    let endpoint =
        setting(config, "storage_custom_endpoint").unwrap_or("https://storage.googleapis.com");
    origin_of(endpoint).into_iter().collect()
}

/// The origin (`scheme://host:port`) of a URL.
fn origin_of(url: &str) -> Option<Origin> {
    let uri: http::Uri = url.parse().ok()?;
    Origin::parse(&format!("{}://{}", uri.scheme_str()?, uri.authority()?)).ok()
}

/// The AWS endpoints an S3/DynamoDB guest's configuration points at: the
/// configured ones, else AWS's regional endpoints.
fn aws_grants(config: &[(String, String)]) -> Vec<Origin> {
    let get = |key: &str| setting(config, key);
    let region = get("region").unwrap_or("us-east-1");
    let mut grants = Vec::new();
    let s3 = match get("endpoints.s3").or(get("endpoint")) {
        Some(url) => origin_of(url),
        None if get("use_path_style") == Some("true") => {
            origin_of(&format!("https://s3.{region}.amazonaws.com"))
        }
        None => origin_of(&format!(
            "https://{}.s3.{region}.amazonaws.com",
            get("bucket").unwrap_or("bucket")
        )),
    };
    grants.extend(s3);
    if get("dynamodb_table").is_some() {
        grants.extend(
            match get("endpoints.dynamodb").or(get("dynamodb_endpoint")) {
                Some(url) => origin_of(url),
                None => origin_of(&format!("https://dynamodb.{region}.amazonaws.com")),
            },
        );
    }
    grants
}

/// The grants a first-party guest gets when the operator lists none: the
/// endpoints and repository its own configuration names. Other guests get
/// nothing by default.
pub fn default_grants(
    source: &GuestSource,
    config: &[(String, String)],
) -> (Vec<Origin>, GitDefaults) {
    match source {
        GuestSource::Embedded(name) => embedded(name)
            .map(|g| ((g.default_http)(config), (g.default_git)(config)))
            .unwrap_or_default(),
        _ => Default::default(),
    }
}

/// The cloud whose credentials the host adds to an embedded guest's
/// requests; [`Cloud::None`] for other guests.
pub fn cloud(source: &GuestSource) -> Cloud {
    match source {
        GuestSource::Embedded(name) => embedded(name).map_or(Cloud::None, |g| g.cloud),
        _ => Cloud::None,
    }
}

/// The embedded guest called `name`, if there is one.
pub fn embedded(name: &str) -> Option<&'static EmbeddedGuest> {
    EMBEDDED.iter().find(|g| g.name == name)
}

/// Names of the embedded guests, for error messages.
pub fn embedded_names() -> Vec<&'static str> {
    EMBEDDED.iter().map(|g| g.name).collect()
}
