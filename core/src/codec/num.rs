//! Strict unsigned digit-string parsing shared by the codecs: ASCII digits only, no sign, no
//! prefix, no separators, no whitespace. Leading zeros are accepted (as Go's `ParseUint` does).

/// Why a digit string was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DigitsError {
    /// There were no digits at all.
    Empty,
    /// A byte was not a digit of the radix.
    NotDigit,
    /// Every byte was a digit, but the value does not fit in `u64`.
    Overflow,
}

/// Parses `digits` as a base-10 `u64`.
pub(crate) fn parse_decimal(digits: &[u8]) -> Result<u64, DigitsError> {
    parse_radix(digits, 10)
}

/// Parses `digits` as a base-16 `u64`, digits of either case.
pub(crate) fn parse_hex(digits: &[u8]) -> Result<u64, DigitsError> {
    parse_radix(digits, 16)
}

/// True when `digits` is non-empty and all ASCII decimal digits.
pub(crate) fn is_decimal(digits: &[u8]) -> bool {
    !digits.is_empty() && digits.iter().all(u8::is_ascii_digit)
}

fn parse_radix(digits: &[u8], radix: u32) -> Result<u64, DigitsError> {
    debug_assert!(radix == 10 || radix == 16);
    if digits.is_empty() {
        return Err(DigitsError::Empty);
    }
    // Validate every byte before reporting overflow, so junk is never mistaken for a big number.
    let mut value: Option<u64> = Some(0);
    for &byte in digits {
        let digit = char::from(byte).to_digit(radix).ok_or(DigitsError::NotDigit)?;
        value = value
            .and_then(|v| v.checked_mul(u64::from(radix)))
            .and_then(|v| v.checked_add(u64::from(digit)));
    }
    value.ok_or(DigitsError::Overflow)
}

/// Compares two valid decimal digit strings by numeric value, whatever their length.
pub(crate) fn cmp_decimal(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    debug_assert!(is_decimal(a) && is_decimal(b));
    let a = trim_leading_zeros(a);
    let b = trim_leading_zeros(b);
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

fn trim_leading_zeros(digits: &[u8]) -> &[u8] {
    let first_nonzero = digits.iter().position(|&d| d != b'0').unwrap_or(digits.len());
    &digits[first_nonzero..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cmp::Ordering;

    #[test]
    fn decimal_accepts_u64_max_and_refuses_one_more() {
        assert_eq!(parse_decimal(b"18446744073709551615"), Ok(u64::MAX));
        assert_eq!(parse_decimal(b"18446744073709551616"), Err(DigitsError::Overflow));
    }

    #[test]
    fn leading_zeros_never_overflow() {
        let padded = format!("{}1", "0".repeat(100));
        assert_eq!(parse_decimal(padded.as_bytes()), Ok(1));
        assert_eq!(parse_hex(padded.as_bytes()), Ok(1));
    }

    #[test]
    fn junk_after_an_overflow_is_reported_as_junk() {
        assert_eq!(parse_decimal(b"99999999999999999999x"), Err(DigitsError::NotDigit));
    }

    #[test]
    fn signs_prefixes_and_separators_are_not_digits() {
        for s in ["+1", "-1", "0x1", "1_000", " 1", "1 ", "1.5"] {
            assert_eq!(parse_decimal(s.as_bytes()), Err(DigitsError::NotDigit), "{s}");
        }
        assert_eq!(parse_hex(b"0xff"), Err(DigitsError::NotDigit));
        assert_eq!(parse_hex(b""), Err(DigitsError::Empty));
    }

    #[test]
    fn hex_accepts_either_case() {
        assert_eq!(parse_hex(b"fF"), Ok(255));
        assert_eq!(parse_hex(b"FFFFFFFFFFFFFFFF"), Ok(u64::MAX));
        assert_eq!(parse_hex(b"10000000000000000"), Err(DigitsError::Overflow));
    }

    #[test]
    fn decimal_comparison_ignores_leading_zeros() {
        assert_eq!(cmp_decimal(b"0010", b"9"), Ordering::Greater);
        assert_eq!(cmp_decimal(b"000", b"0"), Ordering::Equal);
        assert_eq!(cmp_decimal(b"99999999999999999999", b"100000000000000000000"), Ordering::Less);
    }

    proptest! {
        #[test]
        fn decimal_matches_std_for_any_u64(n: u64, zeros in 0usize..30) {
            let s = format!("{}{n}", "0".repeat(zeros));
            prop_assert_eq!(parse_decimal(s.as_bytes()), Ok(n));
            prop_assert_eq!(parse_hex(format!("{n:x}").as_bytes()), Ok(n));
            prop_assert_eq!(parse_hex(format!("{n:X}").as_bytes()), Ok(n));
        }

        #[test]
        fn decimal_comparison_matches_numeric_order(a: u64, b: u64, za in 0usize..4, zb in 0usize..4) {
            let sa = format!("{}{a}", "0".repeat(za));
            let sb = format!("{}{b}", "0".repeat(zb));
            prop_assert_eq!(cmp_decimal(sa.as_bytes(), sb.as_bytes()), a.cmp(&b));
        }
    }
}
