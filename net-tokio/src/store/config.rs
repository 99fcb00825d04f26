//! Store configuration and the budget arithmetic of store.md §3.

use std::path::PathBuf;

use super::StoreError;

/// Largest accepted block (slot) size: 1 GiB. Real deployments use 4 MiB.
pub const MAX_BLOCK_BYTES: u64 = 1 << 30;
/// Largest slot count of one budget (owned, borrowed or RAM). Bounds the in-memory index: at 4 MiB
/// blocks it is 64 TiB, at 64 KiB blocks 1 TiB.
pub const MAX_SLOTS: u64 = 1 << 24;
use dart_core::admission::split_slots;
/// Owned share of the disk slots when [`StoreConfig::owned_fraction`] is `None`.
pub use dart_core::admission::DEFAULT_OWNED_FRACTION;

/// What [`BlockStore::open`](super::BlockStore::open) does with arena files left by a previous run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WarmStart {
    /// Truncate both arenas and start empty, like DART. No slot headers or checksums are written,
    /// and no bytes (including bytes fetched with credentials) survive a restart.
    #[default]
    Cold,
    /// Keep every slot whose header and checksum verify and drop the rest (torn or partial
    /// writes), rebuilding empty if the arena geometry or format changed. Puts pay a checksum over
    /// the block (its XXH3-128 digest).
    Verify,
}

/// Start-up configuration of a [`BlockStore`](super::BlockStore).
#[derive(Clone, Debug, PartialEq)]
pub struct StoreConfig {
    /// Cache directory; created if missing, locked for the life of the store.
    pub dir: PathBuf,
    /// Disk budget in bytes, split into owned and borrowed slots of `block_bytes`.
    pub cache_bytes: u64,
    /// RAM hot-set budget in bytes; below one block the RAM tier is off.
    pub mem_bytes: u64,
    /// Block (slot) size in bytes.
    pub block_bytes: u64,
    /// Owned share of the disk slots, strictly between 0 and 1; `None` means 0.8.
    pub owned_fraction: Option<f64>,
    /// What to do with the previous run's arena files.
    pub warm_start: WarmStart,
    /// Write block data around the page cache (`O_DIRECT`) where the file system takes it
    /// (`arena::Writer`); `false`: through the page cache. `true` by default.
    pub direct_writes: bool,
}

impl StoreConfig {
    /// A configuration with the default owned fraction and a cold start.
    pub fn new(
        dir: impl Into<PathBuf>,
        cache_bytes: u64,
        mem_bytes: u64,
        block_bytes: u64,
    ) -> Self {
        StoreConfig {
            dir: dir.into(),
            cache_bytes,
            mem_bytes,
            block_bytes,
            owned_fraction: None,
            warm_start: WarmStart::Cold,
            direct_writes: true,
        }
    }
}

/// Slot counts of the three tiers, derived and validated from a [`StoreConfig`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Budgets {
    pub(crate) block_bytes: u64,
    pub(crate) owned_slots: u32,
    pub(crate) borrowed_slots: u32,
    /// 0 when the RAM tier is off.
    pub(crate) mem_slots: u32,
}

impl Budgets {
    /// Validates `config` and splits its budgets into slots (store.md §3).
    pub(crate) fn from_config(config: &StoreConfig) -> Result<Budgets, StoreError> {
        let block_bytes = config.block_bytes;
        if block_bytes == 0 {
            return Err(StoreError::ZeroBlockSize);
        }
        if block_bytes > MAX_BLOCK_BYTES {
            return Err(StoreError::BlockSizeTooLarge { block_bytes, max: MAX_BLOCK_BYTES });
        }
        let cache_bytes = config.cache_bytes;
        if cache_bytes == 0 {
            return Err(StoreError::ZeroCacheBudget);
        }
        if cache_bytes < block_bytes {
            return Err(StoreError::CacheSmallerThanBlock { cache_bytes, block_bytes });
        }
        let slots = cache_bytes / block_bytes;
        if slots < 2 {
            return Err(StoreError::TooFewSlots { cache_bytes, block_bytes, slots });
        }
        let fraction = owned_fraction(config.owned_fraction)?;
        let (owned, borrowed) = split_slots(slots, fraction);
        let mem = config.mem_bytes / block_bytes;
        let too_many = |tier, slots| StoreError::TooManySlots { tier, slots, max: MAX_SLOTS };
        let owned_slots = u32::try_from(owned).ok().filter(|&n| u64::from(n) <= MAX_SLOTS);
        let owned_slots = owned_slots.ok_or(too_many("cache", slots))?;
        let borrowed_slots = u32::try_from(borrowed).ok().filter(|&n| u64::from(n) <= MAX_SLOTS);
        let borrowed_slots = borrowed_slots.ok_or(too_many("cache", slots))?;
        let mem_slots = u32::try_from(mem).ok().filter(|&n| u64::from(n) <= MAX_SLOTS);
        let mem_slots = mem_slots.ok_or(too_many("mem", mem))?;
        let budgets = Budgets { block_bytes, owned_slots, borrowed_slots, mem_slots };
        debug_assert!(budgets.owned_slots >= 1 && budgets.borrowed_slots >= 1);
        debug_assert_eq!(u64::from(owned_slots) + u64::from(borrowed_slots), slots);
        Ok(budgets)
    }
}

/// `None` → the default; an explicit value must be finite and strictly inside (0, 1) (issue #17 N4:
/// an explicit 0 must not silently become the default).
fn owned_fraction(given: Option<f64>) -> Result<f64, StoreError> {
    match given {
        None => Ok(DEFAULT_OWNED_FRACTION),
        Some(f) if f.is_finite() && f > 0.0 && f < 1.0 => Ok(f),
        Some(f) => Err(StoreError::BadOwnedFraction(f)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budgets(cache: u64, mem: u64, block: u64, f: Option<f64>) -> Result<Budgets, StoreError> {
        let mut config = StoreConfig::new("/nonexistent", cache, mem, block);
        config.owned_fraction = f;
        Budgets::from_config(&config)
    }

    #[test]
    fn default_owned_fraction_gives_eighty_percent_of_the_slots_to_owned() {
        let b = budgets(1 << 30, 256 << 20, 4 << 20, None).unwrap();
        assert_eq!((b.owned_slots, b.borrowed_slots, b.mem_slots), (204, 52, 64));
        let b = budgets(10 * 4096 + 4095, 0, 4096, None).unwrap();
        assert_eq!((b.owned_slots, b.borrowed_slots, b.mem_slots), (8, 2, 0));
    }

    #[test]
    fn every_budget_keeps_at_least_one_slot() {
        let b = budgets(2, 0, 1, Some(0.99)).unwrap();
        assert_eq!((b.owned_slots, b.borrowed_slots), (1, 1));
        let b = budgets(3, 0, 1, Some(0.01)).unwrap();
        assert_eq!((b.owned_slots, b.borrowed_slots), (1, 2));
        let b = budgets(100, 0, 1, Some(0.999)).unwrap();
        assert_eq!((b.owned_slots, b.borrowed_slots), (99, 1));
        let b = budgets(1000, 0, 1, Some(f64::from_bits(0.999_f64.to_bits() + 1))).unwrap();
        assert_eq!(b.owned_slots + b.borrowed_slots, 1000);
    }

    #[test]
    fn owned_fraction_outside_the_open_unit_interval_or_not_finite_is_rejected() {
        for f in [0.0, -0.1, 1.0, 1.5, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let err = budgets(1 << 20, 0, 4096, Some(f)).unwrap_err();
            assert!(matches!(err, StoreError::BadOwnedFraction(_)), "{f}: {err}");
        }
        assert!(budgets(1 << 20, 0, 4096, Some(0.5)).is_ok());
    }

    #[test]
    fn cache_budget_of_zero_is_rejected() {
        assert!(matches!(budgets(0, 0, 4096, None), Err(StoreError::ZeroCacheBudget)));
    }

    #[test]
    fn cache_smaller_than_one_block_is_rejected() {
        let err = budgets(4095, 0, 4096, None).unwrap_err();
        assert!(matches!(err, StoreError::CacheSmallerThanBlock { .. }), "{err}");
    }

    #[test]
    fn cache_of_fewer_than_two_slots_is_rejected() {
        let err = budgets(2 * 4096 - 1, 0, 4096, None).unwrap_err();
        assert!(matches!(err, StoreError::TooFewSlots { slots: 1, .. }), "{err}");
        assert!(err.to_string().contains("at least 2"));
    }

    #[test]
    fn zero_or_huge_block_size_is_rejected() {
        assert!(matches!(budgets(1 << 20, 0, 0, None), Err(StoreError::ZeroBlockSize)));
        let err = budgets(u64::MAX, 0, MAX_BLOCK_BYTES + 1, None).unwrap_err();
        assert!(matches!(err, StoreError::BlockSizeTooLarge { .. }), "{err}");
    }

    #[test]
    fn slot_counts_above_the_index_limit_are_rejected() {
        let err = budgets(u64::MAX, 0, 1, None).unwrap_err();
        assert!(matches!(err, StoreError::TooManySlots { tier: "cache", .. }), "{err}");
        let err = budgets(1 << 20, u64::MAX, 1, None).unwrap_err();
        assert!(matches!(err, StoreError::TooManySlots { tier: "mem", .. }), "{err}");
    }

    #[test]
    fn mem_budget_below_one_block_turns_the_ram_tier_off() {
        assert_eq!(budgets(1 << 20, 4095, 4096, None).unwrap().mem_slots, 0);
        assert_eq!(budgets(1 << 20, 4096, 4096, None).unwrap().mem_slots, 1);
    }
}
