//! Judging origin responses (spec/fetch.md §2–§4): what a size probe answer means, how much of a
//! range response's body the shell may read, and whether what it read is the window it asked for.
//!
//! The shell performs the request and streams the body; these functions decide. A shell drives a
//! range fetch as: [`plan_range_response`] on the status and headers, then skip `plan.skip` bytes,
//! read at most `plan.read_max` more, abort the rest, and hand the bytes to [`finish_range_body`].

use crate::codec::content_range::{parse_content_range, ContentRange};
use thiserror::Error;

/// Why an origin exchange failed. Carries no URL: the shell adds the redacted one when it logs.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum OriginError {
    /// The origin answered with a status other than the ones a range fetch accepts.
    #[error("origin answered status {status}")]
    Status {
        /// The HTTP status code.
        status: u16,
        /// A 401's `WWW-Authenticate`, passed on to a client the refusal reaches.
        challenge: Option<String>,
    },
    /// A probe's 206 did not reveal the object's total size (`bytes 0-0/*`).
    #[error("origin hid the object size (Content-Range total is `*`)")]
    HiddenTotal,
    /// A `Content-Range` header that does not parse, or that a 206 lacked when it was needed.
    #[error("origin sent an invalid Content-Range")]
    BadContentRange,
    /// The 206 covers a window starting elsewhere than requested.
    #[error("origin answered offset {got}, requested {want}")]
    WrongOffset {
        /// Requested first offset.
        want: u64,
        /// First offset the origin claimed.
        got: u64,
    },
    /// The body was shorter or longer than the window it should hold.
    #[error("origin body length {got}, expected {want}")]
    BodyLength {
        /// Expected body length in bytes.
        want: u64,
        /// Bytes received (at most one more than expected: the read is bounded).
        got: u64,
    },
    /// A Range-ignoring 200 ended before the requested start.
    #[error("origin body ended before the requested start {start}")]
    StartPastEnd {
        /// Requested first offset.
        start: u64,
    },
    /// The request could not be made or the body not read (dial, reset, timeout).
    #[error("origin transport error: {0}")]
    Transport(String),
    /// An invalid request was refused before any I/O (inverted window, overflowing index).
    #[error("invalid origin request: {0}")]
    InvalidRequest(&'static str),
    /// The origin answered with another version of the object than the one being read (its
    /// validator changed): no response may mix bytes of two versions.
    #[error("the object changed at the origin")]
    Changed,
    /// The upstream policy refused every address the origin's host resolved to: nothing was
    /// sent.
    #[error("upstream refused ({0}): {explain}", explain = .0.explain())]
    Refused(crate::policy::Refusal),
}

impl OriginError {
    /// This error with a 401's `WWW-Authenticate` (visible ASCII, at most 1 KiB) attached.
    pub fn with_challenge(self, challenge: Option<&[u8]>) -> Self {
        match self {
            OriginError::Status { status: 401, .. } => {
                let challenge = challenge
                    .filter(|c| c.len() <= 1024 && c.iter().all(|&b| (0x20..0x7f).contains(&b)))
                    .map(|c| String::from_utf8_lossy(c).into_owned());
                OriginError::Status { status: 401, challenge }
            }
            other => other,
        }
    }

    /// True for a credential refusal (401/403): a coalesced joiner retries alone with its own URL.
    pub fn is_refusal(&self) -> bool {
        matches!(self, OriginError::Status { status: 401 | 403, .. })
    }

    /// True when the origin could not be reached or failed on its side (a transport error, a
    /// 5xx): a cache may go on with what it knew (stale-if-error). Not for 404 or refusals.
    pub fn is_unavailable(&self) -> bool {
        match self {
            OriginError::Transport(_) => true,
            OriginError::Status { status, .. } => *status >= 500,
            OriginError::HiddenTotal
            | OriginError::BadContentRange
            | OriginError::WrongOffset { .. }
            | OriginError::BodyLength { .. }
            | OriginError::StartPastEnd { .. }
            | OriginError::InvalidRequest(_)
            | OriginError::Changed
            | OriginError::Refused(_) => false,
        }
    }

    /// The origin's own status, when it answered with one.
    pub fn status(&self) -> Option<u16> {
        match self {
            OriginError::Status { status, .. } => Some(*status),
            OriginError::HiddenTotal
            | OriginError::BadContentRange
            | OriginError::WrongOffset { .. }
            | OriginError::BodyLength { .. }
            | OriginError::StartPastEnd { .. }
            | OriginError::Transport(_)
            | OriginError::InvalidRequest(_)
            | OriginError::Changed
            | OriginError::Refused(_) => None,
        }
    }
}

/// What a size probe (`GET` with `Range: bytes=0-0`) established.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// The origin honours Range and the object has this many bytes (0 for a 416).
    Size(u64),
    /// The origin ignored Range (200): proxy the object verbatim; its length, when announced.
    RangeBlind {
        /// `Content-Length` of the 200, if any.
        content_length: Option<u64>,
    },
}

/// Classifies a probe answer. The body is irrelevant: the shell drops it.
pub fn classify_probe(
    status: u16,
    content_range: Option<&[u8]>,
    content_length: Option<u64>,
) -> Result<ProbeOutcome, OriginError> {
    match status {
        206 => {
            let cr = content_range.ok_or(OriginError::BadContentRange)?;
            let cr = parse_content_range(cr).map_err(|_| OriginError::BadContentRange)?;
            if let Some((start, _)) = cr.range {
                if start != 0 {
                    return Err(OriginError::WrongOffset { want: 0, got: start });
                }
            }
            match cr.total {
                Some(total) => Ok(ProbeOutcome::Size(total)),
                None => Err(OriginError::HiddenTotal),
            }
        }
        200 => Ok(ProbeOutcome::RangeBlind { content_length }),
        416 => Ok(ProbeOutcome::Size(0)),
        _ => Err(OriginError::Status { status, challenge: None }),
    }
}

/// How to read the body of a range response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyPlan {
    /// Bytes to discard before the window (non-zero only for a Range-ignoring 200).
    pub skip: u64,
    /// Most bytes to read after skipping; the rest is aborted.
    pub read_max: u64,
    request: (u64, u64),
    kind: BodyKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BodyKind {
    Partial { content_range: Option<ContentRange> },
    RangeIgnored { content_length: Option<u64> },
}

impl BodyPlan {
    /// The origin honoured the range (a 206 of exactly the window asked for): the body's bytes
    /// are the window's from the first.
    pub fn honours_range(&self) -> bool {
        self.skip == 0 && matches!(self.kind, BodyKind::Partial { .. })
    }

    /// The object's total size, when the response's `Content-Range` names it.
    pub fn total(&self) -> Option<u64> {
        match self.kind {
            BodyKind::Partial { content_range } => content_range.and_then(|cr| cr.total),
            BodyKind::RangeIgnored { .. } => None,
        }
    }
}

/// Bytes of a range fetch, judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RangeBody {
    /// The object's total size, when the response revealed it.
    pub total: Option<u64>,
    /// The origin ignored Range: the bytes may be served but never cached.
    pub range_ignored: bool,
}

/// Decides, from status and headers, how the shell reads the body of a fetch of the inclusive
/// window `start..=end`.
pub fn plan_range_response(
    start: u64,
    end: u64,
    status: u16,
    content_range: Option<&[u8]>,
    content_length: Option<u64>,
) -> Result<BodyPlan, OriginError> {
    if end < start {
        return Err(OriginError::InvalidRequest("end before start"));
    }
    let window = end - start + 1;
    match status {
        206 => {
            let content_range = match content_range {
                Some(raw) => {
                    Some(parse_content_range(raw).map_err(|_| OriginError::BadContentRange)?)
                }
                None => None,
            };
            if let Some((got, _)) = content_range.and_then(|cr| cr.range) {
                if got != start {
                    return Err(OriginError::WrongOffset { want: start, got });
                }
            }
            Ok(BodyPlan {
                skip: 0,
                read_max: window.saturating_add(1),
                request: (start, end),
                kind: BodyKind::Partial { content_range },
            })
        }
        200 => {
            if let Some(len) = content_length {
                if len > 0 && start >= len {
                    return Err(OriginError::StartPastEnd { start });
                }
            }
            Ok(BodyPlan {
                skip: start,
                read_max: window,
                request: (start, end),
                kind: BodyKind::RangeIgnored { content_length },
            })
        }
        _ => Err(OriginError::Status { status, challenge: None }),
    }
}

/// Judges the bytes read under `plan`. `skipped_all` is false when the body ended while skipping.
pub fn finish_range_body(
    plan: &BodyPlan,
    skipped_all: bool,
    body_len: u64,
) -> Result<RangeBody, OriginError> {
    let (start, end) = plan.request;
    let window = end - start + 1;
    debug_assert!(body_len <= plan.read_max, "shell read past the plan");
    match plan.kind {
        BodyKind::Partial { content_range } => {
            let total = content_range.and_then(|cr| cr.total);
            if body_len == window {
                return Ok(RangeBody { total, range_ignored: false });
            }
            // RFC 9110 tail clamp: the origin shortened a window that ran past the end.
            let clamp = content_range.and_then(|cr| match (cr.range, cr.total) {
                (Some((s, e)), Some(t)) if s == start && t > 0 && e == t - 1 && e < end => {
                    Some(e - s + 1)
                }
                _ => None,
            });
            match clamp {
                Some(len) if len == body_len => Ok(RangeBody { total, range_ignored: false }),
                Some(len) => Err(OriginError::BodyLength { want: len, got: body_len }),
                None => Err(OriginError::BodyLength { want: window, got: body_len }),
            }
        }
        BodyKind::RangeIgnored { content_length } => {
            if content_length == Some(0) && start == 0 {
                return Ok(RangeBody { total: Some(0), range_ignored: true });
            }
            if !skipped_all {
                return Err(OriginError::StartPastEnd { start });
            }
            Ok(RangeBody { total: content_length, range_ignored: true })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_206_with_total_gives_the_size() {
        let got = classify_probe(206, Some(b"bytes 0-0/5000"), Some(1));
        assert_eq!(got, Ok(ProbeOutcome::Size(5000)));
    }

    #[test]
    fn probe_206_hiding_the_total_is_a_failure_not_a_size() {
        assert_eq!(
            classify_probe(206, Some(b"bytes 0-0/*"), Some(1)),
            Err(OriginError::HiddenTotal)
        );
        assert_eq!(classify_probe(206, None, Some(1)), Err(OriginError::BadContentRange));
    }

    #[test]
    fn probe_200_marks_the_origin_range_blind() {
        let got = classify_probe(200, None, Some(77));
        assert_eq!(got, Ok(ProbeOutcome::RangeBlind { content_length: Some(77) }));
    }

    #[test]
    fn probe_416_means_an_empty_object() {
        assert_eq!(classify_probe(416, Some(b"bytes */0"), None), Ok(ProbeOutcome::Size(0)));
    }

    #[test]
    fn probe_error_statuses_keep_their_code() {
        assert_eq!(
            classify_probe(404, None, None),
            Err(OriginError::Status { status: 404, challenge: None })
        );
        assert!(classify_probe(403, None, None).unwrap_err().is_refusal());
    }

    #[test]
    fn exact_206_window_is_accepted_and_reveals_the_total() {
        let plan = plan_range_response(4096, 8191, 206, Some(b"bytes 4096-8191/9000"), None)
            .expect("plan");
        assert_eq!(plan.read_max, 4097);
        let body = finish_range_body(&plan, true, 4096).expect("body");
        assert_eq!(body, RangeBody { total: Some(9000), range_ignored: false });
    }

    #[test]
    fn short_or_long_206_bodies_are_errors() {
        let plan = plan_range_response(0, 99, 206, Some(b"bytes 0-99/1000"), None).expect("plan");
        assert!(finish_range_body(&plan, true, 50).is_err());
        assert!(finish_range_body(&plan, true, 101).is_err());
    }

    #[test]
    fn a_206_at_the_wrong_offset_is_refused_before_reading() {
        let got = plan_range_response(100, 199, 206, Some(b"bytes 0-99/1000"), None);
        assert_eq!(got, Err(OriginError::WrongOffset { want: 100, got: 0 }));
    }

    #[test]
    fn rfc_tail_clamp_is_accepted_only_when_content_range_proves_it() {
        // Object 5000 bytes, unknown size, block 1 of 4096: the origin clamps to 4096-4999.
        let plan = plan_range_response(4096, 8191, 206, Some(b"bytes 4096-4999/5000"), None)
            .expect("plan");
        assert_eq!(
            finish_range_body(&plan, true, 904),
            Ok(RangeBody { total: Some(5000), range_ignored: false })
        );
        // The same window claiming 4096-4899/5000 with 804 bytes is not a tail clamp.
        let plan = plan_range_response(4096, 8191, 206, Some(b"bytes 4096-4899/5000"), None)
            .expect("plan");
        assert!(finish_range_body(&plan, true, 804).is_err());
    }

    #[test]
    fn range_ignoring_200_skips_to_the_window_and_is_flagged() {
        let plan = plan_range_response(10, 19, 200, None, Some(100)).expect("plan");
        assert_eq!((plan.skip, plan.read_max), (10, 10));
        assert_eq!(
            finish_range_body(&plan, true, 10),
            Ok(RangeBody { total: Some(100), range_ignored: true })
        );
        assert!(finish_range_body(&plan, false, 0).is_err());
        assert_eq!(
            plan_range_response(100, 199, 200, None, Some(100)),
            Err(OriginError::StartPastEnd { start: 100 })
        );
    }

    #[test]
    fn inverted_windows_fail_before_any_io() {
        assert!(matches!(
            plan_range_response(10, 9, 206, None, None),
            Err(OriginError::InvalidRequest(_))
        ));
    }
}
