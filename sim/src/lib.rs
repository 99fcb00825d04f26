//! Deterministic event-driven simulator of dart clusters built from the real `dart-core` state
//! machines: a virtual clock, one seeded RNG, simulated links and origin, and invariant checks.

#![forbid(unsafe_code)]
