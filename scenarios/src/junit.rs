//! JUnit XML for scenario runs, the test-report format every CI system displays: one
//! `<testsuite>` per scenario, one `<testcase>` per seed, and for each failed run a `<failure>`
//! whose message is the command that replays it.
//!
//! ```
//! use dart_scenarios::junit::Report;
//! use dart_scenarios::{catalogue, Scale};
//!
//! let mut report = Report::default();
//! let scenario = catalogue::find("black-hole").expect("a scenario");
//! let outcome = scenario.run(1, Scale::Test);
//! report.ran(&outcome, std::time::Duration::from_millis(20), None);
//! report.skipped("black-hole", 2, Scale::Test, "the wall-clock budget was spent");
//! let xml = report.to_xml();
//! assert!(xml.contains(r#"<testcase classname="dart-scenarios.black-hole" name="seed 1 small""#));
//! ```

use crate::{Outcome, Scale};
use std::fmt::Write as _;
use std::time::Duration;

/// One run, as JUnit sees it.
#[derive(Clone, Debug)]
struct Case {
    scenario: String,
    seed: u64,
    scale: Scale,
    seconds: f64,
    verdict: Verdict,
}

#[derive(Clone, Debug)]
enum Verdict {
    Passed { output: String },
    Failed { message: String, details: String },
    Skipped { reason: String },
}

/// The runs of one invocation, in the order they were added.
#[derive(Clone, Debug, Default)]
pub struct Report {
    cases: Vec<Case>,
}

impl Report {
    /// Adds a run that took `wall`. `problem` fails it even if its checks passed (the runner's
    /// own findings, such as a second run of the seed that gave another trace).
    pub fn ran(&mut self, outcome: &Outcome, wall: Duration, problem: Option<&str>) {
        let replay = outcome.replay_line();
        let verdict = match (outcome.passed(), problem) {
            (true, None) => Verdict::Passed { output: outcome.describe() },
            (_, problem) => {
                let mut details = outcome.describe();
                if let Some(p) = problem {
                    details.push_str(&format!("\n      {p}\n      replay: {replay}"));
                }
                let first = outcome
                    .panic
                    .as_ref()
                    .map(|p| format!("panicked: {p}"))
                    .or_else(|| problem.map(str::to_owned))
                    .or_else(|| outcome.check.failures.first().cloned())
                    .unwrap_or_default();
                Verdict::Failed { message: format!("{first} — replay: {replay}"), details }
            }
        };
        self.cases.push(Case {
            scenario: outcome.scenario.to_owned(),
            seed: outcome.seed,
            scale: outcome.scale,
            seconds: wall.as_secs_f64(),
            verdict,
        });
    }

    /// Adds a run that was planned but not started, with why.
    pub fn skipped(&mut self, scenario: &str, seed: u64, scale: Scale, reason: &str) {
        let verdict = Verdict::Skipped { reason: reason.to_owned() };
        self.cases.push(Case { scenario: scenario.to_owned(), seed, scale, seconds: 0.0, verdict });
    }

    /// Runs added so far.
    pub fn len(&self) -> usize {
        self.cases.len()
    }

    /// Whether no run was added.
    pub fn is_empty(&self) -> bool {
        self.cases.is_empty()
    }

    /// The XML document: `<testsuites>` with one `<testsuite>` per scenario, in first-seen order.
    pub fn to_xml(&self) -> String {
        let mut names: Vec<&str> = Vec::new();
        for c in &self.cases {
            if !names.contains(&c.scenario.as_str()) {
                names.push(&c.scenario);
            }
        }
        let failed = |c: &&Case| matches!(c.verdict, Verdict::Failed { .. });
        let skipped = |c: &&Case| matches!(c.verdict, Verdict::Skipped { .. });
        let total: f64 = self.cases.iter().map(|c| c.seconds).sum();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        let _ = writeln!(
            out,
            "<testsuites name=\"dart-scenarios\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{total:.3}\">",
            self.cases.len(),
            self.cases.iter().filter(failed).count(),
            self.cases.iter().filter(skipped).count(),
        );
        for name in names {
            let cases: Vec<&Case> = self.cases.iter().filter(|c| c.scenario == name).collect();
            let time: f64 = cases.iter().map(|c| c.seconds).sum();
            let _ = writeln!(
                out,
                "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{time:.3}\">",
                escape(name),
                cases.len(),
                cases.iter().copied().filter(failed).count(),
                cases.iter().copied().filter(skipped).count(),
            );
            for c in cases {
                let small = if c.scale == Scale::Test { " small" } else { "" };
                let _ = write!(
                    out,
                    "    <testcase classname=\"dart-scenarios.{}\" name=\"seed {}{small}\" time=\"{:.3}\"",
                    escape(&c.scenario),
                    c.seed,
                    c.seconds
                );
                match &c.verdict {
                    Verdict::Passed { output } => {
                        let _ = writeln!(
                            out,
                            ">\n      <system-out>{}</system-out>\n    </testcase>",
                            escape(output)
                        );
                    }
                    Verdict::Failed { message, details } => {
                        let _ = writeln!(
                            out,
                            ">\n      <failure message=\"{}\" type=\"scenario\">{}</failure>\n    </testcase>",
                            escape(message),
                            escape(details)
                        );
                    }
                    Verdict::Skipped { reason } => {
                        let _ = writeln!(
                            out,
                            ">\n      <skipped message=\"{}\"/>\n    </testcase>",
                            escape(reason)
                        );
                    }
                }
            }
            out.push_str("  </testsuite>\n");
        }
        out.push_str("</testsuites>\n");
        out
    }
}

/// `text` as XML character data or attribute value: the five markup characters escaped, and
/// the control characters XML 1.0 forbids (all below 0x20 but tab, newline and carriage return)
/// written as `\u{..}` so that nothing is lost and the document stays well formed.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\t' | '\n' | '\r' => out.push(c),
            c if (c as u32) < 0x20 || c == '\u{FFFE}' || c == '\u{FFFF}' => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue;

    #[test]
    fn markup_and_forbidden_control_characters_are_escaped_and_nothing_is_lost() {
        assert_eq!(escape("a<b>&\"c'\td\n"), "a&lt;b&gt;&amp;&quot;c&apos;\td\n");
        assert_eq!(escape("x\u{1}y\u{1f}"), "x\\u{1}y\\u{1f}");
        assert_eq!(escape("naïve — ok"), "naïve — ok");
    }

    #[test]
    fn suites_group_seeds_and_a_failure_carries_its_replay_line() {
        let scenario = catalogue::find("black-hole").expect("black-hole");
        let outcome = scenario.run(1, Scale::Test);
        assert!(outcome.passed(), "{}", outcome.describe());
        let mut report = Report::default();
        report.ran(&outcome, Duration::from_millis(1500), None);
        report.ran(&outcome, Duration::from_millis(500), Some("nondeterminism: <trace> & more"));
        report.skipped("reference", 9, Scale::Full, "budget spent");
        let xml = report.to_xml();
        assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"dart-scenarios\" tests=\"3\" failures=\"1\" skipped=\"1\" time=\"2.000\">"), "{xml}");
        assert!(
            xml.contains("<testsuite name=\"black-hole\" tests=\"2\" failures=\"1\" skipped=\"0\" time=\"2.000\">"),
            "{xml}"
        );
        let replay = "cargo run --release -p dart-scenarios -- replay black-hole 1 --small";
        assert!(
            xml.contains(&format!(
                "<failure message=\"nondeterminism: &lt;trace&gt; &amp; more — replay: {replay}\" type=\"scenario\">"
            )),
            "{xml}"
        );
        assert!(
            xml.contains(
                "name=\"seed 9\" time=\"0.000\">\n      <skipped message=\"budget spent\"/>"
            ),
            "{xml}"
        );
        // Well formed as far as nesting goes: every element opened is closed, in order.
        let opens = xml.matches("<testcase ").count();
        assert_eq!(opens, xml.matches("</testcase>").count());
        assert_eq!(xml.matches("<testsuite ").count(), xml.matches("</testsuite>").count());
        assert!(xml.trim_end().ends_with("</testsuites>"));
    }
}
