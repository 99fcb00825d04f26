//! Command-line flags (spec/node.md §5, spelled GNU-style).

use clap::{Args, Parser, Subcommand};
use dart_core::codec::size::parse_byte_size;

fn size(s: &str) -> Result<u64, String> {
    parse_byte_size(s).map_err(|e| e.to_string())
}

/// dart: a peer-to-peer read-through block cache for large immutable objects.
#[derive(Parser, Debug)]
#[command(name = "dart", version, about, args_conflicts_with_subcommands = true)]
pub struct Cli {
    /// Run a self-contained demo instead of a node.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Node flags.
    #[command(flatten)]
    pub node: NodeFlags,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Start an embedded origin and a node, read an object through the node and report.
    Demo(DemoFlags),
}

/// Flags of the demo.
#[derive(Args, Debug, Clone)]
pub struct DemoFlags {
    /// Size of the generated object.
    #[arg(long, default_value = "64MiB", value_parser = size)]
    pub object_size: u64,
    /// Block size.
    #[arg(long, default_value = "4MiB", value_parser = size)]
    pub block_size: u64,
    /// Keep the node and origin running after the report, for curl (one node only).
    #[arg(long)]
    pub serve: bool,
    /// Nodes to start: 1 reads through one node in this process; more start that many `dart`
    /// processes that discover each other, read the object at once, and read another after
    /// one of them is killed.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub nodes: u16,
    /// How long the embedded origin waits before answering each request: `0s` answers at once
    /// (loopback); `30ms` or more plays an origin across a WAN or an object store, whose first
    /// byte takes far longer than a block's bytes.
    #[arg(long, default_value = "0s", value_parser = duration)]
    pub origin_wait: std::time::Duration,
}

/// Flags of a node.
#[derive(Args, Debug, Clone)]
pub struct NodeFlags {
    /// Client listen address (`host:port`, or `:port` for all interfaces).
    #[arg(long, default_value = ":8080")]
    pub listen: String,
    /// Fixed upstream URL: every request reads it. Empty selects the prefix API.
    #[arg(long, default_value = "")]
    pub origin: String,
    /// PEM file of private CA certificates trusted for `https://` origins (besides the Mozilla
    /// root set built in).
    #[arg(long)]
    pub origin_ca_file: Option<std::path::PathBuf>,
    /// Prefix API path segment: `GET /<prefix>/<upstream-url>`.
    #[arg(long, default_value = "dart")]
    pub prefix: String,
    /// Registry mirror: the upstream registry (`http(s)://host[:port][/path]`). Blobs under
    /// `/v2/<name>/blobs/<digest>` are read through the cache and peers and checked against
    /// their digest when read whole; the rest of `/v2` is proxied. The prefix API stays
    /// beside it. Not with `--origin`.
    #[arg(long, default_value = "")]
    pub registry: String,
    /// Registry credentials, a JSON file `{"host[:port]": {"username": .., "password": ..}}`:
    /// origin requests to a listed host (the mirror's proxying and blob fetches alike) carry
    /// them, Basic or through the registry's bearer-token exchange; a client's own
    /// `Authorization` always wins, and no other host gets them.
    #[arg(long)]
    pub registry_auth: Option<std::path::PathBuf>,
    /// Admin listen address (`/healthz`, `/metrics`); empty disables it.
    #[arg(long, default_value = ":9100")]
    pub admin: String,
    /// Cache directory (created; locked against a second instance).
    #[arg(long, default_value = "./dart-cache")]
    pub cache_dir: std::path::PathBuf,
    /// Disk cache budget (e.g. 1GiB, 500MB, 1073741824).
    #[arg(long, default_value = "1GiB", value_parser = size)]
    pub cache_size: u64,
    /// RAM hot-set budget; below one block disables it.
    #[arg(long, default_value = "256MiB", value_parser = size)]
    pub mem_size: u64,
    /// Share of the disk budget for owned blocks, strictly between 0 and 1 (default 0.8).
    #[arg(long)]
    pub owned_fraction: Option<f64>,
    /// Keep verified blocks across a restart (each slot carries a checksummed header; torn or
    /// corrupt slots are dropped at start). Off: every start is cold. Note that kept blocks
    /// include bytes fetched with credentials. Kept blocks carry no version, so they are served
    /// only for objects that never change (content-addressed, --immutable); for others they are
    /// dropped at first look-up and read afresh.
    #[arg(long)]
    pub warm_start: bool,
    /// Write cached blocks through the page cache. Off: blocks are written around it (O_DIRECT)
    /// where the file system takes it, which cut a cold read's CPU to about a quarter on our
    /// machines (docs/benchmarks.md); a block so written is read from the disk, not memory, at its
    /// first disk-tier hit.
    #[arg(long)]
    pub buffered_writes: bool,
    /// Chunk size (placement unit).
    #[arg(long, default_value = "256MiB", value_parser = size)]
    pub chunk_size: u64,
    /// Block size (transfer and cache unit).
    #[arg(long, default_value = "4MiB", value_parser = size)]
    pub block_size: u64,
    /// Chunk-key namespace (must not contain the byte 0x1F).
    #[arg(long, default_value = "dart")]
    pub namespace: String,
    /// Recognise only OCI `/blobs/<digest>` paths as content addresses.
    #[arg(long)]
    pub oci_digest_only: bool,
    /// How long an object's size and validators (ETag, Last-Modified) are trusted before a read
    /// revalidates them with a 1-byte probe, when the origin's Cache-Control does not say.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub revalidate_after: std::time::Duration,
    /// A URL prefix whose objects never change (repeatable): never revalidated, and their blocks
    /// are not checked against a validator. Content-addressed paths are always treated so.
    #[arg(long = "immutable", value_name = "URL_PREFIX")]
    pub immutable: Vec<String>,
    /// An upstream the node may fetch from (repeatable, or comma-separated): a host
    /// (`registry.example.com`), a name suffix (`.example.com`), or a CIDR network
    /// (`10.0.0.0/8`, `127.0.0.1`). With none, every upstream is allowed except link-local
    /// (metadata services), loopback, non-unicast addresses and this node's own listeners; those
    /// are refused unless a CIDR pattern names them explicitly. Checked after name resolution,
    /// at dial time. A --origin is always allowed.
    #[arg(long = "allow-upstream", value_name = "PATTERN", value_delimiter = ',')]
    pub allow_upstream: Vec<String>,
    /// An upstream whose objects anyone may read (repeatable, or comma-separated; host, .suffix
    /// or CIDR): reads of it skip the credential check.
    #[arg(long = "public-upstream", value_name = "PATTERN", value_delimiter = ',')]
    pub public_upstream: Vec<String>,
    /// How long the origin's acceptance of a requester's credentials (exact URL and
    /// Authorization) for an object is trusted before it is checked again; 0s checks every read.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub credential_ttl: std::time::Duration,
    /// While the origin is unavailable (5xx, unreachable, timing out), a credential it accepted
    /// is still admitted for this long past its --credential-ttl (stale-if-error); a credential it
    /// never accepted is refused either way. 0s fails closed at once.
    #[arg(long, default_value = "1h", value_parser = duration)]
    pub credential_grace: std::time::Duration,
    /// Check credentials for content-addressed objects (OCI digests) too. Off by default: the
    /// registry convention lets whoever names a digest read it (see SECURITY.md).
    #[arg(long)]
    pub check_content_addressed: bool,
    /// File holding the cluster secret (at least 16 bytes): every peer request then carries an
    /// HMAC-SHA256 over its method, path, hop, origin, caller and a timestamp, and an
    /// unauthenticated caller gets 401. Without it the peer plane is unauthenticated.
    #[arg(long)]
    pub cluster_secret_file: Option<std::path::PathBuf>,
    /// Largest wall-clock difference a peer's request timestamp may show.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub peer_clock_skew: std::time::Duration,
    /// This node's member id (visible ASCII, stable across restarts: e.g. the machine's name,
    /// never a pod IP); required with --peers and --discover.
    #[arg(long, default_value = "")]
    pub self_id: String,
    /// Peer listen address (block transport between nodes); used with --peers.
    #[arg(long, default_value = ":9000")]
    pub peer_listen: String,
    /// Fixed membership `id@host:port,...` including this node; empty runs a single node.
    /// Excludes --discover.
    #[arg(long, default_value = "")]
    pub peers: String,
    /// Live membership from seeds: `static:<host:port>,<host:port>` (or a bare list) or
    /// `dns:<name>:<port>` (e.g. a headless Service, resolved every round). Nodes learn each
    /// other by roster exchange and forget a member silent for --forget-after. Excludes --peers.
    #[arg(long, default_value = "")]
    pub discover: String,
    /// Time between discovery rounds (sooner, from 25 ms and doubling, while rounds find the view
    /// far from whole: a boot).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub discover_interval: std::time::Duration,
    /// Time without direct contact after which a member is forgotten.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub forget_after: std::time::Duration,
    /// The `host:port` peers dial to reach this node (with --discover). Never a wildcard; empty
    /// takes --peer-listen, whose wildcard host is replaced by $DART_ADVERTISE_HOST, $POD_IP or
    /// the host name, in that order.
    #[arg(long, default_value = "")]
    pub peer_advertise: String,
    /// Lay each object's distribution trees over the nodes reading it (their member ids, kept
    /// by the object's tracker: the member ranked first for it), below the member ranked first
    /// for each chunk, instead of over every member, so that nodes which read nothing stop
    /// relaying. On by default whenever --peers or --discover is given; `--reader-tree=false`
    /// turns it off; `--reader-tree` without a peer flag is an error.
    #[arg(long, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub reader_tree: Option<bool>,
    /// How often a tracker republishes an object's reader set (leases stay 6s).
    #[arg(long, default_value = "3s", value_parser = duration)]
    pub tracker_tick: std::time::Duration,
    /// Distribution-tree branching factor; 0 (the default) picks it from the cluster size: a
    /// chain up to 16 members (every node uploads each block once, so a herd runs at line rate),
    /// a binary tree beyond.
    #[arg(long, default_value_t = dart_core::engine::route::AUTO_FANOUT)]
    pub fanout: usize,
    /// HRW owners per chunk (their copies are charged to the owned budget).
    #[arg(long, default_value_t = 1)]
    pub replicas: usize,
    /// Scored neighbours kept among the members (docs/overlay.md): pinged every 30s with a
    /// roster fetch, scored by every exchange with them, and asked for a block (cache-only)
    /// before a node that is not the block's home reads the origin. 0 turns them off; at most
    /// 64. Needs --peers or --discover.
    #[arg(long, default_value_t = dart_core::overlay::set::KEEP_DEFAULT)]
    pub neighbours: usize,
    /// Consecutive soft failures that open a peer's circuit; 0 disables the breaker.
    #[arg(long, default_value_t = 5)]
    pub breaker_failures: u32,
    /// How long an open circuit waits before probing (grows on failed probes, capped at 60s).
    #[arg(long, default_value = "5s", value_parser = duration)]
    pub breaker_cooldown: std::time::Duration,
    /// Largest share of peer fetches that may be hedged: a fetch slower than the estimated p99
    /// of recent peer fetches races a backup at the next ancestor. 0 disables hedging.
    #[arg(long, default_value_t = dart_core::engine::hedge::DEFAULT_HEDGE_RATIO)]
    pub hedge_ratio: f64,
    /// Blocks a client read acquires ahead of the one it serves once it misses (through the
    /// same tree and origin path, into the cache), so that hop and origin latency overlap the
    /// transfer; 0 reads one block at a time. Each costs up to one block of memory in flight,
    /// and each is one more stream on an ancestor's uplink.
    #[arg(long, default_value_t = dart_core::engine::DEFAULT_READ_AHEAD)]
    pub read_ahead: usize,
    /// The same where a sequential read's miss goes to the origin (at the root of the block's
    /// tree, or on a node without peers): a client read past its first block that no other
    /// client's read of the object runs beside on this node; beside peers' relays of the
    /// object, and for a peer's relay that continues the block relayed before it, only while
    /// the origin is latency-bound (its windows' bytes take far less time than its wait for
    /// their heads, and that wait is 10 ms or more). It applies too to a client read whose miss
    /// goes to its tree while the tree is latency-bound (the node's last peer block waited 10 ms
    /// or more for its head, far longer than its bytes took: a cold tree whose root waits on the
    /// origin), unless another client's read of the object runs beside it. The larger of the
    /// two flags applies.
    #[arg(long, default_value_t = dart_core::engine::DEFAULT_ORIGIN_READ_AHEAD)]
    pub origin_read_ahead: usize,
    /// Whole-request bound of one peer request.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub peer_timeout: std::time::Duration,
    /// Never ask the origin for a cold read's own bytes beside its block's window. By default,
    /// where the node reads a block from the origin itself (no peers, or the block's tree root),
    /// a client read whose range starts at least a quarter of a block beyond what the window has
    /// brought, and is no longer than the bytes before it, also asks for just its range, so its
    /// first byte does not wait for the bytes before it; each such read costs the origin one
    /// more request and at most as many bytes again as its range (an origin that bills per
    /// request may prefer reads to wait).
    #[arg(long)]
    pub no_origin_lead_in: bool,
    /// Relays store and forward whole blocks instead of cutting through (for comparisons).
    #[arg(long, hide = true)]
    pub store_and_forward: bool,
    /// How long a client may take to send a request head (the first on a connection from its
    /// accept, a later one from its first byte); every listener.
    #[arg(long, default_value = "15s", value_parser = duration)]
    pub header_read_timeout: std::time::Duration,
    /// How long a keep-alive connection may sit idle between requests; every listener.
    #[arg(long, default_value = "60s", value_parser = duration)]
    pub idle_timeout: std::time::Duration,
    /// Most bytes of one request head (at least 8KiB); a larger head is answered 431.
    #[arg(long, default_value = "64KiB", value_parser = size)]
    pub max_header_bytes: u64,
    /// Most connections the client listener, and the peer listener, each serve at once; lowered
    /// to fit the open-file limit. Further connections wait in the listen backlog.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: usize,
    /// How long a client may take no bytes of a response body before its request is given up
    /// (its flight, buffers and peer permit released) and its connection closed.
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub write_stall_timeout: std::time::Duration,
    /// How long in-flight responses may take to finish on SIGTERM/ctrl-c, in seconds.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

impl Default for NodeFlags {
    /// The documented flag defaults (what `dart` with no arguments runs with).
    fn default() -> Self {
        Cli::parse_from(["dart"]).node
    }
}

fn duration(s: &str) -> Result<std::time::Duration, String> {
    parse_duration(s)
}

/// Parses a Go-style duration: one or more `<number><unit>` with units `ns`, `us`, `ms`, `s`,
/// `m`, `h` (e.g. `5s`, `1m30s`, `250ms`); fractions allowed (`1.5s`).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let err = || format!("invalid duration {s:?} (e.g. 5s, 250ms, 1m30s)");
    if s.is_empty() {
        return Err(err());
    }
    let mut rest = s;
    let mut total = 0f64;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(err)?;
        if num_len == 0 {
            return Err(err());
        }
        let value: f64 = rest[..num_len].parse().map_err(|_| err())?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1e-9,
            "us" | "µs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(err()),
        };
        total += value * scale;
        rest = &rest[unit_len..];
    }
    std::time::Duration::try_from_secs_f64(total).map_err(|_| err())
}

/// Parses a listen address; `:port` means every interface (Go's spelling, kept for users of the
/// earlier implementation).
pub fn listen_addr(s: &str) -> anyhow::Result<std::net::SocketAddr> {
    let full = if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_owned() };
    full.parse().map_err(|e| anyhow::anyhow!("invalid listen address {s:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn durations_use_go_syntax() {
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        for bad in ["", "5", "s", "5x", "-1s", "1s5"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn go_style_listen_addresses_mean_every_interface() {
        assert_eq!(listen_addr(":8080").expect("ok").to_string(), "0.0.0.0:8080");
        assert!(listen_addr("nope").is_err());
    }
}
