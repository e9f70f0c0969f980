//! The history case: a guest whose storage keeps versions lists each write,
//! newest first, and reads each back byte for byte. A guest that keeps none
//! (`list-versions` answers `none`) passes: the host keeps versions then.

use crate::backend::{Storage, StorageError};
use std::sync::Arc;

/// Writes made, each a distinct state with the next serial.
const WRITES: u64 = 3;

fn numbered(serial: u64) -> bytes::Bytes {
    format!(r#"{{"version":4,"serial":{serial},"lineage":"ck-history","note":"write {serial}"}}"#)
        .into()
}

pub(super) async fn kept_versions<S: Storage>(s: Arc<S>, ws: String) -> Result<(), String> {
    match s.list_versions(&ws).await {
        Err(StorageError::NoHistory) => return Ok(()),
        Err(e) => return Err(format!("list-versions of a new workspace: {e}")),
        Ok(_) => {}
    }
    for serial in 1..=WRITES {
        s.write(&ws, numbered(serial), None)
            .await
            .map_err(|e| format!("write {serial}: {e}"))?;
    }
    let listed = s
        .list_versions(&ws)
        .await
        .map_err(|e| format!("list-versions: {e}"))?;
    if listed
        .windows(2)
        .any(|w| w[0].created_unix_ms < w[1].created_unix_ms)
    {
        return Err("list-versions is not newest first".into());
    }
    // 0 bytes marks a moment without a state; the writes come first.
    let kept: Vec<_> = listed
        .iter()
        .filter(|v| v.bytes > 0)
        .take(WRITES as usize)
        .collect();
    if kept.len() < WRITES as usize {
        return Err(format!(
            "{WRITES} writes, but list-versions shows {} versions with bytes",
            kept.len()
        ));
    }
    for (version, serial) in kept.iter().zip((1..=WRITES).rev()) {
        let expected = numbered(serial);
        let got = s
            .read_version(&ws, &version.id)
            .await
            .map_err(|e| format!("read-version {}: {e}", version.id))?;
        if got.as_deref() != Some(&expected[..]) {
            return Err(format!(
                "version {} does not read back as write {serial} (newest first)",
                version.id
            ));
        }
        if version.serial.is_some_and(|s| s != serial) || version.bytes != expected.len() as u64 {
            return Err(format!(
                "version {} is listed with serial {:?} and {} bytes; write {serial} had {} bytes",
                version.id,
                version.serial,
                version.bytes,
                expected.len()
            ));
        }
    }
    match s.read_version(&ws, "no-such-version").await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err("read-version of an unknown id returned a state".into()),
        Err(e) => Err(format!(
            "read-version of an unknown id: {e} (expected none)"
        )),
    }
}
