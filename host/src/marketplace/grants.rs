//! What a guest with a manifest actually gets: the intersection of what it
//! asks for and what the operator granted its backend. A request the
//! operator did not grant stops the backend from starting, with the exact
//! lines to add to the config; a grant the guest did not ask for is dropped.

use super::manifest::Capabilities;
use crate::capabilities::aws::AwsGrant;
use crate::config::BackendConfig;
use crate::policy::Origin;

/// `scheme://host[:port]` where the host and the port may be `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct OriginPattern {
    scheme: String,
    host: Option<String>,
    port: Option<u16>,
}

impl OriginPattern {
    fn parse(text: &str) -> Result<Self, String> {
        let (scheme, rest) = text
            .split_once("://")
            .ok_or_else(|| format!("manifest http {text:?}: write scheme://host[:port]"))?;
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        let (host, port) = match rest.rsplit_once(':') {
            Some((host, port)) if !host.contains(']') || host.ends_with(']') => (host, Some(port)),
            _ => (rest, None),
        };
        // Only a whole host (or port) may be `*`: `*.example.com` is not a
        // pattern for "any host".
        if host != "*" && host.contains('*') || port.is_some_and(|p| p != "*" && p.contains('*')) {
            return Err(format!(
                "manifest http {text:?}: `*` may stand only for the whole host or the whole port"
            ));
        }
        let any_host = host == "*";
        let any_port = port == Some("*");
        let concrete = format!(
            "{scheme}://{}{}",
            if any_host { "wildcard.invalid" } else { host },
            match port {
                Some(p) if !any_port => format!(":{p}"),
                _ => String::new(),
            }
        );
        let origin =
            Origin::parse(&concrete).map_err(|e| format!("manifest http {text:?}: {e}"))?;
        Ok(OriginPattern {
            scheme: origin.scheme,
            host: (!any_host).then_some(origin.host),
            port: (!any_port).then_some(origin.port),
        })
    }

    fn matches(&self, origin: &Origin) -> bool {
        self.scheme == origin.scheme
            && self.port.is_none_or(|p| p == origin.port)
            && self.host.as_ref().is_none_or(|h| *h == origin.host)
    }

    /// An example origin for an error message.
    fn example(&self) -> String {
        let host = self.host.as_deref().unwrap_or("HOST");
        match self.port {
            Some(port) => format!("{}://{host}:{port}", self.scheme),
            None => format!("{}://{host}:PORT", self.scheme),
        }
    }
}

/// Narrow `backend`'s grants to what `wants` asks for. `Err` lists, one per
/// line, what the operator must add to `[backends.NAME]`.
pub fn intersect(
    wants: &Capabilities,
    backend: &BackendConfig,
    has_dir: bool,
) -> Result<BackendConfig, String> {
    let (narrowed, missing) = narrow(wants, backend, has_dir)?;
    if !missing.is_empty() {
        return Err(missing.join("\n"));
    }
    Ok(narrowed)
}

/// `backend`'s grants narrowed to what `wants` asks for, and what `wants`
/// asks for beyond them (the lines the operator would add). `Err` only for
/// a manifest that does not parse.
pub fn narrow(
    wants: &Capabilities,
    backend: &BackendConfig,
    has_dir: bool,
) -> Result<(BackendConfig, Vec<String>), String> {
    let mut missing = Vec::new();
    // A named origin must be granted as such; `*` patterns are
    // alternatives: the operator grants at least one host matching any.
    let patterns: Vec<(String, OriginPattern)> = wants
        .http
        .iter()
        .map(|t| OriginPattern::parse(t).map(|p| (t.clone(), p)))
        .collect::<Result<_, _>>()?;
    for (text, pattern) in patterns
        .iter()
        .filter(|(_, p)| p.host.is_some() && p.port.is_some())
    {
        if !backend.allow_http.iter().any(|o| pattern.matches(o)) {
            missing.push(format!("allow_http = [\"{text}\"]"));
        }
    }
    let wildcards: Vec<&(String, OriginPattern)> = patterns
        .iter()
        .filter(|(_, p)| p.host.is_none() || p.port.is_none())
        .collect();
    if let Some((_, pattern)) = wildcards.first()
        && !backend
            .allow_http
            .iter()
            .any(|o| wildcards.iter().any(|(_, p)| p.matches(o)))
    {
        let all: Vec<&str> = wildcards.iter().map(|(t, _)| t.as_str()).collect();
        missing.push(format!(
            "allow_http = [\"{}\"]   # the hosts it may reach ({})",
            pattern.example(),
            all.join(" or ")
        ));
    }
    let allow_http: Vec<Origin> = backend
        .allow_http
        .iter()
        .filter(|o| patterns.iter().any(|(_, p)| p.matches(o)))
        .cloned()
        .collect();
    // AWS signing: the operator's signed origins that the manifest's
    // patterns cover; requests to them are reachable as well.
    let aws_patterns: Vec<OriginPattern> = wants
        .aws_sign
        .iter()
        .map(|t| OriginPattern::parse(t))
        .collect::<Result<_, _>>()?;
    let aws = match &backend.aws {
        Some(grant) if !aws_patterns.is_empty() => {
            let origins: Vec<Origin> = grant
                .origins
                .iter()
                .filter(|o| aws_patterns.iter().any(|p| p.matches(o)))
                .cloned()
                .collect();
            (!origins.is_empty()).then(|| AwsGrant {
                origins,
                settings: grant.settings.clone(),
                scope: grant.scope.clone(),
            })
        }
        _ => None,
    };
    if let Some(pattern) = aws_patterns.first()
        && aws.is_none()
    {
        missing.push(format!(
            "aws_sign = [\"{}\"]   # AWS endpoints the host signs for it ({})",
            pattern.example(),
            wants.aws_sign.join(" or ")
        ));
    }
    let mut allow_http = allow_http;
    for origin in aws.iter().flat_map(|g| &g.origins) {
        if !allow_http.contains(origin) {
            allow_http.push(origin.clone());
        }
    }
    if wants.directory && !has_dir {
        missing.push("dir = \"/path/for/this/backend\"".to_string());
    }
    if wants.git && backend.allow_git.is_empty() {
        missing.push("allow_git = [\"REPOSITORY URL\"]".to_string());
    }
    let mut secrets = Vec::new();
    for name in &wants.secrets {
        match backend.secrets.iter().find(|(k, _)| k == name) {
            Some(secret) => secrets.push(secret.clone()),
            None => missing.push(format!("secrets.{name} = {{ env = \"VARIABLE\" }}")),
        }
    }
    if let Some(need) = wants.memory_mib
        && need << 20 > backend.limits.memory_bytes
    {
        missing.push(format!(
            "memory_mib = {need}   # it needs {need} MiB per request"
        ));
    }
    if let Some(need) = wants.timeout_ms
        && u128::from(need) > backend.limits.timeout.as_millis()
    {
        missing.push(format!(
            "timeout_ms = {need}   # it needs {need} ms per request"
        ));
    }
    let mut narrowed = backend.clone();
    narrowed.allow_http = allow_http;
    narrowed.allow_git = if wants.git {
        backend.allow_git.clone()
    } else {
        Vec::new()
    };
    narrowed.secrets = secrets;
    narrowed.aws = aws;
    // A manifest cannot ask for Azure or Google credentials yet: a
    // stranger's guest never gets them, whatever the backend lists.
    narrowed.azure = None;
    narrowed.gcp = None;
    narrowed.postgres = None;
    Ok((narrowed, missing))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, Overrides};

    fn backend(allow_http: &[&str]) -> BackendConfig {
        let mut b = Config::default_with(Overrides::default())
            .backends
            .remove(0);
        b.allow_http = allow_http
            .iter()
            .map(|o| Origin::parse(o).unwrap())
            .collect();
        b.secrets = vec![("TOKEN".into(), "s3cret".into())];
        b
    }

    #[test]
    fn the_guest_gets_only_what_it_asked_for_and_was_granted() {
        let wants = Capabilities {
            http: vec!["http://*:2379".into(), "https://*:*".into()],
            ..Capabilities::default()
        };
        let got = intersect(
            &wants,
            &backend(&[
                "http://10.0.0.5:2379",
                "http://evil.example",
                "https://etcd.internal:8443",
            ]),
            true,
        )
        .unwrap();
        let origins: Vec<String> = got.allow_http.iter().map(ToString::to_string).collect();
        assert_eq!(
            origins,
            ["http://10.0.0.5:2379", "https://etcd.internal:8443"]
        );
        assert!(
            got.secrets.is_empty(),
            "secrets not asked for are not handed out"
        );
        assert!(got.allow_git.is_empty());
    }

    #[test]
    fn only_a_whole_host_or_port_is_a_wildcard() {
        let err = OriginPattern::parse("https://*.x.com").unwrap_err();
        assert!(err.contains("whole host"), "{err}");
        assert!(OriginPattern::parse("https://a*b.x.com:443").is_err());
        assert!(OriginPattern::parse("http://h:1*").is_err());
        let any = OriginPattern::parse("https://*:*").unwrap();
        assert!(any.host.is_none() && any.port.is_none());
        let port = OriginPattern::parse("http://*:2379").unwrap();
        assert_eq!((port.host, port.port), (None, Some(2379)));
        let exact = OriginPattern::parse("https://api.example.com").unwrap();
        assert_eq!(exact.port, Some(443));
    }

    #[test]
    fn ungranted_requests_list_what_to_add() {
        let wants = Capabilities {
            http: vec!["https://api.example.com".into(), "http://*:2379".into()],
            aws_sign: vec!["https://*:443".into()],
            directory: true,
            git: true,
            secrets: vec!["TOKEN".into(), "OTHER".into()],
            memory_mib: Some(4096),
            timeout_ms: None,
        };
        let err = intersect(&wants, &backend(&[]), false).unwrap_err();
        for line in [
            "allow_http = [\"https://api.example.com\"]",
            "allow_http = [\"http://HOST:2379\"]",
            "dir = ",
            "allow_git = ",
            "secrets.OTHER = { env = ",
            "memory_mib = 4096",
            "aws_sign = [\"https://",
        ] {
            assert!(err.contains(line), "{line} missing from:\n{err}");
        }
        assert!(!err.contains("secrets.TOKEN"), "{err}");
    }
}
