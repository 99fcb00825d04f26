use super::*;
use std::time::Duration;

fn at(secs: u64) -> Instant {
    Instant::ZERO.saturating_add(Duration::from_secs(secs))
}

fn creds() -> Credentials {
    Credentials::from_json(br#"{"reg.example:5000": {"username": "u", "password": "p"}}"#).unwrap()
}

const BLOB: &str =
    "http://reg.example:5000/v2/lib/app/blobs/sha256:0123456789abcdef0123456789abcdef";

#[test]
fn credentials_parse_and_refuse_empty_keys_and_entries() {
    let c = creds();
    assert_eq!(c.for_host("reg.example:5000").unwrap().header(), "Basic dTpw");
    assert_eq!(c.for_host("REG.example:5000").unwrap().header(), "Basic dTpw");
    assert!(c.for_host("reg.example").is_none(), "the port is part of the key");
    assert!(c.for_host("cdn.example").is_none());
    let empty_key = Credentials::from_json(br#"{"": {"username": "u"}}"#);
    assert_eq!(empty_key, Err(CredentialsError::EmptyHost));
    let neither = Credentials::from_json(br#"{"h": {}}"#);
    assert_eq!(neither, Err(CredentialsError::Empty("h".into())));
    assert!(matches!(Credentials::from_json(b"[1]"), Err(CredentialsError::Json(_))));
    let unknown = Credentials::from_json(br#"{"h": {"user": "x"}}"#);
    assert!(matches!(unknown, Err(CredentialsError::Json(_))));
    // A password alone (a token as password) is a credential.
    let only = Credentials::from_json(br#"{"h": {"password": "t"}}"#).unwrap();
    assert_eq!(only.for_host("h").unwrap().header(), "Basic OnQ=");
    let shown = format!("{c:?}");
    assert!(!shown.contains("dTpw") && shown.contains("redacted"), "{shown}");
}

#[test]
fn scopes_come_from_the_path() {
    assert_eq!(scope_for("/v2/lib/app/blobs/sha256:x"), "repository:lib/app:pull");
    assert_eq!(scope_for("/v2/lib/app/manifests/latest"), "repository:lib/app:pull");
    assert_eq!(scope_for("/v2/"), "");
    let path = "/v2/lib/app/blobs/sha256:0123456789abcdef0123456789abcdef";
    assert_eq!(host_and_path(BLOB), Some(("reg.example:5000", path)));
    assert_eq!(host_and_path("https://u:p@h/x?q"), Some(("h", "/x")));
    assert_eq!(host_and_path("https://h"), Some(("h", "/")));
    assert_eq!(host_and_path("ftp://h/x"), None);
}

#[test]
fn challenges_split_on_commas_outside_quotes() {
    let c = Challenge::parse(
        r#"Bearer realm="https://auth.example/token",service="reg",scope="repository:a:pull,push""#,
    )
    .unwrap();
    assert!(c.is_bearer());
    assert_eq!(c.params["scope"], "repository:a:pull,push");
    assert_eq!(
        c.token_url("repository:b:pull").unwrap(),
        "https://auth.example/token?service=reg&scope=repository%3Aa%3Apull%2Cpush"
    );
    let no_scope = Challenge::parse(r#"Bearer realm="https://auth.example/token?x=1""#).unwrap();
    assert_eq!(
        no_scope.token_url("repository:b:pull").unwrap(),
        "https://auth.example/token?x=1&scope=repository%3Ab%3Apull"
    );
    assert_eq!(no_scope.token_url("").unwrap(), "https://auth.example/token?x=1");
    let basic = Challenge::parse(r#"Basic realm="Registry Realm""#).unwrap();
    assert!(!basic.is_bearer());
    assert!(Challenge::parse("").is_none());
    let bad_realm = Challenge::parse(r#"Bearer realm="file:///etc/passwd""#).unwrap();
    assert_eq!(bad_realm.token_url(""), None);
}

#[test]
fn token_answers_take_token_or_access_token_and_default_their_lifetime() {
    let five_minutes = Some(("t".into(), Duration::from_secs(300)));
    assert_eq!(parse_token(br#"{"token":"t","expires_in":300}"#), five_minutes);
    assert_eq!(parse_token(br#"{"access_token":"a"}"#), Some(("a".into(), DEFAULT_TOKEN_TTL)));
    let negative = parse_token(br#"{"token":"","access_token":"a","expires_in":-5}"#);
    assert_eq!(negative, Some(("a".into(), DEFAULT_TOKEN_TTL)));
    assert_eq!(parse_token(br#"{"expires_in":5}"#), None);
    assert_eq!(parse_token(b"not json"), None);
}

#[test]
fn the_cache_keeps_a_margin_drops_only_the_refused_value_and_stays_bounded() {
    let mut cache = TokenCache::default();
    cache.put("h|s", "t1".into(), Duration::from_secs(60), at(0));
    assert_eq!(cache.get("h|s", at(29)), Some("t1"));
    assert_eq!(cache.get("h|s", at(30)), None, "not within 30 s of expiry");
    cache.put("h|s", "t2".into(), Duration::from_secs(60), at(0));
    cache.drop_if("h|s", "t1");
    assert_eq!(cache.get("h|s", at(0)), Some("t2"), "a stale refusal keeps the fresher token");
    cache.drop_if("h|s", "t2");
    assert_eq!(cache.get("h|s", at(0)), None);

    // Full with expired entries: swept. Full of fresh ones: reset.
    for i in 0..TOKEN_CACHE_MAX {
        let ttl = Duration::from_secs(if i % 2 == 0 { 10 } else { 600 });
        cache.put(&format!("k{i}"), "t".into(), ttl, at(0));
    }
    cache.put("new", "t".into(), Duration::from_secs(600), at(100));
    assert_eq!(cache.len(), TOKEN_CACHE_MAX / 2 + 1, "the expired half was swept");
    for i in 0..TOKEN_CACHE_MAX {
        cache.put(&format!("f{i}"), "t".into(), Duration::from_secs(600), at(100));
    }
    assert!(cache.len() <= TOKEN_CACHE_MAX);
}

#[test]
fn only_credentialed_hosts_get_anything_and_the_client_s_authorization_wins() {
    assert!(AuthPlan::new(&creds(), "http://cdn.example/blob", false).is_none());
    let mut client = AuthPlan::new(&creds(), BLOB, true).unwrap();
    let mut cache = TokenCache::default();
    assert_eq!(client.first(&cache, at(0)), Credential::None);
    cache.put(client.key(), "cached".into(), Duration::from_secs(600), at(0));
    assert_eq!(client.first(&cache, at(0)), Credential::None, "never a cached token for a client");
    let challenge = r#"Bearer realm="http://auth/token",service="s""#;
    let next = client.on_unauthorized(&Credential::None, Some(challenge), &mut cache);
    assert_eq!(next, OnUnauthorized::Answer, "the client's 401 is the client's");
    assert_eq!(cache.get(client.key(), at(0)), Some("cached"));
}

#[test]
fn a_bearer_challenge_leads_to_one_exchange_and_one_retry() {
    let mut cache = TokenCache::default();
    let mut plan = AuthPlan::new(&creds(), BLOB, false).unwrap();
    assert_eq!(plan.key(), "reg.example:5000|repository:lib/app:pull");
    let first = plan.first(&cache, at(0));
    assert_eq!(first, Credential::Basic("Basic dTpw".into()));
    let challenge = r#"Bearer realm="http://auth.example/token",service="reg""#;
    let next = plan.on_unauthorized(&first, Some(challenge), &mut cache);
    assert_eq!(
        next,
        OnUnauthorized::Exchange {
            url: "http://auth.example/token?service=reg&scope=repository%3Alib%2Fapp%3Apull".into(),
            authorization: "Basic dTpw".into(),
            key: "reg.example:5000|repository:lib/app:pull".into(),
        }
    );
    cache.put(plan.key(), "tok".into(), Duration::from_secs(300), at(0));
    let retry = Credential::Bearer("tok".into());
    let last = plan.on_unauthorized(&retry, Some(challenge), &mut cache);
    assert_eq!(last, OnUnauthorized::Answer, "one retry only");
    assert_eq!(cache.get(plan.key(), at(0)), None, "the refused token was dropped");

    // The next request starts with the cached token.
    cache.put(plan.key(), "tok2".into(), Duration::from_secs(300), at(0));
    let next = AuthPlan::new(&creds(), BLOB, false).unwrap();
    assert_eq!(next.first(&cache, at(0)), Credential::Bearer("tok2".into()));
}

#[test]
fn a_basic_challenge_is_retried_with_basic_once() {
    let mut cache = TokenCache::default();
    let mut plan = AuthPlan::new(&creds(), BLOB, false).unwrap();
    // A cached token refused with a Basic challenge: retry with Basic.
    let sent = Credential::Bearer("old".into());
    let next = plan.on_unauthorized(&sent, Some(r#"Basic realm="r""#), &mut cache);
    assert_eq!(next, OnUnauthorized::Retry(Credential::Basic("Basic dTpw".into())));
    let basic = Credential::Basic("Basic dTpw".into());
    assert_eq!(plan.on_unauthorized(&basic, Some("Basic"), &mut cache), OnUnauthorized::Answer);
    // Basic already sent and refused with a Basic challenge: the 401 is the answer.
    let mut fresh = AuthPlan::new(&creds(), BLOB, false).unwrap();
    let basic = fresh.first(&cache, at(0));
    let next = fresh.on_unauthorized(&basic, Some("Basic realm=x"), &mut cache);
    assert_eq!(next, OnUnauthorized::Answer);
}
