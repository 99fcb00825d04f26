//! The peer transport over real loopback sockets (seeds/peer.md §2–§5, §7): `PeerClient` against
//! a real `PeerPlane` driving core relay reads, and against hand-written hostile servers that
//! write whatever bytes they like; breaker properties are checked through a reader node's engine
//! driven by `NodeCore::next`, so every answer crosses a real socket.

mod bounds;
mod breaker;
mod hostile;
mod isolation;
mod load;
mod relay;
mod support;
mod wire_form;
