//! What an operator and a client see of a backend beyond its states:
//! who keeps its history, its kept versions, its description.

/// Who keeps a backend's version history: what every replica sees, or
/// only this one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HistorySource {
    /// Not known yet: no listing has asked the guest since the start.
    #[default]
    Unknown,
    /// The guest's storage (S3 object versions, git commits): shared by
    /// every replica on that storage, and kept across restarts.
    Storage,
    /// This replica's data directory (`<data_dir>/history`): only the
    /// writes that went through it, unless that folder is shared.
    Replica,
    /// Nowhere: the storage keeps none and the backend's `history` is 0.
    None,
}

impl HistorySource {
    /// One line for people: where versions come from, and what follows.
    pub fn describe(self) -> &'static str {
        match self {
            HistorySource::Unknown => "not known yet (no version listed since the server started)",
            HistorySource::Storage => {
                "kept by the storage itself: every replica lists the same versions"
            }
            HistorySource::Replica => {
                "kept by this replica in its data directory: versions written through other \
                 replicas are not here unless that folder is shared"
            }
            HistorySource::None => "none: the storage keeps no history and `history = 0`",
        }
    }

    /// The short name the API and metrics use (`storage`, `replica`…).
    pub fn name(self) -> &'static str {
        match self {
            HistorySource::Unknown => "unknown",
            HistorySource::Storage => "storage",
            HistorySource::Replica => "replica",
            HistorySource::None => "none",
        }
    }
}

/// One kept version, as listed by `GET …/versions`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Version {
    /// Opaque id for `GET …/versions/{id}`: `<unix ms>-<serial>`.
    pub id: String,
    /// The state's serial, when it has one.
    pub serial: Option<u64>,
    /// When it was written, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Size as stored.
    pub bytes: u64,
    /// Who wrote it, as this replica's audit trail says (filled in by the
    /// host, never by storage).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written_by: Option<String>,
}

/// What an operator sees of a backend (the console's backends page): where
/// its guest came from, what it may do, and how much of its limits it uses.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Description {
    /// The guest as configured (`local (embedded)`, a path, an installed name).
    pub guest: String,
    /// The name and version its manifest gives, if it has one.
    pub manifest: Option<String>,
    /// The WIT contract version it was built for.
    pub contract: String,
    /// sha256 of the component.
    pub sha256: String,
    /// Key id of the publisher signature that verified it, if installed signed.
    pub signer: Option<String>,
    /// Capabilities its manifest asks for (all it is given, with no manifest).
    pub asked: Vec<String>,
    /// Capabilities the operator granted it, after narrowing to the manifest.
    pub granted: Vec<String>,
    /// Its limits and their current use, as (what, value) pairs.
    pub limits: Vec<(String, String)>,
}
