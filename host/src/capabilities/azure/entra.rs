//! Signing in to Microsoft Entra ID for a backend's storage account: which
//! way, from the backend's settings (Terraform `azurerm`'s names) or the
//! environment (`ARM_*` as Terraform reads them, `AZURE_*` as Azure's own
//! SDKs and AKS workload identity set them).
//!
//! The ways, as Terraform's `azurerm` backend has them with
//! `use_azuread_auth = true`: workload identity (`use_oidc`, a federated
//! token file exchanged as a client assertion), managed identity
//! (`use_msi`, the instance metadata endpoint), a client secret, a client
//! certificate (a client assertion signed with its key).

use std::fmt;
use std::path::{Path, PathBuf};

/// Microsoft Entra ID in Azure's public cloud.
const PUBLIC_AUTHORITY: &str = "https://login.microsoftonline.com";
/// The instance metadata service's managed-identity endpoint.
const IMDS_ENDPOINT: &str = "http://169.254.169.254/metadata/identity/oauth2/token";

/// Settings the host takes out of an `azure` backend's config for Entra ID
/// (the guest keeps `use_azuread_auth`, `use_oidc`, `use_msi`,
/// `client_id`, `tenant_id`, `environment`, `authority_host`: none of them
/// is a credential, and it checks they agree).
pub const TAKEN_KEYS: &[&str] = &[
    "client_secret",
    "client_certificate_path",
    "client_certificate_password",
    "oidc_token_file_path",
    "oidc_token",
    "msi_endpoint",
];

/// An application's identity at one tenant's token endpoint.
#[derive(Clone, PartialEq, Eq)]
pub struct App {
    /// `client_id`: the application (or user-assigned identity).
    pub client_id: String,
    /// `tenant_id`.
    pub tenant_id: String,
    /// The tenant's token endpoint (`{authority}/{tenant}/oauth2/v2.0/token`).
    pub token_url: String,
}

/// How the host signs in.
#[derive(Clone, PartialEq, Eq)]
pub enum Way {
    /// Workload identity: the (rotating) federated token in `file`, re-read
    /// at every exchange, or a fixed `oidc_token`.
    Federated {
        /// Who signs in, where.
        app: App,
        /// The federated token's file, or the token itself.
        token: FederatedToken,
    },
    /// A managed identity, from the metadata endpoint of the VM or
    /// service the host runs on.
    Managed {
        /// The endpoint (`msi_endpoint`, else the instance metadata one).
        endpoint: String,
        /// A user-assigned identity's client ID; `None`: the system one.
        client_id: Option<String>,
        /// App Service's form (`IDENTITY_ENDPOINT`): its header's value.
        identity_header: Option<String>,
    },
    /// A client secret.
    Secret {
        /// Who signs in, where.
        app: App,
        /// `client_secret`.
        secret: String,
    },
    /// A client certificate (PEM, or PKCS#12 with its password): assertions
    /// signed with its key.
    Certificate {
        /// Who signs in, where.
        app: App,
        /// The private key, PEM (one block).
        key_pem: String,
        /// base64url of the certificate's SHA-1 (the assertion's `x5t`).
        x5t: String,
        /// The file, for messages.
        path: PathBuf,
    },
}

/// Where a federated token comes from.
#[derive(Clone, PartialEq, Eq)]
pub enum FederatedToken {
    /// A file a platform rewrites as the token rotates.
    File(PathBuf),
    /// `oidc_token`, given as is.
    Fixed(String),
}

impl Way {
    /// What to name in a message: the way, the client and the tenant.
    pub fn describe(&self) -> String {
        match self {
            Way::Federated { app, token } => {
                let from = match token {
                    FederatedToken::File(path) => format!("token file {}", path.display()),
                    FederatedToken::Fixed(_) => "oidc_token".into(),
                };
                format!("workload identity ({from}, {})", app.describe())
            }
            Way::Managed {
                endpoint,
                client_id,
                ..
            } => match client_id {
                Some(id) => format!("managed identity {id} at {endpoint}"),
                None => format!("the system-assigned managed identity at {endpoint}"),
            },
            Way::Secret { app, .. } => format!("client secret ({})", app.describe()),
            Way::Certificate { app, path, .. } => {
                format!("client certificate {} ({})", path.display(), app.describe())
            }
        }
    }
}

impl App {
    fn describe(&self) -> String {
        format!(
            "client {} in tenant {} at {}",
            self.client_id, self.tenant_id, self.token_url
        )
    }
}

impl fmt::Debug for Way {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never a secret, a key or a token.
        write!(f, "Entra({})", self.describe())
    }
}

/// A setting's value: the backend's, else the first of `envs` set.
struct Lookup<'a> {
    taken: &'a [(String, String)],
    visible: &'a [(String, String)],
}

impl Lookup<'_> {
    /// The backend's own value of `name`.
    fn own(&self, name: &str) -> Option<String> {
        super::super::setting(self.taken, name)
            .or_else(|| super::super::setting(self.visible, name))
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
    }

    /// The backend's `name`, else the environment's; and whether it came
    /// from the environment.
    fn get(&self, name: &str, envs: &[&str]) -> Option<(String, bool)> {
        if let Some(v) = self.own(name) {
            return Some((v, false));
        }
        envs.iter().find_map(|e| {
            std::env::var(e)
                .ok()
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .map(|v| (v, true))
        })
    }

    /// A secret's value, the backend's else the env's, as given (not
    /// trimmed: spaces may be part of a password); empty is none.
    fn secret(&self, name: &str, envs: &[&str]) -> Option<String> {
        super::super::setting(self.taken, name)
            .or_else(|| super::super::setting(self.visible, name))
            .or_else(|| envs.iter().find_map(|e| std::env::var(e).ok()))
            .filter(|v| !v.is_empty())
    }

    /// A boolean setting (`true`/`false`), the backend's else the env's.
    fn flag(&self, name: &str, envs: &[&str]) -> Result<Option<bool>, String> {
        match self.get(name, envs) {
            None => Ok(None),
            Some((v, _)) => match v.to_ascii_lowercase().as_str() {
                "true" => Ok(Some(true)),
                "false" => Ok(Some(false)),
                _ => Err(format!("{name}: {v:?} is not true or false")),
            },
        }
    }
}

/// The Entra ID sign-in a backend's settings ask for; `None` when they ask
/// for none (an account key or SAS token then). `ambient` in the answer:
/// the credential is the host's own (its environment, its managed
/// identity) rather than one the backend's config names.
pub fn resolve(
    taken: &[(String, String)],
    visible: &[(String, String)],
    base: &Path,
) -> Result<Option<(Way, bool)>, String> {
    let look = Lookup { taken, visible };
    let azuread = look.flag("use_azuread_auth", &["ARM_USE_AZUREAD"])?;
    // Ways the backend's own config names.
    let own_true = |name: &str| {
        look.own(name)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    };
    let mut named: Vec<&str> = Vec::new();
    if own_true("use_oidc")
        || look.own("oidc_token_file_path").is_some()
        || look.own("oidc_token").is_some()
    {
        named.push("use_oidc");
    }
    if own_true("use_msi") {
        named.push("use_msi");
    }
    if look.own("client_secret").is_some() {
        named.push("client_secret");
    }
    if look.own("client_certificate_path").is_some() {
        named.push("client_certificate_path");
    }
    if named.len() > 1 {
        return Err(format!(
            "{}: name one way of signing in to Entra ID, not {}",
            named.join(", "),
            named.len()
        ));
    }
    match azuread {
        Some(false) if !named.is_empty() => {
            return Err(format!(
                "use_azuread_auth = false contradicts {}: wasmstate signs in to storage with Entra ID (it fetches no account keys through Azure Resource Manager); set use_azuread_auth = true",
                named[0]
            ));
        }
        None if named.is_empty() => return Ok(None),
        Some(false) => return Ok(None),
        _ => {}
    }
    if look
        .own("use_oidc")
        .is_some_and(|v| v.eq_ignore_ascii_case("false"))
        && (look.own("oidc_token_file_path").is_some() || look.own("oidc_token").is_some())
    {
        return Err(
            "use_oidc = false contradicts oidc_token_file_path / oidc_token: remove one".into(),
        );
    }
    // Without one named in the config: the environment's, in Terraform's
    // order (certificate, secret, OIDC, managed identity last, as Azure's
    // own default chain ends).
    let way = match named.first() {
        Some(way) => *way,
        None => {
            let env = |names: &[&str]| {
                names
                    .iter()
                    .any(|n| std::env::var(n).is_ok_and(|v| !v.trim().is_empty()))
            };
            if env(&[
                "ARM_CLIENT_CERTIFICATE_PATH",
                "AZURE_CLIENT_CERTIFICATE_PATH",
            ]) {
                "client_certificate_path"
            } else if env(&["ARM_CLIENT_SECRET", "AZURE_CLIENT_SECRET"]) {
                "client_secret"
            } else if look.flag("use_oidc", &["ARM_USE_OIDC"])? == Some(true)
                || env(&["ARM_OIDC_TOKEN_FILE_PATH", "AZURE_FEDERATED_TOKEN_FILE"])
            {
                "use_oidc"
            } else {
                "use_msi"
            }
        }
    };
    let client_id = look.get("client_id", &["ARM_CLIENT_ID", "AZURE_CLIENT_ID"]);
    let app = |what: &str| -> Result<App, String> {
        let (client_id, _) = client_id.clone().ok_or_else(|| {
            format!(
                "client_id: required to sign in with {what} (or ARM_CLIENT_ID / AZURE_CLIENT_ID)"
            )
        })?;
        let (tenant_id, _) = look
            .get("tenant_id", &["ARM_TENANT_ID", "AZURE_TENANT_ID"])
            .ok_or_else(|| {
                format!("tenant_id: required to sign in with {what} (or ARM_TENANT_ID / AZURE_TENANT_ID)")
            })?;
        check_id("client_id", &client_id)?;
        check_id("tenant_id", &tenant_id)?;
        Ok(App {
            token_url: format!("{}/{tenant_id}/oauth2/v2.0/token", authority(&look)?),
            client_id,
            tenant_id,
        })
    };
    let resolved = match way {
        "use_oidc" => {
            let app = app("workload identity")?;
            let (token, ambient) = match look.own("oidc_token") {
                Some(token) => (FederatedToken::Fixed(token), false),
                None => {
                    let (path, ambient) = look
                        .get(
                            "oidc_token_file_path",
                            &["ARM_OIDC_TOKEN_FILE_PATH", "AZURE_FEDERATED_TOKEN_FILE"],
                        )
                        .ok_or(
                            "oidc_token_file_path: required with use_oidc (or AZURE_FEDERATED_TOKEN_FILE, which AKS workload identity sets)",
                        )?;
                    (FederatedToken::File(base.join(path)), ambient)
                }
            };
            (Way::Federated { app, token }, ambient)
        }
        "use_msi" => {
            let header = std::env::var("IDENTITY_HEADER")
                .ok()
                .filter(|v| !v.is_empty());
            let (endpoint, identity_header) = match look.get("msi_endpoint", &["ARM_MSI_ENDPOINT"])
            {
                Some((endpoint, _)) => (endpoint, None),
                None => match (std::env::var("IDENTITY_ENDPOINT").ok(), header) {
                    (Some(endpoint), Some(header)) if !endpoint.is_empty() => {
                        (endpoint, Some(header))
                    }
                    _ => (IMDS_ENDPOINT.to_string(), None),
                },
            };
            let uri: http::Uri = endpoint
                .parse()
                .map_err(|e| format!("msi_endpoint: {endpoint:?} is not a URL: {e}"))?;
            if uri.scheme_str() != Some("http") && uri.scheme_str() != Some("https") {
                return Err(format!("msi_endpoint: {endpoint:?} is not an http(s) URL"));
            }
            let client_id = client_id.map(|(id, _)| id);
            if let Some(id) = &client_id {
                check_id("client_id", id)?;
            }
            (
                Way::Managed {
                    endpoint,
                    client_id,
                    identity_header,
                },
                true,
            )
        }
        "client_secret" => {
            let app = app("a client secret")?;
            let (secret, ambient) = look
                .get(
                    "client_secret",
                    &["ARM_CLIENT_SECRET", "AZURE_CLIENT_SECRET"],
                )
                .ok_or("client_secret: required")?;
            (Way::Secret { app, secret }, ambient)
        }
        _ => {
            let app = app("a client certificate")?;
            let (path, ambient) = look
                .get(
                    "client_certificate_path",
                    &[
                        "ARM_CLIENT_CERTIFICATE_PATH",
                        "AZURE_CLIENT_CERTIFICATE_PATH",
                    ],
                )
                .ok_or("client_certificate_path: required")?;
            let path = base.join(path);
            let password = look.secret(
                "client_certificate_password",
                &[
                    "ARM_CLIENT_CERTIFICATE_PASSWORD",
                    "AZURE_CLIENT_CERTIFICATE_PASSWORD",
                ],
            );
            let super::certificate::ClientCertificate { key_pem, x5t } =
                super::certificate::read(&path, password.as_deref())?;
            (
                Way::Certificate {
                    app,
                    key_pem,
                    x5t,
                    path,
                },
                ambient,
            )
        }
    };
    Ok(Some(resolved))
}

/// `authority_host`, `AZURE_AUTHORITY_HOST`, else the `environment`'s
/// (Terraform's names: public, usgovernment, china).
fn authority(look: &Lookup<'_>) -> Result<String, String> {
    let host = match look.get("authority_host", &["AZURE_AUTHORITY_HOST"]) {
        Some((host, _)) => host,
        None => match look
            .get("environment", &["ARM_ENVIRONMENT"])
            .map(|(e, _)| e.to_ascii_lowercase())
            .as_deref()
        {
            None | Some("public") => PUBLIC_AUTHORITY.into(),
            Some("usgovernment") => "https://login.microsoftonline.us".into(),
            Some("china") => "https://login.chinacloudapi.cn".into(),
            Some(other) => {
                return Err(format!(
                    "environment: {other:?} is not public, usgovernment or china (or set authority_host)"
                ));
            }
        },
    };
    let uri: http::Uri = host
        .parse()
        .map_err(|e| format!("authority_host: {host:?} is not a URL: {e}"))?;
    let loopback = uri.host().is_some_and(super::super::is_loopback);
    if uri.scheme_str() != Some("https") && !(loopback && uri.scheme_str() == Some("http")) {
        return Err(format!(
            "authority_host: {host:?} must be https (plain http only to loopback): credentials go there"
        ));
    }
    Ok(host.trim_end_matches('/').to_string())
}

/// A client or tenant ID: a GUID or a domain name, nothing that changes
/// the token endpoint's path.
fn check_id(name: &str, id: &str) -> Result<(), String> {
    if id.len() <= 253
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !id.starts_with('.')
    {
        Ok(())
    } else {
        Err(format!(
            "{name}: {id:?} is not a GUID or domain name (e.g. 00000000-0000-0000-0000-000000000000)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn contradictory_ways_are_refused_in_one_line() {
        let base = Path::new("/");
        let visible = pairs(&[
            ("use_azuread_auth", "true"),
            ("use_msi", "true"),
            ("client_id", "a"),
            ("tenant_id", "t"),
        ]);
        let taken = pairs(&[("client_secret", "s3cret")]);
        let e = resolve(&taken, &visible, base).unwrap_err();
        assert!(e.starts_with("use_msi, client_secret:"), "{e}");
        assert!(!e.contains("s3cret") && !e.contains('\n'), "{e}");
        let off = pairs(&[("use_azuread_auth", "false"), ("use_oidc", "true")]);
        let e = resolve(&[], &off, base).unwrap_err();
        assert!(e.contains("set use_azuread_auth = true"), "{e}");
        // Neither: not Entra ID.
        assert_eq!(resolve(&[], &[], base), Ok(None));
    }

    #[test]
    fn a_secret_signs_in_at_its_tenants_endpoint() {
        let visible = pairs(&[
            ("use_azuread_auth", "true"),
            ("client_id", "app"),
            ("tenant_id", "contoso.onmicrosoft.com"),
            ("authority_host", "http://127.0.0.1:9/"),
        ]);
        let taken = pairs(&[("client_secret", "s")]);
        let (way, ambient) = resolve(&taken, &visible, Path::new("/")).unwrap().unwrap();
        assert!(!ambient);
        let Way::Secret { app, .. } = &way else {
            panic!("{way:?}")
        };
        assert_eq!(
            app.token_url,
            "http://127.0.0.1:9/contoso.onmicrosoft.com/oauth2/v2.0/token"
        );
        assert!(!format!("{way:?}").contains("\"s\""));
        let bad = pairs(&[("tenant_id", "../x"), ("client_id", "a")]);
        assert!(resolve(&taken, &bad, Path::new("/")).is_err());
        let plain = pairs(&[
            ("client_id", "a"),
            ("tenant_id", "t"),
            ("authority_host", "http://login.example.com"),
        ]);
        let e = resolve(&taken, &plain, Path::new("/")).unwrap_err();
        assert!(e.starts_with("authority_host:"), "{e}");
    }
}
