use super::*;
use crate::codec::roster::{decode_roster, encode_roster};
use proptest::prelude::*;

const INTERVAL: Duration = Duration::from_secs(5);
const FORGET: Duration = Duration::from_secs(60);

fn t(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

fn dir(id: &str, addr: &str, seeds: &[&str], now: Instant) -> Directory {
    let seeds = Seeds::Static(seeds.iter().map(|s| s.to_string()).collect());
    let timing = Timing { interval: INTERVAL, forget_after: FORGET };
    Directory::new(Member::ready(id, addr), seeds, timing, now)
}

/// The roster `id` at `addr` would answer with the given view of members (`(id, addr)`).
fn roster(responder: &str, members: &[(&str, &str)], dialed: &str) -> (Roster, Option<String>) {
    let view = View::new(members.iter().map(|(i, a)| Member::ready(i, a)).collect());
    let me = view.get(responder).cloned().unwrap_or_else(|| Member::ready(responder, dialed));
    let body = encode_roster(&view, &me);
    (
        decode_roster(body.as_bytes(), Some(responder), dialed).expect("decodes"),
        Some(responder.into()),
    )
}

fn ids(d: &Directory) -> Vec<String> {
    d.view().members().iter().map(|m| m.id.clone()).collect()
}

fn asked(start: Start) -> Vec<String> {
    match start {
        Start::Ask(a) => a,
        Start::Resolve { .. } => panic!("static seeds ask at once"),
    }
}

#[test]
fn the_first_round_is_due_at_start_and_asks_the_seeds_but_not_ourselves() {
    let mut d = dir("a", "h1:9000", &["h1:9000", "h2:9000", "h3:9000"], t(0));
    assert_eq!(d.take_view().map(|v| v.members().len()), Some(1), "self from the start");
    assert_eq!(d.poll_timeout(), Some(t(0)));
    assert_eq!(asked(d.start_round(t(0))), ["h2:9000", "h3:9000"]);
    assert_eq!(d.poll_timeout(), None, "no round while one is in flight");
    d.check_invariants();
}

#[test]
fn a_responder_is_credited_by_its_own_id_and_the_members_it_names_are_asked_not_learned() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    asked(d.start_round(t(0)));
    let answer = roster("b", &[("b", "h2:9000"), ("c", "h3:9000"), ("a", "h1:9000")], "h2:9000");
    let got = d.answered("h2:9000", Ok(answer), t(10));
    assert_eq!(got.ask, ["h3:9000"], "hearsay is asked in the same round");
    assert_eq!(d.view().members().len(), 1, "nothing published mid-round");
    let c = roster("c", &[("c", "h3:9000")], "h3:9000");
    assert!(d.answered("h3:9000", Ok(c), t(20)).ask.is_empty());
    assert_eq!(ids(&d), ["a", "b", "c"], "both met directly; published at the round's end");
    assert_eq!(d.poll_timeout(), Some(t(0) + QUICK_ROUND), "a view far from whole: quick");
    d.check_invariants();
}

/// One round of `d` at `at` in which every address asked answers with the members `know` (id,
/// address) names for it; returns when the next round is due.
fn round_where(
    d: &mut Directory,
    at: Instant,
    know: &dyn Fn(&str) -> Vec<(String, String)>,
) -> Instant {
    let mut queue = asked(d.start_round(at));
    while let Some(addr) = queue.pop() {
        let members = know(&addr);
        let (id, _) = members.iter().find(|(_, a)| *a == addr).cloned().expect("the responder");
        let refs: Vec<(&str, &str)> =
            members.iter().map(|(i, a)| (i.as_str(), a.as_str())).collect();
        queue.extend(d.answered(&addr, Ok(roster(&id, &refs, &addr)), at).ask);
    }
    d.poll_timeout().expect("the next round is due")
}

#[test]
fn a_view_far_from_whole_is_refreshed_sooner_doubling_up_to_the_interval() {
    // A boot: each round meets as many members again as the view held (the responders name one
    // more member each round), so the rounds come 25, 50, 100, 200, 400, 800, 1,600 and 3,200 ms
    // apart, then at the interval however much they find (eight quick rounds in a row at most).
    let mut d = dir("a", "h0:9000", &["h1:9000"], t(0));
    let known = std::cell::Cell::new(2usize);
    let know = |_: &str| -> Vec<(String, String)> {
        (1..known.get()).map(|i| (format!("m{i}"), format!("h{i}:9000"))).collect()
    };
    let mut at = t(0);
    let mut gaps = Vec::new();
    for _ in 0..10 {
        let next = round_where(&mut d, at, &know);
        gaps.push(next.saturating_duration_since(at).as_millis() as u64);
        at = next;
        known.set(known.get() * 2);
        d.check_invariants();
    }
    assert_eq!(gaps, [25, 50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
    assert_eq!(d.view().members().len(), 1024, "every member met was placed");
    // A settled view that meets one new member (1,024 -> 1,025) keeps the interval and ends the run
    // of quick rounds: the next boot of a part of the cluster starts quick again.
    known.set(1025);
    let next = round_where(&mut d, at, &know);
    assert_eq!(next, at + INTERVAL, "one joiner in a settled view: no quick round");
    at = next;
    known.set(1600);
    let next = round_where(&mut d, at, &know);
    assert_eq!(next, at + QUICK_ROUND, "half a cluster met at once: quick again");
    d.check_invariants();
}

#[test]
fn a_caller_met_between_rounds_counts_toward_a_quick_round() {
    // Found on real nodes: the seed was not up yet (its fetch failed), and the member that
    // called meanwhile joined the view at the round's start, not its end.
    let mut d = dir("a", "h0:9000", &["h1:9000"], t(0));
    assert!(d.caller("b", "h2:9000", t(0)));
    assert_eq!(asked(d.start_round(t(0))), ["h1:9000", "h2:9000"]);
    assert_eq!(ids(&d), ["a", "b"], "the caller joined at the round's start");
    d.answered("h1:9000", Err("connection refused".into()), t(1));
    d.answered("h2:9000", Ok(roster("b", &[("b", "h2:9000")], "h2:9000")), t(2));
    assert_eq!(d.poll_timeout(), Some(t(0) + QUICK_ROUND), "the view doubled since the last round");
}

#[test]
fn a_node_whose_seeds_did_not_answer_asks_again_soon_eight_times_then_at_the_interval() {
    // Found on real nodes: a node up before its seed asked it once, then waited an interval.
    let mut d = dir("a", "h0:9000", &["h1:9000"], t(0));
    let mut at = t(0);
    let mut gaps = Vec::new();
    for _ in 0..10 {
        asked(d.start_round(at));
        d.answered("h1:9000", Err("connection refused".into()), at);
        let next = d.poll_timeout().expect("due");
        gaps.push(next.saturating_duration_since(at).as_millis() as u64);
        at = next;
    }
    assert_eq!(gaps, [25, 50, 100, 200, 400, 800, 1600, 3200, 5000, 5000]);
}

#[test]
fn a_round_that_meets_nobody_new_keeps_the_interval() {
    let mut d = dir("a", "h0:9000", &["h1:9000"], t(0));
    let know = |_: &str| vec![("b".to_owned(), "h1:9000".to_owned())];
    assert_eq!(round_where(&mut d, t(0), &know), t(0) + QUICK_ROUND);
    let at = t(0) + QUICK_ROUND;
    assert_eq!(round_where(&mut d, at, &know), at + INTERVAL);
}

#[test]
fn hearsay_alone_never_makes_a_member() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    asked(d.start_round(t(0)));
    let answer = roster("b", &[("b", "h2:9000"), ("dead", "h9:9000")], "h2:9000");
    assert_eq!(d.answered("h2:9000", Ok(answer), t(10)).ask, ["h9:9000"]);
    d.answered("h9:9000", Err("connection refused".into()), t(20));
    assert_eq!(ids(&d), ["a", "b"], "a member nobody reached is not placed on");
}

#[test]
fn a_dead_member_leaves_although_the_survivors_keep_naming_it() {
    // b and c both still list the dead d; only a roster answer from d (or a call from it) counts.
    let mut d = dir("a", "h1:9000", &["h2:9000", "h3:9000", "h4:9000"], t(0));
    let mut now = t(0);
    let full = [("b", "h2:9000"), ("c", "h3:9000"), ("d", "h4:9000")];
    for addr in asked(d.start_round(now)) {
        let id = full.iter().find(|(_, a)| *a == addr).expect("seed").0;
        d.answered(&addr, Ok(roster(id, &full, &addr)), now);
    }
    assert_eq!(ids(&d), ["a", "b", "c", "d"]);
    let died = now;
    let mut gone_at = None;
    while now < died + FORGET + INTERVAL * 3 {
        now = d.poll_timeout().expect("idle between rounds");
        for addr in asked(d.start_round(now)) {
            let result = match full.iter().find(|(_, a)| *a == addr).map(|m| m.0) {
                Some("d") => Err("connection refused".to_owned()),
                Some(id) => Ok(roster(id, &full, &addr)),
                None => panic!("asked {addr}"),
            };
            d.answered(&addr, result, now + Duration::from_millis(5));
        }
        if gone_at.is_none() && d.view().get("d").is_none() {
            gone_at = Some(now);
        }
        d.check_invariants();
    }
    let gone_at = gone_at.expect("d was forgotten");
    assert!(gone_at >= died + FORGET && gone_at <= died + FORGET + INTERVAL, "{gone_at}");
    assert_eq!(ids(&d), ["a", "b", "c"]);
    assert_eq!(d.stats().forgotten, 1);
}

#[test]
fn a_reused_address_credits_its_new_owner_and_never_the_dead_member_recorded_there() {
    let mut d = dir("a", "h1:9000", &["10.0.0.7:9000"], t(0));
    asked(d.start_round(t(0)));
    d.answered(
        "10.0.0.7:9000",
        Ok(roster("old", &[("old", "10.0.0.7:9000")], "10.0.0.7:9000")),
        t(0),
    );
    assert_eq!(ids(&d), ["a", "old"]);
    // `old` died; its pod IP went to `new`, which answers at the same address.
    let now = d.poll_timeout().expect("next round");
    assert_eq!(asked(d.start_round(now)), ["10.0.0.7:9000"]);
    d.answered(
        "10.0.0.7:9000",
        Ok(roster("new", &[("new", "10.0.0.7:9000")], "10.0.0.7:9000")),
        now,
    );
    assert_eq!(ids(&d), ["a", "new"], "the record at that address was stale");
    assert_eq!(d.stats().displaced, 1);
    d.check_invariants();
}

#[test]
fn an_anonymous_responder_credits_nobody() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    asked(d.start_round(t(0)));
    let (r, _) = roster("b", &[("b", "h2:9000")], "h2:9000");
    let got = d.answered("h2:9000", Ok((r, None)), t(1));
    assert!(got.ask.is_empty(), "b's address is the one dialed");
    assert_eq!(ids(&d), ["a"]);
}

#[test]
fn an_inbound_caller_that_names_itself_is_met_and_an_anonymous_or_invalid_one_is_not() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    assert!(d.caller("z", "10.1.0.5:9000", t(0)));
    assert!(!d.caller("bad id", "10.1.0.6:9000", t(0)));
    assert!(!d.caller("y", "0.0.0.0", t(0)), "not host:port");
    assert!(!d.caller("a", "h7:9000", t(0)), "our own id from elsewhere");
    assert_eq!(d.stats().self_conflicts, 1);
    asked(d.start_round(t(0)));
    d.answered("h2:9000", Err("refused".into()), t(1));
    assert_eq!(ids(&d), ["a", "z"], "a first node with no reachable seed learns its callers");
    assert_eq!(d.view().get("z").map(|m| m.addr.as_str()), Some("10.1.0.5:9000"));
}

#[test]
fn a_member_that_moved_is_found_at_its_new_address() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    asked(d.start_round(t(0)));
    d.answered("h2:9000", Ok(roster("b", &[("b", "h2:9000")], "h2:9000")), t(0));
    // b restarts with a new address and calls us.
    assert!(d.caller("b", "h5:9000", t(100)));
    let now = d.poll_timeout().expect("next");
    let mut ask = asked(d.start_round(now));
    ask.sort();
    assert_eq!(ask, ["h2:9000", "h5:9000"], "the seed and b's new address");
    d.answered("h2:9000", Err("refused".into()), now);
    d.answered("h5:9000", Ok(roster("b", &[("b", "h5:9000")], "h5:9000")), now);
    assert_eq!(d.view().get("b").map(|m| m.addr.as_str()), Some("h5:9000"));
}

#[test]
fn invalid_roster_ids_are_dropped_and_reported_while_their_siblings_are_asked() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    asked(d.start_round(t(0)));
    let body = r#"{"epoch":"1","members":[{"id":"b","addr":"h2:9000"},{"id":"x y","addr":"h8:9000"},{"id":"c","addr":"h3:9000"}]}"#;
    let r = decode_roster(body.as_bytes(), Some("b"), "h2:9000").expect("decodes");
    let got = d.answered("h2:9000", Ok((r, Some("b".into()))), t(1));
    assert_eq!(got.invalid.len(), 1);
    assert_eq!(got.ask, ["h3:9000"]);
}

#[test]
fn dns_seeds_are_resolved_every_round_and_a_failure_keeps_the_known_ones() {
    let seeds = Seeds::Dns { name: "dart.ns.svc".into(), port: 9000 };
    let mut d = Directory::new(Member::ready("a", "10.0.0.1:9000"), seeds, Timing::default(), t(0));
    assert_eq!(d.start_round(t(0)), Start::Resolve { name: "dart.ns.svc".into(), port: 9000 });
    assert_eq!(d.poll_timeout(), Some(t(0) + RESOLVE_BOUND), "resolving, with a bound");
    let ask = d.seeds_resolved(Ok(vec!["10.0.0.1:9000".into(), "10.0.0.2:9000".into()]), t(1));
    assert_eq!(ask, ["10.0.0.2:9000"]);
    d.answered("10.0.0.2:9000", Err("refused".into()), t(2));
    let now = d.poll_timeout().expect("next");
    assert!(matches!(d.start_round(now), Start::Resolve { .. }));
    assert_eq!(d.seeds_resolved(Err("SERVFAIL".into()), now), ["10.0.0.2:9000"]);
    assert_eq!(d.stats().resolve_failures, 1);
}

#[test]
fn discovery_errors_are_told_once_a_minute_with_the_count_held_back() {
    let mut d = dir("a", "h1:9000", &["h2:9000"], t(0));
    assert_eq!(d.report_error(t(0)), Some(0));
    assert_eq!(d.report_error(t(1_000)), None);
    assert_eq!(d.report_error(t(59_999)), None);
    assert_eq!(d.report_error(t(60_000)), Some(2));
    assert_eq!(d.report_error(t(60_001)), None);
}

#[test]
fn zero_timings_fall_back_to_the_defaults() {
    let z = Timing { interval: Duration::ZERO, forget_after: Duration::ZERO };
    let d = Directory::new(Member::ready("a", "h:1"), Seeds::Static(vec!["h:2".into()]), z, t(0));
    assert_eq!(d.timing(), Timing::default());
    assert_eq!(Timing::default().interval, Duration::from_secs(5));
    assert_eq!(Timing::default().forget_after, Duration::from_secs(60));
}

#[test]
fn discover_values_parse_or_are_refused_with_the_reason() {
    assert_eq!(
        Seeds::parse("static:a:9000, b:9000"),
        Ok(Seeds::Static(vec!["a:9000".into(), "b:9000".into()]))
    );
    assert_eq!(
        Seeds::parse("a:9000,[::1]:9000"),
        Ok(Seeds::Static(vec!["a:9000".into(), "[::1]:9000".into()]))
    );
    assert_eq!(Seeds::parse("node-0:9000"), Ok(Seeds::Static(vec!["node-0:9000".into()])));
    assert_eq!(
        Seeds::parse("dns:dart.default.svc.cluster.local:9000"),
        Ok(Seeds::Dns { name: "dart.default.svc.cluster.local".into(), port: 9000 })
    );
    assert_eq!(Seeds::parse("static:"), Err(SeedsError::Empty));
    assert_eq!(Seeds::parse(""), Err(SeedsError::Empty));
    assert!(matches!(Seeds::parse("static:a"), Err(SeedsError::Entry(_))));
    assert!(matches!(Seeds::parse("static:a:0"), Err(SeedsError::Entry(_))));
    assert!(matches!(Seeds::parse("static:a:65536"), Err(SeedsError::Entry(_))));
    assert!(matches!(Seeds::parse("a:9000,::1:9000"), Err(SeedsError::Entry(_))));
    assert!(matches!(Seeds::parse("dns:name"), Err(SeedsError::Dns(_))));
    assert!(matches!(Seeds::parse("dns::9000"), Err(SeedsError::Dns(_))));
    assert!(matches!(Seeds::parse("dns:name:+90"), Err(SeedsError::Dns(_))));
    assert_eq!(Seeds::parse("k8s:default/dart"), Err(SeedsError::Scheme("k8s".into())));
}

#[test]
fn an_advertised_address_is_host_port_and_never_a_wildcard() {
    for good in ["10.0.0.5:9000", "127.0.0.1:9000", "[::1]:9000", "node-a.svc:9000"] {
        assert_eq!(check_advertise(good), Ok(()), "{good}");
    }
    for wildcard in [
        ":9000",
        "0.0.0.0:9000",
        "[::]:9000",
        "[0::0]:9000",
        "[::%eth0]:9000",
        "[0:0:0:0:0:0:0:0]:9000",
    ] {
        assert!(
            matches!(
                check_advertise(wildcard),
                Err(AdvertiseError::Wildcard(_)) | Err(AdvertiseError::NotHostPort(_))
            ),
            "{wildcard}"
        );
        assert!(check_advertise(wildcard).is_err());
    }
    assert!(matches!(check_advertise("0.0.0.0:9000"), Err(AdvertiseError::Wildcard(_))));
    assert!(matches!(check_advertise("10.0.0.5"), Err(AdvertiseError::NotHostPort(_))));
    assert!(is_wildcard_host("") && is_wildcard_host("0.0.0.0") && is_wildcard_host("[::]"));
    assert!(!is_wildcard_host("127.0.0.1") && !is_wildcard_host("node-a"));
}

// ---------------------------------------------------------------------------------------------
// The model: processes with ids and addresses, each running a directory; roster requests are
// messages the test delivers, loses, answers from a stale snapshot or repeats, in any order;
// processes die, and new ones start at dead ones' addresses (pod-IP reuse) or move.
// ---------------------------------------------------------------------------------------------

/// How long a roster fetch may stay unanswered before it fails (the node's exchange bounds).
const FETCH_BOUND: Duration = Duration::from_secs(1);
const ADDRS: usize = 6;

#[derive(Clone, Debug)]
enum Op {
    Advance(u64),
    Deliver(usize),
    Lose(usize),
    Stale(usize),
    Repeat(usize),
    Kill(usize),
    /// A new id starts at a free address (a dead process's address, when there is one).
    Start(usize),
    /// A live process restarts under its id at another free address.
    Move(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (1u64..3_000).prop_map(Op::Advance),
        6 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Lose),
        1 => any::<usize>().prop_map(Op::Stale),
        1 => any::<usize>().prop_map(Op::Repeat),
        1 => any::<usize>().prop_map(Op::Kill),
        1 => any::<usize>().prop_map(Op::Start),
        1 => any::<usize>().prop_map(Op::Move),
    ]
}

struct Proc {
    id: String,
    addr: String,
    dir: Directory,
    alive: bool,
    /// The last time anything from it (a request it sent, an answer it gave) was seen.
    last_word: Instant,
    /// Rosters it answered with and their tags, oldest first (the stale answers).
    said: Vec<(Roster, Option<String>, String)>,
}

struct Msg {
    from: usize,
    to: String,
    sent: Instant,
    /// The tag the asker offered (`If-None-Match`): an answer of that same roster is a 304.
    offered: Option<String>,
}

struct Model {
    now: Instant,
    procs: Vec<Proc>,
    msgs: Vec<Msg>,
    next_id: usize,
    longest_round: Duration,
    round_started: BTreeMap<usize, Instant>,
}

fn addr(i: usize) -> String {
    format!("10.0.0.{i}:9000")
}

impl Model {
    fn new(n: usize) -> Self {
        let mut m = Model {
            now: t(0),
            procs: Vec::new(),
            msgs: Vec::new(),
            next_id: 0,
            longest_round: Duration::ZERO,
            round_started: BTreeMap::new(),
        };
        for i in 0..n {
            m.spawn(format!("n{i}"), addr(i));
        }
        m
    }

    fn spawn(&mut self, id: String, at: String) {
        let seeds = Seeds::Static((0..ADDRS).map(addr).collect());
        let timing = Timing { interval: INTERVAL, forget_after: FORGET };
        let dir = Directory::new(Member::ready(&id, &at), seeds, timing, self.now);
        self.next_id += 1;
        let said = Vec::new();
        self.procs.push(Proc { id, addr: at, dir, alive: true, last_word: self.now, said });
    }

    fn live_at(&self, a: &str) -> Option<usize> {
        self.procs.iter().position(|p| p.alive && p.addr == a)
    }

    fn free_addr(&self, pick: usize) -> Option<String> {
        let free: Vec<String> =
            (0..ADDRS).map(addr).filter(|a| self.live_at(a).is_none()).collect();
        (!free.is_empty()).then(|| free[pick % free.len()].clone())
    }

    fn ask(&mut self, from: usize, addrs: Vec<String>) {
        for to in addrs {
            let offered = self.procs[from].dir.tag_for(&to).map(str::to_owned);
            self.msgs.push(Msg { from, to, sent: self.now, offered });
        }
    }

    /// Starts every due round; fails fetches past their bound; a process whose messages all
    /// died with it is done with them.
    fn tick(&mut self) {
        let now = self.now;
        let late: Vec<usize> = (0..self.msgs.len())
            .filter(|&i| now.saturating_duration_since(self.msgs[i].sent) >= FETCH_BOUND)
            .collect();
        for i in late.into_iter().rev() {
            let msg = self.msgs.remove(i);
            self.fail(msg);
        }
        for p in 0..self.procs.len() {
            while self.procs[p].alive && self.procs[p].dir.poll_timeout().is_some_and(|d| d <= now)
            {
                self.round_started.insert(p, now);
                let ask = asked(self.procs[p].dir.start_round(now));
                self.after_answer(p);
                self.ask(p, ask);
            }
        }
    }

    fn after_answer(&mut self, p: usize) {
        if self.procs[p].dir.poll_timeout().is_some() {
            if let Some(started) = self.round_started.remove(&p) {
                self.longest_round =
                    self.longest_round.max(self.now.saturating_duration_since(started));
            }
        }
        self.procs[p].dir.check_invariants();
    }

    fn fail(&mut self, msg: Msg) {
        let p = msg.from;
        if self.procs[p].alive && self.procs[p].dir.is_pending(&msg.to) {
            self.procs[p].dir.answered(&msg.to, Err("timed out".into()), self.now);
            self.after_answer(p);
        }
    }

    /// The server side of a request: the callee learns the caller; the answer is its roster
    /// (or the oldest one it ever gave, when `stale`) and that roster's tag.
    fn serve(&mut self, msg: &Msg, stale: bool) -> Option<(Roster, Option<String>, String)> {
        let callee = self.live_at(&msg.to)?;
        let (caller_id, caller_addr) =
            (self.procs[msg.from].id.clone(), self.procs[msg.from].addr.clone());
        self.procs[msg.from].last_word = self.procs[msg.from].last_word.max(msg.sent);
        let now = self.now;
        let c = &mut self.procs[callee];
        c.dir.caller(&caller_id, &caller_addr, now);
        c.last_word = now;
        let me = Member::ready(&c.id, &c.addr);
        let body = encode_roster(c.dir.view(), &me);
        let mut tag = crate::hash::Fnv1a::default();
        tag.write(body.as_bytes());
        let fresh = (
            decode_roster(body.as_bytes(), Some(&c.id), &msg.to).expect("decodes"),
            Some(c.id.clone()),
            format!("{:016x}", tag.finish()),
        );
        c.said.push(fresh.clone());
        if c.said.len() > 8 {
            c.said.remove(0);
        }
        Some(if stale { c.said[0].clone() } else { fresh })
    }

    fn deliver(&mut self, i: usize, stale: bool, repeat: bool) {
        if self.msgs.is_empty() {
            return;
        }
        let msg = self.msgs.remove(i % self.msgs.len());
        if !self.procs[msg.from].alive {
            // A request a process sent before it died still reaches its callee.
            let _ = self.serve(&msg, stale);
            return;
        }
        let answer = self.serve(&msg, stale);
        if repeat {
            let _ = self.serve(&msg, stale);
        }
        let p = msg.from;
        if !self.procs[p].dir.is_pending(&msg.to) {
            return;
        }
        let now = self.now;
        let dir = &mut self.procs[p].dir;
        let more = match answer {
            // The roster it offered the tag of: a 304, naming the responder.
            Some((_, responder, tag)) if msg.offered.as_ref() == Some(&tag) => {
                dir.unchanged(&msg.to, responder.as_deref(), now)
            }
            Some((roster, responder, tag)) => {
                let more = dir.answered(&msg.to, Ok((roster, responder)), now);
                dir.note_tag(&msg.to, Some(tag));
                more
            }
            None => dir.answered(&msg.to, Err("connection refused".to_owned()), now),
        };
        self.after_answer(p);
        self.ask(p, more.ask);
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Advance(ms) => {
                // Step so that no fetch outlives its bound by more than a millisecond.
                let end = self.now + Duration::from_millis(ms);
                while self.now < end {
                    self.now = (self.now + Duration::from_millis(250)).min(end);
                    self.tick();
                }
            }
            Op::Deliver(i) => self.deliver(i, false, false),
            Op::Lose(i) => {
                if !self.msgs.is_empty() {
                    let msg = self.msgs.remove(i % self.msgs.len());
                    self.fail(msg);
                }
            }
            Op::Stale(i) => self.deliver(i, true, false),
            Op::Repeat(i) => self.deliver(i, false, true),
            Op::Kill(i) => {
                let live: Vec<usize> =
                    (0..self.procs.len()).filter(|&p| self.procs[p].alive).collect();
                if live.len() > 1 {
                    self.procs[live[i % live.len()]].alive = false;
                }
            }
            Op::Start(i) => {
                if let Some(a) = self.free_addr(i) {
                    let id = format!("n{}", self.next_id + ADDRS);
                    self.spawn(id, a);
                }
            }
            Op::Move(i) => {
                let live: Vec<usize> =
                    (0..self.procs.len()).filter(|&p| self.procs[p].alive).collect();
                if let Some(a) = self.free_addr(i) {
                    let p = live[i % live.len()];
                    self.procs[p].alive = false;
                    let id = self.procs[p].id.clone();
                    self.spawn(id, a);
                }
            }
        }
        self.tick();
        self.check_departures();
    }

    /// Every id no live process holds leaves every live view within forget-after plus one
    /// interval (plus the longest round) of the last word of any process that held it.
    fn check_departures(&self) {
        let bound = FORGET + INTERVAL + self.longest_round + FETCH_BOUND;
        for dead in self.procs.iter().filter(|p| !p.alive) {
            if self.procs.iter().any(|p| p.alive && p.id == dead.id) {
                continue;
            }
            let last = self
                .procs
                .iter()
                .filter(|p| p.id == dead.id)
                .map(|p| p.last_word)
                .max()
                .expect("itself");
            if self.now <= last + bound {
                continue;
            }
            for p in self.procs.iter().filter(|p| p.alive) {
                assert!(
                    p.dir.view().get(&dead.id).is_none(),
                    "{} still lists dead {} at {} (last word {last}, bound {bound:?})",
                    p.id,
                    dead.id,
                    self.now
                );
            }
        }
    }

    /// With every message delivered promptly, every live view converges on the live processes.
    fn settle(&mut self) {
        let end = self.now + FORGET + INTERVAL * 4;
        while self.now < end {
            while !self.msgs.is_empty() {
                self.deliver(0, false, false);
            }
            self.now += Duration::from_millis(100);
            self.tick();
            self.check_departures();
        }
        while !self.msgs.is_empty() {
            self.deliver(0, false, false);
        }
        let mut want: Vec<(String, String)> =
            self.procs.iter().filter(|p| p.alive).map(|p| (p.id.clone(), p.addr.clone())).collect();
        want.sort();
        for p in self.procs.iter().filter(|p| p.alive) {
            let got: Vec<(String, String)> =
                p.dir.view().members().iter().map(|m| (m.id.clone(), m.addr.clone())).collect();
            assert_eq!(got, want, "{}'s view", p.id);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Reordered, lost, stale and repeated roster exchanges, deaths, new members at reused
    /// addresses and members that move: views converge once messages flow, and a departed id
    /// leaves every view within forget-after plus one interval of its last word.
    #[test]
    fn roster_interleavings_converge_and_forget_the_dead(
        n in 2usize..=5,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let mut m = Model::new(n);
        m.tick();
        for op in &ops {
            m.apply(op);
        }
        m.settle();
    }
}

#[test]
fn a_member_that_announces_its_departure_leaves_the_view_at_once_and_comes_back_on_contact() {
    let mut d = dir("a", "h1:9000", &[], t(0));
    assert!(d.caller("b", "h2:9000", t(10)));
    assert!(d.caller("c", "h3:9000", t(10)));
    asked(d.start_round(t(0)));
    d.take_view();
    // (the round asked nobody: the callers are published at its end, which is the next start)
    d.check_invariants();
    assert!(!d.left("b", "h9:9000", t(12)), "an announcement from another address is ignored");
    assert!(!d.left("nobody", "h2:9000", t(12)));
    assert!(d.left("b", "h2:9000", t(12)));
    assert!(!ids(&d).contains(&"b".to_owned()), "out of the view at once: {:?}", ids(&d));
    assert!(d.take_view().is_some(), "the new view is published");
    assert_eq!(d.stats().left, 1);
    assert!(!d.left("b", "h2:9000", t(13)), "once");
    // An answer or a call it made before it left, arriving within an interval, does not bring
    // it back; a restarted process that calls later is a member again.
    assert!(!d.caller("b", "h2:9000", t(20)));
    assert!(d.caller("b", "h2:9000", t(12) + INTERVAL));
    d.check_invariants();
}
