//! The soak's report: a line every few seconds, then a table of the run and a verdict on whether
//! each node's RSS and descriptors stayed flat after warm-up.

use super::cluster::Node;
use super::origin::OriginStats;
use super::workload::Stats;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Drift of a long-lived node's RSS or descriptors after warm-up that still counts as flat.
pub const FLAT_WITHIN: f64 = 0.10;
/// At most this many rows of the over-time table.
const TABLE_ROWS_MAX: usize = 31;

/// Something that happened to the cluster; a fatal one fails the run.
pub struct Event {
    pub at: Duration,
    pub text: String,
    pub fatal: bool,
}

impl Event {
    pub fn at(started: Instant, text: &str) -> Event {
        Event { at: started.elapsed(), text: text.into(), fatal: false }
    }

    pub fn fatal_at(started: Instant, text: &str) -> Event {
        Event { at: started.elapsed(), text: text.into(), fatal: true }
    }
}

/// One node's use of the machine at a moment.
#[derive(Clone, Copy, Debug)]
pub struct Usage {
    pub rss_kib: u64,
    pub fds: u64,
    /// Which life of the node (restarts make new ones).
    pub life: u64,
}

/// Every node's usage at a moment; `None` for a node that is down.
pub struct Sample {
    pub at: Duration,
    pub nodes: Vec<Option<Usage>>,
}

impl Sample {
    pub fn take(nodes: &[Node], at: Duration) -> Sample {
        let nodes = nodes
            .iter()
            .map(|n| {
                let life = n.lives.load(Ordering::SeqCst);
                n.usage().map(|(rss_kib, fds)| Usage { rss_kib, fds, life })
            })
            .collect();
        Sample { at, nodes }
    }
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The periodic report line.
pub fn line(sample: &Sample, s: &Stats) -> String {
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let mut text = format!(
        "[{:>6.0?}] {} requests: {} ok ({} MiB checked), {} node-down errors, {} error statuses, \
         {} unanswered, {} wrong answers, {} wrong bytes |",
        sample.at,
        n(&s.requests),
        n(&s.ok),
        n(&s.ok_bytes) >> 20,
        n(&s.node_down),
        n(&s.error_status),
        n(&s.unanswered),
        n(&s.wrong_answers),
        n(&s.wrong_bytes),
    );
    for (i, u) in sample.nodes.iter().enumerate() {
        match u {
            Some(u) => text += &format!(" node-{i} {:.0} MiB {} fds", mib(u.rss_kib), u.fds),
            None => text += &format!(" node-{i} down"),
        }
    }
    text
}

/// A few counters from every running node's `/metrics`.
pub async fn scrape(nodes: &[Node]) -> Vec<Option<String>> {
    const SERIES: &[&str] = &[
        "dart_block_source_total{source=\"cache\"}",
        "dart_block_source_total{source=\"peer\"}",
        "dart_block_source_total{source=\"origin\"}",
        "dart_relay_total{result=\"served\"}",
        "dart_peer_failover_total",
        "dart_requests_given_up_total{reason=\"write_stall\"}",
    ];
    let c = super::workload::http_client();
    let mut out = Vec::new();
    for n in nodes {
        if n.down.load(Ordering::SeqCst) {
            out.push(None);
            continue;
        }
        let url = format!("http://{}/metrics", n.admin);
        let text = async {
            let req = http::Request::get(url).body(http_body_util::Empty::new()).ok()?;
            let resp = c.request(req).await.ok()?;
            let body = http_body_util::BodyExt::collect(resp.into_body()).await.ok()?;
            Some(String::from_utf8_lossy(&body.to_bytes()).into_owned())
        };
        let text = tokio::time::timeout(Duration::from_secs(5), text).await.ok().flatten();
        out.push(text.map(|t| {
            let picked: Vec<String> = SERIES
                .iter()
                .filter_map(|s| {
                    let v = t.lines().find_map(|l| l.strip_prefix(s)?.strip_prefix(' '))?;
                    let short = s.trim_start_matches("dart_").replace("_total", "");
                    Some(format!("{short} {}", v.trim()))
                })
                .collect();
            picked.join(", ")
        }));
    }
    out
}

/// One node's figures after warm-up.
pub struct Flatness {
    pub node: usize,
    /// Samples it was measured on.
    pub samples: usize,
    pub rss_min_max_kib: (u64, u64),
    pub fds_min_max: (u64, u64),
    /// Mean over the first and the last quarter of the samples after warm-up.
    pub rss_first_last_kib: (f64, f64),
    pub fds_first_last: (f64, f64),
    /// Peak RSS of every life, for a restarted node.
    pub life_peaks_kib: Vec<u64>,
}

impl Flatness {
    fn drift((first, last): (f64, f64)) -> f64 {
        if first == 0.0 {
            0.0
        } else {
            (last - first) / first
        }
    }

    pub fn rss_drift(&self) -> f64 {
        Flatness::drift(self.rss_first_last_kib)
    }

    pub fn fds_drift(&self) -> f64 {
        Flatness::drift(self.fds_first_last)
    }

    pub fn flat(&self) -> bool {
        self.rss_drift().abs() <= FLAT_WITHIN && self.fds_drift().abs() <= FLAT_WITHIN
    }
}

/// Flatness of every long-lived node, and the restarted node's peaks per life.
pub struct Verdict {
    pub warm_up: Duration,
    pub nodes: Vec<Flatness>,
    pub flapping: usize,
}

impl Verdict {
    pub fn of(samples: &[Sample], warm_up: Duration, flapping: usize) -> Verdict {
        let count = samples.first().map_or(0, |s| s.nodes.len());
        let nodes = (0..count).map(|i| flatness(samples, warm_up, i)).collect();
        Verdict { warm_up, nodes, flapping }
    }

    /// Whether every long-lived node stayed flat.
    pub fn flat(&self) -> bool {
        self.nodes.iter().filter(|f| f.node != self.flapping).all(Flatness::flat)
    }
}

fn flatness(samples: &[Sample], warm_up: Duration, node: usize) -> Flatness {
    let after: Vec<Usage> =
        samples.iter().filter(|s| s.at >= warm_up).filter_map(|s| s.nodes[node]).collect();
    let quarter = (after.len() / 4).max(1).min(after.len());
    let mean = |xs: &[Usage], f: fn(&Usage) -> u64| {
        xs.iter().map(|u| f(u) as f64).sum::<f64>() / xs.len().max(1) as f64
    };
    let (first, last) = (&after[..quarter], &after[after.len() - quarter..]);
    let min_max = |f: fn(&Usage) -> u64| {
        (after.iter().map(f).min().unwrap_or(0), after.iter().map(f).max().unwrap_or(0))
    };
    let mut life_peaks_kib: Vec<u64> = Vec::new();
    let mut life = 0;
    for u in samples.iter().filter_map(|s| s.nodes[node]) {
        if u.life != life {
            life = u.life;
            life_peaks_kib.push(0);
        }
        let peak = life_peaks_kib.last_mut().expect("pushed");
        *peak = (*peak).max(u.rss_kib);
    }
    Flatness {
        node,
        samples: after.len(),
        rss_min_max_kib: min_max(|u| u.rss_kib),
        fds_min_max: min_max(|u| u.fds),
        rss_first_last_kib: (mean(first, |u| u.rss_kib), mean(last, |u| u.rss_kib)),
        fds_first_last: (mean(first, |u| u.fds), mean(last, |u| u.fds)),
        life_peaks_kib,
    }
}

/// What the final report is made of.
pub struct Final<'a> {
    pub seed: u64,
    pub elapsed: Duration,
    pub clients: usize,
    pub working_set: u64,
    pub stats: &'a Stats,
    pub origin: &'a OriginStats,
    pub events: &'a [Event],
    pub samples: &'a [Sample],
    pub metrics: &'a [Option<String>],
    pub verdict: &'a Verdict,
    pub nodes: &'a [Node],
}

/// Prints the final tables (Markdown) and returns whether the run was correct.
pub fn print_final(f: &Final) -> bool {
    let correct = print_counts(f);
    print_events(f);
    print_usage_table(f.samples);
    print_verdict(f.verdict);
    println!("\nresult: {}", if correct { "PASS (correct)" } else { "FAIL" });
    correct
}

fn print_counts(f: &Final) -> bool {
    let s = f.stats;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let d = s.detail.lock().expect("detail");
    let mut lat = d.latencies_ms.clone();
    lat.sort_unstable();
    let pct = |p: f64| lat.get(((lat.len().max(1) - 1) as f64 * p) as usize).copied().unwrap_or(0);
    let kinds: Vec<String> = d.by_kind.iter().map(|(k, v)| format!("{k:?} {v}")).collect();
    let statuses: Vec<String> = d.statuses.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    let origin_bytes = f.origin.bytes.load(Ordering::Relaxed);
    let panics: Vec<String> = f.nodes.iter().flat_map(Node::panics).collect();
    println!("\n## Soak: seed {:#x}, {:.1?}, {} clients\n", f.seed, f.elapsed, f.clients);
    println!("| | count |\n|---|---|");
    println!("| requests | {} ({}; {} herds) |", n(&s.requests), kinds.join(", "), n(&s.herds));
    println!(
        "| complete and correct | {} ({} MiB checked byte for byte) |",
        n(&s.ok),
        n(&s.ok_bytes) >> 20
    );
    println!("| **wrong bytes** | **{}** |", n(&s.wrong_bytes));
    println!("| wrong answers (status, length, Content-Range) | {} |", n(&s.wrong_answers));
    println!("| unanswered by a node that stayed up | {} |", n(&s.unanswered));
    println!("| clean error statuses (5xx, complete) | {} |", n(&s.error_status));
    println!("| transport errors while the node was down (expected) | {} |", n(&s.node_down));
    println!(
        "| statuses other than 200/206 | {} |",
        if statuses.is_empty() { "none".into() } else { statuses.join(", ") }
    );
    println!(
        "| latency of correct answers p50 / p99 / max | {} / {} / {} ms |",
        pct(0.5),
        pct(0.99),
        pct(1.0)
    );
    println!(
        "| origin | {} requests, {} MiB ({:.1}x the {} MiB working set) |",
        f.origin.requests.load(Ordering::Relaxed),
        origin_bytes >> 20,
        origin_bytes as f64 / f.working_set as f64,
        f.working_set >> 20
    );
    for (i, m) in f.metrics.iter().enumerate() {
        println!("| node-{i} /metrics at the end | {} |", m.as_deref().unwrap_or("(down)"));
    }
    let stops = |how: &str| f.events.iter().filter(|e| e.text.contains(how)).count();
    println!(
        "| restarts of the flapping node | {} (after {} SIGKILLs and {} SIGTERMs) |",
        stops("restarted"),
        stops("(SIGKILL)"),
        stops("(SIGTERM)")
    );
    println!("| panics in node logs | {} |", panics.len());
    for (kind, list) in &d.samples {
        for text in list {
            println!("\n{kind}: {text}");
        }
    }
    for p in &panics {
        println!("\npanic: {p}");
    }
    let fatal = f.events.iter().any(|e| e.fatal);
    n(&s.wrong_bytes) == 0
        && n(&s.wrong_answers) == 0
        && n(&s.unanswered) == 0
        && n(&s.ok) > 0
        && panics.is_empty()
        && !fatal
}

fn print_events(f: &Final) {
    println!("\n### Events\n");
    for e in f.events {
        let mark = if e.fatal { " (FATAL)" } else { "" };
        println!("- {:>6.1?}: {}{mark}", e.at, e.text);
    }
}

fn print_usage_table(samples: &[Sample]) {
    let Some(first) = samples.first() else { return };
    let every = samples.len().div_ceil(TABLE_ROWS_MAX).max(1);
    println!("\n### RSS (MiB) and open descriptors per node over time\n");
    let mut head = "| t |".to_string();
    let mut rule = "|---|".to_string();
    for i in 0..first.nodes.len() {
        head += &format!(" node-{i} RSS | fds |");
        rule += "---|---|";
    }
    println!("{head}\n{rule}");
    let last = samples.len() - 1;
    let rows = samples.iter().enumerate().filter(|(k, _)| k % every == 0 || *k == last);
    for (_, s) in rows {
        let mut row = format!("| {:.0?} |", s.at);
        for u in &s.nodes {
            match u {
                Some(u) => row += &format!(" {:.1} | {} |", mib(u.rss_kib), u.fds),
                None => row += " down | - |",
            }
        }
        println!("{row}");
    }
}

fn print_verdict(v: &Verdict) {
    println!(
        "\n### Verdict (after a {:.0?} warm-up; flat = drift within {:.0} %)\n",
        v.warm_up,
        FLAT_WITHIN * 100.0
    );
    println!("| node | samples | RSS min–max MiB | RSS first→last quarter | drift | fds min–max | fds first→last quarter | drift | flat |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for f in &v.nodes {
        let (rmin, rmax) = f.rss_min_max_kib;
        let (fmin, fmax) = f.fds_min_max;
        let (r0, r1) = f.rss_first_last_kib;
        let (f0, f1) = f.fds_first_last;
        let flat = if f.node == v.flapping {
            let peaks: Vec<String> =
                f.life_peaks_kib.iter().map(|k| format!("{:.0}", mib(*k))).collect();
            format!("n/a: restarted; peak MiB per life {}", peaks.join(", "))
        } else if f.flat() {
            "yes".into()
        } else {
            "**no**".into()
        };
        println!(
            "| node-{} | {} | {:.1}–{:.1} | {:.1}→{:.1} | {:+.1} % | {fmin}–{fmax} | {f0:.1}→{f1:.1} | {:+.1} % | {flat} |",
            f.node,
            f.samples,
            mib(rmin),
            mib(rmax),
            r0 / 1024.0,
            r1 / 1024.0,
            f.rss_drift() * 100.0,
            f.fds_drift() * 100.0,
        );
    }
}
