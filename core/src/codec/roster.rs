//! The roster wire form (`GET /peer/v1/roster`, seeds/peer.md §3.7, spec/cluster.md §6).
//!
//! `{"epoch":"<decimal u64>","members":[{"id":"..","addr":"..","weight":1}, ...]}`. The epoch is a
//! string because JSON numbers are doubles and a u64 above 2^53 would be corrupted. There is no
//! state field: liveness is a local observation. Unknown fields are ignored.

use crate::membership::{validate_member_id, Member, MemberIdError, View};
use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Largest roster body a client reads.
pub const ROSTER_BYTES_MAX: usize = 4 << 20;

#[derive(Serialize, Deserialize)]
struct WireMember {
    id: String,
    addr: String,
    #[serde(default, skip_serializing_if = "is_zero")]
    weight: f64,
}

fn is_zero(w: &f64) -> bool {
    *w == 0.0
}

#[derive(Serialize, Deserialize)]
struct WireRoster {
    epoch: String,
    members: Vec<WireMember>,
}

/// Why a roster body was refused.
#[derive(Debug, Error)]
pub enum RosterError {
    /// Not the JSON shape of a roster.
    #[error("malformed roster body: {0}")]
    Malformed(String),
    /// The epoch is not a decimal u64.
    #[error("roster epoch {0:?} is not a decimal u64")]
    Epoch(String),
    /// Larger than [`ROSTER_BYTES_MAX`].
    #[error("roster body larger than {ROSTER_BYTES_MAX} bytes")]
    TooLarge,
}

/// A decoded roster: the sender's view of the members (with addresses), and what was dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct Roster {
    /// The sender's epoch.
    pub epoch: u64,
    /// Members with a valid id and an address; weight `<= 0` became 1; all Ready.
    pub members: Vec<Member>,
    /// Ids refused as invalid (one diagnostic each is the caller's job).
    pub invalid: Vec<MemberIdError>,
}

/// Encodes this node's view: every member with an address, the sender always included.
pub fn encode_roster(view: &View, self_member: &Member) -> String {
    let mut members: Vec<WireMember> = view
        .members()
        .iter()
        .filter(|m| !m.addr.is_empty())
        .map(|m| WireMember { id: m.id.clone(), addr: m.addr.clone(), weight: m.weight })
        .collect();
    if !members.iter().any(|m| m.id == self_member.id) {
        let m = self_member;
        members.push(WireMember { id: m.id.clone(), addr: m.addr.clone(), weight: m.weight });
    }
    let wire = WireRoster { epoch: view.epoch().to_string(), members };
    serde_json::to_string(&wire).expect("a roster always serialises")
}

/// [`encode_roster`] as bytes, with its tag (FNV-1a of the bytes: the roster's `ETag`). When the
/// sender is a member of `view` with an address, the body does not depend on it: it is encoded
/// and hashed once per view and shared by the view's clones (a node answers every roster fetch
/// of a round with the same view; at 10,000 members a roster is about 500 KB). Otherwise it is
/// encoded every time.
pub fn roster_body(view: &View, self_member: &Member) -> (bytes::Bytes, u64) {
    let encode = || {
        let body = encode_roster(view, self_member);
        let mut hash = crate::hash::Fnv1a::default();
        hash.write(body.as_bytes());
        (bytes::Bytes::from(body), hash.finish())
    };
    if view.get(&self_member.id).is_some_and(|m| !m.addr.is_empty()) {
        view.roster_memo(encode)
    } else {
        encode()
    }
}

/// Decodes a roster body received from `dialed` whose `X-DART-Node` header named `responder`.
/// A responder that named itself in the header but not in the body is added at the dialed address.
pub fn decode_roster(
    body: &[u8],
    responder: Option<&str>,
    dialed: &str,
) -> Result<Roster, RosterError> {
    if body.len() > ROSTER_BYTES_MAX {
        return Err(RosterError::TooLarge);
    }
    let wire: WireRoster =
        serde_json::from_slice(body).map_err(|e| RosterError::Malformed(e.to_string()))?;
    let epoch = wire.epoch.parse::<u64>().map_err(|_| RosterError::Epoch(wire.epoch.clone()))?;
    let mut members = Vec::new();
    let mut invalid = Vec::new();
    for m in wire.members {
        if m.id.is_empty() || m.addr.is_empty() {
            continue;
        }
        match validate_member_id(&m.id) {
            Ok(()) => {
                let weight = if m.weight > 0.0 { m.weight } else { 1.0 };
                members.push(Member { weight, ..Member::ready(&m.id, &m.addr) });
            }
            Err(e) => invalid.push(e),
        }
    }
    if let Some(id) = responder {
        if validate_member_id(id).is_ok() && !members.iter().any(|m| m.id == id) {
            members.push(Member::ready(id, dialed));
        }
    }
    Ok(Roster { epoch, members, invalid })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn view() -> View {
        View::new(vec![Member::ready("a", "h1:9000"), Member::ready("b", "h2:9000")])
    }

    #[test]
    fn a_roster_body_is_the_encoding_with_its_hash_shared_by_clones_only_when_it_cannot_differ() {
        let fnv = |b: &[u8]| {
            let mut h = crate::hash::Fnv1a::default();
            h.write(b);
            h.finish()
        };
        let v = view();
        let me = Member::ready("a", "h1:9000");
        let (body, tag) = roster_body(&v, &me);
        assert_eq!(&body[..], encode_roster(&v, &me).as_bytes());
        assert_eq!(tag, fnv(&body));
        // A clone answers with the same bytes, not a second encoding of them.
        let (again, _) = roster_body(&v.clone(), &Member::ready("b", "h2:9000"));
        assert_eq!(again.as_ptr(), body.as_ptr(), "encoded once per view");
        // A sender outside the view (or in it without an address) is added: never the memo.
        let stranger = Member::ready("c", "h3:9000");
        let (with_c, tag_c) = roster_body(&v, &stranger);
        assert_eq!(&with_c[..], encode_roster(&v, &stranger).as_bytes());
        assert_ne!(with_c, body);
        assert_eq!(tag_c, fnv(&with_c));
        let addrless = View::new(vec![Member::ready("a", ""), Member::ready("b", "h2:9000")]);
        let (own, _) = roster_body(&addrless, &me);
        assert_eq!(&own[..], encode_roster(&addrless, &me).as_bytes());
        assert_ne!(roster_body(&addrless, &me).0.as_ptr(), own.as_ptr(), "not memoised");
        // Another view (another member list) has a memo of its own.
        let other = View::new(vec![Member::ready("a", "h1:9001"), Member::ready("b", "h2:9000")]);
        let (moved, _) = roster_body(&other, &me);
        assert_eq!(&moved[..], encode_roster(&other, &me).as_bytes());
        assert_ne!(moved, body);
    }

    #[test]
    fn a_roster_round_trips_with_the_sender_and_its_epoch() {
        let me = Member::ready("a", "h1:9000");
        let body = encode_roster(&view(), &me);
        let r = decode_roster(body.as_bytes(), Some("a"), "h1:9000").expect("decodes");
        assert_eq!(r.epoch, view().epoch());
        assert_eq!(r.members, view().members().to_vec());
    }

    #[test]
    fn the_epoch_is_a_string_so_a_u64_survives_where_a_json_number_would_not() {
        let body = encode_roster(&view(), &Member::ready("a", "h1:9000"));
        assert!(body.contains(&format!("\"epoch\":\"{}\"", view().epoch())), "{body}");
        let big = format!(r#"{{"epoch":"{}","members":[]}}"#, u64::MAX);
        assert_eq!(decode_roster(big.as_bytes(), None, "x:1").expect("ok").epoch, u64::MAX);
        let as_number = format!(r#"{{"epoch":{},"members":[]}}"#, u64::MAX);
        assert!(decode_roster(as_number.as_bytes(), None, "x:1").is_err());
    }

    #[test]
    fn the_roster_carries_no_state_and_unknown_fields_decode_cleanly() {
        let body = encode_roster(&view(), &Member::ready("a", "h1:9000"));
        assert!(!body.contains("state") && !body.contains("Ready"), "{body}");
        let with_extra =
            r#"{"epoch":"1","members":[{"id":"c","addr":"h:1","state":"Suspect","x":1}],"v":2}"#;
        let r = decode_roster(with_extra.as_bytes(), None, "h:1").expect("decodes");
        assert_eq!(r.members, vec![Member::ready("c", "h:1")]);
    }

    #[test]
    fn a_responder_that_omits_itself_is_repaired_from_its_header() {
        let body = r#"{"epoch":"1","members":[{"id":"b","addr":"h2:9000"}]}"#;
        let r = decode_roster(body.as_bytes(), Some("z"), "10.0.0.9:9000").expect("decodes");
        assert!(r.members.contains(&Member::ready("z", "10.0.0.9:9000")));
    }

    #[test]
    fn invalid_ids_are_dropped_and_reported_while_valid_siblings_are_kept() {
        let body = "{\"epoch\":\"1\",\"members\":[{\"id\":\"a b\",\"addr\":\"h:1\"},{\"id\":\"ok\",\"addr\":\"h:2\"},{\"id\":\"\",\"addr\":\"h:3\"}]}";
        let r = decode_roster(body.as_bytes(), None, "h:9").expect("decodes");
        assert_eq!(r.members, vec![Member::ready("ok", "h:2")]);
        assert_eq!(r.invalid.len(), 1);
    }

    #[test]
    fn non_positive_weights_become_one_and_bad_bodies_are_errors() {
        let body = r#"{"epoch":"1","members":[{"id":"a","addr":"h:1","weight":-3}]}"#;
        let r = decode_roster(body.as_bytes(), None, "h:1").expect("decodes");
        assert_eq!(r.members[0].weight, 1.0);
        for bad in ["", "{", "[]", r#"{"epoch":"x","members":[]}"#, r#"{"members":[]}"#] {
            assert!(decode_roster(bad.as_bytes(), None, "h:1").is_err(), "{bad}");
        }
        assert!(matches!(
            decode_roster(&vec![b' '; ROSTER_BYTES_MAX + 1], None, "h:1"),
            Err(RosterError::TooLarge)
        ));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode_roster(&body, Some("n"), "h:1");
        }
    }
}
