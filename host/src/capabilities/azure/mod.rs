//! Azure Blob Storage credentials, held by the host and never by a guest.
//!
//! An `azure` backend names its storage account, container and state blob
//! (`key`) in its configuration, as Terraform's `azurerm` backend does;
//! its `access_key` or `sas_token` leave that configuration before the
//! guest sees it ([`AzureGrant::take`]). The guest sends unsigned requests;
//! the host signs (Shared Key) or appends the SAS token only to requests
//! that stay on the state blobs of that container ([`scope`]).
//!
//! Or, with `use_azuread_auth`, the host signs in to Microsoft Entra ID
//! ([`entra`]: workload identity, managed identity, a client secret or
//! certificate) and adds `Authorization: Bearer` to those requests, the
//! token cached and minted again before it expires ([`token`]).

mod certificate;
pub mod entra;
mod scope;
mod shared_key;
mod token;

use crate::policy::Origin;
use std::fmt;

/// Keys of a backend's `config` table holding Azure credentials (and
/// where the host fetches them): the guest never sees them.
pub const CREDENTIAL_KEYS: &[&str] = &[
    "access_key",
    "sas_token",
    "client_secret",
    "client_certificate_path",
    "client_certificate_password",
    "oidc_token_file_path",
    "oidc_token",
    "msi_endpoint",
];

/// How the host authorizes requests to the storage account.
#[derive(Clone, PartialEq, Eq)]
pub enum AzureCredential {
    /// The account's access key (`access_key`, base64): Shared Key signing.
    SharedKey(Vec<u8>),
    /// A SAS token (`sas_token`, without the leading `?`), appended to the
    /// query of each request.
    Sas(String),
    /// Microsoft Entra ID: a bearer token minted this way.
    Entra(entra::Way),
}

impl fmt::Debug for AzureCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AzureCredential::SharedKey(_) => f.write_str("SharedKey(** redacted **)"),
            AzureCredential::Sas(_) => f.write_str("Sas(** redacted **)"),
            AzureCredential::Entra(way) => write!(f, "{way:?}"),
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
    /// `ARM_ACCESS_KEY` / `ARM_SAS_TOKEN`, as Terraform reads them, or the
    /// Entra ID settings and variables [`entra::resolve`] reads; relative
    /// paths from `base`), the account, container, key and blob endpoint
    /// are read and left, and `origins` become reachable in `allow_http`.
    /// `None` (and nothing taken) without origins.
    pub fn take(
        origins: Vec<Origin>,
        guest_config: &mut Vec<(String, String)>,
        allow_http: &mut Vec<Origin>,
        base: &std::path::Path,
    ) -> Result<Option<AzureGrant>, String> {
        if origins.is_empty() {
            return Ok(None);
        }
        // A SAS in a query, or a signed request, can be replayed by whoever
        // reads it on the way.
        super::confidential(&origins, "blob_endpoint")?;
        let taken = super::take_settings(guest_config, CREDENTIAL_KEYS);
        let entra = entra::resolve(&taken, guest_config, base)?;
        let from = |name: &str, env: &str| {
            super::setting(&taken, name)
                .or_else(|| std::env::var(env).ok().filter(|v| !v.is_empty()))
        };
        // The host's own environment goes only to Azure, or to this
        // machine; another endpoint must be given credentials of its own.
        let ambient = match &entra {
            Some((_, ambient)) => *ambient,
            None => taken.is_empty(),
        };
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
                "{}: {}://{} is not Azure's; give this backend its own credentials instead of the host's environment or managed identity",
                if entra.is_some() {
                    "use_azuread_auth"
                } else {
                    "access_key"
                },
                origin.scheme,
                origin.host
            ));
        }
        let key_given = super::setting(&taken, "access_key").is_some()
            || super::setting(&taken, "sas_token").is_some();
        let credential = if let Some((way, _)) = entra {
            if key_given {
                return Err(
                    "access_key, use_azuread_auth: choose one way to reach the storage account (an account key or SAS token, or Entra ID)"
                        .into(),
                );
            }
            AzureCredential::Entra(way)
        } else {
            // Terraform's precedence: the access key, then the SAS token.
            match (
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
                        "access_key: set use_azuread_auth = true (Entra ID), access_key or sas_token (e.g. access_key = { env = \"ARM_ACCESS_KEY\" }); the host holds them, the guest never sees them"
                            .into(),
                    );
                }
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
        // A storage token opens every account the identity may use: it
        // goes only to this account's own Azure endpoint (or loopback).
        if matches!(credential, AzureCredential::Entra(_))
            && let Some(origin) = origins.iter().find(|o| !entra_may_reach(o, &account))
        {
            return Err(format!(
                "blob_endpoint: {}://{} is not storage account {account}'s Azure endpoint (https://{account}.blob.core.windows.net or another Azure cloud's); the host sends Entra ID tokens only there, or to loopback",
                origin.scheme, origin.host
            ));
        }
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

/// Whether an Entra ID token for `account` may go to `origin`: loopback,
/// or https to that account's host in an Azure cloud (its private
/// endpoint's `privatelink` name included).
fn entra_may_reach(origin: &Origin, account: &str) -> bool {
    if super::is_loopback(&origin.host) {
        return true;
    }
    let Some(rest) = origin.host.strip_prefix(&format!("{account}.")) else {
        return false;
    };
    origin.scheme == "https"
        && [
            ".core.windows.net",
            ".core.chinacloudapi.cn",
            ".core.usgovcloudapi.net",
        ]
        .iter()
        .any(|suffix| rest.ends_with(suffix))
}

/// One backend's authorizer of Azure requests.
pub struct AzureSigner {
    grant: AzureGrant,
    /// The Entra ID token, with an [`AzureCredential::Entra`] grant.
    tokens: Option<token::Cache>,
}

impl std::fmt::Debug for AzureSigner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AzureSigner")
            .field("grant", &self.grant)
            .finish_non_exhaustive()
    }
}

/// Why a request was not authorized.
#[derive(Debug)]
pub enum Refusal {
    /// It leaves the grant's scope: never sent.
    OutOfScope(String),
    /// No token could be had: what to fix (the way of signing in, the
    /// client, the tenant, the token endpoint's error), never a secret.
    NoToken(String),
}

impl AzureSigner {
    /// The authorizer of `grant`; no token is fetched yet.
    pub fn new(grant: &AzureGrant) -> AzureSigner {
        let tokens = match &grant.credential {
            AzureCredential::Entra(way) => Some(token::Cache::new(way.clone())),
            _ => None,
        };
        AzureSigner {
            grant: grant.clone(),
            tokens,
        }
    }

    /// Whether requests to `uri` are authorized by this signer (and so
    /// must stay in its scope).
    pub fn signs(&self, uri: &http::Uri) -> bool {
        self.grant.origins.iter().any(|o| o.matches(uri))
    }

    /// Authorize `parts` (a request whose body is `body_len` bytes, when
    /// known): refused unless it stays on the grant's state blobs; then
    /// signed with the account key, given the SAS token, or given the
    /// Entra ID token (returned, for [`token_refused`](Self::token_refused)).
    /// The guest's own `Authorization` is replaced.
    pub async fn authorize(
        &self,
        parts: &mut http::request::Parts,
        body_len: Option<u64>,
    ) -> Result<Option<String>, Refusal> {
        scope::check(&self.grant, &parts.method, &parts.uri, &parts.headers)
            .map_err(Refusal::OutOfScope)?;
        parts.headers.remove(http::header::AUTHORIZATION);
        let failed = |e: String| Refusal::OutOfScope(e);
        match &self.grant.credential {
            AzureCredential::SharedKey(key) => {
                shared_key::sign(&self.grant.account, key, parts, body_len).map_err(failed)?;
                Ok(None)
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
                        .map_err(|e| failed(format!("sas_token does not fit in a URL: {e}")))?,
                );
                parts.uri = http::Uri::from_parts(builder)
                    .map_err(|e| failed(format!("sas_token does not fit in a URL: {e}")))?;
                Ok(None)
            }
            AzureCredential::Entra(_) => {
                let tokens = self.tokens.as_ref().expect("an Entra grant has its cache");
                let token = tokens.get().await.map_err(Refusal::NoToken)?;
                let value = format!("Bearer {token}").parse().map_err(|_| {
                    Refusal::NoToken("the Entra ID token does not fit in a header".into())
                })?;
                parts.headers.insert(http::header::AUTHORIZATION, value);
                Ok(Some(token))
            }
        }
    }

    /// Azure answered 401 to a request carrying `token`: the next one is
    /// minted afresh.
    pub async fn token_refused(&self, token: &str) {
        if let Some(tokens) = &self.tokens {
            tokens.forget(token).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    /// An Entra ID token goes only to the account's own endpoint.
    #[test]
    fn an_entra_token_goes_only_to_the_accounts_endpoint() {
        let take = |endpoint: &str| {
            let mut config: Vec<(String, String)> = [
                ("storage_account_name", "acme"),
                ("container_name", "tfstate"),
                ("key", "prod.tfstate"),
                ("blob_endpoint", endpoint),
                ("client_id", "app"),
                ("tenant_id", "tenant"),
                ("client_secret", "s"),
            ]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
            let origin = endpoint.split('/').take(3).collect::<Vec<_>>().join("/");
            let origin = Origin::parse(&origin).unwrap();
            AzureGrant::take(vec![origin], &mut config, &mut Vec::new(), Path::new("/"))
                .map(|g| g.is_some())
        };
        assert_eq!(take("https://acme.blob.core.windows.net"), Ok(true));
        assert_eq!(
            take("https://acme.privatelink.blob.core.windows.net"),
            Ok(true)
        );
        assert_eq!(take("http://127.0.0.1:10000/devstoreaccount1"), Ok(true));
        for elsewhere in [
            "https://other.blob.core.windows.net",
            "https://acme.blob.example.com",
            "https://acme.blob.core.windows.net.example.com",
        ] {
            let e = take(elsewhere).unwrap_err();
            assert!(e.starts_with("blob_endpoint:"), "{e}");
        }
    }
}
