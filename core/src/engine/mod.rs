//! The read-through engine: the sans-IO state machines that turn a client read into size probes,
//! cache look-ups and block fetches, and decide what is cached.
