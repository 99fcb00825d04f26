//! Model-based test: random put/get/has/delete/reopen sequences drive the store and a small
//! reference model, compared after every step.
//!
//! The model knows the owned budget exactly (plain LRU that only owned traffic moves) and, for
//! every key the store may hold, the bytes of its current incarnation. Borrowed admission is not
//! modelled; the store's own `has` tells the model when a key left, which is enough to check that a
//! get never returns bytes other than those first put for that key.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::tests::{bytes, config, key, TestDir, BLOCK};
use super::*;

/// Distinct keys the operations draw from: a few times the slot counts, so eviction is common.
const KEYS: u64 = 10;

#[derive(Clone, Debug)]
enum Op {
    Put { k: u64, class: BlockClass, salt: u8, len: usize },
    Get { k: u64 },
    Has { k: u64 },
    Delete { k: u64 },
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let class = prop_oneof![Just(BlockClass::Owned), Just(BlockClass::Borrowed)];
    prop_oneof![
        8 => (0..KEYS, class, any::<u8>(), 1..=BLOCK as usize)
            .prop_map(|(k, class, salt, len)| Op::Put { k, class, salt, len }),
        8 => (0..KEYS).prop_map(|k| Op::Get { k }),
        2 => (0..KEYS).prop_map(|k| Op::Has { k }),
        2 => (0..KEYS).prop_map(|k| Op::Delete { k }),
        1 => Just(Op::Reopen),
    ]
}

/// The reference.
#[derive(Debug, Default)]
struct Model {
    owned_slots: usize,
    /// Owned keys, most recently used first.
    owned: Vec<u64>,
    /// When each owned key was written into the owned arena (restores order on a warm start).
    owned_written: BTreeMap<u64, u64>,
    writes: u64,
    /// Bytes of the current incarnation of every key the store may hold.
    bytes: BTreeMap<u64, Vec<u8>>,
}

impl Model {
    fn touch_owned(&mut self, k: u64) -> bool {
        let Some(pos) = self.owned.iter().position(|&o| o == k) else {
            return false;
        };
        self.owned.remove(pos);
        self.owned.insert(0, k);
        true
    }

    fn put_owned(&mut self, k: u64) {
        if self.touch_owned(k) {
            return;
        }
        self.owned.insert(0, k);
        self.writes += 1;
        self.owned_written.insert(k, self.writes);
        if self.owned.len() > self.owned_slots {
            let evicted = self.owned.pop().expect("over capacity");
            self.owned_written.remove(&evicted);
        }
    }

    fn delete(&mut self, k: u64) {
        self.owned.retain(|&o| o != k);
        self.owned_written.remove(&k);
        self.bytes.remove(&k);
    }

    fn reopen(&mut self, warm: WarmStart) {
        match warm {
            WarmStart::Cold => *self = Model { owned_slots: self.owned_slots, ..Model::default() },
            WarmStart::Verify => {
                self.owned.sort_by_key(|k| std::cmp::Reverse(self.owned_written[k]));
            }
        }
    }
}

fn step(
    store: &mut BlockStore,
    model: &mut Model,
    op: &Op,
    cfg: &StoreConfig,
) -> Result<(), TestCaseError> {
    match *op {
        Op::Put { k, class, salt, len } => {
            let data = bytes(k, salt, len);
            if store.has(&key(k)) {
                prop_assert!(model.bytes.contains_key(&k), "store holds {k}, model does not");
            } else {
                model.bytes.insert(k, data.clone());
            }
            let admitted = store.put(key(k), &data, class).unwrap();
            prop_assert_eq!(admitted, store.has(&key(k)), "admitted iff cached");
            match class {
                BlockClass::Owned => model.put_owned(k),
                BlockClass::Borrowed => {
                    model.touch_owned(k);
                }
            }
        }
        Op::Get { k } => {
            let has = store.has(&key(k));
            let got = store.get(&key(k));
            prop_assert_eq!(has, got.is_some());
            if let Some(got) = got {
                prop_assert_eq!(
                    Some(&got[..]),
                    model.bytes.get(&k).map(|b| &b[..]),
                    "bytes of {}",
                    k
                );
            }
            model.touch_owned(k);
        }
        Op::Has { k } => {
            let has = store.has(&key(k));
            prop_assert!(has || !model.owned.contains(&k), "owned {k} vanished");
        }
        Op::Delete { k } => {
            store.delete(&key(k));
            prop_assert!(!store.has(&key(k)));
            model.delete(k);
        }
        Op::Reopen => {
            store.close();
            *store = BlockStore::open(cfg.clone()).unwrap();
            model.reopen(cfg.warm_start);
        }
    }
    Ok(())
}

fn check(store: &BlockStore, model: &mut Model) -> Result<(), TestCaseError> {
    store.check_invariants();
    // Keys the store dropped (eviction, refusal) start a new incarnation when put again.
    let gone: Vec<u64> = model.bytes.keys().copied().filter(|&k| !store.has(&key(k))).collect();
    for k in gone {
        model.bytes.remove(&k);
    }
    for k in 0..KEYS {
        prop_assert!(!store.has(&key(k)) || model.bytes.contains_key(&k), "unexplained key {k}");
    }
    let stats = store.stats();
    prop_assert!(stats.owned_blocks <= stats.owned_slots);
    prop_assert!(stats.borrowed_blocks <= stats.borrowed_slots);
    prop_assert!(stats.mem_blocks <= stats.mem_slots);
    prop_assert!(store.len() as u64 <= stats.owned_slots + stats.borrowed_slots + stats.mem_slots);
    // The owned budget is exactly the model's LRU: borrowed traffic never evicts an owned block.
    prop_assert_eq!(stats.owned_blocks, model.owned.len() as u64);
    for &k in &model.owned {
        prop_assert_eq!(store.disk.class_of(&key(k)), Some(BlockClass::Owned), "owned {}", k);
    }
    Ok(())
}

fn run(
    ops: &[Op],
    owned: u64,
    borrowed: u64,
    mem: u64,
    warm: WarmStart,
) -> Result<(), TestCaseError> {
    let dir = TestDir::new("model");
    let mut cfg = config(dir.path(), owned, borrowed, mem);
    cfg.warm_start = warm;
    let mut store = BlockStore::open(cfg.clone()).unwrap();
    let mut model = Model { owned_slots: owned as usize, ..Model::default() };
    for op in ops {
        step(&mut store, &mut model, op, &cfg)?;
        check(&store, &mut model)?;
    }
    store.close();
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn random_operations_agree_with_the_reference_model(
        owned in 1..4u64,
        borrowed in 1..4u64,
        mem in 0..3u64,
        verify in any::<bool>(),
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let warm = if verify { WarmStart::Verify } else { WarmStart::Cold };
        run(&ops, owned, borrowed, mem, warm)?;
    }
}
