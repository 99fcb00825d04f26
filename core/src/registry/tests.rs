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

/// Whether `parts` hash to what `digest` names.
fn matches(digest: &str, parts: &[&[u8]]) -> Option<bool> {
    let (algorithm, want) = expected(digest)?;
    let mut hasher = Hasher::new(algorithm);
    for part in parts {
        hasher.update(part);
    }
    Some(hasher.finish() == want)
}

#[test]
fn a_digest_is_matched_across_parts_in_either_hex_case() {
    let digest = format!("sha256:{HEX}");
    assert_eq!(matches(&digest, &[b"a", b"", b"bc"]), Some(true));
    let upper = format!("sha256:{}", HEX.to_ascii_uppercase());
    assert_eq!(matches(&upper, &[b"abc"]), Some(true));
}

#[test]
fn wrong_bytes_extra_bytes_and_malformed_digests_do_not_match() {
    let digest = format!("sha256:{HEX}");
    assert_eq!(matches(&digest, &[b"abd"]), Some(false));
    assert_eq!(matches(&digest, &[b"ab", b"cd"]), Some(false));
    // Right algorithm, wrong length or odd hex: nothing matches it.
    assert_eq!(matches(&format!("sha256:{}", &HEX[..40]), &[b"abc"]), Some(false));
    assert_eq!(matches(&format!("sha256:{}", &HEX[..63]), &[b"abc"]), Some(false));
    // An algorithm this node does not compute is not checked.
    assert_eq!(expected(&format!("blake3:{HEX}")), None);
}

#[test]
fn an_empty_blob_matches_the_digest_of_nothing() {
    let empty = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";
    assert_eq!(matches(empty, &[]), Some(true));
    assert_eq!(matches(&format!("sha256:{HEX}"), &[]), Some(false));
}

#[test]
fn sha512_is_checked_too() {
    let abc = "ddaf35a193617abacc417349ae20413112e6fa4e89a97ea20a9eeee64b55d39a\
               2192992a274fc1a836ba3c23a3feebbd454d4423643ce80e2a9ac94fa54ca49f";
    assert_eq!(matches(&format!("sha512:{abc}"), &[b"ab", b"c"]), Some(true));
}

#[test]
fn sha256_digest_names_a_blob_the_way_a_registry_does() {
    assert_eq!(sha256_digest(b"abc"), format!("sha256:{HEX}"));
    assert_eq!(matches(&sha256_digest(b"hello"), &[b"hel", b"lo"]), Some(true));
}
