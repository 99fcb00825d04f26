//! Block digests on the peer plane: a peer's block answer ends with the digest of the block, and
//! the requester refuses a block whose bytes do not hash to it.
//!
//! # Wire form
//!
//! A `200` block answer carries `X-DART-Digest: xxh3-128` and a body of the block followed by a
//! 16-byte footer: the block's XXH3-128, big-endian. `Content-Length` counts both. Every other
//! peer answer (a `404`, an error, a roster) is unchanged.
//!
//! # Who computes what
//!
//! - A node keeps the digest of every block it stores, computed from the bytes it stored (at
//!   most 65,536 of them, oldest dropped first), and of every block a warm start kept, as the
//!   store hashed it at open. A read that finds a whole block in its store (a
//!   relay, or a client read that covers the block) checks it against that digest first: a
//!   block that no longer matches rotted in the store, and is dropped and read afresh as if
//!   missed (`dart_store_blocks_rotten_total`), so the rot reaches neither a peer nor a client.
//! - A node that serves a block sends its digest after the block's last byte: the digest it was
//!   stored with for a block from its store; else the digest of the whole block it served (a
//!   block a peer streamed through it, whose footer it verified first, or a window the origin
//!   sent it).
//! - A requester refuses a `200` without the header, a body that is not the block plus the footer,
//!   and a block whose digest differs ([`crate::breaker::Observation::ValidationFailed`]: a hard
//!   failure that opens the peer's circuit at once). A cut-through relay forwards every byte of the
//!   block but the last before it can check, so a failed check reaches its own requester as a
//!   truncated answer, never as a whole block.
//!
//! # What it catches, and what it does not
//!
//! It catches bytes changed after the block was first hashed: on the wire (the 16-bit TCP
//! checksum misses about one corrupted segment in 65,536), in the serving node's transport, in
//! its store after it was written (while its digest is kept), or by a relay that changes a block
//! it forwards cut-through (its requester checks the relay's footer against the bytes, and the
//! relay checked its upstream's). It does not catch:
//! - a member that forges a digest on purpose: members are authenticated by the cluster secret
//!   ([`crate::peer_auth`]) and trusted not to attack;
//! - a block whose digest was dropped (past the bound). A warm start keeps digests too: the
//!   store hashes each block whose slot checksum holds when it opens
//!   ([`crate::node::Node::recovered_digests`]);
//! - rot in a node's store met by a range read that covers part of a block: it fetches only the
//!   bytes it needs, not the whole block the digest covers, and is served unchecked.
//!
//! Registry blobs are checked whole against their content digest besides ([`crate::registry`]).
//!
//! XXH3-128 is not a cryptographic hash. It is chosen because every block is hashed at every hop:
//! `cargo bench -p dart-core --bench digest` measured it at 23 GiB/s on the 2-core build
//! machine, 1.7 times a plain copy of the block (0.17 ms per 4 MiB block), against 1.7 GiB/s for
//! SHA-256 (2.2 ms per block).
//!
//! # Hashing is the driver's to provide
//!
//! The node machine hashes through a [`BlockHasher`] ([`crate::node::Node::set_block_hasher`]).
//! Every hasher must return [`xxh3_128`] of the bytes; a driver may only make it cheaper. The
//! simulator's remembers the digests of blocks it has hashed (its blocks are shared handles), so
//! it need not read every byte of every block at every hop.

use bytes::Bytes;
use std::fmt;

/// The response header that announces the digest footer, and its only value.
pub const HEADER_DIGEST: &str = "x-dart-digest";
/// The algorithm named by [`HEADER_DIGEST`].
pub const DIGEST_ALGORITHM: &str = "xxh3-128";
/// Bytes of the footer after the block.
pub const FOOTER_LEN: u64 = 16;

/// The digest of one block.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockDigest(pub u128);

impl fmt::Debug for BlockDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{DIGEST_ALGORITHM}:{:032x}", self.0)
    }
}

impl BlockDigest {
    /// The footer that carries this digest.
    pub fn footer(self) -> Bytes {
        Bytes::copy_from_slice(&self.0.to_be_bytes())
    }

    /// The digest a footer carries; `None` unless it is exactly [`FOOTER_LEN`] bytes.
    pub fn from_footer(footer: &[u8]) -> Option<BlockDigest> {
        let bytes: [u8; FOOTER_LEN as usize] = footer.try_into().ok()?;
        Some(BlockDigest(u128::from_be_bytes(bytes)))
    }
}

/// XXH3-128 of `data`: the digest of a block.
pub fn xxh3_128(data: &[u8]) -> BlockDigest {
    BlockDigest(xxhash_rust::xxh3::xxh3_128(data))
}

/// [`xxh3_128`] computed part by part: after [`DigestStream::update`] with a block's bytes in
/// order, [`DigestStream::finish`] is the block's digest. A block gathered from parts is hashed
/// this way as each part is copied in (`crate::node`'s body buffer), while the part is still in
/// the CPU's cache, instead of reading the whole block back from memory after it is gathered.
#[derive(Clone)]
pub struct DigestStream(Box<xxhash_rust::xxh3::Xxh3Default>);

impl DigestStream {
    /// A digest of no bytes yet.
    pub fn new() -> Self {
        DigestStream(Box::new(xxhash_rust::xxh3::Xxh3Default::new()))
    }

    /// Adds `data`, the bytes after those added before.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest of every byte added.
    pub fn finish(&self) -> BlockDigest {
        BlockDigest(self.0.digest128())
    }
}

impl Default for DigestStream {
    fn default() -> Self {
        DigestStream::new()
    }
}

impl fmt::Debug for DigestStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DigestStream")
    }
}

/// Computes block digests for the node machine. Every implementation returns exactly
/// [`xxh3_128`] of the block.
pub trait BlockHasher: Send + Sync + fmt::Debug {
    /// The digest of `block`.
    fn digest(&self, block: &Bytes) -> BlockDigest;
}

/// Hashes every block it is given (the production hasher).
#[derive(Clone, Copy, Debug, Default)]
pub struct Xxh3;

impl BlockHasher for Xxh3 {
    fn digest(&self, block: &Bytes) -> BlockDigest {
        xxh3_128(block)
    }
}

/// Why a peer's block body was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FooterError {
    /// The body is not the block plus the footer.
    Length,
    /// The block does not hash to the footer's digest.
    Digest,
}

/// Checks a peer's block body of `block_len` block bytes and `footer`: the block, if it is
/// whole and hashes (by `digest`, called only then) to the digest the footer carries.
pub fn check_block(
    block: Bytes,
    footer: &[u8],
    block_len: u64,
    digest: impl FnOnce(&Bytes) -> BlockDigest,
) -> Result<Bytes, FooterError> {
    let want = BlockDigest::from_footer(footer).ok_or(FooterError::Length)?;
    if block.len() as u64 != block_len {
        return Err(FooterError::Length);
    }
    if digest(&block) != want {
        return Err(FooterError::Digest);
    }
    Ok(block)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_xxh3_128_and_its_footer_is_big_endian() {
        // Golden vectors of XXH3-128 (seed 0), as the reference implementation prints them.
        assert_eq!(format!("{:?}", xxh3_128(b"")), "xxh3-128:99aa06d3014798d86001c324468d497f");
        let abc = xxh3_128(b"abc");
        assert_eq!(format!("{abc:?}"), "xxh3-128:06b05ab6733a618578af5f94892f3950");
        let footer = abc.footer();
        assert_eq!(footer.len() as u64, FOOTER_LEN);
        assert_eq!(footer[0], 0x06);
        assert_eq!(BlockDigest::from_footer(&footer), Some(abc));
        assert_eq!(BlockDigest::from_footer(&footer[1..]), None);
    }

    #[test]
    fn a_block_is_accepted_only_whole_and_with_its_own_digest() {
        let block = Bytes::from_static(b"0123456789");
        let footer = xxh3_128(&block).footer();
        assert_eq!(check_block(block.clone(), &footer, 10, |b| xxh3_128(b)), Ok(block.clone()));
        let mut flipped = block.to_vec();
        flipped[3] ^= 0x5a;
        assert_eq!(
            check_block(Bytes::from(flipped), &footer, 10, |b| xxh3_128(b)),
            Err(FooterError::Digest)
        );
        assert_eq!(
            check_block(block.slice(..9), &footer, 10, |b| xxh3_128(b)),
            Err(FooterError::Length)
        );
        assert_eq!(
            check_block(block.clone(), &footer[..15], 10, |b| xxh3_128(b)),
            Err(FooterError::Length)
        );
        let mut bad_footer = footer.to_vec();
        bad_footer[15] ^= 1;
        assert_eq!(check_block(block, &bad_footer, 10, |b| xxh3_128(b)), Err(FooterError::Digest));
    }

    proptest::proptest! {
        /// A digest added to part by part, cut anywhere (empty parts, parts longer than the
        /// stream's internal buffer), is the block's digest.
        #[test]
        fn a_digest_streamed_in_parts_is_the_digest_of_the_whole(
            block in proptest::collection::vec(proptest::num::u8::ANY, 0..70_000),
            cuts in proptest::collection::vec(proptest::num::usize::ANY, 0..12),
        ) {
            let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (block.len() + 1)).collect();
            cuts.push(0);
            cuts.push(block.len());
            cuts.sort_unstable();
            let mut stream = DigestStream::new();
            for w in cuts.windows(2) {
                stream.update(&block[w[0]..w[1]]);
            }
            proptest::prop_assert_eq!(stream.finish(), xxh3_128(&block));
        }

        /// Any block with its own footer passes; the same block with any one byte changed, or
        /// cut or grown by a byte, never does.
        #[test]
        fn any_changed_byte_or_length_is_refused(
            block in proptest::collection::vec(proptest::num::u8::ANY, 1..4096),
            at in proptest::num::usize::ANY,
            flip in 1u8..=255,
        ) {
            let len = block.len() as u64;
            let footer = xxh3_128(&block).footer();
            let whole = Bytes::from(block.clone());
            proptest::prop_assert_eq!(check_block(whole.clone(), &footer, len, |b| xxh3_128(b)), Ok(whole));
            let mut changed = block.clone();
            changed[at % block.len()] ^= flip;
            let got = check_block(Bytes::from(changed), &footer, len, |b| xxh3_128(b));
            proptest::prop_assert_eq!(got, Err(FooterError::Digest));
            let short = Bytes::from(block[..block.len() - 1].to_vec());
            let got = check_block(short, &footer, len, |b| xxh3_128(b));
            proptest::prop_assert_eq!(got, Err(FooterError::Length));
            let mut long = block.clone();
            long.push(flip);
            let got = check_block(Bytes::from(long), &footer, len, |b| xxh3_128(b));
            proptest::prop_assert_eq!(got, Err(FooterError::Length));
        }
    }
}
