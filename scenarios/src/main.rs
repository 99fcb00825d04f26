//! `dart-scenarios`: list, run, replay, shrink and report the seeded cluster scenarios.

use clap::{Parser, Subcommand};
use dart_scenarios::{catalogue, html, junit, seeds, shrink, Outcome, Scale, Scenario};
use std::io::{IsTerminal as _, Write as _};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// mimalloc, not the system allocator: the simulator allocates and frees small values at every
/// event, and side by side (farm-bench, 5 alternating runs) it cut the wall time of `bench` to
/// 0.91x and of a 10,000-node herd to 0.84x, for 8 % more peak memory in the herd.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "dart-scenarios", about = "Seeded cluster-failure scenarios for dart")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List the scenarios.
    List,
    /// Run the committed seeds, then fresh ones, within a wall-clock budget.
    Run {
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Run only this seed.
        #[arg(long, conflicts_with = "seeds")]
        seed: Option<u64>,
        /// Fresh seeds per scenario after the committed ones.
        #[arg(long)]
        seeds: Option<u64>,
        /// First fresh seed (default: drawn from the clock and printed).
        #[arg(long)]
        first_seed: Option<u64>,
        /// Stop starting runs after this many seconds.
        #[arg(long)]
        budget: Option<u64>,
        /// Run at the test suite's small scale.
        #[arg(long)]
        small: bool,
        /// Print every run's verdict and notes, not only failures.
        #[arg(long, short)]
        verbose: bool,
        /// Also write the runs as JUnit XML to this file (each failure's message is its replay
        /// command; runs the budget left out are marked skipped).
        #[arg(long, value_name = "FILE")]
        junit: Option<std::path::PathBuf>,
        /// Runs at once, each on a thread of its own (default: the machine's processors). Every
        /// run is seeded and independent, so verdicts and traces do not depend on it; results
        /// are printed in the plan's order.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        jobs: Option<u32>,
    },
    /// Replay one run and print its verdict (and its trace with --trace).
    Replay {
        /// Scenario.
        name: String,
        /// Seed.
        seed: u64,
        /// Small scale.
        #[arg(long)]
        small: bool,
        /// Print the trace, one line per event.
        #[arg(long)]
        trace: bool,
    },
    /// Shrink a failing run to a minimal fault plan and workload.
    Shrink {
        /// Scenario.
        name: String,
        /// Seed.
        seed: u64,
        /// Small scale.
        #[arg(long)]
        small: bool,
        /// Most runs to spend.
        #[arg(long, default_value_t = shrink::SHRINK_RUNS_MAX)]
        runs: usize,
    },
    /// Write an HTML report (SVG plots) of one seed of each scenario.
    Report {
        /// Only this scenario.
        #[arg(long)]
        scenario: Option<String>,
        /// Seed.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Small scale.
        #[arg(long)]
        small: bool,
        /// Output file.
        #[arg(long, default_value = "dart-scenarios.html")]
        out: String,
    },
    /// Print the tail-at-scale table: read latency with hedging off and on, per seed.
    Tail {
        /// Seeds 1..=N.
        #[arg(long, default_value_t = 3)]
        seeds: u64,
        /// Small scale.
        #[arg(long)]
        small: bool,
    },
    /// Measure simulated seconds per wall second and events per second of `reference` (each run,
    /// then their median).
    Bench {
        /// Small scale.
        #[arg(long)]
        small: bool,
        /// Check the touched node's state machines every N events instead of every event.
        #[arg(long)]
        check_every: Option<u64>,
        /// Runs (seeds 1..=N).
        #[arg(long, default_value_t = 3)]
        runs: u64,
        /// Also time herds of these sizes (comma-separated node counts, e.g. 100,1000,10000):
        /// every node reads one 16 MiB object at once in 4 MiB blocks, invariants checked every
        /// 1000 events. A 10,000-node herd takes about 3.3 s and 380 MiB on the 2-core build
        /// machine (7-9 s on a slower hour).
        #[arg(long, value_delimiter = ',')]
        herd: Vec<usize>,
    },
}

fn scale(small: bool) -> Scale {
    if small {
        Scale::Test
    } else {
        Scale::Full
    }
}

fn select(name: Option<&str>) -> Result<Vec<Scenario>, String> {
    match name {
        None => Ok(catalogue::all()),
        Some(n) => catalogue::find(n)
            .map(|s| vec![s])
            .ok_or_else(|| format!("no scenario {n:?} (see `list`)")),
    }
}

fn main() -> ExitCode {
    // Panics inside a run are caught and reported with their replay line; keep stderr readable.
    std::panic::set_hook(Box::new(|info| {
        eprintln!("\npanic: {info}");
    }));
    let cli = Cli::parse();
    let result = match cli.command {
        Command::List => {
            for s in catalogue::all() {
                let gap =
                    s.violation_expected.map_or(String::new(), |w| format!(" [known gap: {w}]"));
                println!("{:<20} {}{gap}", s.name, s.summary);
            }
            Ok(true)
        }
        Command::Run { scenario, seed, seeds, first_seed, budget, small, verbose, junit, jobs } => {
            let scale = scale(small);
            let plan = Plan { scenario: scenario.as_deref(), seed, fresh: seeds, first_seed };
            let jobs = jobs.map_or_else(
                || std::thread::available_parallelism().map_or(1, |n| n.get()),
                |n| n as usize,
            );
            run(plan, budget, jobs, scale, verbose, junit.as_deref())
        }
        Command::Replay { name, seed, small, trace } => replay(&name, seed, scale(small), trace),
        Command::Shrink { name, seed, small, runs } => shrink_cmd(&name, seed, scale(small), runs),
        Command::Report { scenario, seed, small, out } => {
            report(scenario.as_deref(), seed, scale(small), &out)
        }
        Command::Tail { seeds, small } => tail(seeds, scale(small)),
        Command::Bench { small, runs, check_every, herd } => {
            bench(scale(small), runs, check_every).and_then(|ok| Ok(herds(&herd)? && ok))
        }
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

/// Runs `scenario` under `seed`, and a second time for every eighth run to check determinism.
fn run_checked(s: &Scenario, seed: u64, scale: Scale, index: usize) -> (Outcome, Option<String>) {
    let outcome = s.run(seed, scale);
    let mut drift = None;
    if index.is_multiple_of(8) {
        if let Some(first) = &outcome.report {
            let again = s.run(seed, scale);
            let second = again.report.as_ref().map(|r| (r.trace_hash, r.events));
            if second != Some((first.trace_hash, first.events)) {
                drift = Some(format!(
                    "nondeterminism: {} seed {seed} gave trace {:016x}/{} then {second:?}",
                    s.name, first.trace_hash, first.events
                ));
            }
        }
    }
    (outcome, drift)
}

/// Which runs `run` makes.
struct Plan<'a> {
    scenario: Option<&'a str>,
    seed: Option<u64>,
    fresh: Option<u64>,
    first_seed: Option<u64>,
}

fn run(
    Plan { scenario, seed, fresh, first_seed }: Plan<'_>,
    budget: Option<u64>,
    jobs: usize,
    scale: Scale,
    verbose: bool,
    junit: Option<&std::path::Path>,
) -> Result<bool, String> {
    let scenarios = select(scenario)?;
    let mut report = junit::Report::default();
    // An unwritable report path is refused before any run, not after all of them.
    let mut junit_file = match junit {
        Some(path) => Some((
            path,
            std::fs::File::create(path).map_err(|e| format!("--junit {}: {e}", path.display()))?,
        )),
        None => None,
    };
    let mut plan: Vec<(Scenario, u64)> = Vec::new();
    match seed {
        Some(seed) => plan.extend(scenarios.iter().map(|s| (s.clone(), seed))),
        None => {
            for s in &scenarios {
                plan.extend(seeds::of(s.name).into_iter().map(|seed| (s.clone(), seed)));
            }
            if let Some(n) = fresh {
                let base = first_seed.unwrap_or_else(|| {
                    SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .map_or(1, |d| d.as_secs() % 1_000_000)
                        * 1000
                });
                eprintln!("fresh seeds {base}..{}", base + n);
                for s in &scenarios {
                    plan.extend((base..base + n).map(|seed| (s.clone(), seed)));
                }
            }
        }
    }
    let start = Instant::now();
    let budget = budget.map(Duration::from_secs);
    let (mut failed, mut ran, mut sim_secs, mut events) = (Vec::new(), 0usize, 0.0, 0u64);
    // Runs that passed with a known gap (`Check::gap`): counted in the summary, so a log shows
    // them without `--verbose`, each named by its replay line.
    let mut gaps = Vec::new();
    let total = plan.len();
    let mut progress = Progress::new(total);
    let started = run_in_order(&plan, jobs, budget, start, scale, |i, outcome, drift, took| {
        let (s, seed) = &plan[i];
        let what = format_args!("{:<20} seed {seed:<10} {} failed   ", s.name, failed.len());
        progress.show(i + 1, what);
        report.ran(&outcome, took, drift.as_deref());
        ran += 1;
        if let Some(r) = &outcome.report {
            sim_secs += r.end.as_nanos() as f64 / 1e9;
            events += r.events;
        }
        if outcome.passed() && drift.is_none() && !outcome.check.gaps.is_empty() {
            gaps.push(outcome.replay_line());
        }
        if !outcome.passed() || drift.is_some() {
            progress.end_line();
            println!("{}", outcome.describe());
            if let Some(d) = &drift {
                println!("      {d}\n      replay: {}", outcome.replay_line());
            }
            failed.push(outcome.replay_line());
        } else if verbose
            || (!outcome.check.gaps.is_empty()
                && i == plan.iter().position(|(p, _)| p.name == s.name).unwrap_or(i))
        {
            progress.end_line();
            println!("{}", outcome.describe());
        }
    });
    progress.end_line();
    if started < total {
        eprintln!("budget spent after {ran} of {total} runs");
        for (s, seed) in &plan[started..] {
            report.skipped(s.name, *seed, scale, "the wall-clock budget (--budget) was spent");
        }
    }
    let wall = start.elapsed().as_secs_f64();
    print!("{}", summary(ran, &failed, &gaps, wall, sim_secs, events));
    if let Some((path, file)) = &mut junit_file {
        file.write_all(report.to_xml().as_bytes())
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
        println!("wrote {} runs to {} (JUnit XML)", report.len(), path.display());
    }
    Ok(failed.is_empty())
}

/// Progress on stderr. On a terminal, one line rewritten in place after every step; elsewhere (a
/// CI log, a pipe) a line of its own at every twentieth of the steps and at the last, so a log of
/// 564 runs holds about 20 progress lines, not one line of 564 carriage returns.
struct Progress {
    total: usize,
    terminal: bool,
    /// A rewritten line is on the terminal without its newline yet.
    open: bool,
}

impl Progress {
    fn new(total: usize) -> Self {
        Progress { total, terminal: std::io::stderr().is_terminal(), open: false }
    }

    /// Step `done` of the total finished; `what` says which.
    fn show(&mut self, done: usize, what: std::fmt::Arguments<'_>) {
        if self.terminal {
            eprint!("\r[{done}/{}] {what}", self.total);
            let _ = std::io::stderr().flush();
            self.open = true;
        } else if done == self.total || done.is_multiple_of(self.total.div_ceil(20).max(1)) {
            eprintln!("[{done}/{}] {}", self.total, what.to_string().trim_end());
        }
    }

    /// Ends a rewritten line, so the next output starts a line of its own.
    fn end_line(&mut self) {
        if std::mem::take(&mut self.open) {
            eprintln!();
        }
    }
}

/// Runs `plan` on `jobs` threads, each taking the next run in the plan's order, and hands every
/// result to `take` in the plan's order (index, outcome, determinism drift, wall time), whatever
/// order they finish in. A run starts only while `budget` (from `start`) lasts, decided under the
/// lock that hands out the next run, so the runs made are a prefix of the plan; returns how many.
fn run_in_order(
    plan: &[(Scenario, u64)],
    jobs: usize,
    budget: Option<Duration>,
    start: Instant,
    scale: Scale,
    mut take: impl FnMut(usize, Outcome, Option<String>, Duration),
) -> usize {
    let next = std::sync::Mutex::new(0usize);
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        for _ in 0..jobs.clamp(1, plan.len().max(1)) {
            let (next, done_tx) = (&next, done_tx.clone());
            scope.spawn(move || loop {
                let i = {
                    let mut next = next.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if *next == plan.len() || budget.is_some_and(|b| start.elapsed() > b) {
                        break;
                    }
                    *next += 1;
                    *next - 1
                };
                let (s, seed) = &plan[i];
                let t0 = Instant::now();
                let (outcome, drift) = run_checked(s, *seed, scale, i);
                if done_tx.send((i, outcome, drift, t0.elapsed())).is_err() {
                    break;
                }
            });
        }
        drop(done_tx);
        let (mut waiting, mut due) = (std::collections::BTreeMap::new(), 0);
        for (i, outcome, drift, took) in done_rx {
            waiting.insert(i, (outcome, drift, took));
            while let Some((outcome, drift, took)) = waiting.remove(&due) {
                take(due, outcome, drift, took);
                due += 1;
            }
        }
        *next.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    })
}

fn replay(name: &str, seed: u64, scale: Scale, trace: bool) -> Result<bool, String> {
    let s = catalogue::find(name).ok_or_else(|| format!("no scenario {name:?}"))?;
    let mut spec = s.spec(seed, scale);
    spec.record_trace = trace;
    let t0 = Instant::now();
    let outcome = s.run_spec(spec, seed, scale);
    let wall = t0.elapsed();
    if let Some(lines) = outcome.report.as_ref().and_then(|r| r.trace.as_ref()) {
        for l in lines {
            println!("{l}");
        }
    }
    println!("{}", outcome.describe());
    if let Some(r) = &outcome.report {
        println!("      {} (wall {wall:.2?})", r.summary());
    }
    Ok(outcome.passed())
}

fn shrink_cmd(name: &str, seed: u64, scale: Scale, runs: usize) -> Result<bool, String> {
    let s = catalogue::find(name).ok_or_else(|| format!("no scenario {name:?}"))?;
    let Some(shrunk) = shrink::shrink(&s, seed, scale, runs) else {
        println!("{name} seed {seed} passes: nothing to shrink");
        return Ok(true);
    };
    let before = s.spec(seed, scale);
    println!(
        "shrunk in {} steps ({} runs): {} -> {} faults, {} -> {} safety reads, {} -> {} liveness reads",
        shrunk.steps,
        shrunk.runs,
        before.plan.faults.len(),
        shrunk.spec.plan.faults.len(),
        before.workload.safety.len(),
        shrunk.spec.workload.safety.len(),
        before.workload.liveness.len(),
        shrunk.spec.workload.liveness.len(),
    );
    println!("minimal plan: {}", shrunk.spec.plan);
    println!("as a value: {:?}", shrunk.spec.plan);
    println!("reads: {:?}", shrunk.spec.workload);
    println!("{}", shrunk.outcome.describe());
    Ok(false)
}

fn report(scenario: Option<&str>, seed: u64, scale: Scale, out: &str) -> Result<bool, String> {
    let scenarios = select(scenario)?;
    let mut outcomes = Vec::new();
    let mut progress = Progress::new(scenarios.len());
    for (i, s) in scenarios.iter().enumerate() {
        progress.show(i + 1, format_args!("{:<20}", s.name));
        outcomes.push(s.run(seed, scale));
    }
    progress.end_line();
    let page = html::page(&outcomes);
    std::fs::write(out, page).map_err(|e| format!("writing {out}: {e}"))?;
    println!("wrote {out}");
    Ok(outcomes.iter().all(Outcome::passed))
}

fn tail(seeds: u64, scale: Scale) -> Result<bool, String> {
    let s = catalogue::find("tail-at-scale").ok_or("no tail-at-scale scenario")?;
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1e3);
    println!("| seed | hedging | reads completed | p50 | p99 | p99.9 | max | backup requests / peer blocks |");
    println!("|---|---|---|---|---|---|---|---|");
    let mut ok = true;
    for seed in 1..=seeds {
        for ratio in [0.0, dart_core::engine::hedge::DEFAULT_HEDGE_RATIO] {
            let mut spec = catalogue::tail_at_scale_spec(seed, scale);
            spec.cluster.hedge_ratio = ratio;
            let outcome = s.run_spec(spec, seed, scale);
            let r = outcome.report.as_ref().ok_or("the run panicked")?;
            let f = catalogue::tail_figures(r);
            let hedging = if ratio > 0.0 { format!("on ({ratio})") } else { "off".to_string() };
            println!(
                "| {seed} | {hedging} | {}/{} | {} | {} | {} | {} | {}/{} = {:.2} % |",
                f.completed,
                f.reads,
                ms(f.p50),
                ms(f.p99),
                ms(f.p999),
                ms(f.max),
                f.hedges,
                f.peer_blocks,
                100.0 * f.hedges as f64 / f.peer_blocks.max(1) as f64
            );
            if !outcome.passed() {
                ok = false;
                println!("{}", outcome.describe());
            }
        }
    }
    Ok(ok)
}

/// `bench --herd`: one herd per size, timed, with the process's peak resident set so far.
fn herds(sizes: &[usize]) -> Result<bool, String> {
    use dart_sim::origin::ObjectDef;
    const SIZE: u64 = 16 << 20;
    const BLOCK: u64 = 4 << 20;
    let mut ok = true;
    for &nodes in sizes {
        if nodes < 2 {
            return Err(format!("--herd {nodes}: a herd needs at least 2 nodes"));
        }
        let mut cluster =
            dart_sim::ClusterConfig::new(nodes, BLOCK, vec![ObjectDef::plain(SIZE, 7)]);
        cluster.public_origin = true;
        let safety = (0..nodes).map(|n| dart_sim::ReadSpec::whole(Duration::ZERO, n, 0)).collect();
        let spec = dart_sim::SimSpec {
            cluster,
            workload: dart_sim::Workload { safety, liveness: vec![] },
            plan: dart_sim::FaultPlan::none(),
            phases: dart_sim::Phases {
                safety: Duration::from_secs(120),
                liveness: Duration::from_secs(1),
            },
            check: dart_sim::CheckLevel::Sampled { every: 1000 },
            record_trace: false,
        };
        let t0 = Instant::now();
        let r = dart_sim::run(spec, 1);
        let wall = t0.elapsed().as_secs_f64();
        let done = r.reads.iter().filter(|x| x.done_at.is_some()).count();
        let slowest = r
            .reads
            .iter()
            .filter_map(|x| Some(x.done_at?.saturating_duration_since(x.started?)))
            .max()
            .unwrap_or_default()
            .as_secs_f64();
        let peak = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmHWM:"))?.to_owned();
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or("unknown".to_owned(), |kib| format!("{:.0} MiB", kib as f64 / 1024.0));
        println!(
            "herd {nodes} nodes: {done}/{nodes} reads done, slowest {slowest:.3} simulated s; {wall:.2} wall s; {} events = {:.0} events/s; origin {:.2}x the object; process peak RSS so far {peak}",
            r.events,
            r.events as f64 / wall,
            r.origin.body_bytes as f64 / SIZE as f64,
        );
        ok &= done == nodes;
    }
    Ok(ok)
}

fn bench(scale: Scale, runs: u64, check_every: Option<u64>) -> Result<bool, String> {
    let s = catalogue::find("reference").ok_or("no reference scenario")?;
    let mut ok = true;
    let (mut speeds, mut rates) = (Vec::new(), Vec::new());
    for seed in 1..=runs {
        let mut spec = s.spec(seed, scale);
        if let Some(every) = check_every {
            spec.check = dart_sim::CheckLevel::Sampled { every };
        }
        let t0 = Instant::now();
        let outcome = s.run_spec(spec, seed, scale);
        let wall = t0.elapsed().as_secs_f64();
        let r = outcome.report.as_ref().ok_or("the reference run panicked")?;
        let sim = r.end.as_nanos() as f64 / 1e9;
        println!(
            "reference seed {seed}: {sim:.1} simulated s in {wall:.3} wall s = {:.0}x; {} events = {:.0} events/s; trace {:016x}",
            sim / wall,
            r.events,
            r.events as f64 / wall,
            r.trace_hash
        );
        speeds.push(sim / wall);
        rates.push(r.events as f64 / wall);
        ok &= outcome.passed();
        if !outcome.passed() {
            println!("{}", outcome.describe());
        }
    }
    if let (Some(speed), Some(rate)) = (median(&mut speeds), median(&mut rates)) {
        println!(
            "reference, median of {runs} runs: {speed:.0}x real time, {rate:.0} events/s (targets: 1000x, 1000000 events/s; docs/simulation.md)"
        );
    }
    Ok(ok)
}

/// The median of `values` (the mean of the middle two for an even count); `None` when empty.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

/// `run`'s closing lines: the counts and speed, a replay line per failed run, and one per run
/// that passed with a known gap (the first [`GAPS_LISTED`]).
fn summary(
    ran: usize,
    failed: &[String],
    gaps: &[String],
    wall: f64,
    sim_secs: f64,
    events: u64,
) -> String {
    use std::fmt::Write as _;
    let with_gaps = match gaps.len() {
        0 => String::new(),
        n => format!(", {n} passed with a known gap"),
    };
    let mut out = format!(
        "{ran} runs, {} failed{with_gaps}, in {wall:.1} s wall ({sim_secs:.0} simulated seconds, {:.0}x, {:.0} events/s)\n",
        failed.len(),
        sim_secs / wall.max(1e-9),
        events as f64 / wall.max(1e-9)
    );
    for line in failed {
        let _ = writeln!(out, "replay: {line}");
    }
    for line in gaps.iter().take(GAPS_LISTED) {
        let _ = writeln!(out, "known gap: {line}");
    }
    if gaps.len() > GAPS_LISTED {
        let more = gaps.len() - GAPS_LISTED;
        let _ = writeln!(out, "known gap: {more} more (--verbose prints every run)");
    }
    out
}

/// Runs that passed with a known gap that [`summary`] names.
const GAPS_LISTED: usize = 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bench_median_is_the_middle_run_or_the_mean_of_the_middle_two() {
        assert_eq!(median(&mut []), None);
        assert_eq!(median(&mut [86.0, 93.0, 92.0]), Some(92.0));
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), Some(2.5));
    }

    #[test]
    fn the_summary_counts_and_names_runs_that_passed_with_a_known_gap() {
        let gaps: Vec<String> = (1..=12).map(|s| format!("replay herd {s} --small")).collect();
        let failed = vec!["replay dead-root 3".to_owned()];
        let out = summary(40, &failed, &gaps, 2.0, 100.0, 1000);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines[0],
            "40 runs, 1 failed, 12 passed with a known gap, in 2.0 s wall (100 simulated seconds, 50x, 500 events/s)"
        );
        assert_eq!(lines[1], "replay: replay dead-root 3");
        assert_eq!(lines[2], "known gap: replay herd 1 --small");
        assert_eq!(lines[11], "known gap: replay herd 10 --small");
        assert_eq!(lines[12], "known gap: 2 more (--verbose prints every run)");
        assert_eq!(lines.len(), 13);
        let clean = summary(40, &[], &[], 2.0, 100.0, 1000);
        assert_eq!(clean.lines().count(), 1);
        assert!(clean.starts_with("40 runs, 0 failed, in 2.0 s wall"), "{clean}");
    }
}
