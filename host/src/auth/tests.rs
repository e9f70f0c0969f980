//! Unit tests of grants, roles and sign-in.

use super::*;

fn auth() -> (Authenticator, String) {
    let (token, digest) = generate_token();
    let users = vec![User {
        name: "alice".into(),
        password_hash: hash_password("s3cret"),
        grants: vec![
            Grant::parse("prod:team-a-*:write").unwrap(),
            Grant::parse("*:*:read").unwrap(),
        ],
    }];
    let tokens = vec![Token {
        name: "ci".into(),
        sha256: digest,
        grants: vec![Grant::parse("dev:*:admin").unwrap()],
    }];
    (Authenticator::new(users, tokens), token)
}

fn basic(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

const CLIENT: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

#[tokio::test]
async fn basic_users_and_their_grants() {
    let (auth, _) = auth();
    let alice = auth
        .authenticate(Some(&basic("alice", "s3cret")), CLIENT)
        .await
        .unwrap();
    assert!(alice.may("prod", Some("team-a-net"), Role::Write));
    assert!(!alice.may("prod", Some("team-b"), Role::Write));
    assert!(alice.may("prod", Some("team-b"), Role::Read));
    assert!(!alice.may("prod", Some("team-a-net"), Role::Admin));
    // The second check is served from the verification cache.
    assert_eq!(
        auth.authenticate(Some(&basic("alice", "s3cret")), CLIENT)
            .await
            .unwrap(),
        alice
    );
    assert_eq!(
        auth.authenticate(Some(&basic("alice", "wrong")), CLIENT)
            .await,
        Err(AuthError::Invalid)
    );
    assert_eq!(
        auth.authenticate(Some(&basic("mallory", "s3cret")), CLIENT)
            .await,
        Err(AuthError::Invalid)
    );
    assert_eq!(
        auth.authenticate(None, CLIENT).await,
        Err(AuthError::Missing)
    );
    assert_eq!(
        auth.authenticate(Some("Digest x"), CLIENT).await,
        Err(AuthError::Missing)
    );
}

#[tokio::test]
async fn repeated_failures_are_throttled_but_a_remembered_sign_in_is_not() {
    let (auth, _) = auth();
    auth.authenticate(Some(&basic("alice", "s3cret")), CLIENT)
        .await
        .unwrap();
    let attacker = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
    for _ in 0..=throttle::FREE_FAILURES {
        let _ = auth
            .authenticate(Some(&basic("mallory", "guess")), attacker)
            .await;
    }
    assert!(matches!(
        auth.authenticate(Some(&basic("mallory", "guess")), attacker)
            .await,
        Err(AuthError::Throttled(_))
    ));
    assert!(
        auth.authenticate(Some(&basic("alice", "s3cret")), CLIENT)
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn bearer_tokens() {
    let (auth, token) = auth();
    let ci = auth
        .authenticate(Some(&format!("Bearer {token}")), CLIENT)
        .await
        .unwrap();
    assert!(ci.may("dev", Some("anything"), Role::Admin));
    assert!(!ci.may("prod", None, Role::Read));
    // An admin of some workspaces is not an admin of the backend.
    let scoped = Grant::parse("prod:team-*:admin").unwrap();
    assert!(scoped.allows("prod", Some("team-a"), Role::Admin));
    assert!(scoped.allows("prod", None, Role::Read));
    assert!(!scoped.allows("prod", None, Role::Admin));
    assert!(
        Grant::parse("prod:*:admin")
            .unwrap()
            .allows("prod", None, Role::Admin)
    );
    assert_eq!(
        auth.authenticate(Some("Bearer wst_nope"), CLIENT).await,
        Err(AuthError::Invalid)
    );
}

/// Issue 44: Terraform's http backend sends only HTTP Basic; a
/// `[[tokens]]` token as the password signs in as that token.
#[tokio::test]
async fn a_token_signs_in_as_the_basic_password_with_any_user_name() {
    let (auth, token) = auth();
    let ci = auth
        .authenticate(Some(&basic("terraform", &token)), CLIENT)
        .await
        .unwrap();
    assert_eq!(ci.name, "ci");
    assert!(ci.may("dev", Some("x"), Role::Admin));
    assert_eq!(
        auth.authenticate(Some(&basic("terraform", "wst_nope")), CLIENT)
            .await,
        Err(AuthError::Invalid)
    );
}

/// Issue 44: the cloud block sends only bearer tokens; a user's is
/// `user:password`, checked as HTTP Basic is.
#[tokio::test]
async fn a_user_signs_in_with_a_bearer_of_name_and_password() {
    let (auth, _) = auth();
    let alice = auth
        .authenticate(Some("Bearer alice:s3cret"), CLIENT)
        .await
        .unwrap();
    assert!(alice.may("prod", Some("team-a-net"), Role::Write));
    assert_eq!(
        auth.authenticate(Some("Bearer alice:wrong"), CLIENT).await,
        Err(AuthError::Invalid)
    );
}

#[test]
fn grants_are_validated() {
    assert!(Grant::parse("prod:*").is_err());
    assert!(Grant::parse("prod:*:owner").is_err());
    // Issue 44: `outputs` sits below `read`: it passes no read check.
    let outputs = Grant::parse("prod:net:outputs").unwrap();
    assert!(outputs.allows("prod", Some("net"), Role::Outputs));
    assert!(!outputs.allows("prod", Some("net"), Role::Read));
    assert!(!outputs.allows("prod", Some("other"), Role::Outputs));
    assert!(
        Grant::parse("prod:net:read")
            .unwrap()
            .allows("prod", Some("net"), Role::Outputs)
    );
    assert!(check_hash("plaintext").is_err());
    assert!(check_hash(&hash_password("x")).is_ok());
}
