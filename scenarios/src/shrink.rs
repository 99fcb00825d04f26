//! Shrinking a failing run to a minimal one: greedy reduction of the fault plan (drop a fault,
//! shorten it, start it earlier, make it milder) and of the workload (drop reads in halving
//! chunks), keeping a candidate only if it still fails the same way. Turmoil, madsim,
//! FoundationDB's simulator and the VOPR replay failing schedules; none of them shrinks them.

use crate::{Outcome, Scale, Scenario};
use dart_sim::SimSpec;

/// Runs a shrink may spend by default.
pub const SHRINK_RUNS_MAX: usize = 2_000;

/// The result of a shrink.
pub struct Shrunk {
    /// The smallest failing spec found.
    pub spec: SimSpec,
    /// Its outcome.
    pub outcome: Outcome,
    /// Accepted reduction steps.
    pub steps: usize,
    /// Runs spent.
    pub runs: usize,
}

/// What kind of failure an outcome is; a shrink keeps only candidates that fail the same way.
pub fn signature(o: &Outcome) -> Option<String> {
    if o.panic.is_some() {
        return Some("panic".into());
    }
    let f = o.check.failures.first()?;
    let kind = if f.starts_with("invariant violated") {
        // Keep the kind of violation (text up to the first digit or colon after the node).
        let what =
            o.report.as_ref().and_then(|r| r.violation.as_ref()).map_or("", |v| v.what.as_str());
        let head: String = what.chars().take_while(|c| !c.is_ascii_digit()).collect();
        format!("violation: {}", head.trim())
    } else if f.starts_with("liveness") {
        "liveness".into()
    } else {
        format!("expectation: {}", f.chars().take(40).collect::<String>())
    };
    Some(kind)
}

/// Shrinks the failing run of `scenario` under `seed`, spending at most `budget` runs. `None`
/// when the run passes.
pub fn shrink(scenario: &Scenario, seed: u64, scale: Scale, budget: usize) -> Option<Shrunk> {
    let spec = scenario.spec(seed, scale);
    shrink_spec(scenario, spec, seed, scale, budget)
}

/// Shrinks an explicit failing spec.
pub fn shrink_spec(
    scenario: &Scenario,
    spec: SimSpec,
    seed: u64,
    scale: Scale,
    budget: usize,
) -> Option<Shrunk> {
    let first = scenario.run_spec(spec.clone(), seed, scale);
    let want = signature(&first)?;
    let mut best = Shrunk { spec, outcome: first, steps: 0, runs: 1 };
    'outer: while best.runs < budget {
        for candidate in candidates(&best.spec) {
            if best.runs >= budget {
                break 'outer;
            }
            let outcome = scenario.run_spec(candidate.clone(), seed, scale);
            best.runs += 1;
            if signature(&outcome).as_deref() == Some(want.as_str()) {
                best.spec = candidate;
                best.outcome = outcome;
                best.steps += 1;
                continue 'outer;
            }
        }
        break;
    }
    Some(best)
}

/// Specs one step simpler than `spec`, most aggressive first.
fn candidates(spec: &SimSpec) -> Vec<SimSpec> {
    let mut out = Vec::new();
    for plan in spec.plan.simpler() {
        out.push(SimSpec { plan, ..spec.clone() });
    }
    for list in [true, false] {
        let reads = if list { &spec.workload.safety } else { &spec.workload.liveness };
        let mut chunk = reads.len().div_ceil(2);
        while chunk >= 1 && !reads.is_empty() {
            let mut start = 0;
            while start < reads.len() {
                let mut s = spec.clone();
                let target = if list { &mut s.workload.safety } else { &mut s.workload.liveness };
                target.drain(start..(start + chunk).min(target.len()));
                out.push(s);
                start += chunk;
            }
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    out
}
