//! Degraded mode: disk faults injected through [`FaultyIo`] at run time, with its hand-moved clock
//! standing in for the 30 s probe timer. No root, no mounts, no sleeps.

use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;

use super::tests::{bytes, config, key, TestDir, BLOCK};
use super::*;

fn open_faulty(dir: &TestDir, owned: u64, borrowed: u64, mem: u64) -> (BlockStore, Arc<FaultyIo>) {
    open_faulty_with(dir, owned, borrowed, mem, WarmStart::Cold)
}

fn open_faulty_with(
    dir: &TestDir,
    owned: u64,
    borrowed: u64,
    mem: u64,
    warm: WarmStart,
) -> (BlockStore, Arc<FaultyIo>) {
    let io = Arc::new(FaultyIo::new());
    let mut config = config(dir.path(), owned, borrowed, mem);
    config.warm_start = warm;
    let store = BlockStore::open_with_io(config, io.clone()).unwrap();
    (store, io)
}

fn block(i: u64) -> Vec<u8> {
    bytes(i, 0, BLOCK as usize)
}

fn put(store: &BlockStore, i: u64, class: BlockClass) -> Result<bool, StoreError> {
    store.put(key(i), &block(i), class)
}

fn assert_holds(store: &BlockStore, i: u64) {
    assert_eq!(store.get(&key(i)).as_deref(), Some(&block(i)[..]), "block {i}");
}

fn assert_absent(store: &BlockStore, i: u64) {
    assert!(!store.has(&key(i)), "block {i} is held");
    assert_eq!(store.get(&key(i)), None, "block {i} was served");
    assert_eq!(store.get_window(&key(i), 0, 4, BLOCK), None, "block {i} was served");
}

/// The reason of a degraded store, as `/healthz` shows it.
fn degraded_reason(store: &BlockStore) -> String {
    match store.health().state {
        HealthState::Degraded { reason, .. } => reason.to_string(),
        HealthState::Healthy => panic!("expected a degraded store"),
    }
}

#[test]
fn every_kind_of_failed_write_drops_its_put_and_degrades_with_the_reason() {
    let cases = [
        (Fault::NoSpace, "no space left on device"),
        (Fault::ReadOnly, "read-only file system"),
        (Fault::PermissionDenied, "permission denied"),
        (Fault::Io, "io error: Input/output error"),
        (Fault::Short, "io error: "),
    ];
    for (fault, reason) in cases {
        let dir = TestDir::new("fault-kinds");
        let (store, io) = open_faulty(&dir, 2, 2, 0);
        assert!(put(&store, 1, BlockClass::Owned).unwrap());
        io.fail_writes(Some(fault));
        let err = put(&store, 2, BlockClass::Owned).unwrap_err();
        assert!(matches!(err, StoreError::Io { .. }), "{fault:?}: {err}");
        assert_absent(&store, 2);
        assert_holds(&store, 1);
        assert!(
            degraded_reason(&store).starts_with(reason),
            "{fault:?}: {}",
            degraded_reason(&store)
        );
        let health = store.health();
        assert_eq!((health.write_failures, health.read_failures), (1, 0), "{fault:?}");
        let calls = io.write_calls();
        assert!(!put(&store, 3, BlockClass::Borrowed).unwrap(), "{fault:?}: skipped, not cached");
        assert_eq!(io.write_calls(), calls, "{fault:?}: no disk write while degraded");
        assert_absent(&store, 3);
        store.check_invariants();
        store.close();
    }
}

#[test]
fn while_degraded_the_disk_is_left_alone_until_a_probe_is_due_and_a_good_probe_recovers() {
    let dir = TestDir::new("probe");
    let (store, io) = open_faulty(&dir, 4, 4, 0);
    assert!(put(&store, 0, BlockClass::Owned).unwrap());
    io.fail_writes(Some(Fault::NoSpace));
    assert!(put(&store, 1, BlockClass::Owned).is_err());
    let calls = io.write_calls();
    assert!(!put(&store, 2, BlockClass::Owned).unwrap());
    assert!(!put(&store, 3, BlockClass::Borrowed).unwrap());
    io.advance(PROBE_INTERVAL - Duration::from_millis(1));
    assert!(!put(&store, 4, BlockClass::Owned).unwrap());
    assert_eq!(io.write_calls(), calls, "no write before the probe is due");
    assert_holds(&store, 0);

    io.advance(Duration::from_millis(1));
    assert!(put(&store, 5, BlockClass::Owned).is_err(), "the probe writes, and fails");
    assert_eq!(io.write_calls(), calls + 1, "exactly one probe write");
    assert!(!put(&store, 6, BlockClass::Owned).unwrap(), "the next probe is an interval away");
    assert_eq!(store.health().write_failures, 2);

    io.fail_writes(None);
    assert!(!put(&store, 7, BlockClass::Owned).unwrap(), "healed, but no probe is due yet");
    io.advance(PROBE_INTERVAL);
    assert!(put(&store, 8, BlockClass::Owned).unwrap(), "the probe succeeds");
    assert_eq!(store.health().state, HealthState::Healthy);
    assert_eq!((store.health().write_failures, store.health().read_failures), (2, 0));
    assert!(put(&store, 9, BlockClass::Borrowed).unwrap());
    for i in [0, 8, 9] {
        assert_holds(&store, i);
    }
    for i in 1..=7 {
        assert_absent(&store, i);
    }
    store.check_invariants();
}

#[test]
fn a_short_write_is_never_served_even_after_its_slot_is_reused_or_the_store_restarts() {
    for warm in [WarmStart::Cold, WarmStart::Verify] {
        let dir = TestDir::new("short");
        let (store, io) = open_faulty_with(&dir, 2, 1, 0, warm);
        assert!(put(&store, 1, BlockClass::Owned).unwrap());
        io.fail_writes(Some(Fault::Short));
        assert!(put(&store, 2, BlockClass::Owned).is_err());
        assert_absent(&store, 2);
        io.fail_writes(None);
        io.advance(PROBE_INTERVAL);
        // The free slot the torn write left is the one the next insert takes.
        assert!(put(&store, 3, BlockClass::Owned).unwrap());
        assert_holds(&store, 3);
        assert_absent(&store, 2);
        store.check_invariants();
        store.close();
        if warm == WarmStart::Verify {
            let mut cfg = config(dir.path(), 2, 1, 0);
            cfg.warm_start = WarmStart::Verify;
            let store = BlockStore::open(cfg).unwrap();
            assert_holds(&store, 1);
            assert_holds(&store, 3);
            assert_absent(&store, 2);
        }
    }
}

#[test]
fn a_torn_write_into_a_fresh_slot_is_dropped_by_a_verify_restart() {
    let dir = TestDir::new("short-restart");
    let (store, io) = open_faulty_with(&dir, 2, 1, 0, WarmStart::Verify);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    io.fail_writes(Some(Fault::Short));
    assert!(put(&store, 2, BlockClass::Owned).is_err());
    store.close();
    let mut cfg = config(dir.path(), 2, 1, 0);
    cfg.warm_start = WarmStart::Verify;
    let store = BlockStore::open(cfg).unwrap();
    assert_holds(&store, 1);
    assert_absent(&store, 2);
    store.check_invariants();
}

#[test]
fn a_degraded_store_serves_ram_and_disk_blocks_and_still_fills_the_ram_tier() {
    let dir = TestDir::new("degraded-ram");
    let (store, io) = open_faulty(&dir, 4, 4, 2);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    io.fail_writes(Some(Fault::ReadOnly));
    assert!(put(&store, 2, BlockClass::Owned).is_err());
    assert!(!store.in_ram(&key(2)), "a failed put is dropped from every tier");
    assert!(put(&store, 3, BlockClass::Borrowed).unwrap(), "kept in RAM while degraded");
    assert!(store.in_ram(&key(3)) && !store.disk.contains(&key(3)));
    assert_holds(&store, 3);
    assert_holds(&store, 1);
    assert_absent(&store, 2);
    store.check_invariants();
}

#[test]
fn a_failed_read_is_a_miss_that_drops_its_slot_and_degrades_the_store() {
    let dir = TestDir::new("read-fault");
    let (store, io) = open_faulty(&dir, 2, 2, 0);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    assert!(put(&store, 2, BlockClass::Borrowed).unwrap());
    io.fail_reads(Some(Fault::Io));
    assert_eq!(store.get(&key(1)), None);
    assert_eq!(store.get_window(&key(2), 0, 4, BLOCK), None);
    io.fail_reads(None);
    assert_absent(&store, 1);
    assert_absent(&store, 2);
    let health = store.health();
    assert_eq!((health.write_failures, health.read_failures), (0, 2));
    assert!(degraded_reason(&store).starts_with("read error: Input/output error"));
    assert!(!put(&store, 3, BlockClass::Owned).unwrap(), "degraded: no write until the probe");
    io.advance(PROBE_INTERVAL);
    assert!(put(&store, 4, BlockClass::Owned).unwrap());
    assert_eq!(store.health().state, HealthState::Healthy);
    assert_holds(&store, 4);
    store.check_invariants();
}

#[test]
fn a_short_read_is_a_miss_too() {
    let dir = TestDir::new("short-read");
    let (store, io) = open_faulty(&dir, 2, 2, 0);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    io.fail_reads(Some(Fault::Short));
    assert_eq!(store.get(&key(1)), None);
    io.fail_reads(None);
    assert_absent(&store, 1);
    assert_eq!(store.health().read_failures, 1);
}

#[test]
fn a_promotion_waits_while_degraded_and_the_borrowed_copy_keeps_serving() {
    let dir = TestDir::new("degraded-promote");
    let (store, io) = open_faulty(&dir, 2, 2, 0);
    assert!(put(&store, 1, BlockClass::Borrowed).unwrap());
    io.fail_writes(Some(Fault::NoSpace));
    assert!(put(&store, 9, BlockClass::Owned).is_err());
    assert!(put(&store, 1, BlockClass::Owned).unwrap(), "still cached, as borrowed");
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Borrowed));
    assert_holds(&store, 1);
    io.fail_writes(None);
    io.advance(PROBE_INTERVAL);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    assert_eq!(store.disk.class_of(&key(1)), Some(BlockClass::Owned));
    assert_eq!(store.health().state, HealthState::Healthy);
    assert_holds(&store, 1);
    store.check_invariants();
}

#[test]
fn a_deleted_cache_directory_degrades_the_store_at_the_next_check_and_held_blocks_still_serve() {
    let dir = TestDir::new("rmdir");
    let (store, io) = open_faulty(&dir, 4, 4, 0);
    assert!(put(&store, 1, BlockClass::Owned).unwrap());
    std::fs::remove_dir_all(dir.path()).unwrap();
    // Nothing fails: the open files live on, unlinked, until the interval's check.
    assert!(put(&store, 2, BlockClass::Owned).unwrap());
    assert_eq!(store.health().state, HealthState::Healthy);
    io.advance(PROBE_INTERVAL);
    let calls = io.write_calls();
    assert!(!put(&store, 3, BlockClass::Owned).unwrap());
    assert_eq!(io.write_calls(), calls, "the check found the files unlinked and skipped the write");
    assert!(degraded_reason(&store).starts_with("files removed"), "{}", degraded_reason(&store));
    assert_holds(&store, 1);
    assert_holds(&store, 2);
    io.advance(PROBE_INTERVAL);
    assert!(!put(&store, 4, BlockClass::Borrowed).unwrap(), "no recovery without a restart");
    let health = store.health();
    assert!(health.is_degraded());
    assert_eq!((health.write_failures, health.read_failures), (0, 0));
    store.check_invariants();
    store.close();
}

#[test]
fn concurrent_puts_and_gets_on_a_failing_disk_never_panic_or_serve_wrong_bytes() {
    let dir = TestDir::new("degraded-threads");
    let (store, io) = open_faulty(&dir, 4, 4, 2);
    let store = Arc::new(store);
    std::thread::scope(|scope| {
        for t in 0..4u64 {
            let (store, io) = (store.clone(), io.clone());
            scope.spawn(move || {
                for round in 0..200u64 {
                    let i = (round * 7 + t) % 24;
                    match (round + t) % 9 {
                        0 => io.fail_writes(Some(Fault::Short)),
                        3 => io.fail_writes(None),
                        5 => io.fail_reads(Some(Fault::Io)),
                        6 => io.fail_reads(None),
                        8 => io.advance(PROBE_INTERVAL),
                        _ => {}
                    }
                    let _ = put(&store, i, BlockClass::Owned);
                    let _ = put(&store, i + 1, BlockClass::Borrowed);
                    if let Some(got) = store.get(&key(i)) {
                        assert_eq!(&got[..], &block(i)[..], "block {i}");
                    }
                }
            });
        }
    });
    store.check_invariants();
}

/// Distinct keys of the property test: a few times the slots, so slots are reused often.
const KEYS: u64 = 10;

#[derive(Clone, Debug)]
enum Op {
    Put { k: u64, class: BlockClass },
    Get { k: u64 },
    Window { k: u64 },
    Delete { k: u64 },
    Faults { write: Option<Fault>, read: Option<Fault> },
    Advance { secs: u64 },
    Reopen,
}

fn fault() -> impl Strategy<Value = Option<Fault>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(Fault::NoSpace)),
        1 => Just(Some(Fault::ReadOnly)),
        1 => Just(Some(Fault::Io)),
        2 => Just(Some(Fault::Short)),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let class = prop_oneof![Just(BlockClass::Owned), Just(BlockClass::Borrowed)];
    prop_oneof![
        8 => (0..KEYS, class).prop_map(|(k, class)| Op::Put { k, class }),
        6 => (0..KEYS).prop_map(|k| Op::Get { k }),
        2 => (0..KEYS).prop_map(|k| Op::Window { k }),
        1 => (0..KEYS).prop_map(|k| Op::Delete { k }),
        2 => (fault(), fault()).prop_map(|(write, read)| Op::Faults { write, read }),
        2 => (0..45u64).prop_map(|secs| Op::Advance { secs }),
        1 => Just(Op::Reopen),
    ]
}

/// Each key always has the same bytes, of a length of its own, so any other bytes are torn.
fn content(k: u64) -> Vec<u8> {
    bytes(k, 0x5a, 1 + (k as usize * 5) % BLOCK as usize)
}

struct Run {
    dir: TestDir,
    cfg: StoreConfig,
    io: Arc<FaultyIo>,
    store: BlockStore,
    write_fault: Option<Fault>,
    read_fault: Option<Fault>,
}

impl Run {
    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let store = &self.store;
        match *op {
            Op::Put { k, class } => {
                let cached = store.put(key(k), &content(k), class);
                if matches!(cached, Ok(true)) && self.read_fault.is_none() {
                    prop_assert_eq!(store.get(&key(k)), Some(content(k).into()), "put said cached");
                }
                if cached.is_err() {
                    prop_assert!(self.write_fault.is_some(), "a put failed on a good disk");
                    prop_assert!(store.health().is_degraded());
                }
            }
            Op::Get { k } => {
                if let Some(got) = store.get(&key(k)) {
                    prop_assert_eq!(&got[..], &content(k)[..], "torn or foreign bytes for {}", k);
                }
            }
            Op::Window { k } => {
                let len = content(k).len() as u64;
                if let Some(got) = store.get_window(&key(k), len / 2, len - len / 2, len) {
                    prop_assert_eq!(&got[..], &content(k)[(len / 2) as usize..], "window {}", k);
                }
            }
            Op::Delete { k } => {
                store.delete(&key(k));
                prop_assert!(!store.has(&key(k)));
            }
            Op::Faults { write, read } => {
                self.io.fail_writes(write);
                self.io.fail_reads(read);
                (self.write_fault, self.read_fault) = (write, read);
            }
            Op::Advance { secs } => self.io.advance(Duration::from_secs(secs)),
            Op::Reopen => {
                self.store.close();
                // Faults at open are start-up errors, not degraded mode: open on a good disk.
                self.io.fail_writes(None);
                self.io.fail_reads(None);
                self.store = BlockStore::open_with_io(self.cfg.clone(), self.io.clone()).unwrap();
                self.io.fail_writes(self.write_fault);
                self.io.fail_reads(self.read_fault);
                prop_assert_eq!(
                    self.store.health(),
                    StoreHealth::default(),
                    "a new store is healthy"
                );
            }
        }
        self.store.check_invariants();
        let stats = self.store.stats();
        prop_assert!(stats.owned_blocks <= stats.owned_slots);
        prop_assert!(stats.borrowed_blocks <= stats.borrowed_slots);
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Nothing half-written is ever served and a failing disk never panics the store, whatever
    /// the order of faults, probes, slot reuse and restarts.
    #[test]
    fn random_faults_never_serve_torn_bytes_or_panic(
        owned in 1..4u64,
        borrowed in 1..4u64,
        mem in 0..3u64,
        verify in any::<bool>(),
        ops in prop::collection::vec(op(), 1..150),
    ) {
        let dir = TestDir::new("degraded-model");
        let mut cfg = config(dir.path(), owned, borrowed, mem);
        cfg.warm_start = if verify { WarmStart::Verify } else { WarmStart::Cold };
        let io = Arc::new(FaultyIo::new());
        let store = BlockStore::open_with_io(cfg.clone(), io.clone()).unwrap();
        let mut run = Run { dir, cfg, io, store, write_fault: None, read_fault: None };
        for op in &ops {
            run.step(op)?;
        }
        run.store.close();
        drop(run.dir);
    }
}

/// A store whose I/O cannot read from the page cache (the fault-injecting double, like a kernel
/// without `RWF_NOWAIT`) answers only what needs no disk, and leaves the rest to the blocking read,
/// whose faults it then meets.
#[test]
fn without_page_cache_reads_a_disk_hit_waits_for_the_blocking_read() {
    let dir = TestDir::new("cached-faulty");
    let (store, _io) = open_faulty(&dir, 2, 2, 0);
    put(&store, 1, BlockClass::Owned).unwrap();
    assert_eq!(store.get_cached(&key(1), None), None);
    assert_eq!(store.get_cached(&key(1), Some((0, 4, BLOCK))), None);
    assert_eq!(store.get_cached(&key(7), None), Some(None), "a miss needs no disk");
    assert_eq!(store.get_window_now(&key(1), (0, 4, BLOCK)), None);
    assert_eq!(store.get_window_now(&key(7), (0, 4, BLOCK)), Some(None));
    assert!(store.get(&key(1)).is_some(), "the blocking read answers");
}
