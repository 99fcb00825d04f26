//! Sans-IO core of dart: geometry, placement, codecs, the read-through engine and the per-peer
//! circuit breaker, as pure state machines.
//!
//! Nothing in this crate performs I/O, reads a clock or draws ambient randomness. Time comes in as
//! [`time::Instant`] arguments, randomness as seeded [`rng::Rng`]s, and decisions go out as values
//! that a shell (`dart-net-tokio`) or the simulator (`dart-sim`) carries out. Because both drivers
//! run this same code, every decision the simulator checks is the decision production makes.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod breaker;
pub mod codec;
pub mod engine;
pub mod geometry;
pub mod hash;
pub mod hrw;
pub mod identity;
pub mod membership;
pub mod node;
pub mod rng;
pub mod time;
pub mod tree;
