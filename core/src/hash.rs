//! The wire hashes: FNV-1a 64, the fmix64 finaliser, the placement hash, chunk and block keys and
//! the membership epoch. Every function here is wire protocol (spec/geometry.md §3, §6, §7):
//! changing any byte of it changes placement across the fleet.

use std::fmt;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
/// Field separator inside chunk keys and epochs; must never occur inside a field.
pub const FIELD_SEP: u8 = 0x1f;
/// Record separator between members in the epoch framing.
pub const RECORD_SEP: u8 = 0x1e;

/// Incremental FNV-1a 64.
#[derive(Clone, Copy, Debug)]
pub struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Fnv1a(FNV_OFFSET)
    }
}

impl Fnv1a {
    /// Feeds `bytes`.
    pub fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(FNV_PRIME);
        }
    }

    /// The raw FNV-1a state.
    pub fn finish(self) -> u64 {
        self.0
    }
}

/// FNV-1a 64 of `bytes`.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    let mut h = Fnv1a::default();
    h.write(bytes);
    h.finish()
}

/// The murmur3 64-bit finaliser.
pub fn fmix64(mut z: u64) -> u64 {
    z ^= z >> 33;
    z = z.wrapping_mul(0xff51_afd7_ed55_8ccd);
    z ^= z >> 33;
    z = z.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    z ^= z >> 33;
    z
}

/// Placement hash of `key` for member `node_id`: FNV-1a over the little-endian key then the id,
/// finalised with fmix64.
pub fn hash64(key: u64, node_id: &str) -> u64 {
    let mut h = Fnv1a::default();
    h.write(&key.to_le_bytes());
    h.write(node_id.as_bytes());
    fmix64(h.finish())
}

/// A chunk's placement key; on the wire as lower-case hex without padding.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct ChunkKey(pub u64);

impl ChunkKey {
    /// `ChunkKey(namespace, object_id, chunk_index)`; `chunk_index == -1` is the file key.
    ///
    /// Callers guarantee neither field contains [`FIELD_SEP`] (namespaces are validated at start,
    /// object ids have it stripped); it is asserted in debug builds.
    pub fn new(namespace: &str, object_id: &str, chunk_index: i64) -> Self {
        debug_assert!(!namespace.as_bytes().contains(&FIELD_SEP));
        debug_assert!(!object_id.as_bytes().contains(&FIELD_SEP));
        let mut h = Fnv1a::default();
        h.write(namespace.as_bytes());
        h.write(&[FIELD_SEP]);
        h.write(object_id.as_bytes());
        h.write(&[FIELD_SEP]);
        h.write(&chunk_index.to_be_bytes());
        ChunkKey(fmix64(h.finish()))
    }

    /// The tracker's file key: the chunk key at the sentinel index -1.
    pub fn file_key(namespace: &str, object_id: &str) -> Self {
        Self::new(namespace, object_id, -1)
    }
}

/// Lower-case hex, no padding, no `0x`: the peer wire form.
impl fmt::Display for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

/// A block's cache and wire key: its chunk's key and its global block index.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct BlockKey {
    /// The chunk key of the block's chunk.
    pub chunk: ChunkKey,
    /// The block's global index in the object (not its index inside the chunk).
    pub block: u64,
}

/// `chunk-hex/block-dec`, the tail of the peer wire path.
impl fmt::Display for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.chunk, self.block)
    }
}

/// The cluster epoch over canonical `(id, weight)` members, in the order given (callers sort by
/// id). Weight is hashed as stored, before the `<= 0 → 1` rule; state and address are excluded.
pub fn epoch<'a>(members: impl IntoIterator<Item = (&'a str, f64)>) -> u64 {
    let mut h = Fnv1a::default();
    for (id, weight) in members {
        h.write(id.as_bytes());
        h.write(&[FIELD_SEP]);
        h.write(&weight.to_bits().to_be_bytes());
        h.write(&[RECORD_SEP]);
    }
    fmix64(h.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d() -> String {
        format!("sha256:{}", "ab".repeat(32))
    }

    #[test]
    fn hash64_matches_golden_vectors() {
        assert_eq!(hash64(0, "node-a"), 16511540948091628860);
        assert_eq!(hash64(1, "node-a"), 16141481610525751987);
        assert_eq!(hash64(0, "node-b"), 16852417870494220010);
        assert_eq!(hash64(0xDEAD_BEEF_CAFE_BABE, "node-0"), 15394106576409441172);
        assert_eq!(hash64(42, "kube-node-01"), 16063926426682601568);
    }

    #[test]
    fn chunk_key_matches_golden_vectors_and_wire_hex() {
        let k = ChunkKey::new("dart", &d(), 0);
        assert_eq!(k.0, 284481562108898346);
        assert_eq!(k.to_string(), "3f2ae7936a62c2a");
        assert_eq!(ChunkKey::new("dart", &d(), 1).0, 5100546052700164472);
        assert_eq!(ChunkKey::new("dart", &d(), 1).to_string(), "46c8c79c6fb6d178");
        let url = "https://registry.example.com/v2/lib/nginx/blobs";
        assert_eq!(ChunkKey::new("dart", url, 0).0, 4130664464540416952);
        assert_eq!(ChunkKey::new("ns2", &d(), 0).0, 7473071683502782500);
        assert_eq!(ChunkKey::file_key("dart", &d()).0, 143782729898896373);
        assert_eq!(ChunkKey::file_key("dart", &d()).to_string(), "1fed1a18c75abf5");
    }

    #[test]
    fn block_key_wire_tail() {
        let k = BlockKey { chunk: ChunkKey::new("dart", &d(), 0), block: 0 };
        assert_eq!(format!("/peer/v1/block/{k}"), "/peer/v1/block/3f2ae7936a62c2a/0");
    }

    #[test]
    fn epoch_matches_golden_vectors() {
        let m = [("node-a", 1.0), ("node-b", 2.0), ("node-c", 1.0)];
        assert_eq!(epoch(m), 448884658194799021);
        assert_eq!(epoch(std::iter::empty()), 17280346270528514342);
    }
}
