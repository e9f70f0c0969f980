//! The credentials of one libgit2 call: offered only for the granted URL,
//! a bounded number of times, and never past the request's deadline or a
//! download's size limit.

use super::*;

/// Credential state for one call: bounds libgit2's retry loop and records a
/// refusal; stops the call at the request's deadline.
pub(super) struct Auth<'g> {
    auth: &'g GitAuth,
    attempts: Cell<u32>,
    pub(super) refused: Cell<bool>,
    deadline: Option<Instant>,
    pub(super) expired: Cell<bool>,
    /// The URL these credentials are for; asked for another (a redirect),
    /// they are not offered.
    url: Option<String>,
    /// The most bytes a download may bring (what the clone may still
    /// take); past it the download is stopped.
    max_received: Option<u64>,
    /// Set when a download was stopped at `max_received`.
    pub(super) over: Cell<bool>,
}

impl<'g> Auth<'g> {
    pub(super) fn new(auth: &'g GitAuth, deadline: Option<Instant>) -> Self {
        Auth {
            auth,
            attempts: Cell::new(0),
            refused: Cell::new(false),
            deadline,
            expired: Cell::new(false),
            url: None,
            max_received: None,
            over: Cell::new(false),
        }
    }

    /// Stop a download that brings more than `bytes`.
    pub(super) fn downloading_at_most(mut self, bytes: u64) -> Self {
        self.max_received = Some(bytes);
        self
    }

    /// Whether a download that has brought `received` bytes may go on.
    fn within(&self, received: usize) -> bool {
        let within = self.max_received.is_none_or(|m| received as u64 <= m);
        if !within {
            self.over.set(true);
        }
        within
    }

    /// Offer the credentials only when libgit2 asks on behalf of `url`.
    pub(super) fn for_url(mut self, url: &str) -> Self {
        self.url = Some(normalize_url(url));
        self
    }

    /// Whether the call may go on (false once the deadline has passed).
    fn in_time(&self) -> bool {
        let in_time = self.deadline.is_none_or(|d| Instant::now() < d);
        if !in_time {
            self.expired.set(true);
        }
        in_time
    }

    /// Callbacks offering our credentials and cancelling at the deadline. A
    /// fresh set is needed per libgit2 call because fetch/push replace the
    /// connection's callbacks with their own.
    pub(super) fn callbacks(&self) -> RemoteCallbacks<'_> {
        let mut cb = RemoteCallbacks::new();
        cb.credentials(move |asking, url_user, allowed| {
            if !self.in_time() {
                return Err(git2::Error::from_str("the request's deadline passed"));
            }
            if let Some(granted) = &self.url
                && !same_repository(granted, asking)
            {
                self.refused.set(true);
                tracing::warn!(url = %redact(asking), "git credentials withheld: asked for on behalf of another URL");
                return Err(git2::Error::from_str("credentials are only for the granted URL"));
            }
            self.offer(url_user, allowed)
        });
        cb.transfer_progress(move |p| self.in_time() && self.within(p.received_bytes()));
        cb.sideband_progress(move |_| self.in_time());
        cb.push_negotiation(move |_| {
            if self.in_time() {
                Ok(())
            } else {
                Err(git2::Error::from_str("the request's deadline passed"))
            }
        });
        cb
    }

    pub(super) fn offer(
        &self,
        url_user: Option<&str>,
        allowed: CredentialType,
    ) -> Result<Cred, git2::Error> {
        self.attempts.set(self.attempts.get() + 1);
        let a = self.auth;
        let user = a.username.as_deref().or(url_user).unwrap_or("git");
        let cred = if self.attempts.get() > MAX_AUTH_ATTEMPTS {
            None
        } else if allowed.contains(CredentialType::USERNAME) {
            Some(Cred::username(user))
        } else if allowed.contains(CredentialType::SSH_KEY) {
            Some(match &a.ssh_key {
                Some(key) => Cred::ssh_key(user, None, key, None),
                None => Cred::ssh_key_from_agent(user),
            })
        } else if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) {
            a.password
                .as_deref()
                .map(|p| Cred::userpass_plaintext(user, p))
        } else {
            None
        };
        cred.unwrap_or_else(|| {
            self.refused.set(true);
            Err(git2::Error::from_str("no (more) credentials to offer"))
        })
    }
}
