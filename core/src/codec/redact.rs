//! Credential redaction of URLs for errors, logs and banners (spec/fetch.md §8).
//!
//! Both functions are textual and total: they never parse the URL strictly, never fail and never
//! panic, so garbage is redacted too. The authority is the text after the scheme's `://` (or after
//! a leading `//`, or from the start when there is neither) up to the first `/`. That boundary is
//! deliberately conservative: a password holding a raw `?`, `#` or `@` is still removed entirely,
//! and so is every `@`-separated part; the price is that a path-less URL with an `@` in its query
//! loses part of its host in the log. Userinfo is everything in the authority up to its last `@`,
//! and removal repeats until the authority holds no `@`, so no input leaves one behind.

/// Replaces everything from the first `?` on.
pub const QUERY_MARKER: &str = "?<redacted>";

/// `url` without userinfo and with its query (and anything after it) replaced by
/// [`QUERY_MARKER`]: the form every error string and log line carries.
pub fn redact_url(url: &str) -> String {
    // Strip before cutting so a password containing `?` is not half kept; strip again after,
    // because cutting can change where the authority starts in a malformed string.
    let stripped = strip_userinfo(url);
    let Some(query) = stripped.find('?') else {
        return stripped;
    };
    let mut redacted = strip_userinfo(&stripped[..query]);
    redacted.push_str(QUERY_MARKER);
    redacted
}

/// `url` without userinfo, query kept: the form startup banners print.
pub fn strip_userinfo(url: &str) -> String {
    let mut out = url.to_owned();
    // Each pass removes at least one byte, so this ends within `url.len()` passes.
    loop {
        let (start, end) = authority_bounds(&out);
        let Some(at) = out[start..end].rfind('@') else {
            break;
        };
        out.replace_range(start..start + at + 1, "");
    }
    debug_assert!(!authority(&out).contains('@'));
    out
}

/// The byte range of the (conservative) authority of `url`.
fn authority_bounds(url: &str) -> (usize, usize) {
    let start = match url.find("://") {
        // A `/` before `://` means it sits in a path, not after a scheme.
        Some(i) if !url[..i].contains('/') => i + 3,
        _ if url.starts_with("//") => 2,
        _ => 0,
    };
    let end = url[start..].find('/').map_or(url.len(), |i| start + i);
    (start, end)
}

fn authority(url: &str) -> &str {
    let (start, end) = authority_bounds(url);
    &url[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn userinfo_is_dropped() {
        assert_eq!(redact_url("https://user:pass@example.com/blob"), "https://example.com/blob");
        assert_eq!(redact_url("http://user@example.com:8080/x"), "http://example.com:8080/x");
    }

    #[test]
    fn query_is_replaced_by_the_marker() {
        assert_eq!(
            redact_url(
                "https://bucket.s3.amazonaws.com/blob?X-Amz-Signature=abc&X-Amz-Credential=k"
            ),
            "https://bucket.s3.amazonaws.com/blob?<redacted>"
        );
    }

    #[test]
    fn userinfo_and_query_are_both_redacted() {
        assert_eq!(
            redact_url("https://u:p@h.example/a/b?sig=1#frag"),
            "https://h.example/a/b?<redacted>"
        );
    }

    #[test]
    fn everything_from_the_first_question_mark_is_replaced() {
        assert_eq!(redact_url("http://h/p?a=1?b=2"), "http://h/p?<redacted>");
        assert_eq!(redact_url("http://h/p#f?x"), "http://h/p#f?<redacted>");
        assert_eq!(redact_url("http://h/p?"), "http://h/p?<redacted>");
    }

    #[test]
    fn clean_urls_are_unchanged() {
        for url in [
            "https://example.com/v2/lib/nginx/blobs/sha256:abc",
            "http://h:1/",
            "http://h#frag",
            "",
        ] {
            assert_eq!(redact_url(url), url);
            assert_eq!(strip_userinfo(url), url);
        }
    }

    #[test]
    fn password_with_raw_at_sign_is_removed_entirely() {
        assert_eq!(redact_url("https://user:p@ss@example.com/x"), "https://example.com/x");
    }

    #[test]
    fn password_with_raw_question_mark_is_not_half_kept() {
        assert_eq!(
            redact_url("https://user:pa?ss@example.com/x?q=1"),
            "https://example.com/x?<redacted>"
        );
        assert_eq!(redact_url("https://user:pa#ss@example.com/x"), "https://example.com/x");
    }

    #[test]
    fn at_sign_in_the_path_is_not_userinfo() {
        assert_eq!(redact_url("https://h/team@example/blob"), "https://h/team@example/blob");
    }

    #[test]
    fn scheme_relative_and_scheme_less_userinfo_is_dropped() {
        assert_eq!(redact_url("//user:pw@h/x"), "//h/x");
        assert_eq!(redact_url("user:pw@h/x?q"), "h/x?<redacted>");
    }

    #[test]
    fn strip_userinfo_keeps_the_query_for_banners() {
        assert_eq!(
            strip_userinfo("https://u:p@registry-1.docker.io/v2?x=1"),
            "https://registry-1.docker.io/v2?x=1"
        );
        assert_eq!(strip_userinfo("https://registry-1.docker.io"), "https://registry-1.docker.io");
    }

    #[test]
    fn redaction_that_moves_the_authority_still_removes_every_at_sign() {
        // Stripping `x:@` leaves `//h@/`, whose new authority `h@` must be stripped too.
        assert_eq!(strip_userinfo("x:@//h@/p"), "///p");
        assert!(!authority(&redact_url("u@h?x://y/")).contains('@'));
    }

    #[test]
    fn garbage_never_panics() {
        for s in
            ["@", "@@@", "://@", "?", "??@", "://", "/@", "\u{1F600}@\u{e9}?\u{0}", "a://b://c@d"]
        {
            let _ = redact_url(s);
            let _ = strip_userinfo(s);
        }
    }

    fn assert_redacted(input: &str, out: &str) -> Result<(), TestCaseError> {
        prop_assert!(!authority(out).contains('@'), "{input:?} -> {out:?}");
        if let Some(q) = out.find('?') {
            prop_assert_eq!(&out[q..], QUERY_MARKER, "{:?} -> {:?}", input, out);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_strings_leave_no_query_and_no_userinfo(s in any::<String>()) {
            let out = redact_url(&s);
            assert_redacted(&s, &out)?;
            prop_assert!(!authority(&strip_userinfo(&s)).contains('@'));
        }

        #[test]
        fn fuzz_url_shaped_strings_leave_no_query_and_no_userinfo(
            s in "[a-z]{0,5}(://|//|:/)?[a-z:@?#/]{0,30}",
        ) {
            assert_redacted(&s, &redact_url(&s))?;
            prop_assert!(!authority(&strip_userinfo(&s)).contains('@'));
        }

        #[test]
        fn credentials_and_queries_of_real_urls_never_survive(
            scheme in "https?",
            user in "[a-zA-Z0-9._~%!$&'()*+,;=:@?#-]{1,16}",
            host in "[a-z0-9.-]{1,16}(:[0-9]{1,5})?",
            path in "(/[a-zA-Z0-9._~%@:-]{0,8}){1,3}",
            query in "[a-zA-Z0-9=&%@/?:-]{0,24}",
        ) {
            let url = format!("{scheme}://{user}@{host}{path}?{query}");
            prop_assert_eq!(redact_url(&url), format!("{scheme}://{host}{path}?<redacted>"));
            prop_assert_eq!(strip_userinfo(&format!("{scheme}://{user}@{host}{path}")), format!("{scheme}://{host}{path}"));
        }
    }
}
