//! Parsers and printers for everything that crosses a wire: HTTP ranges, origin Content-Range,
//! the peer block path and hop header, byte-size flags and credential redaction. Each parser takes
//! hostile input: it never panics and returns a typed error.

pub mod conditional;
pub mod content_range;
mod num;
pub mod range;
pub mod redact;
pub mod roster;
pub mod size;
pub mod wire;

pub use content_range::{parse_content_range, ContentRange, ContentRangeError};
pub use range::{
    content_range_header, resolve_range, unsatisfied_content_range, RangeError, RangeOutcome,
};
pub use redact::{redact_url, strip_userinfo};
pub use size::{format_byte_size, parse_byte_size, SizeError};
pub use wire::{block_path, parse_block_path, parse_hop, HopError, WireError};
