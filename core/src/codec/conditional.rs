//! Conditional requests (RFC 9110 §13): whether a GET or HEAD is answered normally, with 304 Not
//! Modified or with 412 Precondition Failed, and whether its `Range` still applies, given the
//! object's validators (its `ETag` and `Last-Modified`).
//!
//! The node is a cache standing in for the origin, so it evaluates the preconditions the way an
//! origin server does (§13.2.2), in this order: `If-Match`, else `If-Unmodified-Since`; then
//! `If-None-Match`, else `If-Modified-Since`; then `If-Range`. Malformed field values and dates
//! are ignored (as the RFC asks for dates); an entity-tag list that does not parse matches
//! nothing. One rule is left out: a date later than the server's current time is not ignored,
//! because the core does not read a clock.

/// The object's validators, as the origin sent them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Validators<'a> {
    /// The `ETag` value, e.g. `"abc"` or `W/"abc"`.
    pub etag: Option<&'a str>,
    /// The `Last-Modified` value (an HTTP-date).
    pub last_modified: Option<&'a str>,
}

/// A request's precondition header fields, raw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conditions<'a> {
    /// `If-Match`.
    pub if_match: Option<&'a [u8]>,
    /// `If-None-Match`.
    pub if_none_match: Option<&'a [u8]>,
    /// `If-Modified-Since`.
    pub if_modified_since: Option<&'a [u8]>,
    /// `If-Unmodified-Since`.
    pub if_unmodified_since: Option<&'a [u8]>,
    /// `If-Range`.
    pub if_range: Option<&'a [u8]>,
}

impl Conditions<'_> {
    /// True when no precondition field is present.
    pub fn is_empty(&self) -> bool {
        self.if_match.is_none()
            && self.if_none_match.is_none()
            && self.if_modified_since.is_none()
            && self.if_unmodified_since.is_none()
            && self.if_range.is_none()
    }
}

/// What the preconditions decide.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Answer normally; `range` is false when an `If-Range` did not match (answer the whole
    /// object with 200).
    Proceed {
        /// Whether the request's `Range` still applies.
        range: bool,
    },
    /// 304 Not Modified.
    NotModified,
    /// 412 Precondition Failed.
    Failed,
}

/// An entity-tag: whether it is weak, and its opaque tag (quotes included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EntityTag<'a> {
    /// `W/` prefix.
    pub weak: bool,
    /// The quoted opaque tag, quotes included.
    pub opaque: &'a str,
}

/// Parses one entity-tag (`"x"` or `W/"x"`, RFC 9110 §8.8.3).
pub fn parse_etag(value: &str) -> Option<EntityTag<'_>> {
    let value = value.trim();
    let (weak, opaque) = match value.strip_prefix("W/") {
        Some(rest) => (true, rest),
        None => (false, value),
    };
    let inner = opaque.strip_prefix('"')?.strip_suffix('"')?;
    // etagc = %x21 / %x23-7E / obs-text: no DQUOTE, no controls, no space.
    let ok = inner.bytes().all(|b| b == 0x21 || (0x23..=0x7e).contains(&b) || b >= 0x80);
    ok.then_some(EntityTag { weak, opaque })
}

/// The entity-tags of a field value that is `*` (`None`) or a comma-separated list; `Err` when
/// any member does not parse (the list then matches nothing).
fn etag_list(value: &[u8]) -> Result<Option<Vec<EntityTag<'_>>>, ()> {
    let text = std::str::from_utf8(value).map_err(|_| ())?.trim();
    if text == "*" {
        return Ok(None);
    }
    let mut tags = Vec::new();
    for member in text.split(',') {
        let member = member.trim();
        if member.is_empty() {
            continue; // RFC 9110 §5.6.1: empty list elements are ignored
        }
        tags.push(parse_etag(member).ok_or(())?);
    }
    Ok(Some(tags))
}

/// Strong comparison: both strong and the same opaque tag.
fn strong_eq(a: EntityTag<'_>, b: EntityTag<'_>) -> bool {
    !a.weak && !b.weak && a.opaque == b.opaque
}

/// Weak comparison: the same opaque tag, weakness aside.
fn weak_eq(a: EntityTag<'_>, b: EntityTag<'_>) -> bool {
    a.opaque == b.opaque
}

/// Seconds since the Unix epoch of an HTTP-date (IMF-fixdate, RFC 850 or asctime), if valid.
pub fn http_date(value: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(value).ok()?;
    let t = httpdate::parse_http_date(text.trim()).ok()?;
    t.duration_since(std::time::UNIX_EPOCH).ok().map(|d| d.as_secs())
}

/// `unix_secs` as an IMF-fixdate (RFC 9110 §5.6.7), e.g. `Sun, 06 Nov 1994 08:49:37 GMT`.
pub fn format_http_date(unix_secs: u64) -> String {
    httpdate::fmt_http_date(std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs))
}

/// Evaluates the preconditions of a GET (`get`) or HEAD with or without a `Range` (`range`).
pub fn evaluate(get: bool, range: bool, c: &Conditions<'_>, v: &Validators<'_>) -> Verdict {
    let current = v.etag.and_then(parse_etag);
    let modified = v.last_modified.map(str::as_bytes).and_then(http_date);
    // Step 1: If-Match, else step 2: If-Unmodified-Since.
    if let Some(field) = c.if_match {
        let ok = match etag_list(field) {
            Ok(None) => true, // `*`: a current representation exists
            Ok(Some(tags)) => current.is_some_and(|cur| tags.iter().any(|t| strong_eq(*t, cur))),
            Err(()) => false,
        };
        if !ok {
            return Verdict::Failed;
        }
    } else if let (Some(date), Some(modified)) =
        (c.if_unmodified_since.and_then(http_date), modified)
    {
        if modified > date {
            return Verdict::Failed;
        }
    }
    // Step 3: If-None-Match, else step 4: If-Modified-Since.
    if let Some(field) = c.if_none_match {
        let none_match = match etag_list(field) {
            Ok(None) => false, // `*`: a current representation exists
            Ok(Some(tags)) => current.is_none_or(|cur| !tags.iter().any(|t| weak_eq(*t, cur))),
            Err(()) => true,
        };
        if !none_match {
            return Verdict::NotModified;
        }
    } else if let (Some(date), Some(modified)) = (c.if_modified_since.and_then(http_date), modified)
    {
        if modified <= date {
            return Verdict::NotModified;
        }
    }
    // Step 5: If-Range, for a GET with a Range.
    if get && range {
        if let Some(field) = c.if_range {
            return Verdict::Proceed { range: if_range_matches(field, current, modified) };
        }
    }
    Verdict::Proceed { range: true }
}

/// `If-Range`: an entity-tag must strongly match; a date must equal `Last-Modified` exactly.
fn if_range_matches(field: &[u8], current: Option<EntityTag<'_>>, modified: Option<u64>) -> bool {
    let Ok(text) = std::str::from_utf8(field) else { return false };
    let text = text.trim();
    if text.starts_with('"') || text.starts_with("W/") {
        return match (parse_etag(text), current) {
            (Some(tag), Some(cur)) => strong_eq(tag, cur),
            _ => false,
        };
    }
    matches!((http_date(field), modified), (Some(date), Some(m)) if date == m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const V: Validators<'static> =
        Validators { etag: Some("\"v1\""), last_modified: Some("Sun, 06 Nov 1994 08:49:37 GMT") };
    const EARLIER: &[u8] = b"Sat, 05 Nov 1994 08:49:37 GMT";
    const SAME: &[u8] = b"Sun, 06 Nov 1994 08:49:37 GMT";
    const LATER: &[u8] = b"Mon, 07 Nov 1994 08:49:37 GMT";

    fn eval(c: Conditions<'_>) -> Verdict {
        evaluate(true, true, &c, &V)
    }

    #[test]
    fn if_none_match_with_the_current_etag_is_304_and_weakly_compared() {
        let c = |v| Conditions { if_none_match: Some(v), ..Conditions::default() };
        assert_eq!(eval(c(b"\"v1\"")), Verdict::NotModified);
        assert_eq!(eval(c(b"W/\"v1\"")), Verdict::NotModified);
        assert_eq!(eval(c(b"\"v0\", \"v1\"")), Verdict::NotModified);
        assert_eq!(eval(c(b"*")), Verdict::NotModified);
        assert_eq!(eval(c(b"\"v2\"")), Verdict::Proceed { range: true });
    }

    #[test]
    fn if_match_needs_a_strong_match_or_star() {
        let c = |v| Conditions { if_match: Some(v), ..Conditions::default() };
        assert_eq!(eval(c(b"\"v1\"")), Verdict::Proceed { range: true });
        assert_eq!(eval(c(b"*")), Verdict::Proceed { range: true });
        assert_eq!(eval(c(b"W/\"v1\"")), Verdict::Failed);
        assert_eq!(eval(c(b"\"v2\"")), Verdict::Failed);
        assert_eq!(eval(c(b"not a tag")), Verdict::Failed);
    }

    #[test]
    fn dates_compare_with_last_modified_and_bad_dates_are_ignored() {
        let ims = |v| Conditions { if_modified_since: Some(v), ..Conditions::default() };
        assert_eq!(eval(ims(SAME)), Verdict::NotModified);
        assert_eq!(eval(ims(LATER)), Verdict::NotModified);
        assert_eq!(eval(ims(EARLIER)), Verdict::Proceed { range: true });
        assert_eq!(eval(ims(b"yesterday")), Verdict::Proceed { range: true });
        let ius = |v| Conditions { if_unmodified_since: Some(v), ..Conditions::default() };
        assert_eq!(eval(ius(EARLIER)), Verdict::Failed);
        assert_eq!(eval(ius(SAME)), Verdict::Proceed { range: true });
    }

    #[test]
    fn if_none_match_wins_over_if_modified_since() {
        let c = Conditions {
            if_none_match: Some(b"\"v2\""),
            if_modified_since: Some(LATER),
            ..Conditions::default()
        };
        assert_eq!(eval(c), Verdict::Proceed { range: true });
    }

    #[test]
    fn if_range_keeps_the_range_only_on_a_strong_or_exact_date_match() {
        let c = |v| Conditions { if_range: Some(v), ..Conditions::default() };
        assert_eq!(eval(c(b"\"v1\"")), Verdict::Proceed { range: true });
        assert_eq!(eval(c(b"W/\"v1\"")), Verdict::Proceed { range: false });
        assert_eq!(eval(c(b"\"v0\"")), Verdict::Proceed { range: false });
        assert_eq!(eval(c(SAME)), Verdict::Proceed { range: true });
        assert_eq!(eval(c(LATER)), Verdict::Proceed { range: false });
        assert_eq!(evaluate(true, false, &c(b"\"v0\""), &V), Verdict::Proceed { range: true });
        assert_eq!(evaluate(false, true, &c(b"\"v0\""), &V), Verdict::Proceed { range: true });
    }

    #[test]
    fn http_dates_parse_in_all_three_forms() {
        assert_eq!(http_date(b"Sun, 06 Nov 1994 08:49:37 GMT"), Some(784111777));
        assert_eq!(http_date(b"Sunday, 06-Nov-94 08:49:37 GMT"), Some(784111777));
        assert_eq!(http_date(b"Sun Nov  6 08:49:37 1994"), Some(784111777));
        assert_eq!(http_date(b"06 Nov 1994"), None);
    }

    // ---- a model written from RFC 9110 §13.2.2, step by step, to compare against ------------

    /// A request field as the model sees it.
    #[derive(Clone, Debug)]
    enum Field {
        Absent,
        Star,
        Tags(Vec<(bool, u8)>), // (weak, tag id)
        Date(i8),              // days relative to Last-Modified
        Garbage,
    }

    fn render(f: &Field) -> Option<Vec<u8>> {
        match f {
            Field::Absent => None,
            Field::Star => Some(b"*".to_vec()),
            Field::Tags(tags) => Some(
                tags.iter()
                    .map(|(w, id)| format!("{}\"t{id}\"", if *w { "W/" } else { "" }))
                    .collect::<Vec<_>>()
                    .join(", ")
                    .into_bytes(),
            ),
            Field::Date(d) => {
                let t = std::time::UNIX_EPOCH
                    + std::time::Duration::from_secs((784111777 + i64::from(*d) * 86_400) as u64);
                Some(httpdate::fmt_http_date(t).into_bytes())
            }
            Field::Garbage => Some(b"\x01nonsense".to_vec()),
        }
    }

    fn field() -> impl Strategy<Value = Field> {
        prop_oneof![
            Just(Field::Absent),
            Just(Field::Star),
            prop::collection::vec((any::<bool>(), 0u8..3), 1..3).prop_map(Field::Tags),
            (-2i8..3).prop_map(Field::Date),
            Just(Field::Garbage),
        ]
    }

    /// RFC 9110 §13.2.2 for GET/HEAD at an origin, read literally. `etag`: current tag id and
    /// weakness, if any; `lm`: whether Last-Modified is known (at day 0).
    #[allow(clippy::too_many_arguments)]
    fn model(
        get: bool,
        range: bool,
        etag: Option<(bool, u8)>,
        lm: bool,
        im: &Field,
        inm: &Field,
        ims: &Field,
        ius: &Field,
        ir: &Field,
    ) -> Verdict {
        let strong = |(w, id): (bool, u8)| etag.is_some_and(|(cw, cid)| !w && !cw && id == cid);
        let weak = |(_, id): (bool, u8)| etag.is_some_and(|(_, cid)| id == cid);
        // 1. If-Match present: true if "*" or a listed tag strongly matches.
        let step1 = match im {
            Field::Absent => None,
            Field::Star => Some(true),
            Field::Tags(t) => Some(t.iter().any(|x| strong(*x))),
            Field::Date(_) | Field::Garbage => Some(false),
        };
        match step1 {
            Some(false) => return Verdict::Failed,
            Some(true) => {}
            None => {
                // 2. If-Unmodified-Since present (and If-Match absent): a valid date is compared.
                if let (Field::Date(d), true) = (ius, lm) {
                    if 0 > *d {
                        return Verdict::Failed;
                    }
                }
            }
        }
        // 3. If-None-Match present: false if "*" or a listed tag weakly matches.
        match inm {
            Field::Star => return Verdict::NotModified,
            Field::Tags(t) => {
                if t.iter().any(|x| weak(*x)) {
                    return Verdict::NotModified;
                }
            }
            Field::Date(_) | Field::Garbage => {}
            Field::Absent => {
                // 4. If-Modified-Since (GET/HEAD, If-None-Match absent): not modified since.
                if let (Field::Date(d), true) = (ims, lm) {
                    if 0 <= *d {
                        return Verdict::NotModified;
                    }
                }
            }
        }
        // 5. If-Range on a GET with a Range.
        if get && range {
            let keep = match ir {
                Field::Absent => true,
                Field::Tags(t) if t.len() == 1 => strong(t[0]),
                Field::Date(d) => lm && *d == 0,
                Field::Tags(_) | Field::Star | Field::Garbage => false,
            };
            return Verdict::Proceed { range: keep };
        }
        Verdict::Proceed { range: true }
    }

    proptest! {
        #[test]
        fn the_evaluator_follows_rfc_9110_precedence(
            get in any::<bool>(),
            range in any::<bool>(),
            etag in prop::option::of((any::<bool>(), 0u8..3)),
            lm in any::<bool>(),
            im in field(), inm in field(), ims in field(), ius in field(), ir in field(),
        ) {
            let tag = etag.map(|(w, id)| format!("{}\"t{id}\"", if w { "W/" } else { "" }));
            let lm_text = httpdate::fmt_http_date(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(784111777));
            let v = Validators {
                etag: tag.as_deref(),
                last_modified: lm.then_some(lm_text.as_str()),
            };
            let (a, b, c, d, e) = (render(&im), render(&inm), render(&ims), render(&ius), render(&ir));
            let conditions = Conditions {
                if_match: a.as_deref(),
                if_none_match: b.as_deref(),
                if_modified_since: c.as_deref(),
                if_unmodified_since: d.as_deref(),
                if_range: e.as_deref(),
            };
            let want = model(get, range, etag, lm, &im, &inm, &ims, &ius, &ir);
            prop_assert_eq!(evaluate(get, range, &conditions, &v), want,
                "If-Match {:?} If-None-Match {:?} IMS {:?} IUS {:?} If-Range {:?}", im, inm, ims, ius, ir);
        }
    }
}
