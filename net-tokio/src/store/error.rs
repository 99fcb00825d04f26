//! The store's error type: start-up configuration errors and runtime I/O errors.

use std::io;
use std::path::PathBuf;

/// Everything that can go wrong opening or using a [`BlockStore`](super::BlockStore).
///
/// Configuration variants are returned by [`BlockStore::open`](super::BlockStore::open) before any
/// file is touched, so a bad flag never costs the previous instance its cache. A get miss and an
/// admission refusal are not errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The block (slot) size is 0 bytes.
    #[error("block size must be positive")]
    ZeroBlockSize,
    /// The block size is above [`MAX_BLOCK_BYTES`](super::MAX_BLOCK_BYTES).
    #[error("block size {block_bytes} B exceeds the maximum of {max} B")]
    BlockSizeTooLarge {
        /// The configured block size.
        block_bytes: u64,
        /// The largest accepted block size.
        max: u64,
    },
    /// The disk cache budget is 0 bytes.
    #[error("cache budget is 0 bytes; it must hold at least 2 blocks")]
    ZeroCacheBudget,
    /// The disk cache budget cannot hold a single block.
    #[error("cache budget {cache_bytes} B is smaller than one block of {block_bytes} B")]
    CacheSmallerThanBlock {
        /// The configured disk cache budget.
        cache_bytes: u64,
        /// The configured block size.
        block_bytes: u64,
    },
    /// The disk cache budget holds fewer than 2 slots (one owned and one borrowed are needed).
    #[error(
        "cache budget {cache_bytes} B holds {slots} slot(s) of {block_bytes} B; \
         at least 2 are needed (one owned, one borrowed)"
    )]
    TooFewSlots {
        /// The configured disk cache budget.
        cache_bytes: u64,
        /// The configured block size.
        block_bytes: u64,
        /// `cache_bytes / block_bytes`.
        slots: u64,
    },
    /// A budget has more slots than [`MAX_SLOTS`](super::MAX_SLOTS) (the index would not fit).
    #[error(
        "{tier} budget of {slots} slots exceeds the maximum of {max} slots; raise the block size"
    )]
    TooManySlots {
        /// `"cache"` or `"mem"`.
        tier: &'static str,
        /// The slot count the budget asked for.
        slots: u64,
        /// The largest accepted slot count.
        max: u64,
    },
    /// The owned fraction is not finite or not strictly between 0 and 1.
    #[error("owned fraction {0} must be finite and strictly between 0 and 1")]
    BadOwnedFraction(f64),
    /// The cache directory could not be created, or is not writable.
    #[error("cache directory {dir} cannot be created or written: {cause}")]
    Dir {
        /// The cache directory.
        dir: PathBuf,
        /// The underlying error, in the message (not also a `source`: a printed chain said it
        /// twice).
        cause: io::Error,
    },
    /// Another dart instance holds the lock on this cache directory.
    #[error(
        "cache directory {dir} is in use by another dart instance (lock {lock} is held); \
         give each instance its own cache directory"
    )]
    Locked {
        /// The cache directory.
        dir: PathBuf,
        /// The lock file.
        lock: PathBuf,
    },
    /// A read, write or resize of an arena file failed.
    #[error("I/O error on {path}: {cause}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error, in the message (as [`StoreError::Dir`]'s).
        cause: io::Error,
    },
    /// A put of a 0-byte block.
    #[error("refusing to store an empty block")]
    EmptyBlock,
    /// A put of a block larger than a slot.
    #[error("block of {len} B is larger than the {slot_bytes} B slot")]
    BlockTooLarge {
        /// The block's length.
        len: u64,
        /// The slot (block) size.
        slot_bytes: u64,
    },
    /// The store was closed.
    #[error("the block store is closed")]
    Closed,
}
