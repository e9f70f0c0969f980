//! Uploads of a whole state: one Put Blob up to [`PART_BYTES`], else
//! blocks and a block list, the guest holding one part at a time.

use super::{
    Condition, Container, PART_BYTES, Refusal, Repeat, about_lease, encode, failed, refusal,
};
use wasmstate_guest::{Error, StateReader};

impl Container {
    /// Upload what `state` yields as `blob`: one Put Blob up to
    /// [`PART_BYTES`], else Put Block per part and Put Block List, so the
    /// guest holds one part at a time. The blob changes only at the last
    /// request, and only if `condition` holds then; `repeat` as for
    /// [`Container::put`]. The block list sets the MD5 of the parts sent
    /// as the blob's Content-MD5, as Put Blob's store does.
    pub fn upload(
        &self,
        blob: &str,
        state: &mut StateReader<'_>,
        metadata: &[(String, String)],
        condition: &Condition,
        lease: Option<&str>,
        repeat: Option<Repeat>,
    ) -> Result<Result<(), Refusal>, Error> {
        use md5::Digest;
        if state.size() <= PART_BYTES as u64 {
            return self.put(blob, state.read_all(), metadata, condition, lease, repeat);
        }
        let mut md5 = md5::Md5::new();
        let what = format!("writing {}", self.path(blob));
        // Uncommitted blocks belong to the blob, not to the writer: ids
        // unique to this upload keep two writers' parts apart.
        let upload = hex(&wasmstate_guest::random_bytes(16));
        let mut ids = Vec::new();
        let mut sent = 0u64;
        loop {
            let part = read_part(state, PART_BYTES);
            if part.is_empty() {
                break;
            }
            sent += part.len() as u64;
            md5.update(&part);
            let id = block_id(&upload, ids.len());
            let url = format!("{}?comp=block&blockid={}", self.url(blob), encode(&id));
            let mut headers = Vec::new();
            if let Some(lease) = lease {
                headers.push(("x-ms-lease-id", lease));
            }
            let answer = self.send("PUT", &url, &headers, part, Repeat::Never)?;
            match answer.status {
                201 => ids.push(id),
                412 | 409 if about_lease(&answer) => return Ok(Err(Refusal::Lease)),
                _ => return Err(failed(&what, &answer)),
            }
        }
        if sent != state.size() {
            return Err(Error::Internal(format!(
                "{what}: the state ended at {sent} of its {} bytes",
                state.size()
            )));
        }
        let mut list = String::from(r#"<?xml version="1.0" encoding="utf-8"?><BlockList>"#);
        for id in &ids {
            // Block ids are base64: nothing in them needs escaping.
            list.push_str(&format!("<Latest>{id}</Latest>"));
        }
        list.push_str("</BlockList>");
        let md5 = {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.encode(md5.finalize())
        };
        let headers = [
            ("content-type", "application/xml"),
            ("x-ms-blob-content-type", "application/json"),
            ("x-ms-blob-content-md5", md5.as_str()),
        ];
        let url = format!("{}?comp=blocklist", self.url(blob));
        let answer = self.change(
            "PUT",
            &url,
            &headers,
            metadata,
            condition,
            lease,
            list.into_bytes(),
            repeat,
        )?;
        refusal(answer, 201, &what)
    }
}

/// Up to `max` bytes of `state`, read in full unless it ends.
fn read_part(state: &mut StateReader<'_>, max: usize) -> Vec<u8> {
    let mut part = Vec::new();
    while part.len() < max {
        let chunk = state.next_chunk(max - part.len());
        if chunk.is_empty() {
            break;
        }
        part.extend_from_slice(&chunk);
    }
    part
}

/// Block `index` of upload `upload`: base64 of a fixed-width text, as
/// every block id of a blob must be the same length.
fn block_id(upload: &str, index: usize) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(format!("{upload}-{index:08}"))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
