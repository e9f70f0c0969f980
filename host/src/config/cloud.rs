//! Which cloud's credentials the host adds to a backend's requests, and to
//! which origins: the operator's `aws_sign`, `azure_sign` or `gcp_auth`,
//! else, for a first-party cloud guest, every endpoint its configuration
//! names. One cloud per backend: their credential keys share names
//! (`access_key`), and a guest never needs two.

use crate::capabilities::aws::AwsGrant;
use crate::capabilities::azure::AzureGrant;
use crate::capabilities::gcp::GcpGrant;
use crate::guests::{self, Cloud, GuestSource};
use crate::policy::Origin;

/// The origins an operator listed for each cloud (`None`: not listed).
#[derive(Debug, Clone, Default)]
pub struct CloudLists {
    /// `aws_sign`.
    pub aws_sign: Option<Vec<Origin>>,
    /// `azure_sign`.
    pub azure_sign: Option<Vec<Origin>>,
    /// `gcp_auth`.
    pub gcp_auth: Option<Vec<Origin>>,
}

/// What a backend is granted of each cloud; at most one is `Some`.
#[derive(Debug, Clone, Default)]
pub struct CloudGrants {
    /// AWS: SigV4.
    pub aws: Option<AwsGrant>,
    /// Azure Storage: Shared Key, SAS or an Entra ID token.
    pub azure: Option<AzureGrant>,
    /// Google Cloud: an OAuth2 access token.
    pub gcp: Option<GcpGrant>,
}

/// The grants of a backend running `guest`: their credential settings are
/// taken out of `guest_config` (relative paths from `base`) and their
/// origins become reachable in `allow_http`. `Err` names the key at fault
/// (relative to the backend's table) and what to write.
pub fn take_cloud_grants(
    guest: &GuestSource,
    lists: CloudLists,
    default_http: &[Origin],
    guest_config: &mut Vec<(String, String)>,
    allow_http: &mut Vec<Origin>,
    base: &std::path::Path,
) -> Result<CloudGrants, String> {
    let listed = [&lists.aws_sign, &lists.azure_sign, &lists.gcp_auth]
        .iter()
        .filter(|l| l.as_ref().is_some_and(|l| !l.is_empty()))
        .count();
    if listed > 1 {
        return Err(
            "aws_sign, azure_sign, gcp_auth: list one cloud's endpoints per backend (their credential settings share names)"
                .into(),
        );
    }
    let embedded = guests::cloud(guest);
    // A first-party cloud guest's credential settings always leave its
    // config: with no origins to sign for they would stay there, in the
    // guest's hands.
    let own = match embedded {
        Cloud::Aws => Some(("aws_sign", &lists.aws_sign)),
        Cloud::Azure => Some(("azure_sign", &lists.azure_sign)),
        Cloud::Gcp => Some(("gcp_auth", &lists.gcp_auth)),
        Cloud::None => None,
    };
    if let Some((key, list)) = own {
        if list.as_ref().is_some_and(|l| l.is_empty()) {
            return Err(format!(
                "{key}: empty; this guest reaches its storage only through the endpoints listed there (remove the key to sign for its configured endpoint)"
            ));
        }
        if list.is_none() && listed > 0 {
            return Err(format!(
                "aws_sign, azure_sign, gcp_auth: this guest's requests carry {key}'s credentials; list its endpoints there"
            ));
        }
    }
    let origins = |list: Option<Vec<Origin>>, cloud: Cloud| match list {
        Some(list) => list,
        None if embedded == cloud && listed == 0 => default_http.to_vec(),
        None => Vec::new(),
    };
    let config = |e: String| format!("config.{e}");
    Ok(CloudGrants {
        aws: AwsGrant::take(
            origins(lists.aws_sign, Cloud::Aws),
            matches!(guest, GuestSource::Embedded(_)),
            guest_config,
            allow_http,
            base,
        )
        .map_err(config)?,
        azure: AzureGrant::take(
            origins(lists.azure_sign, Cloud::Azure),
            guest_config,
            allow_http,
            base,
        )
        .map_err(config)?,
        gcp: GcpGrant::take(
            origins(lists.gcp_auth, Cloud::Gcp),
            guest_config,
            allow_http,
            base,
        )
        .map_err(config)?,
    })
}
