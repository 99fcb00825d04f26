//! Byte-size flag values (spec/node.md §5): `-cache-size`, `-chunk-size`, `-block-size`,
//! `-mem-size`.
//!
//! Grammar: a plain integer is bytes, parsed exactly; otherwise `<int>[.<fraction>]<unit>` with
//! the unit matched case-insensitively and an optional trailing `B`: `K M G T` are 10^3..10^12,
//! `Ki Mi Gi Ti` are 2^10..2^40 (`8GiB`, `512mi`, `1.5GiB`, `4MB`). All arithmetic is exact
//! integer arithmetic; a fraction of a byte left over is truncated toward zero (`1.0005K` is
//! 1000). Decisions where the spec is silent:
//!
//! - A bare `B` (`512B`) is an unknown unit, as the spec lists units only with an optional `B`.
//! - A fraction needs a unit: `1.5` alone is refused, there is no half byte.
//! - Both sides of `.` need digits (`.5G`, `5.G` are refused); no sign, no whitespace anywhere.
//! - At most [`FRACTION_DIGITS_MAX`] fraction digits after trailing zeros are dropped, which keeps
//!   the arithmetic exact in 128 bits.
//! - The result must be at most `i64::MAX` (DART's limit; sizes become signed offsets).

use thiserror::Error;

use super::num::parse_decimal;

/// Most significant fraction digits a size may carry (`1.000000000000000001GiB` is the limit).
pub const FRACTION_DIGITS_MAX: usize = 18;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const KB: u64 = 1_000;
const MB: u64 = 1_000_000;
const GB: u64 = 1_000_000_000;
const TB: u64 = 1_000_000_000_000;

/// Unit spellings without the optional trailing `B`, with their multipliers.
const UNITS: [(&str, u64); 8] = [
    ("k", KB),
    ("m", MB),
    ("g", GB),
    ("t", TB),
    ("ki", KIB),
    ("mi", MIB),
    ("gi", GIB),
    ("ti", TIB),
];

/// Why a byte-size flag value was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum SizeError {
    /// The value was empty.
    #[error("empty size")]
    Empty,
    /// The value starts with `-`.
    #[error("negative size")]
    Negative,
    /// The value is not a number optionally followed by a unit.
    #[error("malformed size: expected an integer or <number><unit> such as 8GiB")]
    Malformed,
    /// The suffix after the number is not one of K, M, G, T, Ki, Mi, Gi, Ti (optional B).
    #[error("unknown size unit: expected K, M, G, T, Ki, Mi, Gi or Ti, optionally followed by B")]
    UnknownUnit,
    /// A fractional number was given without a unit.
    #[error("a fractional size needs a unit")]
    FractionWithoutUnit,
    /// The fraction has more than [`FRACTION_DIGITS_MAX`] significant digits.
    #[error("size fraction has more than {FRACTION_DIGITS_MAX} significant digits")]
    TooPrecise,
    /// The size exceeds `i64::MAX` bytes.
    #[error("size exceeds {} bytes", i64::MAX)]
    TooLarge,
}

/// Parses a byte-size flag value into bytes.
pub fn parse_byte_size(value: &str) -> Result<u64, SizeError> {
    let bytes = value.as_bytes();
    match bytes.first() {
        None => return Err(SizeError::Empty),
        Some(b'-') => return Err(SizeError::Negative),
        Some(_) => {}
    }
    let int_len = bytes.iter().take_while(|b| b.is_ascii_digit()).count();
    if int_len == 0 {
        return Err(SizeError::Malformed);
    }
    let (int_digits, rest) = bytes.split_at(int_len);
    let (fraction, unit) = match rest.split_first() {
        Some((b'.', after_dot)) => {
            let fraction_len = after_dot.iter().take_while(|b| b.is_ascii_digit()).count();
            if fraction_len == 0 {
                return Err(SizeError::Malformed);
            }
            let (fraction, unit) = after_dot.split_at(fraction_len);
            (Some(fraction), unit)
        }
        _ => (None, rest),
    };
    // The digits were scanned above, so overflow is the only possible failure.
    let whole = parse_decimal(int_digits).map_err(|_| SizeError::TooLarge)?;
    let multiplier = match (unit.is_empty(), fraction.is_some()) {
        (true, true) => return Err(SizeError::FractionWithoutUnit),
        (true, false) => 1,
        (false, _) => unit_multiplier(unit)?,
    };
    scale(whole, fraction.unwrap_or_default(), multiplier)
}

/// Prints a size for banners, exactly: the unit giving the smallest whole number, binary units
/// winning ties (`1 GiB`, `512 MiB`, `4 MB`, `1234 B`).
pub fn format_byte_size(bytes: u64) -> String {
    const CHOICES: [(u64, &str); 8] = [
        (TIB, "TiB"),
        (GIB, "GiB"),
        (MIB, "MiB"),
        (KIB, "KiB"),
        (TB, "TB"),
        (GB, "GB"),
        (MB, "MB"),
        (KB, "KB"),
    ];
    let best = CHOICES
        .iter()
        .filter(|(unit, _)| bytes != 0 && bytes.checked_rem(*unit) == Some(0))
        .min_by_key(|(unit, _)| bytes / unit);
    match best {
        Some((unit, name)) => format!("{} {name}", bytes / unit),
        None => format!("{bytes} B"),
    }
}

fn unit_multiplier(unit: &[u8]) -> Result<u64, SizeError> {
    if !unit.iter().all(u8::is_ascii_alphabetic) {
        return Err(SizeError::Malformed);
    }
    let stem = match unit {
        [stem @ .., b'b' | b'B'] => stem,
        stem => stem,
    };
    UNITS
        .iter()
        .find(|(name, _)| stem.eq_ignore_ascii_case(name.as_bytes()))
        .map(|&(_, multiplier)| multiplier)
        .ok_or(SizeError::UnknownUnit)
}

/// `(whole + 0.fraction) * multiplier`, truncated, refusing results above `i64::MAX`.
fn scale(whole: u64, fraction: &[u8], multiplier: u64) -> Result<u64, SizeError> {
    let significant = &fraction[..fraction.iter().rposition(|&d| d != b'0').map_or(0, |i| i + 1)];
    if significant.len() > FRACTION_DIGITS_MAX {
        return Err(SizeError::TooPrecise);
    }
    // Bounds: whole * multiplier < 2^64 * 2^40 and numerator < 10^18 * 2^40, both far below 2^128.
    let numerator = match significant {
        [] => 0,
        digits => u128::from(parse_decimal(digits).map_err(|_| SizeError::TooPrecise)?),
    };
    let denominator = 10u128.pow(u32::try_from(significant.len()).unwrap_or(u32::MAX));
    let fraction_bytes = numerator * u128::from(multiplier) / denominator;
    debug_assert!(fraction_bytes < u128::from(multiplier.max(1)));
    let total = u128::from(whole) * u128::from(multiplier) + fraction_bytes;
    u64::try_from(total).ok().filter(|&bytes| bytes <= i64::MAX as u64).ok_or(SizeError::TooLarge)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn plain_integer_is_bytes() {
        assert_eq!(parse_byte_size("0"), Ok(0));
        assert_eq!(parse_byte_size("1234"), Ok(1234));
        assert_eq!(parse_byte_size("0004096"), Ok(4096));
    }

    #[test]
    fn integers_above_two_to_the_53_stay_exact() {
        assert_eq!(parse_byte_size("9007199254740993"), Ok(9007199254740993));
    }

    #[test]
    fn i64_max_is_accepted_and_one_more_is_too_large() {
        assert_eq!(parse_byte_size("9223372036854775807"), Ok(i64::MAX as u64));
        assert_eq!(parse_byte_size("9223372036854775808"), Err(SizeError::TooLarge));
        assert_eq!(parse_byte_size("18446744073709551615"), Err(SizeError::TooLarge));
        assert_eq!(parse_byte_size("18446744073709551616"), Err(SizeError::TooLarge));
    }

    #[test]
    fn decimal_units_are_powers_of_ten() {
        assert_eq!(parse_byte_size("1K"), Ok(1_000));
        assert_eq!(parse_byte_size("1M"), Ok(1_000_000));
        assert_eq!(parse_byte_size("1G"), Ok(1_000_000_000));
        assert_eq!(parse_byte_size("1T"), Ok(1_000_000_000_000));
    }

    #[test]
    fn binary_units_are_powers_of_two() {
        assert_eq!(parse_byte_size("1Ki"), Ok(1 << 10));
        assert_eq!(parse_byte_size("1Mi"), Ok(1 << 20));
        assert_eq!(parse_byte_size("1Gi"), Ok(1 << 30));
        assert_eq!(parse_byte_size("1Ti"), Ok(1 << 40));
    }

    #[test]
    fn gib_and_gb_differ() {
        assert_ne!(parse_byte_size("1GiB"), parse_byte_size("1GB"));
    }

    #[test]
    fn units_are_case_insensitive_with_optional_trailing_b() {
        for s in ["8GiB", "8gib", "8GIB", "8Gi", "8gI", "8gib", "8GiB"] {
            assert_eq!(parse_byte_size(s), Ok(8 << 30), "{s}");
        }
        for s in ["4MB", "4mb", "4M", "4m", "4mB", "4Mb"] {
            assert_eq!(parse_byte_size(s), Ok(4_000_000), "{s}");
        }
    }

    #[test]
    fn manifest_sizes_parse() {
        assert_eq!(parse_byte_size("8GiB"), Ok(8589934592));
        assert_eq!(parse_byte_size("512MiB"), Ok(536870912));
        assert_eq!(parse_byte_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_byte_size("4MiB"), Ok(4 << 20));
    }

    #[test]
    fn fractional_gib_is_exact() {
        assert_eq!(parse_byte_size("1.5GiB"), Ok(1610612736));
        assert_eq!(parse_byte_size("0.5Ki"), Ok(512));
        assert_eq!(parse_byte_size("2.25MB"), Ok(2_250_000));
    }

    #[test]
    fn leftover_fraction_of_a_byte_is_truncated() {
        assert_eq!(parse_byte_size("1.0005K"), Ok(1000));
        assert_eq!(parse_byte_size("0.0001K"), Ok(0));
        assert_eq!(parse_byte_size("0.999999999999999999Ki"), Ok(1023));
        assert_eq!(parse_byte_size("1.1Ki"), Ok(1126));
    }

    #[test]
    fn trailing_fraction_zeros_do_not_count_toward_precision() {
        let long = format!("1.5{}GiB", "0".repeat(100));
        assert_eq!(parse_byte_size(&long), Ok(1610612736));
        assert_eq!(parse_byte_size("1.000000000000000001Ti"), Ok(1 << 40));
        assert_eq!(parse_byte_size("1.0000000000000000001Ti"), Err(SizeError::TooPrecise));
    }

    #[test]
    fn zero_is_allowed_with_or_without_unit() {
        assert_eq!(parse_byte_size("0"), Ok(0));
        assert_eq!(parse_byte_size("0GiB"), Ok(0));
        assert_eq!(parse_byte_size("0.0K"), Ok(0));
    }

    #[test]
    fn unit_results_above_i64_max_are_too_large() {
        assert_eq!(parse_byte_size("8388607TiB"), Ok(8388607 << 40));
        assert_eq!(parse_byte_size("8388608TiB"), Err(SizeError::TooLarge));
        assert_eq!(parse_byte_size("99999999999999999999K"), Err(SizeError::TooLarge));
        assert_eq!(parse_byte_size("18446744073709551615Ti"), Err(SizeError::TooLarge));
    }

    #[test]
    fn empty_is_refused() {
        assert_eq!(parse_byte_size(""), Err(SizeError::Empty));
    }

    #[test]
    fn negative_is_refused() {
        assert_eq!(parse_byte_size("-1"), Err(SizeError::Negative));
        assert_eq!(parse_byte_size("-1GiB"), Err(SizeError::Negative));
        assert_eq!(parse_byte_size("-0"), Err(SizeError::Negative));
    }

    #[test]
    fn unknown_units_are_refused() {
        for s in ["1B", "1b", "1P", "1PiB", "1KiBB", "1iB", "1kilobyte", "1X", "1Kb2"] {
            assert!(
                matches!(parse_byte_size(s), Err(SizeError::UnknownUnit | SizeError::Malformed)),
                "{s}"
            );
        }
        assert_eq!(parse_byte_size("1B"), Err(SizeError::UnknownUnit));
        assert_eq!(parse_byte_size("1PiB"), Err(SizeError::UnknownUnit));
    }

    #[test]
    fn fraction_without_unit_is_refused() {
        assert_eq!(parse_byte_size("1.5"), Err(SizeError::FractionWithoutUnit));
        assert_eq!(parse_byte_size("1.0"), Err(SizeError::FractionWithoutUnit));
    }

    #[test]
    fn junk_is_refused() {
        for s in [
            " 1", "1 ", "1 GiB", "+1", "GiB", ".5G", "5.G", "1..5G", "1.5.3G", "1,5G", "1_000",
            "0x10", "1e3", "one", "1GiB ", "١",
        ] {
            let result = parse_byte_size(s);
            assert!(
                matches!(result, Err(SizeError::Malformed | SizeError::UnknownUnit)),
                "{s:?} -> {result:?}"
            );
        }
    }

    #[test]
    fn format_picks_the_unit_with_the_smallest_whole_number() {
        assert_eq!(format_byte_size(0), "0 B");
        assert_eq!(format_byte_size(1234), "1234 B");
        assert_eq!(format_byte_size(1 << 30), "1 GiB");
        assert_eq!(format_byte_size(512 << 20), "512 MiB");
        assert_eq!(format_byte_size(1536 << 20), "1536 MiB");
        assert_eq!(format_byte_size(4_000_000), "4 MB");
        assert_eq!(format_byte_size(1_000), "1 KB");
        assert_eq!(format_byte_size(1 << 40), "1 TiB");
        assert_eq!(format_byte_size(u64::MAX), "18446744073709551615 B");
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_strings_never_panic(s in any::<String>(), t in "[0-9.+-]{0,25}[kKmMgGtTiIbB. ]{0,4}") {
            let _ = parse_byte_size(&s);
            if let Ok(bytes) = parse_byte_size(&t) {
                prop_assert!(bytes <= i64::MAX as u64);
            }
        }

        #[test]
        fn printed_integers_parse_to_themselves(n in 0..=i64::MAX as u64) {
            prop_assert_eq!(parse_byte_size(&n.to_string()), Ok(n));
        }

        #[test]
        fn integers_above_i64_max_are_too_large(n in (i64::MAX as u64 + 1)..) {
            prop_assert_eq!(parse_byte_size(&n.to_string()), Err(SizeError::TooLarge));
        }

        #[test]
        fn whole_units_multiply_exactly(n in 0u64..1 << 23, unit in 0usize..UNITS.len(), b: bool) {
            let (name, multiplier) = UNITS[unit];
            let s = format!("{n}{name}{}", if b { "B" } else { "" });
            prop_assert_eq!(parse_byte_size(&s), Ok(n * multiplier));
        }

        #[test]
        fn fractions_match_a_rational_reference(
            whole in 0u64..1_000_000, fraction in 0u64..1_000_000, digits in 1usize..=6,
            unit in 0usize..UNITS.len(),
        ) {
            let (name, multiplier) = UNITS[unit];
            let fraction = fraction % 10u64.pow(digits as u32);
            let s = format!("{whole}.{fraction:0digits$}{name}");
            // Reference: the whole number of bytes in (whole * 10^d + fraction) / 10^d units.
            let scaled = u128::from(whole) * 10u128.pow(digits as u32) + u128::from(fraction);
            let expected = scaled * u128::from(multiplier) / 10u128.pow(digits as u32);
            prop_assert_eq!(parse_byte_size(&s).map(u128::from), Ok(expected));
        }

        #[test]
        fn formatted_sizes_parse_back(n in 0..=i64::MAX as u64, shift in 0u32..40) {
            let n = (n >> shift) << shift;
            let printed = format_byte_size(n);
            let compact = printed.strip_suffix(" B").map_or_else(|| printed.replace(' ', ""), str::to_owned);
            prop_assert_eq!(parse_byte_size(&compact), Ok(n));
        }
    }
}
