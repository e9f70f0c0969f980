//! Blobs in one Azure Storage container, through the Blob service's REST
//! API over `wasi:http`.
//!
//! Requests leave unsigned: every one carries `x-ms-version` and no
//! `Authorization` or `x-ms-date`; the host adds both (SharedKey) or the
//! SAS token once the guest's headers are final, so no credential ever
//! enters the guest.

use wasmstate_guest::Error;
use wasmstate_guest::http::{self, Response};

/// The REST API version every request asks for: one Azurite serves and
/// every Azure region has had for years.
pub const API_VERSION: &str = "2021-12-02";

/// Bytes of each ranged read and of each block of a large upload: what
/// the guest holds of a state at once. States up to this size go up in one
/// Put Blob.
pub const PART_BYTES: usize = 4 << 20;

mod upload;

/// Prefix of user metadata headers.
const META: &str = "x-ms-meta-";

/// What Get Blob Properties says about a blob.
#[derive(Debug, Clone)]
pub struct Props {
    /// Its ETag, quotes included, as `If-Match` wants it.
    pub etag: String,
    /// Its size in bytes.
    pub size: u64,
    /// Whether a lease is held on it (`x-ms-lease-status: locked`).
    pub leased: bool,
    /// Its user metadata, names lowercase, in the order received.
    pub metadata: Vec<(String, String)>,
    /// Its Content-MD5 (base64), which the store keeps for every Put Blob
    /// and a metadata change leaves alone.
    pub md5: Option<String>,
}

impl Props {
    /// The value of metadata `name`.
    pub fn meta(&self, name: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What an upload or metadata change may replace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Condition {
    /// Only where no blob exists (`If-None-Match: *`).
    Absent,
    /// Only the blob with this ETag (`If-Match`).
    Etag(String),
    /// Anything.
    Any,
}

/// Why the store refused a change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The condition did not hold: the blob changed, or exists.
    Changed,
    /// A lease is held and the request carried none, or another one.
    Lease,
    /// No such blob.
    Missing,
}

/// One container.
pub struct Container {
    /// The blob service's base URL, without a trailing `/`.
    endpoint: String,
    /// The container's name.
    pub name: String,
}

/// What [`encode`] escapes: everything but RFC 3986's unreserved
/// characters, as Azure's own SDKs quote blob names and query values.
const ESCAPED: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'.')
    .remove(b'_')
    .remove(b'~');

/// Percent-encode `text` for a URL path segment or query value.
pub fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, ESCAPED).to_string()
}

/// Whether a request may be sent again when it failed without an answer.
/// Such a request may still have been applied, so only one whose repeat
/// does no more than it did is repeated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeat {
    /// A read; a change conditional on an ETag or on absence (a repeat of
    /// one applied answers 412 or 409: the "changed" outcome, never a
    /// second change); metadata set under the lease (the same again); a
    /// lease acquired with the same proposed ID (granted again to it).
    Safe,
    /// A repeat could act twice: a snapshot, a lease released or broken
    /// (someone else's, by then), a block (4 MiB held twice to resend it;
    /// a lost one fails the upload, which the client retries).
    Never,
}

/// Sleep `ms` milliseconds (a pause between tries, never a synchronisation).
pub fn pause(ms: u64) {
    http::pause(std::time::Duration::from_millis(ms));
}

/// The error an unexpected answer is.
pub fn failed(what: &str, answer: &Response) -> Error {
    let code = answer.header("x-ms-error-code").unwrap_or("");
    let text = answer.excerpt(300);
    let message = format!("{what}: {} {code} {text}", answer.status);
    match answer.status {
        408 | 429 | 500..=599 => Error::Unavailable(message),
        _ => Error::Internal(message),
    }
}

/// Whether a 409/412 answer is about a lease rather than a condition
/// (`LeaseIdMissing`, `LeaseIdMismatchWithBlobOperation`, …).
fn about_lease(answer: &Response) -> bool {
    answer
        .header("x-ms-error-code")
        .is_some_and(|code| code.starts_with("Lease"))
}

impl Container {
    /// The container `name` of the blob service at `endpoint`
    /// (`https://<account>.blob.core.windows.net`).
    pub fn new(endpoint: &str, name: &str) -> Self {
        Container {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            name: name.to_string(),
        }
    }

    /// The URL of blob `blob` (segments encoded, `/` kept).
    pub fn url(&self, blob: &str) -> String {
        let path: Vec<String> = blob.split('/').map(encode).collect();
        format!(
            "{}/{}/{}",
            self.endpoint,
            encode(&self.name),
            path.join("/")
        )
    }

    /// `<container>/<blob>`, as Terraform names a state in lock paths and
    /// messages.
    pub fn path(&self, blob: &str) -> String {
        format!("{}/{blob}", self.name)
    }

    /// Send one request with the API version; one that is safe to repeat
    /// is sent again, up to three times, when it fails without an answer.
    fn send(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        body: Vec<u8>,
        repeat: Repeat,
    ) -> Result<Response, Error> {
        let mut all: Vec<(&str, &str)> = vec![("x-ms-version", API_VERSION)];
        all.extend_from_slice(headers);
        // Azure wants the length of every change up front (411 without
        // it, and a chunked body is refused); reads carry none.
        let length = body.len().to_string();
        if !matches!(method, "GET" | "HEAD") {
            all.push(("content-length", &length));
        }
        match repeat {
            Repeat::Safe => http::request_repeatable(method, url, &all, body),
            Repeat::Never => http::request(method, url, &all, body),
        }
    }

    /// Get Blob Properties; `None` when there is no such blob.
    pub fn properties(&self, blob: &str) -> Result<Option<Props>, Error> {
        let answer = self.send("HEAD", &self.url(blob), &[], Vec::new(), Repeat::Safe)?;
        match answer.status {
            200 => props_of(&answer).map(Some),
            404 => Ok(None),
            _ => Err(failed(
                &format!("reading the properties of {}", self.path(blob)),
                &answer,
            )),
        }
    }

    /// Bytes `start..=end` of `blob` (of its `snapshot` when given), only
    /// while it is `etag` when one is given. `Ok(None)` when the blob is
    /// gone or changed.
    pub fn range(
        &self,
        blob: &str,
        snapshot: Option<&str>,
        etag: Option<&str>,
        start: u64,
        end: u64,
    ) -> Result<Option<Response>, Error> {
        let mut url = self.url(blob);
        if let Some(snapshot) = snapshot {
            url.push_str(&format!("?snapshot={}", encode(snapshot)));
        }
        let range = format!("bytes={start}-{end}");
        let mut headers = vec![("x-ms-range", range.as_str())];
        if let Some(etag) = etag {
            headers.push(("if-match", etag));
        }
        let answer = self.send("GET", &url, &headers, Vec::new(), Repeat::Safe)?;
        match answer.status {
            200 | 206 => Ok(Some(answer)),
            // Gone, replaced, or (for an id that is no snapshot) malformed.
            400 | 404 | 412 | 416 => Ok(None),
            _ => Err(failed(&format!("reading {}", self.path(blob)), &answer)),
        }
    }

    /// Put Blob: `bytes` as the whole of `blob`, a JSON block blob with
    /// `metadata`, if `condition` holds, under `lease` when one is held;
    /// sent again after no answer as `repeat` says (`None`: as the
    /// condition allows). The store keeps the MD5 of what a Put Blob
    /// wrote as the blob's Content-MD5.
    pub fn put(
        &self,
        blob: &str,
        bytes: Vec<u8>,
        metadata: &[(String, String)],
        condition: &Condition,
        lease: Option<&str>,
        repeat: Option<Repeat>,
    ) -> Result<Result<(), Refusal>, Error> {
        let headers = [
            ("x-ms-blob-type", "BlockBlob"),
            ("content-type", "application/json"),
            ("x-ms-blob-content-type", "application/json"),
        ];
        let answer = self.change(
            "PUT",
            &self.url(blob),
            &headers,
            metadata,
            condition,
            lease,
            bytes,
            repeat,
        )?;
        refusal(answer, 201, &format!("writing {}", self.path(blob)))
    }

    /// Set Blob Metadata: `metadata` replaces all of `blob`'s, if
    /// `condition` holds, under `lease` when one is held.
    pub fn set_metadata(
        &self,
        blob: &str,
        metadata: &[(String, String)],
        condition: &Condition,
        lease: Option<&str>,
    ) -> Result<Result<(), Refusal>, Error> {
        let url = format!("{}?comp=metadata", self.url(blob));
        let answer = self.change(
            "PUT",
            &url,
            &[],
            metadata,
            condition,
            lease,
            Vec::new(),
            None,
        )?;
        refusal(
            answer,
            200,
            &format!("setting the metadata of {}", self.path(blob)),
        )
    }

    /// Snapshot Blob, under `lease` when one is held (as Terraform's
    /// `snapshot = true` does before each write), if `condition` holds;
    /// never sent twice (a repeat would be a second snapshot).
    pub fn snapshot(
        &self,
        blob: &str,
        condition: &Condition,
        lease: Option<&str>,
    ) -> Result<Result<(), Refusal>, Error> {
        let url = format!("{}?comp=snapshot", self.url(blob));
        let answer = self.change(
            "PUT",
            &url,
            &[],
            &[],
            condition,
            lease,
            Vec::new(),
            Some(Repeat::Never),
        )?;
        refusal(answer, 201, &format!("snapshotting {}", self.path(blob)))
    }

    /// Delete Blob with its snapshots, if `condition` holds (a leased blob
    /// is refused: no lease is sent).
    pub fn delete(&self, blob: &str, condition: &Condition) -> Result<Result<(), Refusal>, Error> {
        let headers = [("x-ms-delete-snapshots", "include")];
        let answer = self.change(
            "DELETE",
            &self.url(blob),
            &headers,
            &[],
            condition,
            None,
            Vec::new(),
            None,
        )?;
        refusal(answer, 202, &format!("deleting {}", self.path(blob)))
    }

    /// One lease action (`acquire`, `release`, `break`) with `headers`;
    /// the answer, for the caller to read.
    pub fn lease(
        &self,
        blob: &str,
        action: &str,
        headers: &[(&str, &str)],
    ) -> Result<Response, Error> {
        let url = format!("{}?comp=lease", self.url(blob));
        let mut all = vec![("x-ms-lease-action", action)];
        all.extend_from_slice(headers);
        // Acquiring with a proposed ID is granted again to that ID; a
        // release or break repeated could end someone else's lease.
        let proposed = headers.iter().any(|(n, _)| *n == "x-ms-proposed-lease-id");
        let repeat = match action {
            "acquire" if proposed => Repeat::Safe,
            _ => Repeat::Never,
        };
        self.send("PUT", &url, &all, Vec::new(), repeat)
    }

    /// A request that changes `blob`, with its metadata, condition and
    /// lease headers; sent again after no answer as `repeat` says, or
    /// (`None`) as the condition allows.
    #[allow(clippy::too_many_arguments)]
    fn change(
        &self,
        method: &str,
        url: &str,
        headers: &[(&str, &str)],
        metadata: &[(String, String)],
        condition: &Condition,
        lease: Option<&str>,
        body: Vec<u8>,
        repeat: Option<Repeat>,
    ) -> Result<Response, Error> {
        let mut all: Vec<(String, String)> = headers
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect();
        all.extend(
            metadata
                .iter()
                .map(|(n, v)| (format!("{META}{n}"), v.clone())),
        );
        match condition {
            Condition::Absent => all.push(("if-none-match".into(), "*".into())),
            Condition::Etag(etag) => all.push(("if-match".into(), etag.clone())),
            Condition::Any => {}
        }
        if let Some(lease) = lease {
            all.push(("x-ms-lease-id".into(), lease.to_string()));
        }
        // Conditional changes are safe to repeat, and so is metadata set
        // under the lease (only its holder changes it); Put Blob and Set
        // Blob Metadata are the only changes made with neither but a
        // lease. A conditional write whose caller must tell "not as
        // expected" from "done" is never repeated: a repeat of one applied
        // is refused as changed.
        let metadata_under_lease = url.ends_with("comp=metadata") && lease.is_some();
        let repeat = repeat.unwrap_or(match condition {
            Condition::Absent | Condition::Etag(_) => Repeat::Safe,
            Condition::Any if metadata_under_lease => Repeat::Safe,
            Condition::Any => Repeat::Never,
        });
        let all: Vec<(&str, &str)> = all.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
        self.send(method, url, &all, body, repeat)
    }

    /// List Blobs: one page of the blobs whose names start with `prefix`
    /// (with their snapshots when asked), from `marker`.
    pub fn list_page(
        &self,
        prefix: &str,
        snapshots: bool,
        marker: Option<&str>,
    ) -> Result<Response, Error> {
        let mut url = format!(
            "{}/{}?restype=container&comp=list&prefix={}",
            self.endpoint,
            encode(&self.name),
            encode(prefix)
        );
        if snapshots {
            url.push_str("&include=snapshots");
        }
        if let Some(marker) = marker {
            url.push_str(&format!("&marker={}", encode(marker)));
        }
        let answer = self.send("GET", &url, &[], Vec::new(), Repeat::Safe)?;
        if answer.status != 200 {
            return Err(failed(&format!("listing {}", self.path(prefix)), &answer));
        }
        Ok(answer)
    }
}

/// What Get Blob Properties answered.
fn props_of(answer: &Response) -> Result<Props, Error> {
    let etag = answer
        .header("etag")
        .ok_or_else(|| Error::Internal("a blob's properties came without an ETag".into()))?;
    let size = answer
        .header("content-length")
        .and_then(|n| n.trim().parse().ok())
        .ok_or_else(|| {
            Error::Internal(
                "a blob's properties came without a Content-Length that is a number".into(),
            )
        })?;
    let metadata = answer
        .headers
        .iter()
        .filter_map(|(n, v)| {
            Some((
                n.to_ascii_lowercase().strip_prefix(META)?.to_string(),
                v.clone(),
            ))
        })
        .collect();
    Ok(Props {
        etag: etag.to_string(),
        size,
        leased: answer
            .header("x-ms-lease-status")
            .is_some_and(|s| s.eq_ignore_ascii_case("locked")),
        metadata,
        md5: answer.header("content-md5").map(str::to_string),
    })
}

/// The outcome of a change answered `answer`, which succeeded with `ok`.
fn refusal(answer: Response, ok: u16, what: &str) -> Result<Result<(), Refusal>, Error> {
    match refusal_of(&answer, ok) {
        Some(outcome) => Ok(outcome),
        None => Err(failed(what, &answer)),
    }
}

/// What `answer` to a change means, when it is one of its outcomes.
fn refusal_of(answer: &Response, ok: u16) -> Option<Result<(), Refusal>> {
    Some(match answer.status {
        s if s == ok => Ok(()),
        409 | 412 if about_lease(answer) => Err(Refusal::Lease),
        409 | 412 => Err(Refusal::Changed),
        // Put Block List naming blocks that are gone: another writer's
        // upload committed meanwhile, which drops every uncommitted block.
        400 if answer.header("x-ms-error-code") == Some("InvalidBlockList") => {
            Err(Refusal::Changed)
        }
        404 => Err(Refusal::Missing),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, code: &str) -> Response {
        Response {
            status,
            body: Vec::new(),
            headers: vec![("x-ms-error-code".into(), code.into())],
        }
    }

    #[test]
    fn a_block_list_whose_blocks_are_gone_is_a_changed_blob() {
        assert_eq!(
            refusal_of(&answer(400, "InvalidBlockList"), 201),
            Some(Err(Refusal::Changed))
        );
        assert_eq!(refusal_of(&answer(400, "InvalidHeaderValue"), 201), None);
        assert_eq!(
            refusal_of(&answer(412, "ConditionNotMet"), 201),
            Some(Err(Refusal::Changed))
        );
        assert_eq!(
            refusal_of(&answer(412, "LeaseIdMismatchWithBlobOperation"), 201),
            Some(Err(Refusal::Lease))
        );
        assert_eq!(refusal_of(&answer(201, ""), 201), Some(Ok(())));
    }
}
