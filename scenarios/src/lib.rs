//! Seeded cluster-failure scenarios for dart, built on `dart-sim`: a catalogue with expectations
//! as code, a runner that survives panics and prints replay lines, a shrinker for failing fault
//! plans, and an HTML report.
//!
//! # Writing a scenario
//!
//! A [`Scenario`] is a name, a builder from `(seed, scale)` to a [`SimSpec`] (cluster shape,
//! workload, fault plan, phases) and an expectation over the run's [`RunReport`]. The simulator
//! already checks the safety invariants after every step (every delivered and cached byte, head
//! semantics, bounded maps, coalescing, no busy timers) and the liveness reads; an expectation
//! adds what the scenario is about: origin load, latency bounds, circuit behaviour.
//!
//! ```
//! use dart_scenarios::{Check, Scale, Scenario};
//! use dart_sim::{origin::ObjectDef, ClusterConfig, FaultPlan, Phases, ReadSpec, SimSpec, Workload};
//! use std::time::Duration;
//!
//! let mine = Scenario::new("two-readers", "two nodes read one object", |_seed, _scale| SimSpec {
//!     cluster: ClusterConfig::new(2, 64 << 10, vec![ObjectDef::plain(1 << 20, 1)]),
//!     workload: Workload {
//!         safety: vec![ReadSpec::whole(Duration::ZERO, 0, 0), ReadSpec::whole(Duration::ZERO, 1, 0)],
//!         liveness: vec![],
//!     },
//!     plan: FaultPlan::none(),
//!     phases: Phases { safety: Duration::from_secs(10), liveness: Duration::from_secs(10) },
//!     check: dart_sim::CheckLevel::Full,
//!     record_trace: false,
//! })
//! .expect(|run, check| {
//!     check.that(run.report.origin.body_bytes <= 1 << 20, "origin served the object once");
//! });
//! let outcome = mine.run(7, Scale::Test);
//! assert!(outcome.passed(), "{}", outcome.describe());
//! ```

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod catalogue;
pub mod html;
pub mod junit;
pub mod seeds;
pub mod shrink;

use dart_sim::{RunReport, SimSpec};
use std::fmt::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

/// How big a scenario runs: small enough for `cargo test` in debug, or at its full size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scale {
    /// Scaled down for the test suite.
    Test,
    /// The stated size (CLI and CI sweeps).
    Full,
}

/// One run as an expectation sees it.
pub struct Run<'a> {
    /// What ran.
    pub spec: &'a SimSpec,
    /// What it produced.
    pub report: &'a RunReport,
    /// The scale.
    pub scale: Scale,
}

/// Collects an expectation's verdicts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Expectations that failed.
    pub failures: Vec<String>,
    /// Measurements worth printing.
    pub notes: Vec<String>,
    /// Expectations that fail because of a documented limitation of the core (printed, not
    /// counted as failures; one that starts passing is noted as a closed gap).
    pub gaps: Vec<String>,
}

impl Check {
    /// Records a failure unless `ok`.
    pub fn that(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            self.failures.push(what.into());
        }
    }

    /// Records a measurement.
    pub fn note(&mut self, what: impl Into<String>) {
        self.notes.push(what.into());
    }

    /// An expectation the core does not meet yet for a documented reason: recorded as a gap
    /// when it fails, as a closed gap (a note) when it passes.
    pub fn gap(&mut self, ok: bool, what: impl Into<String>, why: &str) {
        let what = what.into();
        if ok {
            self.notes.push(format!("gap closed? {what} now holds ({why})"));
        } else {
            self.gaps.push(format!("{what} — {why}"));
        }
    }
}

type Build = dyn Fn(u64, Scale) -> SimSpec + Send + Sync;
type Expect = dyn Fn(&Run<'_>, &mut Check) + Send + Sync;

/// A named, seeded scenario with its expectation.
#[derive(Clone)]
pub struct Scenario {
    /// Name used on the command line.
    pub name: &'static str,
    /// One line on what it shows.
    pub summary: &'static str,
    build: Arc<Build>,
    expect: Arc<Expect>,
    /// Whether the simulator's own invariant violation is the expected outcome (a known gap).
    pub violation_expected: Option<&'static str>,
}

/// What one run of a scenario gave.
pub struct Outcome {
    /// Scenario name.
    pub scenario: &'static str,
    /// Seed.
    pub seed: u64,
    /// Scale.
    pub scale: Scale,
    /// The spec that ran.
    pub spec: SimSpec,
    /// The report, unless the run panicked.
    pub report: Option<RunReport>,
    /// The panic message, if it panicked.
    pub panic: Option<String>,
    /// The verdicts.
    pub check: Check,
}

impl Scenario {
    /// A scenario built by `build`, expecting only the simulator's invariants and liveness.
    pub fn new(
        name: &'static str,
        summary: &'static str,
        build: impl Fn(u64, Scale) -> SimSpec + Send + Sync + 'static,
    ) -> Self {
        Scenario {
            name,
            summary,
            build: Arc::new(build),
            expect: Arc::new(|_, _| {}),
            violation_expected: None,
        }
    }

    /// Adds the scenario's own expectation.
    pub fn expect(mut self, f: impl Fn(&Run<'_>, &mut Check) + Send + Sync + 'static) -> Self {
        self.expect = Arc::new(f);
        self
    }

    /// Marks the simulator's invariant violation as the expected result, for the reason given
    /// (a documented gap of the core that the checker exposes).
    pub fn violation_is_a_known_gap(mut self, why: &'static str) -> Self {
        self.violation_expected = Some(why);
        self
    }

    /// The spec of seed `seed` at `scale`.
    pub fn spec(&self, seed: u64, scale: Scale) -> SimSpec {
        (self.build)(seed, scale)
    }

    /// Runs seed `seed` at `scale` and judges it.
    pub fn run(&self, seed: u64, scale: Scale) -> Outcome {
        let spec = self.spec(seed, scale);
        self.run_spec(spec, seed, scale)
    }

    /// Runs an explicit spec (a shrunk plan, a recorded trace) under `seed` and judges it.
    pub fn run_spec(&self, spec: SimSpec, seed: u64, scale: Scale) -> Outcome {
        let result = catch_unwind(AssertUnwindSafe(|| dart_sim::run(spec.clone(), seed)));
        let mut check = Check::default();
        let (report, panic) = match result {
            Ok(report) => (Some(report), None),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_else(|| "panic".into());
                (None, Some(msg))
            }
        };
        if let Some(r) = &report {
            self.judge(&spec, r, scale, &mut check);
        }
        Outcome { scenario: self.name, seed, scale, spec, report, panic, check }
    }

    fn judge(&self, spec: &SimSpec, r: &RunReport, scale: Scale, check: &mut Check) {
        match (&r.violation, self.violation_expected) {
            (Some(v), Some(why)) => {
                check.gaps.push(format!("invariant violated as expected: {v} — {why}"));
                return;
            }
            (Some(v), None) => {
                check.failures.push(format!("invariant violated: {v}"));
                return;
            }
            (None, Some(why)) => {
                check.notes.push(format!("gap closed? no violation ({why})"));
            }
            (None, None) => {}
        }
        for l in &r.liveness_failures {
            check.failures.push(l.clone());
        }
        (self.expect)(&Run { spec, report: r, scale }, check);
    }
}

impl Outcome {
    /// No failure and no panic.
    pub fn passed(&self) -> bool {
        self.panic.is_none() && self.check.failures.is_empty()
    }

    /// The command that replays this run.
    pub fn replay_line(&self) -> String {
        replay_line(self.scenario, self.seed, self.scale)
    }

    /// Multi-line description: summary, failures, gaps, notes, and the replay line on failure.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        let status = if !self.passed() {
            "FAIL"
        } else if self.check.gaps.is_empty() {
            "ok"
        } else {
            "ok (known gap)"
        };
        let _ = write!(out, "{status:>14}  {} seed {}", self.scenario, self.seed);
        match (&self.report, &self.panic) {
            (Some(r), _) => {
                let _ =
                    write!(out, "  trace {:016x}, {} events, {}", r.trace_hash, r.events, r.end);
            }
            (None, Some(p)) => {
                let _ = write!(out, "  PANIC {p}");
            }
            (None, None) => {}
        }
        for f in &self.check.failures {
            let _ = write!(out, "\n      failed: {f}");
        }
        for g in &self.check.gaps {
            let _ = write!(out, "\n      gap: {g}");
        }
        for n in &self.check.notes {
            let _ = write!(out, "\n      note: {n}");
        }
        if !self.passed() {
            let _ = write!(out, "\n      plan: {}", self.spec.plan);
            let _ = write!(out, "\n      replay: {}", self.replay_line());
        }
        out
    }
}

/// The command that replays `scenario` under `seed`.
pub fn replay_line(scenario: &str, seed: u64, scale: Scale) -> String {
    let small = if scale == Scale::Test { " --small" } else { "" };
    format!("cargo run --release -p dart-scenarios -- replay {scenario} {seed}{small}")
}
