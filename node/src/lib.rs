//! The `dart` node: wiring of the tokio shell around the core, the admin plane, signals, and the
//! self-contained demo. `main` parses flags and calls [`run`]; everything here stays thin.

pub mod cli;
pub mod demo;
pub mod limits;

use anyhow::Context as _;
use cli::{Cli, Command, NodeFlags};
use dart_core::breaker::{BackoffPolicy, Breaker, BreakerConfig, DEFAULT_COOLDOWN_CAP};
use dart_core::codec::redact::strip_userinfo;
use dart_core::discovery::{check_advertise, Seeds, Timing};
use dart_core::engine::resolve::UpstreamMode;
use dart_core::engine::route::Placement;
use dart_core::engine::P2p;
use dart_core::engine::{Engine, EngineConfig};
use dart_core::geometry::Geometry;
use dart_core::identity::{IdLayout, Namespace};
use dart_core::membership::{parse_peers, validate_member_id, View};
use dart_core::node::{Access, Bounds, Node, NodeConfig, Plane};
use dart_core::peer_auth::ClusterSecret;
use dart_core::policy::{Pattern, UpstreamPolicy};
use dart_net_tokio::body::{self, ResponseBody};
use dart_net_tokio::cache::{open_disk_cache, BlockCache, CacheHealth, HealthState};
use dart_net_tokio::client::HttpClient;
use dart_net_tokio::driver::{NodeDriver, WallClock};
use dart_net_tokio::memory::{ArenaCap, ARENA_ENV};
use dart_net_tokio::seam::{
    tls_client_config, Dialer, Listener as _, Seam, TokioDialer, TokioSeam,
};
use dart_net_tokio::server::{serve, Drained, ServeOptions};
use http::header::{HeaderValue, CONTENT_TYPE};
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Runs the command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    // The demo prints a report; routine start-up logs would only interleave with it.
    let default_level = if matches!(cli.command, Some(Command::Demo(_))) { "warn" } else { "info" };
    init_tracing(default_level);
    // One malloc arena per core, set before the runtime starts its threads
    // (`dart_net_tokio::memory`): a node under steady load kept the free memory of a dozen.
    // Logged once the flags are valid, as the open-file limit is.
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let arenas = dart_net_tokio::memory::limit_arenas(cores);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.command {
        Some(Command::Demo(flags)) => rt.block_on(demo::run(flags)),
        None => rt.block_on(run_node(cli.node, arenas)),
    }
}

fn init_tracing(default_level: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_env("DART_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colour codes only for a person at a terminal; never in files, pipes or journald.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// A line on stdout that never panics: a closed stdout (a supervisor gone, a pipe nobody reads)
/// must not turn a clean shutdown into a crash.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

async fn run_node(flags: NodeFlags, arenas: ArenaCap) -> anyhow::Result<()> {
    // Before start, which sizes the connection limits to it; logged once the flags are valid.
    let files = limits::raise_open_file_limit();
    let node = start(&flags).await?;
    tracing::info!(
        before = ?files.before,
        after = ?files.after,
        hard = ?files.hard,
        "open-file soft limit (raised to the hard limit)"
    );
    match arenas {
        ArenaCap::Set(arenas) => tracing::info!(arenas, "malloc arenas capped at one per core"),
        ArenaCap::FromEnvironment => {
            tracing::info!("malloc arenas left to the environment ({ARENA_ENV} or GLIBC_TUNABLES)")
        }
        ArenaCap::OtherThreads => tracing::warn!("malloc arenas not capped: other threads run"),
        ArenaCap::Unsupported => tracing::debug!("malloc arenas not capped: not glibc"),
    }
    say!("{}", node.banner);
    dart_net_tokio::seam::shutdown_signal().await;
    // Tell the broadcast targets first, while the listeners still answer: they drop this node
    // from their views now instead of after --forget-after.
    let margin = std::time::Duration::from_millis(100);
    let bound = dart_core::node::LEAVE_BOUND + margin;
    if let Some((announced, answered)) = node.driver.announce_departure(bound).await {
        if announced > 0 {
            say!("dart: departure announced to {answered} of {announced} broadcast targets");
        }
    }
    say!("dart: shutting down (draining for up to {}s)", flags.drain_secs);
    match node.shutdown().await {
        Drained::Clean => say!("dart: stopped (drained cleanly)"),
        Drained::TimedOut => say!(
            "dart: stopped (drain exceeded {}s: remaining connections force-closed)",
            flags.drain_secs
        ),
    }
    Ok(())
}

/// A running node.
pub struct Running<D: Dialer = TokioDialer> {
    /// Bound client address.
    pub client_addr: SocketAddr,
    /// Bound admin address, when enabled.
    pub admin_addr: Option<SocketAddr>,
    /// Bound peer address, when the peer path is on.
    pub peer_addr: Option<SocketAddr>,
    /// The startup banner line.
    pub banner: String,
    /// The executor of the node machine (stats, metrics, store, roster fetches).
    pub driver: Arc<NodeDriver<D>>,
    stop: watch::Sender<bool>,
    /// The servers' tasks, aborted when this is dropped without a shutdown.
    servers: Vec<tokio::task::JoinHandle<Drained>>,
}

impl<D: Dialer> Drop for Running<D> {
    fn drop(&mut self) {
        for server in &self.servers {
            server.abort();
        }
    }
}

impl<D: Dialer> Running<D> {
    /// Signals every server to stop and waits for their drains (concurrently, each bounded).
    pub async fn shutdown(mut self) -> Drained {
        let _ = self.stop.send(true);
        let mut result = Drained::Clean;
        for server in std::mem::take(&mut self.servers) {
            if !matches!(server.await, Ok(Drained::Clean)) {
                result = Drained::TimedOut;
            }
        }
        // The store goes last (after the puts still running), so that a restart on the same
        // directory finds its lock free and the blocks already served.
        self.driver.close().await;
        result
    }

    /// Stops serving at once, as a crash would: every server and connection is aborted, no
    /// drain, the store is left as it is. Returns when the listeners are closed, so that the same
    /// addresses can be bound again (a simulated restart).
    pub async fn abort(mut self) {
        let servers = std::mem::take(&mut self.servers);
        for server in &servers {
            server.abort();
        }
        for server in servers {
            let _ = server.await;
        }
    }
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    while !*rx.borrow_and_update() {
        if rx.changed().await.is_err() {
            return;
        }
    }
}

/// Validates flags, opens the cache, binds the listeners and starts serving on real sockets.
pub async fn start(flags: &NodeFlags) -> anyhow::Result<Running> {
    start_on(TokioSeam, flags, None).await
}

/// [`start`] over any seam (tokio sockets, a turmoil host): `store` replaces the disk cache the
/// flags describe (simulations use an in-memory one).
pub async fn start_on<S: Seam>(
    seam: S,
    flags: &NodeFlags,
    store: Option<Arc<dyn BlockCache>>,
) -> anyhow::Result<Running<S::Dialer>> {
    let geometry = Geometry::new(flags.chunk_size, flags.block_size).context("invalid geometry")?;
    let namespace = Namespace::new(&flags.namespace).context("invalid --namespace")?;
    if flags.cache_size < flags.block_size {
        anyhow::bail!(
            "--cache-size ({}) must be at least --block-size ({})",
            flags.cache_size,
            flags.block_size
        );
    }
    if let Some(f) = flags.owned_fraction {
        if !(f.is_finite() && f > 0.0 && f < 1.0) {
            anyhow::bail!("--owned-fraction must be strictly between 0 and 1, got {f}");
        }
    }
    let mode = upstream_mode(flags)?;
    let registry_auth = match &flags.registry_auth {
        Some(path) => {
            let text = std::fs::read(path)
                .with_context(|| format!("reading --registry-auth {}", path.display()))?;
            let credentials = dart_core::registry::auth::Credentials::from_json(&text)
                .with_context(|| format!("invalid --registry-auth {}", path.display()))?;
            tracing::info!(
                hosts = ?credentials.hosts().collect::<Vec<_>>(),
                "registry credentials loaded"
            );
            Some(credentials)
        }
        None => None,
    };
    if !(flags.hedge_ratio.is_finite() && (0.0..=1.0).contains(&flags.hedge_ratio)) {
        anyhow::bail!("--hedge-ratio must be between 0 and 1, got {}", flags.hedge_ratio);
    }
    for (flag, n) in
        [("--read-ahead", flags.read_ahead), ("--origin-read-ahead", flags.origin_read_ahead)]
    {
        if n > READ_AHEAD_MAX {
            anyhow::bail!("{flag} must be at most {READ_AHEAD_MAX} blocks, got {n}");
        }
    }
    let bounds = bounds(flags)?;
    let (p2p, seeds) = p2p_setup(flags)?;
    let store: Arc<dyn BlockCache> = match store {
        Some(store) => store,
        None => open_disk_cache(
            &flags.cache_dir,
            flags.cache_size,
            flags.mem_size,
            flags.block_size,
            flags.owned_fraction,
            flags.warm_start,
            flags.buffered_writes,
        )
        .with_context(|| format!("opening cache in {}", flags.cache_dir.display()))?,
    };
    let layout = if flags.oci_digest_only { IdLayout::OciOnly } else { IdLayout::Distribution };
    let cut_through = !flags.store_and_forward;
    let immutable_prefixes = flags.immutable.iter().map(|p| identify_prefix(p, layout)).collect();
    let mut engine = Engine::new(EngineConfig {
        geometry,
        namespace,
        layout,
        cut_through,
        revalidate_after: flags.revalidate_after,
        immutable_prefixes,
        hedge: flags.hedge_ratio > 0.0,
        hedge_ratio: flags.hedge_ratio,
        read_ahead: flags.read_ahead,
        origin_read_ahead: flags.origin_read_ahead,
        lead_in: !flags.no_origin_lead_in,
    });
    let members = p2p.as_ref().map_or(0, |p| p.placement.view().members().len());
    let mut advertise = p2p
        .as_ref()
        .and_then(|p| p.placement.view().get(&flags.self_id).map(|m| m.addr.clone()))
        .unwrap_or_default();
    let peered = p2p.is_some();
    if let Some(p2p) = p2p {
        engine.enable_p2p(p2p);
    }
    let extra_roots = match &flags.origin_ca_file {
        Some(path) => load_ca_file(path)?,
        None => Vec::new(),
    };
    let tls = tls_client_config(&extra_roots).context("TLS set-up")?;
    let mut access = access_setup(flags, &mode)?;

    let client_listener = seam
        .bind(cli::listen_addr(&flags.listen)?)
        .await
        .with_context(|| format!("binding --listen {}", flags.listen))?;
    let client_addr = client_listener.local_addr()?;
    let admin = if flags.admin.is_empty() {
        None
    } else {
        let l = seam
            .bind(cli::listen_addr(&flags.admin)?)
            .await
            .with_context(|| format!("binding --admin {}", flags.admin))?;
        Some(l)
    };
    let admin_addr = admin.as_ref().map(|l| l.local_addr()).transpose()?;
    let peer = if peered {
        let l = seam
            .bind(cli::listen_addr(&flags.peer_listen)?)
            .await
            .with_context(|| format!("binding --peer-listen {}", flags.peer_listen))?;
        Some(l)
    } else {
        None
    };
    let peer_addr = peer.as_ref().map(|l| l.local_addr()).transpose()?;
    if let (Some(_), Some(bound)) = (&seeds, peer_addr) {
        advertise = advertised(flags, bound)?;
    }
    for addr in [Some(client_addr), admin_addr, peer_addr].into_iter().flatten() {
        access.policy.add_listener(addr);
    }
    let mut client =
        HttpClient::new(seam.dialer(), Some(tls), bounds.pool_idle_per_host, bounds.pool_idle)
            .with_policy(access.policy.clone());
    if let Some(credentials) = registry_auth {
        client = client.with_registry_auth(credentials);
    }
    let authenticated = access.peer_secret.is_some();
    let config = NodeConfig {
        mode: mode.clone(),
        bounds,
        self_id: flags.self_id.clone(),
        advertise: advertise.clone(),
        access,
    };
    let mut node = Node::new(engine, config).context("invalid bounds")?;
    // Each seeded part of the machine draws from its own child of a root seeded by the member id.
    let rng_for = |label: &str| {
        let mut root =
            dart_core::rng::from_seed(dart_core::hash::fnv1a64(flags.self_id.as_bytes()));
        dart_core::rng::child(&mut root, label)
    };
    if let Some(seeds) = seeds {
        let timing = Timing { interval: flags.discover_interval, forget_after: flags.forget_after };
        // The driver's clock starts at zero when it starts, just below: the first round is due
        // at once.
        node.enable_discovery(seeds, timing, dart_core::time::Instant::ZERO)
            .context("turning discovery on")?;
        // Discovery checked the peer path and the id.
        node.enable_broadcast_targets(rng_for("broadcast"), dart_core::time::Instant::ZERO);
    }
    // On by default with a peer path; `p2p_setup` refused an explicit --reader-tree without one
    // and required a valid --self-id with it.
    let reader_tree =
        flags.reader_tree != Some(false) && node.enable_reader_tree(flags.tracker_tick);
    if flags.neighbours > 0 {
        let config = dart_core::overlay::set::Config {
            keep: flags.neighbours,
            ..dart_core::overlay::set::Config::default()
        };
        // Without a peer path there is nobody to keep: the flag's default does nothing then.
        node.enable_neighbours(config, rng_for("neighbours"), dart_core::time::Instant::ZERO);
    }
    // Blocks a warm start kept carry no version: the machine decides what to serve of them.
    node.recovered_blocks(store.kept_keys());
    node.recovered_digests(store.kept_digests());
    let (stop, stop_rx) = watch::channel(false);
    let wall = if seam.wall_clock() {
        WallClock::System
    } else {
        WallClock::Virtual { epoch_ms: VIRTUAL_EPOCH_MS }
    };
    let driver = NodeDriver::start_with(node, store, client, stop_rx.clone(), wall);

    let options = serve_options(flags, &bounds, seam.wall_clock(), if peered { 2 } else { 1 });
    let admin_options = ServeOptions {
        connections_max: options.connections_max.min(limits::ADMIN_CONNECTIONS_MAX),
        ..options
    };
    let mut servers = Vec::new();
    let d = driver.clone();
    let handler = move |req| d.clone().handle(Plane::Client, req);
    servers.push(tokio::spawn(serve(client_listener, handler, stopped(stop_rx.clone()), options)));
    if let Some(l) = peer {
        let d = driver.clone();
        let handler = move |req| d.clone().handle(Plane::Peer, req);
        servers.push(tokio::spawn(serve(l, handler, stopped(stop_rx.clone()), options)));
    }
    if let Some(l) = admin {
        let d = driver.clone();
        let id: Arc<str> = flags.self_id.as_str().into();
        let handler = move |req| admin_handle(d.clone(), id.clone(), req);
        servers.push(tokio::spawn(serve(l, handler, stopped(stop_rx.clone()), admin_options)));
    }
    let mode_text = match &mode {
        UpstreamMode::Static(u) => format!("origin {}", strip_userinfo(u)),
        UpstreamMode::Prefix(p) => format!("prefix /{p}/<url>"),
        UpstreamMode::Registry { registry, prefix } => {
            format!("registry mirror of {} on /v2, prefix /{prefix}/<url>", registry.base())
        }
    };
    let banner = format!(
        "dart client={client_addr} | mode: {mode_text} | p2p: {} | admin: {} | cache: {} ({} MiB)",
        peer_addr.map_or("off".to_string(), |a| format!(
            "on as {} {}, peer={a}, {}",
            flags.self_id,
            if flags.discover.is_empty() {
                format!("of {members} members")
            } else {
                format!("advertised at {advertise}, discovering by {}", flags.discover)
            },
            if authenticated { "authenticated" } else { "UNAUTHENTICATED" },
        ) + if reader_tree { ", reader tree" } else { "" }),
        admin_addr.map_or("off".to_string(), |a| a.to_string()),
        flags.cache_dir.display(),
        flags.cache_size >> 20,
    );
    Ok(Running { client_addr, admin_addr, peer_addr, banner, driver, stop, servers })
}

/// Most blocks `--read-ahead` may keep in flight per read (memory: one block each).
const READ_AHEAD_MAX: usize = 32;

/// The Unix time (ms) a simulated node's wall clock starts at (2026-01-01T00:00:00Z).
const VIRTUAL_EPOCH_MS: u64 = 1_767_225_600_000;

/// The access rules the flags describe: the upstream policy (the node's listeners are added once
/// bound), the credential check and the peer-plane secret.
fn access_setup(flags: &NodeFlags, mode: &UpstreamMode) -> anyhow::Result<Access> {
    let patterns = |list: &[String], flag: &str| -> anyhow::Result<Vec<Pattern>> {
        list.iter()
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.parse::<Pattern>().with_context(|| format!("invalid {flag}")))
            .collect()
    };
    let mut allow = patterns(&flags.allow_upstream, "--allow-upstream")?;
    if let UpstreamMode::Static(origin) = mode {
        // The operator named this origin: it is allowed whatever it resolves to.
        let (host, _) =
            dart_core::policy::url_host_port(origin).context("--origin has no usable host")?;
        allow.push(host.parse().with_context(|| format!("--origin host {host:?}"))?);
    }
    if let UpstreamMode::Registry { registry, .. } = mode {
        // The operator named this registry: it is allowed whatever it resolves to.
        let (host, _) = dart_core::policy::url_host_port(registry.base())
            .context("--registry has no usable host")?;
        allow.push(host.parse().with_context(|| format!("--registry host {host:?}"))?);
    }
    let public = patterns(&flags.public_upstream, "--public-upstream")?;
    let peer_secret = match &flags.cluster_secret_file {
        Some(path) => {
            let bytes = std::fs::read(path)
                .with_context(|| format!("reading --cluster-secret-file {}", path.display()))?;
            Some(
                ClusterSecret::from_bytes(&bytes)
                    .with_context(|| format!("--cluster-secret-file {}", path.display()))?,
            )
        }
        None => None,
    };
    if flags.peer_clock_skew.is_zero() {
        anyhow::bail!("--peer-clock-skew must be above zero");
    }
    Ok(Access {
        policy: UpstreamPolicy::new(allow, Vec::new()),
        check_ttl: flags.credential_ttl,
        public,
        check_content_addressed: flags.check_content_addressed,
        stale_grace: flags.credential_grace,
        peer_secret,
        clock_skew: flags.peer_clock_skew,
    })
}

/// The node's bounds from the flags.
fn bounds(flags: &NodeFlags) -> anyhow::Result<Bounds> {
    const HEAD_BYTES_MIN: u64 = 8 << 10;
    if flags.max_header_bytes < HEAD_BYTES_MIN {
        anyhow::bail!("--max-header-bytes must be at least 8KiB, got {}", flags.max_header_bytes);
    }
    if flags.idle_timeout.is_zero() {
        anyhow::bail!("--idle-timeout must be above zero");
    }
    let bounds = Bounds {
        peer_request: flags.peer_timeout,
        write_stall: flags.write_stall_timeout,
        inbound_head_read: flags.header_read_timeout,
        inbound_head_bytes: usize::try_from(flags.max_header_bytes).unwrap_or(usize::MAX),
        inbound_connections: flags.max_connections,
        ..Bounds::default()
    };
    bounds.validate().context("invalid bounds")?;
    Ok(bounds)
}

/// The data listeners' transport options: the bounds, the idle timeout, and a connection limit
/// lowered to what the open-file limit can hold (`data_listeners`: client, and peer if on).
fn serve_options(
    flags: &NodeFlags,
    bounds: &Bounds,
    wall_clock: bool,
    data_listeners: usize,
) -> ServeOptions {
    let budget = limits::connection_budget(limits::open_file_limit(), data_listeners);
    if budget < bounds.inbound_connections {
        tracing::warn!(
            configured = bounds.inbound_connections,
            budget,
            open_files = ?limits::open_file_limit(),
            "--max-connections lowered to fit the open-file limit"
        );
    }
    ServeOptions {
        date_header: wall_clock,
        drain_timeout: Duration::from_secs(flags.drain_secs),
        idle_timeout: flags.idle_timeout,
        connections_max: bounds.inbound_connections.min(budget),
        ..ServeOptions::from_bounds(bounds)
    }
}

/// An `--immutable` URL prefix in the form object identities take (identities canonicalise the
/// URL: the prefix is matched against them).
fn identify_prefix(prefix: &str, layout: IdLayout) -> String {
    dart_core::identity::object_id(prefix, layout).id
}

fn upstream_mode(flags: &NodeFlags) -> anyhow::Result<UpstreamMode> {
    if flags.origin.is_empty() {
        let prefix = flags.prefix.trim_matches('/');
        if prefix.is_empty() {
            anyhow::bail!("--prefix must not be empty");
        }
        if flags.registry.is_empty() {
            return Ok(UpstreamMode::prefix(prefix));
        }
        if prefix == "v2" {
            anyhow::bail!("--prefix v2 would hide the registry mirror's /v2: choose another");
        }
        let registry =
            dart_core::registry::Registry::new(&flags.registry).context("invalid --registry")?;
        return Ok(UpstreamMode::Registry { registry, prefix: prefix.to_owned() });
    }
    if !flags.registry.is_empty() {
        anyhow::bail!("--registry and --origin both claim every request: give one");
    }
    if !(flags.origin.starts_with("http://") || flags.origin.starts_with("https://")) {
        anyhow::bail!("--origin must be an http:// or https:// URL");
    }
    Ok(UpstreamMode::Static(flags.origin.clone()))
}

/// Reads PEM certificates of private CAs trusted for `https://` origins.
fn load_ca_file(
    path: &std::path::Path,
) -> anyhow::Result<Vec<rustls::pki_types::CertificateDer<'static>>> {
    use rustls::pki_types::pem::PemObject;
    let certs: Vec<_> = rustls::pki_types::CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading --origin-ca-file {}", path.display()))?
        .collect::<Result<_, _>>()
        .with_context(|| format!("parsing --origin-ca-file {}", path.display()))?;
    if certs.is_empty() {
        anyhow::bail!("--origin-ca-file {} holds no PEM certificate", path.display());
    }
    Ok(certs)
}

/// The address peers reach this node at (with `--discover`): `--peer-advertise`, or the bound
/// peer listener with a wildcard host replaced by `$DART_ADVERTISE_HOST`, `$POD_IP` or the host
/// name.
fn advertised(flags: &NodeFlags, bound: SocketAddr) -> anyhow::Result<String> {
    if !flags.peer_advertise.is_empty() {
        check_advertise(&flags.peer_advertise).context("invalid --peer-advertise")?;
        return Ok(flags.peer_advertise.clone());
    }
    let host = if bound.ip().is_unspecified() {
        let env =
            |k: &str| std::env::var(k).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let hostname = || {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_owned())
                .filter(|h| !h.is_empty())
        };
        env("DART_ADVERTISE_HOST").or_else(|| env("POD_IP")).or_else(hostname).context(
            "--peer-listen has a wildcard host and no --peer-advertise, $DART_ADVERTISE_HOST, \
             $POD_IP or host name says how peers reach this node",
        )?
    } else {
        bound.ip().to_string()
    };
    let host =
        if host.contains(':') && !host.starts_with('[') { format!("[{host}]") } else { host };
    let addr = format!("{host}:{}", bound.port());
    check_advertise(&addr).context("the address to advertise (set --peer-advertise)")?;
    Ok(addr)
}

/// Validates the peer flags and builds the engine's peer half and, with `--discover`, the seeds.
fn p2p_setup(flags: &NodeFlags) -> anyhow::Result<(Option<P2p>, Option<Seeds>)> {
    if flags.neighbours > dart_core::overlay::set::KEEP_MAX {
        anyhow::bail!(
            "--neighbours {} is above the most a node keeps ({})",
            flags.neighbours,
            dart_core::overlay::set::KEEP_MAX
        );
    }
    if !flags.peers.is_empty() && !flags.discover.is_empty() {
        anyhow::bail!("--peers and --discover are mutually exclusive: give a fixed list or seeds");
    }
    if flags.peers.is_empty() && flags.discover.is_empty() {
        if flags.reader_tree == Some(true) {
            anyhow::bail!("--reader-tree needs --peers or --discover");
        }
        if !flags.peer_advertise.is_empty() {
            anyhow::bail!("--peer-advertise needs --discover");
        }
        return Ok((None, None));
    }
    let (members, seeds) = if flags.discover.is_empty() {
        validate_member_id(&flags.self_id).context("--self-id is required with --peers")?;
        let members = parse_peers(&flags.peers).context("invalid --peers")?;
        if !members.iter().any(|m| m.id == flags.self_id) {
            anyhow::bail!("--peers must include this node's --self-id {:?}", flags.self_id);
        }
        (members, None)
    } else {
        validate_member_id(&flags.self_id).context("--self-id is required with --discover")?;
        let seeds = Seeds::parse(&flags.discover).context("invalid --discover")?;
        if !flags.peer_advertise.is_empty() {
            check_advertise(&flags.peer_advertise).context("invalid --peer-advertise")?;
        }
        for (flag, d) in [
            ("--discover-interval", flags.discover_interval),
            ("--forget-after", flags.forget_after),
        ] {
            if d.is_zero() {
                anyhow::bail!("{flag} must be above zero");
            }
        }
        if flags.forget_after < flags.discover_interval * 2 {
            anyhow::bail!(
                "--forget-after ({:?}) must be at least twice --discover-interval ({:?}): a live member \
                 is met once per interval",
                flags.forget_after,
                flags.discover_interval
            );
        }
        // The node alone until the first round; its address is set once the listener is bound.
        (vec![dart_core::membership::Member::ready(&flags.self_id, "")], Some(seeds))
    };
    let view = View::new(members);
    let placement = Placement::new(view, &flags.self_id, flags.fanout, flags.replicas);
    let config = BreakerConfig {
        failure_threshold: flags.breaker_failures,
        backoff: BackoffPolicy::Exponential {
            base: flags.breaker_cooldown,
            cap: DEFAULT_COOLDOWN_CAP.max(flags.breaker_cooldown),
        },
        seed: dart_core::hash::fnv1a64(flags.self_id.as_bytes()),
        ..BreakerConfig::default()
    };
    let breaker = Breaker::new(config).context("invalid breaker settings")?;
    Ok((Some(P2p { placement, breaker }), seeds))
}

type AdminAnswer = (StatusCode, &'static str, String);

fn json_answer(value: &serde_json::Value) -> AdminAnswer {
    let mut text = serde_json::to_string_pretty(value).unwrap_or_default();
    text.push('\n');
    (StatusCode::OK, "application/json", text)
}

fn no_cluster() -> AdminAnswer {
    (StatusCode::SERVICE_UNAVAILABLE, "text/plain", "no cluster: single-node mode\n".into())
}

/// `GET /admin/members`: this node's view (epoch as a decimal string).
fn members_json(node: &Node, self_id: &str, now: dart_core::time::Instant) -> AdminAnswer {
    let Some(p2p) = node.engine().p2p() else { return no_cluster() };
    let view = p2p.placement.view();
    let contacts: std::collections::BTreeMap<String, Duration> =
        node.directory().map(|d| d.contacts(now).into_iter().collect()).unwrap_or_default();
    let members: Vec<serde_json::Value> = view
        .members()
        .iter()
        .map(|m| {
            let mut v = serde_json::json!({
                "id": m.id, "addr": m.addr, "weight": m.weight, "state": m.state.to_string(),
            });
            if let Some(ago) = contacts.get(&m.id) {
                v["last_contact_ms"] = serde_json::json!(ago.as_millis() as u64);
            }
            v
        })
        .collect();
    let discovery = node.directory().map(|d| {
        let s = d.stats();
        serde_json::json!({
            "interval_ms": d.timing().interval.as_millis() as u64,
            "forget_after_ms": d.timing().forget_after.as_millis() as u64,
            "rounds": s.rounds, "answers": s.answers, "unchanged": s.unchanged,
            "failures": s.failures,
            "resolve_failures": s.resolve_failures, "forgotten": s.forgotten,
            "displaced": s.displaced, "refused": s.refused, "self_conflicts": s.self_conflicts, "left": s.left,
        })
    });
    json_answer(&serde_json::json!({
        "self_id": self_id, "epoch": view.epoch().to_string(), "members": members,
        "discovery": discovery, "broadcast_targets": node.broadcast_targets(),
    }))
}

/// `GET /admin/ring?key=<u64>&n=<N>`: the HRW order of the Ready members for a key.
fn ring_json(node: &Node, query: Option<&str>) -> AdminAnswer {
    let param =
        |name: &str| query?.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='));
    let Some(Ok(key)) = param("key").map(str::parse::<u64>) else {
        return (StatusCode::BAD_REQUEST, "text/plain", "key must be a decimal u64\n".into());
    };
    let n = param("n").and_then(|v| v.parse::<usize>().ok()).filter(|n| *n > 0).unwrap_or(8);
    let Some(p2p) = node.engine().p2p() else { return no_cluster() };
    let view = p2p.placement.view();
    let order: Vec<serde_json::Value> = p2p
        .placement
        .ranked(dart_core::hash::ChunkKey(key))
        .into_iter()
        .take(n)
        .enumerate()
        .filter_map(|(rank, id)| {
            let m = view.get(id)?;
            Some(
                serde_json::json!({ "rank": rank, "id": m.id, "addr": m.addr, "weight": m.weight }),
            )
        })
        .collect();
    json_answer(&serde_json::json!({
        "key": key.to_string(), "epoch": view.epoch().to_string(), "order": order,
    }))
}

/// `GET /healthz`: always 200 while the node runs. A degraded cache disk only costs cache hits
/// (reads go to peers and the origin), so a liveness probe must not restart the pod for it: a
/// restart would not bring the space or the disk back, and it would drop the RAM tier and every
/// in-flight read. The body says `degraded: cache disk <reason>` so that people and readiness
/// checks that care can see it.
fn healthz(health: &CacheHealth, peer_plane: &str) -> AdminAnswer {
    let mut text = match &health.state {
        HealthState::Healthy => "ok\n".to_string(),
        HealthState::Degraded { reason, .. } => format!("degraded: cache disk {reason}\n"),
    };
    if peer_plane == "unauthenticated" {
        text.push_str("warning: the peer plane is unauthenticated (no --cluster-secret-file)\n");
    }
    (StatusCode::OK, "text/plain", text)
}

/// The store health as `/admin/stats` shows it.
fn health_json(health: &CacheHealth) -> serde_json::Value {
    let (state, reason, since) = match &health.state {
        HealthState::Healthy => ("healthy", None, None),
        HealthState::Degraded { reason, since } => {
            let since = since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
            ("degraded", Some(reason.to_string()), Some(since))
        }
    };
    serde_json::json!({
        "state": state,
        "reason": reason,
        "since_unix_secs": since,
        "write_failures": health.write_failures,
        "read_failures": health.read_failures,
    })
}

async fn admin_handle<D: Dialer>(
    driver: Arc<NodeDriver<D>>,
    self_id: Arc<str>,
    req: Request<Incoming>,
) -> Response<ResponseBody> {
    let peer_plane =
        driver.with_node(|n| match (n.engine().p2p(), &n.config().access.peer_secret) {
            (None, _) => "off",
            (Some(_), Some(_)) => "authenticated",
            (Some(_), None) => "unauthenticated",
        });
    let (status, ctype, text) = match (req.method(), req.uri().path()) {
        (&http::Method::GET, "/healthz") => healthz(&driver.store().health(), peer_plane),
        (&http::Method::GET, "/metrics") => {
            (StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", driver.metrics().encode())
        }
        (&http::Method::GET, "/admin/stats") => {
            let s = driver.store().stats();
            json_answer(&serde_json::json!({
                "self_id": &*self_id,
                "cached_blocks": s.owned_blocks + s.borrowed_blocks,
                "store_health": health_json(&driver.store().health()),
                "peer_plane": peer_plane,
            }))
        }
        (&http::Method::GET, "/admin/members") => {
            let now = driver.clock().now();
            driver.with_node(|node| members_json(node, &self_id, now))
        }
        (&http::Method::GET, "/admin/ring") => {
            driver.with_node(|node| ring_json(node, req.uri().query()))
        }
        (_, "/healthz" | "/metrics" | "/admin/stats" | "/admin/members" | "/admin/ring") => {
            (StatusCode::METHOD_NOT_ALLOWED, "text/plain", "method not allowed\n".into())
        }
        _ => (StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    };
    let mut r = Response::new(body::full(text));
    *r.status_mut() = status;
    r.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}
