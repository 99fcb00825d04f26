use super::*;
use crate::rng;
use proptest::prelude::*;

fn t(secs: u64) -> Instant {
    Instant::from_secs(secs)
}

fn ms(d: u64) -> Duration {
    Duration::from_millis(d)
}

fn p(i: usize) -> String {
    format!("p{i:02}")
}

fn set_of(range: std::ops::Range<usize>, seen: Instant) -> Vec<(String, Instant)> {
    range.map(|i| (p(i), seen)).collect()
}

fn machine(config: Config) -> BroadcastTargets<String> {
    BroadcastTargets::new(config).expect("a valid config")
}

fn drain(bt: &mut BroadcastTargets<String>) -> Vec<Ping<String>> {
    std::iter::from_fn(|| bt.poll_ping()).collect()
}

fn peers_of(pings: &[Ping<String>]) -> BTreeSet<String> {
    pings.iter().map(|ping| ping.peer.clone()).collect()
}

fn sorted(peers: &[String]) -> BTreeSet<String> {
    peers.iter().cloned().collect()
}

/// How a peer treats a ping in [`drive_round`].
#[derive(Clone, Copy)]
enum Behaviour {
    /// Answers ok after this long.
    Ok(Duration),
    /// Answers with an error after this long.
    Fail(Duration),
    /// Never answers.
    Silent,
}

/// Deterministic driver: starts the round due at `now` and jumps virtual time from answer to
/// deadline until the round ends. Returns the time it ended and every ping sent.
fn drive_round(
    bt: &mut BroadcastTargets<String>,
    rng: &mut rng::Rng,
    mut now: Instant,
    behaviour: impl Fn(&str) -> Behaviour,
) -> (Instant, Vec<Ping<String>>) {
    bt.handle_timeout(now, rng);
    let token = bt.current_round().expect("a round is due and has candidates");
    let mut sent = Vec::new();
    let mut answers: Vec<(Instant, Ping<String>, bool)> = Vec::new();
    for _ in 0..10_000 {
        for ping in drain(bt) {
            match behaviour(&ping.peer) {
                Behaviour::Ok(after) => answers.push((now + after, ping.clone(), true)),
                Behaviour::Fail(after) => answers.push((now + after, ping.clone(), false)),
                Behaviour::Silent => {}
            }
            sent.push(ping);
        }
        bt.check_invariants();
        if bt.current_round() != Some(token) {
            return (now, sent);
        }
        answers.sort_by_key(|(at, ping, _)| (*at, ping.peer.clone()));
        let timeout = bt.poll_timeout().expect("a running round has a deadline");
        match answers.first() {
            Some((at, _, _)) if *at < timeout => {
                let (at, ping, ok) = answers.remove(0);
                now = at;
                bt.ping_answered(ping.token, &ping.peer, ok, now);
            }
            Some(_) | None => {
                now = timeout;
                bt.handle_timeout(now, rng);
            }
        }
    }
    panic!("the round did not end");
}

fn all_ok(_: &str) -> Behaviour {
    Behaviour::Ok(ms(100))
}

#[test]
fn the_defaults_are_the_spec_numbers() {
    let config = Config::default();
    assert_eq!(config.keep, 5);
    assert_eq!(config.ping_interval, Duration::from_secs(60));
    assert_eq!(config.ping_timeout, Duration::from_secs(1));
    assert_eq!(config.stale_after, Duration::from_secs(30 * 60));
    assert_eq!(config.validate(), Ok(()));
}

#[test]
fn every_out_of_range_setting_is_a_typed_error() {
    let base = Config::default();
    let cases = [
        (Config { keep: 0, ..base }, ConfigError::KeepZero),
        (Config { keep: KEEP_MAX + 1, ..base }, ConfigError::KeepAboveMax { keep: KEEP_MAX + 1 }),
        (Config { ping_interval: Duration::ZERO, ..base }, ConfigError::ZeroPingInterval),
        (Config { ping_timeout: Duration::ZERO, ..base }, ConfigError::ZeroPingTimeout),
        (Config { stale_after: Duration::ZERO, ..base }, ConfigError::ZeroStaleAfter),
    ];
    for (config, error) in cases {
        assert_eq!(config.validate(), Err(error));
        assert_eq!(BroadcastTargets::<String>::new(config).err(), Some(error));
    }
    assert!(BroadcastTargets::<String>::new(Config { keep: KEEP_MAX, ..base }).is_ok());
}

#[test]
fn nothing_is_due_before_a_set_is_designated() {
    let mut bt = machine(Config::default());
    assert_eq!(bt.poll_timeout(), None);
    bt.handle_timeout(t(100), &mut rng::from_seed(1));
    assert!(bt.poll_ping().is_none() && bt.targets().is_empty() && !bt.take_changed());
    assert_eq!(bt.epoch(), 0);
}

#[test]
fn a_new_designated_set_starts_a_round_at_once_with_keep_pings() {
    let mut rng = rng::from_seed(1);
    let mut bt = machine(Config::default());
    assert!(bt.set_designated(set_of(0..10, t(0)), t(5)));
    assert_eq!((bt.epoch(), bt.poll_timeout()), (1, Some(t(5))));
    bt.handle_timeout(t(5), &mut rng);
    let pings = drain(&mut bt);
    assert_eq!(pings.len(), 5);
    assert_eq!(peers_of(&pings).len(), 5, "distinct peers");
    let token = bt.current_round().unwrap();
    assert_eq!((token.epoch(), token.round()), (1, 1));
    for ping in &pings {
        assert!(bt.is_designated(&ping.peer));
        assert_eq!((ping.token, ping.deadline), (token, t(6)));
    }
    assert_eq!((bt.in_flight(), bt.poll_timeout()), (5, Some(t(6))));
}

#[test]
fn a_round_publishes_its_responders_fastest_first_and_schedules_the_next() {
    let mut rng = rng::from_seed(2);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(5));
    bt.handle_timeout(t(5), &mut rng);
    let pings = drain(&mut bt);
    let token = pings[0].token;
    for (i, ping) in pings.iter().rev().enumerate() {
        assert!(bt.ping_answered(ping.token, &ping.peer, true, t(5) + ms(100 * i as u64 + 1)));
    }
    let expected: Vec<String> = pings.iter().rev().map(|ping| ping.peer.clone()).collect();
    assert_eq!(bt.targets(), expected);
    assert_eq!((bt.current_round(), bt.last_completed()), (None, Some(token)));
    assert_eq!(bt.poll_timeout(), Some(t(65)), "ping_interval after the round started");
    assert!(bt.take_changed() && !bt.take_changed());
}

#[test]
fn responders_are_published_as_they_answer_while_the_targets_are_empty() {
    let mut rng = rng::from_seed(3);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let pings = drain(&mut bt);
    for (i, ping) in pings.iter().enumerate() {
        bt.ping_answered(ping.token, &ping.peer, true, Instant::from_millis(10 * i as u64 + 10));
        let so_far: Vec<String> = pings[..=i].iter().map(|ping| ping.peer.clone()).collect();
        assert_eq!(bt.targets(), so_far, "published at once");
        assert!(bt.take_changed(), "the owner re-reads after every early answer");
    }
    assert_eq!(bt.last_completed(), Some(pings[0].token));
}

#[test]
fn a_failed_ping_is_replaced_by_the_next_candidate_at_once() {
    let mut rng = rng::from_seed(4);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let first = drain(&mut bt);
    let now = Instant::from_millis(100);
    assert!(bt.ping_answered(first[0].token, &first[0].peer, false, now));
    let next = drain(&mut bt);
    assert_eq!(next.len(), 1);
    assert!(!peers_of(&first).contains(&next[0].peer), "a new candidate");
    assert_eq!(next[0].deadline, now + Duration::from_secs(1));
    assert_eq!(bt.in_flight(), 5);
    assert!(bt.targets().is_empty(), "a failure publishes nobody");
}

#[test]
fn a_ping_times_out_at_its_deadline_and_is_replaced() {
    let mut rng = rng::from_seed(5);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let first = drain(&mut bt);
    for ping in &first[1..] {
        bt.ping_answered(ping.token, &ping.peer, true, Instant::from_millis(200));
    }
    assert_eq!(bt.poll_timeout(), Some(t(1)));
    bt.handle_timeout(Instant::from_nanos(t(1).as_nanos() - 1), &mut rng);
    assert!(drain(&mut bt).is_empty(), "not before the deadline");
    bt.handle_timeout(t(1), &mut rng);
    let next = drain(&mut bt);
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].deadline, t(2));
    assert!(!bt.ping_answered(first[0].token, &first[0].peer, true, t(1)), "timed out");
    assert!(!bt.targets().contains(&first[0].peer));
    assert!(bt.ping_answered(next[0].token, &next[0].peer, true, t(1) + ms(5)));
    assert_eq!(bt.targets().len(), 5);
}

#[test]
fn an_answer_at_the_deadline_counts_as_a_timeout() {
    let mut rng = rng::from_seed(6);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..5, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let pings = drain(&mut bt);
    assert!(!bt.ping_answered(pings[0].token, &pings[0].peer, true, pings[0].deadline));
    assert!(bt.targets().is_empty() && bt.current_round().is_none(), "all timed out: ended");
}

/// §6.2: the candidates run out while live peers' pings are in flight; upstream abandoned them.
#[test]
fn a_round_waits_for_pings_in_flight_when_the_candidates_run_out() {
    let mut rng = rng::from_seed(7);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..6, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let first = drain(&mut bt);
    // The one dead peer among the first five fails fast; its replacement is the last candidate.
    assert!(bt.ping_answered(first[0].token, &first[0].peer, false, Instant::from_millis(10)));
    let last = drain(&mut bt);
    assert_eq!(last.len(), 1);
    assert_eq!(bt.in_flight(), 5, "no candidate left, five pings still in flight");
    let live: Vec<&Ping<String>> = first[1..].iter().chain(&last).collect();
    for (i, ping) in live.iter().enumerate() {
        assert_eq!(bt.current_round(), Some(ping.token), "the round waits");
        assert!(bt.ping_answered(ping.token, &ping.peer, true, Instant::from_millis(900)));
        assert_eq!(bt.targets().len(), i + 1);
    }
    assert_eq!(bt.targets().len(), 5, "keep targets while keep designated peers are alive");
    assert_eq!(bt.last_completed(), Some(first[0].token));
}

#[test]
fn fast_failures_do_not_cut_short_slow_live_answers() {
    let mut rng = rng::from_seed(7);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    // Five dead peers fail fast; five live ones answer slowly, just inside the timeout.
    let dead = |peer: &str| peer < "p05";
    let behaviour =
        |peer: &str| if dead(peer) { Behaviour::Fail(ms(10)) } else { Behaviour::Ok(ms(900)) };
    let (ended, _) = drive_round(&mut bt, &mut rng, t(0), behaviour);
    assert_eq!(bt.targets().len(), 5);
    assert!(bt.targets().iter().all(|peer| !dead(peer)));
    assert!(ended < t(2), "ended by the last answer, {ended}");
}

#[test]
fn a_round_with_fewer_live_peers_than_keep_publishes_every_live_one_once_all_pings_end() {
    let mut rng = rng::from_seed(8);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..8, t(0)), t(0));
    let live = ["p01", "p04", "p06"];
    let behaviour =
        |peer: &str| if live.contains(&peer) { Behaviour::Ok(ms(300)) } else { Behaviour::Silent };
    let (ended, sent) = drive_round(&mut bt, &mut rng, t(0), behaviour);
    assert_eq!(sent.len(), 8);
    assert_eq!(sorted(bt.targets()), live.iter().map(|s| s.to_string()).collect());
    assert!(ended <= t(2), "silent peers time out at 1 s, their replacements at 2 s");
}

/// §6.3: the old targets still designated stay published until the new round ends.
#[test]
fn targets_still_designated_stay_published_until_the_new_round_ends() {
    let mut rng = rng::from_seed(9);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    drive_round(&mut bt, &mut rng, t(0), all_ok);
    let old = bt.targets().to_vec();
    assert_eq!(old.len(), 5);
    bt.take_changed();
    // The new set keeps two of the old targets and adds eight new peers.
    let mut next = vec![(old[3].clone(), t(10)), (old[1].clone(), t(10))];
    next.extend(set_of(20..28, t(10)));
    assert!(bt.set_designated(next, t(10)));
    assert_eq!(bt.targets(), [old[1].clone(), old[3].clone()], "the kept ones, in old order");
    assert!(bt.take_changed());
    assert_eq!(bt.poll_timeout(), Some(t(10)), "a new set starts a round at once");
    bt.handle_timeout(t(10), &mut rng);
    let pings = drain(&mut bt);
    assert_eq!(pings[0].token.epoch(), 2);
    let first = &pings[0];
    bt.ping_answered(first.token, &first.peer, true, t(10) + ms(50));
    assert_eq!(bt.targets(), [old[1].clone(), old[3].clone()], "not replaced mid-round");
    for ping in &pings[1..] {
        bt.ping_answered(ping.token, &ping.peer, true, t(10) + ms(60));
    }
    assert_eq!(sorted(bt.targets()), peers_of(&pings), "the round's end replaces them");
}

#[test]
fn a_new_set_without_old_targets_publishes_the_new_responders_early() {
    let mut rng = rng::from_seed(10);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    drive_round(&mut bt, &mut rng, t(0), all_ok);
    bt.take_changed();
    bt.set_designated(set_of(20..30, t(10)), t(10));
    assert!(bt.targets().is_empty() && bt.take_changed());
    bt.handle_timeout(t(10), &mut rng);
    let pings = drain(&mut bt);
    bt.ping_answered(pings[2].token, &pings[2].peer, true, t(10) + ms(5));
    assert_eq!(bt.targets(), [pings[2].peer.clone()]);
}

#[test]
fn the_epoch_guard_ignores_answers_of_a_round_for_an_older_set() {
    let mut rng = rng::from_seed(11);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let old = drain(&mut bt);
    // A new set arrives while the old round's pings are out; it still holds all old peers.
    assert!(bt.set_designated(set_of(0..11, t(0)), Instant::from_millis(300)));
    for ping in &old {
        assert!(!bt.ping_answered(ping.token, &ping.peer, true, Instant::from_millis(400)));
    }
    assert!(bt.targets().is_empty() && !bt.take_changed(), "not published");
    assert_eq!(bt.current_round(), None, "the old round is abandoned");
    bt.handle_timeout(Instant::from_millis(400), &mut rng);
    let new = drain(&mut bt);
    assert_eq!((new[0].token.epoch(), new[0].token.round()), (2, 2));
    // The race again with the new round running: still ignored.
    for ping in &old {
        assert!(!bt.ping_answered(ping.token, &ping.peer, true, Instant::from_millis(500)));
    }
    assert!(bt.targets().is_empty());
    assert!(bt.ping_answered(new[0].token, &new[0].peer, true, Instant::from_millis(600)));
    assert_eq!(bt.targets(), [new[0].peer.clone()]);
}

#[test]
fn a_set_with_the_same_peers_is_no_change() {
    let mut rng = rng::from_seed(12);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let pings = drain(&mut bt);
    let mut again = set_of(0..10, t(7));
    again.reverse();
    assert!(!bt.set_designated(again, Instant::from_millis(500)));
    assert_eq!((bt.epoch(), bt.current_round()), (1, Some(pings[0].token)));
    assert!(bt.designated().all(|(_, seen)| seen == t(7)), "contacts updated");
    assert!(bt.ping_answered(pings[0].token, &pings[0].peer, true, Instant::from_millis(600)));
    assert!(!bt.set_designated(set_of(0..10, t(1)), Instant::from_millis(700)));
    assert!(bt.designated().all(|(_, seen)| seen == t(7)), "a contact never moves back");
}

#[test]
fn late_repeated_and_unknown_answers_are_ignored() {
    let mut rng = rng::from_seed(13);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    let (_, first) = drive_round(&mut bt, &mut rng, t(0), all_ok);
    let published = bt.targets().to_vec();
    bt.take_changed();
    bt.handle_timeout(t(60), &mut rng);
    let second = drain(&mut bt);
    assert_eq!(second[0].token.round(), 2);
    assert!(!bt.ping_answered(first[0].token, &first[0].peer, false, t(60)), "older round");
    assert!(bt.ping_answered(second[0].token, &second[0].peer, false, t(60)));
    assert!(!bt.ping_answered(second[0].token, &second[0].peer, true, t(60)), "repeated");
    let replacement = drain(&mut bt);
    let pinged: BTreeSet<String> =
        peers_of(&second).union(&peers_of(&replacement)).cloned().collect();
    let unpinged = bt.designated().map(|(k, _)| k.clone()).find(|k| !pinged.contains(k)).unwrap();
    assert!(!bt.ping_answered(second[0].token, &unpinged, true, t(60)), "never pinged");
    assert!(!bt.ping_answered(second[0].token, &p(99), true, t(60)), "not designated");
    assert_eq!(bt.targets(), published);
    assert!(!bt.take_changed());
}

#[test]
fn records_older_than_stale_after_are_not_pinged() {
    let mut rng = rng::from_seed(14);
    let mut bt = machine(Config::default());
    let records = vec![(p(0), t(0)), (p(1), t(1)), (p(2), t(1801)), (p(3), t(5000))];
    bt.set_designated(records, t(1801));
    bt.handle_timeout(t(1801), &mut rng);
    let pings = drain(&mut bt);
    let expected = [p(1), p(2), p(3)].into_iter().collect();
    assert_eq!(peers_of(&pings), expected, "1801 s is stale, 1800 s is not, a later one is fresh");
    for ping in &pings {
        bt.ping_answered(ping.token, &ping.peer, true, t(1801));
    }
    assert!(bt.refresh_contact(&p(0), t(1850)));
    assert!(!bt.refresh_contact(&p(9), t(1850)));
    bt.handle_timeout(t(1861), &mut rng);
    assert!(peers_of(&drain(&mut bt)).contains(&p(0)), "a refreshed record is pinged again");
}

#[test]
fn stale_after_is_configurable() {
    let mut rng = rng::from_seed(15);
    let config = Config { stale_after: Duration::from_secs(10), ..Config::default() };
    let mut bt = machine(config);
    bt.set_designated(vec![(p(0), t(0)), (p(1), t(5))], t(11));
    bt.handle_timeout(t(11), &mut rng);
    assert_eq!(peers_of(&drain(&mut bt)), [p(1)].into_iter().collect());
}

#[test]
fn a_round_with_no_fresh_record_ends_at_once_and_publishes_nobody() {
    let mut rng = rng::from_seed(16);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    drive_round(&mut bt, &mut rng, t(0), all_ok);
    bt.handle_timeout(t(3600), &mut rng);
    assert!(drain(&mut bt).is_empty());
    assert_eq!(bt.last_completed().map(RoundToken::round), Some(2));
    assert!(bt.targets().is_empty(), "nobody verified: no targets");
    assert_eq!(bt.poll_timeout(), Some(t(3660)));
}

#[test]
fn ping_interval_spaces_the_rounds() {
    let mut rng = rng::from_seed(17);
    let config = Config { ping_interval: Duration::from_secs(10), ..Config::default() };
    let mut bt = machine(config);
    bt.set_designated(set_of(0..10, t(0)), t(5));
    drive_round(&mut bt, &mut rng, t(5), all_ok);
    assert_eq!(bt.poll_timeout(), Some(t(15)));
    bt.handle_timeout(t(14), &mut rng);
    assert!(drain(&mut bt).is_empty(), "not before the interval");
    bt.handle_timeout(t(15), &mut rng);
    assert_eq!(drain(&mut bt).len(), 5);
    assert_eq!(bt.current_round().map(RoundToken::round), Some(2));
}

#[test]
fn ping_timeout_sets_the_deadline_the_machine_enforces() {
    let mut rng = rng::from_seed(18);
    let config = Config { ping_timeout: ms(250), ..Config::default() };
    let mut bt = machine(config);
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    let pings = drain(&mut bt);
    assert!(pings.iter().all(|ping| ping.deadline == Instant::from_millis(250)));
    bt.handle_timeout(Instant::from_millis(250), &mut rng);
    let next = drain(&mut bt);
    assert_eq!(next.len(), 5, "all five timed out and were replaced");
    assert!(next.iter().all(|ping| ping.deadline == Instant::from_millis(500)));
}

#[test]
fn keep_bounds_the_pings_in_flight_and_the_targets() {
    let mut rng = rng::from_seed(19);
    let mut bt = machine(Config { keep: 2, ..Config::default() });
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    assert_eq!((drain(&mut bt).len(), bt.in_flight()), (2, 2));
    let mut bt = machine(Config { keep: 2, ..Config::default() });
    bt.set_designated(set_of(0..10, t(0)), t(0));
    let (_, sent) = drive_round(&mut bt, &mut rng, t(0), all_ok);
    assert_eq!((sent.len(), bt.targets().len()), (2, 2));
}

#[test]
fn a_round_longer_than_the_interval_delays_the_next_until_it_ends() {
    let mut rng = rng::from_seed(20);
    let config = Config { keep: 1, ping_interval: Duration::from_secs(2), ..Config::default() };
    let mut bt = machine(config);
    bt.set_designated(set_of(0..10, t(0)), t(0));
    bt.handle_timeout(t(0), &mut rng);
    for second in 1..10 {
        drain(&mut bt);
        assert_eq!(bt.poll_timeout(), Some(t(second)), "the next ping's deadline, not a round");
        bt.handle_timeout(t(second), &mut rng);
        assert_eq!(bt.current_round().map(RoundToken::round), Some(1));
    }
    drain(&mut bt);
    bt.handle_timeout(t(10), &mut rng);
    assert_eq!(bt.last_completed().map(RoundToken::round), Some(1));
    assert_eq!(bt.current_round().map(RoundToken::round), Some(2), "overdue: starts at once");
    assert_eq!(bt.poll_timeout(), Some(t(11)));
}

#[test]
fn time_going_backwards_never_panics_nor_moves_state_back() {
    let mut rng = rng::from_seed(21);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(100)), t(100));
    bt.handle_timeout(t(100), &mut rng);
    let pings = drain(&mut bt);
    bt.handle_timeout(t(50), &mut rng);
    assert!(drain(&mut bt).is_empty());
    assert_eq!((bt.in_flight(), bt.poll_timeout()), (5, Some(t(101))));
    assert!(bt.ping_answered(pings[0].token, &pings[0].peer, false, t(20)));
    let next = drain(&mut bt);
    assert_eq!(next[0].deadline, t(101), "the replacement's deadline is from the latest now");
    assert!(bt.forget(&pings[1].peer, t(10)));
    assert_eq!(drain(&mut bt)[0].deadline, t(101));
    assert!(bt.set_designated(set_of(0..3, t(0)), t(10)));
    assert_eq!(bt.poll_timeout(), Some(t(100)), "due at the latest now, not earlier");
    assert!(bt.refresh_contact(&p(0), t(0)));
    assert_eq!(bt.designated().next(), Some((&p(0), t(100))), "contact not moved back");
    bt.handle_timeout(t(1), &mut rng);
    assert!(drain(&mut bt).iter().all(|ping| ping.deadline == t(101)));
}

#[test]
fn forget_removes_a_peer_from_the_targets_and_replaces_its_ping() {
    let mut rng = rng::from_seed(22);
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..10, t(0)), t(0));
    drive_round(&mut bt, &mut rng, t(0), all_ok);
    let gone = bt.targets()[2].clone();
    bt.take_changed();
    assert!(bt.forget(&gone, t(1)));
    assert!(!bt.forget(&gone, t(1)));
    assert!(!bt.targets().contains(&gone) && bt.take_changed());
    assert_eq!((bt.targets().len(), bt.epoch()), (4, 1), "no new epoch");
    bt.handle_timeout(t(60), &mut rng);
    let pings = drain(&mut bt);
    assert!(bt.forget(&pings[0].peer, t(60)));
    let next = drain(&mut bt);
    assert_eq!(next.len(), 1, "its ping is replaced");
    assert!(!bt.ping_answered(pings[0].token, &pings[0].peer, true, t(60)));
    assert_eq!(bt.in_flight(), 5);
}

#[test]
fn forgetting_every_designated_peer_leaves_nothing_due() {
    let mut bt = machine(Config::default());
    bt.set_designated(set_of(0..2, t(0)), t(0));
    bt.forget(&p(0), t(0));
    assert_eq!(bt.poll_timeout(), Some(t(0)));
    bt.forget(&p(1), t(0));
    assert_eq!(bt.poll_timeout(), None);
    assert!(!bt.set_designated(Vec::new(), t(1)), "empty before and after: no change");
    assert_eq!(bt.epoch(), 1);
}

#[test]
fn only_the_first_designated_max_entries_are_held() {
    let mut bt = machine(Config::default());
    let mut set: Vec<(String, Instant)> =
        (0..DESIGNATED_MAX + 50).map(|i| (format!("q{i:03}"), t(1))).collect();
    set.insert(1, ("q000".to_string(), t(9))); // a duplicate counts as an entry
    bt.set_designated(set, t(10));
    let held: Vec<String> = bt.designated().map(|(k, _)| k.clone()).collect();
    let expected: Vec<String> = (0..DESIGNATED_MAX - 1).map(|i| format!("q{i:03}")).collect();
    assert_eq!(held, expected);
    assert_eq!(bt.designated().next(), Some((&"q000".to_string(), t(9))), "latest contact");
}

#[test]
fn the_same_seed_pings_in_the_same_order_and_other_seeds_differ() {
    let order = |seed: u64| {
        let mut bt = machine(Config::default());
        bt.set_designated(set_of(0..20, t(0)), t(0));
        bt.handle_timeout(t(0), &mut rng::from_seed(seed));
        drain(&mut bt).into_iter().map(|ping| ping.peer).collect::<Vec<_>>()
    };
    assert_eq!(order(5), order(5));
    let orders: BTreeSet<Vec<String>> = (0..8).map(order).collect();
    assert!(orders.len() > 1);
}

// Model-based test: random interleavings of designations, answers, forgets, refreshes and time
// steps, against a reference of what must be in flight and what a finished round publishes.

#[derive(Clone, Debug)]
enum Op {
    /// Designate these peers, each last seen this many seconds ago.
    Designate(Vec<(u8, u16)>),
    /// Answer an outstanding ping (live peers ok, dead ones with an error).
    Answer(u8),
    /// Answer a ping already resolved, abandoned or timed out again.
    Replay {
        pick: u8,
        ok: bool,
    },
    Forget(u8),
    Refresh(u8),
    /// Advance time by this many ms; live peers answer every ping due meanwhile.
    Step(u16),
    /// Move `now` back by this many ms.
    Back(u16),
    /// Jump to the next deadline.
    Timeout,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        1 => prop::collection::vec((0u8..12, 0u16..600), 0..10).prop_map(Op::Designate),
        3 => any::<u8>().prop_map(Op::Answer),
        1 => any::<(u8, bool)>().prop_map(|(pick, ok)| Op::Replay { pick, ok }),
        1 => (0u8..12).prop_map(Op::Forget),
        1 => (0u8..12).prop_map(Op::Refresh),
        2 => (0u16..3000).prop_map(Op::Step),
        1 => (0u16..2000).prop_map(Op::Back),
        2 => Just(Op::Timeout),
    ]
}

const MODEL_STALE_AFTER: Duration = Duration::from_secs(300);

struct Model {
    bt: BroadcastTargets<u8>,
    rng: rng::Rng,
    keep: usize,
    alive: u16,
    now: Instant,
    clock: Instant,
    designated: BTreeMap<u8, Instant>,
    /// Pings the machine has in flight, as the network holds them.
    outstanding: Vec<Ping<u8>>,
    /// Pings answered, abandoned or timed out: answering them again must change nothing.
    resolved: Vec<Ping<u8>>,
    /// Per round: the fresh designated peers at its start, and who answered it ok.
    fresh: BTreeMap<u64, BTreeSet<u8>>,
    responders: BTreeMap<u64, BTreeSet<u8>>,
    /// Targets published when the running round started (or carried over since).
    base: BTreeSet<u8>,
    seen_round: u64,
    last_completed: Option<RoundToken>,
    last_targets: Vec<u8>,
}

impl Model {
    fn is_alive(&self, peer: u8) -> bool {
        self.alive & (1 << peer) != 0
    }

    fn answer(&mut self, ping: &Ping<u8>, ok: bool, now: Instant) {
        assert!(self.bt.ping_answered(ping.token, &ping.peer, ok, now), "{ping:?} is in flight");
        self.clock = self.clock.max(now);
        self.outstanding.retain(|o| o != ping);
        self.resolved.push(ping.clone());
        if ok {
            self.responders.entry(ping.token.round()).or_default().insert(ping.peer);
        }
    }

    /// Live peers answer every ping due by `until`, then time moves there.
    fn advance(&mut self, until: Instant) {
        for _ in 0..100 {
            let due: Vec<Ping<u8>> = self
                .outstanding
                .iter()
                .filter(|o| self.is_alive(o.peer) && o.deadline <= until)
                .cloned()
                .collect();
            if due.is_empty() {
                break;
            }
            for ping in due {
                self.answer(&ping, true, self.now);
            }
            self.settle();
        }
        self.now = self.now.max(until);
        self.handle_timeout();
    }

    fn handle_timeout(&mut self) {
        let targets = self.bt.targets().to_vec();
        let round = self.bt.current_round();
        let nothing_due = self.bt.poll_timeout().is_none_or(|at| at > self.clock);
        self.bt.handle_timeout(self.now, &mut self.rng);
        if self.now <= self.clock && nothing_due {
            assert_eq!((self.bt.targets(), self.bt.current_round()), (&targets[..], round));
        }
        self.clock = self.clock.max(self.now);
        assert!(self.bt.poll_timeout().is_none_or(|at| at > self.clock), "no busy loop");
        let latest = [self.bt.current_round(), self.bt.last_completed()]
            .into_iter()
            .flatten()
            .map(RoundToken::round)
            .max()
            .unwrap_or(0);
        if latest > self.seen_round {
            assert_eq!(latest, self.seen_round + 1, "one round started per call");
            self.seen_round = latest;
            let clock = self.clock;
            let fresh = self
                .designated
                .iter()
                .filter(|(_, seen)| clock.saturating_duration_since(**seen) <= MODEL_STALE_AFTER)
                .map(|(peer, _)| *peer)
                .collect();
            self.fresh.insert(latest, fresh);
            if self.bt.current_round().is_some() {
                self.base = self.bt.targets().iter().copied().collect();
            }
        }
    }

    /// Drains new pings and files those the machine no longer has in flight as resolved.
    fn settle(&mut self) {
        while let Some(ping) = self.bt.poll_ping() {
            assert!(self.fresh[&ping.token.round()].contains(&ping.peer), "only fresh peers");
            assert!(ping.deadline > self.clock);
            self.outstanding.push(ping);
        }
        let current = self.bt.current_round();
        let clock = self.clock;
        let (live, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut self.outstanding)
            .into_iter()
            .partition(|o| Some(o.token) == current && o.deadline > clock);
        self.outstanding = live;
        self.resolved.extend(gone);
        assert_eq!(self.bt.in_flight(), self.outstanding.len());
    }

    fn step(&mut self, op: Op) {
        match op {
            Op::Designate(entries) => {
                let set: Vec<(u8, Instant)> = entries
                    .into_iter()
                    .map(|(peer, age)| {
                        let age = Duration::from_secs(u64::from(age)).as_nanos() as u64;
                        (peer, Instant::from_nanos(self.now.as_nanos().saturating_sub(age)))
                    })
                    .collect();
                let mut next: BTreeMap<u8, Instant> = BTreeMap::new();
                for (peer, seen) in &set {
                    let at = next.entry(*peer).or_insert(*seen);
                    *at = (*at).max(*seen);
                    if let Some(old) = self.designated.get(peer) {
                        *at = (*at).max(*old);
                    }
                }
                let changed = !next.keys().eq(self.designated.keys());
                let (epoch, targets) = (self.bt.epoch(), self.bt.targets().to_vec());
                assert_eq!(self.bt.set_designated(set, self.now), changed);
                self.clock = self.clock.max(self.now);
                self.designated = next;
                if changed {
                    assert_eq!(self.bt.epoch(), epoch + 1);
                    let kept: Vec<u8> =
                        targets.into_iter().filter(|k| self.designated.contains_key(k)).collect();
                    assert_eq!(self.bt.targets(), kept);
                    let due = (!self.designated.is_empty()).then_some(self.clock);
                    assert_eq!(self.bt.poll_timeout(), due, "a new set is due at once");
                    self.base = kept.into_iter().collect();
                }
            }
            Op::Answer(pick) => {
                if !self.outstanding.is_empty() {
                    let ping = self.outstanding[usize::from(pick) % self.outstanding.len()].clone();
                    let ok = self.is_alive(ping.peer);
                    self.answer(&ping, ok, self.now);
                }
            }
            Op::Replay { pick, ok } => {
                if !self.resolved.is_empty() && self.now <= self.clock {
                    let ping = &self.resolved[usize::from(pick) % self.resolved.len()];
                    let before = (self.bt.targets().to_vec(), self.bt.in_flight());
                    assert!(!self.bt.ping_answered(ping.token, &ping.peer, ok, self.now));
                    assert_eq!((self.bt.targets().to_vec(), self.bt.in_flight()), before);
                }
            }
            Op::Forget(peer) => {
                let was = self.designated.remove(&peer).is_some();
                assert_eq!(self.bt.forget(&peer, self.now), was);
                self.clock = self.clock.max(self.now);
                assert!(!self.bt.targets().contains(&peer));
                for responders in self.responders.values_mut() {
                    responders.remove(&peer);
                }
                self.base.remove(&peer);
                let (gone, live): (Vec<_>, Vec<_>) =
                    std::mem::take(&mut self.outstanding).into_iter().partition(|o| o.peer == peer);
                self.outstanding = live;
                self.resolved.extend(gone);
            }
            Op::Refresh(peer) => {
                let known = self.designated.get_mut(&peer);
                let was = known.is_some();
                if let Some(seen) = known {
                    *seen = (*seen).max(self.now);
                }
                assert_eq!(self.bt.refresh_contact(&peer, self.now), was);
            }
            Op::Step(d) => self.advance(self.now + ms(u64::from(d))),
            Op::Back(d) => {
                let back = ms(u64::from(d)).as_nanos() as u64;
                self.now = Instant::from_nanos(self.now.as_nanos().saturating_sub(back));
                self.handle_timeout();
            }
            Op::Timeout => {
                let at = self.bt.poll_timeout().unwrap_or(self.now).max(self.now);
                self.advance(at);
            }
        }
        self.settle();
        self.check();
    }

    fn check(&mut self) {
        self.bt.check_invariants();
        let targets = self.bt.targets().to_vec();
        let as_set: BTreeSet<u8> = targets.iter().copied().collect();
        assert!(targets.len() <= self.keep);
        assert!(as_set.iter().all(|k| self.designated.contains_key(k)));
        assert!(self.bt.in_flight() <= self.keep);
        if targets != self.last_targets {
            assert!(self.bt.take_changed(), "a change is flagged");
        }
        self.bt.take_changed();
        self.last_targets = targets;
        if self.bt.last_completed() != self.last_completed {
            let done = self.bt.last_completed().expect("rounds only complete");
            self.last_completed = Some(done);
            let responders = self.responders.get(&done.round()).cloned().unwrap_or_default();
            assert_eq!(as_set, responders, "a finished round publishes exactly its responders");
            let live = self.fresh[&done.round()]
                .iter()
                .filter(|k| self.is_alive(**k) && self.designated.contains_key(*k))
                .count();
            assert_eq!(as_set.len(), self.keep.min(live), "keep targets when keep are alive");
        }
        if let Some(round) = self.bt.current_round() {
            let responders = self.responders.get(&round.round()).cloned().unwrap_or_default();
            assert!(as_set.is_subset(&self.base) || as_set == responders, "carried or early");
        }
    }
}

fn run_model(keep: usize, alive: u16, seed: u64, ops: Vec<Op>) {
    let config = Config { keep, stale_after: MODEL_STALE_AFTER, ..Config::default() };
    let mut model = Model {
        bt: BroadcastTargets::new(config).unwrap(),
        rng: rng::from_seed(seed),
        keep,
        alive,
        now: t(1000),
        clock: Instant::ZERO,
        designated: BTreeMap::new(),
        outstanding: Vec::new(),
        resolved: Vec::new(),
        fresh: BTreeMap::new(),
        responders: BTreeMap::new(),
        base: BTreeSet::new(),
        seen_round: 0,
        last_completed: None,
        last_targets: Vec::new(),
    };
    for op in ops {
        model.step(op);
    }
}

proptest! {
    #[test]
    fn random_interleavings_keep_the_invariants_and_publish_keep_when_keep_are_alive(
        keep in 1usize..7,
        alive in any::<u16>(),
        seed in any::<u64>(),
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run_model(keep, alive, seed, ops);
    }
}
