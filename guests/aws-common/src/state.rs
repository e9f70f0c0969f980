//! The state layout on S3, byte-compatible with Terraform's `backend "s3"`:
//! which key holds which workspace's state, and how a state is read,
//! written and listed there.

use crate::s3::S3State;
use crate::writes::Condition;
use crate::{block_on, sdk_error};
use wasmstate_guest::{Error, StateReader};

impl S3State {
    /// Copy the state of `workspace` into `out`; `false` when there is
    /// none. An empty object (a created, never written workspace) counts
    /// as none.
    pub fn read_state_to(
        &self,
        workspace: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<bool, Error> {
        Ok(self.read_tagged_state_to(workspace, out)?.is_some())
    }

    /// As [`S3State::read_state_to`], with the [`crate::WRITE_TAG`] of the write
    /// that put the state: `None` when there is no state, `Some(None)`
    /// for a state without one (written by Terraform, say).
    pub fn read_tagged_state_to(
        &self,
        workspace: &str,
        out: &mut dyn std::io::Write,
    ) -> Result<Option<Option<String>>, Error> {
        Ok(self
            .get_to(&self.settings.state_key(workspace), None, out)?
            .filter(|got| got.size > 0)
            .map(|got| got.tag))
    }

    /// Replace the state of `workspace` with what `state` yields, handing
    /// every chunk to `each` on its way and tagging the object with `tag`
    /// ([`crate::WRITE_TAG`]).
    ///
    /// The write replaces only the object that was there before `checked`
    /// ran (`If-Match` its ETag, `If-None-Match` when there was none; on a
    /// store that answers 501 to conditional writes, without one).
    /// `checked` is the caller's lock check: run after the ETag is read, a
    /// writer whose lock is taken over after its check finds the new
    /// holder's state there and is refused; and a request S3 applies late
    /// (sent before a deadline stopped this guest, applied after a newer
    /// write) cannot bring an older state back.
    pub fn write_state_from(
        &self,
        workspace: &str,
        state: &mut StateReader<'_>,
        each: impl FnMut(&[u8]),
        tag: Option<&str>,
        checked: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let key = self.settings.state_key(workspace);
        let condition = Condition::Preferably(Box::new(match self.etag_of(&key)? {
            Some(etag) => Condition::IfMatch(etag),
            None => Condition::IfAbsent,
        }));
        checked()?;
        if self.put_from(&key, state, each, &condition, tag)? {
            return Ok(());
        }
        Err(Error::Unavailable(format!(
            "the state at {} changed while this write was under way, so it was not written; \
             read it again",
            self.url(&key)
        )))
    }

    /// The ETag of `workspace`'s state object (a HEAD), `None` when there
    /// is none: what a delete reads before its lock check and then deletes
    /// with [`S3State::delete_state_read`].
    pub fn state_etag(&self, workspace: &str) -> Result<Option<String>, Error> {
        self.etag_of(&self.settings.state_key(workspace))
    }

    /// The [`crate::WRITE_TAG`] of `workspace`'s state object (a HEAD):
    /// `None` when there is none, `Some(None)` for one without a tag.
    pub fn state_write_tag(&self, workspace: &str) -> Result<Option<Option<String>>, Error> {
        self.write_tag_of(&self.settings.state_key(workspace))
    }

    /// Delete the state of `workspace` only while it is still the object
    /// whose ETag `etag` was read before the caller's lock check
    /// (`If-Match`; on a store that answers 501 to conditional deletes,
    /// without one). A delete S3 applies late (sent before a deadline
    /// stopped this guest, applied after a newer write was acknowledged)
    /// is refused, and so is one racing a write: the newer state stays.
    ///
    /// When the object changed, `check` (the caller's lock check, run
    /// again) names why if it can (the lock changed hands: 423/409 with
    /// the holder); else the refusal says the state changed meanwhile. An
    /// object gone meanwhile was deleted by someone else: done.
    pub fn delete_state_read(
        &self,
        workspace: &str,
        etag: &str,
        check: impl FnOnce() -> Result<(), Error>,
    ) -> Result<(), Error> {
        let key = self.settings.state_key(workspace);
        let condition = Condition::Preferably(Box::new(Condition::IfMatch(etag.to_string())));
        if self.remove_when(&key, &condition)? || self.etag_of(&key)?.is_none() {
            return Ok(());
        }
        check()?;
        Err(Error::Unavailable(format!(
            "the state at {} changed while this delete was under way (a newer state was \
             written), so it was not deleted; read it again before deleting it",
            self.url(&key)
        )))
    }

    /// Whether `workspace` exists (has a state object, maybe empty).
    pub fn workspace_exists(&self, workspace: &str) -> Result<bool, Error> {
        self.exists(&self.settings.state_key(workspace))
    }

    /// Create `workspace` as an empty state object; `false` if it existed.
    pub fn create_workspace(&self, workspace: &str) -> Result<bool, Error> {
        self.put(&self.settings.state_key(workspace), b"", true)
    }

    /// Workspaces as Terraform lists them: every key exactly
    /// `<prefix>/<ws>/<key>` (so lock files and other objects are not
    /// workspaces).
    pub fn list_workspaces(&self) -> Result<Vec<String>, Error> {
        let s = &self.settings;
        let prefix = if s.workspace_prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", s.workspace_prefix)
        };
        let mut names = Vec::new();
        let mut token: Option<String> = None;
        block_on(async {
            loop {
                let mut request = self
                    .client
                    .list_objects_v2()
                    .bucket(&s.bucket)
                    .prefix(&prefix);
                if let Some(t) = token.take() {
                    request = request.continuation_token(t);
                }
                let out = request
                    .send()
                    .await
                    .map_err(|e| sdk_error(&format!("listing s3://{}/{prefix}", s.bucket), e))?;
                for object in out.contents() {
                    let Some(rest) = object.key().and_then(|k| k.strip_prefix(&prefix)) else {
                        continue;
                    };
                    if let Some((ws, tail)) = rest.split_once('/')
                        && tail == s.key
                        && !ws.is_empty()
                    {
                        names.push(ws.to_string());
                    }
                }
                match out.next_continuation_token() {
                    Some(t) if out.is_truncated() == Some(true) => token = Some(t.to_string()),
                    _ => return Ok(names),
                }
            }
        })
    }
}
