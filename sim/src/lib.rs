//! Deterministic event-driven simulator of dart clusters that runs the real node machine: a
//! virtual clock, one seeded RNG, simulated links and origin, and an oracle over everything the
//! nodes do.
//!
//! # What is shared, what is the simulator's
//!
//! Each simulated node is exactly [`dart_core::node::Node`], the machine production runs (reads,
//! origin flight coalescing, peer fetches and their judging, relays with cut-through, breaker
//! permits, every exchange bound as a timer), built from a core
//! [`Engine`](dart_core::engine::Engine) with its peer half, over a simulated block cache
//! ([`cache`]). The simulator makes no decision a node makes. It owns only what production gets
//! from the outside world:
//!
//! - the network ([`net`]) and the exchanges over it ([`calls`]): dials, pooled connections,
//!   latency, bandwidth, loss, silent paths that stall a call until it heals (TCP
//!   retransmission) or the node's own timer gives up and cancels, refused dials, resets;
//! - the origin ([`origin`]), serving bytes that are a pure function of object, version and
//!   offset ([`content`]); an object can be replaced mid-run by a new version
//!   ([`FaultKind::ReplaceObject`]);
//! - faults ([`fault`]), the workload ([`workload`]), the report ([`report`]); a rotting store
//!   ([`FaultKind::Rot`]) changes bytes the cache holds, as a faulty disk or memory would;
//! - block digests: nodes hash through [`content::SimHasher`], which returns the digests
//!   production computes ([`dart_core::integrity`]) but hashes each generator slice once per run;
//! - the oracle: every byte a client receives or a cache stores (of the one version the response's
//!   head names, of the version the node believes in), every response head, coalescing, the
//!   machine's own invariants, timers. It observes the machine's outputs; it does not run
//!   beside it.
//!
//! A node's outputs are carried out as the contract on [`Node`](dart_core::node::Node) says: an
//! `Output::Send` becomes a call whose progress the node is told as `IoEvent`s at simulated times,
//! store operations are answered from the cache at once, response parts go to the local client
//! or back over a peer's call, events feed the trace and the report.
//!
//! # Shape
//!
//! A run is a value ([`SimSpec`]: cluster, workload, fault plan, phases) plus a seed. [`Sim`]
//! keeps one event queue ordered by `(time, sequence)`; the clock jumps from event to event.
//!
//! # Determinism
//!
//! One root seed; every component's RNG is a child drawn in a fixed order. Ordered containers
//! only (`clippy.toml` bans hash maps here), no clocks. Every event writes trace lines into a
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
pub mod queue;
pub mod report;
mod sim;
pub mod trace;
pub mod workload;

pub use config::{CheckLevel, ClusterConfig, PeerConfig, Phases, SimSpec};
pub use dart_core::node::Bounds;
pub use fault::{Fault, FaultClass, FaultKind, FaultPlan, Lie, OriginFault, SwarmSpace};
pub use report::{BlockSource, Phase, ReadOutcome, ReadRecord, RunReport, Violation};
pub use sim::Sim;
pub use workload::{RangeSpec, ReadSpec, Workload};

/// Runs `spec` under `seed` to the end.
pub fn run(spec: SimSpec, seed: u64) -> RunReport {
    Sim::new(spec, seed).run()
}
