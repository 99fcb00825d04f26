//! Weighted rendezvous (HRW) ranking of members for a placement key (spec/geometry.md §4).
//!
//! Every member gets a score from the placement hash of `(key, id)` and its weight; the ranking
//! is the members sorted by score, best first, ties broken by id bytewise ascending. The score is
//! wire protocol (two nodes must rank identically), so it is computed literally as the spec states
//! it, in IEEE f64 with the same operation order: `u = (f64(hash64(key, id)) + 0.5) / 2^64` with
//! the u64 → f64 conversion rounding to nearest, then `score = weight / -ln(u)`.
//!
//! Consequences worth knowing: a member's share of keys is proportional to its weight; adding a
//! member moves only the keys it now wins, each onto itself, and leaves the relative order of the
//! others untouched (scores are per member); the top 1024 hash values round to `u == 1.0` and
//! score `-inf`, which sorts last (DART keeps this rather than change the wire).

use std::cmp::Ordering;

use crate::hash::hash64;

/// `2^64` as an f64 (exact).
const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;

/// The weight a member ranks with: its configured weight when that is a positive number, else 1.
///
/// Zero and negative weights are treated as 1 by the spec; a NaN weight (which no valid
/// configuration produces, but a malformed peer view could carry) is treated as 1 as well, so a
/// score is never NaN and the ranking stays a total order.
pub fn effective_weight(weight: f64) -> f64 {
    // `NaN > 0.0` is false, so NaN takes the fallback too.
    if weight > 0.0 {
        weight
    } else {
        1.0
    }
}

/// The hash mapped into `(0, 1]`: `(f64(hash) + 0.5) / 2^64`, where `f64(hash)` rounds to
/// nearest (ties to even), exactly as `as` does.
fn unit_interval(hash: u64) -> f64 {
    let u = (hash as f64 + 0.5) / TWO_POW_64;
    debug_assert!(u > 0.0 && u <= 1.0, "u = {u} for hash {hash}");
    u
}

/// The score of a member whose placement hash is `hash`.
fn score_of_hash(hash: u64, weight: f64) -> f64 {
    let weight = effective_weight(weight);
    let score = weight / -unit_interval(hash).ln();
    debug_assert!(!score.is_nan(), "score of hash {hash} weight {weight} is NaN");
    debug_assert!(score > 0.0 || score == f64::NEG_INFINITY || weight < f64::MIN_POSITIVE);
    score
}

/// The HRW score of member `id` with `weight` for `key`: `w / -ln(u)`; see the module docs.
///
/// `weight <= 0` and NaN count as 1 ([`effective_weight`]). The result is never NaN; it is
/// `-inf` for the 1024 largest hash values and `+inf` only for an infinite weight.
pub fn score(key: u64, id: &str, weight: f64) -> f64 {
    score_of_hash(hash64(key, id), weight)
}

/// Best first: higher score, then smaller id bytewise.
fn better_first(a: (f64, &str), b: (f64, &str)) -> Ordering {
    // Scores are never NaN; total_cmp agrees with `<` on everything else that can occur
    // (scores are never -0.0: the numerator is positive).
    b.0.total_cmp(&a.0).then_with(|| a.1.as_bytes().cmp(b.1.as_bytes()))
}

/// Ranks pre-scored members: indices best first. Entries equal in score and id keep input order.
fn rank_scored(scored: &[(f64, &str)]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scored.len()).collect();
    order.sort_by(|&a, &b| better_first(scored[a], scored[b]).then(a.cmp(&b)));
    debug_assert!(order.windows(2).all(|w| better_first(scored[w[0]], scored[w[1]]).is_le()));
    debug_assert!({
        let mut sorted = order.clone();
        sorted.sort_unstable();
        sorted.iter().copied().eq(0..scored.len())
    });
    order
}

/// The HRW ranking of `members` (`(id, weight)` pairs) for `key`: indices into `members`, best
/// first. Ties in score go to the bytewise smaller id; the order of the ids is independent of
/// the order of `members`. Ids are expected to be unique; exact duplicates keep input order.
pub fn rank(key: u64, members: &[(&str, f64)]) -> Vec<usize> {
    let scored: Vec<(f64, &str)> =
        members.iter().map(|&(id, weight)| (score(key, id, weight), id)).collect();
    let order = rank_scored(&scored);
    debug_assert_eq!(order.len(), members.len());
    order
}

/// The best `n` members of [`rank`]: all of them when `n >= members.len()`, none when `n == 0`.
pub fn top(key: u64, members: &[(&str, f64)], n: usize) -> Vec<usize> {
    let mut order = rank(key, members);
    order.truncate(n);
    debug_assert_eq!(order.len(), n.min(members.len()));
    order
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ids_in_order(key: u64, members: &[(&str, f64)]) -> Vec<String> {
        rank(key, members).into_iter().map(|i| members[i].0.to_string()).collect()
    }

    fn ten_nodes() -> Vec<String> {
        (0..10).map(|i| format!("node-{i:02}")).collect()
    }

    fn weighted() -> [(&'static str, f64); 4] {
        [("wn-1", 1.0), ("wn-2", 1.0), ("wn-3", 2.0), ("wn-4", 4.0)]
    }

    #[test]
    fn ten_equal_nodes_rank_in_the_golden_order() {
        let ids = ten_nodes();
        let members: Vec<(&str, f64)> = ids.iter().map(|id| (id.as_str(), 1.0)).collect();
        let want = [
            "node-03", "node-04", "node-05", "node-07", "node-08", "node-00", "node-09", "node-06",
            "node-01", "node-02",
        ];
        assert_eq!(ids_in_order(0xDEAD_BEEF_CAFE_BABE, &members), want);
    }

    #[test]
    fn weighted_nodes_rank_in_the_golden_orders() {
        let members = weighted();
        let cases: [(u64, [&str; 4]); 4] = [
            (0xDEAD_BEEF_CAFE_BABE, ["wn-4", "wn-3", "wn-2", "wn-1"]),
            (42, ["wn-1", "wn-3", "wn-4", "wn-2"]),
            (7, ["wn-4", "wn-2", "wn-1", "wn-3"]),
            (1024, ["wn-2", "wn-3", "wn-4", "wn-1"]),
        ];
        for (key, want) in cases {
            assert_eq!(ids_in_order(key, &members), want, "key {key}");
        }
    }

    #[test]
    fn non_positive_and_nan_weights_score_like_weight_one() {
        let one = score(42, "node-a", 1.0);
        for weight in [0.0, -0.0, -3.5, f64::NEG_INFINITY, f64::NAN] {
            assert_eq!(score(42, "node-a", weight).to_bits(), one.to_bits(), "weight {weight}");
        }
    }

    #[test]
    fn power_of_two_weights_scale_the_score_exactly() {
        for key in 0..100u64 {
            let one = score(key, "node-a", 1.0);
            assert_eq!(score(key, "node-a", 2.0), 2.0 * one);
            assert_eq!(score(key, "node-a", 4.0), 4.0 * one);
        }
    }

    #[test]
    fn the_top_1024_hash_values_round_to_one_and_score_negative_infinity() {
        let first_at_one = u64::MAX - 1023;
        assert_eq!(unit_interval(first_at_one), 1.0);
        assert_eq!(unit_interval(u64::MAX), 1.0);
        assert!(unit_interval(first_at_one - 1) < 1.0);
        assert_eq!(score_of_hash(u64::MAX, 1.0), f64::NEG_INFINITY);
        assert_eq!(score_of_hash(u64::MAX, f64::INFINITY), f64::NEG_INFINITY);
        assert!(score_of_hash(first_at_one - 1, 1.0) > 0.0);
        assert!(unit_interval(0) > 0.0, "u is never zero, so ln never diverges");
    }

    #[test]
    fn negative_infinity_scores_sort_last_and_tie_by_id() {
        let scored = [
            (f64::NEG_INFINITY, "b"),
            (0.5, "z"),
            (f64::NEG_INFINITY, "a"),
            (0.5, "c"),
            (9.0, "y"),
        ];
        assert_eq!(rank_scored(&scored), [4, 3, 1, 2, 0]);
    }

    #[test]
    fn ties_break_bytewise_not_by_locale() {
        let scored = [(1.0, "b"), (1.0, "B"), (1.0, "a"), (1.0, "é")];
        assert_eq!(rank_scored(&scored), [1, 2, 0, 3]);
    }

    #[test]
    fn empty_input_ranks_empty_and_top_clamps_to_the_membership() {
        assert!(rank(1, &[]).is_empty());
        let members = weighted();
        assert!(top(7, &members, 0).is_empty());
        assert_eq!(top(7, &members, 2), rank(7, &members)[..2]);
        assert_eq!(top(7, &members, 4), rank(7, &members));
        assert_eq!(top(7, &members, usize::MAX), rank(7, &members));
    }

    /// Share of keys `0..keys` whose top-1 is each member.
    fn owner_shares(members: &[(&str, f64)], keys: u64) -> Vec<f64> {
        let mut wins = vec![0u64; members.len()];
        for key in 0..keys {
            wins[top(key, members, 1)[0]] += 1;
        }
        wins.into_iter().map(|w| w as f64 / keys as f64).collect()
    }

    #[test]
    fn owner_share_is_proportional_to_weight() {
        // Deterministic: keys 0..20000. Standard error of a share is at most 0.0036 here, so
        // 0.02 is a generous (5σ+) tolerance that still catches a wrong formula.
        let members = weighted();
        let total: f64 = members.iter().map(|m| m.1).sum();
        let shares = owner_shares(&members, 20_000);
        for (member, share) in members.iter().zip(shares) {
            let want = member.1 / total;
            assert!((share - want).abs() < 0.02, "{}: share {share} want {want}", member.0);
        }
        let ids = ten_nodes();
        let equal: Vec<(&str, f64)> = ids.iter().map(|id| (id.as_str(), 1.0)).collect();
        for (id, share) in ids.iter().zip(owner_shares(&equal, 20_000)) {
            assert!((share - 0.1).abs() < 0.015, "{id}: share {share}");
        }
    }

    #[test]
    fn adding_a_node_moves_about_its_fair_share_and_only_onto_itself() {
        let ids = ten_nodes();
        let before: Vec<(&str, f64)> = ids.iter().map(|id| (id.as_str(), 1.0)).collect();
        let mut after = before.clone();
        after.push(("node-10", 1.0));
        let keys = 20_000u64;
        let mut moved = 0u64;
        for key in 0..keys {
            let (old, new) = (top(key, &before, 1)[0], top(key, &after, 1)[0]);
            if old != new {
                assert_eq!(after[new].0, "node-10", "key {key} moved between old nodes");
                moved += 1;
            }
        }
        let share = moved as f64 / keys as f64;
        assert!((share - 1.0 / 11.0).abs() < 0.015, "moved share {share}");
    }

    /// Owned `(id, weight)` members with unique ids.
    type Members = Vec<(String, f64)>;

    fn members() -> impl Strategy<Value = Members> {
        let weight = prop_oneof![
            4 => 0.01f64..100.0,
            1 => Just(0.0),
            1 => -10.0f64..0.0,
            1 => Just(f64::NAN),
            1 => Just(1.0),
        ];
        proptest::collection::btree_map("[a-z0-9-]{1,8}", weight, 0..24)
            .prop_map(|m| m.into_iter().collect())
    }

    fn members_and_a_shuffle() -> impl Strategy<Value = (Members, Members)> {
        members().prop_flat_map(|m| (Just(m.clone()), Just(m).prop_shuffle()))
    }

    fn borrowed(members: &[(String, f64)]) -> Vec<(&str, f64)> {
        members.iter().map(|(id, w)| (id.as_str(), *w)).collect()
    }

    proptest! {
        #[test]
        fn rank_is_a_permutation_of_the_members(key in any::<u64>(), owned in members()) {
            let members = borrowed(&owned);
            let mut order = rank(key, &members);
            order.sort_unstable();
            prop_assert!(order.into_iter().eq(0..members.len()));
        }

        #[test]
        fn rank_does_not_depend_on_input_order(
            key in any::<u64>(),
            (owned, shuffled) in members_and_a_shuffle(),
        ) {
            let (a, b) = (borrowed(&owned), borrowed(&shuffled));
            prop_assert_eq!(ids_in_order(key, &a), ids_in_order(key, &b));
        }

        #[test]
        fn equal_weights_rank_by_descending_rounded_hash(key in any::<u64>(), owned in members()) {
            let members: Vec<(&str, f64)> =
                owned.iter().map(|(id, _)| (id.as_str(), 1.0)).collect();
            let order = rank(key, &members);
            for w in order.windows(2) {
                let (a, b) = (members[w[0]].0, members[w[1]].0);
                let (ha, hb) = (hash64(key, a) as f64, hash64(key, b) as f64);
                prop_assert!(ha >= hb, "{} ranked before {} with a smaller rounded hash", a, b);
            }
        }

        #[test]
        fn adding_a_member_only_moves_keys_onto_it(
            owned in members(),
            newcomer in "[A-Z]{1,8}",
            weight in 0.01f64..100.0,
            keys in proptest::collection::vec(any::<u64>(), 1..32),
        ) {
            let before = borrowed(&owned);
            let mut after = before.clone();
            after.push((newcomer.as_str(), weight));
            for key in keys {
                let old = ids_in_order(key, &before);
                let new = ids_in_order(key, &after);
                let without: Vec<&String> = new.iter().filter(|id| **id != newcomer).collect();
                prop_assert!(without.into_iter().eq(old.iter()), "old members kept their order");
                if let (Some(old_top), Some(new_top)) = (old.first(), new.first()) {
                    prop_assert!(new_top == old_top || *new_top == newcomer);
                }
            }
        }
    }
}
