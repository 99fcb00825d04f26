//! Object, chunk and block geometry (spec/geometry.md §1): which block holds an offset, how long
//! every block must be, and which blocks cover a byte range.
//!
//! All offsets are `u64` but every legal window fits in `i64` range arithmetic: a block index
//! above [`Geometry::max_block_index`] cannot come from a same-config peer and is refused before
//! any arithmetic is done with it.

use thiserror::Error;

/// Default chunk size: 256 MiB.
pub const DEFAULT_CHUNK_BYTES: u64 = 256 << 20;
/// Default block size: 4 MiB.
pub const DEFAULT_BLOCK_BYTES: u64 = 4 << 20;
/// Largest block we accept: a block is buffered whole in memory on the peer and origin paths.
pub const BLOCK_BYTES_MAX: u64 = 1 << 30;
/// Largest object offset + 1 anything can address (`i64::MAX + 1`).
const ADDRESSABLE_BYTES: u64 = i64::MAX as u64 + 1;

/// Why a geometry configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum GeometryError {
    /// The block size was zero.
    #[error("block size must be greater than zero")]
    ZeroBlock,
    /// The chunk size was zero.
    #[error("chunk size must be greater than zero")]
    ZeroChunk,
    /// The chunk size is not a whole number of blocks.
    #[error("chunk size {chunk} is not a multiple of block size {block}")]
    ChunkNotMultipleOfBlock {
        /// Configured chunk size in bytes.
        chunk: u64,
        /// Configured block size in bytes.
        block: u64,
    },
    /// The block size exceeds [`BLOCK_BYTES_MAX`].
    #[error("block size {0} exceeds the maximum of {BLOCK_BYTES_MAX} bytes")]
    BlockTooLarge(u64),
    /// The chunk size does not fit signed 64-bit offsets.
    #[error("chunk size {0} exceeds the signed 64-bit offset range")]
    ChunkTooLarge(u64),
}

/// Chunk and block sizes, validated: `block > 0`, `chunk > 0`, `chunk % block == 0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Geometry {
    chunk_bytes: u64,
    block_bytes: u64,
}

impl Default for Geometry {
    fn default() -> Self {
        Geometry { chunk_bytes: DEFAULT_CHUNK_BYTES, block_bytes: DEFAULT_BLOCK_BYTES }
    }
}

/// One block's part of a byte range: absolute inclusive offsets `from..=to` inside block
/// `block_index` of chunk `chunk_index`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Index of the chunk holding the block.
    pub chunk_index: u64,
    /// Global index of the block.
    pub block_index: u64,
    /// First absolute offset of the range inside this block.
    pub from: u64,
    /// Last absolute offset (inclusive) of the range inside this block.
    pub to: u64,
}

impl Geometry {
    /// Validates and builds a geometry.
    pub fn new(chunk_bytes: u64, block_bytes: u64) -> Result<Self, GeometryError> {
        if block_bytes == 0 {
            return Err(GeometryError::ZeroBlock);
        }
        if chunk_bytes == 0 {
            return Err(GeometryError::ZeroChunk);
        }
        if block_bytes > BLOCK_BYTES_MAX {
            return Err(GeometryError::BlockTooLarge(block_bytes));
        }
        if chunk_bytes > i64::MAX as u64 {
            return Err(GeometryError::ChunkTooLarge(chunk_bytes));
        }
        if !chunk_bytes.is_multiple_of(block_bytes) {
            return Err(GeometryError::ChunkNotMultipleOfBlock {
                chunk: chunk_bytes,
                block: block_bytes,
            });
        }
        Ok(Geometry { chunk_bytes, block_bytes })
    }

    /// Block size in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// Chunk size in bytes.
    pub fn chunk_bytes(&self) -> u64 {
        self.chunk_bytes
    }

    /// Blocks in one chunk.
    pub fn blocks_per_chunk(&self) -> u64 {
        self.chunk_bytes / self.block_bytes
    }

    /// The largest block index whose whole window fits in `i64`:
    /// `(i64::MAX - block + 1) / block`.
    pub fn max_block_index(&self) -> u64 {
        (i64::MAX as u64 - self.block_bytes + 1) / self.block_bytes
    }

    /// Chunk holding absolute offset `offset`.
    pub fn chunk_index(&self, offset: u64) -> u64 {
        offset / self.chunk_bytes
    }

    /// Block holding absolute offset `offset`.
    pub fn block_index(&self, offset: u64) -> u64 {
        offset / self.block_bytes
    }

    /// Chunk holding global block `block`.
    pub fn chunk_of_block(&self, block: u64) -> u64 {
        block / self.blocks_per_chunk()
    }

    /// First offset of `block`, or `None` when the index is above [`Self::max_block_index`].
    pub fn block_start(&self, block: u64) -> Option<u64> {
        (block <= self.max_block_index()).then(|| block * self.block_bytes)
    }

    /// The natural inclusive window of `block` (ignoring object size), `None` above the maximum.
    pub fn block_window(&self, block: u64) -> Option<(u64, u64)> {
        let start = self.block_start(block)?;
        Some((start, start + (self.block_bytes - 1)))
    }

    /// The exact length block `block` must have in an object of `size` bytes: `block` bytes, or
    /// the remainder for the final block. `None` when the block lies wholly outside the object.
    pub fn block_len(&self, size: u64, block: u64) -> Option<u64> {
        let start = self.block_start(block)?;
        if start >= size {
            return None;
        }
        let len = (size - start).min(self.block_bytes);
        debug_assert!(len >= 1 && len <= self.block_bytes);
        Some(len)
    }

    /// Number of blocks in an object of `size` bytes.
    pub fn block_count(&self, size: u64) -> u64 {
        size.div_ceil(self.block_bytes)
    }

    /// The segments covering the inclusive range `start..=end`, one per block, in order. An
    /// inverted range or one past the addressable offsets yields nothing.
    pub fn segments(&self, start: u64, end: u64) -> Segments {
        let valid = start <= end && end < ADDRESSABLE_BYTES;
        Segments { geometry: *self, next: start, end, done: !valid }
    }
}

/// Iterator over the [`Segment`]s of a range; see [`Geometry::segments`].
#[derive(Clone, Debug)]
pub struct Segments {
    geometry: Geometry,
    next: u64,
    end: u64,
    done: bool,
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        if self.done {
            return None;
        }
        let g = &self.geometry;
        let block_index = g.block_index(self.next);
        let block_last = block_index * g.block_bytes + (g.block_bytes - 1);
        let to = block_last.min(self.end);
        let seg =
            Segment { chunk_index: g.chunk_index(self.next), block_index, from: self.next, to };
        if to == self.end {
            self.done = true;
        } else {
            self.next = to + 1;
        }
        Some(seg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn g(chunk: u64, block: u64) -> Geometry {
        Geometry::new(chunk, block).expect("valid geometry")
    }

    #[test]
    fn invalid_configurations_are_refused() {
        assert_eq!(Geometry::new(16, 0), Err(GeometryError::ZeroBlock));
        assert_eq!(Geometry::new(0, 4), Err(GeometryError::ZeroChunk));
        assert!(matches!(Geometry::new(18, 4), Err(GeometryError::ChunkNotMultipleOfBlock { .. })));
        assert!(matches!(Geometry::new(1 << 32, 1 << 31), Err(GeometryError::BlockTooLarge(_))));
        assert!(matches!(Geometry::new(u64::MAX, 1), Err(GeometryError::ChunkTooLarge(_))));
        assert_eq!(Geometry::default().blocks_per_chunk(), 64);
    }

    #[test]
    fn offsets_map_to_golden_chunk_block_and_start() {
        let geo = g(16, 4);
        let want = [(0, 0, 0, 0), (3, 0, 0, 0), (4, 0, 1, 4), (15, 0, 3, 12), (16, 1, 4, 16)];
        let want2 = [(31, 1, 7, 28), (32, 2, 8, 32)];
        for (off, c, b, s) in want.into_iter().chain(want2) {
            assert_eq!(geo.chunk_index(off), c, "chunk of {off}");
            assert_eq!(geo.block_index(off), b, "block of {off}");
            assert_eq!(geo.block_start(b), Some(s), "start of {b}");
            assert_eq!(geo.chunk_of_block(b), c);
        }
    }

    #[test]
    fn range_crossing_a_chunk_boundary_splits_per_block() {
        let segs: Vec<_> = g(16, 4).segments(14, 18).collect();
        assert_eq!(
            segs,
            vec![
                Segment { chunk_index: 0, block_index: 3, from: 14, to: 15 },
                Segment { chunk_index: 1, block_index: 4, from: 16, to: 18 },
            ]
        );
        let one: Vec<_> = Geometry::default().segments(0, 4095).collect();
        assert_eq!(one, vec![Segment { chunk_index: 0, block_index: 0, from: 0, to: 4095 }]);
        assert_eq!(g(16, 4).segments(5, 4).count(), 0);
    }

    #[test]
    fn max_block_index_matches_golden_values() {
        for (block, want) in [
            (1, 9223372036854775807),
            (3, 3074457345618258601),
            (16, 576460752303423487),
            (4096, 2251799813685247),
            (4194304, 2199023255551),
        ] {
            assert_eq!(g(block, block).max_block_index(), want, "block {block}");
        }
        let geo = g(4096, 4096);
        assert_eq!(
            geo.block_window(2251799813685247),
            Some((9223372036854771712, 9223372036854775807))
        );
        let geo16 = g(16, 16);
        assert_eq!(geo16.block_start(576460752303423488), None);
        assert_eq!(geo16.block_start(1 << 63), None);
        assert_eq!(geo16.block_start(u64::MAX), None);
    }

    #[test]
    fn block_len_is_full_or_the_final_remainder() {
        let geo = g(4096, 4096);
        assert_eq!(geo.block_len(4500, 0), Some(4096));
        assert_eq!(geo.block_len(4500, 1), Some(404));
        assert_eq!(geo.block_len(4500, 2), None);
        assert_eq!(geo.block_len(0, 0), None);
        assert_eq!(geo.block_len(8192, 1), Some(4096));
        assert_eq!(geo.block_len(u64::MAX, u64::MAX), None);
        assert_eq!(geo.block_count(4500), 2);
        assert_eq!(geo.block_count(0), 0);
    }

    proptest! {
        #[test]
        fn segments_tile_the_range_without_gaps(
            block in 1u64..64, per_chunk in 1u64..8, start in 0u64..10_000, len in 0u64..10_000,
        ) {
            let geo = g(block * per_chunk, block);
            let end = start + len;
            let segs: Vec<_> = geo.segments(start, end).collect();
            prop_assert_eq!(segs.first().map(|s| s.from), Some(start));
            prop_assert_eq!(segs.last().map(|s| s.to), Some(end));
            for w in segs.windows(2) {
                prop_assert_eq!(w[0].to + 1, w[1].from);
                prop_assert_eq!(w[0].block_index + 1, w[1].block_index);
            }
            for s in &segs {
                prop_assert_eq!(geo.block_index(s.from), s.block_index);
                prop_assert_eq!(geo.block_index(s.to), s.block_index);
                prop_assert_eq!(geo.chunk_of_block(s.block_index), s.chunk_index);
            }
        }

        #[test]
        fn segments_near_the_top_of_the_offset_space_never_overflow(
            back in 0u64..10_000, len in 0u64..10_000,
        ) {
            let geo = g(4096, 4096);
            let top = i64::MAX as u64;
            let start = top - back;
            let end = start.saturating_add(len).min(top);
            let n = geo.segments(start, end).count() as u64;
            prop_assert!((1..=4).contains(&n));
        }
    }
}
