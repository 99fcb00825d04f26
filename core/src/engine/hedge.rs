//! Tail control for peer fetches (seeds/engine.md §3.8): an online latency estimator and a hedge
//! limiter.
//!
//! A peer fetch has two escalations, kept apart:
//!
//! | escalation | trigger | rate limited? |
//! |---|---|---|
//! | failover | the contender definitively failed (an error, a miss, a timeout) | no: it reacts to a known-bad peer, and throttling it would send a subtree to the origin while a peer that holds the block sits idle |
//! | hedge | the contender is merely slow (past the estimated p99) | yes, to [`HedgeLimiter::ratio`]: when a whole cluster is slow, unthrottled duplicates double its load |
//!
//! The hedge delay is the exact p99 of a bounded window of recent peer fetches that *held* the
//! block (a fast miss must not collapse it), floored at [`DELAY_FLOOR`] so a fast cluster does not
//! hedge on noise and capped at [`DELAY_CAP`] so a pathological sample cannot disable hedging.
//! Until [`SAMPLES_MIN`] samples exist there is no estimate; a node then hedges after
//! [`COLD_DELAY`], and it starts with one hedge banked. Without both, a node that meets a stalled
//! peer on its first fetch could neither hedge (no delay, no credit: 20 fetches earn the first
//! hedge at the default ratio) nor fail over before its cold head bound (1.5 s): the
//! `stalled-peer` scenario's slowest read was that bound plus the read, 2.4 × a stall-free read.
//! The banked hedge is the one burst the cap allows: at most one extra request per node, once.

use std::collections::VecDeque;
use std::time::Duration;

/// Samples needed before the estimator answers.
pub const SAMPLES_MIN: usize = 16;
/// Samples kept (the oldest age out).
pub const WINDOW: usize = 512;
/// Shortest hedge delay.
pub const DELAY_FLOOR: Duration = Duration::from_millis(5);
/// Longest hedge delay.
pub const DELAY_CAP: Duration = Duration::from_secs(2);
/// The hedge delay of a node without an estimate yet: a quarter of the default cold response-head
/// wait (`Bounds::cold_peer_head`, 1.5 s), as the head wait is four times the p99 it presumes.
pub const COLD_DELAY: Duration = Duration::from_millis(375);
/// When a primary peer fetch is first looked at while there is no estimate yet: the liveness
/// probe of its peer ([`crate::engine::Read::handle_hedge_due`]), a held-only ask that spends no
/// hedge credit and that a live peer answers at once. For a last ancestor that probe is the
/// hedge; with another ancestor left, a silent peer is left for it at once and a live one is
/// hedged at [`COLD_DELAY`] as before. Shorter than [`COLD_DELAY`]: a node that meets a dead
/// root in its first seconds otherwise waits out the whole cold delay first (`dead-root`, 0.1-0.2
/// s in: 0.44-0.56 s per fault with [`COLD_DELAY`], 0.23-0.35 s with this), and so does one
/// that meets a stalled parent (`stalled-peer`, with the held-only bound of the same day:
/// 0.29-0.31 s, 0.10-0.15 s with both). Only for a head that has not come: a body that stops is
/// probed a hedge delay after it last moved (on a narrow link a live root's body pauses longer
/// than this, and its probe, unanswered within the probe wait, sent every window to the origin
/// a second time: `herd-narrow-links`).
pub const COLD_PROBE_DELAY: Duration = Duration::from_millis(150);
/// Default [`HedgeLimiter::ratio`].
pub const DEFAULT_HEDGE_RATIO: f64 = 0.05;

/// Exact quantiles over the last [`WINDOW`] samples.
#[derive(Clone, Debug, Default)]
pub struct LatencyEstimator {
    /// Arrival order (for ageing out).
    order: VecDeque<Duration>,
    /// The same samples, sorted (for exact quantiles).
    sorted: Vec<Duration>,
}

impl LatencyEstimator {
    /// Records one fetch that held the block and took `d`.
    pub fn record(&mut self, d: Duration) {
        if self.order.len() == WINDOW {
            let old = self.order.pop_front().expect("a full window");
            let i = self.sorted.binary_search(&old).expect("every sample is in the sorted copy");
            self.sorted.remove(i);
        }
        self.order.push_back(d);
        let i = self.sorted.partition_point(|x| *x <= d);
        self.sorted.insert(i, d);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Whether no sample is held.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// The exact `q`-quantile (nearest rank: the smallest sample with at least `q` of the samples
    /// at or below it), or `None` below [`SAMPLES_MIN`] samples.
    pub fn quantile(&self, q: f64) -> Option<Duration> {
        let n = self.sorted.len();
        if n < SAMPLES_MIN {
            return None;
        }
        let rank = (q.clamp(0.0, 1.0) * n as f64).ceil() as usize;
        Some(self.sorted[rank.clamp(1, n) - 1])
    }

    /// The hedge delay: p99 within [[`DELAY_FLOOR`], [`DELAY_CAP`]], `None` without an estimate.
    pub fn hedge_delay(&self) -> Option<Duration> {
        self.quantile(0.99).map(|p99| p99.clamp(DELAY_FLOOR, DELAY_CAP))
    }
}

/// Keeps the long-run share of hedged fetches at or below `ratio`: every fetch earns `ratio` of a
/// hedge, a hedge spends one, and banked credit is capped at one so an idle period cannot release
/// a burst. A limiter with a non-zero ratio starts with that one hedge banked (a node that just
/// started may hedge its first slow fetch); over `n` fetches it allows at most `1 + ratio × n`.
#[derive(Clone, Debug)]
pub struct HedgeLimiter {
    ratio: f64,
    credit: f64,
}

impl HedgeLimiter {
    /// A limiter allowing `ratio` (clamped to `[0, 1]`; not a number means the default).
    pub fn new(ratio: f64) -> Self {
        let ratio = if ratio.is_nan() { DEFAULT_HEDGE_RATIO } else { ratio.clamp(0.0, 1.0) };
        let credit = if ratio > 0.0 { 1.0 } else { 0.0 };
        HedgeLimiter { ratio, credit }
    }

    /// The configured share.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// A fetch started: it earns its share of a hedge.
    pub fn on_fetch(&mut self) {
        self.credit = (self.credit + self.ratio).min(1.0);
    }

    /// Whether a hedge may fire now; if so, it is paid for.
    pub fn try_hedge(&mut self) -> bool {
        // A little slack for floating-point sums of the ratio.
        if self.credit >= 1.0 - 1e-9 {
            self.credit -= 1.0;
            self.credit = self.credit.max(0.0);
            true
        } else {
            false
        }
    }
}

impl Default for HedgeLimiter {
    fn default() -> Self {
        HedgeLimiter::new(DEFAULT_HEDGE_RATIO)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_estimator_needs_sixteen_samples_and_answers_exact_quantiles() {
        let mut e = LatencyEstimator::default();
        for i in 1..=15 {
            e.record(ms(i));
        }
        assert_eq!(e.quantile(0.5), None);
        assert_eq!(e.hedge_delay(), None);
        e.record(ms(16));
        assert_eq!(e.quantile(0.5), Some(ms(8)));
        assert_eq!(e.quantile(0.99), Some(ms(16)));
        for i in 17..=100 {
            e.record(ms(i));
        }
        // Samples 1..=100 ms in shuffled arrival would give the same: the order does not matter.
        assert_eq!(e.quantile(0.5), Some(ms(50)));
        assert_eq!(e.quantile(0.99), Some(ms(99)));
        assert_eq!(e.quantile(1.0), Some(ms(100)));
    }

    #[test]
    fn old_samples_age_out_of_the_window() {
        let mut e = LatencyEstimator::default();
        for _ in 0..WINDOW {
            e.record(ms(1000));
        }
        assert_eq!(e.quantile(0.5), Some(ms(1000)));
        for _ in 0..WINDOW {
            e.record(ms(10));
        }
        assert_eq!(e.len(), WINDOW);
        assert_eq!(e.quantile(0.99), Some(ms(10)), "the slow era is gone");
    }

    #[test]
    fn the_hedge_delay_is_floored_and_capped() {
        let mut fast = LatencyEstimator::default();
        let mut slow = LatencyEstimator::default();
        for _ in 0..SAMPLES_MIN {
            fast.record(Duration::from_micros(50));
            slow.record(Duration::from_secs(60));
        }
        assert_eq!(fast.hedge_delay(), Some(DELAY_FLOOR));
        assert_eq!(slow.hedge_delay(), Some(DELAY_CAP));
    }

    #[test]
    fn the_limiter_keeps_the_long_run_share_at_its_ratio() {
        for ratio in [0.05, 0.25, 0.5] {
            let mut l = HedgeLimiter::new(ratio);
            let mut hedges = 0u32;
            let fetches = 10_000;
            for _ in 0..fetches {
                l.on_fetch();
                // Every fetch is slow: each would hedge if allowed.
                if l.try_hedge() {
                    hedges += 1;
                }
            }
            let share = f64::from(hedges) / f64::from(fetches);
            assert!((share - ratio).abs() < 0.002, "ratio {ratio}: share {share}");
        }
    }

    #[test]
    fn the_limiter_clamps_its_ratio_and_banks_at_most_one_hedge() {
        assert_eq!(HedgeLimiter::new(7.0).ratio(), 1.0);
        assert_eq!(HedgeLimiter::new(-1.0).ratio(), 0.0);
        assert_eq!(HedgeLimiter::new(f64::NAN).ratio(), DEFAULT_HEDGE_RATIO);
        let mut off = HedgeLimiter::new(0.0);
        for _ in 0..1000 {
            off.on_fetch();
        }
        assert!(!off.try_hedge(), "a zero ratio never hedges");
        // A fresh limiter holds the one hedge a node starts with, and no more.
        let mut fresh = HedgeLimiter::new(0.05);
        assert!(fresh.try_hedge(), "a node that just started may hedge once");
        assert!(!fresh.try_hedge());
        for _ in 0..19 {
            fresh.on_fetch();
        }
        assert!(!fresh.try_hedge(), "19 fetches earn 0.95 of a hedge");
        fresh.on_fetch();
        assert!(fresh.try_hedge(), "the 20th earns the next");
        // A long run of fast fetches (none needed a hedge) banks at most one.
        let mut l = HedgeLimiter::new(0.05);
        for _ in 0..100_000 {
            l.on_fetch();
        }
        assert!(l.try_hedge());
        assert!(!l.try_hedge(), "no burst after a quiet period");
    }
}
