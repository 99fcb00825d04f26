//! tokio/hyper shell for dart: it executes the core's node machine (`dart_core::node::Node`) and
//! moves bytes; every decision is the machine's.
//!
//! - [`driver`]: feeds the node what happened and carries out its outputs: exchanges, store
//!   operations, response parts, its timers.
//! - [`client`]: the pooled outbound HTTP/1.1 client over the seam (no timeouts of its own).
//! - [`seam`]: listeners, dialers and the clock, so the same code runs on tokio and turmoil.
//! - [`server`]: the bounded accept loop with graceful shutdown; [`guard`]: its per-connection
//!   bounds (write progress, head and idle timers, abort).
//! - [`store`]: the block store (RAM hot set, owned/borrowed disk arenas, TinyLFU admission).
//! - [`cache`], [`metrics`], [`body`]: the block cache seam, Prometheus exposition and bodies.
//! - [`origin_server`]: a generated-object origin for the demo and tests.
//! - [`registry_auth`]: the registry credentials' token cache and exchange singleflight (the
//!   decisions are `dart_core::registry::auth`'s).

pub mod body;
pub mod cache;
pub mod client;
pub mod driver;
pub mod guard;
pub mod mapped;
pub mod memory;
pub mod metrics;
pub mod origin_server;
pub mod registry_auth;
pub mod seam;
pub mod server;
pub mod store;
