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
    /// Keep the node and origin running after the report, for curl.
    #[arg(long)]
    pub serve: bool,
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
    /// Prefix API path segment: `GET /<prefix>/<upstream-url>`.
    #[arg(long, default_value = "dart")]
    pub prefix: String,
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
    /// How long in-flight responses may take to finish on SIGTERM/ctrl-c, in seconds.
    #[arg(long, default_value_t = 10)]
    pub drain_secs: u64,
}

/// Parses a listen address; `:port` means every interface (Go's spelling, kept for users of the
/// earlier implementation).
pub fn listen_addr(s: &str) -> anyhow::Result<std::net::SocketAddr> {
    let full = if s.starts_with(':') { format!("0.0.0.0{s}") } else { s.to_owned() };
    full.parse().map_err(|e| anyhow::anyhow!("invalid listen address {s:?}: {e}"))
}
