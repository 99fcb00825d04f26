//! Mutations of valid requests: each takes a request past the request line and breaks one thing
//! (the method, the target, a range, a peer path, a hop, an origin, a MAC, a date, the framing,
//! the header syntax), or edits the serialised bytes.

use super::gen::{Ctx, Plane, Req};
use super::rng::Rng;

/// A structural mutation: its name (for the counts) and what it does.
pub type Mutation = (&'static str, fn(&mut Req, &mut Rng, &Ctx));

/// The structural mutations that fit `plane`, with their weights.
pub fn structural(plane: Plane) -> Vec<(u64, Mutation)> {
    let mut all: Vec<(u64, Mutation)> = vec![
        (6, ("method", method)),
        (4, ("version", version)),
        (12, ("target", target)),
        (3, ("conditional", conditional)),
        (3, ("huge-head", huge_head)),
        (4, ("body-framing", body_framing)),
        (5, ("header-syntax", header_syntax)),
        (3, ("duplicates", duplicates)),
        (2, ("connection", connection)),
    ];
    match plane {
        Plane::Client => all.extend([(14, ("range", range as fn(&mut Req, &mut Rng, &Ctx)))]),
        Plane::Peer => all.extend([
            (12, ("hop", hop as fn(&mut Req, &mut Rng, &Ctx))),
            (10, ("x-dart-origin", origin)),
            (12, ("x-dart-auth", auth)),
            (4, ("caller", caller)),
            (2, ("range", range)),
        ]),
        Plane::Admin => {
            all.extend([(2, ("range", range as fn(&mut Req, &mut Rng, &Ctx))), (2, ("hop", hop))])
        }
    }
    all
}

const BAD_METHODS: &[&str] = &[
    "PUT", "POST", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "BREW", "get", "GeT", "G",
    "GETT", "HEADD", "G\u{0}T", "GET\t", "-", "\u{7f}", "GET/", "GET:", "\"GET\"", "é",
];

fn method(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    req.method = match rng.below(4) {
        0 => rng.bytes_between(1, 24),
        1 => vec![b'X'; rng.between(100, 9000) as usize],
        2 => Vec::new(),
        _ => rng.pick(BAD_METHODS).as_bytes().to_vec(),
    };
}

const BAD_VERSIONS: &[&str] = &[
    "HTTP/1.0",
    "HTTP/2.0",
    "HTTP/0.9",
    "HTTP/1",
    "http/1.1",
    "HTTP/1.1 extra",
    "HTTP/11.1",
    "HTTP/1.x",
    "HTTP/1.1\u{0}",
    "",
    "HTTPS/1.1",
    "HTTP/9.9",
    "HTTP/-1.1",
    "HTTP /1.1",
];

fn version(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    req.version = rng.pick(BAD_VERSIONS).as_bytes().to_vec();
}

const PERCENT_AND_ODD: &[&[u8]] = &[
    b"%",
    b"%z",
    b"%zz",
    b"%0",
    b"%00",
    b"%ff",
    b"%C0%AF",
    b"%25%32%35",
    b"%%",
    b"%u0041",
    b"\x7f",
    b"\x01",
    b"\"",
    b"<",
    b">",
    b"{",
    b"|",
    b"\\",
    b"^",
    b"`",
    b"\xc3\xa9",
    b"\xff\xfe",
    b" ",
    b"\t",
    b"/../../",
    b"//",
    b"/./",
    b"?",
    b"??&&==;",
    b"#frag",
    b"\x00",
];

fn target(req: &mut Req, rng: &mut Rng, ctx: &Ctx) {
    match rng.below(3) {
        0 => insert_odd(&mut req.target, rng),
        1 => {
            let pad = rng.between(2_000, 40_000) as usize;
            req.target.extend(std::iter::repeat_n(b'a', pad));
        }
        _ => {
            req.target = match req.target.first() {
                Some(b'/') if req.target.starts_with(b"/peer/") => peer_target(rng, ctx),
                Some(b'/') if req.target.starts_with(b"/dart/") => client_target(rng, ctx),
                _ => admin_target(rng),
            }
        }
    }
}

/// Inserts an odd sequence past the target's URL authority (the host must stay a literal).
fn insert_odd(target: &mut Vec<u8>, rng: &mut Rng) {
    let authority_end = target
        .windows(3)
        .position(|w| w == b"://")
        .and_then(|s| target[s + 3..].iter().position(|b| *b == b'/').map(|e| s + 3 + e))
        .unwrap_or(0);
    let at = rng.between(authority_end as u64, target.len() as u64) as usize;
    let odd = rng.pick(PERCENT_AND_ODD).to_vec();
    target.splice(at..at, odd);
}

fn client_target(rng: &mut Rng, ctx: &Ctx) -> Vec<u8> {
    let o = ctx.origin;
    let p = o.port();
    let choices = [
        "/dart".to_string(),
        "/dart/".into(),
        format!("/DART/http://{o}/x"),
        format!("/dart//http://{o}/x"),
        format!("/dartx/http://{o}/x"),
        format!("/dart/ftp://{o}/x"),
        format!("/dart/http:/{o}/x"),
        "/dart/http://".into(),
        "/dart/http:///x".into(),
        format!("/dart/https://{o}/x"),
        format!("/dart/http://user:pw@{o}/x"),
        format!("/dart/http://{o}@127.0.0.1:1/x"),
        "/dart/http://127.0.0.1:99999/x".into(),
        "/dart/http://127.0.0.1:0/x".into(),
        "/dart/http://127.0.0.1:/x".into(),
        "/dart/http://127.0.0.1:1/x".into(),
        format!("/dart/http://127.0.0.2:{p}/x"),
        format!("/dart/http://[::1]:{p}/x"),
        "/dart/http://[::1/x".into(),
        "/dart/http://169.254.169.254/latest/meta-data/".into(),
        "/dart/http://[fe80::1]/x".into(),
        format!("/dart/http://0.0.0.0:{p}/x"),
        format!("/dart/http://2130706433:{p}/x"),
        format!("/dart/http://0x7f.1:{p}/x"),
        format!("/dart/http://127.1:{p}/x"),
        format!("/dart/http://localhost:{p}/x"),
        format!("/dart/http://10.255.255.1:{p}/x"),
        format!("/dart/http://{}/dart/http://{o}/x", ctx.client),
        format!("/dart/http://{}/metrics", ctx.admin),
        format!("/dart/http://{}/peer/v1/roster", ctx.peer),
        format!("/dart/http%3A%2F%2F{o}/x"),
        format!("http://{}/dart/http://{o}/x", ctx.client),
        "*".into(),
        "".into(),
        format!("/dart/http://{o}/x?sig=%zz&&=&"),
        format!("/dart/http://{o}/x#frag"),
    ];
    rng.pick(&choices).into_bytes()
}

fn peer_target(rng: &mut Rng, ctx: &Ctx) -> Vec<u8> {
    const HEX: &[&str] = &[
        "",
        "zz",
        "0x1f",
        "-1",
        "+1",
        "g1",
        "1F",
        "ffffffffffffffffff",
        "00000000000000000001f",
        "ffffffffffffffff",
        "é",
        "%31",
        " 1",
        "1 ",
    ];
    const N: &[&str] = &[
        "",
        "-1",
        "+1",
        "0",
        "18446744073709551615",
        "18446744073709551616",
        "99999999999999999999999999",
        "1e3",
        "0x10",
        "1/2",
        "1/",
        " 1",
        "00000000000000000000001",
        "9223372036854775808",
    ];
    let url = ctx.object_url(&ctx.paths[0]);
    let good = ctx.block_target(&url, 0);
    let (chunk, _) = good.trim_start_matches("/peer/v1/block/").split_once('/').expect("two parts");
    let choices = [
        format!("/peer/v1/block/{}/{}", rng.pick(HEX), rng.pick(N)),
        format!("/peer/v1/block/{chunk}/{}", rng.pick(N)),
        format!("/peer/v1/block/{}/0", rng.pick(HEX)),
        "/peer/v1/block/".into(),
        "/peer/v1/block".into(),
        format!("/peer/v2/block/{chunk}/0"),
        format!("{good}?q=1"),
        format!("{good}/"),
        format!("/peer/v1/block/{chunk}//0"),
        "/peer/v1/roster/x".into(),
        "/peer/v1/roster?x=1".into(),
        "/peer".into(),
        "/".into(),
        format!("/dart/{url}"),
        format!("/peer/v1/block/{chunk}/{}", u64::MAX),
    ];
    rng.pick(&choices).into_bytes()
}

fn admin_target(rng: &mut Rng) -> Vec<u8> {
    const CHOICES: &[&str] = &[
        "/healthz?x",
        "/healthz/",
        "/HEALTHZ",
        "/admin/ring",
        "/admin/ring?key=",
        "/admin/ring?key=-1",
        "/admin/ring?key=18446744073709551616",
        "/admin/ring?key=1&n=0",
        "/admin/ring?key=1&n=18446744073709551615",
        "/admin/ring?key=1&n=99999999999999999999",
        "/admin/ring?key=1&key=2",
        "/admin/ring?key=%31",
        "/admin/ring?&&&",
        "/admin/members/x",
        "/metrics%00",
        "/admin/../metrics",
        "/admin/stats?",
        "/admin",
        "/",
        "//healthz",
        "/admin/ring?key=1&n=-1",
    ];
    rng.pick(CHOICES).as_bytes().to_vec()
}

fn range(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    const BAD: &[&str] = &[
        "bytes=0-1,3-4",
        "bytes=99999999999999999999999-",
        "bytes=-0",
        "bytes=--1",
        "bytes=a-b",
        "bits=0-1",
        "bytes= 0-1",
        "bytes=0-18446744073709551616",
        "bytes=-18446744073709551615",
        "bytes=",
        "",
        "bytes=-",
        "bytes=0 - 1",
        "BYTES=0-1",
        "bytes=18446744073709551615-",
        "bytes=1-0",
        "bytes=0-1,",
        "bytes=,0-1",
        "bytes=0-1;bytes=2-3",
        "bytes=0x10-0x20",
        "bytes=+1-2",
        "bytes=1--2",
        "bytes=\u{0}",
        "bytes=é",
    ];
    let value = match rng.below(4) {
        0 => {
            let (a, b) = (rng.below(1 << 20), rng.below(1 << 20));
            format!("bytes={}-{}", a.max(b) + 1, a.min(b))
        }
        1 => {
            let n = rng.between(2, 400);
            let specs: Vec<String> = (0..n).map(|i| format!("{i}-{}", i + 1)).collect();
            format!("bytes={}", specs.join(","))
        }
        _ => rng.pick(BAD).to_string(),
    };
    req.set("Range", value.as_bytes());
    if rng.percent(10) {
        req.add("Range", b"bytes=0-0");
    }
}

fn conditional(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    const NAMES: &[&str] =
        &["If-None-Match", "If-Match", "If-Modified-Since", "If-Unmodified-Since", "If-Range"];
    const VALUES: &[&str] = &[
        "",
        "*",
        "\"",
        "W/",
        "W/\"x\"",
        "\"a\", \"b\"",
        "\"unterminated",
        "Sun, 06 Nov 1994 08:49:37 GMT",
        "Sunday, 06-Nov-94 08:49:37 GMT",
        "Sun Nov  6 08:49:37 1994",
        "Mon, 32 Foo 99999 99:99:99 XYZ",
        "0",
        "-1",
        "18446744073709551616",
        "Thu, 01 Jan 1970 00:00:00 GMT",
        "Fri, 31 Dec 9999 23:59:59 GMT",
        "yesterday",
        "\"é\"",
    ];
    for _ in 0..rng.between(1, 3) {
        let value = if rng.percent(15) {
            rng.bytes_between(1, 64).into_iter().filter(|b| !matches!(b, b'\r' | b'\n')).collect()
        } else {
            rng.pick(VALUES).as_bytes().to_vec()
        };
        req.add(rng.pick(NAMES), &value);
    }
}

fn huge_head(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    match rng.below(3) {
        0 => req.add("X-Pad", &vec![b'p'; rng.between(17 << 10, 40 << 10) as usize]),
        1 => {
            for i in 0..rng.between(101, 2_000) {
                req.add(&format!("X-H{i}"), b"v");
            }
        }
        _ => req.add("X-Pad", &vec![b'p'; rng.between(8 << 10, 15 << 10) as usize]),
    }
}

fn body_framing(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    let (headers, body): (&[(&str, &str)], &[u8]) = match rng.below(12) {
        0 => (&[("Transfer-Encoding", "chunked")], b"5\r\nhello\r\n0\r\n\r\n"),
        1 => (&[("Transfer-Encoding", "chunked")], b"zz\r\nhello\r\n0\r\n\r\n"),
        2 => (&[("Transfer-Encoding", "chunked")], b"ffffffffffffffffff\r\nhello\r\n"),
        3 => (&[("Transfer-Encoding", "chunked")], b"5\r\nhel"),
        4 => (&[("Content-Length", "5")], b"hello"),
        5 => (&[("Content-Length", "-1")], b""),
        6 => (&[("Content-Length", "abc")], b""),
        7 => (&[("Content-Length", "1, 2")], b"x"),
        8 => (&[("Content-Length", "18446744073709551616")], b""),
        9 => (&[("Content-Length", "3"), ("Transfer-Encoding", "chunked")], b"0\r\n\r\n"),
        10 => (&[("Transfer-Encoding", "gzip, chunked")], b"0\r\n\r\n"),
        _ => (&[("Expect", "100-continue"), ("Content-Length", "2")], b"hi"),
    };
    for (name, value) in headers {
        req.add(name, value.as_bytes());
    }
    req.body = body.to_vec();
}

fn header_syntax(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    const LINES: &[&[u8]] = &[
        b"NoColon",
        b" leading-space: x",
        b"Name : x",
        b": empty-name",
        b"Bad\x00Name: x",
        b"Name: val\x00ue",
        b"Name: \xff\xfe",
        b"X-A: a\r\n  continued",
        b"X-B: b\nX-C: c",
        b"X-D: d\r",
        b"\tX-E: e",
        b"X-F:",
        b"X-G:    ",
        b"X-H\x7f: h",
        b"(Bad): x",
        b"X-I: \x01\x02",
    ];
    let at = rng.below(req.headers.len() as u64 + 1) as usize;
    req.headers.insert(at, rng.pick(LINES).to_vec());
}

fn duplicates(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    match rng.below(3) {
        0 => req.remove("host"),
        1 => req.add("Host", b"other.invalid:1"),
        _ => {
            let line = rng.pick(&req.headers);
            req.headers.push(line);
        }
    }
}

fn connection(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    const CHOICES: &[(&str, &str)] = &[
        ("Connection", "close"),
        ("Connection", "keep-alive"),
        ("Connection", "Upgrade"),
        ("Upgrade", "h2c"),
        ("Upgrade", "websocket"),
        ("Connection", "foo, bar, close"),
        ("Keep-Alive", "timeout=99999999999"),
        ("TE", "trailers"),
    ];
    let (name, value) = rng.pick(CHOICES);
    req.add(name, value.as_bytes());
}

fn hop(req: &mut Req, rng: &mut Rng, _: &Ctx) {
    const HOPS: &[&str] = &[
        "",
        "-1",
        "-0",
        "+5",
        "abc",
        " 1",
        "1 ",
        "1.0",
        "0x1",
        "9223372036854775807",
        "9223372036854775808",
        "18446744073709551616",
        "63",
        "64",
        "65",
        "99999999999999999999999",
        "é",
        "1,2",
        "\u{0}",
    ];
    req.set("X-DART-Hop", rng.pick(HOPS).as_bytes());
    if rng.percent(15) {
        req.add("X-DART-Hop", b"0");
    }
}

fn origin(req: &mut Req, rng: &mut Rng, ctx: &Ctx) {
    let o = ctx.origin;
    let choices = [
        String::new(),
        "ftp://127.0.0.1/x".into(),
        "http://".into(),
        "http:///x".into(),
        "http://169.254.169.254/latest/meta-data/".into(),
        "http://127.0.0.1:1/x".into(),
        format!("http://[::1]:{}/x", o.port()),
        format!("https://{o}/x"),
        format!("http://{o}/x?{}", "q".repeat(rng.between(1, 12_000) as usize)),
        format!("http://{o}/%zz"),
        "not a url".into(),
        format!("http://{}/peer/v1/roster", ctx.peer),
        format!("http://{}/dart/http://{o}/x", ctx.client),
        format!("http://{o}/other-object"),
        format!("HTTP://{o}/x"),
        format!("http://{o}@127.0.0.1:1/x"),
    ];
    let value = if rng.percent(5) {
        b"http://127.0.0.1/\xff\xfe".to_vec()
    } else {
        rng.pick(&choices).into_bytes()
    };
    req.set("X-DART-Origin", &value);
}

fn auth(req: &mut Req, rng: &mut Rng, ctx: &Ctx) {
    let now = super::gen::unix_now();
    let hex64 = "ab".repeat(32);
    let value = match rng.below(12) {
        0 => return req.remove("x-dart-auth"),
        1 => String::new(),
        2 => "v1".into(),
        3 => "v1 1 2".into(),
        4 => format!("v2 {now} {hex64}"),
        5 => format!("v1 -1 {hex64}"),
        6 => format!("v1 99999999999999999999 {hex64}"),
        7 => format!("v1 {now} {}", &hex64[1..]),
        8 => format!("v1 {now} {}", "zz".repeat(32)),
        9 => format!("v1  {now} {hex64}"),
        10 => {
            let mut other = req.clone();
            other.sign(if rng.percent(50) { &ctx.other_secret } else { &ctx.secret }, now - 3600);
            return req.set("X-DART-Auth", other.get("x-dart-auth").unwrap_or_default());
        }
        _ => format!("v1 {now} {hex64} extra"),
    };
    req.set("X-DART-Auth", value.as_bytes());
}

fn caller(req: &mut Req, rng: &mut Rng, ctx: &Ctx) {
    let values: [Vec<u8>; 8] = [
        Vec::new(),
        b"bad\x01id".to_vec(),
        vec![b'n'; 300],
        ctx.self_id.clone().into_bytes(),
        b"has space".to_vec(),
        b"\xff".to_vec(),
        vec![b'm'; 10_000],
        b"member-9".to_vec(),
    ];
    let addrs: [&[u8]; 5] = [b"", b"::::", b"127.0.0.1:9", b"not-an-address", b"127.0.0.1:99999"];
    req.set("X-DART-Node", &rng.pick(&values));
    req.set("X-DART-Peer-Addr", rng.pick(&addrs));
}

/// Signs `req` with the cluster secret (after its structural mutations) unless its MAC was
/// the mutation: a signed request reaches the parsers behind the MAC check.
pub fn sign(req: &mut Req, ctx: &Ctx) {
    req.sign(&ctx.secret, super::gen::unix_now());
}

/// A byte-level edit of a serialised request. It may break a URL authority: the plan checks
/// every authority afterwards ([`super::gen::hosts_are_local`]).
pub fn bytes(bytes: &mut Vec<u8>, rng: &mut Rng) -> &'static str {
    match rng.below(5) {
        0 => {
            for _ in 0..rng.between(1, 8) {
                let at = rng.below(bytes.len() as u64) as usize;
                bytes[at] ^= 1 << rng.below(8);
            }
            "flip"
        }
        1 => {
            let at = rng.below(bytes.len() as u64) as usize;
            let junk = rng.bytes_between(1, 64);
            bytes.splice(at..at, junk);
            "insert"
        }
        2 => {
            let at = rng.below(bytes.len() as u64) as usize;
            let len = rng.between(1, 16).min((bytes.len() - at) as u64) as usize;
            bytes.drain(at..at + len);
            "delete"
        }
        3 => {
            let to: &[u8] = rng.pick(&[&b"\n"[..], b"\r", b"\n\r", b"\r\r\n"]);
            *bytes = replace_all(bytes, b"\r\n", to);
            "line-endings"
        }
        _ => {
            let at = rng.below(bytes.len() as u64) as usize;
            let len = rng.between(1, 64).min((bytes.len() - at) as u64) as usize;
            let copy = bytes[at..at + len].to_vec();
            bytes.splice(at..at, copy);
            "repeat"
        }
    }
}

fn replace_all(haystack: &[u8], from: &[u8], to: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}
