//! What the protocol layer tells the audit trail ([`crate::audit`]): one
//! record per change, with who asked and what was answered.

use super::{ApiError, App, Caller};
use crate::audit::{Facts, Operation, Record, lock_digest, now_text};

/// What a change answered, for its record's status.
pub trait Answered {
    /// The HTTP status of the answer.
    fn status(&self) -> u16 {
        200
    }
}

impl Answered for axum::response::Response {
    fn status(&self) -> u16 {
        self.status().as_u16()
    }
}

impl Answered for () {}
impl Answered for u64 {}
impl<T> Answered for Option<T> {}

impl<S> App<S> {
    /// Record `operation` on `backend`/`workspace`, asked by `caller` and
    /// answered `outcome`, with what the change learnt (`facts`). The
    /// future it returns holds none of the arguments (an answer need not be
    /// `Sync`): the record is made before it is awaited.
    pub fn record<'a, T: Answered>(
        &'a self,
        caller: &Caller,
        (backend, workspace): (&str, &str),
        operation: Operation,
        facts: Facts,
        outcome: &Result<T, ApiError>,
    ) -> impl std::future::Future<Output = ()> + use<'a, S, T> {
        let record = self.make(caller, (backend, workspace), operation, facts, outcome);
        self.audit.append(record)
    }

    fn make<T: Answered>(
        &self,
        caller: &Caller,
        (backend, workspace): (&str, &str),
        operation: Operation,
        facts: Facts,
        outcome: &Result<T, ApiError>,
    ) -> Record {
        let (status, result) = match outcome {
            Ok(answer) if facts.unchanged => (answer.status(), "unchanged".to_string()),
            Ok(answer) => (answer.status(), "ok".to_string()),
            Err(e) => (e.status().as_u16(), e.message()),
        };
        let result = match &facts.note {
            Some(note) => format!("{result}; {note}"),
            None => result,
        };
        let holder = facts.holder.or_else(|| match outcome {
            Err(ApiError::Holder(_, holder)) => Some(holder.who.clone()),
            _ => None,
        });
        let identity = caller.identity();
        Record {
            time: now_text(),
            replica: self.audit.replica().to_string(),
            caller: identity.map_or_else(|| "anyone".to_string(), |i| i.name.clone()),
            claims: identity.map(|i| i.claims.clone()).unwrap_or_default(),
            backend: backend.to_string(),
            workspace: workspace.to_string(),
            operation,
            before: facts.before,
            after: facts.after,
            lock: facts.lock_id.as_deref().map(lock_digest),
            holder,
            status,
            result,
        }
    }

    /// Whether `caller` may act as `role` on `at`; a refusal (403) is
    /// recorded as `operation` refused.
    pub async fn permit(
        &self,
        caller: &Caller,
        at: (&str, &str),
        role: crate::auth::Role,
        operation: Operation,
    ) -> Result<(), ApiError> {
        match caller.may(at.0, Some(at.1), role) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.refused(caller, at, operation, e).await),
        }
    }

    /// Record a change refused before it started (403: the caller may not;
    /// a body refused), at a bounded rate per caller, and hand the refusal
    /// back. What a change answers once it ran is always recorded.
    pub async fn refused(
        &self,
        caller: &Caller,
        at: (&str, &str),
        operation: Operation,
        refusal: ApiError,
    ) -> ApiError {
        let outcome: Result<(), ApiError> = Err(refusal);
        let record = self.make(caller, at, operation, Facts::default(), &outcome);
        self.audit.append_refusal(record).await;
        let Err(refusal) = outcome else {
            unreachable!("made an error above")
        };
        refusal
    }
}
