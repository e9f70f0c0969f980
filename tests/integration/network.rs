//! Hostile clients: nobody on the network may slow the server for others,
//! hold it open forever, or act through a browser. Each test drives a real
//! server over real sockets and asserts numbers: latencies, how soon a
//! stalled connection is closed, how soon the server exits.

use crate::common::*;
use base64::Engine as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// A token client's p95 during a flood may not pass this. A regression
/// guard: with password checks on the async executor it was 217 ms. On a
/// machine the rest of the suite keeps busy, the bound grows with the same
/// client's p95 before the flood ([`latency_bound`]).
const TOKEN_P95_BOUND: Duration = Duration::from_millis(50);

/// The 95th percentile of `samples`.
fn p95(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() * 95 / 100]
}

fn hash(password: &str) -> String {
    use std::process::{Command, Stdio};
    let mut child = Command::new(BIN)
        .arg("hash-password")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(child.stdin.take().unwrap(), "{password}").unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// A server with user `alice` (password `right`) and a token; extra config
/// lines first.
fn guarded_server(dir: &std::path::Path, extra: &str) -> (Server, String) {
    let (token, sha256) = generate_token();
    let server = Server::with_config(
        dir,
        &format!(
            "{extra}\n[backends.default]\nguest = \"local\"\n\
             [[users]]\nname = \"alice\"\npassword_hash = \"{}\"\ngrants = [\"*:*:admin\"]\n\
             [[tokens]]\nname = \"ci\"\nsha256 = \"{sha256}\"\ngrants = [\"*:*:admin\"]\n\
             [[tokens]]\nname = \"reader\"\nsha256 = \"{}\"\ngrants = [\"*:*:read\"]\n",
            hash("right"),
            reader_token().1
        ),
    );
    (server, token)
}

/// A second token, with only the read role.
fn reader_token() -> &'static (String, String) {
    static TOKEN: std::sync::OnceLock<(String, String)> = std::sync::OnceLock::new();
    TOKEN.get_or_init(generate_token)
}

fn addr(server: &Server) -> SocketAddr {
    server.url.trim_start_matches("http://").parse().unwrap()
}

/// A connection from `local` (any 127.0.0.0/8 address) to the server.
fn connect_from(local: std::net::Ipv4Addr, server: SocketAddr) -> TcpStream {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
    socket.bind(&SocketAddr::from((local, 0)).into()).unwrap();
    socket.connect(&server.into()).unwrap();
    socket.into()
}

/// Whether the server closed `stream` (EOF or reset) within `deadline`.
fn closed_within(stream: &mut TcpStream, deadline: Duration) -> bool {
    stream.set_read_timeout(Some(deadline)).unwrap();
    let mut buf = [0u8; 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue, // an answer (e.g. 408) before the close
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return false;
            }
            Err(_) => return true,
        }
    }
}

#[test]
fn a_wrong_password_flood_slows_no_token_client_and_is_throttled() {
    let dir = tempdir();
    let (server, token) = guarded_server(dir.path(), "");
    let url = server.state_url("default", "ws");
    let bearer = format!("Bearer {token}");
    assert_eq!(
        send_with("POST", &url, Some(&state(1)), &[("Authorization", &bearer)]).status,
        200
    );

    // Refusing a known and an unknown name costs the same (the first few
    // failures, before any backoff). Each refusal comes from its own
    // loopback address, so the address backoff never starts; a name may
    // fail FREE_FAILURES (5) times before its own does. Samples alternate
    // and the fastest of each counts, so a busy machine's stalls (the rest
    // of the suite runs beside) hit both sides alike. Without the dummy
    // hash an unknown name is refused ~20x faster; 3x still catches it.
    let refusal = |user: &str, from: u8| {
        let client = reqwest::blocking::Client::builder()
            .local_address(std::net::IpAddr::from([127, 0, 0, from]))
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let started = Instant::now();
        let answer = client
            .get(&url)
            .header("Authorization", basic(user, "wrong"))
            .send()
            .unwrap();
        assert_eq!(answer.status(), 401);
        started.elapsed()
    };
    let (mut known, mut unknown) = (Duration::MAX, Duration::MAX);
    for i in 0..5u8 {
        known = known.min(refusal("alice", 20 + 2 * i));
        unknown = unknown.min(refusal("nobody", 21 + 2 * i));
    }
    eprintln!("refusing a known name: {known:?}, an unknown one: {unknown:?}");
    assert!(
        unknown * 3 >= known && known * 3 >= unknown,
        "refusing a known name took {known:?}, an unknown one {unknown:?}"
    );

    // The token client's latencies, and what this machine gives it before
    // the flood.
    let client = reqwest::blocking::Client::new();
    let token_latencies = |n: usize| -> Vec<Duration> {
        (0..n)
            .map(|_| {
                let started = Instant::now();
                let answer = client
                    .get(&url)
                    .header("Authorization", &bearer)
                    .send()
                    .unwrap();
                assert_eq!(answer.status(), 200);
                answer.bytes().unwrap();
                started.elapsed()
            })
            .collect()
    };
    token_latencies(50); // warm up
    let quiet = p95(token_latencies(300));

    let flooding = Arc::new(AtomicBool::new(true));
    let throttled = Arc::new(AtomicUsize::new(0));
    let flooders: Vec<_> = (0..16)
        .map(|i| {
            let (url, flooding, throttled) = (url.clone(), flooding.clone(), throttled.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::new();
                let user = if i % 2 == 0 { "alice" } else { "mallory" };
                let started = Instant::now();
                while flooding.load(Ordering::SeqCst) && started.elapsed() < Duration::from_secs(30)
                {
                    let answer = client
                        .get(&url)
                        .header("Authorization", basic(user, &format!("guess-{i}")))
                        .send()
                        .unwrap();
                    match answer.status().as_u16() {
                        401 => {}
                        429 => {
                            assert!(answer.headers().contains_key("retry-after"));
                            throttled.fetch_add(1, Ordering::SeqCst);
                        }
                        other => panic!("flood answer {other}"),
                    }
                }
            })
        })
        .collect();
    let latencies = token_latencies(300);
    // The token client is fast; the flood's first refusals wait for argon2
    // on a loaded machine. Keep flooding until it is throttled.
    wait_until("the flood to be throttled", Duration::from_secs(30), || {
        throttled.load(Ordering::SeqCst) > 0
    });
    flooding.store(false, Ordering::SeqCst);
    for f in flooders {
        f.join().unwrap();
    }
    let p95 = p95(latencies);
    eprintln!("token client p95: {quiet:?} before the flood, {p95:?} during it");
    let bound = latency_bound(TOKEN_P95_BOUND, quiet);
    assert!(
        p95 <= bound,
        "the token client's p95 was {p95:?} during the flood, {quiet:?} before it (bound {bound:?})"
    );
    assert!(
        throttled.load(Ordering::SeqCst) > 0,
        "the flood was never throttled"
    );
    let metrics = send_with(
        "GET",
        &format!("{}/metrics", server.url),
        None,
        &[("Authorization", &bearer)],
    )
    .text();
    assert!(
        metrics.contains("wasmstate_auth_failures_total{throttled=\"true\"}"),
        "{metrics}"
    );
    // The throttled name is refused even with the right password until its
    // backoff ends; a client whose sign-in was remembered is not.
    let alice = send_with(
        "GET",
        &url,
        None,
        &[("Authorization", &basic("alice", "right"))],
    );
    assert_eq!(alice.status, 429, "{}", alice.text());
}

#[test]
fn stalled_headers_are_cut_off_and_connections_are_capped_per_address() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nheader_read_timeout_secs = 2\nmax_connections_per_address = 50\nmax_connections = 400\n\
         [backends.default]\nguest = \"local\"\n",
    );
    let server_addr = addr(&server);
    // 200 connections from four addresses, each sending half a header.
    let mut stalled: Vec<TcpStream> = (0..200)
        .map(|i| {
            let mut stream = connect_from(
                std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / 50) as u8),
                server_addr,
            );
            stream
                .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
                .unwrap();
            stream
        })
        .collect();
    // A 51st from one of those addresses is refused, with a reason.
    let mut extra = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2), server_addr);
    extra
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let mut refused = String::new();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let _ = extra.read_to_string(&mut refused);
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    assert!(refused.contains("max_connections_per_address"), "{refused}");
    // Others are served meanwhile.
    assert_eq!(
        send("GET", &format!("{}/healthz", server.url), None).status,
        200
    );
    // Every stalled connection is closed by the header deadline (2 s).
    let started = Instant::now();
    for stream in &mut stalled {
        assert!(
            closed_within(stream, Duration::from_secs(10)),
            "a stalled connection was still open after {:?}",
            started.elapsed()
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(6),
        "closing took {:?}",
        started.elapsed()
    );
    wait_until(
        "the timeouts to be counted",
        Duration::from_secs(10),
        || server.metric("wasmstate_connections_open") <= 1.0,
    );
    let metrics = send("GET", &format!("{}/metrics", server.url), None).text();
    let timed_out: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("wasmstate_connection_timeouts_total{phase=\"header\"} "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(timed_out >= 200.0, "{metrics}");
}

#[test]
fn idle_keepalive_connections_and_slow_bodies_get_their_own_deadlines() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nkeepalive_timeout_secs = 2\nbody_timeout_secs = 2\n[backends.default]\nguest = \"local\"\n",
    );
    let server_addr = addr(&server);
    // A request, then silence: closed after the idle deadline, not before
    // (the header deadline is the default 10 s).
    let mut idle = TcpStream::connect(server_addr).unwrap();
    idle.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    let started = Instant::now();
    assert!(closed_within(&mut idle, Duration::from_secs(10)));
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(1500) && took < Duration::from_secs(6),
        "{took:?}"
    );

    // A body that stops arriving: 408, nothing written.
    let mut slow = TcpStream::connect(server_addr).unwrap();
    slow.write_all(
        b"POST /states/default/slow HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"version\":4",
    )
    .unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = [0u8; 512];
    let n = slow.read(&mut answer).unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout_secs"), "{answer}");
    assert_eq!(
        send("GET", &server.state_url("default", "slow"), None).status,
        404
    );
}

/// One `GET /healthz` on a kept-alive `stream`: its answer's status line.
fn health_on(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    // `ok\n` ends a 200; a 503 ends with the connection.
    while !answer.ends_with(b"ok\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or("").to_string()
}

/// Idle keep-alive connections filling `max_connections` (from many
/// addresses, each at its own cap) do not lock out a new client or a
/// liveness probe: the oldest idle one is closed to make room, and at an
/// address's cap that address's oldest.
#[test]
fn idle_keepalive_connections_make_room_and_health_stays_answerable() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nmax_connections = 16\nmax_connections_per_address = 4\n\
         [backends.default]\nguest = \"local\"\n",
    );
    let server_addr = addr(&server);
    // 4 addresses x 4 connections, each idle after one GET: the server is
    // full, every address at its cap.
    let mut idle: Vec<TcpStream> = (0..16)
        .map(|i| {
            let address = std::net::Ipv4Addr::new(127, 0, 0, 2 + (i / 4) as u8);
            let mut stream = connect_from(address, server_addr);
            assert_eq!(health_on(&mut stream), "HTTP/1.1 200 OK", "connection {i}");
            stream
        })
        .collect();
    // A probe from another address is answered (the server marks each
    // connection idle just after its answer: polled with a deadline).
    wait_until(
        "/healthz answered at capacity",
        Duration::from_secs(10),
        || send("GET", &format!("{}/healthz", server.url), None).status == 200,
    );
    // The oldest idle connection made room; the newest still serves.
    assert!(closed_within(&mut idle[0], Duration::from_secs(5)));
    assert_eq!(health_on(&mut idle[15]), "HTTP/1.1 200 OK");
    // At an address's cap, its own oldest idle connection makes room.
    let mut again = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 3), server_addr);
    assert_eq!(health_on(&mut again), "HTTP/1.1 200 OK");
    assert!(closed_within(&mut idle[4], Duration::from_secs(5)));
    assert_eq!(health_on(&mut idle[7]), "HTTP/1.1 200 OK");
    wait_until(
        "the closings to be counted",
        Duration::from_secs(10),
        || server.metric("wasmstate_connection_timeouts_total{phase=\"room\"}") >= 2.0,
    );
}

#[test]
fn sigterm_exits_within_its_deadline_while_an_upload_under_way_completes() {
    let data = tempdir();
    let server = Server::with_config(
        data.path(),
        "[network]\nshutdown_timeout_secs = 5\nheader_read_timeout_secs = 60\n[backends.default]\nguest = \"local\"\n",
    );
    let server_addr = addr(&server);
    let url = server.state_url("default", "term");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    // Connections that will never send a whole request.
    let _stalled: Vec<TcpStream> = (0..40)
        .map(|_| {
            let mut s = TcpStream::connect(server_addr).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .unwrap();
            s
        })
        .collect();
    // A 4 MiB state, half sent when SIGTERM arrives.
    let padding = "x".repeat(4 << 20);
    let body =
        format!(r#"{{"version":4,"serial":2,"lineage":"test-lineage","padding":"{padding}"}}"#);
    let mut upload = TcpStream::connect(server_addr).unwrap();
    write!(
        upload,
        "POST /states/default/term HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .unwrap();
    let (first, rest) = body.as_bytes().split_at(body.len() / 2);
    upload.write_all(first).unwrap();
    wait_until(
        "the upload to be in flight",
        Duration::from_secs(30),
        || server.metric("wasmstate_requests_in_flight") >= 2.0,
    );
    let started = Instant::now();
    let pid = server.pid().to_string();
    assert!(
        std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    upload.write_all(rest).unwrap();
    upload
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut response = String::new();
    upload.read_to_string(&mut response).unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    let status = server.terminate(Duration::from_secs(15));
    let took = started.elapsed();
    assert!(status.success(), "exit status {status}");
    assert!(
        took < Duration::from_secs(8),
        "the server took {took:?} to exit (deadline 5 s)"
    );

    let again = Server::start(data.path());
    let stored = send("GET", &again.state_url("default", "term"), None);
    assert_eq!(
        stored.body,
        body.as_bytes(),
        "the state must be the whole new write"
    );
}

#[test]
fn browsers_can_neither_change_state_nor_read_through_rebinding() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nserver_names = [\"state.example.com\"]\n[backends.default]\nguest = \"local\"\n",
    );
    let url = server.state_url("default", "web");
    assert_eq!(send("POST", &url, Some(&state(1))).status, 200);
    let evil = br#"{"version":4}"#;
    for (headers, want) in [
        (vec![("Origin", "http://evil.example")], 403),
        (vec![("Sec-Fetch-Site", "cross-site")], 403),
        (vec![("Content-Type", "text/plain")], 415),
        (
            vec![("Content-Type", "application/x-www-form-urlencoded")],
            415,
        ),
        (vec![("Host", "rebind.attacker.test")], 421),
    ] {
        let answer = send_with("POST", &url, Some(evil), &headers);
        assert_eq!(answer.status, want, "{headers:?}: {}", answer.text());
    }
    // Rebinding cannot read either.
    let read = send_with("GET", &url, None, &[("Host", "rebind.attacker.test:6061")]);
    assert_eq!(read.status, 421, "{}", read.text());
    // What a page could send despite all that (no lineage, no serial) is
    // still refused over a state that has them.
    let bare = send("POST", &url, Some(evil));
    assert_eq!(bare.status, 409, "{}", bare.text());
    assert_eq!(send("GET", &url, None).body, state(1), "nothing changed");

    // The server's own names and same-origin pages are fine.
    let named = send_with("GET", &url, None, &[("Host", "state.example.com")]);
    assert_eq!(named.status, 200, "{}", named.text());
    let own = server.url.clone();
    let same = send_with(
        "POST",
        &url,
        Some(&state(2)),
        &[("Origin", own.as_str()), ("Sec-Fetch-Site", "same-origin")],
    );
    assert_eq!(same.status, 200, "{}", same.text());
}

#[test]
fn the_body_is_not_read_before_the_caller_is_known() {
    let dir = tempdir();
    let (server, _token) = guarded_server(dir.path(), "");
    let reader = format!("Bearer {}", reader_token().0);
    let server_addr = addr(&server);
    for (auth, want) in [("", "401"), (reader.as_str(), "403")] {
        let mut stream = TcpStream::connect(server_addr).unwrap();
        let auth_line = if auth.is_empty() {
            String::new()
        } else {
            format!("Authorization: {auth}\r\n")
        };
        write!(
            stream,
            "POST /states/default/big HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth_line}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            60 << 20
        )
        .unwrap();
        // No body is sent: the answer comes anyway, at once.
        let started = Instant::now();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut answer = [0u8; 256];
        let n = stream.read(&mut answer).unwrap();
        let answer = String::from_utf8_lossy(&answer[..n]);
        assert!(answer.starts_with(&format!("HTTP/1.1 {want}")), "{answer}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
