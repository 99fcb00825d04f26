use super::*;
use crate::overlay::{Fault, Punishment, TransportError, SCORE_INITIAL};
use crate::rng;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn t(secs: u64) -> Instant {
    Instant::from_secs(secs)
}

fn cand(peer: &str, expires_secs: u64) -> Candidate<String> {
    Candidate { peer: peer.to_string(), expires_at: t(expires_secs) }
}

fn peers(range: std::ops::Range<usize>, expires_secs: u64) -> Vec<Candidate<String>> {
    range.map(|i| cand(&format!("p{i:02}"), expires_secs)).collect()
}

fn members(set: &NeighbourSet<String>) -> Vec<String> {
    set.members().map(|(k, _)| k.clone()).collect()
}

/// A set of the default config filled with exactly p00..p04, entries expiring at 3600 s.
fn full_set(rng: &mut rng::Rng) -> NeighbourSet<String> {
    let mut set = NeighbourSet::new(Config::default());
    let update = set.update(peers(0..5, 3600), t(0), rng);
    assert_eq!(update.added.len(), 5);
    assert_eq!(members(&set), ["p00", "p01", "p02", "p03", "p04"]);
    set
}

fn fail(set: &mut NeighbourSet<String>, peer: &str, times: usize) {
    let stats = set.stats_mut(&peer.to_string()).expect("a member");
    for _ in 0..times {
        stats.transport_error(TransportError::Other, Duration::ZERO);
    }
}

fn score(set: &NeighbourSet<String>, peer: &str) -> u8 {
    set.book().get(&peer.to_string()).expect("a member").score()
}

#[test]
fn the_defaults_are_the_spec_numbers() {
    assert_eq!(KEEP_DEFAULT, 5);
    assert_eq!(UPDATE_INTERVAL, Duration::from_secs(120));
    assert_eq!(PING_INTERVAL, Duration::from_secs(30));
    assert_eq!(ENTRY_TTL, Duration::from_secs(3600));
    assert_eq!(entry_expiry(t(100), ENTRY_TTL), t(3700));
    assert_eq!(Config::default().keep, 5);
    assert_eq!(Config::default().default_round_trip, Duration::from_millis(300));
}

#[test]
fn the_initial_fill_picks_keep_of_the_candidates_at_random() {
    let mut picks = BTreeSet::new();
    for seed in 0..8 {
        let mut rng = rng::from_seed(seed);
        let mut set = NeighbourSet::new(Config::default());
        let update = set.update(peers(0..10, 3600), t(0), &mut rng);
        assert_eq!(set.len(), 5);
        assert_eq!(update.added.len(), 5);
        assert!(update.departed.is_empty() && !update.no_candidates);
        assert_eq!(set.generation(), 5, "one generation per join");
        for peer in &update.added {
            assert_eq!(score(&set, peer), SCORE_INITIAL);
            assert_eq!(set.expires_at(peer), Some(t(3600)));
        }
        picks.insert(members(&set));
    }
    assert!(picks.len() > 1, "different seeds pick different members");
}

#[test]
fn keep_bounds_the_set_and_the_candidates_wanted() {
    let mut rng = rng::from_seed(1);
    let mut set = NeighbourSet::new(Config { keep: 2, ..Config::default() });
    assert_eq!(set.candidates_wanted(), 4);
    set.update(peers(0..10, 3600), t(0), &mut rng);
    assert_eq!(set.len(), 2);
    assert_eq!(set.candidates_wanted(), 2);
    let set5 = NeighbourSet::<String>::new(Config::default());
    assert_eq!(set5.candidates_wanted(), 10, "keep + (keep - active)");
}

#[test]
#[should_panic(expected = "keep 0 not in")]
fn a_keep_of_zero_is_refused() {
    NeighbourSet::<String>::new(Config { keep: 0, ..Config::default() });
}

#[test]
fn the_default_round_trip_seeds_fresh_neighbours() {
    let mut rng = rng::from_seed(1);
    let config = Config { default_round_trip: Duration::from_millis(100), ..Config::default() };
    let mut set = NeighbourSet::new(config);
    set.update(peers(0..1, 3600), t(0), &mut rng);
    assert_eq!(set.book().get(&"p00".to_string()).unwrap().average_round_trip_ms(), 100);
}

#[test]
fn a_full_healthy_set_is_not_churned_over_ten_updates_with_spare_fresh_candidates() {
    let mut rng = rng::from_seed(2);
    let mut set = full_set(&mut rng);
    // Healthy but not all perfect: p00 has two failures (48), p01 three (40).
    fail(&mut set, "p00", 2);
    fail(&mut set, "p01", 3);
    let before = members(&set);
    let generation = set.generation();
    for round in 1..=10u64 {
        let now = t(round * 120);
        let update = set.update(peers(5..15, 3600), now, &mut rng);
        assert!(update.departed.is_empty(), "round {round}: {:?}", update.departed);
        assert!(update.added.is_empty());
        assert!(!update.no_candidates);
        assert_eq!(members(&set), before);
        assert_eq!(set.generation(), generation);
    }
    assert_eq!((score(&set, "p00"), score(&set, "p01")), (48, 40));
}

#[test]
fn an_unreliable_member_is_replaced_by_a_candidate() {
    let mut rng = rng::from_seed(3);
    let mut set = full_set(&mut rng);
    set.stats_mut(&"p02".to_string()).unwrap().punish(Punishment::Malicious);
    let update = set.update(peers(5..6, 3600), t(120), &mut rng);
    assert_eq!(update.departed, [("p02".to_string(), Departure::Unreliable)]);
    assert_eq!(update.added, ["p05"]);
    assert_eq!(members(&set), ["p00", "p01", "p03", "p04", "p05"]);
    assert!(set.book().remembers(&"p02".to_string()));
    assert_eq!(set.generation(), 7);
}

#[test]
fn a_member_at_32_is_evicted_for_a_fresh_candidate_but_one_at_40_is_not() {
    let mut rng = rng::from_seed(4);
    let mut set = full_set(&mut rng);
    fail(&mut set, "p03", 3);
    assert_eq!(score(&set, "p03"), 40);
    let update = set.update(peers(5..6, 3600), t(120), &mut rng);
    assert!(update.departed.is_empty() && update.added.is_empty(), "40 is above the margin");
    fail(&mut set, "p03", 1);
    fail(&mut set, "p04", 3);
    assert_eq!((score(&set, "p03"), score(&set, "p04")), (32, 40));
    let update = set.update(peers(5..7, 3600), t(240), &mut rng);
    assert_eq!(update.departed, [("p03".to_string(), Departure::Evicted)]);
    assert_eq!(update.added.len(), 1, "one eviction per update, one replacement");
    assert!(!set.contains(&"p03".to_string()) && set.contains(&"p04".to_string()));
    assert_eq!(set.len(), 5);
}

#[test]
fn a_remembered_candidate_never_evicts_a_member() {
    let mut rng = rng::from_seed(5);
    let mut set = full_set(&mut rng);
    // p05 departs with 40 and is remembered; p00 drops to 32 (evictable by a newcomer only).
    set.update(peers(5..6, 3600), t(0), &mut rng);
    set.remove(&"p04".to_string(), t(0));
    set.update(peers(5..6, 3600), t(0), &mut rng);
    assert!(set.contains(&"p05".to_string()));
    fail(&mut set, "p05", 3);
    assert!(set.remove(&"p05".to_string(), t(10)));
    assert!(set.book().remembers(&"p05".to_string()));
    set.update(peers(4..5, 3600), t(10), &mut rng);
    assert_eq!(set.len(), 5);
    fail(&mut set, "p00", 4);
    let update = set.update(peers(5..6, 3600), t(130), &mut rng);
    assert!(update.departed.is_empty() && update.added.is_empty());
    assert!(set.contains(&"p00".to_string()));
}

#[test]
fn with_no_spare_candidates_the_set_does_not_oscillate_between_keep_and_keep_minus_one() {
    let mut rng = rng::from_seed(6);
    let mut set = full_set(&mut rng);
    fail(&mut set, "p00", 4); // 32: evictable, but there is no one to replace it
    let generation = set.generation();
    for round in 1..=10u64 {
        // The overlay has only the members themselves, or nobody at all.
        let offer = if round % 2 == 0 { peers(0..5, 3600) } else { Vec::new() };
        let update = set.update(offer, t(round * 120), &mut rng);
        assert_eq!(set.len(), 5, "round {round}");
        assert!(update.no_candidates && update.departed.is_empty());
        assert_eq!(set.generation(), generation);
    }
}

#[test]
fn no_candidates_is_reported_only_when_nobody_outside_the_set_is_offered() {
    let mut rng = rng::from_seed(7);
    let mut set = NeighbourSet::new(Config::default());
    assert!(set.update(Vec::new(), t(0), &mut rng).no_candidates, "an empty overlay");
    assert!(set.is_empty());
    assert!(set.update(peers(0..1, 10), t(10), &mut rng).no_candidates, "expired entry");
    assert!(!set.update(peers(0..2, 3600), t(10), &mut rng).no_candidates);
    assert!(set.update(peers(0..2, 3600), t(20), &mut rng).no_candidates, "members only");
    assert_eq!(set.len(), 2);
}

#[test]
fn an_expired_neighbour_is_replaced() {
    let mut rng = rng::from_seed(8);
    let mut set = NeighbourSet::new(Config::default());
    let mut offer = peers(0..4, 3600);
    offer.push(cand("p04", 1000));
    set.update(offer, t(0), &mut rng);
    assert_eq!(set.len(), 5);
    let update = set.update(peers(5..6, 4600), t(999), &mut rng);
    assert!(update.departed.is_empty(), "not yet expired at 999 s");
    let update = set.update(peers(5..6, 4600), t(1000), &mut rng);
    assert_eq!(update.departed, [("p04".to_string(), Departure::Expired)]);
    assert_eq!(update.added, ["p05"]);
    assert_eq!(set.expires_at(&"p05".to_string()), Some(t(4600)));
}

#[test]
fn a_refreshed_neighbour_is_kept_past_its_original_expiry() {
    let mut rng = rng::from_seed(9);
    let mut set = full_set(&mut rng);
    // p00 is refreshed by the driver, p01 by being offered again; an earlier expiry is ignored.
    assert!(set.refresh(&"p00".to_string(), t(7200)));
    assert!(set.refresh(&"p00".to_string(), t(100)));
    assert!(!set.refresh(&"p99".to_string(), t(7200)));
    let mut offer = peers(5..10, 7200);
    offer.push(cand("p01", 7200));
    let update = set.update(offer, t(3000), &mut rng);
    assert!(update.departed.is_empty());
    assert_eq!(set.expires_at(&"p00".to_string()), Some(t(7200)));
    assert_eq!(set.expires_at(&"p01".to_string()), Some(t(7200)));
    let update = set.update(peers(5..10, 7200), t(3600), &mut rng);
    let expired: Vec<_> = update.departed.iter().map(|(k, d)| (k.as_str(), *d)).collect();

    assert_eq!(
        expired,
        [("p02", Departure::Expired), ("p03", Departure::Expired), ("p04", Departure::Expired)]
    );
    assert!(set.contains(&"p00".to_string()) && set.contains(&"p01".to_string()));
    assert_eq!(set.len(), 5);
}

#[test]
fn a_punished_peer_removed_and_offered_again_comes_back_with_its_low_score() {
    let mut rng = rng::from_seed(10);
    let mut set = full_set(&mut rng);
    set.stats_mut(&"p01".to_string()).unwrap().reject(Fault::Wrong, Duration::ZERO);
    set.stats_mut(&"p01".to_string()).unwrap().punish(Punishment::Slow);
    assert_eq!(score(&set, "p01"), 48);
    let generation = set.generation();
    assert!(set.remove(&"p01".to_string(), t(60)));
    assert!(!set.remove(&"p01".to_string(), t(60)), "a second removal changes nothing");
    assert_eq!(set.generation(), generation + 1);
    assert!(set.book().remembers(&"p01".to_string()));
    let update = set.update(vec![cand("p01", 7200)], t(120), &mut rng);
    assert_eq!(update.added, ["p01"]);
    assert_eq!(score(&set, "p01"), 48, "not a fresh 64");
    assert_eq!(set.book().get(&"p01".to_string()).unwrap().failures(), 1);
}

#[test]
fn a_removed_malicious_peer_offered_again_is_refused_and_still_remembered() {
    let mut rng = rng::from_seed(11);
    let mut set = full_set(&mut rng);
    set.stats_mut(&"p02".to_string()).unwrap().reject(Fault::Invalid, Duration::ZERO);
    assert!(set.remove(&"p02".to_string(), t(60)));
    let generation = set.generation();
    let update = set.update(vec![cand("p02", 7200)], t(120), &mut rng);
    assert!(update.added.is_empty() && !update.no_candidates);
    assert_eq!(set.len(), 4);
    assert_eq!(set.generation(), generation);
    assert!(set.book().remembers(&"p02".to_string()));
    // A fresh candidate is preferred to a remembered one for the free slot.
    let update = set.update(vec![cand("p02", 7200), cand("p07", 7200)], t(240), &mut rng);
    assert_eq!(update.added, ["p07"]);
}

#[test]
fn a_refused_peer_offered_again_and_again_is_forgotten_an_hour_after_it_left() {
    let mut rng = rng::from_seed(12);
    let mut set = full_set(&mut rng);
    let p02 = "p02".to_string();
    set.stats_mut(&p02).unwrap().reject(Fault::Invalid, Duration::ZERO);
    assert!(set.remove(&p02, t(60)));
    // Offered every two minutes: refused each time, and the refusals do not restart the hour.
    for k in 1..30 {
        let update = set.update(vec![cand("p02", 7200)], t(60 + 120 * k), &mut rng);
        assert!(update.added.is_empty(), "refused at {k}");
    }
    assert!(set.book().remembers(&p02));
    // An hour after it left, it is forgotten and comes back fresh.
    let back = t(60) + crate::overlay::REMEMBER_FOR;
    let update = set.update(vec![cand("p02", 7200)], back, &mut rng);
    assert_eq!(update.added, ["p02"]);
    assert_eq!(set.book().get(&p02).unwrap().score(), crate::overlay::SCORE_INITIAL);
}

const STAT_SEED: u64 = 0x5e70_f5e7;

#[test]
fn the_ping_target_is_uniform_over_the_whole_set_including_a_weight_0_member() {
    println!("seed {STAT_SEED:#x}");
    let mut rng = rng::from_seed(STAT_SEED);
    let mut set = full_set(&mut rng);
    fail(&mut set, "p03", 5); // 24 with a failed streak: weight 8, left out of the index
    let p03 = "p03".to_string();
    assert!(set.book().get(&p03).unwrap().is_reliable());
    assert_eq!(set.book().get(&p03).unwrap().selection_weight(), 0);
    let draws = 50_000;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for _ in 0..draws {
        *counts.entry(set.ping_target(&mut rng).unwrap()).or_default() += 1;
        assert_ne!(set.choose_one(&mut rng), Some(p03.clone()), "choice keeps it out");
    }
    assert_eq!(counts.len(), 5);
    for (peer, count) in &counts {
        let freq = *count as f64 / draws as f64;
        assert!((freq - 0.2).abs() < 0.01, "{peer}: {freq} (seed {STAT_SEED:#x})");
    }
    assert_eq!(NeighbourSet::<String>::new(Config::default()).ping_target(&mut rng), None);
}

#[test]
fn a_ping_success_lets_an_excluded_neighbour_earn_its_way_back() {
    let mut rng = rng::from_seed(12);
    let mut set = full_set(&mut rng);
    fail(&mut set, "p03", 5);
    let p03 = "p03".to_string();
    set.stats_mut(&p03).unwrap().accept(Duration::from_millis(50));
    assert_eq!(set.book().get(&p03).unwrap().selection_weight(), 32);
    assert_eq!(set.choose_many(5, &mut rng).len(), 5);
}

#[test]
fn a_generation_snapshot_taken_before_an_update_is_stale_after_it() {
    let mut rng = rng::from_seed(13);
    let mut set = full_set(&mut rng);
    let snapshot = set.generation();
    assert!(set.is_current(snapshot));
    // No membership change: refreshing, scoring and a quiet update keep the snapshot current.
    set.refresh(&"p00".to_string(), t(9000));
    fail(&mut set, "p01", 1);
    set.update(peers(5..8, 3600), t(120), &mut rng);
    assert!(set.is_current(snapshot));
    set.stats_mut(&"p01".to_string()).unwrap().punish(Punishment::Malicious);
    set.update(peers(5..8, 3600), t(240), &mut rng);
    assert!(!set.is_current(snapshot), "p01 left and a candidate joined");
    assert_eq!(set.generation(), snapshot + 2);
    let snapshot = set.generation();
    set.remove(&"p02".to_string(), t(250));
    assert!(!set.is_current(snapshot));
}

#[test]
fn time_going_backwards_does_not_panic_or_expire_anyone() {
    let mut rng = rng::from_seed(14);
    let mut set = full_set(&mut rng);
    let update = set.update(peers(5..8, 3600), t(0), &mut rng);
    assert!(update.departed.is_empty());
    set.remove(&"p00".to_string(), t(0));
    set.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Model-based: random operations against a reference of the expiries and the rules that must hold.

#[derive(Clone, Debug)]
enum Op {
    Update { offer: Vec<(u8, u16)>, seed: u64 },
    Remove(u8),
    Outcome { member: u8, kind: u8 },
    Refresh { member: u8, ttl: u16 },
    Step(u16),
    Back(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (prop::collection::vec((0u8..12, 0u16..4000), 0..12), any::<u64>())
            .prop_map(|(offer, seed)| Op::Update { offer, seed }),
        (0u8..12).prop_map(Op::Remove),
        (0u8..8, 0u8..6).prop_map(|(member, kind)| Op::Outcome { member, kind }),
        (0u8..8, 0u16..4000).prop_map(|(member, ttl)| Op::Refresh { member, ttl }),
        (0u16..1000).prop_map(Op::Step),
        (0u16..100).prop_map(Op::Back),
    ]
}

fn report(stats: &mut NeighbourStats, kind: u8) {
    let rtt = Duration::from_millis(40);
    match kind {
        0 => stats.accept(rtt),
        1 => stats.ignore(rtt),
        2 => stats.reject(Fault::Wrong, rtt),
        3 => stats.reject(Fault::Invalid, rtt),
        4 => stats.transport_error(TransportError::QueryTimeout, rtt),
        _ => stats.punish(Punishment::Minor),
    }
}

fn run_model(keep: usize, ops: Vec<Op>) {
    let mut set: NeighbourSet<u8> = NeighbourSet::new(Config { keep, ..Config::default() });
    let mut expiry: BTreeMap<u8, Instant> = BTreeMap::new(); // the reference
    let mut now = t(0);
    for op in ops {
        let before: Vec<u8> = set.members().map(|(k, _)| *k).collect();
        let generation = set.generation();
        match op {
            Op::Update { offer, seed } => {
                let offer: Vec<Candidate<u8>> = offer
                    .into_iter()
                    .map(|(peer, ttl)| Candidate { peer, expires_at: now + secs(ttl) })
                    .collect();
                let mut offered: BTreeMap<u8, Instant> = BTreeMap::new();
                for c in &offer {
                    let at = offered.entry(c.peer).or_insert(c.expires_at);
                    *at = (*at).max(c.expires_at);
                }
                let was_full_and_healthy = before.len() == keep
                    && before.iter().all(|p| {
                        set.book().get(p).unwrap().score() > SCORE_INITIAL - EVICT_MARGIN
                            && expiry[p].max(offered.get(p).copied().unwrap_or(now)) > now
                    });
                let update = set.update(offer, now, &mut rng::from_seed(seed));
                for (peer, at) in set.members() {
                    let expected = if before.contains(peer) {
                        offered.get(peer).map_or(expiry[peer], |o| expiry[peer].max(*o))
                    } else {
                        offered[peer]
                    };
                    assert_eq!(at, expected, "expiry of {peer}");
                    assert!(at > now, "no member is expired after an update");
                    assert!(set.book().get(peer).unwrap().is_reliable());
                }
                if was_full_and_healthy {
                    assert_eq!(update.departed, [], "a full healthy set is not churned");
                }
                assert_eq!(
                    update.no_candidates,
                    offered.iter().all(|(p, at)| before.contains(p) || *at <= now)
                );
                expiry = set.members().map(|(k, e)| (*k, e)).collect();
            }
            Op::Remove(peer) => {
                let was = set.remove(&peer, now);
                assert_eq!(was, before.contains(&peer));
                assert!(!set.contains(&peer));
                expiry.remove(&peer);
            }
            Op::Outcome { member, kind } => {
                let target = set.ping_target(&mut rng::from_seed(u64::from(member)));
                assert_eq!(target.is_some(), !before.is_empty());
                if let Some(peer) = target {
                    assert!(before.contains(&peer), "the ping target is a member");
                    report(set.stats_mut(&peer).unwrap(), kind);
                }
            }
            Op::Refresh { member, ttl } => {
                if let Some(&peer) = before.get(usize::from(member)) {
                    set.refresh(&peer, now + secs(ttl));
                    let e = expiry.get_mut(&peer).unwrap();
                    *e = (*e).max(now + secs(ttl));
                }
            }
            Op::Step(s) => now += secs(s),
            Op::Back(s) => {
                now = Instant::from_nanos(now.as_nanos().saturating_sub(secs(s).as_nanos() as u64))
            }
        }
        set.check_invariants();
        let after: Vec<u8> = set.members().map(|(k, _)| *k).collect();
        assert!(after.len() <= keep);
        assert_eq!(after.len(), after.iter().collect::<BTreeSet<_>>().len(), "no duplicates");
        for peer in &after {
            assert!(set.book().get(peer).is_some(), "every member has stats in the book");
        }
        assert_eq!(set.members().map(|(k, e)| (*k, e)).collect::<BTreeMap<_, _>>(), expiry);
        assert!(set.generation() >= generation);
        if set.is_current(generation) {
            assert_eq!(after, before, "membership changed without a new generation");
        }
    }
}

fn secs(s: u16) -> Duration {
    Duration::from_secs(u64::from(s))
}

proptest! {
    #[test]
    fn random_updates_removals_outcomes_and_time_steps_keep_the_invariants(
        keep in 1usize..7,
        ops in prop::collection::vec(op(), 1..60),
    ) {
        run_model(keep, ops);
    }
}
