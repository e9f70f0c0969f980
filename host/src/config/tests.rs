use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("/etc/wasmstate.toml"), Overrides::default())
}

#[test]
fn reads_a_full_file() {
    let config = parse(
        r#"
        listen = "0.0.0.0:7000"
        data_dir = "data"
        max_body_mib = 8
        [backends.prod]
        guest = "local"
        memory_mib = 32
        timeout_ms = 500
        [backends.prod.config]
        fsync = false
        "#,
    )
    .unwrap();
    assert_eq!(config.listen.to_string(), "0.0.0.0:7000");
    assert_eq!(config.data_dir, PathBuf::from("/etc/data"));
    assert_eq!(config.max_body_bytes, 8 << 20);
    let prod = &config.backends[0];
    assert_eq!(prod.guest, GuestSource::Embedded("local"));
    assert_eq!(prod.limits.memory_bytes, 32 << 20);
    assert_eq!(prod.limits.timeout, Duration::from_millis(500));
    assert_eq!(prod.guest_config, vec![("fsync".into(), "false".into())]);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let err = parse("[backends.a]\nguest = \"local\"\nmemroy_mib = 3\n").unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("/etc/wasmstate.toml:3:1: "), "{msg}");
    assert!(msg.contains("memroy_mib"), "{msg}");
}

#[test]
fn invalid_values_name_the_key_and_the_reason() {
    let msg = parse("[backends.a]\nguest = \"local\"\nmemory_mib = 0\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("backends.a.memory_mib = 0: must be between"),
        "{msg}"
    );

    let msg = parse("[backends.a]\nguest = \"nope\"\n")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("backends.a.guest = \"nope\""), "{msg}");

    let msg = parse("[backends.a]\nguest = \"missing.wasm\"\n")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("no such file"), "{msg}");

    let msg = parse("[backends.\"a/b\"]\nguest = \"local\"\n")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("contains '/'"), "{msg}");

    let msg = parse("listen = \"localhost\"\n[backends.a]\nguest = \"local\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("listen = \"localhost\": not an address"),
        "{msg}"
    );

    let msg = parse("[backends.a]\nguest = \"local\"\nallow_http = [\"http://h:1/path\"]\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("backends.a.allow_http: \"http://h:1/path\""),
        "{msg}"
    );

    let msg = parse("[backends.a]\nguest = \"local\"\nconfig = { x = 1979-05-27 }\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("backends.a.config.x: datetime values"),
        "{msg}"
    );
}

#[test]
fn nested_tables_flatten_and_env_values_come_from_the_host() {
    let config = parse(
        r#"
        [backends.a]
        guest = "local"
        [backends.a.config]
        endpoints = { s3 = "http://127.0.0.1:9000" }
        secret_key = { env = "PATH" }
        "#,
    )
    .unwrap();
    let pairs = &config.backends[0].guest_config;
    assert!(pairs.contains(&("endpoints.s3".into(), "http://127.0.0.1:9000".into())));
    let path = std::env::var("PATH").unwrap();
    assert!(pairs.contains(&("secret_key".into(), path)));
    let msg = parse(
        "[backends.a]\nguest = \"local\"\nconfig = { k = { env = \"WASMSTATE_NO_SUCH_VAR\" } }\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("backends.a.config.k: environment variable WASMSTATE_NO_SUCH_VAR is not set"),
        "{msg}"
    );
}

#[test]
fn aws_guests_are_granted_their_configured_endpoints() {
    let config = parse(
        r#"
        [backends.s3]
        guest = "dynamodb"
        [backends.s3.config]
        bucket = "b"
        key = "k"
        dynamodb_table = "t"
        endpoints = { s3 = "http://127.0.0.1:5000/", dynamodb = "http://127.0.0.1:5001" }
        "#,
    )
    .unwrap();
    let grants: Vec<String> = config.backends[0]
        .allow_http
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(grants, ["http://127.0.0.1:5000", "http://127.0.0.1:5001"]);

    let config = parse("[backends.s3]\nguest = \"s3-lockfile\"\nconfig = { bucket = \"b\", key = \"k\", region = \"eu-west-1\" }\n").unwrap();
    let grants: Vec<String> = config.backends[0]
        .allow_http
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(grants, ["https://b.s3.eu-west-1.amazonaws.com:443"]);
}

/// Issue 27, finding 13: an embedded AWS guest without `aws_sign` had
/// every `allow_http` origin signed, the operator's others included. Only
/// the endpoints its own configuration names are; STS and IAM never.
#[test]
fn an_aws_guest_is_signed_for_its_own_endpoints_only() {
    let config = parse(
        r#"
        [backends.s3]
        guest = "s3-lockfile"
        allow_http = ["http://127.0.0.1:5000", "http://10.1.2.3:8080"]
        [backends.s3.config]
        bucket = "b"
        key = "k"
        endpoints = { s3 = "http://127.0.0.1:5000" }
        "#,
    )
    .unwrap();
    let signed: Vec<String> = config.backends[0]
        .aws
        .as_ref()
        .unwrap()
        .origins
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(signed, ["http://127.0.0.1:5000"]);
    let sts = parse(
        "[backends.s3]\nguest = \"s3-lockfile\"\naws_sign = [\"https://sts.amazonaws.com\"]\n\
         config = { bucket = \"b\", key = \"k\" }\n",
    );
    assert!(sts.is_err_and(|e| e.to_string().contains("STS or IAM")));
}

/// Google and Azure credentials leave the guest's configuration for the
/// host; the token goes only over https or to loopback; one cloud per
/// backend.
#[test]
fn cloud_credentials_are_taken_from_the_guest_and_held_by_the_host() {
    let gcs = parse(
        r#"
        [backends.g]
        guest = "gcs"
        config = { bucket = "b", prefix = "/team/app", access_token = "ya29.x", storage_custom_endpoint = "http://127.0.0.1:4443/storage/v1/" }
        "#,
    )
    .unwrap();
    let backend = &gcs.backends[0];
    assert!(
        !backend
            .guest_config
            .iter()
            .any(|(k, _)| k == "access_token")
    );
    let grant = backend
        .gcp
        .as_ref()
        .expect("the gcs guest's token is the host's");
    assert_eq!(grant.prefix, "team/app/");
    assert_eq!(grant.upload_path, "/upload/storage/v1");
    assert_eq!(grant.origins[0].to_string(), "http://127.0.0.1:4443");
    let plain = parse(
        r#"
        [backends.g]
        guest = "gcs"
        config = { bucket = "b", access_token = "t", storage_custom_endpoint = "http://gcs.internal/storage/v1/" }
        "#,
    );
    assert!(plain.is_err_and(|e| e.to_string().contains("only over https or to loopback")));
    let azure = parse(
        r#"
        [backends.a]
        guest = "azure"
        config = { storage_account_name = "acct", container_name = "tfstate", key = "prod.tfstate", access_key = "c2VjcmV0", blob_endpoint = "http://127.0.0.1:10000/acct" }
        "#,
    )
    .unwrap();
    let backend = &azure.backends[0];
    assert!(!backend.guest_config.iter().any(|(k, _)| k == "access_key"));
    let grant = backend.azure.as_ref().unwrap();
    assert_eq!(
        (grant.base_path.as_str(), grant.key.as_str()),
        ("/acct", "prod.tfstate")
    );
    let keyless = parse(
        r#"
        [backends.a]
        guest = "azure"
        config = { storage_account_name = "acct", container_name = "c", key = "k" }
        "#,
    );
    if std::env::var_os("ARM_ACCESS_KEY").is_none() && std::env::var_os("ARM_SAS_TOKEN").is_none() {
        assert!(keyless.is_err_and(|e| e.to_string().contains("access_key or sas_token")));
    }
    let two = parse(
        r#"
        [backends.g]
        guest = "gcs"
        aws_sign = ["http://127.0.0.1:1"]
        gcp_auth = ["http://127.0.0.1:2"]
        config = { bucket = "b", access_token = "t" }
        "#,
    );
    assert!(two.is_err_and(|e| e.to_string().contains("one cloud")));
}

#[test]
fn users_and_tokens_are_checked() {
    let hash = crate::auth::hash_password("pw");
    let ok = format!(
        "[backends.prod]\nguest = \"local\"\n[[users]]\nname = \"a\"\npassword_hash = \"{hash}\"\ngrants = [\"prod:*:write\"]\n"
    );
    assert_eq!(parse(&ok).unwrap().users.len(), 1);
    let typo = ok.replace("prod:*:write", "prd:*:write");
    assert!(
        parse(&typo)
            .unwrap_err()
            .to_string()
            .contains("names backend \"prd\", which is not configured")
    );
    let plain = ok.replace(&hash, "hunter2");
    assert!(
        parse(&plain)
            .unwrap_err()
            .to_string()
            .contains("wasmstate hash-password")
    );
    let token = "[backends.prod]\nguest = \"local\"\n[[tokens]]\nname = \"ci\"\nsha256 = \"abc\"\ngrants = [\"*:*:read\"]\n";
    assert!(
        parse(token)
            .unwrap_err()
            .to_string()
            .contains("64 hex digits")
    );
}

#[test]
fn strangers_guests_get_a_disk_quota_by_default_embedded_ones_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let wasm = dir.path().join("g.wasm");
    std::fs::write(&wasm, b"").unwrap();
    let config = Config::parse(
        &format!(
            "[backends.mine]\nguest = \"local\"\n[backends.theirs]\nguest = {:?}\n[backends.set]\nguest = \"local\"\ndisk_quota_mib = 5\nmemory_budget_mib = 100\nmax_cores = 3\n",
            wasm.display().to_string()
        ),
        &dir.path().join("c.toml"),
        Overrides::default(),
    )
    .unwrap();
    let quota = |name: &str| {
        config
            .backends
            .iter()
            .find(|b| b.name == name)
            .unwrap()
            .disk_quota_bytes
    };
    assert_eq!(quota("mine"), None);
    assert_eq!(quota("theirs"), Some(1024 << 20));
    assert_eq!(quota("set"), Some(5 << 20));
    let set = config.backends.iter().find(|b| b.name == "set").unwrap();
    assert_eq!(
        (set.memory_budget_bytes, set.max_cores),
        (Some(100 << 20), Some(3))
    );
    assert_eq!(config.max_guest_memory_bytes, None);
}

#[test]
fn a_backend_directory_may_not_overlap_the_hosts_or_another_backends() {
    let dir = tempfile::tempdir().unwrap();
    let config = |backends: &str| {
        Config::parse(
            &format!("data_dir = \"data\"\n{backends}"),
            &dir.path().join("c.toml"),
            Overrides::default(),
        )
    };
    for (bad, what) in [
        ("dir = \"data\"", "the data directory"),
        ("dir = \".\"", "the data directory"),
        ("dir = \"data/cache\"", "compiled-guest cache"),
        ("dir = \"data/cache/x\"", "compiled-guest cache"),
        ("dir = \"data/git\"", "git clones"),
        ("dir = \"data/./guests/../history\"", "version history"),
        ("dir = \"data/audit\"", "audit trail"),
    ] {
        let err = config(&format!("[backends.a]\nguest = \"local\"\n{bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(what), "{bad}: {err}");
    }
    let shared = config(
        "[backends.a]\nguest = \"local\"\ndir = \"s\"\n[backends.b]\nguest = \"local\"\ndir = \"s/x\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(shared.contains("backend \"b\"'s directory"), "{shared}");
    // Found between neighbours in path order, whatever lies between in
    // config order: s/z and s/y are both inside c's s; two equal dirs.
    for dirs in [["s/z", "s", "s/y"], ["t", "u", "t"]] {
        let tables: String = ["a", "b", "c"]
            .iter()
            .zip(dirs)
            .map(|(name, dir)| format!("[backends.{name}]\nguest = \"local\"\ndir = \"{dir}\"\n"))
            .collect();
        let err = config(&tables).unwrap_err().to_string();
        assert!(err.contains("'s directory"), "{dirs:?}: {err}");
    }
    // The default layout (data/backends/NAME) and dirs elsewhere are fine.
    assert!(config("[backends.a]\nguest = \"local\"\n[backends.b]\nguest = \"local\"\ndir = \"elsewhere\"\n").is_ok());
}

#[test]
fn lock_ttl_and_the_audit_table_are_checked() {
    let config = parse(
        "[backends.a]\nguest = \"git\"\nlock_ttl = \"12h\"\n[backends.a.config]\nrepository = \"/r.git\"\n\
         [backends.b]\nguest = \"local\"\n\
         [audit]\nmax_mib = 8\nfiles = 2\nstdout = true\nreplica = \"pod-1\"\n",
    )
    .unwrap();
    assert_eq!(
        config.backends[0].lock_ttl,
        Some(Duration::from_secs(12 * 3600))
    );
    assert_eq!(config.backends[1].lock_ttl, None, "off by default");
    assert_eq!(
        config.audit,
        crate::audit::AuditSettings {
            max_bytes: 8 << 20,
            files: 2,
            stdout: true,
            replica: "pod-1".into(),
        }
    );
    for (bad, says) in [
        (
            "[backends.a]\nguest = \"git\"\nlock_ttl = \"10s\"\n[backends.a.config]\nrepository = \"/r.git\"\n",
            "under a minute",
        ),
        (
            "[backends.a]\nguest = \"local\"\nlock_ttl = \"1h\"\n",
            "cannot take a lock over safely",
        ),
        (
            "[backends.a]\nguest = \"local\"\nlock_ttl = \"soon\"\n",
            "backends.a.lock_ttl",
        ),
        (
            "[backends.a]\nguest = \"local\"\n[audit]\nfiles = 1\n",
            "audit.files = 1",
        ),
        (
            "[backends.a]\nguest = \"local\"\n[audit]\nmax_mib = 0\n",
            "audit.max_mib = 0",
        ),
        (
            "[backends.a]\nguest = \"local\"\n[audit]\nreplica = \"a/b\"\n",
            "audit.replica",
        ),
        (
            "[backends.a]\nguest = \"local\"\n[audit]\nkeep = 1\n",
            "keep",
        ),
    ] {
        let msg = parse(bad).unwrap_err().to_string();
        assert!(msg.contains(says), "{bad}: {msg}");
    }
}

#[test]
fn a_file_without_backends_says_what_to_add() {
    let msg = parse("listen = \"127.0.0.1:1\"\n").unwrap_err().to_string();
    assert!(msg.contains("[backends.default]"), "{msg}");
}

#[test]
fn command_line_wins_over_the_file() {
    let overrides = Overrides {
        listen: Some("127.0.0.1:9".parse().unwrap()),
        data_dir: Some(PathBuf::from("/tmp/x")),
        cache_dir: None,
    };
    let config = Config::parse(
        "listen = \"0.0.0.0:1\"\n[backends.a]\nguest = \"local\"\n",
        Path::new("c.toml"),
        overrides,
    )
    .unwrap();
    assert_eq!(config.listen.to_string(), "127.0.0.1:9");
    assert_eq!(config.data_dir, PathBuf::from("/tmp/x"));
}

#[test]
fn local_guest_gets_its_own_folder_by_default() {
    let config = Config::default_with(Overrides::default());
    let dir = config.granted_dir(&config.backends[0]).unwrap();
    assert_eq!(dir, PathBuf::from("./wasmstate-data/backends/default"));
}

#[test]
fn an_aws_guests_credential_settings_stay_with_the_host() {
    let config = parse(
        r#"
        [backends.a]
        guest = "s3-lockfile"
        [backends.a.config]
        bucket = "b"
        key = "k"
        region = "eu-west-1"
        shared_config_files = ["aws/config"]
        access_key = { env = "PATH" }
        secret_key = "s"
        assume_role = { role_arn = "arn:aws:iam::1:role/r", duration = "15m", tags = { team = "x" } }
        [backends.other]
        guest = "local"
        [backends.other.config]
        token = "a setting of this guest's own"
        list = ["a", "b"]
        "#,
    )
    .unwrap();
    let a = &config.backends[0];
    let keys: Vec<&str> = a.guest_config.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(keys, ["bucket", "key", "region"]);
    let aws = a.aws.as_ref().expect("AWS guests are signed for");
    assert_eq!(aws.origins, a.allow_http);
    assert_eq!(
        aws.origins[0].to_string(),
        "https://b.s3.eu-west-1.amazonaws.com:443"
    );
    assert_eq!(
        aws.settings.shared_config_files,
        vec![PathBuf::from("/etc/aws/config")]
    );
    let role = aws.settings.assume_role.as_ref().unwrap();
    assert_eq!(role.duration, Some(Duration::from_secs(900)));
    // Other guests keep their own keys, whatever they are called; lists
    // become numbered keys.
    let other = &config.backends[1];
    assert!(other.aws.is_none());
    assert!(
        other
            .guest_config
            .contains(&("token".into(), "a setting of this guest's own".into()))
    );
    assert!(other.guest_config.contains(&("list.1".into(), "b".into())));
}

#[test]
fn a_body_budget_below_two_largest_bodies_is_refused() {
    let msg = parse(
        "max_body_mib = 64\n[network]\nmax_buffered_mib = 191\n[backends.a]\nguest = \"local\"\n",
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.contains("network.max_buffered_mib") && msg.contains("192 MiB"),
        "{msg}"
    );
    let config = parse(
        "max_body_mib = 64\n[network]\nmax_buffered_mib = 192\n[backends.a]\nguest = \"local\"\n",
    )
    .unwrap();
    assert_eq!(config.network.max_buffered_bytes, Some(192 << 20));
    assert!(crate::config::default_max_buffered(512 << 20) >= (1088 << 20));
}

#[test]
fn oidc_issuers_and_their_roles_are_validated() {
    let with = |oidc: &str| parse(&format!("[backends.prod]\nguest = \"local\"\n{oidc}"));
    let good = with(
        "[[oidc]]\nname = \"github\"\nissuer = \"https://token.actions.githubusercontent.com\"\n\
         audiences = [\"wasmstate\"]\n[[oidc.roles]]\nbound_claims = { repository = \"acme/*\" }\n\
         grants = [\"prod:*:read\"]\n",
    )
    .unwrap();
    assert_eq!(
        good.oidc[0].roles[0].bound_claims,
        [("repository".into(), "acme/*".into())]
    );
    for (oidc, says) in [
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"https://x.example\"\naudiences = [\"w\"]\n\
             [[oidc.roles]]\nbound_claims = {}\ngrants = [\"prod:*:read\"]\n",
            "bound_claims is empty",
        ),
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"https://x.example\"\naudiences = [\"w\"]\n\
             [[oidc.roles]]\nbound_claims = { repository = \"**\" }\ngrants = [\"prod:*:read\"]\n",
            "matches any value",
        ),
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"http://x.example\"\naudiences = [\"w\"]\n",
            "must be an https:// URL",
        ),
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"https://x.example\"\naudiences = []\n",
            "audiences must name",
        ),
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"https://x.example\"\naudiences = [\"w\"]\n\
             [[oidc]]\nname = \"g\"\nissuer = \"https://y.example\"\naudiences = [\"w\"]\n",
            "a name of its own",
        ),
        (
            "[[oidc]]\nname = \"g\"\nissuer = \"https://x.example\"\naudiences = [\"w\"]\n\
             [[oidc.roles]]\nbound_claims = { a = \"b\" }\ngrants = [\"nope:*:read\"]\n",
            "not configured",
        ),
    ] {
        let err = with(oidc).unwrap_err().to_string();
        assert!(err.contains(says), "{err}");
    }
}
