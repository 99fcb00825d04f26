use super::*;
use proptest::prelude::*;

const TICK: Duration = Duration::from_secs(1);
const LEASE: Duration = Duration::from_secs(2);
const GRACE: Duration = Duration::from_secs(10);
const FILE: &str = "bucket/object";

fn t(ms: u64) -> Instant {
    Instant::from_millis(ms)
}

/// The spec's vector timing: tick 1 s, lease 2 s, grace 10 s.
fn registry() -> Registry {
    Registry::with_timing(TICK, LEASE, GRACE)
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn join(r: &mut Registry, node: &str, ms: u64) -> Grant {
    let grant = r.join(FILE, node, 0, t(ms)).expect("join is admitted");
    r.check_invariants();
    grant
}

// ---------------------------------------------------------------------------------------------
// Registry

#[test]
fn an_idle_file_is_kept_within_the_grace_and_forgotten_after_it_with_epoch_zero() {
    let mut r = registry();
    assert_eq!(join(&mut r, "a", 0).epoch, 1);
    // Any call drives the sweep; a query of another file is not activity on this one.
    assert_eq!(r.readers("other", t(5_000)), (0, vec![]));
    assert!(r.contains(FILE), "5 s idle, lease gone: kept within the 10 s grace");
    assert_eq!(r.readers(FILE, t(15_000)), (0, vec![]));
    assert!(!r.contains(FILE));
    assert_eq!(r.files(), 0);
    r.check_invariants();
}

#[test]
fn a_file_queried_every_five_seconds_is_never_evicted() {
    let mut r = registry();
    join(&mut r, "a", 0);
    for s in 1..=20 {
        let (epoch, readers) = r.readers(FILE, t(s * 5_000));
        assert!(epoch >= 1 && readers.is_empty(), "at {s}: lease gone, file kept");
        assert!(r.contains(FILE));
        r.check_invariants();
    }
}

#[test]
fn a_rejoin_after_eviction_publishes_the_new_reader_with_a_nonzero_epoch() {
    let mut r = registry();
    join(&mut r, "a", 0);
    join(&mut r, "b", 0);
    r.readers("other", t(15_000));
    assert!(!r.contains(FILE));
    let grant = join(&mut r, "C", 15_500);
    assert_eq!(grant.readers, ids(&["C"]));
    assert_ne!(grant.epoch, 0);
}

#[test]
fn the_first_join_publishes_at_once_and_later_joins_see_the_frozen_set_until_a_tick() {
    let mut r = registry();
    let first = join(&mut r, "b", 0);
    assert_eq!((first.epoch, first.readers), (1, ids(&["b"])));
    for (node, ms) in [("c", 300), ("a", 999)] {
        let grant = join(&mut r, node, ms);
        assert_eq!((grant.epoch, grant.readers), (1, ids(&["b"])), "{node} sees the frozen set");
    }
    assert_eq!(r.readers(FILE, t(999)), (1, ids(&["b"])));
    assert_eq!(r.readers(FILE, t(1_000)), (2, ids(&["a", "b", "c"])), "one tick: one bump");
    for node in ["a", "b", "c"] {
        join(&mut r, node, 1_900);
    }
    assert_eq!(r.readers(FILE, t(2_000)), (2, ids(&["a", "b", "c"])), "refreshes change nothing");
}

#[test]
fn refreshes_and_leaves_of_absent_nodes_never_bump_the_epoch() {
    let mut r = registry();
    join(&mut r, "a", 0);
    join(&mut r, "b", 0);
    assert_eq!(r.readers(FILE, t(1_000)), (2, ids(&["a", "b"])));
    for ms in (1_500..=10_000).step_by(500) {
        join(&mut r, "a", ms);
        join(&mut r, "b", ms);
        r.leave(FILE, "nobody", t(ms));
        r.leave("no-such-file", "a", t(ms));
        assert_eq!(r.readers(FILE, t(ms)), (2, ids(&["a", "b"])), "at {ms} ms");
        r.check_invariants();
    }
}

#[test]
fn published_readers_are_sorted_by_id_ascending() {
    let mut r = registry();
    for node in ["zeta", "mu", "alpha", "Beta", "0"] {
        join(&mut r, node, 0);
    }
    let (_, readers) = r.readers(FILE, t(1_000));
    assert_eq!(readers, ids(&["0", "Beta", "alpha", "mu", "zeta"]));
}

#[test]
fn a_lease_above_ten_minutes_is_clamped_and_the_grant_reports_the_clamp() {
    let mut r = registry();
    let day_ms = 24 * 3600 * 1000;
    let grant = r.join(FILE, "a", day_ms, t(0)).expect("joins");
    assert_eq!(grant.lease, MAX_LEASE);
    join(&mut r, "b", 599_000); // keeps the file known past a's deadline
    assert_eq!(r.readers(FILE, t(599_999)).1, ids(&["a", "b"]));
    assert_eq!(r.readers(FILE, t(600_000)).1, ids(&["b"]), "a's lease ended at 10 min");
}

#[test]
fn a_ttl_of_u64_max_is_clamped_without_overflow() {
    let mut r = registry();
    let grant = r.join(FILE, "a", u64::MAX, t(0)).expect("joins");
    assert_eq!(grant.lease, Duration::from_millis(600_000));
    let body = String::from_utf8(encode_grant(&grant)).expect("utf-8");
    assert!(body.contains(r#""ttlMs":600000"#), "{body}");
    r.check_invariants();
}

#[test]
fn a_ttl_of_zero_grants_the_default_lease_whatever_the_tick() {
    let mut r = Registry::new(Duration::from_secs(10));
    assert_eq!(r.join(FILE, "a", 0, t(0)).expect("joins").lease, DEFAULT_LEASE);
    assert_eq!(r.join(FILE, "b", 1, t(0)).expect("joins").lease, Duration::from_millis(1));
}

#[test]
fn zero_timings_pick_the_defaults() {
    let r = Registry::new(Duration::ZERO);
    assert_eq!((r.tick, r.lease, r.grace), (DEFAULT_TICK, DEFAULT_LEASE, IDLE_GRACE));
    let r = Registry::with_timing(Duration::ZERO, Duration::ZERO, Duration::ZERO);
    assert_eq!((r.tick, r.lease, r.grace), (DEFAULT_TICK, DEFAULT_LEASE, IDLE_GRACE));
    let r = Registry::with_timing(TICK, Duration::from_secs(3_600), GRACE);
    assert_eq!(r.lease, MAX_LEASE, "a configured default lease is clamped too");
}

#[test]
fn a_leave_of_the_last_reader_forgets_the_file() {
    let mut r = registry();
    join(&mut r, "a", 0);
    r.leave(FILE, "a", t(100));
    assert!(!r.contains(FILE));
    assert_eq!(r.readers(FILE, t(200)), (0, vec![]));
    r.check_invariants();
}

#[test]
fn a_leave_among_several_readers_is_published_at_the_next_tick() {
    let mut r = registry();
    join(&mut r, "a", 0);
    join(&mut r, "b", 0);
    assert_eq!(r.readers(FILE, t(1_000)), (2, ids(&["a", "b"])));
    r.leave(FILE, "a", t(1_200));
    assert_eq!(join(&mut r, "b", 1_500).readers, ids(&["a", "b"]), "frozen until the tick");
    assert_eq!(r.readers(FILE, t(2_000)), (3, ids(&["b"])));
}

#[test]
fn a_leave_when_only_expired_leases_remain_forgets_the_file() {
    let mut r = registry();
    join(&mut r, "a", 0);
    join(&mut r, "b", 0);
    r.leave(FILE, "a", t(2_000)); // b's lease ended at 2 s too
    assert!(!r.contains(FILE));
    r.check_invariants();
}

#[test]
fn a_lease_expires_at_its_deadline_regardless_of_others_joins() {
    let mut r = registry();
    join(&mut r, "a", 0);
    assert_eq!(join(&mut r, "b", 1_000).readers, ids(&["a", "b"]));
    assert_eq!(join(&mut r, "b", 1_500).readers, ids(&["a", "b"]));
    let grant = join(&mut r, "b", 2_000);
    assert_eq!((grant.epoch, grant.readers), (3, ids(&["b"])), "a lapsed at 2 s");
}

#[test]
fn time_going_backwards_never_panics_nor_moves_state_back() {
    let mut r = registry();
    join(&mut r, "a", 10_000);
    // Granted from the latest instant seen (10 s), not from 1 s.
    let grant = r.join(FILE, "b", 2_000, t(1_000)).expect("joins");
    assert_eq!(grant.readers, ids(&["a"]));
    assert_eq!(r.readers(FILE, t(0)), (1, ids(&["a"])));
    r.leave("other", "a", t(5));
    r.check_invariants();
    assert_eq!(r.readers(FILE, t(11_000)), (2, ids(&["a", "b"])));
    assert_eq!(r.readers(FILE, t(12_000)), (3, vec![]), "both lapsed at 12 s");
    r.check_invariants();
}

#[test]
fn a_bad_file_or_node_is_refused_by_join() {
    let mut r = registry();
    assert_eq!(r.join("", "a", 0, t(0)), Err(RegistryError::BadFile));
    let long = "f".repeat(FILE_MAX_LEN + 1);
    assert_eq!(r.join(&long, "a", 0, t(0)), Err(RegistryError::BadFile));
    assert!(r.join(&long[1..], "a", 0, t(0)).is_ok(), "exactly the bound is accepted");
    assert!(matches!(r.join(FILE, "a b", 0, t(0)), Err(RegistryError::BadNode(_))));
    assert!(matches!(r.join(FILE, "", 0, t(0)), Err(RegistryError::BadNode(_))));
    assert_eq!(r.files(), 1);
    r.check_invariants();
}

#[test]
fn a_full_registry_refuses_a_new_file_but_keeps_serving_known_ones() {
    let mut r = registry().with_caps(2, 4, 100);
    r.join("f1", "a", 0, t(0)).expect("joins");
    r.join("f2", "a", 0, t(0)).expect("joins");
    assert_eq!(r.join("f3", "a", 0, t(0)), Err(RegistryError::FilesFull));
    assert!(r.join("f1", "b", 0, t(0)).is_ok(), "a known file takes new readers");
    assert!(!r.contains("f3"));
    r.leave("f2", "a", t(10));
    assert!(r.join("f3", "a", 0, t(10)).is_ok(), "a forgotten file frees its slot");
    r.check_invariants();
}

#[test]
fn a_full_file_refuses_a_new_reader_until_a_lease_lapses_but_refreshes_existing_ones() {
    let mut r = registry().with_caps(4, 2, 100);
    join(&mut r, "a", 0);
    join(&mut r, "b", 500);
    assert_eq!(r.join(FILE, "c", 0, t(600)), Err(RegistryError::ReadersFull));
    assert!(r.join(FILE, "b", 0, t(600)).is_ok(), "a refresh needs no new slot");
    // a's lease (0 + 2 s) has lapsed: its slot is free even before a recompute drops it.
    assert!(r.join(FILE, "c", 0, t(2_000)).is_ok());
    r.check_invariants();
}

#[test]
fn the_lease_bound_across_files_refuses_a_new_reader() {
    let mut r = registry().with_caps(4, 4, 3);
    r.join("f1", "a", 0, t(0)).expect("joins");
    r.join("f1", "b", 0, t(0)).expect("joins");
    r.join("f2", "a", 0, t(0)).expect("joins");
    assert_eq!(r.join("f2", "b", 0, t(0)), Err(RegistryError::LeasesFull));
    assert_eq!(r.join("f3", "a", 0, t(0)), Err(RegistryError::LeasesFull));
    assert!(r.join("f1", "a", 0, t(0)).is_ok());
    r.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Server

fn request(file: &str, node: &str) -> Vec<u8> {
    encode_join(&JoinRequest { file: file.into(), node: node.into(), ttl_ms: 0 })
}

fn text(reply: &Reply) -> String {
    String::from_utf8(reply.body.clone()).expect("utf-8")
}

#[test]
fn serve_refuses_other_methods_with_405_and_allow_post() {
    let mut r = registry();
    for method in ["GET", "PUT", "HEAD", "DELETE"] {
        for path in [JOIN_PATH, LEAVE_PATH] {
            let reply = serve(&mut r, method, path, &request(FILE, "a"), t(0));
            assert_eq!(reply.status, 405, "{method} {path}");
            assert!(reply.headers.contains(&("allow", "POST".to_owned())));
        }
    }
    assert_eq!(r.files(), 0);
}

#[test]
fn serve_answers_404_for_other_paths() {
    let mut r = registry();
    for path in ["/", "/tracker/v1/join/", "/tracker/v2/join", "/tracker/v1/readers"] {
        assert_eq!(serve(&mut r, "POST", path, &request(FILE, "a"), t(0)).status, 404, "{path}");
    }
}

#[test]
fn serve_refuses_bad_bodies_with_400_naming_the_problem() {
    let mut r = registry();
    let huge = format!(r#"{{"file":"f","node":"a","pad":"{}"}}"#, "x".repeat(BODY_MAX));
    let cases: [(&[u8], &str); 9] = [
        (b"{not json", "bad JSON"),
        (b"[\"f\",\"a\"]", "bad JSON"),
        (br#"{"node":"a"}"#, "missing file"),
        (br#"{"file":"","node":"a"}"#, "missing file"),
        (br#"{"file":"f"}"#, "missing node"),
        (br#"{"file":"f","node":null}"#, "missing node"),
        (br#"{"file":"f","node":"a b"}"#, "bad node"),
        (br#"{"file":"f","node":"a","ttlMs":1.5}"#, "ttlMs"),
        (huge.as_bytes(), "over the 65536-byte bound"),
    ];
    for path in [JOIN_PATH, LEAVE_PATH] {
        for (body, problem) in cases {
            if path == LEAVE_PATH && problem == "ttlMs" {
                continue; // a leave ignores ttlMs
            }
            let reply = serve(&mut r, "POST", path, body, t(0));
            assert_eq!(reply.status, 400, "{path} {problem}");
            assert!(text(&reply).contains(problem), "{path}: {:?} lacks {problem}", text(&reply));
        }
    }
    assert_eq!(r.files(), 0);
}

#[test]
fn serve_answers_a_join_with_200_and_the_json_grant() {
    let mut r = registry();
    let reply = serve(&mut r, "POST", JOIN_PATH, &request(FILE, "a"), t(0));
    assert_eq!(reply.status, 200);
    let content_type = ("content-type", "application/json; charset=utf-8".to_owned());
    assert_eq!(reply.headers, vec![content_type]);
    assert_eq!(text(&reply), r#"{"epochS":1,"readers":["a"],"ttlMs":2000}"#);
    let grant = decode_grant(&reply.body).expect("decodes");
    assert_eq!(grant, Grant { epoch: 1, readers: ids(&["a"]), lease: LEASE });
}

#[test]
fn serve_answers_a_leave_with_204_and_no_body() {
    let mut r = registry();
    serve(&mut r, "POST", JOIN_PATH, &request(FILE, "a"), t(0));
    let leave = encode_leave(&LeaveRequest { file: FILE.into(), node: "a".into() });
    let reply = serve(&mut r, "POST", LEAVE_PATH, &leave, t(1));
    assert_eq!(reply, Reply { status: 204, headers: vec![], body: vec![] });
    assert!(!r.contains(FILE));
    let reply = serve(&mut r, "POST", LEAVE_PATH, &leave, t(2));
    assert_eq!(reply.status, 204, "leaving an unknown file is fine");
}

#[test]
fn serve_answers_503_when_the_registry_is_full() {
    let mut r = registry().with_caps(1, 1, 10);
    assert_eq!(serve(&mut r, "POST", JOIN_PATH, &request("f1", "a"), t(0)).status, 200);
    let reply = serve(&mut r, "POST", JOIN_PATH, &request("f2", "a"), t(0));
    assert_eq!(reply.status, 503);
    assert!(text(&reply).contains("most files"), "{}", text(&reply));
    assert_eq!(serve(&mut r, "POST", JOIN_PATH, &request("f1", "b"), t(0)).status, 503);
    assert_eq!(serve(&mut r, "POST", JOIN_PATH, &request("f1", "a"), t(0)).status, 200);
}

#[test]
fn serve_ignores_a_query_string() {
    let mut r = registry();
    let path = format!("{JOIN_PATH}?x=1");
    assert_eq!(serve(&mut r, "POST", &path, &request(FILE, "a"), t(0)).status, 200);
}

// ---------------------------------------------------------------------------------------------
// Wire

#[test]
fn the_wire_forms_of_a_join_a_grant_and_a_leave_do_not_drift() {
    let join = JoinRequest { file: "ns/object-7".into(), node: "node-a".into(), ttl_ms: 0 };
    let grant = Grant { epoch: 3, readers: ids(&["node-a", "node-b"]), lease: DEFAULT_LEASE };
    let leave = LeaveRequest { file: "ns/object-7".into(), node: "node-a".into() };
    let text = |b: Vec<u8>| String::from_utf8(b).expect("utf-8");
    let forms = format!(
        "POST {JOIN_PATH}\n{}\n200\n{}\nPOST {LEAVE_PATH}\n{}\n",
        text(encode_join(&join)),
        text(encode_grant(&grant)),
        text(encode_leave(&leave)),
    );
    insta::assert_snapshot!("wire_forms", forms);
    assert_eq!(decode_join(&encode_join(&join)), Ok(join));
    assert_eq!(decode_grant(&encode_grant(&grant)), Ok(grant));
    assert_eq!(decode_leave(&encode_leave(&leave)), Ok(leave));
}

#[test]
fn decode_join_defaults_the_ttl_ignores_unknown_fields_and_reads_negative_as_default() {
    let with = |ttl: &str| format!(r#"{{"file":"f","node":"a","extra":[1]{ttl}}}"#);
    let ttl = |ttl: &str| decode_join(with(ttl).as_bytes()).map(|r| r.ttl_ms);
    assert_eq!(ttl(""), Ok(0));
    assert_eq!(ttl(r#","ttlMs":null"#), Ok(0));
    assert_eq!(ttl(r#","ttlMs":-5"#), Ok(0));
    assert_eq!(ttl(r#","ttlMs":1500"#), Ok(1500));
    assert_eq!(ttl(r#","ttlMs":18446744073709551615"#), Ok(u64::MAX));
    assert_eq!(ttl(r#","ttlMs":18446744073709551616"#), Err(WireError::BadTtl));
    assert_eq!(ttl(r#","ttlMs":2.5"#), Err(WireError::BadTtl));
    assert_eq!(ttl(r#","ttlMs":"100""#), Err(WireError::BadTtl));
}

#[test]
fn decode_join_refuses_a_file_over_the_length_bound_and_a_non_string_field() {
    let long = "f".repeat(FILE_MAX_LEN + 1);
    let body = format!(r#"{{"file":"{long}","node":"a"}}"#);
    assert_eq!(decode_join(body.as_bytes()), Err(WireError::FileTooLong(FILE_MAX_LEN + 1)));
    let body = format!(r#"{{"file":"{}","node":"a"}}"#, &long[1..]);
    assert!(decode_join(body.as_bytes()).is_ok());
    assert!(matches!(decode_leave(br#"{"file":7,"node":"a"}"#), Err(WireError::Json(_))));
}

#[test]
fn decode_grant_drops_invalid_reader_ids_and_keeps_the_rest_sorted() {
    let body = br#"{"epochS":4,"readers":["b","a b","",7,"a","b"],"ttlMs":6000,"x":1}"#;
    let grant = decode_grant(body).expect("decodes");
    assert_eq!(grant, Grant { epoch: 4, readers: ids(&["a", "b"]), lease: DEFAULT_LEASE });
    assert_eq!(decode_grant(b"{}"), Ok(Grant { epoch: 0, readers: vec![], lease: Duration::ZERO }));
}

#[test]
fn decode_grant_refuses_too_many_readers_bad_json_and_oversized_bodies() {
    let many: Vec<String> = (0..=READERS_MAX).map(|i| format!("n{i}")).collect();
    let body = serde_json::json!({"epochS": 1, "readers": many, "ttlMs": 6000}).to_string();
    assert_eq!(decode_grant(body.as_bytes()), Err(WireError::TooManyReaders(READERS_MAX + 1)));
    assert!(matches!(decode_grant(b"<html>"), Err(WireError::Json(_))));
    assert!(matches!(decode_grant(br#"{"epochS":-1}"#), Err(WireError::Json(_))));
    assert_eq!(decode_grant(br#"{"ttlMs":-1}"#), Err(WireError::BadTtl));
    let big = vec![b' '; BODY_MAX + 1];
    assert_eq!(decode_grant(&big), Err(WireError::TooLarge(BODY_MAX + 1)));
}

#[test]
fn decode_grant_clamps_a_lease_above_ten_minutes() {
    let grant = decode_grant(br#"{"epochS":1,"readers":["a"],"ttlMs":86400000}"#).expect("ok");
    assert_eq!(grant.lease, MAX_LEASE);
}

// ---------------------------------------------------------------------------------------------
// Reader cache

fn grant(readers: &[&str], lease_ms: u64) -> Result<Grant, String> {
    Ok(Grant { epoch: 1, readers: ids(readers), lease: Duration::from_millis(lease_ms) })
}

fn look(c: &mut ReaderCache, ms: u64) -> (Option<Vec<String>>, bool) {
    let lookup = c.lookup(FILE, t(ms));
    c.check_invariants();
    (lookup.readers, lookup.join)
}

#[test]
fn the_first_lookup_asks_for_a_join_and_a_second_while_in_flight_does_not() {
    let mut c = ReaderCache::new();
    assert!(c.is_empty());
    assert_eq!(look(&mut c, 0), (None, true));
    assert_eq!(look(&mut c, 100), (None, false));
    assert_eq!(c.len(), 1);
}

#[test]
fn after_a_grant_its_readers_are_served_until_the_lease_ends() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["b", "a"], 6_000), t(1_000));
    assert_eq!(look(&mut c, 1_000), (Some(ids(&["a", "b"])), false));
    assert_eq!(look(&mut c, 3_999), (Some(ids(&["a", "b"])), false));
    // Nobody answered the re-JOIN asked at 4 s: the readers end with the lease at 7 s.
    assert_eq!(look(&mut c, 4_000), (Some(ids(&["a", "b"])), true));
    assert_eq!(look(&mut c, 6_999), (Some(ids(&["a", "b"])), false));
    assert_eq!(look(&mut c, 7_000), (None, false));
}

#[test]
fn a_re_join_is_asked_at_half_the_lease_while_the_old_readers_are_still_served() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 6_000), t(0));
    assert_eq!(look(&mut c, 2_999), (Some(ids(&["a"])), false));
    assert_eq!(look(&mut c, 3_000), (Some(ids(&["a"])), true));
    assert_eq!(look(&mut c, 3_500), (Some(ids(&["a"])), false), "in flight");
    c.joined(FILE, grant(&["a", "c"], 6_000), t(3_600));
    assert_eq!(look(&mut c, 3_600), (Some(ids(&["a", "c"])), false));
    assert_eq!(look(&mut c, 6_600), (Some(ids(&["a", "c"])), true));
}

#[test]
fn a_failed_join_keeps_the_old_readers_until_expiry_and_holds_off_retries_for_two_seconds() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 6_000), t(0));
    assert_eq!(look(&mut c, 3_000), (Some(ids(&["a"])), true));
    c.joined(FILE, Err("tracker unreachable".into()), t(3_500));
    assert_eq!(look(&mut c, 3_500), (Some(ids(&["a"])), false));
    assert_eq!(look(&mut c, 5_499), (Some(ids(&["a"])), false), "held off");
    assert_eq!(look(&mut c, 5_500), (Some(ids(&["a"])), true), "retry after 2 s");
    c.joined(FILE, Err("timeout".into()), t(6_000));
    assert_eq!(look(&mut c, 6_000), (None, false), "the lease ended at 6 s");
    assert_eq!(look(&mut c, 8_000), (None, true));
}

#[test]
fn a_first_join_that_fails_holds_off_retries_too() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, Err("refused".into()), t(100));
    assert_eq!(look(&mut c, 2_099), (None, false));
    assert_eq!(look(&mut c, 2_100), (None, true));
}

#[test]
fn a_stale_answer_with_no_join_in_flight_is_ignored() {
    let mut c = ReaderCache::new();
    c.joined(FILE, grant(&["x"], 6_000), t(0));
    assert!(c.is_empty(), "an answer for an unknown file is ignored");
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 6_000), t(100));
    c.joined(FILE, grant(&["z"], 60_000), t(200));
    c.joined(FILE, Err("late failure".into()), t(300));
    assert_eq!(look(&mut c, 300), (Some(ids(&["a"])), false));
    assert_eq!(look(&mut c, 3_100), (Some(ids(&["a"])), true), "renewal is not held off");
}

#[test]
fn a_grant_with_a_lease_of_zero_is_served_and_renewed_after_the_two_second_fallback() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 0), t(0));
    assert_eq!(look(&mut c, 1_999), (Some(ids(&["a"])), false));
    assert_eq!(look(&mut c, 2_000), (None, true));
}

#[test]
fn a_short_lease_is_renewed_at_half_of_it_not_after_two_seconds() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 1_000), t(0));
    assert_eq!(look(&mut c, 499), (Some(ids(&["a"])), false));
    assert_eq!(look(&mut c, 500), (Some(ids(&["a"])), true));
}

#[test]
fn a_join_never_answered_is_presumed_lost_after_ten_seconds() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    assert_eq!(look(&mut c, 9_999), (None, false));
    assert_eq!(look(&mut c, 10_000), (None, true));
}

#[test]
fn readers_from_a_grant_are_stored_sorted_without_duplicates() {
    let mut c = ReaderCache::new();
    look(&mut c, 0);
    c.joined(FILE, grant(&["c", "a", "c", "b"], 6_000), t(0));
    assert_eq!(look(&mut c, 1).0, Some(ids(&["a", "b", "c"])));
}

#[test]
fn a_full_cache_does_not_cache_a_new_file_until_a_sweep_frees_room() {
    let mut c = ReaderCache::new();
    for i in 0..CACHE_MAX {
        let file = format!("f{i}");
        assert!(c.lookup(&file, t(0)).join);
        c.joined(&file, grant(&["a"], 6_000), t(0));
    }
    assert_eq!(c.len(), CACHE_MAX);
    assert_eq!(c.lookup("new", t(1_000)), Lookup { readers: None, join: false });
    assert_eq!(c.len(), CACHE_MAX);
    c.check_invariants();
    // Every lease ended at 6 s: the next new file sweeps them all.
    assert_eq!(c.lookup("new", t(6_000)), Lookup { readers: None, join: true });
    assert_eq!(c.len(), 1);
    c.check_invariants();
}

#[test]
fn a_sweep_keeps_live_entries_and_joins_in_flight() {
    let mut c = ReaderCache::new();
    for i in 0..=CACHE_SWEEP_ABOVE {
        let file = format!("f{i}");
        c.lookup(&file, t(0));
        if i % 2 == 0 {
            c.joined(&file, grant(&["a"], 6_000), t(0));
        }
    }
    // At 7 s the granted ones have lapsed; the ones in flight since 0 s are still awaited.
    c.lookup("new", t(7_000));
    assert_eq!(c.len(), CACHE_SWEEP_ABOVE / 2 + 1);
    c.check_invariants();
}

// ---------------------------------------------------------------------------------------------
// Model-based: the registry against the rules restated as simply as possible

const FILES: [&str; 3] = ["f0", "f1", "f2"];
const NODES: [&str; 5] = ["n0", "n1", "n2", "n3", "n4"];

#[derive(Clone, Debug)]
enum Op {
    Join { file: usize, node: usize, ttl_ms: u64 },
    Leave { file: usize, node: usize },
    Readers { file: usize },
    Advance(u64),
    Back(u64),
}

fn op() -> impl Strategy<Value = Op> {
    let ttl = prop_oneof![
        3 => Just(0u64),
        2 => (1u64..20).prop_map(|q| q * 250),
        2 => 1u64..5_000,
        1 => Just(700_000u64),
        1 => Just(u64::MAX),
    ];
    prop_oneof![
        6 => (0..FILES.len(), 0..NODES.len(), ttl)
            .prop_map(|(file, node, ttl_ms)| Op::Join { file, node, ttl_ms }),
        2 => (0..FILES.len(), 0..NODES.len()).prop_map(|(file, node)| Op::Leave { file, node }),
        3 => (0..FILES.len()).prop_map(|file| Op::Readers { file }),
        // Quarter seconds land on deadlines, ticks and the grace exactly.
        3 => (0u64..16).prop_map(|q| Op::Advance(q * 250)),
        2 => (0u64..4_000).prop_map(Op::Advance),
        1 => (0u64..3_000).prop_map(Op::Back),
    ]
}

/// One file as the rules describe it: every node's last deadline (never pruned: with time
/// monotone, an expired deadline stays expired), the published set and its epoch.
#[derive(Clone, Debug)]
struct ModelFile {
    deadlines: BTreeMap<String, Instant>,
    published: Vec<String>,
    epoch: u64,
    recomputed_at: Instant,
    active_at: Instant,
}

impl ModelFile {
    fn live(&self, now: Instant) -> Vec<String> {
        self.deadlines.iter().filter(|(_, d)| **d > now).map(|(n, _)| n.clone()).collect()
    }
}

#[derive(Default)]
struct Model {
    files: BTreeMap<String, ModelFile>,
    clock: Instant,
    swept_at: Option<Instant>,
}

impl Model {
    /// Every call: the clock never goes back, and idle eviction runs at most once per tick.
    fn enter(&mut self, now: Instant) -> Instant {
        self.clock = self.clock.max(now);
        let now = self.clock;
        if self.swept_at.is_none_or(|at| now >= at + TICK) {
            self.swept_at = Some(now);
            self.files.retain(|_, f| !f.live(now).is_empty() || now <= f.active_at + GRACE);
        }
        now
    }

    fn refresh(f: &mut ModelFile, now: Instant, force: bool) {
        if force || now >= f.recomputed_at + TICK {
            let live = f.live(now);
            if live != f.published {
                f.published = live;
                f.epoch += 1;
            }
            f.recomputed_at = now;
        }
    }

    /// Answers the grant and whether the file was (re)created by this join.
    fn join(&mut self, file: &str, node: &str, ttl_ms: u64, now: Instant) -> (Grant, bool) {
        let now = self.enter(now);
        let lease = match ttl_ms {
            0 => LEASE,
            ms => Duration::from_millis(ms).min(MAX_LEASE),
        };
        let created = !self.files.contains_key(file);
        let f = self.files.entry(file.to_owned()).or_insert(ModelFile {
            deadlines: BTreeMap::new(),
            published: vec![],
            epoch: 0,
            recomputed_at: now,
            active_at: now,
        });
        f.deadlines.insert(node.to_owned(), now + lease);
        f.active_at = now;
        Model::refresh(f, now, created);
        (Grant { epoch: f.epoch, readers: f.published.clone(), lease }, created)
    }

    fn leave(&mut self, file: &str, node: &str, now: Instant) {
        let now = self.enter(now);
        if let Some(f) = self.files.get_mut(file) {
            f.deadlines.remove(node);
            if f.live(now).is_empty() {
                self.files.remove(file);
            }
        }
    }

    fn readers(&mut self, file: &str, now: Instant) -> (u64, Vec<String>) {
        let now = self.enter(now);
        match self.files.get_mut(file) {
            None => (0, vec![]),
            Some(f) => {
                f.active_at = now;
                Model::refresh(f, now, false);
                (f.epoch, f.published.clone())
            }
        }
    }
}

fn published(r: &Registry) -> BTreeMap<String, (u64, Vec<String>)> {
    r.files.iter().map(|(name, f)| (name.clone(), (f.epoch, f.published.clone()))).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Random joins, leaves, queries and clock moves (some backwards) over 3 files and 5 nodes:
    /// the registry answers as the rules say, its sets stay sorted, and an epoch moves by exactly
    /// one when its set changes and never otherwise.
    #[test]
    fn the_registry_follows_the_rules_and_bumps_epochs_only_on_change(
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let mut real = registry();
        let mut model = Model::default();
        let mut now = Instant::ZERO;
        for op in &ops {
            let before = published(&real);
            let mut created = None;
            match *op {
                Op::Join { file, node, ttl_ms } => {
                    let got = real.join(FILES[file], NODES[node], ttl_ms, now);
                    let (want, fresh) = model.join(FILES[file], NODES[node], ttl_ms, now);
                    prop_assert_eq!(got, Ok(want), "{:?}", op);
                    created = fresh.then_some(FILES[file]);
                }
                Op::Leave { file, node } => {
                    real.leave(FILES[file], NODES[node], now);
                    model.leave(FILES[file], NODES[node], now);
                }
                Op::Readers { file } => {
                    let got = real.readers(FILES[file], now);
                    prop_assert_eq!(got, model.readers(FILES[file], now), "{:?}", op);
                }
                Op::Advance(ms) => now += Duration::from_millis(ms),
                Op::Back(ms) => {
                    now = Instant::from_nanos(now.as_nanos().saturating_sub(ms * 1_000_000));
                }
            }
            real.check_invariants();
            let after = published(&real);
            let want: BTreeMap<_, _> = model
                .files
                .iter()
                .map(|(name, f)| (name.clone(), (f.epoch, f.published.clone())))
                .collect();
            prop_assert_eq!(&after, &want, "after {:?}", op);
            for (name, (epoch, set)) in &after {
                prop_assert!(set.windows(2).all(|w| w[0] < w[1]), "{} sorted", name);
                match before.get(name) {
                    _ if created == Some(name.as_str()) => prop_assert_eq!(*epoch, 1),
                    None => prop_assert!(false, "{} appeared without a join", name),
                    Some((e0, s0)) if s0 == set => prop_assert_eq!(e0, epoch, "{}", name),
                    Some((e0, _)) => prop_assert_eq!(e0 + 1, *epoch, "{}", name),
                }
            }
        }
    }
}

#[test]
fn peek_serves_live_readers_without_asking_for_a_join() {
    let mut c = ReaderCache::new();
    assert_eq!(c.peek(FILE, t(0)), None);
    look(&mut c, 0);
    c.joined(FILE, grant(&["a"], 6_000), t(0));
    assert_eq!(c.peek(FILE, t(5_999)), Some(&ids(&["a"])[..]));
    assert_eq!(c.peek(FILE, t(6_000)), None);
    assert_eq!(look(&mut c, 3_000), (Some(ids(&["a"])), true), "peeking asked for nothing");
}
