//! Review of issue 47's server hardening (Security 2, 3, 5): attacks on
//! the connection eviction, the connection clocks and the audit trail's
//! shares, as a network client. Each failed before its fix (they are kept
//! here, not in `network.rs`/`audit.rs`, which are near the file size
//! limit).

use crate::common::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

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

/// `GET /healthz` on `stream`: the status line.
fn health_on(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    while !answer.ends_with(b"ok\n") {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => answer.extend_from_slice(&buf[..n]),
        }
    }
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.lines().next().unwrap_or("").to_string()
}

/// Store a state of about `mib` MiB in `default/big`.
fn big_state(server: &Server, mib: usize) {
    let padding = "x".repeat(mib << 20);
    let body = format!(
        r#"{{"version":4,"serial":1,"lineage":"test-lineage","outputs":{{}},"resources":[],"padding":"{padding}"}}"#
    );
    let answer = send(
        "POST",
        &server.state_url("default", "big"),
        Some(body.as_bytes()),
    );
    assert_eq!(answer.status, 200, "{}", answer.text());
}

/// Start `GET /states/default/big` on a connection from `local`, read
/// its head and stop reading: the server is left writing the body. The
/// connection and the body's length.
fn start_download(local: std::net::Ipv4Addr, server: SocketAddr) -> (TcpStream, Vec<u8>, usize) {
    let mut stream = connect_from(local, server);
    stream
        .write_all(b"GET /states/default/big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16 << 10];
    let end = loop {
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "closed before the answer's head");
        got.extend_from_slice(&buf[..n]);
        if let Some(at) = got.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
    };
    let head = String::from_utf8_lossy(&got[..end]).to_lowercase();
    assert!(head.starts_with("http/1.1 200"), "{head}");
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .expect("a content-length")
        .trim()
        .parse()
        .unwrap();
    (stream, got[end..].to_vec(), length)
}

/// Read the rest of a download: how many body bytes arrived in all.
fn finish_download(stream: &mut TcpStream, mut received: usize, length: usize) -> usize {
    let mut buf = [0u8; 64 << 10];
    while received < length {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => received += n,
        }
    }
    received
}

/// A connection whose answer is still being written is not idle: a new
/// connection at the cap must not close it to make room (the client would
/// get a truncated state). Here a download stalls (the client is slow, or
/// the state is big) while probes arrive at a cap of two.
#[test]
fn a_download_under_way_is_not_closed_to_make_room() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nmax_connections = 2\nmax_connections_per_address = 64\n\
         [backends.default]\nguest = \"local\"\n",
    );
    big_state(&server, 48);
    let server_addr = addr(&server);
    let (mut victim, started, length) =
        start_download(std::net::Ipv4Addr::new(127, 0, 0, 2), server_addr);
    // Probes at the cap of two, each kept open once answered: each one
    // admitted past the first closes the connection idle the longest.
    // Until five were (the download's answer began before any probe).
    let (mut probes, mut answered) = (Vec::new(), 0);
    wait_until(
        "five connections closed to make room",
        Duration::from_secs(30),
        || {
            let mut probe = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 3), server_addr);
            if health_on(&mut probe) == "HTTP/1.1 200 OK" {
                answered += 1;
            }
            probes.push(probe);
            answered >= 6
        },
    );
    let received = finish_download(&mut victim, started.len(), length);
    assert_eq!(
        received, length,
        "the download was cut to make room for a probe"
    );
}

/// A download the client reads slowly (a pause longer than
/// `keepalive_timeout_secs`, far within the write clock) is not cut as an
/// idle keep-alive connection.
#[test]
fn a_slow_download_is_not_cut_by_the_keepalive_clock() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nkeepalive_timeout_secs = 1\n[backends.default]\nguest = \"local\"\n",
    );
    big_state(&server, 48);
    let (mut victim, started, length) =
        start_download(std::net::Ipv4Addr::new(127, 0, 0, 2), addr(&server));
    // The client pauses (a slow link, a busy machine): the server's write
    // stalls well within body_timeout_secs.
    std::thread::sleep(Duration::from_secs(3));
    let received = finish_download(&mut victim, started.len(), length);
    assert_eq!(
        received, length,
        "the download was cut by the idle keep-alive clock"
    );
}

/// Connections that never finish their request header (each within
/// `header_read_timeout_secs`, reopened as they are cut) fill
/// `max_connections`: none is idle, but the oldest of them, with nothing
/// started, is closed to make room, so a liveness probe is answered.
#[test]
fn connections_in_their_header_still_lock_out_a_health_probe() {
    let dir = tempdir();
    let server = Server::with_config(
        dir.path(),
        "[network]\nmax_connections = 8\nmax_connections_per_address = 64\n\
         header_read_timeout_secs = 60\n[backends.default]\nguest = \"local\"\n",
    );
    let server_addr = addr(&server);
    let _stalled: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut s = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 2), server_addr);
            s.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
            s
        })
        .collect();
    let mut probe = connect_from(std::net::Ipv4Addr::new(127, 0, 0, 3), server_addr);
    assert_eq!(
        health_on(&mut probe),
        "HTTP/1.1 200 OK",
        "a probe locked out by connections that never send a whole header"
    );
}

/// Callers with no grant on backend `b` at all (here: readers of `a`),
/// refused again and again on `b`: their refusals go to the refusals' own
/// sequence, and never rotate out the lock records of `b`'s own writer.
#[test]
fn strangers_refusals_rotate_out_another_backends_lock_records() {
    let dir = tempdir();
    let data = dir.path().join("data");
    let (owner, owner_sha) = generate_token();
    let strangers: Vec<(String, String)> = (0..30).map(|_| generate_token()).collect();
    let mut config = format!(
        "[backends.a]\nguest = \"local\"\n[backends.b]\nguest = \"local\"\n\
         [audit]\nreplica = \"r\"\nmax_mib = 1\nfiles = 2\n\
         [[tokens]]\nname = \"owner\"\nsha256 = \"{owner_sha}\"\ngrants = [\"b:*:write\"]\n"
    );
    for (i, (_, sha)) in strangers.iter().enumerate() {
        config.push_str(&format!(
            "[[tokens]]\nname = \"stranger-{i}\"\nsha256 = \"{sha}\"\ngrants = [\"a:*:read\"]\n"
        ));
    }
    let server = Server::with_config(&data, &config);
    let url = server.state_url("b", "w");
    let lock = lock_info("owner-lock", "owner@laptop");
    let bearer = format!("Bearer {owner}");
    for method in ["LOCK", "UNLOCK"] {
        let answer = send_with(method, &url, Some(&lock), &[("Authorization", &bearer)]);
        assert_eq!(answer.status, 200, "{method}: {}", answer.text());
    }
    let files =
        ["requests.jsonl", "requests.1.jsonl"].map(|f| data.join("audit/r/backends/b").join(f));
    let owners_records = || -> usize {
        files
            .iter()
            .filter_map(|f| std::fs::read_to_string(f).ok())
            .flat_map(|t| t.lines().map(str::to_string).collect::<Vec<_>>())
            .filter(|l| l.contains(r#""caller":"owner""#))
            .count()
    };
    assert_eq!(owners_records(), 2);
    let client = reqwest::blocking::Client::new();
    let until = std::time::Instant::now() + Duration::from_secs(60);
    'flood: while std::time::Instant::now() < until {
        for (token, _) in &strangers {
            let answer = client
                .request(reqwest::Method::from_bytes(b"LOCK").unwrap(), &url)
                .header("Authorization", format!("Bearer {token}"))
                .header("Content-Type", "application/json")
                .body(lock_info("x", "stranger"))
                .send()
                .unwrap();
            assert_eq!(answer.status(), 403);
            if owners_records() < 2 {
                break 'flood;
            }
        }
    }
    assert_eq!(
        owners_records(),
        2,
        "callers with no grant on b rotated out b's writer's lock records"
    );
    let refusals = std::fs::read_to_string(data.join("audit/r/refusals.jsonl")).unwrap();
    assert!(
        refusals.contains(r#""caller":"stranger-"#),
        "the refusals are still recorded, in their own sequence"
    );
}
