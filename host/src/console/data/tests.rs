use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A listing of locks asks about at most MAX_LOCK_CHECKS workspaces,
/// LOCK_CHECKS_AT_ONCE at a time, and says when it left some out.
#[tokio::test]
async fn a_listing_of_locks_is_bounded_and_says_when_it_is_cut() {
    let names: Vec<String> = (0..1500).map(|i| format!("w{i:04}")).collect();
    let checks = tokio::sync::Semaphore::new(LOCK_CHECKS_AT_ONCE);
    let (calls, now, most) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicUsize::new(0),
    );
    let (locks, cut) = gather_locks(names, &checks, |name| {
        let (calls, now, most) = (&calls, &now, &most);
        async move {
            calls.fetch_add(1, Ordering::SeqCst);
            let at_once = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(at_once, Ordering::SeqCst);
            tokio::task::yield_now().await;
            now.fetch_sub(1, Ordering::SeqCst);
            let held = name.ends_with('7').then(|| LockInfo {
                id: name.clone(),
                ..LockInfo::default()
            });
            Ok((name, held))
        }
    })
    .await;
    assert_eq!(calls.load(Ordering::SeqCst), MAX_LOCK_CHECKS);
    assert_eq!(cut, Some(1500));
    assert!(most.load(Ordering::SeqCst) <= LOCK_CHECKS_AT_ONCE);
    assert_eq!(locks.unwrap().len(), MAX_LOCK_CHECKS / 10);
    let (_, cut) = gather_locks(
        vec!["a".into()],
        &checks,
        |name| async move { Ok((name, None)) },
    )
    .await;
    assert_eq!(cut, None);
}

/// A comparison waits for the one under way no longer than its bound,
/// then is answered 503 with Retry-After.
#[tokio::test(start_paused = true)]
async fn a_comparison_waits_for_the_slot_no_longer_than_its_bound() {
    let slot = Arc::new(tokio::sync::Semaphore::new(1));
    let held = diff_turn(&slot, DIFF_WAIT).await.unwrap();
    let started = tokio::time::Instant::now();
    let busy = tokio::time::timeout(DIFF_WAIT * 2, diff_turn(&slot, DIFF_WAIT))
        .await
        .expect("answered within its bound");
    match busy {
        Err(ApiError::RetryAfter(status, _, why)) => {
            assert_eq!(status, axum::http::StatusCode::SERVICE_UNAVAILABLE);
            assert!(why.contains("busy, retry"), "{why}");
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    assert!(started.elapsed() >= DIFF_WAIT);
    drop(held);
    assert!(diff_turn(&slot, DIFF_WAIT).await.is_ok());
}
