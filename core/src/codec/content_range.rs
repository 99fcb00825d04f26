//! Parser for an origin's `Content-Range` (spec/fetch.md §2–§3, RFC 9110 §14.4).
//!
//! Accepted forms: `bytes <first>-<last>/<total>`, `bytes <first>-<last>/*` (total hidden) and
//! `bytes */<total>` (the 416 form). Numbers are one or more ASCII digits (leading zeros allowed)
//! that fit in `u64`. The unit is matched case-insensitively (RFC 9110 §14.1) and followed by
//! exactly one space; optional whitespace around the whole value is trimmed, any other whitespace
//! is refused. `bytes */*` carries no information and is refused. What to do with a hidden total
//! (a probe failure, fetch.md §2) is the caller's decision: this parser only reports it.

use std::fmt;

use thiserror::Error;

use super::num::{parse_decimal, DigitsError};

/// A parsed `Content-Range` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentRange {
    /// Inclusive `(first, last)` offsets of the enclosed bytes; `None` for `bytes */<total>`.
    pub range: Option<(u64, u64)>,
    /// Complete length of the object; `None` when the origin sent `*`.
    pub total: Option<u64>,
}

/// The canonical wire form: no leading zeros, lower-case unit. A value with neither a range nor
/// a total (never produced by the parser) prints as the unparseable `bytes */*`.
impl fmt::Display for ContentRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes ")?;
        match self.range {
            Some((first, last)) => write!(f, "{first}-{last}/")?,
            None => f.write_str("*/")?,
        }
        match self.total {
            Some(total) => write!(f, "{total}"),
            None => f.write_str("*"),
        }
    }
}

/// Why an origin's `Content-Range` was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ContentRangeError {
    /// The value does not follow the grammar (unit, space, `-`, `/`, digits, `*`).
    #[error("malformed Content-Range")]
    Syntax,
    /// A number does not fit in 64 bits.
    #[error("Content-Range number overflows 64 bits")]
    Overflow,
    /// The range ends before it starts.
    #[error("Content-Range {first}-{last} is inverted")]
    Inverted {
        /// First offset as sent.
        first: u64,
        /// Last offset as sent.
        last: u64,
    },
    /// The range's last offset is not inside the complete length.
    #[error("Content-Range last offset {last} is not below the total {total}")]
    PastTotal {
        /// Last offset as sent.
        last: u64,
        /// Complete length as sent.
        total: u64,
    },
}

/// Parses an origin's `Content-Range` header value.
pub fn parse_content_range(value: &[u8]) -> Result<ContentRange, ContentRangeError> {
    const UNIT: &[u8] = b"bytes ";
    let value = trim_ows(value);
    if value.len() < UNIT.len() || !value[..UNIT.len()].eq_ignore_ascii_case(UNIT) {
        return Err(ContentRangeError::Syntax);
    }
    let rest = &value[UNIT.len()..];
    let slash = rest.iter().position(|&b| b == b'/').ok_or(ContentRangeError::Syntax)?;
    let (range_part, total_part) = (&rest[..slash], &rest[slash + 1..]);
    let range = match range_part {
        b"*" => None,
        _ => {
            let dash =
                range_part.iter().position(|&b| b == b'-').ok_or(ContentRangeError::Syntax)?;
            let first = number(&range_part[..dash])?;
            let last = number(&range_part[dash + 1..])?;
            Some((first, last))
        }
    };
    let total = match total_part {
        b"*" => None,
        _ => Some(number(total_part)?),
    };
    let parsed = ContentRange { range, total };
    check(parsed)?;
    Ok(parsed)
}

fn check(parsed: ContentRange) -> Result<(), ContentRangeError> {
    match (parsed.range, parsed.total) {
        (None, None) => Err(ContentRangeError::Syntax),
        (Some((first, last)), _) if first > last => {
            Err(ContentRangeError::Inverted { first, last })
        }
        (Some((_, last)), Some(total)) if last >= total => {
            Err(ContentRangeError::PastTotal { last, total })
        }
        _ => Ok(()),
    }
}

fn number(digits: &[u8]) -> Result<u64, ContentRangeError> {
    parse_decimal(digits).map_err(|e| match e {
        DigitsError::Overflow => ContentRangeError::Overflow,
        DigitsError::Empty | DigitsError::NotDigit => ContentRangeError::Syntax,
    })
}

fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !is_ows(b)).map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<ContentRange, ContentRangeError> {
        parse_content_range(s.as_bytes())
    }

    fn cr(
        range: Option<(u64, u64)>,
        total: Option<u64>,
    ) -> Result<ContentRange, ContentRangeError> {
        Ok(ContentRange { range, total })
    }

    #[test]
    fn probe_answer_gives_the_total() {
        assert_eq!(parse("bytes 0-0/5000"), cr(Some((0, 0)), Some(5000)));
    }

    #[test]
    fn hidden_total_is_reported_as_unknown_not_fabricated() {
        assert_eq!(parse("bytes 0-0/*"), cr(Some((0, 0)), None));
        assert_eq!(parse("bytes 4096-4899/*"), cr(Some((4096, 4899)), None));
    }

    #[test]
    fn unsatisfied_form_gives_only_the_total() {
        assert_eq!(parse("bytes */100"), cr(None, Some(100)));
        assert_eq!(parse("bytes */0"), cr(None, Some(0)));
    }

    #[test]
    fn rfc_tail_clamp_is_parsed_as_sent() {
        assert_eq!(parse("bytes 4096-4999/5000"), cr(Some((4096, 4999)), Some(5000)));
    }

    #[test]
    fn nothing_known_is_refused() {
        assert_eq!(parse("bytes */*"), Err(ContentRangeError::Syntax));
    }

    #[test]
    fn inverted_range_is_refused() {
        assert_eq!(parse("bytes 5-4/100"), Err(ContentRangeError::Inverted { first: 5, last: 4 }));
        assert_eq!(parse("bytes 5-4/*"), Err(ContentRangeError::Inverted { first: 5, last: 4 }));
    }

    #[test]
    fn range_ending_at_or_past_the_total_is_refused() {
        assert_eq!(
            parse("bytes 0-100/100"),
            Err(ContentRangeError::PastTotal { last: 100, total: 100 })
        );
        assert_eq!(parse("bytes 0-0/0"), Err(ContentRangeError::PastTotal { last: 0, total: 0 }));
    }

    #[test]
    fn overflowing_numbers_are_refused() {
        assert_eq!(parse("bytes 0-0/18446744073709551616"), Err(ContentRangeError::Overflow));
        assert_eq!(parse("bytes 18446744073709551616-1/*"), Err(ContentRangeError::Overflow));
        assert_eq!(parse("bytes */99999999999999999999999"), Err(ContentRangeError::Overflow));
    }

    #[test]
    fn u64_max_total_is_accepted() {
        assert_eq!(
            parse("bytes 0-18446744073709551614/18446744073709551615"),
            cr(Some((0, u64::MAX - 1)), Some(u64::MAX))
        );
        assert_eq!(parse("bytes 0-18446744073709551615/*"), cr(Some((0, u64::MAX)), None));
    }

    #[test]
    fn junk_is_refused() {
        for s in [
            "",
            "bytes",
            "bytes ",
            "bytes 0-1",
            "bytes 0-1/",
            "bytes -1/10",
            "bytes 0-/10",
            "bytes 0-1/10/10",
            "bytes 0-1-2/10",
            "bytes=0-1/10",
            "bytes  0-1/10",
            "bytes 0 -1/10",
            "bytes 0-1 /10",
            "bytes 0-1/ 10",
            "bytes +0-1/10",
            "bytes 0-1/-10",
            "bytes */",
            "bytes *",
            "bytes **/10",
            "bytes 0x0-1/10",
            "items 0-1/10",
            "0-1/10",
            "bytes 0-1/1e3",
        ] {
            assert_eq!(parse(s), Err(ContentRangeError::Syntax), "{s:?}");
        }
        assert_eq!(parse_content_range(b"bytes 0-1/\xff"), Err(ContentRangeError::Syntax));
    }

    #[test]
    fn unit_case_and_surrounding_whitespace_are_tolerated() {
        assert_eq!(parse(" Bytes 0-1/10\t"), cr(Some((0, 1)), Some(10)));
    }

    #[test]
    fn leading_zeros_are_accepted_and_printed_canonically() {
        let parsed = parse("bytes 000-009/0100").expect("valid");
        assert_eq!(parsed, ContentRange { range: Some((0, 9)), total: Some(100) });
        assert_eq!(parsed.to_string(), "bytes 0-9/100");
    }

    #[test]
    fn display_prints_every_form() {
        assert_eq!(
            ContentRange { range: Some((0, 9)), total: Some(100) }.to_string(),
            "bytes 0-9/100"
        );
        assert_eq!(ContentRange { range: Some((0, 9)), total: None }.to_string(), "bytes 0-9/*");
        assert_eq!(ContentRange { range: None, total: Some(100) }.to_string(), "bytes */100");
    }

    fn valid_content_range() -> impl Strategy<Value = ContentRange> {
        let ranged = (any::<u64>(), any::<u64>(), any::<u64>(), any::<bool>()).prop_map(
            |(a, b, c, hidden)| {
                let mut sorted = [a, b, c];
                sorted.sort_unstable();
                let [first, last, total] = sorted;
                // `last < total` must hold; when they collide, hide the total instead.
                let total = if last == total { None } else { Some(total) };
                ContentRange {
                    range: Some((first, last)),
                    total: if hidden { None } else { total },
                }
            },
        );
        let unsatisfied = any::<u64>().prop_map(|t| ContentRange { range: None, total: Some(t) });
        prop_oneof![ranged, unsatisfied]
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_bytes_never_panic(bytes: Vec<u8>) {
            let _ = parse_content_range(&bytes);
        }

        #[test]
        fn fuzz_accepted_values_reprint_and_reparse_equal(
            s in "[ ]?(bytes|BYTES|byte)[ ]{0,2}(\\*|[0-9]{0,21})-?[0-9]{0,21}/?(\\*|[0-9]{0,21})",
        ) {
            if let Ok(parsed) = parse(&s) {
                prop_assert!(parsed.range.is_some() || parsed.total.is_some());
                if let Some((first, last)) = parsed.range {
                    prop_assert!(first <= last);
                    prop_assert!(parsed.total.is_none_or(|t| last < t));
                }
                prop_assert_eq!(parse(&parsed.to_string()), Ok(parsed));
            }
        }

        #[test]
        fn canonical_prints_round_trip_exactly(value in valid_content_range()) {
            let printed = value.to_string();
            prop_assert_eq!(parse(&printed), Ok(value));
            prop_assert_eq!(parse(&printed).map(|v| v.to_string()), Ok(printed));
        }
    }
}
