//! A self-contained HTML report with hand-written SVG plots: per-node timelines of circuit states
//! and block sources, the read latency CDF, and origin bytes over time.

use crate::Outcome;
use dart_core::breaker::CircuitState;
use dart_core::time::Instant;
use dart_sim::{BlockSource, Phase, RunReport};
use std::collections::BTreeMap;
use std::fmt::Write as _;

const WIDTH: f64 = 900.0;
const ROW: f64 = 7.0;
const ROWS_MAX: usize = 120;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

fn secs(t: Instant) -> f64 {
    t.as_nanos() as f64 / 1e9
}

/// The whole page for `outcomes`.
pub fn page(outcomes: &[Outcome]) -> String {
    let mut out = String::from(
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>dart scenarios</title><style>\
         body{font:14px sans-serif;margin:2em;max-width:1000px}h2{margin-top:2em}\
         .ok{color:#070}.fail{color:#b00}.gap{color:#a60}pre{background:#f4f4f4;padding:.5em;white-space:pre-wrap}\
         svg{background:#fcfcfc;border:1px solid #ddd;margin:.3em 0}</style></head><body>\
         <h1>dart scenario report</h1>",
    );
    out.push_str("<table><tr><th>scenario</th><th>seed</th><th>verdict</th><th>trace</th></tr>");
    for o in outcomes {
        let (class, verdict) = verdict(o);
        let trace = o.report.as_ref().map_or("-".into(), |r| format!("{:016x}", r.trace_hash));
        let _ = write!(
            out,
            "<tr><td><a href=\"#{0}-{1}\">{0}</a></td><td>{1}</td><td class=\"{class}\">{verdict}</td><td><code>{trace}</code></td></tr>",
            o.scenario, o.seed
        );
    }
    out.push_str("</table>");
    for o in outcomes {
        section(&mut out, o);
    }
    out.push_str("</body></html>\n");
    out
}

fn verdict(o: &Outcome) -> (&'static str, &'static str) {
    if !o.passed() {
        ("fail", "FAIL")
    } else if !o.check.gaps.is_empty() {
        ("gap", "ok (known gap)")
    } else {
        ("ok", "ok")
    }
}

fn section(out: &mut String, o: &Outcome) {
    let (class, verdict) = verdict(o);
    let _ = write!(
        out,
        "<h2 id=\"{0}-{1}\">{0} <small>seed {1}</small> <span class=\"{class}\">{verdict}</span></h2>",
        o.scenario, o.seed
    );
    let _ = write!(out, "<pre>{}</pre>", esc(&o.describe()));
    let _ = write!(out, "<p>fault plan: {}</p>", esc(&o.spec.plan.to_string()));
    let Some(r) = &o.report else { return };
    out.push_str("<h3>per-node timeline</h3><p>block sources: <span style=\"color:#2a7\">cache</span>, \
                  <span style=\"color:#27c\">peer</span>, <span style=\"color:#d33\">origin</span>, \
                  <span style=\"color:#e90\">coalesced</span>; background: a circuit of the node is \
                  <span style=\"background:#fcc\">open</span> or <span style=\"background:#ffe8a0\">half-open</span></p>");
    timeline(out, r);
    out.push_str("<h3>read latency CDF</h3>");
    latency_cdf(out, r);
    out.push_str("<h3>origin bytes over time</h3>");
    origin_bytes(out, r);
}

fn x_of(t: f64, end: f64) -> f64 {
    40.0 + (WIDTH - 50.0) * (t / end.max(1e-9)).clamp(0.0, 1.0)
}

fn axis(out: &mut String, end: f64, y: f64, unit: &str) {
    for k in 0..=5 {
        let t = end * f64::from(k) / 5.0;
        let x = x_of(t, end);
        let _ = write!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#999\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"10\" text-anchor=\"middle\">{t:.2}{unit}</text>",
            y + 4.0,
            y + 15.0
        );
    }
}

/// The time the plots span: a little past the last read, circuit transition or the heal.
fn horizon(r: &RunReport) -> f64 {
    let last_read = r.reads.iter().filter_map(|x| x.done_at).max().unwrap_or(r.end);
    let last_circuit = r
        .nodes
        .iter()
        .flat_map(|n| n.circuit_events.iter().map(|e| e.at))
        .max()
        .unwrap_or(Instant::ZERO);
    let last = last_read.max(last_circuit).max(r.heal_at).min(r.end);
    (secs(last) * 1.05).max(1e-3)
}

/// A circuit's state between two of its transitions: an open circuit counts as half-open (it
/// admits a probe) once its cooldown has run out.
fn bands(
    events: &[&dart_core::breaker::BreakerEvent<String>],
    end: f64,
) -> Vec<(f64, f64, CircuitState)> {
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        let next = events.get(i + 1).map_or(end, |n| secs(n.at));
        let start = secs(e.at);
        match (e.to, e.reopen_at) {
            (CircuitState::Open, Some(until)) => {
                let until = secs(until).min(next);
                out.push((start, until, CircuitState::Open));
                if until < next {
                    out.push((until, next, CircuitState::HalfOpen));
                }
            }
            (CircuitState::Open | CircuitState::HalfOpen, _) => out.push((start, next, e.to)),
            (CircuitState::Closed, _) => {}
        }
    }
    out
}

fn timeline(out: &mut String, r: &RunReport) {
    let nodes = r.nodes.len().min(ROWS_MAX);
    let end = horizon(r);
    let height = 20.0 + nodes as f64 * ROW + 20.0;
    let _ = write!(out, "<svg width=\"{WIDTH}\" height=\"{height:.0}\">");
    for (i, n) in r.nodes.iter().take(nodes).enumerate() {
        let y = 10.0 + i as f64 * ROW;
        let mut per_peer: BTreeMap<&str, Vec<&dart_core::breaker::BreakerEvent<String>>> =
            BTreeMap::new();
        for e in &n.circuit_events {
            per_peer.entry(e.addr.as_str()).or_default().push(e);
        }
        let mut all: Vec<(f64, f64, CircuitState)> =
            per_peer.values().flat_map(|evs| bands(evs, end)).collect();
        // Half-open first so that open bands, drawn after, win where they overlap.
        all.sort_by_key(|band| band.2 == CircuitState::Open);
        for (from, to, state) in all {
            let color = if state == CircuitState::Open { "#fcc" } else { "#ffe8a0" };
            let (x0, x1) = (x_of(from, end), x_of(to, end));
            let _ = write!(
                out,
                "<rect x=\"{x0:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{ROW}\" fill=\"{color}\"/>",
                (x1 - x0).max(0.5)
            );
        }
        let _ = write!(out, "<text x=\"2\" y=\"{:.1}\" font-size=\"7\">n{i}</text>", y + ROW - 1.0);
    }
    // Block sources, one mark per node and pixel column (the most frequent source there).
    let mut cells: BTreeMap<(usize, u32), [u32; 4]> = BTreeMap::new();
    for b in r.blocks.iter().filter(|b| b.node < nodes) {
        let col = x_of(secs(b.at), end) as u32;
        let k = match b.source {
            BlockSource::Cache => 0,
            BlockSource::Peer => 1,
            BlockSource::Origin => 2,
            BlockSource::Coalesced => 3,
        };
        cells.entry((b.node, col)).or_default()[k] += 1;
    }
    let colors = ["#2a7", "#27c", "#d33", "#e90"];
    for ((node, col), counts) in cells {
        let k = (0..4).max_by_key(|&k| (counts[k], 3 - k)).expect("four sources");
        let y = 10.0 + node as f64 * ROW + 1.0;
        let _ = write!(
            out,
            "<rect x=\"{col}\" y=\"{y:.1}\" width=\"1\" height=\"{:.1}\" fill=\"{}\"/>",
            ROW - 2.0,
            colors[k]
        );
    }
    axis(out, end, 10.0 + nodes as f64 * ROW + 2.0, "s");
    out.push_str("</svg>");
}

fn latency_cdf(out: &mut String, r: &RunReport) {
    let height = 220.0;
    let series: Vec<(Phase, &str, Vec<f64>)> = [(Phase::Safety, "#27c"), (Phase::Liveness, "#2a7")]
        .into_iter()
        .map(|(p, c)| {
            let mut v: Vec<f64> = r
                .phase(p)
                .filter(|x| x.outcome.is_complete())
                .filter_map(|x| x.latency())
                .map(|d| d.as_secs_f64())
                .collect();
            v.sort_by(f64::total_cmp);
            (p, c, v)
        })
        .collect();
    let max = series.iter().filter_map(|s| s.2.last()).copied().fold(1e-3, f64::max);
    let _ = write!(out, "<svg width=\"{WIDTH}\" height=\"{height}\">");
    for (phase, color, v) in &series {
        if v.is_empty() {
            continue;
        }
        let mut pts = String::new();
        for (i, l) in v.iter().enumerate() {
            let frac = (i + 1) as f64 / v.len() as f64;
            let _ =
                write!(pts, "{:.1},{:.1} ", x_of(*l, max), 10.0 + (1.0 - frac) * (height - 40.0));
        }
        let _ = write!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"1.5\" points=\"{pts}\"/>"
        );
        let label_y = if *phase == Phase::Safety { 20.0 } else { 34.0 };
        let _ = write!(out, "<text x=\"{:.0}\" y=\"{label_y}\" font-size=\"11\" fill=\"{color}\">{phase:?} ({} reads)</text>", WIDTH - 160.0, v.len());
    }
    axis(out, max, height - 30.0, "s");
    out.push_str("</svg>");
}

fn origin_bytes(out: &mut String, r: &RunReport) {
    let height = 200.0;
    let end = horizon(r);
    let total = r.origin.bytes_timeline.last().map_or(1, |p| p.1).max(1) as f64;
    let _ = write!(out, "<svg width=\"{WIDTH}\" height=\"{height}\">");
    let mut pts = format!("{:.1},{:.1} ", x_of(0.0, end), height - 30.0);
    for (t, b) in &r.origin.bytes_timeline {
        let _ = write!(
            pts,
            "{:.1},{:.1} ",
            x_of(secs(*t), end),
            10.0 + (1.0 - *b as f64 / total) * (height - 40.0)
        );
    }
    let _ = write!(
        out,
        "<polyline fill=\"none\" stroke=\"#d33\" stroke-width=\"1.5\" points=\"{pts}\"/>"
    );
    let _ = write!(
        out,
        "<text x=\"45\" y=\"20\" font-size=\"11\">{} bytes in {} requests</text>",
        total as u64, r.origin.requests
    );
    let heal = x_of(secs(r.heal_at), end);
    let _ = write!(out, "<line x1=\"{heal:.1}\" y1=\"10\" x2=\"{heal:.1}\" y2=\"{:.1}\" stroke=\"#2a7\" stroke-dasharray=\"4\"/><text x=\"{heal:.1}\" y=\"20\" font-size=\"10\" fill=\"#2a7\">heal</text>", height - 30.0);
    axis(out, end, height - 30.0, "s");
    out.push_str("</svg>");
}
