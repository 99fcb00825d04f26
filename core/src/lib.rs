//! Sans-IO core of dart: one node as one state machine ([`node::Node`]), and beneath it geometry,
//! placement, codecs, the read-through engine, origin flights, the per-peer circuit breaker and
//! TinyLFU admission, as pure state machines and functions.
//!
//! Nothing in this crate performs I/O, reads a clock or draws ambient randomness. Time comes in as
//! [`time::Instant`] arguments, randomness as seeded [`rng::Rng`]s, and decisions go out as values.
//! Both drivers execute [`node::Node`]: the tokio/hyper shell (`dart-net-tokio`, wired by
//! `dart-node`, also run under turmoil) and the simulator (`dart-sim`). Which source serves a
//! block, what is coalesced and cached, whom the breaker blames, when an exchange is given up and
//! what a relay forwards are decided here once; the drivers keep only transport and world
//! mechanics (docs/architecture.md lists them).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod breaker;
pub mod bufpool;
pub mod codec;
pub mod discovery;
pub mod engine;
pub mod geometry;
pub mod hash;
pub mod hrw;
pub mod identity;
pub mod integrity;
pub mod membership;
pub mod node;
pub mod overlay;
pub mod peer_auth;
pub mod policy;
pub mod registry;
pub mod rng;
pub mod time;
pub mod tracker;
pub mod tree;
mod walk_gate;
