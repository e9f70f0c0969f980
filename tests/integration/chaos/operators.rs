//! What operators and other teams do beside the Terraform-like clients,
//! each a seam between two features where a state was lost or a lock
//! granted twice (issue 47):
//!
//! - an administrator deletes the state while a lock is held (`DELETE
//!   ?ID=`), then leaves it deleted, pushes a backup of it again (an older
//!   serial of the same lineage: a legitimate restart of the state, which
//!   every replica must then serve), or starts a new lineage;
//! - a second writer of another lineage on a workspace just started (the
//!   first writer's state OpenTofu-encrypted or a legacy format 3 half
//!   the time, which the stale-write guard cannot see into): 409, never
//!   200, once a state of another lineage is stored;
//! - a workspace deleted and created again through the API
//!   (`wasmstate workspace delete|create`), then read and written: one of
//!   its own ([`API_WORKSPACE`]), so that few locks keep the delete out.

use super::clients::{Client, answer, answer_keeping, lock_info};
use super::history::{Op, Outcome, Written};
use std::time::Duration;

/// The workspace that only [`Client::recreate_workspace`] uses.
pub const API_WORKSPACE: &str = "ws-api";

impl Client {
    /// Lock, DELETE the state with the lock's ID, then leave it deleted,
    /// push a backup again, or start a new lineage; unlock. After a backup
    /// was pushed, read it through every host.
    pub fn delete_under_lock(&mut self, workspace: &str) {
        let id = self.next_name();
        // `-lock-timeout`: a few tries, as an operator's tool would.
        let mut tries = 0;
        while !self
            .send(
                workspace,
                Op::Lock(id.clone()),
                "LOCK",
                Some(lock_info(&id)),
            )
            .is(200)
        {
            tries += 1;
            if tries == 5 {
                return;
            }
            std::thread::sleep(Duration::from_millis(30 + self.rng.below(100) as u64));
        }
        let deleted = self.send_to(
            workspace,
            Op::DeleteState(Some(id.clone())),
            "DELETE",
            &format!("?ID={id}"),
            None,
        );
        let mut pushed_again = false;
        if deleted.is(200) {
            // The operator's pace (finding the backup), not a wait for
            // anything: the lock stays held over an empty workspace, as a
            // native client's lock attempts find it.
            std::thread::sleep(Duration::from_millis(50 + self.rng.below(250) as u64));
            let backups = self.backups.get(workspace).cloned().unwrap_or_default();
            match self.rng.below(4) {
                0 => {}
                1 | 2 if !backups.is_empty() => {
                    let (old, body) = backups[self.rng.below(backups.len())].clone();
                    let written = Written {
                        lock_id: Some(id.clone()),
                        shape: "re-push",
                        ..old
                    };
                    pushed_again = self.post_body(workspace, written, body).is(200);
                }
                _ => {
                    let fresh = (format!("l-{}", self.next_name()), 0);
                    self.post(workspace, &fresh, Some(&id));
                }
            }
        }
        self.send(
            workspace,
            Op::Unlock(id.clone()),
            "UNLOCK",
            Some(lock_info(&id)),
        );
        if pushed_again {
            self.read_everywhere(workspace);
        }
    }

    /// Two writers starting the workspace from nothing (or from serial
    /// 1): the first one's state stored, the second's other lineage must
    /// be refused. The first writes what the guard cannot see into half
    /// the time.
    pub fn second_lineage(&mut self, workspace: &str) {
        let Some(base) = self.get(workspace) else {
            return;
        };
        if base.1 == 0 {
            let shape = ["opaque", "v3", "", "opaque"][self.rng.below(4)];
            let (written, body) = self.written_as(workspace, &base, None, Some(shape));
            if !self.post_body(workspace, written, body).is(200) {
                return;
            }
        }
        let rival = (format!("s-{}", self.next_name()), 0);
        self.post(workspace, &rival, None);
    }

    /// `wasmstate workspace delete` and `create`, then an apply on it.
    pub fn recreate_workspace(&mut self, workspace: &str) {
        self.delete_workspace(workspace);
        let (host, base) = self.hosts.pick(&mut self.rng);
        let url = format!("{base}/workspaces/{}/{workspace}", self.backend);
        let http = self.http.clone();
        let created = self
            .recorder
            .record(self.id, host, workspace, Op::CreateWorkspace, || {
                answer(http.put(&url).send(), false)
            });
        if created.is(200) || created.is(201) {
            self.read_everywhere(workspace);
            self.locked_write(workspace);
        }
    }

    /// `terraform state pull > backup`: a GET whose state is kept as a
    /// backup to push again some day.
    pub fn pull_backup(&mut self, workspace: &str) {
        let (host, base) = self.hosts.pick(&mut self.rng);
        let request = self
            .http
            .get(format!("{base}/states/{}/{workspace}", self.backend));
        let mut body = None;
        let outcome = self.recorder.record(self.id, host, workspace, Op::Get, || {
            answer_keeping(request.send(), true, &mut body)
        });
        if let (Outcome::Answered(200, Some(seen)), Some(body)) = (outcome, body)
            && !seen.blank
        {
            let written = Written {
                lineage: seen.lineage,
                serial: seen.serial,
                digest: seen.digest,
                lock_id: None,
                shape: "",
            };
            self.keep_backup(workspace, written, body);
        }
    }

    /// The remedy docs/guarantees.md gives for a replica refusing a state
    /// deleted and pushed again below serial `newest` on storage without
    /// a shared history: lock, read (through whichever replica serves it),
    /// write it again as serial `newest + 1` of its lineage, unlock.
    pub fn push_above(&mut self, workspace: &str, newest: u64) {
        let id = self.next_name();
        let lock = self.send(
            workspace,
            Op::Lock(id.clone()),
            "LOCK",
            Some(lock_info(&id)),
        );
        if !lock.is(200) {
            return;
        }
        if let Some((lineage, serial)) = self.get(workspace)
            && serial <= newest
        {
            self.post(workspace, &(lineage, newest), Some(&id));
        }
        self.send(
            workspace,
            Op::Unlock(id.clone()),
            "UNLOCK",
            Some(lock_info(&id)),
        );
    }

    /// GET the state through every host that is up.
    pub fn read_everywhere(&mut self, workspace: &str) -> Vec<Outcome> {
        let hosts = self.hosts.up();
        hosts
            .into_iter()
            .map(|(host, base)| {
                let url = format!("{base}/states/{}/{workspace}", self.backend);
                let request = self.http.get(&url);
                self.recorder.record(self.id, host, workspace, Op::Get, || {
                    answer(request.send(), true)
                })
            })
            .collect()
    }
}

/// The serial N a host names when it refuses a state as older than one it
/// served and says to push it once more above N.
pub fn refused_below(outcome: &Outcome) -> Option<u64> {
    let Outcome::Failed(500, said) = outcome else {
        return None;
    };
    if !said.contains("push it once more") {
        return None;
    }
    said.split("older than serial ")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}
