//! Objects in one Google Cloud Storage bucket, through the JSON API over
//! `wasi:http`. Requests leave without credentials: the host adds them.
//!
//! Uploads are `multipart` (metadata and bytes in one request, which is
//! what Google's own clients send for small objects and what honours
//! `ifGenerationMatch` everywhere, fake-gcs-server included) up to
//! [`PART_BYTES`], and `resumable` in parts past it. Downloads are ranged
//! GETs pinned to one generation, so a state replaced mid-read never mixes
//! two.

use serde::Deserialize;
use wasmstate_guest::http::{self, Response};
use wasmstate_guest::{Error, StateReader};

/// Bytes of each ranged read and of each part of a resumable upload (a
/// multiple of 256 KiB, as resumable uploads require): what the guest
/// holds of a state at once.
pub const PART_BYTES: usize = 8 << 20;

/// User metadata holding the serial of the state an object holds, as the
/// host read it: the history listing's serials without reading versions.
pub const SERIAL_KEY: &str = "wasmstate-serial";

/// An object's resource, as far as the guest reads it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Object {
    /// Full object name.
    pub name: String,
    /// Its generation (an int64, as a string).
    pub generation: String,
    /// Its size in bytes (as a string).
    pub size: String,
    /// When this generation was written (RFC 3339).
    #[serde(default)]
    pub time_created: String,
    /// When this generation stopped being the live one, for a noncurrent
    /// version.
    #[serde(default)]
    pub time_deleted: Option<String>,
    /// User metadata.
    #[serde(default)]
    pub metadata: std::collections::BTreeMap<String, String>,
}

impl Object {
    /// Its size in bytes. A size that is not a number is an error: taken
    /// as 0, a state would read as none, and be written over from scratch.
    pub fn bytes(&self) -> Result<u64, Error> {
        self.size.parse().map_err(|_| {
            Error::Internal(format!(
                "object {} has size {:?}, not a number",
                self.name, self.size
            ))
        })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Listing {
    #[serde(default)]
    items: Vec<Object>,
    #[serde(default)]
    next_page_token: Option<String>,
}

/// When an upload may replace what is at its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    /// Only if no live object is there (`ifGenerationMatch=0`).
    Absent,
    /// Only if the live object is this generation.
    Generation(i64),
    /// Whatever is there (workspace metadata written unconditionally).
    Any,
}

impl Condition {
    /// The query parameter, with its leading `&` (none for `Any`).
    fn query(self) -> String {
        match self {
            Condition::Absent => "&ifGenerationMatch=0".into(),
            Condition::Generation(g) => format!("&ifGenerationMatch={g}"),
            Condition::Any => String::new(),
        }
    }
}

/// The first bytes of an object and what the answer said of the whole.
pub struct FirstBytes {
    /// The generation the bytes are of (`x-goog-generation`).
    pub generation: Option<String>,
    /// The object's size in bytes.
    pub size: u64,
    /// Lowercase hex MD5 of the object's bytes as served, when the store
    /// keeps one (`x-goog-hash`; none for composite objects, or for
    /// objects stored compressed, whose hash is of other bytes).
    pub md5: Option<String>,
    /// Its first bytes.
    pub bytes: Vec<u8>,
}

/// One bucket.
pub struct Bucket {
    /// The bucket's name.
    pub name: String,
    /// JSON API base, ending in `/storage/v1/`.
    api: String,
    /// Upload base, ending in `/upload/storage/v1/`.
    upload: String,
    /// `kms_encryption_key`: new objects are encrypted with it.
    kms_key: Option<String>,
}

/// Percent-encode `text` for a URL path segment or query value.
pub fn encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, percent_encoding::NON_ALPHANUMERIC).to_string()
}

/// `GET url` with `headers`, sent again when no answer came (a GET
/// changes nothing).
fn get_with(url: &str, headers: &[(&str, &str)]) -> Result<Response, Error> {
    http::request_repeatable("GET", url, headers, Vec::new())
}

fn failed(what: &str, answer: &Response) -> Error {
    let text = answer.excerpt(300);
    match answer.status {
        429 | 500..=599 => Error::Unavailable(format!("{what}: {} {text}", answer.status)),
        _ => Error::Internal(format!("{what}: {} {text}", answer.status)),
    }
}

impl Bucket {
    /// The bucket `name` behind `endpoint` (the JSON API's base, as
    /// Terraform's `storage_custom_endpoint`: `…/storage/v1/`).
    pub fn new(name: &str, endpoint: &str, kms_key: Option<String>) -> Self {
        let api = format!("{}/", endpoint.trim_end_matches('/'));
        let upload = match api.strip_suffix("/storage/v1/") {
            Some(root) => format!("{root}/upload/storage/v1/"),
            None => format!("{api}upload/"),
        };
        Bucket {
            name: name.to_string(),
            api,
            upload,
            kms_key,
        }
    }

    fn object_url(&self, object: &str) -> String {
        format!("{}b/{}/o/{}", self.api, encode(&self.name), encode(object))
    }

    /// `gs://bucket/object`, for messages and lock paths.
    pub fn url(&self, object: &str) -> String {
        format!("gs://{}/{object}", self.name)
    }

    /// The live object's resource, `None` when there is none.
    pub fn get(&self, object: &str) -> Result<Option<Object>, Error> {
        let answer = get_with(&self.object_url(object), &[])?;
        match answer.status {
            200 => answer.json().map(Some),
            404 => Ok(None),
            _ => Err(failed(
                &format!("looking for {}", self.url(object)),
                &answer,
            )),
        }
    }

    /// The bytes of `object` at `generation` (the live one when `None`),
    /// written into `out` in ranged GETs; its resource, `None` when there
    /// is no such object or generation.
    pub fn read_to(
        &self,
        object: &str,
        generation: Option<&str>,
        out: &mut dyn std::io::Write,
    ) -> Result<Option<Object>, Error> {
        let meta = match generation {
            Some(g) => self.get_generation(object, g)?,
            None => self.get(object)?,
        };
        let Some(meta) = meta else {
            return Ok(None);
        };
        let size = meta.bytes()?;
        let url = format!(
            "{}?alt=media&generation={}",
            self.object_url(object),
            encode(&meta.generation)
        );
        let torn =
            |why: &str| Error::Unavailable(format!("reading {}: {why}; retry", self.url(object)));
        let mut start = 0u64;
        while start < size {
            let end = (start + PART_BYTES as u64).min(size) - 1;
            let range = format!("bytes={start}-{end}");
            let answer = get_with(&url, &[("range", &range)])?;
            let whole = match answer.status {
                206 => false,
                // A store that ignores ranges sends all of it: only whole,
                // and only as the first answer, is that one read.
                200 if start == 0 && answer.body.len() as u64 == size => true,
                200 => return Err(torn("the store ignored a range request")),
                404 => return Err(torn("the object was replaced while it was read")),
                _ => return Err(failed(&format!("reading {}", self.url(object)), &answer)),
            };
            let expected = if whole { size } else { end + 1 - start };
            if answer.body.len() as u64 != expected {
                return Err(torn(&format!(
                    "asked for {expected} bytes at {start}, got {}",
                    answer.body.len()
                )));
            }
            out.write_all(&answer.body)
                .map_err(|e| Error::io("handing the state to the host", e))?;
            start += answer.body.len() as u64;
        }
        Ok(Some(meta))
    }

    /// The first `len` bytes of the live `object` (fewer when it is
    /// shorter), with its generation, size and MD5, in one ranged GET;
    /// `None` when there is no such object.
    pub fn first_bytes(&self, object: &str, len: u64) -> Result<Option<FirstBytes>, Error> {
        let url = format!("{}?alt=media", self.object_url(object));
        let range = format!("bytes=0-{}", len.max(1) - 1);
        let answer = get_with(&url, &[("range", &range)])?;
        let size = match answer.status {
            // `Content-Range: bytes 0-65535/1048576`
            206 => answer
                .header("content-range")
                .and_then(|r| r.rsplit('/').next())
                .and_then(|n| n.trim().parse::<u64>().ok())
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "reading {}: a part came without the object's size",
                        self.url(object)
                    ))
                })?,
            // The whole object: a store that ignores ranges, or one that
            // serves a compressed object decompressed.
            200 => answer.body.len() as u64,
            // Nothing to range over: an empty object.
            416 => 0,
            404 => return Ok(None),
            _ => return Err(failed(&format!("reading {}", self.url(object)), &answer)),
        };
        let identity = answer
            .header("x-goog-stored-content-encoding")
            .is_none_or(|e| e.eq_ignore_ascii_case("identity"));
        // GCS sends one `x-goog-hash` per algorithm, or one list of them.
        let md5 = answer
            .headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("x-goog-hash"))
            .flat_map(|(_, v)| v.split(','))
            .find_map(|h| h.trim().strip_prefix("md5="))
            .and_then(base64_hex)
            .filter(|_| identity);
        let mut bytes = answer.body;
        bytes.truncate(len as usize);
        Ok(Some(FirstBytes {
            generation: answer_generation(&answer.headers),
            size,
            md5,
            bytes,
        }))
    }

    /// Bytes `start..end` of `object` at `generation` (fewer when it is
    /// shorter; none when it is gone).
    pub fn read_range(
        &self,
        object: &str,
        generation: &str,
        start: u64,
        end: u64,
    ) -> Result<Vec<u8>, Error> {
        if end <= start {
            return Ok(Vec::new());
        }
        let url = format!(
            "{}?alt=media&generation={}",
            self.object_url(object),
            encode(generation)
        );
        let range = format!("bytes={start}-{}", end - 1);
        let answer = get_with(&url, &[("range", &range)])?;
        match answer.status {
            200 | 206 => Ok(answer.body),
            404 | 416 => Ok(Vec::new()),
            _ => Err(failed(&format!("reading {}", self.url(object)), &answer)),
        }
    }

    fn get_generation(&self, object: &str, generation: &str) -> Result<Option<Object>, Error> {
        let url = format!(
            "{}?generation={}",
            self.object_url(object),
            encode(generation)
        );
        let answer = get_with(&url, &[])?;
        match answer.status {
            200 => answer.json().map(Some),
            // A generation that is not a number is no version of ours.
            400 | 404 => Ok(None),
            _ => Err(failed(
                &format!("looking for {}", self.url(object)),
                &answer,
            )),
        }
    }

    /// Upload what `state` yields as `object` if `condition` holds
    /// (`Ok(false)` when it does not: nothing changed), with `serial` as
    /// [`SERIAL_KEY`] metadata.
    pub fn upload_from(
        &self,
        object: &str,
        state: &mut StateReader<'_>,
        condition: Condition,
    ) -> Result<bool, Error> {
        let serial = state.serial();
        if state.size() <= PART_BYTES as u64 {
            let bytes = state.read_all();
            return self.upload(object, &bytes, condition, serial);
        }
        self.upload_resumable(object, state, condition, serial)
    }

    fn resource(&self, object: &str, serial: Option<u64>) -> serde_json::Value {
        let mut resource = serde_json::json!({ "name": object, "contentType": "application/json" });
        if let Some(serial) = serial {
            resource["metadata"] = serde_json::json!({ SERIAL_KEY: serial.to_string() });
        }
        if let Some(key) = &self.kms_key {
            resource["kmsKeyName"] = serde_json::json!(key);
        }
        resource
    }

    /// Upload `bytes` as `object` in one multipart request if `condition`
    /// holds; `Ok(false)` when it does not.
    pub fn upload(
        &self,
        object: &str,
        bytes: &[u8],
        condition: Condition,
        serial: Option<u64>,
    ) -> Result<bool, Error> {
        let resource = serde_json::to_vec(&self.resource(object, serial))
            .map_err(|e| Error::Internal(format!("encoding an object resource: {e}")))?;
        let boundary = boundary_for(bytes);
        // RFC 2046 multipart/related: the resource, then the bytes.
        let mut body = Vec::with_capacity(bytes.len() + resource.len() + 256);
        for (kind, part) in [
            ("application/json; charset=UTF-8", &resource[..]),
            ("application/octet-stream", bytes),
        ] {
            body.extend_from_slice(
                format!("--{boundary}\r\ncontent-type: {kind}\r\n\r\n").as_bytes(),
            );
            body.extend_from_slice(part);
            body.extend_from_slice(b"\r\n");
        }
        body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
        let url = format!(
            "{}b/{}/o?uploadType=multipart{}",
            self.upload,
            encode(&self.name),
            condition.query()
        );
        let kind = format!("multipart/related; boundary={boundary}");
        let answer = http::request("POST", &url, &[("content-type", &kind)], body)?;
        match answer.status {
            200 | 201 => Ok(true),
            412 => Ok(false),
            _ => Err(failed(&format!("writing {}", self.url(object)), &answer)),
        }
    }

    fn upload_resumable(
        &self,
        object: &str,
        state: &mut StateReader<'_>,
        condition: Condition,
        serial: Option<u64>,
    ) -> Result<bool, Error> {
        let what = || format!("writing {}", self.url(object));
        let url = format!(
            "{}b/{}/o?uploadType=resumable{}",
            self.upload,
            encode(&self.name),
            condition.query()
        );
        let resource = serde_json::to_vec(&self.resource(object, serial))
            .map_err(|e| Error::Internal(format!("encoding an object resource: {e}")))?;
        let total = state.size();
        let header = total.to_string();
        let answer = http::request(
            "POST",
            &url,
            &[
                ("content-type", "application/json; charset=UTF-8"),
                ("x-upload-content-length", &header),
            ],
            resource,
        )?;
        match answer.status {
            200 | 201 => {}
            412 => return Ok(false),
            _ => return Err(failed(&what(), &answer)),
        }
        let Some(session) = answer.header("location").map(str::to_string) else {
            return Err(Error::Internal(format!("{}: no upload session", what())));
        };
        // The host lends the whole state, so every part is read in full; a
        // part the store kept only in part is sent again from where its
        // `Range` says it stopped.
        let mut pending: Vec<u8> = Vec::new();
        let mut start = 0u64;
        loop {
            while pending.len() < PART_BYTES {
                let chunk = state.next_chunk(PART_BYTES - pending.len());
                if chunk.is_empty() {
                    break;
                }
                pending.extend_from_slice(&chunk);
            }
            if pending.is_empty() {
                return Err(Error::Internal(format!(
                    "{}: the state ended at {start} of its {total} bytes",
                    what()
                )));
            }
            let end = start + pending.len() as u64;
            let range = format!("bytes {start}-{}/{total}", end - 1);
            let answer = http::request(
                "PUT",
                &session,
                &[("content-range", &range)],
                pending.clone(),
            )?;
            match answer.status {
                200 | 201 if end == total => return Ok(true),
                308 => {
                    // `Range: bytes=0-N`: what the store has kept so far.
                    let kept = answer
                        .header("range")
                        .and_then(|r| r.rsplit('-').next())
                        .and_then(|n| n.trim().parse::<u64>().ok())
                        .map_or(0, |last| last + 1);
                    if kept < start || kept > end || kept == total {
                        return Err(Error::Internal(format!(
                            "{}: the store kept {kept} bytes after {end} were sent",
                            what()
                        )));
                    }
                    pending.drain(..(kept - start) as usize);
                    start = kept;
                }
                412 => return Ok(false),
                _ => return Err(failed(&what(), &answer)),
            }
        }
    }

    /// Delete the live `object`, only while it is `generation` when one is
    /// given. `Ok(false)` when the condition did not hold; a missing
    /// object is fine.
    pub fn delete(&self, object: &str, generation: Option<&str>) -> Result<bool, Error> {
        let url = match generation {
            Some(g) => format!(
                "{}?ifGenerationMatch={}",
                self.object_url(object),
                encode(g)
            ),
            None => self.object_url(object),
        };
        let answer = http::request("DELETE", &url, &[], Vec::new())?;
        match answer.status {
            200 | 204 | 404 => Ok(true),
            412 => Ok(false),
            _ => Err(failed(&format!("deleting {}", self.url(object)), &answer)),
        }
    }

    /// The objects whose names start with `prefix`, not below another `/`
    /// after it (a `delimiter=/` listing), or every generation of them
    /// with `versions`.
    pub fn list(&self, prefix: &str, versions: bool) -> Result<Vec<Object>, Error> {
        let mut all = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut url = format!(
                "{}b/{}/o?prefix={}",
                self.api,
                encode(&self.name),
                encode(prefix)
            );
            url.push_str(if versions {
                "&versions=true"
            } else {
                "&delimiter=%2F"
            });
            if let Some(t) = token.take() {
                url.push_str(&format!("&pageToken={}", encode(&t)));
            }
            let answer = get_with(&url, &[])?;
            if answer.status != 200 {
                return Err(failed(&format!("listing {}", self.url(prefix)), &answer));
            }
            let page: Listing = answer.json()?;
            all.extend(page.items);
            match page.next_page_token {
                Some(t) if !t.is_empty() => token = Some(t),
                _ => return Ok(all),
            }
        }
    }

    /// Whether the bucket keeps noncurrent versions (object versioning on).
    pub fn versioning_enabled(&self) -> Result<bool, Error> {
        #[derive(Deserialize)]
        struct Versioning {
            #[serde(default)]
            enabled: bool,
        }
        #[derive(Deserialize)]
        struct BucketResource {
            versioning: Option<Versioning>,
        }
        let url = format!("{}b/{}?fields=versioning", self.api, encode(&self.name));
        let answer = get_with(&url, &[])?;
        if answer.status != 200 {
            return Err(failed(
                &format!("reading the versioning of gs://{}", self.name),
                &answer,
            ));
        }
        let bucket: BucketResource = answer.json()?;
        Ok(bucket.versioning.is_some_and(|v| v.enabled))
    }
}

/// The `x-goog-generation` of an answer.
fn answer_generation(headers: &[(String, String)]) -> Option<String> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("x-goog-generation"))
        .map(|(_, v)| v.trim().to_string())
}

/// Lowercase hex of base64 `text`, when it is base64.
fn base64_hex(text: &str) -> Option<String> {
    use base64::Engine;
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text.trim())
        .ok()?;
    Some(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A multipart boundary that does not occur in `bytes`.
fn boundary_for(bytes: &[u8]) -> String {
    use std::hash::{BuildHasher, Hasher};
    loop {
        let mut a = std::collections::hash_map::RandomState::new().build_hasher();
        a.write_u8(1);
        let mut b = std::collections::hash_map::RandomState::new().build_hasher();
        b.write_u8(2);
        let boundary = format!("wasmstate{:016x}{:016x}", a.finish(), b.finish());
        if !bytes
            .windows(boundary.len())
            .any(|w| w == boundary.as_bytes())
        {
            return boundary;
        }
    }
}
