//! List Blobs answers (XML), every page followed.

use crate::blobs::Container;
use serde::Deserialize;
use wasmstate_guest::Error;

/// One blob or snapshot of a listing.
#[derive(Debug, Clone, Deserialize)]
pub struct Listed {
    /// Full blob name.
    #[serde(rename = "Name")]
    pub name: String,
    /// The snapshot's timestamp; `None` for the base blob.
    #[serde(rename = "Snapshot", default)]
    pub snapshot: Option<String>,
    /// Its properties.
    #[serde(rename = "Properties")]
    pub properties: Properties,
}

/// The properties a listing gives, as far as the guest reads them.
#[derive(Debug, Clone, Deserialize)]
pub struct Properties {
    /// When its content was last written (RFC 1123).
    #[serde(rename = "Last-Modified", default)]
    pub last_modified: String,
    /// Its ETag.
    #[serde(rename = "Etag", default)]
    pub etag: String,
    /// Its size in bytes.
    #[serde(rename = "Content-Length", default)]
    pub content_length: u64,
    /// Its Content-MD5 (base64; empty when it has none).
    #[serde(rename = "Content-MD5", default)]
    pub content_md5: String,
}

impl Listed {
    /// When its content was written, milliseconds since the Unix epoch (0
    /// when the store's date cannot be read).
    pub fn modified_unix_ms(&self) -> u64 {
        httpdate::parse_http_date(&self.properties.last_modified)
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

#[derive(Deserialize)]
struct Page {
    #[serde(rename = "Blobs", default)]
    blobs: Blobs,
    #[serde(rename = "NextMarker", default)]
    next_marker: Option<String>,
}

#[derive(Deserialize, Default)]
struct Blobs {
    #[serde(rename = "Blob", default)]
    blob: Vec<Listed>,
}

/// Every blob whose name starts with `prefix`, with its snapshots when
/// asked, over as many pages as the store answers.
pub fn all(container: &Container, prefix: &str, snapshots: bool) -> Result<Vec<Listed>, Error> {
    let mut listed = Vec::new();
    let mut marker: Option<String> = None;
    loop {
        let answer = container.list_page(prefix, snapshots, marker.as_deref())?;
        let text = String::from_utf8_lossy(&answer.body);
        let page: Page = quick_xml::de::from_str(&text).map_err(|e| {
            Error::Internal(format!(
                "listing {} answered XML that is not a blob list: {e}",
                container.path(prefix)
            ))
        })?;
        listed.extend(page.blobs.blob);
        match page.next_marker {
            Some(next) if !next.is_empty() => marker = Some(next),
            _ => return Ok(listed),
        }
    }
}
