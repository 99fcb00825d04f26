//! The committed seeds (`scenarios/seeds.txt`): replayed by the test suite and by `run`.

/// The file's text, compiled in.
pub const SEEDS_TXT: &str = include_str!("../seeds.txt");

/// `(scenario, seeds)` per line of [`SEEDS_TXT`], comments and blanks skipped.
pub fn committed() -> Vec<(String, Vec<u64>)> {
    SEEDS_TXT
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let mut words = l.split_whitespace();
            let name = words.next().expect("a non-empty line has a word").to_owned();
            let seeds = words.map(|w| w.parse().expect("seeds are integers")).collect();
            (name, seeds)
        })
        .collect()
}

/// The committed seeds of `scenario`.
pub fn of(scenario: &str) -> Vec<u64> {
    committed().into_iter().filter(|(n, _)| n == scenario).flat_map(|(_, s)| s).collect()
}
