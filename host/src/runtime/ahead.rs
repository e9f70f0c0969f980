//! The thread that makes instances ahead of their calls, at the lowest
//! scheduling priority.
//!
//! An instance made ahead is work no client waits for, yet on the
//! server's own runtime it ran beside the answer of the call that had
//! just ended (hyper writing it, the client reading it) and took their
//! cores: on a 2-core machine a 100 KiB GET over a socket cost 343–353 µs
//! with the instance made there, and 244–264 µs with it made here
//! (`cargo bench --bench guest_vs_native -- socket-GET`, same build, runs
//! alternated; `docs/benchmarks.md`, "Where a request's time goes"). At
//! nice 19 the kernel gives this thread a core only when the request path
//! leaves one idle, which between a client's requests it does.
//!
//! One thread for the whole server, with a current-thread runtime: what
//! it runs is a few tens of microseconds a backend, only for backends
//! whose calls come one at a time (under load nothing is made ahead), and
//! a start function that awaits the network yields the thread to the
//! others. Nothing here holds a call's slots: a starved lane delays only
//! the instances it makes, and a call that finds none ready makes its own.
//! An instance made here takes none of its backend's turns on the cores
//! ([`super::turns`]) until a call takes it: preempted at nice 19, it
//! holds none that the backend's calls wait for. (A start function that
//! writes a file still takes the quota's lock while it does.)

use std::future::Future;
use std::sync::OnceLock;
use tokio::runtime::Handle;

/// The niceness of the lane's thread: the lowest priority there is.
const NICENESS: i32 = 19;

/// Run `work` on the lane.
pub(super) fn spawn(work: impl Future<Output = ()> + Send + 'static) {
    match lane() {
        Some(lane) => drop(lane.spawn(work)),
        // The thread could not start (no threads left): make it on the
        // server's runtime, as before the lane.
        None => drop(tokio::spawn(work)),
    }
}

fn lane() -> Option<&'static Handle> {
    static LANE: OnceLock<Option<Handle>> = OnceLock::new();
    LANE.get_or_init(start).as_ref()
}

fn start() -> Option<Handle> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("wasmstate-ahead")
        .build()
        .inspect_err(|e| tracing::warn!("cannot start the thread making instances ahead: {e}"))
        .ok()?;
    let handle = runtime.handle().clone();
    // Never dropped: this runs in a call's task (`Shared::after_call`), and
    // a runtime dropped inside an async context panics ("Cannot drop a
    // runtime in a context where blocking is not allowed"). Had the thread
    // failed to start, the closure and the runtime in it would be dropped
    // here: the panic would fail the call that just ended (a write already
    // made, reported failed) and leave its backend's ready one `Preparing`
    // for good. Leaked instead (a few descriptors, once: `None` is kept).
    let runtime = std::mem::ManuallyDrop::new(runtime);
    std::thread::Builder::new()
        .name("wasmstate-ahead".into())
        .spawn(move || {
            // On Linux a niceness set this way is the calling thread's
            // own. Failing to lower it only costs what the lane saves.
            if let Err(e) = rustix::process::setpriority_process(None, NICENESS) {
                tracing::debug!("cannot lower the ahead thread's priority: {e}");
            }
            runtime.block_on(std::future::pending::<()>());
        })
        .inspect_err(|e| tracing::warn!("cannot start the thread making instances ahead: {e}"))
        .ok()?;
    Some(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn work_runs_on_the_lane_thread_at_the_lowest_priority() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        spawn(async move {
            let name = std::thread::current().name().map(str::to_owned);
            let nice = rustix::process::getpriority_process(None).ok();
            let _ = tx.send((name, nice));
        });
        let (name, nice) = rx.await.expect("the lane ran the work");
        assert_eq!(name.as_deref(), Some("wasmstate-ahead"));
        assert_eq!(nice, Some(NICENESS), "its niceness");
    }
}
