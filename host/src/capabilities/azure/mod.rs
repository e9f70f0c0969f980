//! Azure Blob Storage credentials, held by the host and never by a guest.
//!
//! An `azure` backend names its storage account, container and state blob
//! (`key`) in its configuration, as Terraform's `azurerm` backend does;
//! its `access_key` or `sas_token` leave that configuration before the
//! guest sees it ([`AzureGrant::take`]). The guest sends unsigned requests;
//! the host signs (Shared Key) or appends the SAS token only to requests
//! that stay on the state blobs of that container ([`scope`]).

mod scope;
mod shared_key;

use crate::policy::Origin;
use std::fmt;

/// Keys of a backend's `config` table holding Azure credentials.
pub const CREDENTIAL_KEYS: &[&str] = &["access_key", "sas_token"];

/// How the host authorizes requests to the storage account.
#[derive(Clone, PartialEq, Eq)]
pub enum AzureCredential {
    /// The account's access key (`access_key`, base64): Shared Key signing.
    SharedKey(Vec<u8>),
    /// A SAS token (`sas_token`, without the leading `?`), appended to the
    /// query of each request.
    Sas(String),
}

impl fmt::Debug for AzureCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AzureCredential::SharedKey(_) => f.write_str("SharedKey(** redacted **)"),
            AzureCredential::Sas(_) => f.write_str("Sas(** redacted **)"),
        }
    }
}

/// What a backend is granted: requests to `origins`, on the state blobs of
/// one container, are authorized with `credential`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AzureGrant {
    /// Origins whose requests the host authorizes.
    pub origins: Vec<Origin>,
    /// `storage_account_name`.
    pub account: String,
    /// The blob endpoint's own path (`/devstoreaccount1` on Azurite, empty
    /// on Azure): what comes before the container in a request's path.
    pub base_path: String,
    /// `container_name`.
    pub container: String,
    /// `key`: the default workspace's blob; the others are `key` +
    /// `env:NAME`.
    pub key: String,
    /// The credential.
    pub credential: AzureCredential,
}

impl AzureGrant {
    /// The grant of a backend whose requests to `origins` are authorized:
    /// the credential is taken out of `guest_config` (else from
    /// `ARM_ACCESS_KEY` / `ARM_SAS_TOKEN`, as Terraform reads them), the
    /// account, container, key and blob endpoint are read and left, and
    /// `origins` become reachable in `allow_http`. `None` (and nothing
    /// taken) without origins.
    pub fn take(
        origins: Vec<Origin>,
        guest_config: &mut Vec<(String, String)>,
        allow_http: &mut Vec<Origin>,
    ) -> Result<Option<AzureGrant>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        // A SAS in a query, or a signed request, can be replayed by whoever
        // reads it on the way.
        super::confidential(&origins, "blob_endpoint")?;
        let taken = super::take_settings(guest_config, CREDENTIAL_KEYS);
        let from = |name: &str, env: &str| {
            super::setting(&taken, name)
                .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
        };
        // The host's own environment goes only to Azure, or to this
        // machine; another endpoint must be given credentials of its own.
        let ambient = taken.is_empty();
        if ambient
            && let Some(origin) = origins.iter().find(|o| {
                let azure = [
                    ".core.windows.net",
                    ".core.chinacloudapi.cn",
                    ".core.usgovcloudapi.net",
                ];
                !super::takes_host_identity(o, &azure)
            })
        {
            return Err(format!(
                "access_key: {}://{} is not Azure's; give this backend its own access_key or sas_token instead of ARM_ACCESS_KEY / ARM_SAS_TOKEN",
                origin.scheme, origin.host
            ));
        }
        // Terraform's precedence: the access key, then the SAS token.
        let credential = match (
            from("access_key", "ARM_ACCESS_KEY"),
            from("sas_token", "ARM_SAS_TOKEN"),
        ) {
            (Some(key), _) => {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(key.trim())
                    .map_err(|_| {
                        "access_key: not base64; give the storage account's key as the portal shows it"
                            .to_string()
                    })?;
                AzureCredential::SharedKey(bytes)
            }
            (None, Some(sas)) => {
                AzureCredential::Sas(sas.trim().trim_start_matches('?').to_string())
            }
            (None, None) => {
                return Err(
                    "access_key: set access_key or sas_token (e.g. access_key = { env = \"ARM_ACCESS_KEY\" }); the host holds them, the guest never sees them"
                        .into(),
                );
            }
        };
        let setting = |name: &str| {
            super::setting(guest_config, name)
                .filter(|v| !v.is_empty())
                .ok_or_else(|| format!("{name}: required"))
        };
        let account = setting("storage_account_name")?;
        let base_path = match setting("blob_endpoint") {
            Ok(url) => {
                let uri: http::Uri = url
                    .parse()
                    .map_err(|e| format!("blob_endpoint: {url:?} is not a URL: {e}"))?;
                uri.path().trim_end_matches('/').to_string()
            }
            Err(_) => String::new(),
        };
        let grant = AzureGrant {
            origins,
            account,
            base_path,
            container: setting("container_name")?,
            key: setting("key")?,
            credential,
        };
        super::reach(&grant.origins, allow_http);
        Ok(Some(grant))
    }
}

/// One backend's authorizer of Azure requests.
#[derive(Debug)]
pub struct AzureSigner {
    grant: AzureGrant,
}

impl AzureSigner {
    /// The authorizer of `grant`.
    pub fn new(grant: &AzureGrant) -> AzureSigner {
        AzureSigner {
            grant: grant.clone(),
        }
    }

    /// Whether requests to `uri` are authorized by this signer (and so
    /// must stay in its scope).
    pub fn signs(&self, uri: &http::Uri) -> bool {
        self.grant.origins.iter().any(|o| o.matches(uri))
    }

    /// Authorize `parts` (a request whose body is `body_len` bytes, when
    /// known): refused unless it stays on the grant's state blobs; then
    /// signed with the account key, or given the SAS token. The guest's own
    /// `Authorization` is replaced.
    pub fn authorize(
        &self,
        parts: &mut http::request::Parts,
        body_len: Option<u64>,
    ) -> Result<(), String> {
        scope::check(&self.grant, &parts.method, &parts.uri, &parts.headers)?;
        parts.headers.remove(http::header::AUTHORIZATION);
        match &self.grant.credential {
            AzureCredential::SharedKey(key) => {
                shared_key::sign(&self.grant.account, key, parts, body_len)
            }
            AzureCredential::Sas(sas) => {
                let uri = &parts.uri;
                let joined = match uri.query() {
                    Some(q) if !q.is_empty() => format!("{}?{q}&{sas}", uri.path()),
                    _ => format!("{}?{sas}", uri.path()),
                };
                let mut builder = http::uri::Parts::from(uri.clone());
                builder.path_and_query = Some(
                    joined
                        .parse()
                        .map_err(|e| format!("sas_token does not fit in a URL: {e}"))?,
                );
                parts.uri = http::Uri::from_parts(builder)
                    .map_err(|e| format!("sas_token does not fit in a URL: {e}"))?;
                Ok(())
            }
        }
    }
}
