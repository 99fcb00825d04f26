//! Client `Range` header resolution against a known object size (spec/node.md §2, RFC 9110 §14),
//! and the `Content-Range` values the client plane sends back.
//!
//! Exactly one range is served. The accepted grammar is
//! `bytes=<first>-<last>`, `bytes=<first>-` and `bytes=-<suffix>` where each number is one or more
//! ASCII digits. Decisions where the spec is silent:
//!
//! - Optional whitespace (SP, HTAB) around the whole field value is trimmed: RFC 9110 §5.5 says it
//!   is not part of the value, and Go's `net/http` (which DART sits on) strips it before DART sees
//!   the header. Whitespace anywhere inside (around `=` or `-`, inside a number) is `Invalid`.
//! - A header whose value is empty (after that trim) is treated as absent, serving the whole
//!   object, as a Go handler reading it through `Header.Get` (which cannot tell empty from
//!   absent) would; an empty value selects no range, so the RFC allows ignoring it.
//! - The unit `bytes` is matched case-insensitively (RFC 9110 §14.1: range units are
//!   case-insensitive); node.md only speaks of a `bytes=` prefix. A missing or different unit is
//!   `Invalid` (416) as node.md says, although the RFC would let a server ignore it.
//! - Numbers too large for `u64` are syntactically fine (RFC 9110 §14.1.1 tells recipients to
//!   expect arbitrarily large numerals): an over-large last position clamps to `size - 1` like
//!   any last position past the end, an over-large first position is `Unsatisfiable` (it is past
//!   any representable size), an over-large suffix length selects the whole object. Read as
//!   node.md's "bad numbers" all three would be 416; we follow the RFC for the first and third.
//! - `first > last` is `Invalid` (RFC 9110 §14.1.1 calls such a spec invalid); the comparison is
//!   exact even for numbers past `u64`.
//! - `bytes=-0` is `Unsatisfiable`: it is well formed but selects nothing.

use std::cmp::Ordering;

use thiserror::Error;

use super::num::{cmp_decimal, is_decimal, parse_decimal, DigitsError};

/// What a request's `Range` header asks for, resolved against the object size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RangeOutcome {
    /// No range was asked for: answer 200 with the whole object (possibly empty).
    Whole,
    /// One satisfiable range: answer 206 with these inclusive offsets, already clamped so that
    /// `start <= end < size`.
    Partial {
        /// First byte offset served.
        start: u64,
        /// Last byte offset served (inclusive).
        end: u64,
    },
}

impl RangeOutcome {
    /// The `Content-Length` of the answer for an object of `size` bytes.
    pub fn content_length(&self, size: u64) -> u64 {
        match *self {
            RangeOutcome::Whole => size,
            RangeOutcome::Partial { start, end } => {
                debug_assert!(start <= end && end < size);
                end - start + 1
            }
        }
    }
}

/// Why a `Range` header gets 416 with `Content-Range: bytes */<size>`; the variants differ only
/// for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum RangeError {
    /// The header is not one well-formed byte range (wrong unit, several ranges, bad numbers,
    /// `first > last`, whitespace, ...).
    #[error("malformed or multi-range Range header")]
    Invalid,
    /// The range is well formed but selects no byte of the object (first position at or past the
    /// end, a zero-length suffix, or any range on an empty object).
    #[error("Range not satisfiable for this object size")]
    Unsatisfiable,
}

/// One syntactically valid byte-range spec; numbers are kept as digit strings so that values past
/// `u64` still compare exactly.
#[derive(Clone, Copy, Debug)]
enum RangeSpec<'a> {
    /// `first-last`.
    Bounded { first: &'a [u8], last: &'a [u8] },
    /// `first-`.
    From { first: &'a [u8] },
    /// `-suffix`.
    Suffix { suffix: &'a [u8] },
}

/// Resolves the client's `Range` header (`None` when absent) against an object of `size` bytes.
pub fn resolve_range(header: Option<&[u8]>, size: u64) -> Result<RangeOutcome, RangeError> {
    let Some(raw) = header else {
        return Ok(RangeOutcome::Whole);
    };
    let value = trim_ows(raw);
    if value.is_empty() {
        return Ok(RangeOutcome::Whole);
    }
    let outcome = match parse_spec(value).ok_or(RangeError::Invalid)? {
        RangeSpec::Bounded { first, last } => {
            if cmp_decimal(first, last) == Ordering::Greater {
                return Err(RangeError::Invalid);
            }
            let start = saturating_decimal(first);
            if start >= size {
                return Err(RangeError::Unsatisfiable);
            }
            RangeOutcome::Partial { start, end: saturating_decimal(last).min(size - 1) }
        }
        RangeSpec::From { first } => {
            let start = saturating_decimal(first);
            if start >= size {
                return Err(RangeError::Unsatisfiable);
            }
            RangeOutcome::Partial { start, end: size - 1 }
        }
        RangeSpec::Suffix { suffix } => {
            let suffix_len = saturating_decimal(suffix);
            // An empty object has no last byte: `[0, -1]` must never be produced (issue #49).
            if suffix_len == 0 || size == 0 {
                return Err(RangeError::Unsatisfiable);
            }
            RangeOutcome::Partial { start: size - suffix_len.min(size), end: size - 1 }
        }
    };
    if let RangeOutcome::Partial { start, end } = outcome {
        debug_assert!(start <= end && end < size, "resolved [{start}, {end}] for size {size}");
    }
    Ok(outcome)
}

/// `Content-Range` of a 206: `bytes <start>-<end>/<size>`.
///
/// # Panics
/// If `start <= end < size` does not hold: that is a caller bug, never client input.
pub fn content_range_header(start: u64, end: u64, size: u64) -> String {
    assert!(start <= end && end < size, "bad Content-Range [{start}, {end}] of {size}");
    format!("bytes {start}-{end}/{size}")
}

/// `Content-Range` of a 416: `bytes */<size>`.
pub fn unsatisfied_content_range(size: u64) -> String {
    format!("bytes */{size}")
}

fn parse_spec(value: &[u8]) -> Option<RangeSpec<'_>> {
    const UNIT: &[u8] = b"bytes=";
    if value.len() < UNIT.len() || !value[..UNIT.len()].eq_ignore_ascii_case(UNIT) {
        return None;
    }
    let spec = &value[UNIT.len()..];
    // A comma means several ranges; splitting at the first '-' leaves any second '-' in `last`,
    // where it fails the digit check.
    let dash = spec.iter().position(|&b| b == b'-')?;
    let (first, last) = (&spec[..dash], &spec[dash + 1..]);
    match (first.is_empty(), last.is_empty()) {
        (false, false) if is_decimal(first) && is_decimal(last) => {
            Some(RangeSpec::Bounded { first, last })
        }
        (false, true) if is_decimal(first) => Some(RangeSpec::From { first }),
        (true, false) if is_decimal(last) => Some(RangeSpec::Suffix { suffix: last }),
        _ => None,
    }
}

/// Value of a validated digit string, `u64::MAX` when it does not fit.
fn saturating_decimal(digits: &[u8]) -> u64 {
    let value = parse_decimal(digits);
    debug_assert!(matches!(value, Ok(_) | Err(DigitsError::Overflow)), "validated digits");
    value.unwrap_or(u64::MAX)
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

    fn resolve(header: &str, size: u64) -> Result<RangeOutcome, RangeError> {
        resolve_range(Some(header.as_bytes()), size)
    }

    fn partial(start: u64, end: u64) -> Result<RangeOutcome, RangeError> {
        Ok(RangeOutcome::Partial { start, end })
    }

    #[test]
    fn missing_header_serves_the_whole_object() {
        assert_eq!(resolve_range(None, 100), Ok(RangeOutcome::Whole));
    }

    #[test]
    fn missing_header_on_empty_object_serves_an_empty_200() {
        assert_eq!(resolve_range(None, 0), Ok(RangeOutcome::Whole));
        assert_eq!(RangeOutcome::Whole.content_length(0), 0);
    }

    #[test]
    fn empty_header_value_is_treated_as_absent_like_go_header_get() {
        assert_eq!(resolve("", 10), Ok(RangeOutcome::Whole));
        assert_eq!(resolve(" \t ", 10), Ok(RangeOutcome::Whole));
    }

    #[test]
    fn bounded_range_is_served_inclusive() {
        assert_eq!(resolve("bytes=0-9", 100), partial(0, 9));
        assert_eq!(resolve("bytes=5-5", 100), partial(5, 5));
        assert_eq!(resolve("bytes=99-99", 100), partial(99, 99));
    }

    #[test]
    fn bounded_range_end_past_size_clamps_to_last_byte() {
        assert_eq!(resolve("bytes=90-1000", 100), partial(90, 99));
        assert_eq!(resolve("bytes=0-100", 100), partial(0, 99));
    }

    #[test]
    fn bounded_range_starting_at_or_past_size_is_unsatisfiable() {
        assert_eq!(resolve("bytes=100-200", 100), Err(RangeError::Unsatisfiable));
        assert_eq!(resolve("bytes=150-200", 100), Err(RangeError::Unsatisfiable));
    }

    #[test]
    fn inverted_bounded_range_is_invalid() {
        assert_eq!(resolve("bytes=10-5", 100), Err(RangeError::Invalid));
        assert_eq!(resolve("bytes=200-150", 100), Err(RangeError::Invalid));
    }

    #[test]
    fn open_ended_range_runs_to_the_last_byte() {
        assert_eq!(resolve("bytes=10-", 100), partial(10, 99));
        assert_eq!(resolve("bytes=0-", 100), partial(0, 99));
        assert_eq!(resolve("bytes=99-", 100), partial(99, 99));
    }

    #[test]
    fn open_ended_range_starting_at_size_is_unsatisfiable() {
        assert_eq!(resolve("bytes=100-", 100), Err(RangeError::Unsatisfiable));
    }

    #[test]
    fn suffix_range_serves_the_last_bytes() {
        assert_eq!(resolve("bytes=-10", 100), partial(90, 99));
        assert_eq!(resolve("bytes=-1", 100), partial(99, 99));
    }

    #[test]
    fn suffix_longer_than_object_serves_the_whole_object_as_206() {
        assert_eq!(resolve("bytes=-500", 100), partial(0, 99));
        assert_eq!(resolve("bytes=-100", 100), partial(0, 99));
    }

    #[test]
    fn zero_length_suffix_is_unsatisfiable() {
        assert_eq!(resolve("bytes=-0", 100), Err(RangeError::Unsatisfiable));
        assert_eq!(resolve("bytes=-000", 100), Err(RangeError::Unsatisfiable));
    }

    #[test]
    fn suffix_range_on_empty_object_is_unsatisfiable() {
        assert_eq!(resolve("bytes=-1", 0), Err(RangeError::Unsatisfiable));
        assert_eq!(resolve("bytes=-100", 0), Err(RangeError::Unsatisfiable));
        assert_eq!(resolve("bytes=-18446744073709551615", 0), Err(RangeError::Unsatisfiable));
    }

    #[test]
    fn every_range_form_on_empty_object_is_unsatisfiable() {
        assert_eq!(resolve("bytes=0-0", 0), Err(RangeError::Unsatisfiable));
        assert_eq!(resolve("bytes=0-", 0), Err(RangeError::Unsatisfiable));
        assert_eq!(unsatisfied_content_range(0), "bytes */0");
    }

    #[test]
    fn multi_range_is_invalid() {
        assert_eq!(resolve("bytes=0-1,5-6", 100), Err(RangeError::Invalid));
        assert_eq!(resolve("bytes=0-1, 5-6", 100), Err(RangeError::Invalid));
        assert_eq!(resolve("bytes=0-1,", 100), Err(RangeError::Invalid));
        assert_eq!(resolve("bytes=,0-1", 100), Err(RangeError::Invalid));
    }

    #[test]
    fn missing_or_foreign_unit_is_invalid() {
        for h in ["0-9", "=0-9", "bytes0-9", "byte=0-9", "items=0-9", "bytes 0-9", "bytes:0-9"] {
            assert_eq!(resolve(h, 100), Err(RangeError::Invalid), "{h:?}");
        }
    }

    #[test]
    fn unit_is_matched_case_insensitively() {
        assert_eq!(resolve("Bytes=0-9", 100), partial(0, 9));
        assert_eq!(resolve("BYTES=-1", 100), partial(99, 99));
    }

    #[test]
    fn signs_in_numbers_are_invalid() {
        for h in ["bytes=+1-5", "bytes=1-+5", "bytes=--5", "bytes=-+5", "bytes=-5-", "bytes=1--5"] {
            assert_eq!(resolve(h, 100), Err(RangeError::Invalid), "{h:?}");
        }
    }

    #[test]
    fn whitespace_inside_the_value_is_invalid() {
        for h in
            ["bytes= 0-9", "bytes =0-9", "bytes=0 -9", "bytes=0- 9", "bytes=1 0-20", "bytes=-\t5"]
        {
            assert_eq!(resolve(h, 100), Err(RangeError::Invalid), "{h:?}");
        }
    }

    #[test]
    fn whitespace_around_the_value_is_trimmed() {
        assert_eq!(resolve(" bytes=0-9\t", 100), partial(0, 9));
    }

    #[test]
    fn empty_numbers_and_garbage_are_invalid() {
        for h in ["bytes=", "bytes=-", "bytes=a-b", "bytes=0x1-2", "bytes=1.5-2", "bytes=1_0-20"] {
            assert_eq!(resolve(h, 100), Err(RangeError::Invalid), "{h:?}");
        }
        assert_eq!(resolve_range(Some(b"bytes=\xff-1"), 100), Err(RangeError::Invalid));
    }

    #[test]
    fn leading_zeros_are_accepted() {
        assert_eq!(resolve("bytes=007-0010", 100), partial(7, 10));
    }

    #[test]
    fn u64_max_start_is_unsatisfiable() {
        assert_eq!(resolve("bytes=18446744073709551615-", 100), Err(RangeError::Unsatisfiable));
        assert_eq!(
            resolve("bytes=18446744073709551615-", u64::MAX),
            Err(RangeError::Unsatisfiable)
        );
    }

    #[test]
    fn u64_max_suffix_selects_the_whole_object() {
        assert_eq!(resolve("bytes=-18446744073709551615", 100), partial(0, 99));
        assert_eq!(resolve("bytes=-18446744073709551615", u64::MAX), partial(0, u64::MAX - 1));
    }

    #[test]
    fn u64_max_sized_object_serves_its_last_byte() {
        assert_eq!(
            resolve("bytes=18446744073709551614-", u64::MAX),
            partial(u64::MAX - 1, u64::MAX - 1)
        );
        assert_eq!(resolve("bytes=0-18446744073709551615", u64::MAX), partial(0, u64::MAX - 1));
    }

    #[test]
    fn overflowing_end_clamps_to_last_byte() {
        assert_eq!(resolve("bytes=0-99999999999999999999999", 100), partial(0, 99));
    }

    #[test]
    fn overflowing_start_is_unsatisfiable() {
        assert_eq!(resolve("bytes=99999999999999999999999-", 100), Err(RangeError::Unsatisfiable));
        assert_eq!(
            resolve("bytes=99999999999999999999999-999999999999999999999999", u64::MAX),
            Err(RangeError::Unsatisfiable)
        );
    }

    #[test]
    fn overflowing_suffix_selects_the_whole_object() {
        assert_eq!(resolve("bytes=-99999999999999999999999", 100), partial(0, 99));
    }

    #[test]
    fn inverted_range_of_overflowing_numbers_is_still_invalid() {
        assert_eq!(
            resolve("bytes=99999999999999999999999-18446744073709551615", 100),
            Err(RangeError::Invalid)
        );
        assert_eq!(
            resolve("bytes=100000000000000000000000-99999999999999999999999", 100),
            Err(RangeError::Invalid)
        );
    }

    #[test]
    fn content_length_is_the_inclusive_window() {
        assert_eq!(RangeOutcome::Partial { start: 0, end: 9 }.content_length(100), 10);
        assert_eq!(RangeOutcome::Whole.content_length(100), 100);
    }

    #[test]
    fn content_range_printers_match_the_wire_form() {
        assert_eq!(content_range_header(0, 9, 100), "bytes 0-9/100");
        assert_eq!(content_range_header(99, 99, 100), "bytes 99-99/100");
        assert_eq!(unsatisfied_content_range(100), "bytes */100");
        assert_eq!(
            content_range_header(0, u64::MAX - 1, u64::MAX),
            "bytes 0-18446744073709551614/18446744073709551615"
        );
    }

    #[test]
    #[should_panic(expected = "bad Content-Range")]
    fn content_range_printer_refuses_an_inverted_window() {
        let _ = content_range_header(0, 0, 0);
    }

    fn any_size() -> impl Strategy<Value = u64> {
        prop_oneof![Just(0), Just(1), Just(u64::MAX), 0u64..1_000, any::<u64>()]
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_bytes_never_panic(bytes: Vec<u8>, size in any_size()) {
            let _ = resolve_range(Some(&bytes), size);
        }

        #[test]
        fn fuzz_range_shaped_headers_resolve_inside_the_object(
            header in "[ \t]?(bytes|BYTES|byte)?=?[0-9+ ]{0,22}-?[0-9,]{0,22}[ \t]?",
            size in any_size(),
        ) {
            if let Ok(RangeOutcome::Partial { start, end }) = resolve(&header, size) {
                prop_assert!(start <= end && end < size, "{header:?} -> [{start},{end}] of {size}");
            }
        }

        #[test]
        fn bounded_ranges_match_a_reference_model(a: u64, b: u64, size in any_size()) {
            let expected = if a > b {
                Err(RangeError::Invalid)
            } else if a >= size {
                Err(RangeError::Unsatisfiable)
            } else {
                Ok(RangeOutcome::Partial { start: a, end: b.min(size - 1) })
            };
            prop_assert_eq!(resolve(&format!("bytes={a}-{b}"), size), expected);
        }

        #[test]
        fn suffix_ranges_match_a_reference_model(n: u64, size in any_size()) {
            let expected = if n == 0 || size == 0 {
                Err(RangeError::Unsatisfiable)
            } else {
                Ok(RangeOutcome::Partial { start: size - n.min(size), end: size - 1 })
            };
            prop_assert_eq!(resolve(&format!("bytes=-{n}"), size), expected);
        }

        #[test]
        fn partial_outcomes_print_a_reparseable_content_range(a: u64, size in 1u64..) {
            let a = a % size;
            let Ok(RangeOutcome::Partial { start, end }) = resolve(&format!("bytes={a}-"), size)
            else {
                return Err(TestCaseError::fail("open-ended range inside the object"));
            };
            let printed = content_range_header(start, end, size);
            let parsed = crate::codec::parse_content_range(printed.as_bytes());
            prop_assert_eq!(parsed.map(|c| (c.range, c.total)), Ok((Some((start, end)), Some(size))));
        }
    }
}
