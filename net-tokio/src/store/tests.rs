//! Behaviour of the whole store: budgets, admission, RAM tier, locking and restarts.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dart_core::hash::{BlockKey, ChunkKey};

use super::tiered::{BORROWED_FILE, OWNED_FILE};
use super::*;

/// Slot size of the test stores.
pub(super) const BLOCK: u64 = 16;

/// A unique directory under the system temp dir, removed on drop.
pub(super) struct TestDir(PathBuf);

impl TestDir {
    pub(super) fn new(name: &str) -> TestDir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("dart-store-{name}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        TestDir(path)
    }

    pub(super) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

pub(super) fn key(i: u64) -> BlockKey {
    BlockKey { chunk: ChunkKey(0x00c0_ffee ^ (i / 4)), block: i }
}

/// `len` bytes that differ per `(i, salt)`.
pub(super) fn bytes(i: u64, salt: u8, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as u8).wrapping_mul(31) ^ salt ^ (j as u8)).collect()
}

/// A config with exactly `owned` + `borrowed` disk slots and `mem` RAM slots of [`BLOCK`] bytes.
pub(super) fn config(dir: &Path, owned: u64, borrowed: u64, mem: u64) -> StoreConfig {
    let slots = owned + borrowed;
    let mut config = StoreConfig::new(dir, slots * BLOCK, mem * BLOCK, BLOCK);
    config.owned_fraction = Some((owned as f64 + 0.5) / slots as f64);
    config
}

fn open(dir: &TestDir, owned: u64, borrowed: u64, mem: u64) -> BlockStore {
    let store = BlockStore::open(config(dir.path(), owned, borrowed, mem)).unwrap();
    let stats = store.stats();
    assert_eq!((stats.owned_slots, stats.borrowed_slots, stats.mem_slots), (owned, borrowed, mem));
    store
}

fn open_verify(dir: &TestDir, owned: u64, borrowed: u64) -> BlockStore {
    let mut config = config(dir.path(), owned, borrowed, 0);
    config.warm_start = WarmStart::Verify;
    BlockStore::open(config).unwrap()
}

fn put(store: &BlockStore, i: u64, class: BlockClass) -> bool {
    store.put(key(i), &bytes(i, 0, BLOCK as usize), class).unwrap()
}

fn assert_holds(store: &BlockStore, i: u64) {
    assert_eq!(store.get(&key(i)).as_deref(), Some(&bytes(i, 0, BLOCK as usize)[..]), "block {i}");
}

/// Overwrites `len` bytes at `offset` of `path`.
fn scribble(path: &Path, offset: u64, len: usize) {
    use std::os::unix::fs::FileExt;
    let file = fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(&vec![0xa5; len], offset).unwrap();
}

#[test]
fn get_returns_exactly_the_bytes_put_and_a_miss_is_none() {
    let dir = TestDir::new("roundtrip");
    for mem in [0, 4] {
        let store = open(&dir, 4, 2, mem);
        assert_eq!(store.get(&key(1)), None);
        assert!(put(&store, 1, BlockClass::Owned));
        assert!(put(&store, 2, BlockClass::Borrowed));
        assert_holds(&store, 1);
        assert_holds(&store, 2);
        assert_eq!(store.get(&key(3)), None);
        store.check_invariants();
        store.close();
    }
}

/// What `ask` answers while the test holds both arenas' locks (as any operation of an arena
/// holds its own): the answer must come at once (the bound is for that failure only).
fn answered_while_both_arenas_are_held<T: Send>(
    store: &BlockStore,
    ask: impl FnOnce() -> T + Send,
) -> T {
    let held = store.disk.hold();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::scope(|s| {
        s.spawn(move || tx.send(ask()).expect("the test waits for the answer"));
        let answer = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(held);
        answer.expect("answered while both arenas' locks are held")
    })
}

#[test]
fn a_look_up_under_the_nodes_lock_never_waits_for_a_disk_write() {
    // The driver asks `get_from_ram` under the node's lock: it must not wait for an arena's lock,
    // whoever holds it (here the test). Block 2 is in RAM and on disk, block 1 on disk only,
    // block 3 nowhere.
    let dir = TestDir::new("no-wait");
    let store = open(&dir, 2, 2, 1);
    assert!(put(&store, 1, BlockClass::Owned));
    assert!(put(&store, 2, BlockClass::Borrowed));
    assert!(store.in_ram(&key(2)) && !store.in_ram(&key(1)));
    let answers = answered_while_both_arenas_are_held(&store, || {
        (1..=3).map(|i| store.get_from_ram(&key(i)).map(|b| b.map(|b| b.len()))).collect::<Vec<_>>()
    });
    assert_eq!(answers, vec![None, Some(Some(BLOCK as usize)), Some(None)]);
    // Once the write is over the disk copy answers, and nothing drifted.
    assert_holds(&store, 1);
    store.check_invariants();
}

/// A disk read happens outside the arena's lock on a pinned slot: inserts pass a pinned slot over
/// (its block is not evicted, a freed one is not reused), so the read gets its key's bytes even
/// after the key was dropped; with every slot pinned a put caches nothing and the store stays
/// healthy; once the pins go, the slots are used again.
#[test]
fn a_slot_being_read_outside_the_lock_is_never_reused_under_the_read() {
    let dir = TestDir::new("pinned");
    let store = open(&dir, 2, 1, 0);
    let owned = BlockClass::Owned;
    assert!(put(&store, 1, owned));
    assert!(put(&store, 2, owned));
    // 1 is the least recently used block; a read pins it.
    let read1 = store.disk.pin(owned, &key(1)).expect("1 is held");
    assert!(put(&store, 3, owned), "3 takes the slot of 2, the LRU block no read pins");
    assert_eq!(store.get(&key(2)), None);
    assert_holds(&store, 1);
    store.delete(&key(1));
    assert!(put(&store, 4, owned), "4 passes over the freed but pinned slot of 1");
    assert_eq!(store.get(&key(3)), None, "and evicts 3 instead");
    assert_eq!(read1.read().unwrap(), Bytes::from(bytes(1, 0, BLOCK as usize)));
    // Both slots pinned: nothing to write into.
    let read4 = store.disk.pin(owned, &key(4)).expect("4 is held");
    assert!(!put(&store, 5, owned), "no slot to take");
    assert_eq!(store.get(&key(5)), None);
    assert_eq!(store.health().state, HealthState::Healthy);
    assert_eq!(read1.read().unwrap(), Bytes::from(bytes(1, 0, BLOCK as usize)));
    assert_eq!(read4.read().unwrap(), Bytes::from(bytes(4, 0, BLOCK as usize)));
    // The borrowed arena's one slot, pinned: its admission has no victim to weigh against.
    assert!(put(&store, 7, BlockClass::Borrowed));
    let read7 = store.disk.pin(BlockClass::Borrowed, &key(7)).expect("7 is held");
    assert!(!put(&store, 8, BlockClass::Borrowed), "no slot to take");
    assert_eq!(store.health().state, HealthState::Healthy);
    drop(read7);
    let slot1 = read1.slot();
    drop(read1);
    assert!(put(&store, 5, owned), "the slot of 1 is free again");
    assert_eq!(store.disk.with_arena(owned, |a| a.slot_of(&key(5))), Some(slot1));
    drop(read4);
    assert!(put(&store, 6, owned));
    assert_holds(&store, 5);
    assert_holds(&store, 6);
    store.check_invariants();
}

/// A window hit the page cache holds is answered from the arena file's mapping, and the answer owns
/// its slot's pin: deleting its key, evicting around it and putting the key again never change its
/// bytes, and its slot is reused only once the last slice of the answer is dropped.
#[test]
fn a_mapped_window_keeps_its_bytes_and_its_slot_until_its_last_slice_is_dropped() {
    let dir = TestDir::new("mapped");
    let store = open(&dir, 4, 1, 0);
    let owned = BlockClass::Owned;
    let mapped_out = || store.disk.with_arena(owned, |a| a.mapped_out());
    for i in [1, 2, 5, 6] {
        assert!(put(&store, i, owned));
    }
    let window = store.get_window(&key(1), 3, 5, BLOCK).expect("1 is held");
    assert_eq!(mapped_out(), Some(1), "answered from the mapping");
    assert_eq!(&window[..], &bytes(1, 0, BLOCK as usize)[3..8]);
    let slot1 = store.disk.with_arena(owned, |a| a.slot_of(&key(1))).expect("1 is held");
    let slice = window.slice(1..3);
    drop(window);
    assert_eq!(mapped_out(), Some(1), "a slice keeps the answer");
    store.delete(&key(1));
    assert!(put(&store, 3, owned), "3 passes over the pinned slot of 1 and evicts 2");
    assert_eq!(store.get(&key(2)), None);
    let other = bytes(1, 9, BLOCK as usize);
    assert!(store.put(key(1), &other, owned).unwrap(), "1 again, other bytes, evicting 5");
    assert_ne!(store.disk.with_arena(owned, |a| a.slot_of(&key(1))), Some(slot1));
    assert_eq!(&slice[..], &bytes(1, 0, BLOCK as usize)[4..6], "the answer's bytes held");
    assert_eq!(store.get_window(&key(1), 4, 2, BLOCK).as_deref(), Some(&other[4..6]));
    drop(slice);
    assert_eq!(mapped_out(), Some(0));
    assert!(put(&store, 4, owned), "the slot of 1 is free again");
    assert_eq!(store.disk.with_arena(owned, |a| a.slot_of(&key(4))), Some(slot1));
    assert_holds(&store, 4);
    store.check_invariants();
}

/// At most a [`arena::MAPPED_SHARE`]th of an arena's slots is pinned by mapped answers; reads past
/// it are copies. Without a RAM tier whole blocks are mapped as windows are, and the look-up under
/// the node's lock maps as the blocking read does. Every answer holds its own bytes.
#[test]
fn mapped_answers_stop_at_their_share() {
    let dir = TestDir::new("mapped-share");
    let store = open(&dir, 8, 1, 0);
    let owned = BlockClass::Owned;
    let mapped_out = || store.disk.with_arena(owned, |a| a.mapped_out());
    for i in 0..8 {
        assert!(put(&store, i, owned));
    }
    let whole = store.get(&key(0)).expect("0 is held");
    assert_eq!(mapped_out(), Some(1), "no RAM tier: a whole block is mapped");
    let windows: Vec<_> =
        (0..5).map(|i| store.get_window(&key(i), 0, BLOCK, BLOCK).expect("held")).collect();
    assert_eq!(mapped_out(), Some(8 / arena::MAPPED_SHARE), "the rest are copies");
    for (i, window) in (0..).zip(&windows) {
        assert_eq!(&window[..], &bytes(i, 0, BLOCK as usize)[..], "window of {i}");
    }
    drop(windows);
    assert_eq!(mapped_out(), Some(1));
    let now = store.get_window_now(&key(7), (2, 4, BLOCK)).expect("cached").expect("held");
    assert_eq!(mapped_out(), Some(2), "the look-up under the node's lock maps too");
    assert_eq!(&now[..], &bytes(7, 0, BLOCK as usize)[2..6]);
    let cached = store.get_cached(&key(6), None).expect("cached").expect("held");
    assert_eq!(mapped_out(), Some(2), "past the share: copied from the page cache");
    assert_eq!(&cached[..], &bytes(6, 0, BLOCK as usize)[..]);
    assert_eq!(&whole[..], &bytes(0, 0, BLOCK as usize)[..]);
    let stats = store.stats();
    let reads = (stats.disk_reads_mapped, stats.disk_reads_page_cache, stats.disk_reads_blocking);
    assert_eq!(reads, (3, 1, 4), "mapped: the whole block, a window, the look-up");
    drop((whole, now));
    assert_eq!(mapped_out(), Some(0));
    store.close();
    assert_eq!(mapped_out(), None, "closed: the arena lets go of its mapping");
}

/// With a RAM tier a whole block read from the disk is promoted into it and may stay there for
/// long, so it is a copy, never a mapped answer that would pin its slot meanwhile; windows map.
#[test]
fn with_a_ram_tier_whole_blocks_are_copies() {
    let dir = TestDir::new("mapped-ram");
    let store = open(&dir, 4, 1, 1);
    let owned = BlockClass::Owned;
    let mapped_out = || store.disk.with_arena(owned, |a| a.mapped_out());
    assert!(put(&store, 1, owned));
    assert!(put(&store, 2, owned), "2 takes the RAM tier's one slot");
    let whole = store.get(&key(1)).expect("1 is held");
    assert_eq!(mapped_out(), Some(0), "a copy");
    assert_eq!(&whole[..], &bytes(1, 0, BLOCK as usize)[..]);
    let cached = store.get_cached(&key(2), None);
    assert_eq!(cached.flatten().as_deref(), Some(&bytes(2, 0, BLOCK as usize)[..]));
    assert_eq!(mapped_out(), Some(0), "a copy too");
    let window = store.get_window(&key(2), 1, 2, BLOCK);
    assert_eq!(mapped_out(), Some(0), "2 is in RAM now: a slice of it");
    assert_eq!(window.as_deref(), Some(&bytes(2, 0, BLOCK as usize)[1..3]));
    let window = store.get_window(&key(1), 1, 2, BLOCK).expect("1 is held");
    assert_eq!(mapped_out(), Some(1), "1 left RAM: its window is mapped");
    assert_eq!(&window[..], &bytes(1, 0, BLOCK as usize)[1..3]);
}

/// A mapped answer may outlive its store (a response still being sent when the node closes it):
/// a cold open of the same directory afterwards makes new arena files instead of truncating the
/// old ones under the answer's mapping (a read past a truncated file's end is `SIGBUS`), so the
/// answer keeps its bytes, and the new store starts empty.
#[test]
fn an_answer_that_outlives_its_store_keeps_its_bytes_through_a_cold_reopen() {
    let dir = TestDir::new("mapped-reopen");
    let store = open(&dir, 8, 1, 0);
    assert!(put(&store, 1, BlockClass::Owned));
    let window = store.get_window(&key(1), 2, 9, BLOCK).expect("1 is held");
    assert_eq!(store.disk.with_arena(BlockClass::Owned, |a| a.mapped_out()), Some(1));
    store.close();
    drop(store);
    let reopened = open(&dir, 8, 1, 0);
    assert_eq!(reopened.get(&key(1)), None, "a cold open starts empty");
    assert!(put(&reopened, 2, BlockClass::Owned));
    assert_eq!(&window[..], &bytes(1, 0, BLOCK as usize)[2..11]);
    assert_holds(&reopened, 2);
}

/// Reads (whole blocks and windows) on two threads race puts that evict and deletes on a third:
/// every read answers its own key's bytes or nothing. The interleavings differ run to run; the
/// property holds in each (a regression shows as a wrong-bytes failure, maybe not every run).
#[test]
fn reads_racing_evictions_return_their_keys_bytes_or_nothing() {
    const KEYS: u64 = 12;
    const ROUNDS: u64 = 3000;
    let dir = TestDir::new("pinned-race");
    // Four slots per arena: one of them may be held by a mapped answer (`MAPPED_SHARE`).
    let store = open(&dir, 4, 4, 0);
    std::thread::scope(|s| {
        s.spawn(|| {
            for r in 0..ROUNDS {
                let i = r % KEYS;
                let class =
                    if i.is_multiple_of(2) { BlockClass::Owned } else { BlockClass::Borrowed };
                let _ = store.put(key(i), &bytes(i, 0, BLOCK as usize), class);
                if r % 7 == 0 {
                    store.delete(&key(r * 5 % KEYS));
                }
            }
        });
        for t in 0..2 {
            let store = &store;
            s.spawn(move || {
                for r in 0..ROUNDS {
                    let i = (r * 3 + t) % KEYS;
                    let want = bytes(i, 0, BLOCK as usize);
                    if let Some(got) = store.get(&key(i)) {
                        assert_eq!(&got[..], &want[..], "block {i}, round {r}");
                    }
                    if let Some(got) = store.get_window(&key(i), 3, 5, BLOCK) {
                        assert_eq!(&got[..], &want[3..8], "window of block {i}, round {r}");
                    }
                }
            });
        }
    });
    store.check_invariants();
    assert_eq!(store.health().state, HealthState::Healthy);
    for class in [BlockClass::Owned, BlockClass::Borrowed] {
        let out = store.disk.with_arena(class, |a| a.mapped_out());
        assert_eq!(out, Some(0), "mapped, and every mapped answer let go of its slot");
    }
}

/// A [`StoreIo`] whose block writes (at most [`BLOCK`] bytes: headers and the superblock are
/// larger) wait until the test opens the gate; it says when a write is waiting.
#[derive(Debug, Default)]
struct GatedIo {
    state: std::sync::Mutex<(bool, u32)>,
    changed: std::sync::Condvar,
    /// Whether block writes that pass the gate fail (EIO).
    fail: std::sync::atomic::AtomicBool,
}

impl GatedIo {
    fn close_gate(&self) {
        self.state.lock().unwrap().0 = true;
    }

    fn open_gate(&self) {
        self.state.lock().unwrap().0 = false;
        self.changed.notify_all();
    }

    /// Waits until `n` block writes are held at the gate.
    fn await_held(&self, n: u32) {
        let mut state = self.state.lock().unwrap();
        while state.1 < n {
            state = self.changed.wait(state).unwrap();
        }
    }
}

impl StoreIo for GatedIo {
    fn write_all_at(&self, file: &std::fs::File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        if buf.len() as u64 <= BLOCK {
            let mut state = self.state.lock().unwrap();
            state.1 += 1;
            self.changed.notify_all();
            while state.0 {
                state = self.changed.wait(state).unwrap();
            }
            state.1 -= 1;
            if self.fail.load(Ordering::Relaxed) {
                return Err(std::io::Error::from_raw_os_error(5));
            }
        }
        std::os::unix::fs::FileExt::write_all_at(file, buf, offset)
    }
}

/// A block's bytes are written outside its arena's lock: while a put's write is held, reads and
/// look-ups of the same arena go on, a second put of the same key is a refresh, a put into the
/// other arena writes meanwhile, and a delete of a key being written wins (the write is not
/// published). What the write held is published once it ends. (A second block write into the
/// same arena file waits for the first: `writes_into_one_arena_file_are_one_at_a_time`.)
#[test]
fn a_write_in_progress_holds_up_no_other_read_or_put_of_its_arena() {
    for verify in [false, true] {
        let dir = TestDir::new("write-outside");
        let io = Arc::new(GatedIo::default());
        let mut cfg = config(dir.path(), 4, 2, 0);
        cfg.warm_start = if verify { WarmStart::Verify } else { WarmStart::Cold };
        let store = BlockStore::open_with_io(cfg.clone(), io.clone()).unwrap();
        let owned = BlockClass::Owned;
        assert!(put(&store, 1, owned));
        io.close_gate();
        std::thread::scope(|s| {
            let writer = s.spawn(|| put(&store, 2, owned));
            io.await_held(1);
            // The arena's lock is free: these would wait for the write if it held the lock (the
            // bound is for that failure only; the gate opens so that the test ends).
            let (tx, rx) = std::sync::mpsc::channel();
            let store = &store;
            s.spawn(move || {
                let window = store.get_window(&key(1), 2, 3, BLOCK);
                let answers =
                    (store.get(&key(1)), window, store.get(&key(2)), put(store, 2, owned));
                tx.send(answers).expect("the test waits");
            });
            let answers =
                rx.recv_timeout(std::time::Duration::from_secs(10)).inspect_err(|_| io.open_gate());
            let (one, window, two, again) = answers.expect("reads and puts waited for a write");
            assert_eq!(one, Some(Bytes::from(bytes(1, 0, BLOCK as usize))));
            assert_eq!(window.as_deref(), Some(&bytes(1, 0, BLOCK as usize)[2..5]));
            assert_eq!(two, None, "not published before its write ends");
            assert!(!store.has(&key(2)));
            assert!(again, "a second put of a key being written is a refresh");
            let other = s.spawn(move || put(store, 3, BlockClass::Borrowed));
            io.await_held(2);
            store.delete(&key(3));
            io.open_gate();
            assert!(writer.join().unwrap());
            assert!(!other.join().unwrap(), "3 was deleted while it was written");
        });
        assert_holds(&store, 2);
        assert_eq!(store.get(&key(3)), None);
        store.check_invariants();
        // The slot 3 was written into is free again (the borrowed arena's two slots both take a
        // block), and (verify) its header does not bring 3 back on a warm restart.
        assert!(put(&store, 4, BlockClass::Borrowed) && put(&store, 5, BlockClass::Borrowed));
        store.check_invariants();
        store.close();
        drop(store);
        if verify {
            let store = BlockStore::open(cfg).unwrap();
            assert_eq!(store.get(&key(3)), None, "a deleted write stays deleted");
            for i in [1, 2, 4, 5] {
                assert_holds(&store, i);
            }
        }
    }
}

/// A [`StoreIo`] that counts the block writes in progress per file and keeps the most seen at once
/// (each write yields a few times while counted, so that writes that may overlap do).
#[derive(Debug, Default)]
struct OverlapIo {
    /// Per file descriptor: (in progress, most at once).
    writes: std::sync::Mutex<std::collections::HashMap<i32, (u32, u32)>>,
}

impl StoreIo for OverlapIo {
    fn write_all_at(&self, file: &std::fs::File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        let fd = file.as_raw_fd();
        let block = buf.len() as u64 <= BLOCK;
        if block {
            let mut writes = self.writes.lock().unwrap();
            let (now, most) = writes.entry(fd).or_default();
            *now += 1;
            *most = (*most).max(*now);
        }
        for _ in 0..20 {
            std::thread::yield_now();
        }
        let written = std::os::unix::fs::FileExt::write_all_at(file, buf, offset);
        if block {
            self.writes.lock().unwrap().get_mut(&fd).expect("counted above").0 -= 1;
        }
        written
    }
}

/// Block writes into one arena file are one at a time (the file system would serialize them
/// anyway, with the waiting writer spinning on a CPU): four threads putting into the owned arena
/// never have two writes of its file in progress at once. Fails with the arena's writer lock
/// taken out (two or more at once).
#[test]
fn writes_into_one_arena_file_are_one_at_a_time() {
    let dir = TestDir::new("one-writer");
    let io = Arc::new(OverlapIo::default());
    let store = BlockStore::open_with_io(config(dir.path(), 8, 2, 0), io.clone()).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let store = &store;
            s.spawn(move || {
                for i in 0..50 {
                    let k = 1 + t * 1000 + i;
                    store.put(key(k), &bytes(k, 0, BLOCK as usize), BlockClass::Owned).unwrap();
                }
            });
        }
    });
    let writes = io.writes.lock().unwrap();
    assert!(!writes.is_empty(), "block writes were counted");
    for (fd, (now, most)) in writes.iter() {
        assert_eq!((*now, *most), (0, 1), "file {fd}: (writes in progress, most at once)");
    }
    drop(writes);
    store.check_invariants();
}

/// A block write that fails counts against the disk's health even when its key was deleted while
/// it was written (the put then caches nothing either way), and frees its slot.
#[test]
fn a_failed_write_of_a_key_deleted_meanwhile_still_degrades_the_store() {
    let dir = TestDir::new("write-fails-deleted");
    let io = Arc::new(GatedIo::default());
    let store = BlockStore::open_with_io(config(dir.path(), 2, 1, 0), io.clone()).unwrap();
    io.close_gate();
    std::thread::scope(|s| {
        let writer = s.spawn(|| put(&store, 1, BlockClass::Owned));
        io.await_held(1);
        store.delete(&key(1));
        io.fail.store(true, Ordering::Relaxed);
        io.open_gate();
        assert!(!writer.join().unwrap());
    });
    assert!(matches!(store.health().state, HealthState::Degraded { .. }));
    assert_eq!(store.get(&key(1)), None);
    store.check_invariants();
}

#[test]
fn a_window_reads_just_its_bytes_and_only_of_a_block_of_the_stated_length() {
    let dir = TestDir::new("window");
    for mem in [0, 4] {
        let store = open(&dir, 4, 2, mem);
        assert!(put(&store, 1, BlockClass::Owned));
        assert!(put(&store, 2, BlockClass::Borrowed));
        let short = bytes(3, 0, BLOCK as usize - 3);
        assert!(store.put(key(3), &short, BlockClass::Owned).unwrap());
        for i in [1, 2] {
            let got = store.get_window(&key(i), 3, 5, BLOCK);
            assert_eq!(got.as_deref(), Some(&bytes(i, 0, BLOCK as usize)[3..8]), "mem {mem}");
        }
        assert_eq!(store.get_window(&key(3), 0, 4, BLOCK), None, "a wrong length is a miss");
        let tail = store.get_window(&key(3), 0, 4, BLOCK - 3);
        assert_eq!(tail.as_deref(), Some(&short[..4]));
        assert_eq!(store.get_window(&key(1), BLOCK - 1, 2, BLOCK), None, "past the block");
        assert_eq!(store.get_window(&key(9), 0, 1, BLOCK), None);
        store.check_invariants();
        store.close();
    }
}

#[test]
fn put_is_write_once_and_a_re_put_refreshes_recency() {
    let dir = TestDir::new("write-once");
    let store = open(&dir, 2, 1, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert!(store.put(key(1), b"other bytes", BlockClass::Owned).unwrap());
    put(&store, 3, BlockClass::Owned);
    assert_holds(&store, 1);
    assert!(!store.has(&key(2)), "2 became the LRU when 1 was re-put");
    store.check_invariants();
}

#[test]
fn write_once_holds_across_ram_and_both_budgets() {
    let dir = TestDir::new("write-once-tiers");
    let store = open(&dir, 2, 2, 2);
    put(&store, 1, BlockClass::Borrowed);
    assert!(store.put(key(1), b"other bytes, 16B", BlockClass::Owned).unwrap());
    store.put(key(1), b"short", BlockClass::Owned).unwrap();
    store.put(key(1), b"short", BlockClass::Borrowed).unwrap();
    assert_holds(&store, 1);
    // A RAM-only copy (disk copy deleted underneath) lends its bytes to the disk put.
    assert!(store.disk.remove(&key(1)));
    store.put(key(1), b"new", BlockClass::Owned).unwrap();
    let from_disk = store.disk.get(&key(1)).unwrap();
    assert_eq!(&from_disk[..], &bytes(1, 0, BLOCK as usize)[..]);
}

#[test]
fn empty_and_oversized_blocks_are_rejected() {
    let dir = TestDir::new("reject-size");
    let store = open(&dir, 2, 2, 2);
    assert!(matches!(store.put(key(1), b"", BlockClass::Owned), Err(StoreError::EmptyBlock)));
    let big = vec![1u8; BLOCK as usize + 1];
    let err = store.put(key(1), &big, BlockClass::Borrowed).unwrap_err();
    assert!(matches!(err, StoreError::BlockTooLarge { len: 17, slot_bytes: 16 }), "{err}");
    assert!(!store.has(&key(1)));
    assert!(store.put(key(1), &big[..BLOCK as usize], BlockClass::Owned).unwrap());
}

#[test]
fn a_tail_block_shorter_than_a_slot_is_returned_at_its_exact_length() {
    let dir = TestDir::new("tail");
    for mem in [0, 1] {
        let store = open(&dir, 1, 1, mem);
        put(&store, 1, BlockClass::Owned);
        // The tail reuses the full block's slot, whose old bytes are still on disk past 5.
        put(&store, 2, BlockClass::Owned);
        store.put(key(3), b"tail!", BlockClass::Owned).unwrap();
        assert_eq!(store.get(&key(3)).as_deref(), Some(&b"tail!"[..]));
        put(&store, 4, BlockClass::Borrowed);
        let from_disk = store.disk.get(&key(3)).unwrap();
        assert_eq!(&from_disk[..], b"tail!");
        store.close();
    }
}

#[test]
fn has_does_not_touch_recency() {
    let dir = TestDir::new("has");
    let store = open(&dir, 2, 1, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert!(store.has(&key(1)));
    put(&store, 3, BlockClass::Owned);
    assert!(!store.has(&key(1)), "has must not have refreshed 1");
    assert!(store.has(&key(2)) && store.has(&key(3)));
}

#[test]
fn get_refreshes_recency_so_the_least_recently_used_block_is_evicted() {
    let dir = TestDir::new("lru");
    let store = open(&dir, 2, 1, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert_holds(&store, 1);
    put(&store, 3, BlockClass::Owned);
    assert!(store.has(&key(1)) && !store.has(&key(2)));
}

#[test]
fn delete_removes_the_block_from_every_tier() {
    let dir = TestDir::new("delete");
    let store = open(&dir, 2, 2, 2);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Borrowed);
    assert!(store.in_ram(&key(1)));
    assert!(store.delete(&key(1)) && store.delete(&key(2)));
    assert!(!store.delete(&key(1)));
    assert!(!store.has(&key(1)) && store.get(&key(2)).is_none());
    assert_eq!(
        store.stats().owned_blocks + store.stats().borrowed_blocks + store.stats().mem_blocks,
        0
    );
    assert_eq!(store.len(), 0);
    store.check_invariants();
}

#[test]
fn close_is_idempotent_and_a_closed_store_is_empty_and_refuses_puts() {
    let dir = TestDir::new("close");
    let store = open(&dir, 2, 2, 2);
    put(&store, 1, BlockClass::Owned);
    store.close();
    store.close();
    assert!(store.get(&key(1)).is_none() && !store.has(&key(1)) && !store.delete(&key(1)));
    assert!(matches!(store.put(key(2), b"x", BlockClass::Owned), Err(StoreError::Closed)));
    assert_eq!(store.len(), 0);
    let stats = store.stats();
    assert_eq!((stats.owned_blocks, stats.borrowed_blocks, stats.mem_blocks), (0, 0, 0));
    store.check_invariants();
}

#[test]
fn owned_blocks_survive_any_amount_of_borrowed_churn() {
    let dir = TestDir::new("isolation-owned");
    let store = open(&dir, 4, 2, 0);
    for i in 0..4 {
        put(&store, i, BlockClass::Owned);
    }
    for i in 100..1100 {
        put(&store, i, BlockClass::Borrowed);
        store.get(&key(i));
        store.get(&key(i - 1));
        assert!(store.stats().borrowed_blocks <= 2);
    }
    for i in 0..4 {
        assert_holds(&store, i);
    }
    assert_eq!(store.stats().owned_blocks, 4);
    store.check_invariants();
}

#[test]
fn borrowed_blocks_survive_owned_churn() {
    let dir = TestDir::new("isolation-borrowed");
    let store = open(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Borrowed);
    put(&store, 2, BlockClass::Borrowed);
    for i in 100..200 {
        put(&store, i, BlockClass::Owned);
    }
    assert_holds(&store, 1);
    assert_holds(&store, 2);
    assert_eq!(store.stats().owned_blocks, 2);
}

#[test]
fn put_as_owned_drops_the_borrowed_copy() {
    let dir = TestDir::new("promote");
    let store = open(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Borrowed);
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Borrowed));
    assert!(store.put(key(1), b"different bytes", BlockClass::Owned).unwrap());
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Owned));
    let stats = store.stats();
    assert_eq!((stats.owned_blocks, stats.borrowed_blocks), (1, 0));
    assert_holds(&store, 1);
    store.check_invariants();
}

#[test]
fn borrowed_put_of_an_owned_key_keeps_it_owned_and_refreshes_its_recency() {
    let dir = TestDir::new("owned-refresh");
    let store = open(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert!(put(&store, 1, BlockClass::Borrowed));
    assert_eq!(store.stats().borrowed_blocks, 0);
    put(&store, 3, BlockClass::Owned);
    assert!(store.has(&key(1)) && !store.has(&key(2)), "1 was refreshed, 2 was the LRU");
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Owned));
    assert_eq!(store.disk.estimate(&key(1)), 0, "owned keys never reach the estimator");
}

#[test]
fn a_full_borrowed_arena_refuses_a_colder_candidate_and_counts_the_refusal() {
    let dir = TestDir::new("admission");
    let store = open(&dir, 1, 2, 0);
    put(&store, 1, BlockClass::Borrowed);
    put(&store, 2, BlockClass::Borrowed);
    for _ in 0..3 {
        store.get(&key(1));
        store.get(&key(2));
    }
    assert!(!put(&store, 3, BlockClass::Borrowed), "an unseen key is colder than the victim");
    assert!(!store.has(&key(3)));
    assert_eq!(store.stats().admit_rejected, 1);
    assert!(store.has(&key(1)) && store.has(&key(2)));
    // Repeated demand makes the candidate as popular as the victim: it gets in.
    // The victims stand at 4 (doorkeeper + 3 counted reads); each put of 3 counts as an access.
    assert_eq!(store.disk.estimate(&key(1)), 4);
    assert!(!put(&store, 3, BlockClass::Borrowed));
    assert!(!put(&store, 3, BlockClass::Borrowed));
    assert!(put(&store, 3, BlockClass::Borrowed));
    assert_eq!(store.stats().admit_rejected, 3);
    assert!(!store.has(&key(1)), "1 was the LRU victim");
    assert_eq!(store.stats().borrowed_blocks, 2);
}

#[test]
fn an_unseen_candidate_is_admitted_over_a_victim_that_was_never_read() {
    let dir = TestDir::new("admission-cold");
    let store = open(&dir, 1, 2, 0);
    put(&store, 1, BlockClass::Borrowed);
    put(&store, 2, BlockClass::Borrowed);
    assert!(put(&store, 3, BlockClass::Borrowed));
    assert!(!store.has(&key(1)) && store.has(&key(2)) && store.has(&key(3)));
    assert_eq!(store.stats().admit_rejected, 0);
}

#[test]
fn a_borrowed_put_feeds_the_estimator() {
    let dir = TestDir::new("insert-feeds");
    let store = open(&dir, 1, 2, 0);
    assert_eq!(store.disk.estimate(&key(1)), 0);
    put(&store, 1, BlockClass::Borrowed);
    assert_eq!(store.disk.estimate(&key(1)), 1);
    put(&store, 1, BlockClass::Borrowed);
    assert_eq!(store.disk.estimate(&key(1)), 2);
    // Borrowed misses count too.
    store.get(&key(7));
    assert_eq!(store.disk.estimate(&key(7)), 1);
}

#[test]
fn owned_traffic_does_not_decay_borrowed_estimates() {
    let dir = TestDir::new("owned-no-decay");
    let store = open(&dir, 4, 2, 0);
    put(&store, 1, BlockClass::Borrowed);
    for _ in 0..5 {
        store.get(&key(1));
    }
    let warm = store.disk.estimate(&key(1));
    assert_eq!(warm, 6);
    for i in 0..4 {
        put(&store, 100 + i, BlockClass::Owned);
    }
    // Far more owned hits than the 2560 increments that would halve the sketch.
    for n in 0..10_000u64 {
        store.get(&key(100 + n % 4));
    }
    assert_eq!(store.disk.estimate(&key(1)), warm);
}

#[test]
fn ram_hits_feed_the_borrowed_estimator_but_skip_owned_keys() {
    let dir = TestDir::new("touch");
    let store = open(&dir, 2, 2, 4);
    put(&store, 1, BlockClass::Borrowed);
    put(&store, 2, BlockClass::Owned);
    assert!(store.in_ram(&key(1)) && store.in_ram(&key(2)));
    for _ in 0..3 {
        store.get(&key(1));
        store.get(&key(2));
    }
    assert_eq!(store.disk.estimate(&key(1)), 4, "one insert and three RAM hits");
    assert_eq!(store.disk.estimate(&key(2)), 0);
}

#[test]
fn ram_hits_refresh_the_disk_recency() {
    let dir = TestDir::new("touch-recency");
    let store = open(&dir, 2, 1, 4);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert!(store.get(&key(1)).is_some() && store.in_ram(&key(1)));
    put(&store, 3, BlockClass::Owned);
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Owned));
    assert_eq!(store.disk.class_of(&key(2)), None);
}

#[test]
fn reads_prefer_ram_and_promote_a_disk_hit_into_ram() {
    let dir = TestDir::new("promote-ram");
    let store = open(&dir, 4, 2, 1);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    assert!(!store.in_ram(&key(1)) && store.in_ram(&key(2)));
    assert_holds(&store, 1);
    assert!(store.in_ram(&key(1)) && !store.in_ram(&key(2)));
    // Served from RAM: the disk copy is gone, the RAM copy still answers.
    assert!(store.disk.remove(&key(1)));
    assert_holds(&store, 1);
    assert_eq!(store.stats().mem_blocks, 1);
}

#[test]
fn a_refused_borrowed_block_is_still_kept_in_ram() {
    let dir = TestDir::new("refused-ram");
    let store = open(&dir, 1, 1, 2);
    put(&store, 1, BlockClass::Borrowed);
    store.get(&key(1));
    assert!(put(&store, 2, BlockClass::Borrowed), "admitted: the RAM tier kept it");
    assert_eq!(store.stats().admit_rejected, 1);
    assert_eq!(store.disk.class_of(&key(2)), None);
    assert!(store.has(&key(2)));
    assert_holds(&store, 2);
    assert_eq!(store.len(), 2, "one disk block and one RAM-only block");
}

#[test]
fn len_counts_disk_blocks_plus_ram_only_blocks() {
    let dir = TestDir::new("len");
    let store = open(&dir, 2, 1, 3);
    for i in 0..3 {
        put(&store, i, BlockClass::Owned);
    }
    // Owned holds 1 and 2; RAM holds 0, 1, 2.
    assert_eq!(store.len(), 3);
    store.disk.remove(&key(1));
    assert_eq!(store.len(), 3);
    store.delete(&key(0));
    assert_eq!(store.len(), 2);
    assert!(!store.is_empty());
}

#[test]
fn stats_report_blocks_and_slots_per_tier() {
    let dir = TestDir::new("stats");
    let store = open(&dir, 4, 2, 1);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    put(&store, 3, BlockClass::Borrowed);
    let want = StoreStats {
        owned_blocks: 2,
        owned_slots: 4,
        borrowed_blocks: 1,
        borrowed_slots: 2,
        mem_blocks: 1,
        mem_slots: 1,
        admit_rejected: 0,
        disk_reads_mapped: 0,
        disk_reads_page_cache: 0,
        disk_reads_blocking: 0,
    };
    assert_eq!(store.stats(), want);
    // 3 is in RAM too; 1 and 2 only on disk: a window from the mapping, a whole block copied.
    assert!(store.get(&key(3)).is_some());
    assert!(store.get_window(&key(1), 0, 4, BLOCK).is_some());
    assert!(store.get(&key(2)).is_some());
    let want = StoreStats { disk_reads_mapped: 1, disk_reads_blocking: 1, mem_blocks: 1, ..want };
    assert_eq!(store.stats(), want);
}

#[test]
fn a_returned_block_is_a_copy_that_survives_its_slot_being_recycled() {
    let dir = TestDir::new("copy");
    let store = open(&dir, 1, 1, 0);
    put(&store, 1, BlockClass::Owned);
    let got = store.get(&key(1)).unwrap();
    put(&store, 2, BlockClass::Owned);
    assert!(!store.has(&key(1)));
    assert_eq!(&got[..], &bytes(1, 0, BLOCK as usize)[..]);
}

#[test]
fn borrowed_admission_is_serialised_with_eviction_under_concurrent_puts() {
    let dir = TestDir::new("concurrent");
    let store = Arc::new(open(&dir, 4, 8, 2));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                for n in 0..400u64 {
                    let i = (n * 7 + t * 13) % 40;
                    let class = if i % 10 == 0 { BlockClass::Owned } else { BlockClass::Borrowed };
                    store.put(key(i), &bytes(i, 0, BLOCK as usize), class).unwrap();
                    if let Some(got) = store.get(&key((i + t) % 40)) {
                        assert_eq!(&got[..], &bytes((i + t) % 40, 0, BLOCK as usize)[..]);
                    }
                    let stats = store.stats();
                    assert!(stats.borrowed_blocks <= stats.borrowed_slots);
                    assert!(stats.owned_blocks <= stats.owned_slots);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    store.check_invariants();
    for i in 0..40 {
        if let Some(got) = store.get(&key(i)) {
            assert_eq!(&got[..], &bytes(i, 0, BLOCK as usize)[..]);
        }
    }
}

#[test]
fn a_second_open_of_a_locked_dir_fails_before_truncating_the_first_instances_files() {
    let dir = TestDir::new("lock");
    let first = open(&dir, 2, 2, 0);
    put(&first, 1, BlockClass::Owned);
    let owned_file = dir.path().join(OWNED_FILE);
    let before = fs::read(&owned_file).unwrap();
    let err = BlockStore::open(config(dir.path(), 3, 3, 0)).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains(&dir.path().display().to_string()), "{err}");
    assert_eq!(fs::read(&owned_file).unwrap(), before, "the refused open touched the arena");
    assert_holds(&first, 1);
    first.close();
    let second = open(&dir, 3, 3, 0);
    assert!(!second.has(&key(1)), "cold start");
}

#[test]
fn open_creates_a_missing_directory_and_leaves_foreign_files_alone() {
    let dir = TestDir::new("create");
    let nested = dir.path().join("a").join("b");
    fs::create_dir_all(dir.path()).unwrap();
    let store = BlockStore::open(config(&nested, 2, 2, 0)).unwrap();
    fs::write(nested.join("foreign.txt"), b"not ours").unwrap();
    put(&store, 1, BlockClass::Owned);
    store.close();
    let store = BlockStore::open(config(&nested, 2, 2, 0)).unwrap();
    assert_eq!(fs::read(nested.join("foreign.txt")).unwrap(), b"not ours");
    let mut names: Vec<_> = fs::read_dir(&nested)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, [".dart.lock", BORROWED_FILE, OWNED_FILE, "foreign.txt"]);
    assert_eq!(store.dir(), nested);
}

#[test]
fn an_uncreatable_directory_is_a_clear_error() {
    let dir = TestDir::new("uncreatable");
    fs::create_dir_all(dir.path()).unwrap();
    let file = dir.path().join("plain-file");
    fs::write(&file, b"").unwrap();
    let bad = file.join("cache");
    let err = BlockStore::open(config(&bad, 2, 2, 0)).unwrap_err();
    assert!(matches!(err, StoreError::Dir { .. }), "{err}");
    assert!(err.to_string().contains(&bad.display().to_string()), "{err}");
}

#[test]
fn bad_configurations_fail_at_open_before_the_directory_is_touched() {
    let dir = TestDir::new("bad-config");
    let cases: [(u64, u64, Option<f64>); 5] = [
        (0, 16, None),
        (15, 16, None),
        (31, 16, None),
        (64, 16, Some(0.0)),
        (64, 16, Some(f64::NAN)),
    ];
    for (cache, block, fraction) in cases {
        let mut config = StoreConfig::new(dir.path(), cache, 0, block);
        config.owned_fraction = fraction;
        let err = BlockStore::open(config).unwrap_err();
        assert!(!matches!(err, StoreError::Dir { .. } | StoreError::Io { .. }), "{err}");
        assert!(!dir.path().exists(), "{err}: the directory was created");
    }
}

#[test]
fn arena_files_are_preallocated_to_their_exact_size_and_sparse() {
    use std::os::unix::fs::MetadataExt;
    let dir = TestDir::new("sparse");
    let block = 1 << 20;
    let config = StoreConfig::new(dir.path(), 10 * block, 0, block);
    let store = BlockStore::open(config).unwrap();
    for (name, slots) in [(OWNED_FILE, 8), (BORROWED_FILE, 2)] {
        let meta = fs::metadata(dir.path().join(name)).unwrap();
        assert_eq!(meta.len(), 4096 + slots * block, "{name}");
        assert!(meta.blocks() * 512 < meta.len(), "{name} is not sparse");
    }
    store.close();
}

#[test]
fn a_cold_open_starts_empty_even_after_a_clean_close() {
    let dir = TestDir::new("cold");
    let store = open(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Borrowed);
    store.close();
    let store = open(&dir, 2, 2, 0);
    assert_eq!(store.len(), 0);
    assert!(store.get(&key(1)).is_none());
    // A verify open after a cold run finds no headers either.
    store.close();
    let store = open_verify(&dir, 2, 2);
    assert_eq!(store.len(), 0);
}

#[test]
fn a_verify_open_keeps_intact_blocks_and_drops_corrupted_ones() {
    let dir = TestDir::new("verify");
    let store = open_verify(&dir, 3, 2);
    for i in 1..=3 {
        put(&store, i, BlockClass::Owned);
    }
    put(&store, 4, BlockClass::Borrowed);
    store.put(key(5), b"tail", BlockClass::Borrowed).unwrap();
    let (layout, slot) =
        store.disk.with_arena(BlockClass::Owned, |a| (a.layout(), a.slot_of(&key(2)).unwrap()));
    store.close();
    // One flipped byte in block 2's data.
    scribble(&dir.path().join(OWNED_FILE), layout.data_offset(slot) + 3, 1);
    let store = open_verify(&dir, 3, 2);
    for i in [1, 3, 4] {
        assert_holds(&store, i);
    }
    assert_eq!(store.get(&key(5)).as_deref(), Some(&b"tail"[..]));
    assert!(!store.has(&key(2)), "a corrupted slot is never served");
    let stats = store.stats();
    assert_eq!((stats.owned_blocks, stats.borrowed_blocks), (2, 2));
    // The digests of exactly the kept blocks, of their bytes (the node's kept digests).
    let mut want: Vec<_> = [1, 3, 4]
        .map(|i| (key(i), dart_core::integrity::xxh3_128(&bytes(i, 0, BLOCK as usize))))
        .to_vec();
    want.push((key(5), dart_core::integrity::xxh3_128(b"tail")));
    want.sort_by_key(|(k, _)| *k);
    let mut got = store.loaded_digests();
    got.sort_by_key(|(k, _)| *k);
    assert_eq!(got, want);
    // The dropped slot is reusable.
    put(&store, 6, BlockClass::Owned);
    assert_holds(&store, 6);
    store.check_invariants();
}

/// Under `--warm-start` a put that brings the node's digest (`Output::StorePut`) gets the slot
/// checksum the store would have hashed: a warm open keeps those blocks, with their digests.
#[test]
fn a_put_with_the_nodes_digest_verifies_at_a_warm_open_like_a_hashed_one() {
    use dart_core::integrity::xxh3_128;
    let dir = TestDir::new("verify-digest");
    let mut cfg = config(dir.path(), 3, 1, 1);
    cfg.warm_start = WarmStart::Verify;
    let store = BlockStore::open(cfg.clone()).unwrap();
    let full = Bytes::from(bytes(1, 0, BLOCK as usize));
    assert!(store.put_bytes(key(1), &full, BlockClass::Owned, Some(xxh3_128(&full))).unwrap());
    let tail = Bytes::from_static(b"short tail");
    assert!(store.put_bytes(key(2), &tail, BlockClass::Borrowed, Some(xxh3_128(&tail))).unwrap());
    put(&store, 3, BlockClass::Owned);
    store.close();
    let store = BlockStore::open(cfg).unwrap();
    let mut got = store.loaded_digests();
    got.sort_by_key(|(k, _)| *k);
    let mut want = vec![
        (key(1), xxh3_128(&full)),
        (key(2), xxh3_128(&tail)),
        (key(3), xxh3_128(&bytes(3, 0, BLOCK as usize))),
    ];
    want.sort_by_key(|(k, _)| *k);
    assert_eq!(got, want, "every block kept, each with its bytes' digest");
    assert_eq!(store.get(&key(1)).as_deref(), Some(&full[..]));
    assert_eq!(store.get(&key(2)).as_deref(), Some(&tail[..]));
    assert_holds(&store, 3);
    store.check_invariants();
}

#[test]
fn a_verify_open_drops_a_torn_header_and_a_partial_data_write() {
    let dir = TestDir::new("verify-torn");
    let store = open_verify(&dir, 3, 2);
    for i in 1..=3 {
        put(&store, i, BlockClass::Owned);
    }
    let (layout, slots) = store.disk.with_arena(BlockClass::Owned, |a| {
        (a.layout(), [1, 2].map(|i| a.slot_of(&key(i)).unwrap()))
    });
    store.close();
    let path = dir.path().join(OWNED_FILE);
    // Block 1: the header write tore after 20 bytes. Block 2: a crash mid-rewrite left the old
    // header next to half-new data.
    scribble(&path, layout.header_offset(slots[0]) + 20, 44);
    scribble(&path, layout.data_offset(slots[1]), BLOCK as usize / 2);
    let store = open_verify(&dir, 3, 2);
    assert!(!store.has(&key(1)) && !store.has(&key(2)));
    assert_holds(&store, 3);
    store.check_invariants();
}

#[test]
fn a_verify_open_rebuilds_empty_when_the_geometry_changes() {
    let dir = TestDir::new("verify-geometry");
    let store = open_verify(&dir, 3, 2);
    put(&store, 1, BlockClass::Owned);
    store.close();
    let store = open_verify(&dir, 4, 2);
    assert!(!store.has(&key(1)));
    assert_eq!(fs::metadata(dir.path().join(OWNED_FILE)).unwrap().len(), 4096 + 4 * BLOCK);
    store.close();
    // The owned and borrowed files are tagged: swapping them keeps nothing.
    let store = open_verify(&dir, 2, 2);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Borrowed);
    store.close();
    let (owned, borrowed) = (dir.path().join(OWNED_FILE), dir.path().join(BORROWED_FILE));
    let tmp = dir.path().join("swap");
    fs::rename(&owned, &tmp).unwrap();
    fs::rename(&borrowed, &owned).unwrap();
    fs::rename(&tmp, &borrowed).unwrap();
    let store = open_verify(&dir, 2, 2);
    assert_eq!(store.len(), 0);
}

#[test]
fn a_verify_open_restores_write_order_as_recency() {
    let dir = TestDir::new("verify-order");
    let store = open_verify(&dir, 3, 1);
    for i in [5, 6, 7] {
        put(&store, i, BlockClass::Owned);
    }
    store.close();
    let store = open_verify(&dir, 3, 1);
    put(&store, 8, BlockClass::Owned);
    assert!(!store.has(&key(5)), "the oldest write is the LRU victim");
    assert!(store.has(&key(6)) && store.has(&key(7)));
}

#[test]
fn a_deleted_block_stays_deleted_across_a_verify_restart() {
    let dir = TestDir::new("verify-delete");
    let store = open_verify(&dir, 2, 2);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Borrowed);
    assert!(store.delete(&key(1)) && store.delete(&key(2)));
    store.close();
    let store = open_verify(&dir, 2, 2);
    assert_eq!(store.len(), 0);
}

#[test]
fn a_verify_open_keeps_a_block_in_one_budget_only() {
    let dir = TestDir::new("verify-dup");
    let store = open_verify(&dir, 2, 2);
    put(&store, 1, BlockClass::Borrowed);
    store.close();
    let saved = fs::read(dir.path().join(BORROWED_FILE)).unwrap();
    let store = open_verify(&dir, 2, 2);
    put(&store, 1, BlockClass::Owned);
    store.close();
    // As if the process died between the owned insert and the borrowed delete.
    fs::write(dir.path().join(BORROWED_FILE), saved).unwrap();
    let store = open_verify(&dir, 2, 2);
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Owned));
    assert_eq!(store.stats().borrowed_blocks, 0);
    assert_holds(&store, 1);
    store.check_invariants();
}

#[test]
fn ram_block_count_is_exact_across_put_refresh_evict_delete_and_close() {
    let dir = TestDir::new("mem-count");
    let store = open(&dir, 4, 4, 2);
    let mem_blocks = |store: &BlockStore| store.stats().mem_blocks;
    put(&store, 1, BlockClass::Owned);
    assert_eq!(mem_blocks(&store), 1);
    put(&store, 1, BlockClass::Owned);
    assert_eq!(mem_blocks(&store), 1, "refresh");
    put(&store, 2, BlockClass::Borrowed);
    put(&store, 3, BlockClass::Borrowed);
    assert_eq!(mem_blocks(&store), 2, "evict");
    store.get(&key(1));
    assert_eq!(mem_blocks(&store), 2, "promotion evicts");
    store.delete(&key(1));
    assert_eq!(mem_blocks(&store), 1, "delete");
    store.close();
    assert_eq!(mem_blocks(&store), 0, "close");
    store.close();
    assert_eq!(mem_blocks(&store), 0);
}

#[test]
fn racing_owned_and_borrowed_puts_of_one_key_leave_it_in_one_budget() {
    let dir = TestDir::new("race-classes");
    let store = Arc::new(open(&dir, 4, 4, 0));
    for round in 0..200 {
        let i = round % 8;
        let racers: Vec<_> = [BlockClass::Owned, BlockClass::Borrowed]
            .into_iter()
            .map(|class| {
                let store = Arc::clone(&store);
                std::thread::spawn(move || put(&store, i, class))
            })
            .collect();
        for racer in racers {
            assert!(racer.join().unwrap());
        }
        store.check_invariants();
        assert_eq!(store.disk.class_of(&key(i)), Some(BlockClass::Owned));
        assert_holds(&store, i);
        store.delete(&key(i));
    }
}

/// A disk hit the page cache holds is answered at once, with the bytes the blocking read gives;
/// misses, windows of another block length and a closed store answer at once too. Linux only
/// (`preadv2(RWF_NOWAIT)`); the bytes were just written, so the page cache holds them.
#[cfg(target_os = "linux")]
#[test]
fn page_cache_reads_answer_as_the_blocking_reads_do() {
    let dir = TestDir::new("cached");
    let store = open(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Borrowed);
    store.put(key(3), b"short", BlockClass::Borrowed).unwrap();
    for i in [1, 2] {
        let whole = store.get_cached(&key(i), None);
        assert_eq!(
            whole,
            Some(store.get(&key(i))),
            "block {i}: the page cache of {} did not answer (RWF_NOWAIT unsupported there?)",
            dir.path().display()
        );
        for (start, len) in [(0, BLOCK), (0, 1), (5, 7), (BLOCK - 1, 1)] {
            let window = Some((start, len, BLOCK));
            let blocking = store.get_window(&key(i), start, len, BLOCK);
            assert!(blocking.is_some());
            assert_eq!(
                store.get_cached(&key(i), window),
                Some(blocking),
                "block {i} {start}+{len}"
            );
        }
    }
    assert_eq!(store.get_cached(&key(3), None).flatten().as_deref(), Some(&b"short"[..]));
    assert_eq!(store.get_cached(&key(3), Some((0, 2, BLOCK))), Some(None), "held with 5 bytes");
    assert_eq!(store.get_cached(&key(1), Some((BLOCK - 1, 2, BLOCK))), Some(None), "past the end");
    assert_eq!(store.get_cached(&key(1), Some((0, 0, BLOCK))), Some(None), "an empty window");
    assert_eq!(store.get_cached(&key(9), None), Some(None), "a miss needs no disk");
    store.close();
    assert_eq!(store.get_cached(&key(1), None), Some(None), "closed");
}

/// The driver asks `get_window_now` under the node's lock for small windows: a disk hit the page
/// cache holds is answered with the blocking read's bytes, a RAM hit and a miss at once, and while
/// a write holds both arenas nothing waits (the disk hit is left to the blocking read).
#[cfg(target_os = "linux")]
#[test]
fn a_small_window_under_the_nodes_lock_reads_the_page_cache_and_never_waits_for_a_write() {
    let dir = TestDir::new("window-now");
    // Block 2 is in RAM and on disk, block 1 on disk only, block 3 nowhere.
    let store = open(&dir, 2, 2, 1);
    assert!(put(&store, 1, BlockClass::Owned));
    assert!(put(&store, 2, BlockClass::Borrowed));
    assert!(store.in_ram(&key(2)) && !store.in_ram(&key(1)));
    let w = (5, 7, BLOCK);
    for i in [1, 2] {
        let blocking = store.get_window(&key(i), 5, 7, BLOCK);
        assert!(blocking.is_some());
        assert_eq!(store.get_window_now(&key(i), w), Some(blocking), "block {i}");
    }
    assert!(!store.in_ram(&key(1)), "a window is not promoted");
    assert_eq!(store.get_window_now(&key(3), w), Some(None), "a miss");
    assert_eq!(store.get_window_now(&key(1), (0, 2, BLOCK + 1)), Some(None), "another length");
    assert_eq!(store.get_window_now(&key(1), (BLOCK - 1, 2, BLOCK)), Some(None), "past the end");

    let answers = answered_while_both_arenas_are_held(&store, || {
        (1..=3)
            .map(|i| store.get_window_now(&key(i), w).map(|b| b.map(|b| b.len())))
            .collect::<Vec<_>>()
    });
    assert_eq!(answers, vec![None, Some(Some(7)), Some(None)]);
    store.close();
    assert_eq!(store.get_window_now(&key(2), w), Some(None), "closed");
}

/// A whole block read from the page cache is promoted into RAM, as a blocking `get` promotes it;
/// a window is not.
#[cfg(target_os = "linux")]
#[test]
fn a_whole_page_cache_read_is_promoted_into_ram_and_a_window_is_not() {
    let dir = TestDir::new("cached-promote");
    let store = open(&dir, 4, 2, 2);
    put(&store, 1, BlockClass::Owned);
    put(&store, 2, BlockClass::Owned);
    put(&store, 3, BlockClass::Owned);
    put(&store, 4, BlockClass::Owned);
    // RAM holds 3 and 4 now (two slabs); 1 and 2 are on disk only.
    assert_eq!(store.get_from_ram(&key(1)), None, "1 needs a disk read");
    assert!(store.get_cached(&key(1), Some((0, 4, BLOCK))).flatten().is_some());
    assert_eq!(store.get_from_ram(&key(1)), None, "a window is not promoted");
    assert!(store.get_cached(&key(1), None).flatten().is_some());
    assert_eq!(store.get_from_ram(&key(1)), Some(Some(Bytes::from(bytes(1, 0, BLOCK as usize)))));
}

/// Whether the file system under the test directory takes `O_DIRECT` (tmpfs before Linux 6.6
/// does not): where it does not, the direct-write tests check the page-cache fallback instead.
#[cfg(target_os = "linux")]
fn takes_o_direct(dir: &TestDir) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    fs::create_dir_all(dir.path()).unwrap();
    let probe = dir.path().join("o-direct-probe");
    let opened = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&probe)
        .is_ok();
    let _ = fs::remove_file(&probe);
    eprintln!("{}: O_DIRECT {}", dir.path().display(), if opened { "taken" } else { "refused" });
    opened
}

/// Block data written around the page cache (`O_DIRECT`, arena's `Writer`) reads back exactly,
/// through every read path, when it replaces a block whose pages were cached and mapped: a window
/// answered from the mapping makes the old block's pages resident, then the slot is rewritten
/// directly, and the window, the whole block, a tail block shorter than its slot (padded on disk)
/// and a warm reopen all see the new bytes, never the old ones cached before.
#[cfg(target_os = "linux")]
#[test]
fn direct_writes_replace_cached_and_mapped_bytes_and_read_back_exactly() {
    // Large enough for a pooled buffer (`dart_core::bufpool`).
    const SLOT: u64 = 64 << 10;
    let dir = TestDir::new("direct");
    let direct = takes_o_direct(&dir);
    let block = |i: u64, len: usize| -> Vec<u8> {
        (0..len).map(|j| (i as u8).wrapping_mul(37) ^ (j as u8) ^ ((j >> 8) as u8)).collect()
    };
    // The bytes of block `i` one byte into their buffer: never on a page boundary, whatever
    // the allocator handed out (a fresh `Vec` may start on one by chance; the count of blocks
    // written as they are below must not depend on that).
    let unaligned = |i: u64| -> bytes::Bytes {
        let mut buf = vec![0u8];
        buf.extend(block(i, SLOT as usize));
        bytes::Bytes::from(buf).slice(1..)
    };
    // Four owned slots: one of them may be held by a mapped answer (`MAPPED_SHARE`).
    let mut cfg = StoreConfig::new(dir.path(), 5 * SLOT, 0, SLOT);
    cfg.owned_fraction = Some(4.5 / 5.0);
    cfg.warm_start = WarmStart::Verify;
    let owned = BlockClass::Owned;
    let store = BlockStore::open(cfg.clone()).unwrap();
    assert_eq!(store.disk.with_arena(owned, |a| a.writes_direct()), direct);
    let reads = |s: &BlockStore| {
        let stats = s.stats();
        (stats.disk_reads_mapped, stats.disk_reads_page_cache, stats.disk_reads_blocking)
    };
    assert!(store.put(key(1), &unaligned(1), owned).unwrap());
    let slot1 = store.disk.with_arena(owned, |a| a.slot_of(&key(1))).expect("1 is held");
    // A direct write leaves no page cached: the first read is a `pread`, which caches them, and
    // the window after it is answered from the mapping.
    assert_holds_bytes(&store, 1, &block(1, SLOT as usize));
    assert_eq!(reads(&store), if direct { (0, 0, 1) } else { (1, 0, 0) });
    let window = store.get_window(&key(1), 100, 5000, SLOT).expect("1 is held");
    assert_eq!(&window[..], &block(1, SLOT as usize)[100..5100]);
    assert_eq!(store.disk.with_arena(owned, |a| a.mapped_out()), Some(1));
    drop(window);
    for i in [2, 3, 4] {
        assert!(store.put(key(i), &unaligned(i), owned).unwrap());
    }
    // 1 is the least recently used: 5 takes its slot, written directly over cached pages.
    assert!(store.put(key(5), &unaligned(5), owned).unwrap());
    assert_eq!(store.disk.with_arena(owned, |a| a.slot_of(&key(5))), Some(slot1));
    assert_eq!(store.get(&key(1)), None);
    let window = store.get_window(&key(5), 100, 5000, SLOT).expect("5 is held");
    assert_eq!(&window[..], &block(5, SLOT as usize)[100..5100], "the window of the new block");
    drop(window);
    assert_holds_bytes(&store, 5, &block(5, SLOT as usize));
    let window = store.get_window(&key(5), 100, 5000, SLOT).expect("5 is held");
    assert_eq!(&window[..], &block(5, SLOT as usize)[100..5100], "mapped or copied, the same");
    drop(window);
    assert_eq!(store.disk.with_arena(owned, |a| a.direct_writes_as_is()), 0, "copied: unaligned");
    // A block in a pooled buffer starts aligned: written as it is, and read back exactly.
    let mut pooled = dart_core::bufpool::Buf::take(SLOT as usize);
    pooled.as_mut_slice().copy_from_slice(&block(7, SLOT as usize));
    let pooled = pooled.freeze();
    assert!(store.put_bytes(key(7), &pooled, owned, None).unwrap());
    let as_is = store.disk.with_arena(owned, |a| a.direct_writes_as_is());
    assert_eq!(as_is, u64::from(direct), "no copy when aligned");
    assert_holds_bytes(&store, 7, &block(7, SLOT as usize));
    // A tail of 5,000 bytes replaces 3 (padded to 8 KiB on disk, 5,000 bytes when read).
    assert_eq!(store.get(&key(2)), None, "7 took the slot of 2");
    assert!(store.put(key(6), &block(6, 5000), owned).unwrap());
    assert_eq!(store.get(&key(3)), None);
    assert_holds_bytes(&store, 6, &block(6, 5000));
    assert_eq!(store.get_window(&key(6), 0, 5000, SLOT), None, "not a block of the slot's length");
    store.check_invariants();
    store.close();
    drop(store);
    let store = BlockStore::open(cfg).unwrap();
    for i in [4, 5, 7] {
        assert_holds_bytes(&store, i, &block(i, SLOT as usize));
    }
    assert_holds_bytes(&store, 6, &block(6, 5000));
}

#[cfg(target_os = "linux")]
fn assert_holds_bytes(store: &BlockStore, i: u64, want: &[u8]) {
    assert_eq!(store.get(&key(i)).as_deref(), Some(want), "block {i}");
}

/// The production I/O with its direct writes refused as invalid, as a file system that does not
/// take this alignment refuses them: counts the refusals.
#[cfg(target_os = "linux")]
#[derive(Debug, Default)]
struct RefusingDirectIo {
    /// The direct handles' descriptors (one per arena).
    direct: std::sync::Mutex<Vec<i32>>,
    refused: AtomicU64,
}

#[cfg(target_os = "linux")]
impl StoreIo for RefusingDirectIo {
    fn open_direct(&self, path: &Path) -> Option<std::fs::File> {
        use std::os::fd::AsRawFd;
        let file = OsIo.open_direct(path)?;
        self.direct.lock().unwrap().push(file.as_raw_fd());
        Some(file)
    }

    fn write_all_at(&self, file: &std::fs::File, buf: &[u8], offset: u64) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        if self.direct.lock().unwrap().contains(&file.as_raw_fd()) {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        }
        OsIo.write_all_at(file, buf, offset)
    }
}

/// A direct write refused as invalid is written again through the page cache, nothing is lost and
/// the store stays healthy, and the arena writes buffered from then on (one refusal per arena).
#[cfg(target_os = "linux")]
#[test]
fn a_refused_direct_write_is_written_through_the_page_cache_and_direct_writes_stop() {
    const SLOT: u64 = 8192;
    let dir = TestDir::new("direct-refused");
    let direct = takes_o_direct(&dir);
    let io = Arc::new(RefusingDirectIo::default());
    let mut cfg = StoreConfig::new(dir.path(), 3 * SLOT, 0, SLOT);
    cfg.owned_fraction = Some(2.5 / 3.0);
    let store = BlockStore::open_with_io(cfg, io.clone()).unwrap();
    let owned = BlockClass::Owned;
    for i in 1..=4u64 {
        let data = vec![i as u8; SLOT as usize];
        assert!(store.put(key(i), &data, owned).unwrap(), "put {i}");
        assert_eq!(store.get(&key(i)).as_deref(), Some(&data[..]), "block {i}");
    }
    assert_eq!(io.refused.load(Ordering::Relaxed), u64::from(direct), "once, by the owned arena");
    assert!(!store.disk.with_arena(owned, |a| a.writes_direct()));
    assert_eq!(store.health().state, HealthState::Healthy);
    store.check_invariants();
}

/// `direct_writes: false` (the node's `--buffered-writes`) writes block data through the page cache
/// even where the file system takes `O_DIRECT`: a block just put is a page-cache hit.
#[cfg(target_os = "linux")]
#[test]
fn buffered_writes_leave_the_block_in_the_page_cache() {
    const SLOT: u64 = 64 << 10;
    let dir = TestDir::new("buffered");
    let mut cfg = StoreConfig::new(dir.path(), 5 * SLOT, 0, SLOT);
    cfg.direct_writes = false;
    let store = BlockStore::open(cfg).unwrap();
    assert!(!store.disk.writes_direct());
    let data = vec![7u8; SLOT as usize];
    assert!(store.put(key(1), &data, BlockClass::Owned).unwrap());
    assert_eq!(store.get(&key(1)).as_deref(), Some(&data[..]));
    let stats = store.stats();
    assert_eq!(stats.disk_reads_blocking, 0, "read from the page cache, not the disk");
}
