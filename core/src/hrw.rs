//! Weighted rendezvous (HRW) ranking (spec/geometry.md §4).
//!
//! CONTRACT (to be implemented):
//! - `pub fn score(key: u64, id: &str, weight: f64) -> f64`
//! - `pub fn rank(key: u64, members: &[(&str, f64)]) -> Vec<usize>`: indices into `members`, best
//!   first; ties by id ascending; input order irrelevant.
//! - `pub fn top(key: u64, members: &[(&str, f64)], n: usize) -> Vec<usize>`
