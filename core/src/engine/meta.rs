//! What the origin says about an object besides its size: its validators (`ETag`,
//! `Last-Modified`) and the entity header fields every response of the object carries
//! (`Content-Type`, `Cache-Control`, `Content-Disposition`), learnt at the size probe; and how
//! long they are trusted before a revalidating probe.

use std::sync::Arc;
use std::time::Duration;

/// Longest header value kept (longer ones are dropped: they are not validators we can trust).
pub const META_VALUE_MAX: usize = 1024;
/// Longest freshness an origin's `Cache-Control` may grant (a day; longer is capped).
pub const FRESHNESS_MAX: Duration = Duration::from_secs(86_400);

/// An object's validators and entity header fields, as the origin sent them.
///
/// The values are shared (`Arc<str>`): every answer of an object carries its fields, so a copy of
/// them is a count raised, not an allocation per field per answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ObjectMeta {
    /// `ETag`.
    pub etag: Option<Arc<str>>,
    /// `Last-Modified`.
    pub last_modified: Option<Arc<str>>,
    /// `Content-Type`.
    pub content_type: Option<Arc<str>>,
    /// `Cache-Control`.
    pub cache_control: Option<Arc<str>>,
    /// `Content-Disposition`.
    pub content_disposition: Option<Arc<str>>,
}

/// The header fields [`ObjectMeta`] keeps, by name (lower case).
pub const META_FIELDS: [&str; 5] =
    ["etag", "last-modified", "content-type", "cache-control", "content-disposition"];

fn field(value: Option<&[u8]>) -> Option<Arc<str>> {
    let value = value?;
    let ok = value.len() <= META_VALUE_MAX
        && value.iter().all(|&b| b == b'\t' || (0x20..0x7f).contains(&b));
    ok.then(|| Arc::from(String::from_utf8_lossy(value).trim()))
        .filter(|v: &Arc<str>| !v.is_empty())
}

impl ObjectMeta {
    /// The fields of a response's header, looked up by lower-case name. Values that are not
    /// visible ASCII, or longer than [`META_VALUE_MAX`], are dropped.
    pub fn from_fields<'a>(get: impl Fn(&str) -> Option<&'a [u8]>) -> Self {
        ObjectMeta {
            etag: field(get("etag")),
            last_modified: field(get("last-modified")),
            content_type: field(get("content-type")),
            cache_control: field(get("cache-control")),
            content_disposition: field(get("content-disposition")),
        }
    }

    /// The fields, by name, for a response head.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &str)> {
        let values = [
            &self.etag,
            &self.last_modified,
            &self.content_type,
            &self.cache_control,
            &self.content_disposition,
        ];
        META_FIELDS.into_iter().zip(values).filter_map(|(n, v)| Some((n, v.as_deref()?)))
    }

    /// Only the validators (`ETag`, `Last-Modified`), the fields that name a version.
    pub fn validators(&self) -> ObjectMeta {
        ObjectMeta {
            etag: self.etag.clone(),
            last_modified: self.last_modified.clone(),
            ..ObjectMeta::default()
        }
    }

    /// Whether `other` describes the same version of the object, judged by the strongest
    /// validator both carry: the `ETag`, else `Last-Modified`. `None` when they share none (the
    /// version cannot be told).
    pub fn same_version(&self, other: &ObjectMeta) -> Option<bool> {
        match (&self.etag, &other.etag, &self.last_modified, &other.last_modified) {
            (Some(a), Some(b), _, _) => Some(a == b),
            (None, None, Some(a), Some(b)) => Some(a == b),
            _ => None,
        }
    }

    /// How long these validators are trusted before a revalidating probe: the origin's
    /// `Cache-Control` (`s-maxage`, else `max-age`, capped at [`FRESHNESS_MAX`]; `no-cache`,
    /// `no-store` or `must-revalidate` without an age mean every read revalidates), else
    /// `default`.
    pub fn freshness(&self, default: Duration) -> Duration {
        let Some(cc) = &self.cache_control else { return default };
        let mut max_age = None;
        let mut s_maxage = None;
        let mut revalidate = false;
        for directive in cc.split(',') {
            let directive = directive.trim().to_ascii_lowercase();
            let (name, value) = match directive.split_once('=') {
                Some((n, v)) => (n.trim().to_owned(), Some(v.trim().trim_matches('"').to_owned())),
                None => (directive.clone(), None),
            };
            let secs = value.as_deref().and_then(|v| v.parse::<u64>().ok());
            match name.as_str() {
                "s-maxage" => s_maxage = secs.or(s_maxage),
                "max-age" => max_age = secs.or(max_age),
                "no-cache" | "no-store" | "must-revalidate" | "proxy-revalidate" => {
                    revalidate = true
                }
                _ => {}
            }
        }
        match s_maxage.or(max_age) {
            Some(secs) => Duration::from_secs(secs).min(FRESHNESS_MAX),
            None if revalidate => Duration::ZERO,
            None => default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pairs: &[(&'static str, &'static str)]) -> ObjectMeta {
        ObjectMeta::from_fields(|n| pairs.iter().find(|(k, _)| *k == n).map(|(_, v)| v.as_bytes()))
    }

    #[test]
    fn the_probe_keeps_validators_and_entity_fields_and_drops_unsafe_values() {
        let m = meta(&[
            ("etag", "\"v1\""),
            ("last-modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
            ("content-type", "text/plain"),
            ("content-disposition", "bad\u{1}value"),
        ]);
        assert_eq!(m.etag.as_deref(), Some("\"v1\""));
        assert_eq!(m.content_type.as_deref(), Some("text/plain"));
        assert_eq!(m.content_disposition, None);
        let names: Vec<&str> = m.fields().map(|(n, _)| n).collect();
        assert_eq!(names, ["etag", "last-modified", "content-type"]);
    }

    #[test]
    fn versions_compare_by_etag_else_last_modified_else_unknown() {
        let a = meta(&[("etag", "\"v1\""), ("last-modified", "x")]);
        let b = meta(&[("etag", "\"v2\""), ("last-modified", "x")]);
        assert_eq!(a.same_version(&b), Some(false));
        assert_eq!(a.same_version(&a), Some(true));
        let lm1 = meta(&[("last-modified", "x")]);
        let lm2 = meta(&[("last-modified", "y")]);
        assert_eq!(lm1.same_version(&lm2), Some(false));
        assert_eq!(lm1.same_version(&a), None, "one has an ETag, the other not");
        assert_eq!(ObjectMeta::default().same_version(&a), None);
    }

    #[test]
    fn freshness_follows_cache_control_with_a_default() {
        let d = Duration::from_secs(60);
        assert_eq!(ObjectMeta::default().freshness(d), d);
        let m = |cc: &'static str| meta(&[("cache-control", cc)]);
        assert_eq!(m("public, max-age=300").freshness(d), Duration::from_secs(300));
        assert_eq!(m("max-age=300, s-maxage=30").freshness(d), Duration::from_secs(30));
        assert_eq!(m("no-cache").freshness(d), Duration::ZERO);
        assert_eq!(m("no-store").freshness(d), Duration::ZERO);
        assert_eq!(m("max-age=99999999").freshness(d), FRESHNESS_MAX);
        assert_eq!(m("public").freshness(d), d);
    }
}
