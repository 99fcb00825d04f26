//! The peer plane's wire vocabulary: header names, paths, the block path codec
//! (spec/geometry.md §3, seeds/peer.md §2) and the `X-DART-Hop` decoder (spec/node.md §4).
//!
//! The block path is `/peer/v1/block/<chunk-hex>/<block-dec>`. We print the canonical form (lower
//! case hex, no padding, no `0x`) and accept what DART's `strconv.ParseUint` accepts: hex digits
//! of either case for the chunk, decimal for the block, leading zeros allowed in both (so a
//! zero-padded 17+ digit chunk is accepted when its value fits), no sign, no prefix, no empty
//! segment, no extra `/`, no trailing slash. The caller passes the path component only (no query;
//! DART parses `URL.Path`). The block index is an unrestricted `u64` here: declining indices above
//! the geometry's `max_block_index` is the relay source's job, not the transport's.

use thiserror::Error;

use super::num::{parse_decimal, parse_hex, DigitsError};
use crate::hash::{BlockKey, ChunkKey};

/// Header carrying the upstream URL a relay may fetch on the requester's behalf.
pub const HEADER_ORIGIN: &str = "x-dart-origin";
/// Header carrying the relay depth of a peer request.
pub const HEADER_HOP: &str = "x-dart-hop";
/// Header naming the member that served a peer block.
pub const HEADER_NODE: &str = "x-dart-node";
/// Header carrying the origin's status when it refused the requester's credential during a relay.
pub const HEADER_UPSTREAM_STATUS: &str = "x-dart-upstream-status";
/// How long the requester waits for this relay's response head, in milliseconds: a relay that
/// cannot answer within it (its own upstream is slow or dead) answers
/// `504` + `X-DART-Upstream-Status: 504` just before, so the requester fails over without
/// blaming it.
pub const HEADER_BUDGET: &str = "x-dart-budget-ms";
/// How long the requester lets this relay's response body stand still, in milliseconds: a relay
/// cuts off its own upstream's stalled body a margin sooner, so its abort reaches the requester
/// before the requester's own progress bound fires and blames it.
pub const HEADER_PROGRESS: &str = "x-dart-progress-ms";
/// Header asking a relay to serve only a block it holds, never to fetch it (`1`), while
/// `X-DART-Origin` still names the object so the relay answers with the version it holds
/// (a neighbour's ask before the origin, docs/overlay.md).
pub const HEADER_HELD_ONLY: &str = "x-dart-held-only";
/// The object's size as the requester knows it (decimal bytes), on a relay request: a relay
/// that does not know the object may ask its own upstream under it while it probes
/// (`crate::engine::Told`); never trusted.
pub const HEADER_OBJECT_SIZE: &str = "x-dart-object-size";
/// The `ETag` of the version the requester reads, beside [`HEADER_OBJECT_SIZE`].
pub const HEADER_OBJECT_ETAG: &str = "x-dart-object-etag";
/// The `Last-Modified` of the version the requester reads, beside [`HEADER_OBJECT_SIZE`].
pub const HEADER_OBJECT_LAST_MODIFIED: &str = "x-dart-object-last-modified";
/// Header carrying the requester's advertised peer address.
pub const HEADER_PEER_ADDR: &str = "x-dart-peer-addr";
/// Header carrying the sender's membership epoch on roster responses (decimal u64).
pub const HEADER_EPOCH: &str = "x-dart-epoch";
/// Path prefix of peer block requests; the block key's wire tail follows it.
pub const BLOCK_PATH_PREFIX: &str = "/peer/v1/block/";
/// Exact path of the membership roster exchange.
pub const ROSTER_PATH: &str = "/peer/v1/roster";
/// Query of a roster request that asks for the responder alone (a neighbour's or a broadcast
/// target's ping): `GET /peer/v1/roster?self`.
pub const ROSTER_SELF_QUERY: &str = "self";
/// Exact path of a member's departure announcement (`POST`, JSON `{"id", "addr"}`).
pub const LEAVE_PATH: &str = "/peer/v1/leave";
/// Relay depth at which the engine declines to relay further (held = false, no origin contact);
/// each relay sends `hop + 1`.
pub const MAX_HOP: u64 = 64;

/// Why a peer request path is not a block path (the peer server answers 400).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum WireError {
    /// The path does not start with [`BLOCK_PATH_PREFIX`].
    #[error("not a peer block path")]
    NotBlockPath,
    /// The path after the prefix is not exactly `<chunk>/<block>` (missing or extra segments,
    /// trailing slash).
    #[error("peer block path must be <chunk-hex>/<block-dec>")]
    Segments,
    /// The chunk segment is not 1 or more hex digits of a value that fits in 64 bits.
    #[error("peer block path chunk key is not a 64-bit hex number")]
    Chunk,
    /// The block segment is not 1 or more decimal digits of a value that fits in 64 bits.
    #[error("peer block path block index is not a 64-bit decimal number")]
    Block,
}

/// Why an `X-DART-Hop` value was refused (the peer server answers 400 before the source runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum HopError {
    /// The header was present with an empty value.
    #[error("empty X-DART-Hop")]
    Empty,
    /// The value is not an optionally signed run of decimal digits.
    #[error("X-DART-Hop is not a decimal integer")]
    Malformed,
    /// The value is a negative integer; a negative start would delay the relay-loop cutoff.
    #[error("X-DART-Hop is negative")]
    Negative,
    /// The value is above `i64::MAX`.
    #[error("X-DART-Hop overflows a signed 64-bit integer")]
    Overflow,
}

/// The request path of a peer block fetch: `/peer/v1/block/<chunk-hex>/<block-dec>`.
pub fn block_path(key: BlockKey) -> String {
    format!("{BLOCK_PATH_PREFIX}{key}")
}

/// Parses a peer block request path (path component only) into its block key.
pub fn parse_block_path(path: &str) -> Result<BlockKey, WireError> {
    let tail = path.strip_prefix(BLOCK_PATH_PREFIX).ok_or(WireError::NotBlockPath)?;
    let (chunk, block) = tail.split_once('/').ok_or(WireError::Segments)?;
    if block.contains('/') {
        return Err(WireError::Segments);
    }
    let chunk = parse_hex(chunk.as_bytes()).map_err(|_| WireError::Chunk)?;
    let block = parse_decimal(block.as_bytes()).map_err(|_| WireError::Block)?;
    Ok(BlockKey { chunk: ChunkKey(chunk), block })
}

/// Decodes `X-DART-Hop` (`None` when absent, which means depth 0) with Go `strconv.Atoi`
/// semantics, refusing negatives: an optional `+` or `-` then one or more decimal digits, value
/// in `0..=i64::MAX` (`-0` is 0). Whitespace, `_`, `.`, prefixes and empty values are refused;
/// a value at or past [`MAX_HOP`] is valid here, the engine enforces the bound.
pub fn parse_hop(value: Option<&[u8]>) -> Result<u64, HopError> {
    let Some(value) = value else {
        return Ok(0);
    };
    let (negative, digits) = match value {
        [] => return Err(HopError::Empty),
        [b'+', digits @ ..] => (false, digits),
        [b'-', digits @ ..] => (true, digits),
        digits => (false, digits),
    };
    let hop = match parse_decimal(digits) {
        Ok(hop) => hop,
        Err(DigitsError::Empty | DigitsError::NotDigit) => return Err(HopError::Malformed),
        Err(DigitsError::Overflow) if negative => return Err(HopError::Negative),
        Err(DigitsError::Overflow) => return Err(HopError::Overflow),
    };
    if negative && hop != 0 {
        return Err(HopError::Negative);
    }
    if hop > i64::MAX as u64 {
        return Err(HopError::Overflow);
    }
    Ok(hop)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(chunk: u64, block: u64) -> BlockKey {
        BlockKey { chunk: ChunkKey(chunk), block }
    }

    fn hop(s: &str) -> Result<u64, HopError> {
        parse_hop(Some(s.as_bytes()))
    }

    #[test]
    fn block_path_matches_the_golden_wire_form() {
        assert_eq!(block_path(key(284481562108898346, 0)), "/peer/v1/block/3f2ae7936a62c2a/0");
        assert_eq!(block_path(key(0, 7)), "/peer/v1/block/0/7");
        assert_eq!(
            block_path(key(u64::MAX, u64::MAX)),
            "/peer/v1/block/ffffffffffffffff/18446744073709551615"
        );
    }

    #[test]
    fn golden_block_path_parses_back() {
        assert_eq!(
            parse_block_path("/peer/v1/block/3f2ae7936a62c2a/0"),
            Ok(key(284481562108898346, 0))
        );
    }

    #[test]
    fn chunk_hex_is_accepted_in_any_case() {
        assert_eq!(
            parse_block_path("/peer/v1/block/3F2AE7936A62C2A/0"),
            Ok(key(284481562108898346, 0))
        );
        assert_eq!(parse_block_path("/peer/v1/block/aBcD/1"), Ok(key(0xabcd, 1)));
    }

    #[test]
    fn leading_zeros_are_accepted_like_go_parse_uint() {
        assert_eq!(parse_block_path("/peer/v1/block/000ff/007"), Ok(key(0xff, 7)));
        assert_eq!(parse_block_path("/peer/v1/block/00000000000000000001/1"), Ok(key(1, 1)));
    }

    #[test]
    fn chunk_key_above_64_bits_is_refused() {
        assert_eq!(parse_block_path("/peer/v1/block/ffffffffffffffff/0"), Ok(key(u64::MAX, 0)));
        assert_eq!(parse_block_path("/peer/v1/block/10000000000000000/0"), Err(WireError::Chunk));
    }

    #[test]
    fn block_index_u64_max_is_accepted_and_one_more_is_refused() {
        assert_eq!(parse_block_path("/peer/v1/block/1/18446744073709551615"), Ok(key(1, u64::MAX)));
        assert_eq!(
            parse_block_path("/peer/v1/block/1/18446744073709551616"),
            Err(WireError::Block)
        );
    }

    #[test]
    fn malformed_relay_indices_from_issue_52_still_parse_for_the_source_to_decline() {
        for index in [1u64 << 63, u64::MAX, 576460752303423488] {
            assert_eq!(parse_block_path(&format!("/peer/v1/block/1/{index}")), Ok(key(1, index)));
        }
    }

    #[test]
    fn chunk_prefix_and_sign_are_refused() {
        for chunk in ["0xff", "0Xff", "+ff", "-ff", "", " ff", "ff ", "f_f", "fg", "%66"] {
            let path = format!("/peer/v1/block/{chunk}/0");
            assert_eq!(parse_block_path(&path), Err(WireError::Chunk), "{path:?}");
        }
    }

    #[test]
    fn block_prefix_sign_and_junk_are_refused() {
        for block in ["+1", "-1", "-0", "", "0x1", "1_000", "1.5", " 1", "1 ", "a", "1?x=y"] {
            let path = format!("/peer/v1/block/ff/{block}");
            assert_eq!(parse_block_path(&path), Err(WireError::Block), "{path:?}");
        }
    }

    #[test]
    fn extra_missing_and_trailing_segments_are_refused() {
        for path in [
            "/peer/v1/block/ff",
            "/peer/v1/block/ff/",
            "/peer/v1/block/ff/0/",
            "/peer/v1/block/ff/0/1",
            "/peer/v1/block/ff//0",
            "/peer/v1/block//ff/0",
            "/peer/v1/block/",
        ] {
            let result = parse_block_path(path);
            assert!(
                matches!(result, Err(WireError::Segments | WireError::Chunk | WireError::Block)),
                "{path:?} -> {result:?}"
            );
        }
        assert_eq!(parse_block_path("/peer/v1/block/ff/0/"), Err(WireError::Segments));
        assert_eq!(parse_block_path("/peer/v1/block/ff"), Err(WireError::Segments));
    }

    #[test]
    fn other_paths_are_not_block_paths() {
        for path in [
            "",
            "/",
            "/peer/v1/block",
            "/peer/v1/roster",
            "/peer/v2/block/ff/0",
            "peer/v1/block/ff/0",
            "//peer/v1/block/ff/0",
            "/PEER/v1/block/ff/0",
        ] {
            assert_eq!(parse_block_path(path), Err(WireError::NotBlockPath), "{path:?}");
        }
    }

    #[test]
    fn absent_hop_is_depth_zero() {
        assert_eq!(parse_hop(None), Ok(0));
    }

    #[test]
    fn plain_hops_are_accepted_including_values_past_the_engine_bound() {
        assert_eq!(hop("0"), Ok(0));
        assert_eq!(hop("5"), Ok(5));
        assert_eq!(hop("63"), Ok(MAX_HOP - 1));
        assert_eq!(hop("64"), Ok(MAX_HOP));
        assert_eq!(hop("007"), Ok(7));
    }

    #[test]
    fn leading_plus_is_accepted_like_atoi() {
        assert_eq!(hop("+5"), Ok(5));
        assert_eq!(hop("+0"), Ok(0));
    }

    #[test]
    fn negative_zero_is_accepted_as_zero() {
        assert_eq!(hop("-0"), Ok(0));
        assert_eq!(hop("-000"), Ok(0));
    }

    #[test]
    fn negative_hops_are_refused() {
        assert_eq!(hop("-1"), Err(HopError::Negative));
        assert_eq!(hop("-9223372036854775808"), Err(HopError::Negative));
        assert_eq!(hop("-99999999999999999999999"), Err(HopError::Negative));
    }

    #[test]
    fn hop_at_i64_max_is_accepted_and_one_more_overflows() {
        assert_eq!(hop("9223372036854775807"), Ok(i64::MAX as u64));
        assert_eq!(hop("9223372036854775808"), Err(HopError::Overflow));
        assert_eq!(hop("18446744073709551615"), Err(HopError::Overflow));
        assert_eq!(hop("18446744073709551616"), Err(HopError::Overflow));
    }

    #[test]
    fn empty_hop_is_refused() {
        assert_eq!(hop(""), Err(HopError::Empty));
    }

    #[test]
    fn non_decimal_hops_are_refused() {
        for s in
            ["1.5", " 1", "1 ", "1_000", "0x1", "+", "-", "+-1", "--1", "++1", "1e3", "one", "١"]
        {
            assert_eq!(hop(s), Err(HopError::Malformed), "{s:?}");
        }
        assert_eq!(parse_hop(Some(b"\xff")), Err(HopError::Malformed));
    }

    proptest! {
        #[test]
        fn fuzz_arbitrary_paths_never_panic_and_accepted_paths_reprint_to_the_same_key(
            tail in "[0-9a-fA-FxX+ /_-]{0,24}",
            raw: Vec<u8>,
        ) {
            for path in [format!("{BLOCK_PATH_PREFIX}{tail}"), String::from_utf8_lossy(&raw).into_owned()] {
                if let Ok(parsed) = parse_block_path(&path) {
                    prop_assert_eq!(parse_block_path(&block_path(parsed)), Ok(parsed));
                }
            }
        }

        #[test]
        fn canonical_block_paths_round_trip_exactly(chunk: u64, block: u64) {
            let path = block_path(key(chunk, block));
            let parsed = parse_block_path(&path);
            prop_assert_eq!(parsed, Ok(key(chunk, block)));
            prop_assert_eq!(block_path(key(chunk, block)), path);
        }

        #[test]
        fn upper_case_and_padded_forms_parse_to_the_same_key(chunk: u64, block: u64, pad in 0usize..8) {
            let zeros = "0".repeat(pad);
            let path = format!("{BLOCK_PATH_PREFIX}{zeros}{chunk:X}/{zeros}{block}");
            prop_assert_eq!(parse_block_path(&path), Ok(key(chunk, block)));
        }

        #[test]
        fn fuzz_arbitrary_hop_bytes_never_panic_and_stay_in_i64(bytes: Vec<u8>) {
            if let Ok(value) = parse_hop(Some(&bytes)) {
                prop_assert!(value <= i64::MAX as u64);
            }
        }

        #[test]
        fn hop_matches_an_atoi_reference_model(s in "[+-]?[0-9]{0,21}") {
            // Reference: Rust's i64 parse has Atoi's grammar (optional sign, base-10 digits).
            match s.parse::<i64>() {
                Ok(v) if v >= 0 => prop_assert_eq!(hop(&s), Ok(v.unsigned_abs())),
                Ok(_) => prop_assert_eq!(hop(&s), Err(HopError::Negative)),
                Err(_) => prop_assert!(hop(&s).is_err()),
            }
        }
    }
}
