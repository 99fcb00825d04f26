//! Sending one connection's plan and reading back what the node answered.

use super::gen::{Ending, Item, Plan};
use std::net::SocketAddr;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Most answer bytes kept per connection (answers are small; a whole object is 40 KiB).
const READ_BYTES_MAX: usize = 16 << 20;

/// How the node's side of a connection ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum End {
    /// The node closed it (FIN).
    Closed,
    /// The node reset it (it closed with our bytes unread, as a server does after a 400).
    Reset,
    /// We dropped it mid-head, as planned; nothing read.
    Dropped,
    /// Neither closed nor reset within the bound: the node holds a connection it should not.
    Stuck,
    /// More than [`READ_BYTES_MAX`] came back.
    Capped,
}

/// One response read off the connection.
pub struct Answer {
    pub head: String,
    pub status: u16,
    pub body: Vec<u8>,
    /// Its whole body arrived (by `Content-Length`, chunked framing or the close).
    pub complete: bool,
}

/// What happened on one connection.
pub struct Outcome {
    pub answers: Vec<Answer>,
    pub end: End,
    /// How long the node took to close a stalled connection.
    pub stall_closed_after: Option<Duration>,
    /// The node closed before it took all our bytes.
    pub write_cut: bool,
}

/// Sends `plan` to `addr` and reads the node's answers; `bound` bounds how long the node may take
/// to close the connection after our last byte (half-closed, or stalled mid-head).
pub async fn run(addr: SocketAddr, plan: &Plan, bound: Duration) -> std::io::Result<Outcome> {
    let stream = TcpStream::connect(addr).await?;
    stream.set_nodelay(true)?;
    let bytes = plan.bytes();
    let (mut rx, mut tx) = stream.into_split();
    let half_close = plan.ending == Ending::HalfClose;
    let write = async move {
        let ok = tx.write_all(&bytes).await.is_ok();
        if half_close {
            let _ = tx.shutdown().await;
        }
        (ok, tx)
    };
    if plan.ending == Ending::Drop {
        let (ok, tx) = write.await;
        drop((tx, rx));
        let end = End::Dropped;
        return Ok(Outcome { answers: Vec::new(), end, stall_closed_after: None, write_cut: !ok });
    }
    let t0 = Instant::now();
    let ((ok, tx), (buf, end)) = tokio::join!(write, read_all(&mut rx, bound));
    drop(tx);
    let stall_closed_after = (plan.ending == Ending::Stall
        && matches!(end, End::Closed | End::Reset))
    .then(|| t0.elapsed());
    let answers = parse_answers(&buf, &plan.items);
    Ok(Outcome { answers, end, stall_closed_after, write_cut: !ok })
}

async fn read_all(rx: &mut tokio::net::tcp::OwnedReadHalf, bound: Duration) -> (Vec<u8>, End) {
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 64 << 10];
    let deadline = tokio::time::Instant::now() + bound;
    loop {
        match tokio::time::timeout_at(deadline, rx.read(&mut chunk)).await {
            Err(_) => return (buf, End::Stuck),
            Ok(Ok(0)) => return (buf, End::Closed),
            Ok(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
            Ok(Err(_)) => return (buf, End::Reset),
        }
        if buf.len() > READ_BYTES_MAX {
            return (buf, End::Capped);
        }
    }
}

/// Splits what came back into answers, skipping interim (1xx) heads. HTTP/1.1 answers
/// pipelined requests in order, so answer `i` is normally item `i`'s; an item whose head a
/// byte-level mutation left unterminated merges with the next, and the count is then off by one.
pub fn parse_answers(buf: &[u8], items: &[Item]) -> Vec<Answer> {
    let mut answers = Vec::new();
    let mut pos = 0;
    for item in items {
        let (status, raw, headers, body_at) = loop {
            let Some(end) = find(&buf[pos..], b"\r\n\r\n") else { return answers };
            let head = String::from_utf8_lossy(&buf[pos..pos + end]).into_owned();
            pos += end + 4;
            let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
            if !(100..200).contains(&status) || status == 101 {
                let lower = head.to_ascii_lowercase();
                break (status, head, lower, pos);
            }
        };
        let header = |name: &str| {
            headers.lines().find_map(|l| Some(l.strip_prefix(name)?.strip_prefix(':')?.trim()))
        };
        // A HEAD's answer announces a length but has no body: the next thing on the wire is
        // another answer or the close. (Decided from the wire, not only from the item: a
        // byte-level mutation can merge two heads, so answers and items may be out of step.)
        let rest = &buf[body_at..];
        let bodiless = rest.starts_with(b"HTTP/1.") || (rest.is_empty() && item.is_head());
        let (body, complete, next) = if bodiless || status == 204 || status == 304 {
            (Vec::new(), true, body_at)
        } else if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
            dechunk(&buf[body_at..])
                .map_or((buf[body_at..].to_vec(), false, buf.len()), |(b, n)| {
                    (b, true, body_at + n)
                })
        } else if let Some(len) = header("content-length").and_then(|v| v.parse::<usize>().ok()) {
            let have = (buf.len() - body_at).min(len);
            (buf[body_at..body_at + have].to_vec(), have == len, body_at + have)
        } else {
            (buf[body_at..].to_vec(), true, buf.len())
        };
        answers.push(Answer { head: raw, status, body, complete });
        if !complete {
            return answers;
        }
        pos = next;
    }
    answers
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Decodes a chunked body at the start of `buf`: the body and the bytes it took, or `None` when
/// it is incomplete or malformed.
fn dechunk(buf: &[u8]) -> Option<(Vec<u8>, usize)> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let line_end = pos + find(&buf[pos..], b"\r\n")?;
        let size_text = std::str::from_utf8(&buf[pos..line_end]).ok()?;
        let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
        pos = line_end + 2;
        if size == 0 {
            let trailer_end = pos + find(&buf[pos..], b"\r\n")?;
            return Some((body, trailer_end + 2));
        }
        body.extend_from_slice(buf.get(pos..pos + size)?);
        pos += size + 2;
    }
}
