use super::*;

const HEX: &str = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"; // sha256("abc")

fn reg() -> Registry {
    Registry::new("http://reg.example:5000/").expect("a valid upstream")
}

#[test]
fn upstream_must_be_http_with_a_host_and_nothing_after_the_path() {
    assert_eq!(reg().base(), "http://reg.example:5000");
    assert_eq!(reg().host(), "reg.example:5000");
    let prefixed = Registry::new("https://mirror.example/registry/").unwrap();
    assert_eq!(prefixed.base(), "https://mirror.example/registry");
    assert_eq!(prefixed.host(), "mirror.example");
    assert!(matches!(Registry::new("ftp://x"), Err(RegistryError::NotHttp(_))));
    assert!(matches!(Registry::new("reg.example"), Err(RegistryError::NotHttp(_))));
    assert!(matches!(Registry::new("http://"), Err(RegistryError::NoHost(_))));
    assert!(matches!(Registry::new("http:///v2"), Err(RegistryError::NoHost(_))));
    for bad in ["http://u:p@reg", "http://reg/?x=1", "http://reg/#f", "http://reg /x"] {
        assert!(matches!(Registry::new(bad), Err(RegistryError::Shape(_))), "{bad}");
    }
}

#[test]
fn a_blob_path_routes_to_the_engine_with_the_escaped_path_and_no_query() {
    let target = format!("/v2/library/nginx/blobs/sha256:{HEX}?ns=docker.io");
    assert_eq!(
        reg().route(&target),
        Route::Blob {
            url: format!("http://reg.example:5000/v2/library/nginx/blobs/sha256:{HEX}"),
            digest: format!("sha256:{HEX}"),
        }
    );
    // An escaped colon is decoded for the rule and kept escaped upstream.
    let escaped = format!("/v2/a/blobs/sha256%3A{HEX}");
    assert_eq!(
        reg().route(&escaped),
        Route::Blob {
            url: format!("http://reg.example:5000{escaped}"),
            digest: format!("sha256:{HEX}"),
        }
    );
    // With a path prefix on the upstream.
    let prefixed = Registry::new("http://h/mirror").unwrap();
    assert!(
        matches!(prefixed.route(&target), Route::Blob { url, .. } if url.starts_with("http://h/mirror/v2/library/"))
    );
}

#[test]
fn the_last_blobs_segment_is_the_anchor_and_the_digest_rule_is_identity_s() {
    // A repository may itself be called blobs.
    let nested = format!("/v2/blobs/blobs/sha256:{HEX}");
    assert_eq!(blob_digest(&nested), Some(format!("sha256:{HEX}")));
    for path in [
        format!("/v2//blobs/sha256:{HEX}"),         // empty name
        format!("/v2/a/blobs/SHA256:{HEX}"),        // upper-case algorithm
        format!("/v2/a/blobs/sha256:{HEX}/extra"),  // extra segment
        "/v2/a/blobs/uploads/".to_owned(),          // upload session
        "/v2/a/blobs/uploads/0f2a-uuid".to_owned(), // upload session
        "/v2/a/blobs/sha256:abc".to_owned(),        // too short
        format!("/v2/a/manifests/sha256:{HEX}"),    // manifest by digest
        format!("/v2/a/blobs/sha256:{HEX}%zz"),     // malformed escape
    ] {
        assert_eq!(blob_digest(&path), None, "{path}");
        assert!(matches!(reg().route(&path), Route::Proxy { .. }), "{path}");
    }
    // Upper-case hex passes, as it does for object identity.
    let upper = HEX.to_ascii_uppercase();
    assert_eq!(
        blob_digest(&format!("/v2/a/blobs/sha256:{upper}")),
        Some(format!("sha256:{upper}"))
    );
}

#[test]
fn everything_else_under_v2_is_proxied_with_the_exact_target() {
    for target in [
        "/v2",
        "/v2/",
        "/v2/library/nginx/manifests/latest",
        "/v2/library/nginx/tags/list?n=10&last=a",
        "/v2/we%3Fird/manifests/latest", // %3F stays %3F: never a query upstream
        "/v2/_catalog",
    ] {
        assert_eq!(
            reg().route(target),
            Route::Proxy { url: format!("http://reg.example:5000{target}") },
            "{target}"
        );
    }
}

#[test]
fn paths_outside_v2_are_not_found() {
    for target in ["/", "/v1/x", "/v2x", "/v20/", "/dart/http://h/v2/x", "//v2/", "/V2/"] {
        assert_eq!(reg().route(target), Route::NotFound, "{target}");
    }
}

#[test]
fn repository_names_for_token_scopes() {
    assert_eq!(repository(&format!("/v2/library/nginx/blobs/sha256:{HEX}")), Some("library/nginx"));
    assert_eq!(repository("/v2/a/b/manifests/latest"), Some("a/b"));
    assert_eq!(repository("/v2/a/tags/list"), Some("a"));
    assert_eq!(repository("/v2/a/referrers/sha256:x"), Some("a"));
    // blobs is tried before manifests, whatever their order in the path.
    assert_eq!(repository("/v2/x/manifests/y/blobs/z"), Some("x/manifests/y"));
    assert_eq!(repository("/v2/"), None);
    assert_eq!(repository("/v2/_catalog"), None);
    assert_eq!(repository("/other/a/blobs/x"), None);
}

#[test]
fn a_blob_check_verifies_across_parts_and_decides_with_the_last_byte() {
    let digest = format!("sha256:{HEX}");
    let mut check = BlobCheck::new(&digest, 3).unwrap();
    assert_eq!(check.update(b"a"), Verdict::Pending);
    assert_eq!(check.update(b""), Verdict::Pending);
    assert_eq!(check.update(b"bc"), Verdict::Verified);
    // Upper-case hex names the same digest.
    let mut upper = BlobCheck::new(&format!("sha256:{}", HEX.to_ascii_uppercase()), 3).unwrap();
    assert_eq!(upper.update(b"abc"), Verdict::Verified);
}

#[test]
fn a_blob_check_fails_wrong_bytes_extra_bytes_and_malformed_digests() {
    let digest = format!("sha256:{HEX}");
    let mut wrong = BlobCheck::new(&digest, 3).unwrap();
    assert_eq!(wrong.update(b"abd"), Verdict::Mismatch);
    let mut long = BlobCheck::new(&digest, 3).unwrap();
    assert_eq!(long.update(b"ab"), Verdict::Pending);
    assert_eq!(long.update(b"cd"), Verdict::Mismatch);
    // Right algorithm, wrong length of hex: nothing matches it.
    let mut short = BlobCheck::new(&format!("sha256:{}", &HEX[..40]), 3).unwrap();
    assert_eq!(short.update(b"abc"), Verdict::Mismatch);
    // An algorithm this node does not compute is not checked.
    assert!(BlobCheck::new(&format!("blake3:{HEX}"), 3).is_none());
}

#[test]
fn an_empty_blob_is_checked_when_its_zero_bytes_are_in() {
    let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert_eq!(BlobCheck::new(empty, 0).unwrap().update(b""), Verdict::Verified);
    let mut not_empty = BlobCheck::new(&format!("sha256:{HEX}"), 0).unwrap();
    assert_eq!(not_empty.update(b""), Verdict::Mismatch);
}

#[test]
fn sha512_is_checked_too() {
    let abc = "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
               2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f";
    let mut check = BlobCheck::new(&format!("sha512:{abc}"), 3).unwrap();
    assert_eq!(check.update(b"abc"), Verdict::Verified);
}

#[test]
fn sha256_digest_names_a_blob_the_way_a_registry_does() {
    assert_eq!(sha256_digest(b"abc"), format!("sha256:{HEX}"));
    let mut check = BlobCheck::new(&sha256_digest(b"hello"), 5).unwrap();
    assert_eq!(check.update(b"hello"), Verdict::Verified);
}
