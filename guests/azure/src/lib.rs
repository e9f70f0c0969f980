//! wasmstate guest: Terraform state in Azure Blob Storage, the layout of
//! Terraform's `backend "azurerm"` (`internal/backend/remote-state/azure`):
//!
//! - state: block blob `key` for `default`, `key + "env:" + <workspace>`
//!   for the others (no separator), content type `application/json`; a
//!   zero-length blob is a workspace without a state;
//! - lock: an infinite lease on the state blob, and metadata
//!   `terraformlockid` = base64 of Terraform's LockInfo JSON whose `ID` is
//!   the lease ID ([`lockinfo`] says how a lock ID that is not a GUID gets
//!   one); writes under the lock carry the lease and keep the metadata;
//! - `snapshot = true`: a snapshot of the blob before every write, which
//!   are then the state's history, seen by every replica;
//! - workspace metadata (wasmstate's own): block blob
//!   `key + ".wasmstate-metadata/" + <workspace> + ".json"`, outside the
//!   `key + "env:"` prefix Terraform lists workspaces by
//!   ([`workspace_metadata`]).
//!
//! A state's version names its content: `md5-` and the blob's
//! Content-MD5 (the store's for a Put Blob, this guest's on its block
//! lists), else its ETag. `head` reads the first bytes, ETag, size and
//! MD5 in one ranged Get Blob; a conditional write reads the blob's
//! properties, compares, and is a Put Blob (or, for a large state, Put
//! Block List) with `If-Match` on the ETag just read (`If-None-Match: *`
//! for none there): the store's own compare-and-swap, which a lock taken
//! in between (metadata: a new ETag) does not make stale.
//!
//! So native Terraform and wasmstate exclude each other on the same
//! container, and either reads the state the other wrote.
//!
//! Settings, named as Terraform's: `storage_account_name`,
//! `container_name`, `key` (required), `snapshot`; and `blob_endpoint`
//! (Terraform has none: the blob service's base URL, by default
//! `https://<account>.blob.core.windows.net`). Credentials (`access_key`,
//! `sas_token`, and for Entra ID `client_secret`,
//! `client_certificate_path`, `oidc_token_file_path`, …) stay with the
//! host, which signs every request or adds its bearer token; the guest
//! sees only the Entra ID choices (`use_azuread_auth`, `use_oidc`,
//! `use_msi`, `client_id`, `tenant_id`, `environment`, `authority_host`)
//! and refuses contradictory ones ([`check_sign_in`]).

mod blobs;
mod history;
mod lease;
mod listing;
mod lockinfo;
mod workspace_metadata;

use blobs::{Condition, Container, PART_BYTES, Refusal, Repeat};
use lease::Holder;
use wasmstate_guest::{
    Backend, Config, Diagnostic, Error, Expect, Head, LockInfo, Metadata, StateReader, StateWriter,
    Version, check_lock, register_backend,
};

/// Bytes `head` asks for. Terraform and OpenTofu write serial and lineage
/// in the first 120 or so (the host reads the state whole when a prefix
/// leaves them out), and these bytes are read and billed on top of
/// Terraform's own read of the state in every apply: few, as the
/// conformance kit's floor (256) allows.
const HEAD_BYTES: u64 = 256;

/// Times a read starts again when the blob was replaced before its first
/// byte was handed on.
const READ_TRIES: usize = 3;

struct Azure {
    container: Container,
    key: String,
    snapshot: bool,
}

fn invalid(key: &str, message: impl Into<String>) -> Error {
    Error::InvalidConfig(vec![Diagnostic::key(key, message)])
}

/// The host's default workspace.
const DEFAULT: &str = "default";

impl Azure {
    /// The blob of workspace `ws`, as Terraform names it.
    fn blob(&self, ws: &str) -> String {
        match ws {
            DEFAULT => self.key.clone(),
            _ => format!("{}env:{ws}", self.key),
        }
    }

    /// Stream `blob` (its `snapshot` when given; the live blob only while
    /// it is `etag` when given) into `out`; `false` when it is gone, or
    /// changed, before its first byte.
    fn stream(
        &self,
        blob: &str,
        snapshot: Option<&str>,
        etag: Option<&str>,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        let c = &self.container;
        let torn =
            |why: &str| Error::Unavailable(format!("reading {}: {why}; retry", c.path(blob)));
        let mut start = 0u64;
        loop {
            let end = start + PART_BYTES as u64 - 1;
            let Some(answer) = c.range(blob, snapshot, etag, start, end)? else {
                if start == 0 {
                    return Ok(false);
                }
                return Err(torn("the blob was replaced while it was read"));
            };
            // `Content-Range: bytes 0-4194303/10485760`; a store that
            // ignores ranges sends all of it, which only a first read takes.
            let total = match answer.status {
                206 => answer
                    .header("content-range")
                    .and_then(|r| r.rsplit('/').next())
                    .and_then(|n| n.trim().parse::<u64>().ok())
                    .ok_or_else(|| torn("a part came without its blob's size"))?,
                _ if start == 0 => answer.body.len() as u64,
                _ => return Err(torn("the store ignored a range request")),
            };
            let expected = end.min(total.saturating_sub(1)) + 1 - start;
            if answer.body.len() as u64 != expected {
                return Err(torn(&format!(
                    "asked for {expected} bytes at {start}, got {}",
                    answer.body.len()
                )));
            }
            std::io::Write::write_all(out, &answer.body)
                .map_err(|e| Error::io("handing the state to the host", e))?;
            start += expected;
            if start >= total {
                return Ok(true);
            }
        }
    }

    /// Replace the state of `ws` with what `state` yields (empty: delete
    /// it, keeping the workspace, its lock and its history), by the lock
    /// rules of a write, if the blob is as `expect` says: `false` when it
    /// is not (nothing written). With [`Expect::Any`], a blob changed
    /// under the write is an error to retry instead.
    fn replace(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let c = &self.container;
        let blob = self.blob(ws);
        let path = c.path(&blob);
        let props = c.properties(&blob)?;
        let holder = props.as_ref().map_or(Holder::None, Holder::of);
        check_lock(holder.reported(&path), lock_id)?;
        let lease = match (&holder, lock_id) {
            (Holder::Known(held), Some(_)) => Some(held.lease().to_string()),
            _ => None,
        };
        // A zero-length blob (a workspace made, or locked, and never
        // written) is no state: `Absent` replaces it, while it is that one.
        let as_expected = match (expect, &props) {
            (Expect::Any, _) | (Expect::Absent, None) => true,
            (Expect::Absent, Some(p)) => p.size == 0,
            (Expect::Version(v), Some(p)) => history::token(p.md5.as_deref(), &p.etag) == *v,
            (Expect::Version(_), None) => false,
        };
        if !as_expected {
            return Ok(false);
        }
        let conditional = *expect != Expect::Any;
        // The caller of a conditional write must tell "not as expected"
        // from "written": a write repeated after no answer could be
        // refused for its own success, so it is sent once (no answer is
        // an error, and Terraform's retry finds it written by its head).
        let repeat = conditional.then_some(Repeat::Never);
        let not_written = || match conditional {
            true => Ok(false),
            false => Err(self.changed(&blob)),
        };
        // Only what was there before the lock check is replaced: a writer
        // whose lock was broken and taken over meanwhile finds the new
        // holder's lease, and a request applied late cannot bring an older
        // state back. Metadata is resent (a Put replaces it), lock info
        // included, as Terraform does.
        let (condition, metadata) = match &props {
            Some(p) => (Condition::Etag(p.etag.clone()), p.metadata.clone()),
            None if state.size() == 0 => return Ok(true),
            None => (Condition::Absent, Vec::new()),
        };
        // The snapshot only of the blob about to be replaced (a snapshot
        // leaves the base blob's ETag as it is).
        if self.snapshot && props.is_some() {
            match c.snapshot(&blob, &condition, lease.as_deref())? {
                Ok(()) => {}
                Err(Refusal::Lease) => {
                    self.lock_lost(&blob, lock_id)?;
                    return not_written();
                }
                Err(_) => return not_written(),
            }
        }
        match c.upload(
            &blob,
            state,
            &metadata,
            &condition,
            lease.as_deref(),
            repeat,
        )? {
            Ok(()) => Ok(true),
            Err(Refusal::Lease) => {
                self.lock_lost(&blob, lock_id)?;
                not_written()
            }
            Err(Refusal::Changed | Refusal::Missing) => not_written(),
        }
    }

    /// A write refused for its lease: the lock changed after the check.
    /// The lock error when the writer lost it; else `Ok` (the blob
    /// changed under the write, which was not made).
    fn lock_lost(&self, blob: &str, lock_id: Option<&str>) -> Result<(), Error> {
        let c = &self.container;
        let holder = c.properties(blob)?.map_or(Holder::None, |p| Holder::of(&p));
        check_lock(holder.reported(&c.path(blob)), lock_id)
    }

    fn changed(&self, blob: &str) -> Error {
        Error::Unavailable(format!(
            "the state at {} changed while this write was under way, so it was not written; read it again",
            self.container.path(blob)
        ))
    }
}

impl Backend for Azure {
    fn new(config: &Config) -> Result<Self, Error> {
        config.reject_unknown(&[
            "storage_account_name",
            "container_name",
            "key",
            "snapshot",
            "blob_endpoint",
            "use_azuread_auth",
            "use_oidc",
            "use_msi",
            "client_id",
            "tenant_id",
            "environment",
            "authority_host",
        ])?;
        check_sign_in(config)?;
        let account = config.required("storage_account_name")?;
        if !(3..=24).contains(&account.len())
            || !account
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        {
            return Err(invalid(
                "storage_account_name",
                format!(
                    "{account:?} is not a storage account name (3 to 24 lowercase letters and digits)"
                ),
            ));
        }
        let container = config.required("container_name")?;
        if !(3..=63).contains(&container.len())
            || !container
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(invalid(
                "container_name",
                format!(
                    "{container:?} is not a container name (3 to 63 lowercase letters, digits and hyphens)"
                ),
            ));
        }
        let key = config.required("key")?;
        if key.is_empty() || key.len() > 1000 {
            return Err(invalid(
                "key",
                "must be a blob name such as \"prod.terraform.tfstate\"",
            ));
        }
        let snapshot = config.parse_or("snapshot", false)?;
        let default_endpoint = format!("https://{account}.blob.core.windows.net");
        let endpoint = config.get("blob_endpoint").unwrap_or(&default_endpoint);
        if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
            return Err(invalid(
                "blob_endpoint",
                format!(
                    "{endpoint:?} must start with http:// or https:// (e.g. \"https://{account}.blob.core.windows.net\", or Azurite's \"http://127.0.0.1:10000/devstoreaccount1\")"
                ),
            ));
        }
        Ok(Azure {
            container: Container::new(endpoint, container),
            key: key.to_string(),
            snapshot,
        })
    }

    fn read_into(&self, ws: &str, out: &mut StateWriter<'_>) -> Result<bool, Error> {
        let blob = self.blob(ws);
        for _ in 0..READ_TRIES {
            let Some(props) = self.container.properties(&blob)? else {
                return Ok(false);
            };
            // A zero-length blob is a workspace without a state.
            if props.size == 0 {
                return Ok(false);
            }
            if self.stream(&blob, None, Some(&props.etag), out)? {
                return Ok(true);
            }
        }
        Err(Error::Unavailable(format!(
            "{} kept changing while it was read; retry",
            self.container.path(&blob)
        )))
    }

    fn write_from(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
    ) -> Result<(), Error> {
        self.replace(ws, state, lock_id, &Expect::Any).map(|_| ())
    }

    /// One ranged Get Blob: the first bytes, and in its headers the ETag,
    /// the size (`Content-Range`) and the blob's MD5
    /// (`x-ms-blob-content-md5`: the store's own for a Put Blob, this
    /// guest's for a block list). The version names the content (`md5-`
    /// and its MD5, else the ETag), not the blob: taking or releasing a
    /// lock rewrites the blob's metadata, and so its ETag, but leaves the
    /// version of its state as it was.
    fn head(&self, ws: &str, prefix: &mut StateWriter<'_>) -> Result<Option<Head>, Error> {
        let blob = self.blob(ws);
        // Gone, or zero-length (416: no state), are both none.
        let Some(answer) = self.container.range(&blob, None, None, 0, HEAD_BYTES - 1)? else {
            return Ok(None);
        };
        let first = workspace_metadata::first_bytes(&answer, &self.container.path(&blob))?;
        if first.size == 0 {
            return Ok(None);
        }
        let mut bytes = answer.body;
        bytes.truncate(HEAD_BYTES as usize);
        if let Err(e) = std::io::Write::write_all(prefix, &bytes)
            && !prefix.is_stopped()
        {
            return Err(Error::io("handing the state's first bytes to the host", e));
        }
        Ok(Some(Head {
            version: history::token(first.md5.as_deref(), &first.etag),
            size: first.size,
            digest: first.md5_hex().map(|hex| format!("md5:{hex}")),
        }))
    }

    /// Put Blob (Put Block List for a large state) with `If-Match` on the
    /// ETag of the blob read just before, whose content is the version
    /// expected; for `Absent` `If-None-Match: *`, or `If-Match` on the
    /// zero-length blob of a workspace never written (Terraform's lock
    /// makes one): the store's own compare-and-swap, under the lease when
    /// the writer holds the lock.
    fn write_if(
        &self,
        ws: &str,
        state: &mut StateReader<'_>,
        lock_id: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        self.replace(ws, state, lock_id, expect)
    }

    fn read_metadata(&self, ws: &str) -> Result<Option<Metadata>, Error> {
        workspace_metadata::read(&self.container, &workspace_metadata::blob(&self.key, ws))
    }

    fn write_metadata(
        &self,
        ws: &str,
        content: Option<&str>,
        expect: &Expect,
    ) -> Result<bool, Error> {
        let blob = workspace_metadata::blob(&self.key, ws);
        workspace_metadata::write(&self.container, &blob, content, expect)
    }

    /// The blob is emptied, not deleted: a zero-length blob reads as no
    /// state, and the workspace keeps its lease (the lock) and snapshots.
    fn delete(&self, ws: &str, lock_id: Option<&str>) -> Result<(), Error> {
        self.replace(ws, &mut StateReader::from_slice(&[]), lock_id, &Expect::Any)
            .map(|_| ())
    }

    fn lock(&self, ws: &str, info: &LockInfo) -> Result<(), Error> {
        lease::lock(&self.container, &self.blob(ws), info)
    }

    fn unlock(&self, ws: &str, id: &str) -> Result<(), Error> {
        lease::unlock(&self.container, &self.blob(ws), id)
    }

    fn current_lock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        lease::current(&self.container, &self.blob(ws))
    }

    fn force_unlock(&self, ws: &str) -> Result<Option<LockInfo>, Error> {
        lease::force(&self.container, &self.blob(ws))
    }

    /// As Terraform lists them (`default` first, then the blobs named
    /// `key + "env:" + name`, nothing below a further `/`), but over every
    /// page of the listing.
    fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let prefix = format!("{}env:", self.key);
        let mut names: Vec<String> = listing::all(&self.container, &prefix, false)?
            .into_iter()
            .filter_map(|b| b.name.strip_prefix(&prefix).map(str::to_string))
            .filter(|ws| {
                !ws.contains('/')
                    && ws != DEFAULT
                    && wasmstate_guest::validate_workspace_name(ws).is_ok()
            })
            .collect();
        names.sort();
        names.dedup();
        names.insert(0, DEFAULT.to_string());
        Ok(names)
    }

    fn create_workspace(&self, ws: &str) -> Result<bool, Error> {
        let blob = self.blob(ws);
        match self
            .container
            .put(&blob, Vec::new(), &[], &Condition::Absent, None, None)?
        {
            Ok(()) => Ok(true),
            Err(Refusal::Changed | Refusal::Lease) => Ok(false),
            Err(Refusal::Missing) => Err(Error::Internal(format!(
                "container {} does not exist",
                self.container.name
            ))),
        }
    }

    /// Deletes the blob with its snapshots, only while unleased and
    /// unchanged since it was read (as Terraform, which sends no lease).
    fn delete_workspace(&self, ws: &str) -> Result<(), Error> {
        if ws == DEFAULT {
            return Err(Error::InvalidInput(
                "the default workspace cannot be deleted".into(),
            ));
        }
        let c = &self.container;
        let blob = self.blob(ws);
        let Some(props) = c.properties(&blob)? else {
            return Err(Error::NotFound);
        };
        if let Some(holder) = Holder::of(&props).reported(&c.path(&blob)) {
            return Err(Error::locked(holder));
        }
        match c.delete(&blob, &Condition::Etag(props.etag))? {
            // Then its metadata: after the state, so a workspace still
            // listed keeps its metadata whatever fails (a failure here
            // leaves the document, for a workspace of that name made later).
            Ok(()) | Err(Refusal::Missing) => {
                let metadata = workspace_metadata::blob(&self.key, ws);
                workspace_metadata::write(c, &metadata, None, &Expect::Any).map(|_| ())
            }
            Err(Refusal::Lease | Refusal::Changed) => {
                match c
                    .properties(&blob)?
                    .map(|p| Holder::of(&p).reported(&c.path(&blob)))
                {
                    Some(Some(holder)) => Err(Error::locked(holder)),
                    _ => Err(Error::Unavailable(format!(
                        "{} changed while it was being deleted, so it was not; retry",
                        c.path(&blob)
                    ))),
                }
            }
        }
    }

    /// The blob's snapshots and the live blob, with `snapshot = true`;
    /// otherwise none, and the host keeps versions.
    fn list_versions(&self, ws: &str) -> Result<Option<Vec<Version>>, Error> {
        if !self.snapshot {
            return Ok(None);
        }
        history::list(&self.container, &self.blob(ws)).map(Some)
    }

    fn read_version_into(
        &self,
        ws: &str,
        id: &str,
        out: &mut StateWriter<'_>,
    ) -> Result<bool, Error> {
        if !self.snapshot {
            return Ok(false);
        }
        let blob = self.blob(ws);
        // The live blob's ETag changes with a lock alone: located again,
        // its content is still the one named, or a snapshot holds it.
        for _ in 0..READ_TRIES {
            let Some(at) = history::locate(&self.container, &blob, id)? else {
                return Ok(false);
            };
            if self.stream(&blob, at.snapshot.as_deref(), at.etag.as_deref(), out)? {
                return Ok(true);
            }
            if at.etag.is_none() {
                return Ok(false);
            }
        }
        Err(Error::Unavailable(format!(
            "{} kept changing while version {id} was read; retry",
            self.container.path(&blob)
        )))
    }
}

/// The Entra ID settings the guest sees agree: one way of signing in, and
/// Entra ID not turned off while one is asked for.
fn check_sign_in(config: &Config) -> Result<(), Error> {
    let flag = |name: &str| -> Result<Option<bool>, Error> {
        match config.get(name).map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(None),
            Some(v) if v == "true" => Ok(Some(true)),
            Some(v) if v == "false" => Ok(Some(false)),
            Some(v) => Err(invalid(name, format!("{v:?} is not true or false"))),
        }
    };
    let (azuread, oidc, msi) = (
        flag("use_azuread_auth")?,
        flag("use_oidc")?,
        flag("use_msi")?,
    );
    if oidc == Some(true) && msi == Some(true) {
        return Err(invalid(
            "use_msi",
            "use_oidc and use_msi are both true: keep the one this host signs in with",
        ));
    }
    if azuread == Some(false)
        && let Some(way) = [("use_oidc", oidc), ("use_msi", msi)]
            .iter()
            .find_map(|(name, on)| (*on == Some(true)).then_some(*name))
    {
        return Err(invalid(
            "use_azuread_auth",
            format!(
                "false contradicts {way} = true: set use_azuread_auth = true to sign in with Entra ID"
            ),
        ));
    }
    Ok(())
}

register_backend!(Azure);
