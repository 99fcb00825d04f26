//! Deterministic event-driven simulator of dart clusters built from the real `dart-core` state
//! machines: a virtual clock, one seeded RNG, simulated links and origin, and invariant checks.
//!
//! # Shape
//!
//! A run is a value ([`SimSpec`]: cluster, workload, fault plan, phases) plus a seed. [`Sim`]
//! keeps one event queue ordered by `(time, sequence)`; the clock jumps from event to event. Each
//! node is the real core [`Engine`](dart_core::engine::Engine) driving real
//! [`Read`](dart_core::engine::Read)s, with a simulated block cache and the same origin
//! coalescing (`FlightTable`) and answer judging the tokio shell uses (`shell.rs` mirrors
//! `net-tokio`'s client plane and origin fetcher). Messages cross a simulated network
//! ([`net`]); the origin ([`origin`]) serves bytes that are a pure function of object and
//! offset ([`content`]), so every delivered and every cached byte is checked.
//!
//! # Determinism
//!
//! One root seed; every component's RNG is a child drawn in a fixed order. Ordered containers
//! only (`clippy.toml` bans hash maps here), no clocks. Every event writes one trace line into a
//! running hash ([`trace`]); two runs of one seed must print the same hash.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod cache;
pub mod calls;
pub mod config;
pub mod content;
pub mod fault;
pub mod net;
pub mod node;
pub mod origin;
mod peer;
pub mod queue;
pub mod report;
mod shell;
mod sim;
pub mod trace;
pub mod workload;

pub use config::{CheckLevel, ClusterConfig, Phases, ShellBounds, SimSpec};
pub use fault::{Fault, FaultClass, FaultKind, FaultPlan, Lie, OriginFault, SwarmSpace};
pub use report::{BlockSource, Phase, ReadOutcome, ReadRecord, RunReport, Violation};
pub use sim::{CallFailure, Sim};
pub use workload::{RangeSpec, ReadSpec, Workload};

/// Runs `spec` under `seed` to the end.
pub fn run(spec: SimSpec, seed: u64) -> RunReport {
    Sim::new(spec, seed).run()
}
