//! Outbound HTTP policy: which origins a backend's guest may call.
//!
//! A grant is an origin, `scheme://host[:port]` (port defaults to 80/443).
//! A request is allowed only when its parsed URI's scheme, host and port
//! equal one granted origin's. The `Host` header is never consulted: a guest
//! can forge it, the URI is what the host actually connects to.
//!
//! Link-local and cloud metadata addresses (169.254.0.0/16, fe80::/10,
//! fd00:ec2::254) are refused even if a pattern would cover them, unless a
//! grant names that exact address.
//!
//! A grant is by name, but the connection goes to an address: the host
//! resolves the name itself, checks every address it resolves to
//! ([`OutboundPolicy::check_address`]) and connects only to a checked one,
//! so a granted name whose DNS answers 169.254.169.254, 127.0.0.1 or a
//! private address reaches nothing there unless the operator granted that
//! address or range (`allow_http_addresses`, or an origin that is the
//! address itself).

use ipnet::IpNet;
use std::net::IpAddr;

/// One granted origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    /// `http` or `https`.
    pub scheme: String,
    /// Host name (lower-case) or IP literal (IPv6 without brackets).
    pub host: String,
    /// Port, defaulted from the scheme.
    pub port: u16,
}

impl Origin {
    /// Whether `uri` is on this origin (scheme, host and port equal).
    pub fn matches(&self, uri: &http::Uri) -> bool {
        parts(uri).is_some_and(|(scheme, host, port)| {
            scheme == self.scheme && host == self.host && port == self.port
        })
    }

    /// Parse `scheme://host[:port]`, with nothing after the authority but
    /// an optional `/`.
    pub fn parse(text: &str) -> Result<Origin, String> {
        let uri: http::Uri = text
            .parse()
            .map_err(|e| format!("{text:?} is not a URL: {e}"))?;
        let (scheme, host, port) = parts(&uri).ok_or_else(|| {
            format!("{text:?} must be scheme://host[:port], e.g. \"http://127.0.0.1:2379\"")
        })?;
        if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
            return Err(format!(
                "{text:?}: give only scheme://host[:port], without a path"
            ));
        }
        Ok(Origin { scheme, host, port })
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}://[{}]:{}", self.scheme, self.host, self.port)
        } else {
            write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
        }
    }
}

/// Scheme, host and port of an absolute http(s) URI; `None` for anything
/// else (relative URIs, empty authority, other schemes).
fn parts(uri: &http::Uri) -> Option<(String, String, u16)> {
    let scheme = uri.scheme_str()?.to_ascii_lowercase();
    let default_port = match scheme.as_str() {
        "http" => 80,
        "https" => 443,
        _ => return None,
    };
    let authority = uri.authority()?;
    if authority.as_str().contains('@') {
        return None; // credentials in the URI: refuse rather than guess
    }
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_ascii_lowercase();
    if host.is_empty() {
        return None;
    }
    Some((scheme, host, authority.port_u16().unwrap_or(default_port)))
}

/// Addresses a guest may never reach by accident: instance metadata services
/// hand out cloud credentials.
fn is_metadata_or_link_local(host: &str) -> bool {
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(ip)) => ip.is_link_local(),
        Ok(IpAddr::V6(ip)) => {
            (ip.segments()[0] & 0xffc0) == 0xfe80
                || ip
                    == "fd00:ec2::254"
                        .parse::<std::net::Ipv6Addr>()
                        .expect("valid")
        }
        Err(_) => false,
    }
}

/// Addresses no request goes to unless granted by address: loopback,
/// private, shared (CGNAT), link-local and metadata, unspecified, multicast
/// and broadcast, and their IPv6 kin (unique local, NAT64 of those).
pub fn is_internal(ip: IpAddr) -> bool {
    match ip.to_canonical() {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            v4.is_loopback()
                || v4.is_private()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast()
                || a == 0
                // Shared address space (carrier-grade NAT), 100.64.0.0/10.
                || (a == 100 && (64..128).contains(&b))
                // IETF protocol assignments, 192.0.0.0/24.
                || (a, b, c) == (192, 0, 0)
                // Benchmarking networks, 198.18.0.0/15: lab and test nets.
                || (a == 198 && (b & 0xfe) == 18)
                // Reserved for future use, 240.0.0.0/4.
                || a >= 240
        }
        IpAddr::V6(v6) => {
            let segments = v6.segments();
            let first = segments[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xfe00) == 0xfc00
                || (first & 0xffc0) == 0xfe80
                // NAT64, well-known (64:ff9b::/96) and local-use
                // (64:ff9b:1::/48) prefixes: both reach IPv4 addresses.
                || segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0]
                || segments[..3] == [0x64, 0xff9b, 1]
        }
    }
}

/// The group a client address is counted in (connections per address,
/// failed sign-ins): an IPv6 client owns its whole /64 (a host is given
/// one and picks addresses in it freely), so the /64 counts as one client;
/// an IPv4 address is itself.
pub fn client_group(address: IpAddr) -> IpAddr {
    match address.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(std::net::Ipv6Addr::from(bits))
        }
        v4 => v4,
    }
}

/// Parse an address or range granted by address (`10.0.0.0/8`,
/// `127.0.0.1`, `fd00::/8`).
pub fn parse_address_grant(text: &str) -> Result<IpNet, String> {
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| {
            format!(
                "{text:?} is not an IP address or range; write e.g. \"10.0.0.0/8\" or \"127.0.0.1\""
            )
        })
}

/// The origins one backend's guest may call, and the internal addresses
/// they may resolve to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OutboundPolicy {
    granted: Vec<Origin>,
    addresses: Vec<IpNet>,
}

impl OutboundPolicy {
    /// A policy allowing exactly `granted`, resolving to public addresses
    /// or to `addresses`.
    pub fn new(granted: Vec<Origin>, addresses: Vec<IpNet>) -> Self {
        OutboundPolicy { granted, addresses }
    }

    /// Allow or refuse connecting to `ip` for a request to `host` (already
    /// allowed by [`Self::check`]): an internal address only when it was
    /// granted by address, as an address range or as the origin's own host.
    pub fn check_address(&self, host: &str, ip: IpAddr) -> Result<(), String> {
        let ip = ip.to_canonical();
        if !is_internal(ip) && !is_metadata_or_link_local(&ip.to_string()) {
            return Ok(());
        }
        let literal = host.parse::<IpAddr>().is_ok_and(|h| h.to_canonical() == ip);
        if literal || self.addresses.iter().any(|net| net.contains(&ip)) {
            return Ok(());
        }
        Err(format!(
            "{host} resolves to {ip}, an internal address nobody granted; add it to allow_http_addresses if the backend should reach it"
        ))
    }

    /// Whether any outbound HTTP is granted.
    pub fn is_empty(&self) -> bool {
        self.granted.is_empty()
    }

    /// Allow or refuse a request to `uri`, with the reason when refused.
    pub fn check(&self, uri: &http::Uri) -> Result<(), String> {
        let (scheme, host, port) = parts(uri)
            .ok_or_else(|| format!("{uri} is not an absolute http(s) URL with a host"))?;
        let granted = self.granted.iter().find(|o| o.matches(uri));
        match granted {
            Some(_) => Ok(()),
            None if is_metadata_or_link_local(&host) => {
                Err(format!("{host} is a link-local/metadata address"))
            }
            None if self.granted.is_empty() => Err("no outbound HTTP is granted".into()),
            None => Err(format!(
                "{scheme}://{host}:{port} is not granted (granted: {})",
                self.granted
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reserved_and_translated_ranges_are_internal() {
        for internal in [
            "198.18.0.1",
            "198.19.255.254",
            "240.0.0.1",
            "255.255.255.254",
            "192.0.0.8",
            "64:ff9b:1::a00:1",
            "64:ff9b::a9fe:a9fe",
            "100.64.0.1",
        ] {
            assert!(is_internal(internal.parse().unwrap()), "{internal}");
        }
        for public in ["198.20.0.1", "192.0.2.1", "8.8.8.8", "2606:4700::1111"] {
            assert!(!is_internal(public.parse().unwrap()), "{public}");
        }
    }

    fn policy(origins: &[&str]) -> OutboundPolicy {
        OutboundPolicy::new(
            origins.iter().map(|o| Origin::parse(o).unwrap()).collect(),
            Vec::new(),
        )
    }

    #[test]
    fn names_may_resolve_only_to_public_or_granted_addresses() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let p = policy(&["https://s3.example.com", "http://127.0.0.1:2379"]);
        assert!(p.check_address("s3.example.com", ip("52.216.1.2")).is_ok());
        for internal in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "64:ff9b::7f00:1",
        ] {
            let err = p.check_address("s3.example.com", ip(internal)).unwrap_err();
            assert!(err.contains("allow_http_addresses"), "{internal}: {err}");
        }
        // An origin granted as an address reaches that address.
        assert!(p.check_address("127.0.0.1", ip("127.0.0.1")).is_ok());
        // A range granted by address covers names resolving into it.
        let ranged = OutboundPolicy::new(
            vec![Origin::parse("http://etcd.internal:2379").unwrap()],
            vec![parse_address_grant("10.0.0.0/8").unwrap()],
        );
        assert!(
            ranged
                .check_address("etcd.internal", ip("10.9.8.7"))
                .is_ok()
        );
        assert!(
            ranged
                .check_address("etcd.internal", ip("192.168.0.1"))
                .is_err()
        );
        assert!(parse_address_grant("not-an-ip").is_err());
    }

    fn check(p: &OutboundPolicy, uri: &str) -> Result<(), String> {
        p.check(&uri.parse().unwrap())
    }

    #[test]
    fn grants_exactly_scheme_host_and_port() {
        let p = policy(&["http://127.0.0.1:2379", "https://s3.example.com"]);
        assert!(check(&p, "http://127.0.0.1:2379/v3/kv/range").is_ok());
        assert!(check(&p, "https://S3.Example.com/bucket?x=1").is_ok());
        assert!(check(&p, "https://s3.example.com:443/").is_ok());
        assert!(check(&p, "http://127.0.0.1:2380/").is_err(), "other port");
        assert!(
            check(&p, "https://127.0.0.1:2379/").is_err(),
            "other scheme"
        );
        assert!(check(&p, "http://s3.example.com/").is_err(), "https only");
        assert!(
            check(&p, "https://evil.s3.example.com/").is_err(),
            "no wildcards"
        );
        assert!(check(&p, "https://s3.example.com.evil.io/").is_err());
    }

    #[test]
    fn refuses_relative_empty_and_credentialed_uris() {
        let p = policy(&["http://127.0.0.1:2379"]);
        assert!(check(&p, "/v3/kv/range").is_err());
        assert!(check(&p, "http://user@127.0.0.1:2379/").is_err());
        assert!(check(&p, "ftp://127.0.0.1:2379/").is_err());
    }

    #[test]
    fn metadata_addresses_need_an_explicit_grant() {
        let p = policy(&["http://127.0.0.1:80"]);
        let err = check(&p, "http://169.254.169.254/latest/meta-data/").unwrap_err();
        assert!(err.contains("metadata"), "{err}");
        assert!(check(&p, "http://[fd00:ec2::254]/").is_err());
        assert!(check(&p, "http://[fe80::1]:80/").is_err());
        let explicit = policy(&["http://169.254.169.254"]);
        assert!(check(&explicit, "http://169.254.169.254/latest/").is_ok());
    }

    #[test]
    fn nothing_granted_refuses_everything() {
        let err = check(&OutboundPolicy::default(), "http://127.0.0.1/").unwrap_err();
        assert_eq!(err, "no outbound HTTP is granted");
    }

    #[test]
    fn origins_must_not_carry_paths() {
        assert!(Origin::parse("http://127.0.0.1:2379/v3").is_err());
        assert!(Origin::parse("127.0.0.1:2379").is_err());
        assert_eq!(
            Origin::parse("https://[::1]").unwrap().to_string(),
            "https://[::1]:443"
        );
    }
}
