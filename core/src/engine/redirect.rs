//! Redirects of origin exchanges. Registries answer blob requests with a redirect to a CDN or a
//! presigned bucket URL (Docker Hub, GHCR, ECR, GCR, S3-backed distribution); an origin GET
//! follows them, as Go's `http.Client` does for the earlier implementation:
//!
//! - `301`, `302`, `303`, `307` and `308` with a `Location` are followed, at most
//!   [`REDIRECTS_MAX`] times for one exchange; the method stays `GET` and every header but the
//!   credential stays (a `Range` is the point of the request).
//! - `Location` is resolved against the URL that answered (absolute, scheme-relative,
//!   absolute-path or relative-path references); anything but `http://` and `https://` is not
//!   followed (the answer is then the redirect itself).
//! - **Credentials stay with their host:** the client's `Authorization` is dropped when the
//!   target's scheme, host or port differ from the URL that carried it, and the operator's
//!   registry credentials are decided afresh for the new host (only listed hosts get them,
//!   [`crate::registry::auth`]).
//! - The target is dialed under the upstream policy like any origin, so a redirect cannot reach
//!   an address the node would refuse to fetch directly.
//!
//! The object's identity, cache keys and coalescing stay those of the URL the client named: a
//! presigned target changes with every request.

use crate::node::Headers;

/// The most redirects one origin exchange follows.
pub const REDIRECTS_MAX: u8 = 10;

/// The URL a `status` answer with `location` redirects a GET of `from` to, after `hops`
/// redirects already followed; `None` when it is not a redirect to follow.
pub fn target(status: u16, location: Option<&str>, from: &str, hops: u8) -> Option<String> {
    if !matches!(status, 301 | 302 | 303 | 307 | 308) || hops >= REDIRECTS_MAX {
        return None;
    }
    let location = location?.trim();
    if location.is_empty() || location.bytes().any(|b| b < 0x20 || b == 0x7f) {
        return None;
    }
    let (scheme, rest) = split_scheme(from)?;
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    let url = if split_scheme(location).is_some() {
        location.to_owned()
    } else if let Some(net) = location.strip_prefix("//") {
        format!("{scheme}://{net}")
    } else if location.starts_with('/') {
        format!("{scheme}://{authority}{location}")
    } else if location[..location.find(['/', '?', '#']).unwrap_or(location.len())].contains(':') {
        return None; // another scheme (mailto:, ftp:, ...)
    } else {
        let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
        let dir = &path[..path.rfind('/').map_or(0, |i| i + 1)];
        let dir = if dir.is_empty() { "/" } else { dir };
        format!("{scheme}://{authority}{dir}{location}")
    };
    let url = url.split('#').next().unwrap_or_default().to_owned();
    split_scheme(&url).filter(|(_, rest)| !rest.is_empty() && !rest.starts_with('/'))?;
    Some(url)
}

/// `http` or `https` and the rest after `://` (case-insensitive scheme, lower-cased).
fn split_scheme(url: &str) -> Option<(&'static str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = match scheme.to_ascii_lowercase().as_str() {
        "http" => "http",
        "https" => "https",
        _ => return None,
    };
    Some((scheme, rest))
}

/// Scheme, host and port of `url` (host lower-cased, the default port made explicit), read as
/// the dialer reads them ([`crate::policy::url_host_port`]).
pub(crate) fn origin_of(url: &str) -> Option<(&'static str, String, u16)> {
    let (scheme, _) = split_scheme(url)?;
    let (host, port) = crate::policy::url_host_port(url)?;
    Some((scheme, host.to_ascii_lowercase(), port))
}

/// The header fields a redirected request from `from` to `to` carries: `headers` without
/// `Authorization` when the two differ in scheme, host or port.
pub fn carried(headers: &Headers, from: &str, to: &str) -> Headers {
    if origin_of(from).is_some() && origin_of(from) == origin_of(to) {
        return headers.clone();
    }
    let mut out = Headers::new();
    for (name, value) in headers.iter() {
        if !name.eq_ignore_ascii_case("authorization") {
            out.push(name, value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROM: &str = "https://reg.example/v2/lib/app/blobs/sha256:abc?ns=x";

    #[test]
    fn locations_resolve_against_the_url_that_answered() {
        let t = |l: &str| target(307, Some(l), FROM, 0);
        assert_eq!(
            t("https://cdn.example/x?sig=1").as_deref(),
            Some("https://cdn.example/x?sig=1")
        );
        assert_eq!(t("HTTP://cdn.example/x").as_deref(), Some("HTTP://cdn.example/x"));
        assert_eq!(t("//cdn.example/x").as_deref(), Some("https://cdn.example/x"));
        assert_eq!(t("/other/y").as_deref(), Some("https://reg.example/other/y"));
        assert_eq!(t("z?q=1").as_deref(), Some("https://reg.example/v2/lib/app/blobs/z?q=1"));
        assert_eq!(t("https://cdn.example/x#frag").as_deref(), Some("https://cdn.example/x"));
        let root = target(302, Some("a"), "http://h", 0);
        assert_eq!(root.as_deref(), Some("http://h/a"));
    }

    #[test]
    fn only_redirect_statuses_to_http_are_followed_and_only_ten_times() {
        for status in [301, 302, 303, 307, 308] {
            assert!(target(status, Some("/x"), FROM, 0).is_some(), "{status}");
        }
        for status in [200, 206, 300, 304, 305, 401, 404] {
            assert!(target(status, Some("/x"), FROM, 0).is_none(), "{status}");
        }
        assert!(target(307, None, FROM, 0).is_none());
        assert!(target(307, Some(""), FROM, 0).is_none());
        assert!(target(307, Some("ftp://h/x"), FROM, 0).is_none());
        assert!(target(307, Some("mailto:a@b"), FROM, 0).is_none());
        assert!(target(307, Some("file:///etc/passwd"), FROM, 0).is_none());
        assert!(target(307, Some("https:///nohost"), FROM, 0).is_none());
        assert!(target(307, Some("/x\r\nInjected: 1"), FROM, 0).is_none());
        assert!(target(307, Some("/x"), FROM, REDIRECTS_MAX - 1).is_some());
        assert!(target(307, Some("/x"), FROM, REDIRECTS_MAX).is_none());
    }

    #[test]
    fn the_credential_stays_with_its_host() {
        let headers = Headers::new().with("range", "bytes=0-9").with("authorization", "Bearer t");
        let same = carried(&headers, FROM, "https://REG.example:443/elsewhere");
        assert_eq!(same.get("authorization"), Some(&b"Bearer t"[..]));
        for other in [
            "https://cdn.example/x",
            "http://reg.example/x",
            "https://reg.example:8443/x",
            "https://reg.example.evil/x",
        ] {
            let moved = carried(&headers, FROM, other);
            assert_eq!(moved.get("authorization"), None, "{other}");
            assert_eq!(moved.get("range"), Some(&b"bytes=0-9"[..]), "{other}");
        }
    }
}
