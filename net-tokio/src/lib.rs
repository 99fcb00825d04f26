//! tokio/hyper shell for dart: it moves bytes for the decisions `dart-core` makes.
//!
//! - [`seam`]: listeners, dialers and the clock, so the same code runs on tokio and turmoil.
//! - [`origin`]: the origin fetcher (probe, block window, passthrough), coalesced by the core's
//!   flight table.
//! - [`client_plane`]: the HTTP client plane driving core reads.
//! - [`server`]: the accept loop with graceful shutdown.
//! - [`store`]: the block store (RAM hot set, owned/borrowed disk arenas, TinyLFU admission).
//! - [`cache`], [`metrics`], [`body`]: the block cache seam, Prometheus exposition and bodies.
//! - [`origin_server`]: a generated-object origin for the demo and tests.

pub mod body;
pub mod cache;
pub mod client_plane;
pub mod driver;
pub mod metrics;
pub mod origin;
pub mod origin_server;
pub mod peer_client;
pub mod peer_plane;
pub mod seam;
pub mod server;
pub mod store;
