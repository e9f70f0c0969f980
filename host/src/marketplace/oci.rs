//! Guests as OCI artifacts (`oci://registry/repository:tag`), through the
//! maintained `oci-client` crate: one layer holds the component
//! (`application/wasm`), an optional second one its minisign signature.
//! The layer digest of the component is its sha256, the same digest the
//! store and configs pin.
//!
//! Registries are spoken to over HTTPS, except a registry on a loopback
//! address (a local test or mirror), which gets plain HTTP.

use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

/// Media type of the component layer (the Wasm OCI artifact convention).
pub const WASM_LAYER: &str = "application/wasm";
/// Media type of the signature layer.
pub const SIGNATURE_LAYER: &str = "application/vnd.wasmstate.guest.signature.v1+minisign";
const CONFIG_TYPE: &str = "application/vnd.wasm.config.v0+json";

fn reference(location: &str) -> Result<(Client, Reference), String> {
    let text = location
        .strip_prefix("oci://")
        .ok_or_else(|| format!("{location}: not an oci:// reference"))?;
    let reference: Reference = text.parse().map_err(|e| {
        format!(
            "{location}: not a registry reference ({e}); write oci://HOST[:PORT]/REPOSITORY:TAG"
        )
    })?;
    let registry = reference.resolve_registry().to_string();
    let host = registry
        .rsplit_once(':')
        .map_or(registry.as_str(), |(h, _)| h);
    let loopback = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    let protocol = if loopback {
        ClientProtocol::HttpsExcept(vec![registry.clone()])
    } else {
        ClientProtocol::Https
    };
    let client = Client::new(ClientConfig {
        protocol,
        ..ClientConfig::default()
    });
    Ok((client, reference))
}

/// Pull the component and, when the artifact has one, its signature.
pub async fn pull(location: &str) -> Result<(Vec<u8>, Option<String>), String> {
    let (client, reference) = reference(location)?;
    let image = client
        .pull(
            &reference,
            &RegistryAuth::Anonymous,
            vec![WASM_LAYER, SIGNATURE_LAYER],
        )
        .await
        .map_err(|e| format!("cannot pull {location}: {e}"))?;
    let mut wasm = None;
    let mut signature = None;
    for layer in image.layers {
        match layer.media_type.as_str() {
            WASM_LAYER => wasm = Some(layer.data),
            SIGNATURE_LAYER => {
                signature = Some(
                    String::from_utf8(layer.data)
                        .map_err(|_| format!("{location}: the signature layer is not text"))?,
                )
            }
            _ => {}
        }
    }
    let wasm = wasm.ok_or_else(|| format!("{location}: the artifact has no {WASM_LAYER} layer"))?;
    Ok((wasm, signature))
}

/// Push a component (and its signature) as an artifact; returns the URL
/// the registry reports.
pub async fn push(
    location: &str,
    wasm: Vec<u8>,
    signature: Option<String>,
) -> Result<String, String> {
    let (client, reference) = reference(location)?;
    let mut layers = vec![ImageLayer::new(wasm, WASM_LAYER.to_string(), None)];
    if let Some(signature) = signature {
        layers.push(ImageLayer::new(
            signature.into_bytes(),
            SIGNATURE_LAYER.to_string(),
            None,
        ));
    }
    let config = Config::new(
        br#"{"architecture":"wasm","os":"wasip2"}"#.to_vec(),
        CONFIG_TYPE.to_string(),
        None,
    );
    let response = client
        .push(&reference, &layers, config, &RegistryAuth::Anonymous, None)
        .await
        .map_err(|e| format!("cannot push to {location}: {e}"))?;
    Ok(response.manifest_url)
}
