use super::*;

fn limits(total: usize, per_address: usize) -> NetworkLimits {
    NetworkLimits {
        clocks: Clocks {
            header: Duration::from_secs(1),
            idle: Duration::from_secs(1),
            write: Duration::from_secs(1),
        },
        max_connections: total,
        max_connections_per_address: per_address,
        shutdown_timeout: Duration::from_secs(1),
    }
}

#[test]
fn caps_count_in_total_and_by_address_and_give_places_back() {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
    let limits = limits(3, 2);
    // Each one's request has begun: none can make room.
    let first = admit(&counts, &limits, a).unwrap();
    let second = admit(&counts, &limits, a).unwrap();
    assert!(first.place.begin() && second.place.begin());
    assert_eq!(admit(&counts, &limits, a).err(), Some("address"));
    let third = admit(&counts, &limits, b).unwrap();
    assert!(third.place.begin());
    assert_eq!(admit(&counts, &limits, b).err(), Some("total"));
    drop(first);
    assert!(admit(&counts, &limits, a).is_ok());
    assert!(lock(&counts).by_address.len() <= 2);
}

/// At a cap, the connection idle the longest is closed to make room
/// (of the same address, at the address's cap); one answering or
/// reading a request never is, and without an idle one the new
/// connection is refused.
#[test]
fn at_a_cap_the_oldest_idle_connection_makes_room() {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let [a, b, c]: [IpAddr; 3] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|s| s.parse().unwrap());
    let limits = limits(3, 2);
    let first = admit(&counts, &limits, a).unwrap();
    let second = admit(&counts, &limits, b).unwrap();
    let third = admit(&counts, &limits, b).unwrap();
    for admitted in [&first, &second, &third] {
        assert!(admitted.place.begin());
    }
    assert_eq!(admit(&counts, &limits, c).err(), Some("total"), "none idle");
    let now = std::time::Instant::now();
    first.place.idle(now + Duration::from_secs(1));
    second.place.idle(now);
    let _fourth = admit(&counts, &limits, c).unwrap();
    assert_eq!(second.place.idle_since(), None, "the oldest idle is closed");
    assert!(first.place.idle_since().is_some(), "the younger one stays");
    assert_eq!(lock(&counts).total, 3);
    // The closed one's end does not give its place back twice.
    drop(second);
    assert_eq!(lock(&counts).total, 3);
    assert_eq!(lock(&counts).by_address.get(&b), Some(&1));

    // At an address's cap, only that address's idle connections make room.
    let counts = Arc::new(Mutex::new(Counts::default()));
    let limits = self::limits(10, 1);
    let other = admit(&counts, &limits, b).unwrap();
    assert!(other.place.begin());
    other.place.idle(now);
    let mine = admit(&counts, &limits, a).unwrap();
    assert!(mine.place.begin());
    assert_eq!(admit(&counts, &limits, a).err(), Some("address"));
    mine.place.idle(now + Duration::from_secs(1));
    let _again = admit(&counts, &limits, a).unwrap();
    assert_eq!(mine.place.idle_since(), None);
    assert!(other.place.idle_since().is_some());
    assert_eq!(lock(&counts).total, 2);
}

/// When none is idle, the connection waiting longest for its header
/// with nothing started makes room (its task is told to drop it); one
/// whose request has begun never does.
#[tokio::test]
async fn at_a_cap_a_connection_still_in_its_header_makes_room() {
    let counts = Arc::new(Mutex::new(Counts::default()));
    let [a, b]: [IpAddr; 2] = ["10.0.0.1", "10.0.0.2"].map(|s| s.parse().unwrap());
    let limits = limits(2, 8);
    let waiting = admit(&counts, &limits, a).unwrap();
    let answering = admit(&counts, &limits, a).unwrap();
    assert!(answering.place.begin());
    let _probe = admit(&counts, &limits, b).unwrap();
    assert!(!waiting.place.begin(), "closed: its request must not start");
    tokio::time::timeout(Duration::from_secs(5), waiting.place.dropped())
        .await
        .expect("its task is told to drop it");
    assert_eq!(lock(&counts).total, 2);
    // The next one closes the probe waiting for its header, never the
    // connection answering.
    let _next = admit(&counts, &limits, b).unwrap();
    assert!(
        answering.place.begin(),
        "a request under way is never closed"
    );
    assert_eq!(lock(&counts).total, 2);
}
