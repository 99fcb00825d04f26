//! Prometheus exposition (spec/node.md §7). Counters the core keeps ([`EngineStats`]) and store
//! occupancy are read at scrape time, so there is one source of truth for each figure.

use crate::cache::BlockCache;
use dart_core::engine::neighbours::NeighbourReport;
use dart_core::engine::EngineStats;
use dart_core::node::{AccessCounters, NodeCounters};
use dart_core::peer_auth::AuthRefusal;
use dart_core::policy::Refusal;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::fmt;
use std::sync::Arc;

/// Label set `source=...` of the fetch-latency histogram.
pub type SourceLabel = [(&'static str, &'static str); 1];

/// Buckets of `dart_block_fetch_seconds`.
pub const FETCH_BUCKETS: [f64; 9] = [0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0];

/// The node's metric registry.
pub struct Metrics {
    registry: Registry,
    fetch_seconds: Family<SourceLabel, Histogram>,
}

/// What one scrape reads from the node machine.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    /// The engine's counters.
    pub stats: EngineStats,
    /// Peers whose circuit is open (`None` without a peer path).
    pub open_circuits: Option<usize>,
    /// The access decisions.
    pub access: AccessCounters,
    /// The node machine's own counters.
    pub node: NodeCounters,
    /// Objects whose reader set this node hosts (`None` while the reader tree is off).
    pub tracker_files: Option<usize>,
    /// Registry token exchanges ended: (with a token, without); `None` without
    /// `--registry-auth`.
    pub registry_tokens: Option<(u64, u64)>,
    /// The scored neighbours (`None` while they are off).
    pub neighbours: Option<Vec<NeighbourReport>>,
    /// Broadcast targets published (`None` while they are off).
    pub broadcast_targets: Option<usize>,
    /// The discovery refresh loop's counters (`None` without `--discover`).
    pub discovery: Option<dart_core::discovery::DirectoryStats>,
}

/// Reads the node machine's counters at scrape time.
pub type Snapshot = Box<dyn Fn() -> Scrape + Send + Sync>;

struct Collected {
    snapshot: Snapshot,
    cache: Arc<dyn BlockCache>,
}

impl fmt::Debug for Collected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Collected")
    }
}

fn counter(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    label: &'static str,
    values: &[(&'static str, u64)],
) -> fmt::Result {
    let c = ConstCounter::new(0u64);
    let mut family = enc.encode_descriptor(name, help, None, c.metric_type())?;
    for (value, n) in values {
        let labels = [(label, *value)];
        ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A counter without labels.
fn plain_counter(enc: &mut DescriptorEncoder, name: &str, help: &str, n: u64) -> fmt::Result {
    let c = ConstCounter::new(n);
    c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)
}

fn plain_gauge(enc: &mut DescriptorEncoder, name: &str, help: &str, n: usize) -> fmt::Result {
    let g = ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));
    g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    values: &[(&'static str, u64)],
) -> fmt::Result {
    let g = ConstGauge::new(0i64);
    let mut family = enc.encode_descriptor(name, help, None, g.metric_type())?;
    for (class, n) in values {
        let labels = [("class", *class)];
        let v = i64::try_from(*n).unwrap_or(i64::MAX);
        ConstGauge::new(v).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// The scored neighbours: one series per current neighbour (a departed one's series go with
/// it), their count, and the blocks asked of them before the origin.
fn encode_neighbours(
    enc: &mut DescriptorEncoder,
    neighbours: &[NeighbourReport],
    s: &EngineStats,
) -> fmt::Result {
    plain_gauge(enc, "dart_neighbours", "Scored neighbours kept.", neighbours.len())?;
    let help = "A neighbour's score, 0..=128 (64 new; below 16 it is not asked).";
    let score = |n: &NeighbourReport| u64::from(n.score);
    per_peer(enc, "dart_neighbour_score", help, neighbours, score, ConstGauge::new(0i64))?;
    let help = "Exchanges with a neighbour that were scored (block fetches and pings).";
    let requests = |n: &NeighbourReport| n.requests;
    per_peer(enc, "dart_neighbour_requests", help, neighbours, requests, ConstCounter::new(0u64))?;
    let help = "Scored exchanges with a neighbour that failed.";
    let failures = |n: &NeighbourReport| n.failures;
    per_peer(enc, "dart_neighbour_failures", help, neighbours, failures, ConstCounter::new(0u64))?;
    let relay = [("asked", s.neighbour_asks), ("held", s.neighbour_hits)];
    counter(
        enc,
        "dart_neighbour_relay",
        "Blocks asked of a neighbour (cache-only) before the origin, and those it held.",
        "result",
        &relay,
    )
}

/// One family with a series per neighbour (label `peer`), of `kind` (a gauge or a counter).
fn per_peer<M: EncodeMetric + PerPeer>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    neighbours: &[NeighbourReport],
    value: impl Fn(&NeighbourReport) -> u64,
    kind: M,
) -> fmt::Result {
    let mut family = enc.encode_descriptor(name, help, None, kind.metric_type())?;
    for n in neighbours {
        let labels = [("peer", n.id.as_str())];
        M::of(value(n)).encode(family.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A constant metric made from a value.
trait PerPeer: Sized {
    fn of(v: u64) -> Self;
}

impl PerPeer for ConstGauge<i64> {
    fn of(v: u64) -> Self {
        ConstGauge::new(i64::try_from(v).unwrap_or(i64::MAX))
    }
}

impl PerPeer for ConstCounter<u64> {
    fn of(v: u64) -> Self {
        ConstCounter::new(v)
    }
}

impl prometheus_client::collector::Collector for Collected {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let scrape = (self.snapshot)();
        let (s, open) = (scrape.stats, scrape.open_circuits);
        let refused: Vec<(&'static str, u64)> =
            Refusal::ALL.iter().map(|r| (r.label(), scrape.access.refused(*r))).collect();
        counter(
            &mut enc,
            "dart_upstream_refused",
            "Upstreams refused by the upstream policy, by reason.",
            "reason",
            &refused,
        )?;
        let auth: Vec<(&'static str, u64)> =
            AuthRefusal::ALL.iter().map(|r| (r.label(), scrape.access.auth_refused(*r))).collect();
        counter(
            &mut enc,
            "dart_peer_auth_refused",
            "Peer requests refused by the cluster MAC check, by reason.",
            "reason",
            &auth,
        )?;
        let a = scrape.access;
        let checks = [
            ("sent", a.checks),
            ("cached", a.check_hits),
            ("refused", a.check_refused),
            ("failed", a.check_failed),
            ("stale", a.check_stale),
        ];
        counter(
            &mut enc,
            "dart_credential_checks",
            "Credential checks: sent to the origin, admitted from the cache of accepted \
             credentials, refused by the origin (passed through), failed (answered 502), \
             admitted on a credential accepted earlier while the origin was unavailable.",
            "result",
            &checks,
        )?;
        counter(
            &mut enc,
            "dart_probes_joined",
            "Size probes of the origin not sent: the read waited for a credential check of the \
             same object in flight, whose admitting answer taught the node the object's size.",
            "source",
            &[("check", a.probes_joined)],
        )?;
        let stalls = [("write_stall", scrape.node.write_stalls)];
        counter(
            &mut enc,
            "dart_requests_given_up",
            "Requests given up by the node: the requester stopped reading.",
            "reason",
            &stalls,
        )?;
        let sources = [
            ("cache", s.block_source_cache),
            ("peer", s.block_source_peer),
            ("origin", s.block_source_origin),
        ];
        counter(&mut enc, "dart_block_source", "Block reads by source.", "source", &sources)?;
        let bytes =
            [("client", s.client_bytes), ("peer_in", s.peer_bytes), ("origin_in", s.origin_bytes)];
        counter(&mut enc, "dart_bytes", "Wire bytes by direction.", "direction", &bytes)?;
        let pass = [("range_unsupported", s.passthrough), ("registry", s.proxied)];
        counter(&mut enc, "dart_passthrough", "Requests proxied verbatim.", "reason", &pass)?;
        let digests = [
            ("verified", scrape.node.blob_digests_verified),
            ("mismatch", scrape.node.blob_digest_mismatches),
        ];
        counter(
            &mut enc,
            "dart_registry_blob_digest",
            "Whole registry blobs checked against their digest as they were served; a mismatch \
             failed the response before its last byte and dropped the object's cached blocks.",
            "result",
            &digests,
        )?;
        if let Some((ok, failed)) = scrape.registry_tokens {
            let tokens = [("ok", ok), ("failed", failed)];
            counter(
                &mut enc,
                "dart_registry_token_exchanges",
                "Bearer token exchanges with registries named in --registry-auth (one per host \
                 and scope at a time; a failed one leaves the registry's 401 as the answer).",
                "result",
                &tokens,
            )?;
        }
        plain_counter(
            &mut enc,
            "dart_objects_distrusted",
            "Objects whose content failed a whole-object check (a registry blob's digest): their \
             cached blocks were dropped and they are read from the origin only for 10 minutes.",
            s.objects_distrusted,
        )?;
        let blocks = [("verified", s.peer_digests_verified), ("mismatch", s.peer_digest_mismatch)];
        counter(
            &mut enc,
            "dart_peer_block_digest",
            "Peer blocks checked against the digest that ended them; a mismatch was neither \
             cached nor served whole, and opened the peer's circuit.",
            "result",
            &blocks,
        )?;
        let relay = [("served", s.relay_served), ("declined", s.relay_declined)];
        counter(&mut enc, "dart_relay", "Peer block requests by result.", "result", &relay)?;
        let told = [
            ("asked", s.relay_told),
            ("unstored", s.relay_told_unstored),
            ("refused", s.relay_told_refused),
        ];
        counter(
            &mut enc,
            "dart_relay_told",
            "Relays of an object this node did not know that asked upstream at once under the \
             size their requester named, probing beside it (asked); their blocks not stored \
             because the probe had not confirmed that size and version (unstored); their \
             declines and uncharged wrong lengths where it contradicted or had not confirmed \
             it (refused).",
            "result",
            &told,
        )?;
        let versions = [
            ("changed", s.object_changes),
            ("revalidated", s.revalidations),
            ("peer_mismatch", s.peer_version_mismatch),
            ("stale_served", s.stale_served),
        ];
        counter(
            &mut enc,
            "dart_object_version",
            "Version events: objects found changed at the origin (old blocks dropped), \
             revalidating probes, peer answers refused for naming another version, reads served \
             stale because the origin was unavailable.",
            "event",
            &versions,
        )?;
        let hedges = [
            ("fired", s.hedge_fired),
            ("primary_won", s.hedge_primary_won),
            ("backup_won", s.hedge_backup_won),
        ];
        counter(
            &mut enc,
            "dart_hedge",
            "Hedged peer fetches: fired, and which contender won (counted only when one fired).",
            "event",
            &hedges,
        )?;
        let probes = [
            ("sent", s.hedge_probes),
            ("alive", s.hedge_probes_alive),
            ("silent", s.hedge_origin + s.hedge_probe_failovers),
        ];
        counter(
            &mut enc,
            "dart_hedge_probe",
            "Held-only liveness probes of a slow peer (a hedge with no other ancestor left, the \
             first look at a fetch before the node has a latency estimate, or the look in place \
             of a hedge the budget refused): asked (sent), \
             answered (alive: the read keeps waiting on it), or not (silent: the backup is the \
             next ancestor or an origin fill, and the tree routes around the peer for a while).",
            "result",
            &probes,
        )?;
        let successor = [("asked", s.successor_asks), ("held", s.successor_hits)];
        counter(
            &mut enc,
            "dart_successor_relay",
            "Blocks this node, the home of their chunk, asked the member ranked next for \
             (held-only) before the origin, and those it held.",
            "result",
            &successor,
        )?;
        plain_counter(
            &mut enc,
            "dart_block_landed",
            "Blocks a read waiting on peers took from this node's store instead, after another \
             read of this node stored them (its peer fetches cancelled, not charged).",
            s.landed,
        )?;
        plain_counter(
            &mut enc,
            "dart_origin_window_streamed",
            "Client reads' block windows passed on from the origin as they arrived (the window \
             named the version the read serves), instead of held whole first.",
            s.origin_streams,
        )?;
        let resumed = [("resumed", s.streams_resumed), ("refused", s.streams_resume_refused)];
        counter(
            &mut enc,
            "dart_relay_stream_resume",
            "Committed relay streams of a block that landed in this node's store meanwhile: \
             finished from that copy (resumed: every byte already forwarded was the copy's), or \
             left to end on their own (refused: they were not).",
            "result",
            &resumed,
        )?;
        plain_counter(
            &mut enc,
            "dart_store_blocks_rotten",
            "Whole blocks a read found in its store that no longer hashed to the digest they \
             were stored with: dropped and read afresh, never served.",
            scrape.node.rotten_blocks_dropped,
        )?;
        plain_counter(
            &mut enc,
            "dart_warm_blocks_dropped",
            "Blocks a warm start kept, dropped unserved because their object may have changed.",
            scrape.node.unversioned_dropped,
        )?;
        let early = [("upstream_slow", scrape.node.relay_early_answers)];
        counter(
            &mut enc,
            "dart_relay_early_answer",
            "Relay requests answered 504 + upstream 504 within the requester's budget.",
            "reason",
            &early,
        )?;
        let joined = "Peer block fetches a read joined: another read of this node was fetching \
                      the same block from the same peer.";
        plain_counter(&mut enc, "dart_peer_fetch_joined", joined, scrape.node.peer_fetches_joined)?;
        let held = "Block look-ups answered from the last blocks the node stored, kept in memory \
                    whether or not the store admitted them.";
        plain_counter(&mut enc, "dart_held_block_hits", held, scrape.node.held_hits)?;
        let released = "Times the node, idle for 10 s after work, gave memory kept for reuse \
                        back (the block-buffer pool's idle buffers; the allocator's free pages \
                        on glibc).";
        plain_counter(&mut enc, "dart_memory_releases", released, scrape.node.memory_releases)?;
        let ahead = "Read-ahead reads started: blocks acquired ahead of the one a read serves \
                     (--read-ahead; --origin-read-ahead at the origin, through a latency-bound \
                     tree, and for a relayed stream at a latency-bound origin).";
        plain_counter(&mut enc, "dart_read_ahead", ahead, scrape.node.read_ahead)?;
        let again = "Reads that joined an origin flight in its second half and asked the origin \
                     again, once, when that flight found it unavailable.";
        plain_counter(&mut enc, "dart_origin_asked_again", again, scrape.node.origin_asked_again)?;
        let lead_ins = "Origin requests for a client read's own bytes deep in a cold block, sent \
                        beside the block's window so that its first byte did not wait for the \
                        bytes before it.";
        plain_counter(&mut enc, "dart_origin_lead_ins", lead_ins, scrape.node.origin_lead_ins)?;
        if let Some(files) = scrape.tracker_files {
            let n = scrape.node;
            let joins = [("granted", n.tracker_join_ok), ("failed", n.tracker_join_failed)];
            counter(
                &mut enc,
                "dart_tracker_join",
                "JOINs this node sent to its objects' trackers (its own registry included) that \
                 ended, by result (one in flight counts in neither); a failed one routes the \
                 object over every Ready member.",
                "result",
                &joins,
            )?;
            plain_counter(
                &mut enc,
                "dart_tracker_joins_served",
                "JOINs this node granted as an object's tracker.",
                n.tracker_joins_granted,
            )?;
            let help = "Objects whose reader set this node hosts.";
            plain_gauge(&mut enc, "dart_tracker_files", help, files)?;
        }
        plain_counter(
            &mut enc,
            "dart_peer_failover",
            "Escalations past a failed peer.",
            s.peer_failover,
        )?;
        plain_counter(
            &mut enc,
            "dart_peer_reroutes",
            "Blocks asked of a tree laid again after every ancestor asked had failed.",
            s.peer_reroutes,
        )?;
        if let Some(open) = open {
            plain_gauge(&mut enc, "dart_peer_circuits_open", "Peers whose circuit is open.", open)?;
        }
        if let Some(neighbours) = &scrape.neighbours {
            encode_neighbours(&mut enc, neighbours, &s)?;
        }
        if let Some(targets) = scrape.broadcast_targets {
            let help = "Ping-verified broadcast targets a departure is announced to.";
            plain_gauge(&mut enc, "dart_broadcast_targets", help, targets)?;
        }
        if let Some(d) = scrape.discovery {
            let help = "Discovery rounds started (one per --discover-interval, sooner while a \
                        round finds the view far from whole).";
            plain_counter(&mut enc, "dart_discovery_rounds", help, d.rounds)?;
            let ended = [("whole", d.answers), ("unchanged", d.unchanged), ("failed", d.failures)];
            counter(
                &mut enc,
                "dart_discovery_rosters",
                "Discovery roster fetches ended: a whole roster, a 304 (unchanged since the tag \
                 the fetch offered, from the member recorded at the address), or a failure.",
                "result",
                &ended,
            )?;
        }
        let c = self.cache.stats();
        let blocks =
            [("owned", c.owned_blocks), ("borrowed", c.borrowed_blocks), ("mem", c.mem_blocks)];
        gauges(&mut enc, "dart_store_blocks", "Blocks held, by budget.", &blocks)?;
        let slots =
            [("owned", c.owned_slots), ("borrowed", c.borrowed_slots), ("mem", c.mem_slots)];
        gauges(&mut enc, "dart_store_slots", "Block slots, by budget.", &slots)?;
        plain_counter(
            &mut enc,
            "dart_store_admit_rejected",
            "Borrowed insertions refused by admission.",
            c.admit_rejected,
        )?;
        let reads = [
            ("mapped", c.disk_reads_mapped),
            ("page_cache", c.disk_reads_page_cache),
            ("blocking", c.disk_reads_blocking),
        ];
        counter(
            &mut enc,
            "dart_store_disk_reads",
            "Disk-tier reads of block bytes, by how: from the arena's mapping without a copy \
             (mapped), copied from the page cache without waiting (page_cache), or the way that \
             may wait for the disk, on the blocking pool (blocking).",
            "how",
            &reads,
        )?;
        let health = self.cache.health();
        let degraded = ConstGauge::new(i64::from(health.is_degraded()));
        let m = enc.encode_descriptor(
            "dart_store_degraded",
            "1 while the cache disk is degraded (a write or read failed): new blocks are not \
             written to disk, reads are still served.",
            None,
            degraded.metric_type(),
        )?;
        degraded.encode(m)?;
        let errors = [("write", health.write_failures), ("read", health.read_failures)];
        counter(
            &mut enc,
            "dart_store_errors",
            "Failed cache disk calls, by operation.",
            "op",
            &errors,
        )
    }
}

impl Metrics {
    /// A registry exporting the counters `snapshot` reads and `cache`'s occupancy.
    pub fn new(snapshot: Snapshot, cache: Arc<dyn BlockCache>) -> Self {
        let mut registry = Registry::default();
        let fetch_seconds = Family::<SourceLabel, Histogram>::new_with_constructor(|| {
            Histogram::new(FETCH_BUCKETS)
        });
        registry.register(
            "dart_block_fetch_seconds",
            "Time to fetch a missing block, by source.",
            fetch_seconds.clone(),
        );
        registry.register_collector(Box::new(Collected { snapshot, cache }));
        Metrics { registry, fetch_seconds }
    }

    /// Records one block fetch from `source` (`peer` or `origin`).
    pub fn observe_fetch(&self, source: &'static str, seconds: f64) {
        self.fetch_seconds.get_or_create(&[("source", source)]).observe(seconds);
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding to a String cannot fail");
        out
    }
}
