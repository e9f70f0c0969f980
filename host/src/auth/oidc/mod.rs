//! Sign-in with an OIDC token (a CI job's short-lived signed JWT: GitHub
//! Actions, GitLab CI, Kubernetes service accounts), mapped to grants by
//! the token's claims, as Vault's JWT auth does.
//!
//! A token is checked by [`jsonwebtoken`]: its `kid` names a key of the
//! issuer's key set ([`keys`]); its algorithm must be an asymmetric one
//! from [`ALGORITHMS`] (never `none`, never HMAC, which a public key would
//! turn into a shared secret) and, when the key names one, the key's;
//! `iss` must be the issuer exactly, `aud` one of the audiences, `exp`,
//! `nbf` and `iat` hold within [`LEEWAY`]. Its grants are the union of
//! every role whose bound claims all match; none leaves it signed in
//! with no grants (403 everywhere).

pub mod claims;
pub mod keys;

pub use claims::{DEFAULT_AUDIT_CLAIMS, OidcRole};

use super::{AuthError, Identity};
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// The algorithms a token may be signed with.
pub const ALGORITHMS: [Algorithm; 9] = [
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Clock difference tolerated on `exp`, `nbf` and `iat`.
pub const LEEWAY: Duration = Duration::from_secs(60);

/// Longest `sub` kept in a caller's name; longer ones are cut.
const MAX_SUBJECT: usize = 200;

/// Longest token read at all (CI tokens are 1 to 2 KiB).
pub const MAX_TOKEN_BYTES: usize = 16 << 10;

/// One `[[oidc]]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OidcConfig {
    /// Shown in logs and callers' names (`oidc:<name>:<sub>`).
    pub name: String,
    /// The `iss` tokens must carry, exactly; an `https://` URL.
    pub issuer: String,
    /// `aud` must contain one of these.
    pub audiences: Vec<String>,
    /// Where the keys are; `None`: from the issuer's discovery document.
    pub jwks_url: Option<String>,
    /// Extra PEM roots for a private issuer.
    pub ca_file: Option<PathBuf>,
    /// Which claims earn which grants.
    pub roles: Vec<OidcRole>,
    /// Claims the audit trail keeps of a caller (besides those its matched
    /// roles bind).
    pub audit_claims: Vec<String>,
}

/// An issuer whose tokens sign callers in.
pub struct Issuer {
    config: OidcConfig,
    keys: Arc<keys::Keys>,
}

impl std::fmt::Debug for Issuer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issuer")
            .field("name", &self.config.name)
            .field("issuer", &self.config.issuer)
            .finish_non_exhaustive()
    }
}

impl Issuer {
    /// Ready to check `config`'s tokens (its keys are fetched on first use).
    pub fn new(config: OidcConfig) -> anyhow::Result<Issuer> {
        let roots = config
            .ca_file
            .as_ref()
            .map(|path| {
                std::fs::read(path).map_err(|e| {
                    anyhow::anyhow!("oidc {:?}: ca_file {}: {e}", config.name, path.display())
                })
            })
            .transpose()?;
        let keys = keys::Keys::new(&config.issuer, config.jwks_url.as_deref(), roots.as_deref())
            .map_err(|e| anyhow::anyhow!("oidc {:?}: {e:#}", config.name))?;
        Ok(Issuer {
            config,
            keys: Arc::new(keys),
        })
    }

    /// The `iss` its tokens carry.
    pub fn issuer(&self) -> &str {
        &self.config.issuer
    }

    /// Who `token` signs in, with the grants its claims earn.
    pub async fn verify(&self, token: &str) -> Result<Identity, AuthError> {
        // RFC 7515 4.1.11: a `crit` extension not understood is refused;
        // this host understands none.
        if json_part(token, 0).is_none_or(|h| h.get("crit").is_some()) {
            return Err(AuthError::Invalid);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|_| AuthError::Invalid)?;
        if !ALGORITHMS.contains(&header.alg) {
            return Err(AuthError::Invalid);
        }
        let kid = header.kid.ok_or(AuthError::Invalid)?;
        let jwk = self.keys.key(&kid).await.ok_or(AuthError::Invalid)?;
        // A key published for one algorithm never checks another's token.
        if let Some(for_alg) = jwk.common.key_algorithm
            && for_alg.to_string().parse::<Algorithm>().ok() != Some(header.alg)
        {
            return Err(AuthError::Invalid);
        }
        // An HMAC ("oct") key would check only HS* tokens, which the
        // allow-list refuses; jsonwebtoken also refuses a key of another
        // family than the algorithm.
        let key = DecodingKey::from_jwk(&jwk).map_err(|_| AuthError::Invalid)?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = LEEWAY.as_secs();
        validation.validate_nbf = true;
        validation.set_issuer(&[&self.config.issuer]);
        validation.set_audience(&self.config.audiences);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        let claims =
            jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation)
                .map_err(|_| AuthError::Invalid)?
                .claims;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        // Issued in the future: a clock far off, or a forged token.
        if let Some(iat) = claims.get("iat").and_then(Value::as_u64)
            && iat > now + LEEWAY.as_secs()
        {
            return Err(AuthError::Invalid);
        }
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .ok_or(AuthError::Invalid)?;
        let matched: Vec<&OidcRole> = self
            .config
            .roles
            .iter()
            .filter(|role| role.matches(&claims))
            .collect();
        let grants = matched
            .iter()
            .flat_map(|role| role.grants.iter().cloned())
            .collect();
        let bound = matched
            .iter()
            .flat_map(|role| role.bound_claims.iter().map(|(name, _)| name.as_str()));
        let audited = self.config.audit_claims.iter().map(String::as_str);
        Ok(Identity {
            claims: claims::kept(&claims, audited.chain(bound)),
            name: format!(
                "oidc:{}:{}",
                self.config.name,
                subject.chars().take(MAX_SUBJECT).collect::<String>()
            ),
            grants,
        })
    }
}

/// The `iss` a JWT says it has, read without checking anything, to pick
/// the issuer that checks it; `None` for what is not a JWT.
pub fn unchecked_issuer(token: &str) -> Option<String> {
    match json_part(token, 1)?.get("iss")? {
        Value::String(iss) => Some(iss.clone()),
        _ => None,
    }
}

/// Part `index` (0: header, 1: payload) of a compact JWT of three parts,
/// decoded as a JSON object; `None` for anything else or past
/// [`MAX_TOKEN_BYTES`].
fn json_part(token: &str, index: usize) -> Option<serde_json::Map<String, Value>> {
    if token.len() > MAX_TOKEN_BYTES || token.split('.').count() != 3 {
        return None;
    }
    let part = token.split('.').nth(index)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(part)
        .ok()?;
    match serde_json::from_slice(&bytes).ok()? {
        Value::Object(map) => Some(map),
        _ => None,
    }
}
