//! Per-peer circuit breaker with generations and half-open probes (seeds/peer.md §3.5).
