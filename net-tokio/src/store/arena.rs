//! A disk arena: one preallocated file split into equal slots, with an in-memory index, an LRU list
//! and a free list, so put, get, has and delete are O(1) and nothing fragments (store.md §2).
//!
//! File layout: a 64-byte superblock (magic, format, class, geometry, checksum), a table of one
//! 64-byte header per slot, then the slots themselves from the next 4 KiB boundary. The headers
//! are written only under [`WarmStart::Verify`]; under [`WarmStart::Cold`] the file is truncated on
//! open and the table stays zero.
//!
//! Publication order: a slot is taken off the index and the LRU list before its bytes are
//! overwritten, and its new key enters the index only after the data and header writes succeeded,
//! so within a process a reused slot is never readable under its old key and a half-written slot is
//! never readable at all. Across a crash, a Verify open keeps only slots whose header (with its own
//! checksum) names a key and whose data match the header's checksum ([`slot_checksum`]). The
//! header is zeroed before a slot is rewritten, so even with the OS reordering the writes the old
//! key's header can only survive next to new bytes that then fail the checksum.
//!
//! Reads outside the lock ([`Arena::begin_read`]) pin their slot; an insert takes only a slot no
//! read pins, so a slot's bytes never change under a read, even one whose key was dropped or
//! evicted after it began.
//!
//! A window read whose pages the page cache holds is answered from the file's read-only mapping
//! ([`SlotRead::try_map`]): the `Bytes` point into the page cache and own the slot's pin, so the
//! slot is not rewritten until the last of them is dropped. At most a [`MAPPED_SHARE`]th of the
//! slots is held so at once; past that, and for whole blocks unless the store has no RAM tier
//! ([`Arena::map_whole_blocks`]), reads copy.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use dart_core::hash::{fnv1a64, BlockKey, ChunkKey, Fnv1a};

use super::io::StoreIo;
use super::lru::SlotList;
use super::tiered::lock;
use super::{StoreError, WarmStart};
use crate::mapped::Mapping;
use dart_core::bufpool::Buf;

/// Superblock magic: "DARTARN1".
const SUPER_MAGIC: u64 = u64::from_le_bytes(*b"DARTARN1");
/// Slot header magic: "DARTSLT1".
const SLOT_MAGIC: u64 = u64::from_le_bytes(*b"DARTSLT1");
/// On-disk format version, part of the superblock.
/// 2: slot checksums over the bytes' XXH3-128 digest ([`slot_checksum`]); 1 hashed the bytes with
/// FNV-1a. An arena of another format fails the superblock check and is rebuilt empty.
const FORMAT_VERSION: u64 = 2;
/// Bytes reserved for the superblock at offset 0.
pub(crate) const SUPERBLOCK_BYTES: u64 = 64;
/// Bytes of one slot header in the table after the superblock.
pub(crate) const HEADER_BYTES: u64 = 64;
/// Slot data start on this boundary.
const DATA_ALIGN: u64 = 4096;
/// A header as it is before any write and after an invalidation.
const ZERO_HEADER: [u8; HEADER_BYTES as usize] = [0; HEADER_BYTES as usize];

/// The byte layout of an arena file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    /// Slot size.
    pub(crate) block_bytes: u64,
    /// Slot count.
    pub(crate) slots: u32,
    /// Offset of slot 0's data.
    pub(crate) data_start: u64,
    /// Exact file length.
    pub(crate) file_len: u64,
}

impl Layout {
    pub(crate) fn new(block_bytes: u64, slots: u32) -> Self {
        let table_end = SUPERBLOCK_BYTES + u64::from(slots) * HEADER_BYTES;
        let data_start = table_end.div_ceil(DATA_ALIGN) * DATA_ALIGN;
        let file_len = data_start + u64::from(slots) * block_bytes;
        Layout { block_bytes, slots, data_start, file_len }
    }

    /// File offset of `slot`'s header.
    pub(crate) fn header_offset(&self, slot: u32) -> u64 {
        SUPERBLOCK_BYTES + u64::from(slot) * HEADER_BYTES
    }

    /// File offset of `slot`'s data.
    pub(crate) fn data_offset(&self, slot: u32) -> u64 {
        self.data_start + u64::from(slot) * self.block_bytes
    }
}

/// The checksum a slot header carries: FNV-1a 64 over the key, the length and the bytes' XXH3-128
/// digest ([`dart_core::integrity::xxh3_128`], the block digest peers check). Not FNV-1a over the
/// bytes themselves: that hashes one byte at a time, about 1.3 CPU-seconds per GiB written, where
/// XXH3 runs at memory speed (format 1 did; its arenas are rebuilt on open).
pub(crate) fn slot_checksum(key: &BlockKey, data: &[u8]) -> u64 {
    checksum_of_digest(key, data.len() as u64, dart_core::integrity::xxh3_128(data))
}

/// [`slot_checksum`] of `len` bytes whose digest is `digest`.
pub(crate) fn checksum_of_digest(
    key: &BlockKey,
    len: u64,
    digest: dart_core::integrity::BlockDigest,
) -> u64 {
    let mut h = Fnv1a::default();
    h.write(&key.chunk.0.to_le_bytes());
    h.write(&key.block.to_le_bytes());
    h.write(&len.to_le_bytes());
    h.write(&digest.0.to_le_bytes());
    h.finish()
}

/// Encodes `words` little-endian followed by FNV-1a 64 of them, zero-padded to 64 bytes.
fn encode_words(words: [u64; 6]) -> [u8; 64] {
    let mut out = [0u8; 64];
    for (i, w) in words.iter().enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    let sum = fnv1a64(&out[..48]);
    out[48..56].copy_from_slice(&sum.to_le_bytes());
    out
}

/// Decodes what [`encode_words`] wrote; `None` if the checksum or the padding is off.
fn decode_words(buf: &[u8]) -> Option<[u64; 6]> {
    assert_eq!(buf.len(), 64);
    let word = |i: usize| u64::from_le_bytes(buf[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
    let intact = word(6) == fnv1a64(&buf[..48]) && word(7) == 0;
    intact.then(|| [word(0), word(1), word(2), word(3), word(4), word(5)])
}

/// A slot header: which key the slot holds, how long it is, when it was written, and its checksum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SlotHeader {
    key: BlockKey,
    len: u64,
    /// Write sequence number: restores the recency order on a warm start.
    seq: u64,
    data_sum: u64,
}

impl SlotHeader {
    fn encode(&self) -> [u8; 64] {
        let k = self.key;
        encode_words([SLOT_MAGIC, k.chunk.0, k.block, self.len, self.seq, self.data_sum])
    }

    /// `Ok(None)` for a never-written or invalidated header, `Err(())` for a torn or foreign one.
    fn decode(buf: &[u8]) -> Result<Option<SlotHeader>, ()> {
        if buf.iter().all(|&b| b == 0) {
            return Ok(None);
        }
        match decode_words(buf) {
            Some([SLOT_MAGIC, chunk, block, len, seq, data_sum]) => {
                let key = BlockKey { chunk: ChunkKey(chunk), block };
                Ok(Some(SlotHeader { key, len, seq, data_sum }))
            }
            _ => Err(()),
        }
    }
}

/// How a warm open went.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LoadReport {
    /// Slots whose header and checksum verified.
    pub(crate) kept: u32,
    /// Slots with a torn header, bad checksum or duplicate key, now free.
    pub(crate) dropped: u32,
    /// Whether the file was truncated (cold start, missing or foreign file, geometry change).
    pub(crate) rebuilt: bool,
}

/// Bookkeeping of one slot.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    /// The key and length the slot serves, once published.
    live: Option<(BlockKey, u64)>,
    /// Whether the header on disk may be non-zero (must be zeroed before the slot is rewritten).
    header_on_disk: bool,
}

/// At most `slots / MAPPED_SHARE` slots are pinned by mapped answers ([`SlotRead::try_map`]) at
/// once, none in an arena of fewer slots: a pinned slot is never reused, and a client that reads
/// slowly holds its answer's pin until its socket takes the bytes, so the share bounds what slow
/// clients can keep from new blocks. Reads past the share copy, as without a mapping.
pub(crate) const MAPPED_SHARE: u32 = 4;

/// How an arena's reads of block bytes went, since open (`dart_store_disk_reads_total`).
#[derive(Debug, Default)]
pub(crate) struct ReadCounts {
    /// Answered from the file's mapping, no copy ([`SlotRead::try_map`]).
    pub(crate) mapped: AtomicU64,
    /// Copied from the page cache without waiting for the disk ([`Arena::read_cached`]).
    pub(crate) page_cache: AtomicU64,
    /// Read the way that may wait for the disk ([`SlotRead::read`], on the blocking pool).
    pub(crate) blocking: AtomicU64,
}

/// An arena file's read-only mapping and its mapped answers out.
#[derive(Debug)]
struct Mapped {
    mapping: Mapping,
    /// Mapped answers alive now (each pins its slot).
    out: AtomicU32,
    /// The most `out` may reach.
    cap: u32,
    /// Windows found resident lately, so that a hot window is not checked at every answer.
    recent: Mutex<Recent>,
}

impl Mapped {
    fn new(mapping: Mapping, cap: u32) -> Mapped {
        Mapped { mapping, out: AtomicU32::new(0), cap, recent: Mutex::new(Recent::default()) }
    }

    /// Whether every page of the file's `offset..offset + len` is in the page cache: known from a
    /// check of a window covering it at most [`RESIDENT_FOR`] before `now`, else checked now
    /// (`mincore`) and, if so, remembered.
    fn resident(&self, offset: u64, len: u64, now: Instant) -> bool {
        if lock(&self.recent).covers(offset, len, now) {
            return true;
        }
        let resident = self.mapping.resident(offset, len);
        if resident {
            lock(&self.recent).remember(offset, len, now);
        }
        resident
    }
}

/// How long a window found resident is taken to stay so ([`Recent`]).
pub(crate) const RESIDENT_FOR: Duration = Duration::from_millis(10);

/// The last [`Recent::WINDOWS`] windows of an arena file found resident, with when. The residency
/// check before a mapped answer keeps the answer's bytes from waiting for the disk on an async
/// worker, and shortens the time in which a page evicted and failing to read back would fault a
/// reader in user space (`crate::mapped`); taking a check [`RESIDENT_FOR`] old as still true
/// widens that time by at most that much, and spares a hot window (one range read by many
/// clients) a system call per answer, made under the node's lock. A slot's windows are forgotten
/// before the slot is rewritten ([`Arena::begin_insert`]): a direct write drops the old bytes'
/// pages.
#[derive(Debug, Default)]
struct Recent {
    /// `(offset, len, when)`, replaced in turn (a window found again renews its entry).
    windows: [Option<(u64, u64, Instant)>; Recent::WINDOWS],
    next: usize,
}

impl Recent {
    const WINDOWS: usize = 8;

    /// Whether a window found resident at most [`RESIDENT_FOR`] before `now` covers
    /// `offset..offset + len`.
    fn covers(&self, offset: u64, len: u64, now: Instant) -> bool {
        self.windows.iter().flatten().any(|&(at, n, when)| {
            at <= offset
                && offset + len <= at + n
                && now.saturating_duration_since(when) <= RESIDENT_FOR
        })
    }

    /// Notes `offset..offset + len` found resident at `now`.
    fn remember(&mut self, offset: u64, len: u64, now: Instant) {
        if let Some(same) =
            self.windows.iter_mut().flatten().find(|(at, n, _)| (*at, *n) == (offset, len))
        {
            same.2 = now;
            return;
        }
        self.windows[self.next] = Some((offset, len, now));
        self.next = (self.next + 1) % Self::WINDOWS;
    }

    /// Forgets every window that overlaps `offset..offset + len`.
    fn forget(&mut self, offset: u64, len: u64) {
        for window in &mut self.windows {
            if window.is_some_and(|(at, n, _)| at < offset + len && offset < at + n) {
                *window = None;
            }
        }
    }
}

/// The owner of a mapped answer's bytes: its pinned read, and the mapping.
struct MappedWindow {
    read: SlotRead,
    mapped: Arc<Mapped>,
}

impl AsRef<[u8]> for MappedWindow {
    fn as_ref(&self) -> &[u8] {
        // Pinned: the slot's bytes do not change while this lives (`crate::mapped`'s contract).
        self.mapped.mapping.slice(self.read.offset, self.read.len)
    }
}

impl Drop for MappedWindow {
    fn drop(&mut self) {
        self.mapped.out.fetch_sub(1, Ordering::Relaxed);
        // `read`'s own drop then releases the pin.
    }
}

/// A slot's bytes, to be read outside the arena's lock ([`Arena::begin_read`]). While it lives
/// the slot is pinned: no insert takes it (a pinned slot on the free list or at the end of the LRU
/// list is passed over), so the bytes read are the ones published under the key when it was
/// made, even if the key is evicted or dropped meanwhile.
#[derive(Debug)]
pub(crate) struct SlotRead {
    path: Arc<Path>,
    file: Arc<File>,
    io: Arc<dyn StoreIo>,
    pins: Arc<[AtomicU32]>,
    slot: u32,
    offset: u64,
    len: u64,
    /// The file's mapping, for a window read ([`SlotRead::try_map`]); `None` when the file is not
    /// mapped, and for a whole block when a RAM tier may keep it ([`Arena::map_whole_blocks`]).
    mapped: Option<Arc<Mapped>>,
    reads: Arc<ReadCounts>,
}

impl SlotRead {
    /// The pinned slot.
    pub(crate) fn slot(&self) -> u32 {
        self.slot
    }

    /// Reads the bytes, waiting for the disk if need be.
    pub(crate) fn read(&self) -> Result<Bytes, StoreError> {
        let mut buf = Buf::take(self.len as usize);
        self.io
            .read_exact_at(&self.file, buf.as_mut_slice(), self.offset)
            .map_err(io_error(&self.path))?;
        self.reads.blocking.fetch_add(1, Ordering::Relaxed);
        Ok(buf.freeze())
    }

    /// The bytes without a copy, pointing into the file's mapping: when this reads a window (or a
    /// whole block of an arena that maps them), the file is mapped, fewer than the arena's cap of
    /// mapped answers are out ([`MAPPED_SHARE`]) and the page cache holds every page (`mincore`).
    /// Else the read itself comes back, for [`SlotRead::read`]. The answer keeps the slot pinned
    /// until it and every clone and slice of it are dropped.
    pub(crate) fn try_map(self) -> Result<Bytes, SlotRead> {
        let Some(mapped) = self.mapped.clone() else {
            return Err(self);
        };
        if mapped.out.fetch_add(1, Ordering::Relaxed) >= mapped.cap
            || !mapped.resident(self.offset, self.len, Instant::now())
        {
            mapped.out.fetch_sub(1, Ordering::Relaxed);
            return Err(self);
        }
        self.reads.mapped.fetch_add(1, Ordering::Relaxed);
        Ok(Bytes::from_owner(MappedWindow { read: self, mapped }))
    }
}

impl Drop for SlotRead {
    fn drop(&mut self) {
        // Release: the read is over before an insert that sees the pin gone (Acquire) writes.
        self.pins[self.slot as usize].fetch_sub(1, Ordering::Release);
    }
}

/// The unit of an `O_DIRECT` write: its buffer's address, file offset and length are multiples of
/// it (the page size; a file system's logical block is at most that on the disks we meet).
const DIRECT_ALIGN: u64 = 4096;

/// An arena's block writer (behind [`Arena::writer`]): the arena file opened a second time with
/// `O_DIRECT`, when the file system allows it.
///
/// Why around the page cache: a block written through it costs the writer a copy into new
/// page-cache pages, each zeroed first, and the kernel's dirty-page accounting, the larger part
/// of a cold read's CPU on our machines (docs/benchmarks.md, "Cold reads write around the page
/// cache"); a direct write costs at most a copy into an aligned buffer and the device's transfer.
/// Reads still go through the page cache (`pread`, the mapping): the kernel writes back and then
/// drops any cached page of the range around a direct write, so a later read sees the new bytes,
/// and no read of the slot runs during its write (the slot is reserved, [`Arena::begin_insert`]).
/// Headers and the superblock stay buffered: they lie before `data_start`, on pages of their own.
///
/// Bytes that start on the alignment and fill whole units (a block gathered into a pooled
/// buffer, `dart_core::bufpool::ALIGN`) are written as they are; others (a block that came in one
/// piece, an object's last block) are copied into a pooled buffer for the write, which goes back
/// to the pool after it (below the pool's smallest class, into an aligned buffer of their own,
/// `Buf::take_aligned`). A block shorter than its slot is written padded with zeros to the
/// alignment; the slot's header and index keep its true length. A direct write the kernel
/// refuses as invalid (`EINVAL`: an alignment this file system does not take) is written again
/// through the page cache, and the arena writes buffered from then on. The handle is closed when the arena is dropped, not at
/// [`Arena::close`] (a write in progress may still hold the writer).
#[derive(Debug, Default)]
pub(crate) struct Writer {
    /// The `O_DIRECT` handle; `None`: every write goes through the page cache.
    direct: Option<File>,
    /// Direct writes made from the caller's bytes, which were aligned already: no copy (tests
    /// check that a pooled block takes this path).
    #[cfg(test)]
    aligned_as_is: u64,
}

impl Writer {
    /// Writes `data` at `offset` of the arena file (`file`, buffered), directly if it can.
    fn write_data(
        &mut self,
        io: &dyn StoreIo,
        file: &File,
        data: &[u8],
        offset: u64,
    ) -> io::Result<()> {
        if let Some(direct) = self.direct.as_ref().filter(|_| offset.is_multiple_of(DIRECT_ALIGN)) {
            let align = DIRECT_ALIGN as usize;
            let mut copy;
            let out = if data.as_ptr().align_offset(align) == 0 && data.len().is_multiple_of(align)
            {
                // A whole block gathered into a pooled buffer (`dart_core::bufpool::ALIGN`).
                #[cfg(test)]
                {
                    self.aligned_as_is += 1;
                }
                data
            } else {
                let padded = data.len().div_ceil(align) * align;
                copy = Buf::take_aligned(padded);
                let out = copy.as_mut_slice();
                out[..data.len()].copy_from_slice(data);
                out[data.len()..].fill(0);
                out
            };
            match io.write_all_at(direct, out, offset) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    tracing::warn!(
                        error = %e,
                        "O_DIRECT write refused: block data written through the page cache now"
                    );
                    self.direct = None;
                }
                done => return done,
            }
        }
        io.write_all_at(file, data, offset)
    }
}

/// A block's write into a slot reserved for it ([`Arena::begin_insert`]), done outside the arena's
/// lock: the slot is neither free nor published while it runs, so no read and no other insert
/// touches it; [`Arena::finish_insert`] publishes it (or frees it) under the lock again.
#[derive(Debug)]
pub(crate) struct SlotWrite {
    path: Arc<Path>,
    file: Arc<File>,
    io: Arc<dyn StoreIo>,
    /// The arena's [`Arena::writer`]: held for the whole write.
    writer: Arc<Mutex<Writer>>,
    slot: u32,
    data_offset: u64,
    header_offset: u64,
    /// Whether the slot's old header must be zeroed before its bytes are overwritten.
    zero_header: bool,
    /// The new header, when headers are kept.
    header: Option<[u8; HEADER_BYTES as usize]>,
}

impl SlotWrite {
    /// Invalidates the slot's old header if needed, writes `data`, then the new header.
    pub(crate) fn write(&self, data: &[u8]) -> Result<(), StoreError> {
        let fail = || io_error(&self.path);
        let mut writer = lock(&self.writer);
        if self.zero_header {
            self.io.write_all_at(&self.file, &ZERO_HEADER, self.header_offset).map_err(fail())?;
        }
        writer.write_data(&*self.io, &self.file, data, self.data_offset).map_err(fail())?;
        if let Some(header) = &self.header {
            self.io.write_all_at(&self.file, header, self.header_offset).map_err(fail())?;
        }
        Ok(())
    }
}

/// One budget's arena file and index.
#[derive(Debug)]
pub(crate) struct Arena {
    path: Arc<Path>,
    /// `None` once closed.
    file: Option<Arc<File>>,
    /// Per slot, how many [`SlotRead`]s are reading it outside the lock (raised under the lock,
    /// lowered without it).
    pins: Arc<[AtomicU32]>,
    /// Every positional read and write of `file` goes through it.
    io: Arc<dyn StoreIo>,
    /// Held by the block write in progress ([`SlotWrite::write`]), so that the arena's file sees
    /// one at a time: the file system serializes buffered writes of one file anyway (the inode's
    /// lock), and a writer that waits there spins on a CPU (4-6 % of a node's CPU during cold
    /// reads, measured); one that waits here sleeps. A leaf lock, taken with no other held. It
    /// owns the file's `O_DIRECT` handle ([`Writer`]).
    writer: Arc<Mutex<Writer>>,
    layout: Layout,
    /// Superblock tag that keeps the owned and borrowed files from being swapped.
    class_tag: u64,
    /// Whether slot headers are kept (warm start `Verify`).
    verify: bool,
    index: HashMap<BlockKey, u32>,
    /// `index`'s keys, shared with look-ups that must not wait for this arena's lock (any operation
    /// of the arena holds it): see [`Arena::published`].
    published: Arc<Mutex<HashSet<BlockKey>>>,
    slots: Vec<Slot>,
    /// Keys whose bytes are being written outside the lock, with their reserved slot (on no list).
    writing: HashMap<BlockKey, u32>,
    /// Slots reserved by [`Arena::begin_insert`] whose [`Arena::finish_insert`] has not come: the
    /// slots of `writing`, and of writes whose key was removed meanwhile.
    reserved: usize,
    lru: SlotList,
    /// Free slots; popped from the end, so the lowest slot is used first.
    free: Vec<u32>,
    next_seq: u64,
    /// The block digests (`dart_core::integrity`) of the slots the last warm open kept, hashed
    /// from the bytes that passed their checksum.
    loaded_digests: Vec<(BlockKey, dart_core::integrity::BlockDigest)>,
    /// The file's read-only mapping once opened, if `io` maps ([`StoreIo::map`]); `None` once
    /// closed (mapped answers still out keep it alive).
    mapped: Option<Arc<Mapped>>,
    /// Whether whole-block reads are mapped too ([`Arena::map_whole_blocks`]).
    map_whole: bool,
    reads: Arc<ReadCounts>,
}

fn io_error(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |cause| StoreError::Io { path: path.to_owned(), cause }
}

impl Arena {
    /// Opens or creates the arena file at `path`, sized exactly for `slots` slots of
    /// `block_bytes`, cold (truncated, empty) or warm (verified slots kept); its reads and writes
    /// go through `io`, block data around the page cache if `direct` and `io` opens the file so
    /// ([`StoreIo::open_direct`]; never asked when `direct` is off).
    pub(crate) fn open(
        path: PathBuf,
        class_tag: u64,
        block_bytes: u64,
        slots: u32,
        warm: WarmStart,
        direct: bool,
        io: Arc<dyn StoreIo>,
    ) -> Result<(Arena, LoadReport), StoreError> {
        assert!(block_bytes >= 1 && slots >= 1);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_error(&path))?;
        let mut arena = Arena {
            path: path.into(),
            file: Some(Arc::new(file)),
            pins: (0..slots).map(|_| AtomicU32::new(0)).collect(),
            io,
            writer: Arc::default(),
            layout: Layout::new(block_bytes, slots),
            class_tag,
            verify: warm == WarmStart::Verify,
            index: HashMap::with_capacity(slots as usize),
            published: Arc::default(),
            slots: vec![Slot::default(); slots as usize],
            writing: HashMap::new(),
            reserved: 0,
            lru: SlotList::new(slots),
            free: (0..slots).rev().collect(),
            next_seq: 1,
            loaded_digests: Vec::new(),
            mapped: None,
            map_whole: false,
            reads: Arc::default(),
        };
        let report = match warm {
            WarmStart::Cold => {
                arena.reset()?;
                LoadReport { rebuilt: true, ..LoadReport::default() }
            }
            WarmStart::Verify => arena.load()?,
        };
        // Opened only now: `reset` may have replaced the file.
        if direct && block_bytes.is_multiple_of(DIRECT_ALIGN) {
            lock(&arena.writer).direct = arena.io.open_direct(&arena.path);
        }
        // Mapped only now: the file has its final length, and is never truncated again while
        // this process has it open (`crate::mapped`'s contract).
        if let Some(file) = &arena.file {
            arena.mapped = arena
                .io
                .map(file, arena.layout.file_len)
                .map(|mapping| Arc::new(Mapped::new(mapping, slots / MAPPED_SHARE)));
        }
        arena.check_invariants();
        Ok((arena, report))
    }

    fn superblock(&self) -> [u8; 64] {
        let l = &self.layout;
        let geometry = [l.block_bytes, u64::from(l.slots), l.data_start];
        encode_words([
            SUPER_MAGIC,
            FORMAT_VERSION,
            self.class_tag,
            geometry[0],
            geometry[1],
            geometry[2],
        ])
    }

    /// Replaces the file with a new one of exactly the layout's length (sparse, all zero) and
    /// writes the superblock. A new file, not the old one truncated: a mapping of the old one
    /// that outlives its store in this process (an answer still being sent after the store
    /// closed) keeps the old file's pages and stays readable, where a truncation would turn its
    /// reads into `SIGBUS` (`crate::mapped`). If the old name cannot be removed, the file is
    /// truncated in place.
    fn reset(&mut self) -> Result<(), StoreError> {
        self.file.as_ref().ok_or(StoreError::Closed)?;
        let fail = io_error(&self.path);
        if std::fs::remove_file(&self.path).is_ok() {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&self.path)
                .map_err(io_error(&self.path))?;
            self.file = Some(Arc::new(file));
        }
        let file = self.file.as_ref().ok_or(StoreError::Closed)?;
        let result = file
            .set_len(0)
            .and_then(|()| file.set_len(self.layout.file_len))
            .and_then(|()| self.io.write_all_at(file, &self.superblock(), 0));
        result.map_err(fail)
    }

    /// Warm open: keeps the slots that verify, drops the rest; rebuilds empty on any geometry doubt.
    fn load(&mut self) -> Result<LoadReport, StoreError> {
        let file = self.file.as_ref().ok_or(StoreError::Closed)?;
        let len = file.metadata().map_err(io_error(&self.path))?.len();
        let mut superblock = [0u8; SUPERBLOCK_BYTES as usize];
        let same_geometry = len == self.layout.file_len
            && self.io.read_exact_at(file, &mut superblock, 0).is_ok()
            && superblock == self.superblock();
        if !same_geometry {
            self.reset()?;
            return Ok(LoadReport { rebuilt: true, ..LoadReport::default() });
        }
        let mut table = vec![0u8; (u64::from(self.layout.slots) * HEADER_BYTES) as usize];
        self.io.read_exact_at(file, &mut table, SUPERBLOCK_BYTES).map_err(io_error(&self.path))?;
        let mut report = LoadReport::default();
        let mut verified = Vec::new();
        let mut buf = Vec::new();
        for (slot, raw) in (0..self.layout.slots).zip(table.chunks_exact(HEADER_BYTES as usize)) {
            match SlotHeader::decode(raw) {
                Ok(None) => {}
                Ok(Some(header)) => match self.verify_slot(slot, &header, &mut buf) {
                    Some(digest) => verified.push((header.seq, slot, header, digest)),
                    None => report.dropped += 1,
                },
                Err(()) => report.dropped += 1,
            }
            self.slots[slot as usize].header_on_disk = raw.iter().any(|&b| b != 0);
        }
        // Oldest write first, so the newest ends up most recently used; a duplicate key (a crash
        // between a rewrite and an invalidation) keeps its newest copy.
        verified.sort_unstable_by_key(|&(seq, slot, ..)| (seq, slot));
        let mut digests = BTreeMap::new();
        for &(seq, slot, header, digest) in &verified {
            if let Some(&older) = self.index.get(&header.key) {
                self.unlink(older);
                report.dropped += 1;
                report.kept -= 1;
            }
            self.slots[slot as usize].live = Some((header.key, header.len));
            self.index.insert(header.key, slot);
            lock(&self.published).insert(header.key);
            self.lru.push_front(slot);
            self.next_seq = self.next_seq.max(seq + 1);
            digests.insert(header.key, digest);
            report.kept += 1;
        }
        self.loaded_digests = digests.into_iter().collect();
        self.free = (0..self.layout.slots)
            .rev()
            .filter(|&s| self.slots[s as usize].live.is_none())
            .collect();
        Ok(report)
    }

    /// The block digest of `slot`'s data if they match `header`.
    fn verify_slot(
        &self,
        slot: u32,
        header: &SlotHeader,
        buf: &mut Vec<u8>,
    ) -> Option<dart_core::integrity::BlockDigest> {
        if header.len == 0 || header.len > self.layout.block_bytes {
            return None;
        }
        let file = self.file.as_ref()?;
        buf.resize(header.len as usize, 0);
        match self.io.read_exact_at(file, buf, self.layout.data_offset(slot)) {
            Ok(()) => {
                // One pass over the bytes gives both the checksum and the block digest.
                let digest = dart_core::integrity::xxh3_128(buf);
                (checksum_of_digest(&header.key, header.len, digest) == header.data_sum)
                    .then_some(digest)
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), slot, error = %e, "dropping unreadable slot");
                None
            }
        }
    }

    /// The block digests of the slots the last warm open kept (empty after a cold one).
    pub(crate) fn loaded_digests(&self) -> Vec<(BlockKey, dart_core::integrity::BlockDigest)> {
        self.loaded_digests.clone()
    }

    /// Maps whole-block reads too, not only windows: for a store without a RAM tier, where no
    /// whole block is kept after its read (with one, a whole block read is promoted into it and
    /// would hold its slot's pin for as long as it stays there).
    pub(crate) fn map_whole_blocks(&mut self) {
        self.map_whole = true;
    }

    /// How this arena's reads went since open.
    pub(crate) fn read_counts(&self) -> Arc<ReadCounts> {
        self.reads.clone()
    }

    /// Number of published blocks.
    pub(crate) fn len(&self) -> usize {
        self.index.len()
    }

    /// Slot count.
    pub(crate) fn slots(&self) -> u32 {
        self.layout.slots
    }

    /// Whether an insert would evict: no free slot is left that no read pins.
    pub(crate) fn is_full(&self) -> bool {
        self.free.iter().all(|&slot| self.pinned(slot))
    }

    /// Whether an insert can take a slot now: a free one or a published one that no read pins
    /// (false only while reads pin every slot).
    pub(crate) fn has_room(&self) -> bool {
        !self.is_full() || self.victim().is_some()
    }

    /// The least recently used published slot that no read pins: the next eviction victim.
    fn victim(&self) -> Option<u32> {
        self.lru.iter_from_back().find(|&slot| !self.pinned(slot))
    }

    /// The set of published keys, kept equal to the index by every change of it (made under the
    /// arena's lock), and locked only for a set operation, never across I/O: whether a key is
    /// published can be asked without the arena's lock. During an insert the new
    /// key is absent until its bytes and header are written, and an evicted victim is absent
    /// from the moment the insert takes its slot, as in the index itself.
    pub(crate) fn published(&self) -> Arc<Mutex<HashSet<BlockKey>>> {
        self.published.clone()
    }

    /// Whether `key` is published, without touching recency.
    pub(crate) fn contains(&self, key: &BlockKey) -> bool {
        self.index.contains_key(key)
    }

    /// Refreshes `key`'s recency; returns whether it is published.
    pub(crate) fn touch(&mut self, key: &BlockKey) -> bool {
        match self.index.get(key) {
            Some(&slot) => {
                self.lru.touch(slot);
                true
            }
            None => false,
        }
    }

    /// The key of the next eviction victim: the least recently used one no read pins.
    pub(crate) fn lru_key(&self) -> Option<BlockKey> {
        let slot = self.victim()?;
        Some(self.slots[slot as usize].live.expect("linked slot is live").0)
    }

    /// Pins the slot of `key`'s block (the whole block, or `window` = `(start, len, block_len)`
    /// of a block held with exactly `block_len` bytes) for a read outside the lock, refreshing
    /// its recency if `touch`. `None` for a miss (a window that does not fit, a closed arena).
    pub(crate) fn begin_read(
        &mut self,
        key: &BlockKey,
        window: Option<(u64, u64, u64)>,
        touch: bool,
    ) -> Option<SlotRead> {
        let (slot, start, len) = self.span(key, window)?;
        let file = self.file.clone()?;
        // Raised under the lock, where inserts look at it.
        self.pins[slot as usize].fetch_add(1, Ordering::Relaxed);
        if touch {
            self.lru.touch(slot);
        }
        Some(SlotRead {
            path: self.path.clone(),
            file,
            io: self.io.clone(),
            pins: self.pins.clone(),
            slot,
            offset: self.layout.data_offset(slot) + start,
            len,
            mapped: self.mapped.clone().filter(|_| window.is_some() || self.map_whole),
            reads: self.reads.clone(),
        })
    }

    /// Whether a read outside the lock holds `slot`.
    fn pinned(&self, slot: u32) -> bool {
        self.pins[slot as usize].load(Ordering::Acquire) != 0
    }

    /// The slot holding `key` and the bytes (`start`, `len`) a read of the whole block, or of
    /// `window` = `(start, len, block_len)`, covers; `None` for a miss, and for a window of a
    /// block held with another length than `block_len` or reaching past its end.
    fn span(&self, key: &BlockKey, window: Option<(u64, u64, u64)>) -> Option<(u32, u64, u64)> {
        let &slot = self.index.get(key)?;
        let (_, held) = self.slots[slot as usize].live.expect("indexed slot is live");
        match window {
            None => Some((slot, 0, held)),
            Some((start, len, block_len)) => {
                let fits = held == block_len && start.saturating_add(len) <= block_len;
                fits.then_some((slot, start, len))
            }
        }
    }

    /// A read of `key`'s whole block or of `window` = `(start, len, block_len)`, touching
    /// recency, answered only from the page cache, under the lock (it cannot wait for the disk):
    /// `None` when the bytes are not all cached (or the read failed: the blocking read, pinned
    /// by [`Arena::begin_read`], then meets the error and reports it), `Some(None)` for a miss,
    /// `Some(Some(bytes))` for a hit.
    pub(crate) fn read_cached(
        &mut self,
        key: &BlockKey,
        window: Option<(u64, u64, u64)>,
    ) -> Option<Option<Bytes>> {
        let Some((slot, start, len)) = self.span(key, window) else {
            return Some(None);
        };
        if let Some(bytes) = self.read_mapped(key, window) {
            return Some(Some(bytes));
        }
        let file = self.file.as_ref()?;
        let mut buf = Buf::take(len as usize);
        let offset = self.layout.data_offset(slot) + start;
        if !self.io.read_cached_at(file, buf.as_mut_slice(), offset) {
            return None;
        }
        self.reads.page_cache.fetch_add(1, Ordering::Relaxed);
        self.lru.touch(slot);
        Some(Some(buf.freeze()))
    }

    /// `key`'s whole block or `window` = `(start, len, block_len)` of it from the file's mapping,
    /// touching recency ([`SlotRead::try_map`]: no copy, no wait for the disk); `None` when it
    /// cannot be answered so (a miss, a window that does not fit, no mapping or not for whole
    /// blocks, the share of mapped answers out, a page not in the page cache).
    pub(crate) fn read_mapped(
        &mut self,
        key: &BlockKey,
        window: Option<(u64, u64, u64)>,
    ) -> Option<Bytes> {
        self.mapped.as_ref()?;
        let read = self.begin_read(key, window, false)?;
        let slot = read.slot();
        let bytes = read.try_map().ok()?;
        self.lru.touch(slot);
        Some(bytes)
    }

    /// Reserves a slot no read pins for an absent `key` of `len` bytes ([`Arena::has_room`] must
    /// hold), evicting the least recently used such block if no free one is left; the bytes are
    /// then written outside the lock ([`SlotWrite::write`]) and published by
    /// [`Arena::finish_insert`]. Until then `key` is absent but [`Arena::touch_or_writing`].
    /// `data_sum` is [`slot_checksum`] of the bytes, required exactly when headers are kept.
    pub(crate) fn begin_insert(
        &mut self,
        key: BlockKey,
        len: u64,
        data_sum: Option<u64>,
    ) -> Result<SlotWrite, StoreError> {
        assert!(!self.index.contains_key(&key), "insert of a present key {key}");
        assert!(!self.writing.contains_key(&key), "insert of a key being written {key}");
        assert!(len >= 1 && len <= self.layout.block_bytes);
        assert_eq!(data_sum.is_some(), self.verify, "checksum given iff headers are kept");
        let file = self.file.clone().ok_or(StoreError::Closed)?;
        // The lowest free slot no read pins (the list is popped from its end), else the victim.
        let slot = match self.free.iter().rposition(|&slot| !self.pinned(slot)) {
            Some(at) => self.free.remove(at),
            None => {
                let victim = self.victim().expect("the caller checked has_room");
                self.unlink(victim);
                victim
            }
        };
        let header = data_sum.map(|data_sum| {
            let seq = self.next_seq;
            self.next_seq += 1;
            SlotHeader { key, len, seq, data_sum }.encode()
        });
        if let Some(mapped) = &self.mapped {
            // No read pins the slot, so no mapped answer notes its windows until it is published.
            lock(&mapped.recent).forget(self.layout.data_offset(slot), self.layout.block_bytes);
        }
        let state = &mut self.slots[slot as usize];
        debug_assert!(state.live.is_none());
        let zero_header = state.header_on_disk;
        // Until the write is known to be over, the header may be anything.
        state.header_on_disk = zero_header || header.is_some();
        self.writing.insert(key, slot);
        self.reserved += 1;
        Ok(SlotWrite {
            path: self.path.clone(),
            file,
            io: self.io.clone(),
            writer: self.writer.clone(),
            slot,
            data_offset: self.layout.data_offset(slot),
            header_offset: self.layout.header_offset(slot),
            zero_header,
            header,
        })
    }

    /// Ends the insert `write` of `key` (`len` bytes) begun by [`Arena::begin_insert`], whose
    /// write gave `written`: publishes `key` (`Ok(true)`), or, if the write failed, frees the slot
    /// and returns the error, or, if `key` was removed or the arena closed while it was written,
    /// frees the slot (invalidating the header it may have been given) and returns `Ok(false)`.
    pub(crate) fn finish_insert(
        &mut self,
        key: BlockKey,
        len: u64,
        write: SlotWrite,
        written: Result<(), StoreError>,
    ) -> Result<bool, StoreError> {
        let slot = write.slot;
        if self.file.is_none() {
            // Closed while written: the close forgot every slot, this one too.
            return Ok(false);
        }
        self.reserved -= 1;
        if self.writing.get(&key) != Some(&slot) {
            // Removed while written.
            let _ = self.invalidate_header(slot, &key);
            self.free.push(slot);
            return Ok(false);
        }
        self.writing.remove(&key);
        if let Err(e) = written {
            self.free.push(slot);
            return Err(e);
        }
        self.slots[slot as usize].header_on_disk = write.header.is_some();
        self.slots[slot as usize].live = Some((key, len));
        self.index.insert(key, slot);
        lock(&self.published).insert(key);
        self.lru.push_front(slot);
        Ok(true)
    }

    /// Whether `key` is published (its recency refreshed) or its bytes are being written: a put
    /// of it has nothing to write.
    pub(crate) fn touch_or_writing(&mut self, key: &BlockKey) -> bool {
        self.touch(key) || self.writing.contains_key(key)
    }

    /// Zeroes `slot`'s header if it may be non-zero; a failure is logged (the slot stays marked,
    /// so the next write into it zeroes it first).
    fn invalidate_header(&mut self, slot: u32, key: &BlockKey) -> Result<(), StoreError> {
        let state = &mut self.slots[slot as usize];
        let Some(file) = self.file.as_ref().filter(|_| state.header_on_disk) else {
            return Ok(());
        };
        match self.io.write_all_at(file, &ZERO_HEADER, self.layout.header_offset(slot)) {
            Ok(()) => {
                state.header_on_disk = false;
                Ok(())
            }
            Err(e) => {
                tracing::warn!(path = %self.path.display(), %key, error = %e, "header invalidation failed");
                Err(io_error(&self.path)(e))
            }
        }
    }

    /// Drops `key` and invalidates its header on disk. `None` if `key` was not published;
    /// `Some(Err(_))` if it was dropped but its header could not be zeroed (the slot still verifies
    /// as `key` with its true bytes, so the only cost is that a warm restart may bring it back).
    pub(crate) fn remove(&mut self, key: &BlockKey) -> Option<Result<(), StoreError>> {
        if self.writing.remove(key).is_some() {
            // Being written: `finish_insert` frees the slot instead of publishing it.
            return Some(Ok(()));
        }
        let &slot = self.index.get(key)?;
        self.unlink(slot);
        let result = self.invalidate_header(slot, key);
        self.free.push(slot);
        Some(result)
    }

    /// Whether the open file has lost its last name (its directory or the file was deleted).
    /// A closed arena, or one whose `fstat` fails, is not reported unlinked.
    pub(crate) fn is_unlinked(&self) -> bool {
        let links = self.file.as_ref().and_then(|f| f.metadata().ok()).map(|m| m.nlink());
        links == Some(0)
    }

    /// Published keys in slot order.
    pub(crate) fn keys(&self) -> Vec<BlockKey> {
        self.slots.iter().filter_map(|s| s.live.map(|(k, _)| k)).collect()
    }

    /// Releases the file and forgets the index; later operations see an empty, closed arena.
    pub(crate) fn close(&mut self) {
        self.file = None;
        self.mapped = None;
        self.index.clear();
        self.writing.clear();
        self.reserved = 0;
        lock(&self.published).clear();
        self.lru.clear();
        self.slots.iter_mut().for_each(|s| s.live = None);
        self.free = (0..self.layout.slots).rev().collect();
    }

    /// Takes a published slot off the index and the LRU list (it is on no list afterwards).
    fn unlink(&mut self, slot: u32) {
        let (key, _) = self.slots[slot as usize].live.take().expect("unlink of a live slot");
        self.index.remove(&key);
        lock(&self.published).remove(&key);
        self.lru.unlink(slot);
    }

    /// Whether block data is written around the page cache ([`Writer`]).
    pub(crate) fn writes_direct(&self) -> bool {
        lock(&self.writer).direct.is_some()
    }

    /// Direct writes made from the caller's bytes as they were ([`Writer`]).
    #[cfg(test)]
    pub(crate) fn direct_writes_as_is(&self) -> u64 {
        lock(&self.writer).aligned_as_is
    }

    /// Mapped answers out now ([`SlotRead::try_map`]).
    #[cfg(test)]
    pub(crate) fn mapped_out(&self) -> Option<u32> {
        self.mapped.as_ref().map(|m| m.out.load(Ordering::Relaxed))
    }

    /// The file layout.
    #[cfg(test)]
    pub(crate) fn layout(&self) -> Layout {
        self.layout
    }

    /// The slot `key` is published in.
    pub(crate) fn slot_of(&self, key: &BlockKey) -> Option<u32> {
        self.index.get(key).copied()
    }

    /// Asserts that index, slots, LRU list, free list and reserved slots partition the slots
    /// exactly.
    pub(crate) fn check_invariants(&self) {
        self.lru.check_invariants();
        assert_eq!(self.slots.len(), self.layout.slots as usize);
        assert_eq!(self.index.len(), self.lru.len());
        assert_eq!(self.index.len() + self.free.len() + self.reserved, self.slots.len());
        assert!(self.writing.len() <= self.reserved);
        for (key, &slot) in &self.writing {
            assert!(!self.index.contains_key(key), "{key} both published and being written");
            assert!(self.slots[slot as usize].live.is_none() && !self.lru.contains(slot));
            assert!(!self.free.contains(&slot), "slot {slot} both free and being written");
        }
        let published = lock(&self.published);
        assert_eq!(published.len(), self.index.len(), "published keys drifted from the index");
        assert!(published.iter().all(|k| self.index.contains_key(k)), "a stale published key");
        drop(published);
        for (key, &slot) in &self.index {
            let (live, len) = self.slots[slot as usize].live.expect("indexed slot is live");
            assert_eq!(live, *key);
            assert!(len >= 1 && len <= self.layout.block_bytes);
            assert!(self.lru.contains(slot));
        }
        let mut free = self.free.clone();
        free.sort_unstable();
        free.dedup();
        assert_eq!(free.len(), self.free.len(), "a slot is on the free list twice");
        assert!(free
            .iter()
            .all(|&s| self.slots[s as usize].live.is_none() && !self.lru.contains(s)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_found_resident_is_trusted_for_a_bounded_time_and_forgotten_when_overlapped() {
        let t0 = Instant::now();
        let mut recent = Recent::default();
        assert!(!recent.covers(0, 10, t0), "nothing known yet");
        recent.remember(100, 50, t0);
        assert!(recent.covers(100, 50, t0 + RESIDENT_FOR), "the same window, at the bound");
        assert!(recent.covers(120, 10, t0), "a window inside it");
        assert!(!recent.covers(90, 20, t0) && !recent.covers(140, 20, t0), "past either end");
        assert!(!recent.covers(100, 50, t0 + RESIDENT_FOR + Duration::from_nanos(1)), "too old");
        // Found again: the one entry is renewed, not a second one taken.
        recent.remember(100, 50, t0 + RESIDENT_FOR);
        assert!(recent.covers(100, 50, t0 + 2 * RESIDENT_FOR));
        assert_eq!(recent.windows.iter().flatten().count(), 1);
        // Entries are replaced in turn: the first is the next to go.
        for i in 0..Recent::WINDOWS as u64 {
            recent.remember(1000 * (i + 1), 10, t0);
        }
        assert!(!recent.covers(100, 50, t0), "replaced");
        assert!(recent.covers(1000, 10, t0) && recent.covers(8000, 10, t0));
        // Forgetting a range drops every window it touches, and no other.
        recent.forget(1005, 2000);
        assert!(!recent.covers(1000, 10, t0) && !recent.covers(2000, 10, t0));
        assert!(!recent.covers(3000, 10, t0), "overlaps at its first byte");
        assert!(recent.covers(4000, 10, t0));
    }

    #[test]
    fn a_rewritten_slot_is_checked_again_before_a_mapped_answer() {
        let dir = crate::store::tests::TestDir::new("arena-recent");
        std::fs::create_dir_all(dir.path()).expect("temp dir");
        let io: Arc<dyn StoreIo> = Arc::new(crate::store::OsIo);
        // Four slots: one mapped answer may be out (`MAPPED_SHARE`).
        let (mut arena, _) =
            Arena::open(dir.path().join("arena"), 9, 8192, 4, WarmStart::Cold, false, io)
                .expect("open");
        let put = |arena: &mut Arena, block: u64, byte: u8| {
            let key = BlockKey { chunk: ChunkKey(5), block };
            let write = arena.begin_insert(key, 8192, None).expect("begin");
            let written = write.write(&[byte; 8192]);
            assert!(matches!(arena.finish_insert(key, 8192, write, written), Ok(true)));
            key
        };
        let a = put(&mut arena, 0, 1);
        let slot = arena.slot_of(&a).expect("published");
        let offset = arena.layout().data_offset(slot);
        let window = Some((4096, 4096, 8192));
        let answer = arena.read_mapped(&a, window).expect("buffered writes leave the bytes cached");
        assert_eq!(&answer[..], &[1u8; 4096][..]);
        drop(answer);
        let mapped = arena.mapped.clone().expect("mapped");
        assert!(lock(&mapped.recent).covers(offset + 4096, 4096, Instant::now()), "remembered");
        // The slot is freed and taken again for another block: its windows are forgotten before
        // the new bytes are written.
        assert!(matches!(arena.remove(&a), Some(Ok(()))));
        let mut b = put(&mut arena, 1, 2);
        while arena.slot_of(&b) != Some(slot) {
            b = put(&mut arena, b.block + 1, 2);
        }
        assert!(!lock(&mapped.recent).covers(offset + 4096, 4096, Instant::now()), "forgotten");
        let answer = arena.read_mapped(&b, window).expect("cached");
        assert_eq!(&answer[..], &[2u8; 4096][..], "the new block's bytes");
    }

    #[test]
    fn slot_header_round_trips_and_a_torn_header_is_detected() {
        let key = BlockKey { chunk: ChunkKey(0xabc), block: 7 };
        let header = SlotHeader { key, len: 42, seq: 9, data_sum: 0x1234 };
        let raw = header.encode();
        assert_eq!(SlotHeader::decode(&raw), Ok(Some(header)));
        assert_eq!(SlotHeader::decode(&ZERO_HEADER), Ok(None));
        for i in 0..64 {
            let mut torn = raw;
            torn[i] ^= 0x01;
            assert_eq!(SlotHeader::decode(&torn), Err(()), "bit flip in byte {i}");
        }
        let mut half = raw;
        half[32..].fill(0);
        assert_eq!(SlotHeader::decode(&half), Err(()));
    }

    #[test]
    fn layout_aligns_slot_data_after_the_header_table() {
        let l = Layout::new(4 << 20, 52);
        assert_eq!(l.data_start, 4096);
        assert_eq!(l.file_len, 4096 + 52 * (4 << 20));
        assert_eq!(l.header_offset(1), 128);
        let l = Layout::new(16, 100);
        assert_eq!(l.data_start, 8192);
        assert_eq!(l.data_offset(2), 8192 + 32);
    }

    #[test]
    fn a_verify_open_keeps_its_own_format_and_rebuilds_an_arena_of_format_1() {
        use std::os::unix::fs::FileExt;
        let dir = crate::store::tests::TestDir::new("arena-format");
        std::fs::create_dir_all(dir.path()).expect("temp dir");
        let path = dir.path().join("arena");
        let key = BlockKey { chunk: ChunkKey(5), block: 1 };
        let data = vec![7u8; 3000];
        let open = || {
            let io: Arc<dyn StoreIo> = Arc::new(crate::store::OsIo);
            Arena::open(path.clone(), 9, 4096, 4, WarmStart::Verify, true, io).expect("open")
        };
        let (mut arena, report) = open();
        assert!(report.rebuilt, "a new file");
        let write = arena.begin_insert(key, 3000, Some(slot_checksum(&key, &data))).expect("begin");
        let written = write.write(&data);
        assert!(matches!(arena.finish_insert(key, 3000, write, written), Ok(true)));
        let superblock = arena.superblock();
        arena.close();
        let (mut arena, report) = open();
        assert_eq!((report.kept, report.rebuilt, arena.len()), (1, false, 1), "kept");
        arena.close();
        // The same file as format 1 wrote it (the slot checksum then hashed the bytes themselves):
        // the superblock names another format, so nothing is read as format 2.
        let words: Vec<u64> = superblock[..48]
            .chunks_exact(8)
            .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")))
            .collect();
        assert_eq!(words[1], FORMAT_VERSION);
        let old = encode_words([words[0], 1, words[2], words[3], words[4], words[5]]);
        let file = OpenOptions::new().write(true).open(&path).expect("reopen");
        file.write_all_at(&old, 0).expect("write the old superblock");
        let (arena, report) = open();
        assert_eq!((report.kept, report.rebuilt, arena.len()), (0, true, 0), "rebuilt empty");
    }

    #[test]
    fn slot_checksum_binds_key_length_and_bytes() {
        let a = BlockKey { chunk: ChunkKey(1), block: 2 };
        let b = BlockKey { chunk: ChunkKey(1), block: 3 };
        assert_ne!(slot_checksum(&a, b"xyz"), slot_checksum(&b, b"xyz"));
        assert_ne!(slot_checksum(&a, b"xyz"), slot_checksum(&a, b"xyz\0"));
        assert_ne!(slot_checksum(&a, b"xyz"), slot_checksum(&a, b"xzy"));
        assert_eq!(slot_checksum(&a, b"xyz"), slot_checksum(&a, b"xyz"));
        let digest = dart_core::integrity::xxh3_128(b"xyz");
        assert_eq!(checksum_of_digest(&a, 3, digest), slot_checksum(&a, b"xyz"));
    }
}
