//! Contract 0.3.0's calls of a guest backend: `storage.head`, the
//! conditional `storage.write` and the workspace metadata, each within the
//! backend's limits, as every other call (a write's head and write in one
//! instance, [`crate::request`]). What a guest
//! returns is bounded here: a version or digest longer than
//! [`MAX_GUEST_TEXT`] or metadata past [`MAX_METADATA_BYTES`] is the
//! guest's fault, a clear 500, never carried into an answer or the log.

use super::super::bindings::MAX_GUEST_TEXT;
use super::super::bindings::exports::wasmstate::backend::storage::StateHead;
use super::super::bindings::wasmstate::backend::types as t;
use super::super::chunks::{StateSink, StateSource};
use super::GuestBackend;
use crate::backend::{Expect, Head, MAX_METADATA_BYTES, Metadata, StorageError, StorageResult};
use crate::contract::ContractVersion;

impl GuestBackend {
    /// Whether its guest has 0.3.0's head, conditional write and metadata.
    pub(super) fn has_conditional_calls(&self) -> bool {
        self.shared.contract == ContractVersion::V0_3_0
    }

    /// `storage.head`, keeping at most [`crate::statefile::PREFIX_BYTES`]
    /// of the state's first bytes, the guest told to stop there or as
    /// soon as they hold lineage and serial ([`StateSink::head`]).
    pub(super) async fn head_in_guest(&self, workspace: &str) -> StorageResult<Option<Head>> {
        let ws = workspace.to_owned();
        let found = self
            .run(self.shared.max_lift_bytes, move |g, s| {
                Box::pin(async move {
                    let sink = StateSink::head(crate::statefile::PREFIX_BYTES);
                    let lent = s.data_mut().table.push(sink)?;
                    let found = g.head(s, &ws, &lent).await?;
                    let sink = s.data_mut().table.delete(lent)?;
                    if sink.failed() && found.is_ok() {
                        return Ok(Err(super::super::body::copy_failed("head")));
                    }
                    Ok(found.map(|found| found.map(|head| (head, sink.into_bytes().0))))
                })
            })
            .await?;
        found
            .map(|(head, prefix)| head_of(head, prefix))
            .transpose()
    }

    /// `storage.write` if the stored state is as `expect` says.
    pub(super) async fn write_in_guest(
        &self,
        workspace: &str,
        state: bytes::Bytes,
        lock_id: Option<&str>,
        expect: Expect,
    ) -> StorageResult<bool> {
        if !matches!(expect, Expect::Any) && !self.has_conditional_calls() {
            return Err(no_conditional_write());
        }
        let ws = workspace.to_owned();
        let id = lock_id.map(str::to_owned);
        let expect = t::Expect::from(expect);
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move {
                let lent = s.data_mut().table.push(StateSource::new(state))?;
                let written = g.write(s, &ws, &lent, id.as_deref(), &expect).await?;
                let source = s.data_mut().table.delete(lent)?;
                if source.failed() && written.is_ok() {
                    return Ok(Err(super::super::body::copy_failed("write")));
                }
                Ok(written)
            })
        })
        .await
    }

    /// `workspaces.read-metadata`.
    pub(super) async fn read_metadata_in_guest(
        &self,
        workspace: &str,
    ) -> StorageResult<Option<Metadata>> {
        if !self.has_conditional_calls() {
            return Err(no_metadata(self.shared.contract));
        }
        let name = workspace.to_owned();
        let read = self
            .run(self.shared.max_lift_bytes, move |g, s| {
                Box::pin(async move { g.read_metadata(s, &name).await })
            })
            .await;
        match read.map_err(metadata_refused)? {
            None => Ok(None),
            Some(metadata) => metadata_of(metadata).map(Some),
        }
    }

    /// `workspaces.write-metadata`.
    pub(super) async fn write_metadata_in_guest(
        &self,
        workspace: &str,
        content: Option<String>,
        expect: Expect,
    ) -> StorageResult<bool> {
        if !self.has_conditional_calls() {
            return Err(no_metadata(self.shared.contract));
        }
        if let Some(content) = &content
            && content.len() > MAX_METADATA_BYTES
        {
            return Err(StorageError::InvalidInput(format!(
                "workspace metadata of {} bytes is more than the {} KiB a backend keeps; shorten it",
                content.len(),
                MAX_METADATA_BYTES >> 10
            )));
        }
        let name = workspace.to_owned();
        let expect = t::Expect::from(expect);
        self.run(self.shared.max_lift_bytes, move |g, s| {
            Box::pin(async move {
                g.write_metadata(s, &name, content.as_deref(), &expect)
                    .await
            })
        })
        .await
        .map_err(metadata_refused)
    }
}

/// A non-`any` write asked of a guest before 0.3.0 (the protocol asks
/// only when [`crate::backend::Storage::conditional_writes`]).
fn no_conditional_write() -> StorageError {
    StorageError::Internal(
        "this backend's guest has no conditional write (built for a contract before 0.3.0)".into(),
    )
}

fn no_metadata(contract: ContractVersion) -> StorageError {
    StorageError::NoMetadata(format!(
        "its guest was built for contract {contract}, before 0.3.0; rebuild it against the current \
         wasmstate-guest SDK to keep metadata in its storage"
    ))
}

/// A 0.3.0 guest whose storage cannot keep metadata answers
/// `invalid-input` saying so (the contract's way): the host then keeps it
/// itself.
fn metadata_refused(e: StorageError) -> StorageError {
    match e {
        StorageError::InvalidInput(why) => StorageError::NoMetadata(why),
        e => e,
    }
}

/// A guest's head in the host's terms, refusing what no storage version or
/// digest is.
fn head_of(head: StateHead, prefix: Vec<u8>) -> StorageResult<Head> {
    bounded("head's version", &head.version)?;
    if let Some(digest) = &head.digest {
        bounded("head's digest", digest)?;
    }
    Ok(Head {
        version: head.version,
        size: head.size,
        digest: head.digest,
        prefix,
    })
}

/// A guest's metadata in the host's terms, refusing more than the host
/// ever writes.
fn metadata_of(metadata: t::Metadata) -> StorageResult<Metadata> {
    bounded("metadata's version", &metadata.version)?;
    if metadata.content.len() > MAX_METADATA_BYTES {
        return Err(StorageError::Internal(format!(
            "the guest returned workspace metadata of {} bytes, more than the {} KiB the host ever \
             writes: its storage is corrupt or the guest is faulty",
            metadata.content.len(),
            MAX_METADATA_BYTES >> 10
        )));
    }
    Ok(Metadata {
        content: metadata.content,
        version: metadata.version,
    })
}

fn bounded(what: &str, text: &str) -> StorageResult<()> {
    if text.len() > MAX_GUEST_TEXT {
        return Err(StorageError::Internal(format!(
            "the guest returned a {what} of {} bytes, more than the {MAX_GUEST_TEXT} the host \
             accepts: the guest is faulty",
            text.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(version: String, digest: Option<String>) -> StateHead {
        StateHead {
            version,
            size: 3,
            digest,
        }
    }

    #[test]
    fn a_head_is_taken_with_its_prefix_within_bounds() {
        let got = head_of(
            head("etag-1".into(), Some("md5:00".into())),
            b"{\"v".to_vec(),
        )
        .unwrap();
        assert_eq!(
            got,
            Head {
                version: "etag-1".into(),
                size: 3,
                digest: Some("md5:00".into()),
                prefix: b"{\"v".to_vec(),
            }
        );
        let edge = "v".repeat(MAX_GUEST_TEXT);
        assert!(head_of(head(edge.clone(), Some(edge)), Vec::new()).is_ok());
    }

    #[test]
    fn an_overlong_version_or_digest_is_the_guests_fault() {
        let long = "v".repeat(MAX_GUEST_TEXT + 1);
        for bad in [head(long.clone(), None), head("1".into(), Some(long))] {
            let e = head_of(bad, Vec::new()).unwrap_err();
            assert!(
                matches!(&e, StorageError::Internal(m) if m.contains("guest is faulty") && m.len() < 200),
                "{e:?}"
            );
        }
    }

    #[test]
    fn metadata_past_the_cap_is_refused_and_invalid_input_means_none_kept() {
        let ok = t::Metadata {
            content: "x".repeat(MAX_METADATA_BYTES),
            version: "7".into(),
        };
        assert_eq!(metadata_of(ok).unwrap().version, "7");
        let big = t::Metadata {
            content: "x".repeat(MAX_METADATA_BYTES + 1),
            version: "7".into(),
        };
        assert!(matches!(metadata_of(big), Err(StorageError::Internal(_))));
        let long_version = t::Metadata {
            content: "{}".into(),
            version: "v".repeat(MAX_GUEST_TEXT + 1),
        };
        assert!(matches!(
            metadata_of(long_version),
            Err(StorageError::Internal(_))
        ));
        assert!(matches!(
            metadata_refused(StorageError::InvalidInput("no room".into())),
            StorageError::NoMetadata(m) if m == "no room"
        ));
        assert!(matches!(
            metadata_refused(StorageError::NotFound),
            StorageError::NotFound
        ));
    }
}
