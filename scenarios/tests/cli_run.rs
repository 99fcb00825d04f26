//! `dart-scenarios run` as a user runs it: runs spread over threads (`--jobs`) print what one
//! thread prints, in the plan's order, and a spent budget skips the runs it left out.

use std::process::Command;

fn run(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dart-scenarios"))
        .arg("run")
        .args(args)
        .output()
        .expect("dart-scenarios starts");
    assert!(out.status.success(), "run {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).expect("utf-8"), String::from_utf8(out.stderr).expect("utf-8"))
}

/// The lines of a run's output that do not depend on the wall clock (the summary's times do).
fn verdicts(stdout: &str) -> Vec<&str> {
    stdout.lines().filter(|l| !l.contains(" s wall (") && !l.starts_with("wrote ")).collect()
}

#[test]
fn runs_on_several_threads_print_what_one_thread_prints_in_the_same_order() {
    // Verbose: every run's verdict, notes and trace hash, in order.
    let args = ["--small", "--scenario", "herd", "--seeds", "5", "--first-seed", "41", "-v"];
    let (one, _) = run(&[&args[..], &["--jobs", "1"]].concat());
    let (three, _) = run(&[&args[..], &["--jobs", "3"]].concat());
    let one = verdicts(&one);
    assert!(one.iter().filter(|l| l.contains("seed 4")).count() >= 5, "every run printed: {one:?}");
    assert_eq!(one, verdicts(&three));
}

#[test]
fn a_spent_budget_starts_no_more_runs_and_reports_the_rest_as_skipped() {
    let dir = std::env::temp_dir().join(format!("dart-cli-run-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let junit = dir.join("runs.xml");
    let junit_arg = junit.to_str().expect("utf-8 path");
    let args = ["--small", "--scenario", "herd", "--seeds", "4", "--first-seed", "41"];
    let (stdout, stderr) =
        run(&[&args[..], &["--budget", "0", "--jobs", "2", "--junit", junit_arg]].concat());
    assert!(stdout.starts_with("0 runs, 0 failed"), "{stdout}");
    assert!(stderr.contains("budget spent after 0 of"), "{stderr}");
    let xml = std::fs::read_to_string(&junit).expect("the report was written");
    let cases = xml.matches("<testcase").count();
    assert!(cases >= 4, "every planned run is in the report: {xml}");
    assert_eq!(xml.matches("<skipped").count(), cases, "and every one was skipped: {xml}");
    std::fs::remove_dir_all(dir).expect("clean up");
}

#[test]
fn progress_in_a_log_is_a_few_whole_lines_not_one_line_rewritten_per_run() {
    // stderr is a pipe here, as in a CI log. Seeds 100-139 all pass `herd` at test scale (a few
    // seeds elsewhere do not: docs/simulation.md, "Findings about the core").
    let args = ["--small", "--scenario", "herd", "--seeds", "40", "--first-seed", "100"];
    let (stdout, stderr) = run(&args);
    let total: usize = stdout.split(' ').next().and_then(|n| n.parse().ok()).expect("a summary");
    assert!(total > 40, "{stdout}");
    assert!(!stderr.contains('\r'), "no carriage returns: {stderr:?}");
    let progress: Vec<&str> = stderr.lines().filter(|l| l.starts_with('[')).collect();
    assert!((2..=21).contains(&progress.len()), "about 20 lines: {progress:?}");
    assert!(progress.last().unwrap().starts_with(&format!("[{total}/{total}] herd")), "{stderr}");
}

#[test]
fn the_herd_seeds_that_showed_a_roots_shared_read_pass_with_no_gap() {
    // Seeds 57 and 337 of `herd` at test scale ran every reader at 2.02-2.22 x one solo read
    // until tree roots read ahead at an origin slow to answer (docs/simulation.md, "Findings
    // about the core"): they pass now, the bound checked hard, and the summary names no gap.
    for seed in ["57", "337"] {
        let (stdout, _) =
            run(&["--small", "--scenario", "herd", "--seeds", "1", "--first-seed", seed]);
        let summary = stdout.lines().find(|l| l.contains(" s wall (")).expect("a summary");
        assert!(summary.contains(" 0 failed, in "), "{summary}");
        assert!(!stdout.contains("known gap"), "{stdout}");
    }
}
