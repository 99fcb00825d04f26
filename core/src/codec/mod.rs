//! Parsers and printers for everything that crosses a wire: HTTP ranges, origin Content-Range,
//! the peer block path and hop header, byte-size flags and credential redaction. Each parser takes
//! hostile input: it never panics and returns a typed error.
