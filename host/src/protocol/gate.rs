//! One host's order on each workspace: every change to a workspace (a
//! guarded write, lock, unlock, force-unlock, delete, restore) runs alone
//! on this host, so the stale-write guard's check and the write it allows
//! cannot be split by another change arriving here. Reads never wait.
//!
//! Across hosts the storage decides; this gate only closes the window
//! inside one process (two `-lock=false` writers from the same serial, a
//! force-unlock landing between a holder's guard and its write).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Per-workspace gates, made on first use and forgotten when unused, so
/// their number follows the workspaces being changed right now.
#[derive(Default)]
pub struct WorkspaceGates {
    gates: Mutex<HashMap<WorkspaceKey, Weak<AsyncMutex<()>>>>,
}

/// (backend, workspace).
type WorkspaceKey = (String, String);

/// Held while one change to a workspace runs; dropping it lets the next in.
pub struct Gate {
    _held: OwnedMutexGuard<()>,
}

impl WorkspaceGates {
    /// Wait until no other change to `backend`/`workspace` runs on this host.
    pub async fn enter(&self, backend: &str, workspace: &str) -> Gate {
        let gate = {
            let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
            let key = (backend.to_string(), workspace.to_string());
            match gates.get(&key).and_then(Weak::upgrade) {
                Some(gate) => gate,
                None => {
                    // Sweep the gates nobody holds before adding one, so the
                    // map never outgrows the changes in flight by much.
                    if gates.len() >= 64 {
                        gates.retain(|_, gate| gate.strong_count() > 0);
                    }
                    let gate = Arc::new(AsyncMutex::new(()));
                    gates.insert(key, Arc::downgrade(&gate));
                    gate
                }
            }
        };
        Gate {
            _held: gate.lock_owned().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_change_per_workspace_at_a_time() {
        let gates = Arc::new(WorkspaceGates::default());
        let first = gates.enter("b", "w").await;
        // Another workspace is not held up.
        let _other = gates.enter("b", "other").await;
        let waiting = {
            let gates = gates.clone();
            tokio::spawn(async move { gates.enter("b", "w").await })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "a second change got in");
        drop(first);
        tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the second change enters once the first is done")
            .unwrap();
    }

    #[tokio::test]
    async fn unused_gates_are_forgotten() {
        let gates = WorkspaceGates::default();
        for i in 0..1000 {
            drop(gates.enter("b", &format!("w{i}")).await);
        }
        assert!(gates.gates.lock().unwrap().len() <= 64);
    }
}
