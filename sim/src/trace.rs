//! The run trace: one line per event, folded into a hash as it is written. Two runs of one seed
//! must print the same hash; the lines themselves are kept only when asked for (replay, report).

use dart_core::hash::Fnv1a;
use dart_core::time::Instant;
use std::fmt::{self, Write as _};

/// Lines kept at most when recording; a longer trace keeps hashing but stops storing.
pub const TRACE_LINES_MAX: usize = 2_000_000;

/// The trace of one run.
#[derive(Debug, Default)]
pub struct Trace {
    hash: Fnv1a,
    lines: u64,
    line: String,
    kept: Option<Vec<String>>,
}

impl Trace {
    /// A trace that hashes every line and keeps them when `record` is true.
    pub fn new(record: bool) -> Self {
        Trace { hash: Fnv1a::default(), lines: 0, line: String::new(), kept: record.then(Vec::new) }
    }

    /// Appends the line `<now in ns> <what>`.
    pub fn line(&mut self, now: Instant, what: fmt::Arguments<'_>) {
        self.line.clear();
        push_time(&mut self.line, now.as_nanos());
        self.line.write_fmt(what).expect("writing to a String");
        self.hash.write(self.line.as_bytes());
        self.hash.write(b"\n");
        self.lines += 1;
        if let Some(kept) = &mut self.kept {
            if kept.len() < TRACE_LINES_MAX {
                kept.push(self.line.clone());
            }
        }
    }

    /// The hash of every line so far.
    pub fn hash(&self) -> u64 {
        self.hash.finish()
    }

    /// Lines written so far.
    pub fn len(&self) -> u64 {
        self.lines
    }

    /// True when nothing was written.
    pub fn is_empty(&self) -> bool {
        self.lines == 0
    }

    /// The kept lines, if recording.
    pub fn take_lines(&mut self) -> Option<Vec<String>> {
        self.kept.take()
    }
}

/// Appends `nanos` right-aligned in 13 columns and a space, as `{:>13} ` would (by hand: this
/// runs for every line of every run).
fn push_time(line: &mut String, mut nanos: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (nanos % 10) as u8;
        nanos /= 10;
        if nanos == 0 {
            break;
        }
    }
    let text = std::str::from_utf8(&digits[at..]).expect("ASCII digits");
    for _ in text.len()..13 {
        line.push(' ');
    }
    line.push_str(text);
    line.push(' ');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_depends_on_every_line_and_on_recording_nothing_else() {
        let mut a = Trace::new(false);
        let mut b = Trace::new(true);
        for t in [&mut a, &mut b] {
            t.line(Instant::from_millis(1), format_args!("read {}", 1));
            t.line(Instant::from_millis(2), format_args!("done"));
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(b.take_lines().map(|l| l.len()), Some(2));
        let mut c = Trace::new(false);
        c.line(Instant::from_millis(1), format_args!("read {}", 2));
        c.line(Instant::from_millis(2), format_args!("done"));
        assert_ne!(a.hash(), c.hash());
    }

    #[test]
    fn times_are_written_as_the_format_string_would() {
        for nanos in [0, 7, 1_000_000, 9_999_999_999_999, 10_000_000_000_000, u64::MAX] {
            let mut line = String::new();
            push_time(&mut line, nanos);
            assert_eq!(line, format!("{nanos:>13} "));
        }
    }
}
