//! The upstream policy: which origins a node may fetch from, so that a node is not an open proxy
//! into its own network (server-side request forgery).
//!
//! It governs every fetch the node makes on someone's behalf: client prefix reads, relays (the
//! `X-DART-Origin` of a peer request) and passthroughs. It is checked twice, with the same rules:
//!
//! - by the node machine before an exchange is sent ([`UpstreamPolicy::check_host`]): a URL whose
//!   host is a literal address, or a name no pattern admits, is refused with no connection at all;
//! - by the shell's dialer after name resolution and before connecting
//!   ([`UpstreamPolicy::check_addr`]), for every resolved address, so a name that resolves (or
//!   rebinds) to a refused address is refused too.
//!
//! The rules, in order:
//!
//! 1. **The node's own listeners** are always refused (a fetch from itself is a loop, or a way
//!    into its admin plane): an address equal to a listener's, or a loopback or unspecified
//!    address on the port of a listener bound to an unspecified address.
//! 2. **Sensitive addresses** are refused unless an allowed CIDR pattern contains the address
//!    (a name pattern never widens them): link-local (`169.254.0.0/16`, `fe80::/10`, where cloud
//!    metadata services live), loopback (`127.0.0.0/8`, `::1`), unspecified, multicast and
//!    broadcast. IPv4-mapped IPv6 addresses are judged as the IPv4 address they carry.
//! 3. **With allow patterns**, only hosts matching one are admitted: an exact host name, a name
//!    suffix (`.example.com` or `*.example.com`: any name below it, not the name itself), or a
//!    CIDR (`10.0.0.0/8`, or a bare address) containing the host's address.
//! 4. **Without allow patterns**, every other address is admitted (private ranges included: an
//!    in-cluster origin is the common case).

use ipnet::IpNet;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

/// One `--allow-upstream` pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// Exactly this host name (lower case).
    Host(String),
    /// Any name ending in this suffix, which starts with a dot (`.example.com`).
    Suffix(String),
    /// Any address in this network.
    Net(IpNet),
}

/// Why a pattern did not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid upstream pattern {pattern:?}: {reason}")]
pub struct PatternError {
    /// The text given.
    pub pattern: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl Pattern {
    /// Whether host name `name` (without a trailing dot) is this host, or ends in this suffix past
    /// its start, compared without regard to ASCII case (patterns are lower case); an address
    /// pattern names no host.
    pub fn matches_name(&self, name: &str) -> bool {
        match self {
            Pattern::Host(h) => h.eq_ignore_ascii_case(name),
            Pattern::Suffix(s) => {
                let (name, s) = (name.as_bytes(), s.as_bytes());
                name.len() > s.len() && name[name.len() - s.len()..].eq_ignore_ascii_case(s)
            }
            Pattern::Net(_) => false,
        }
    }
}

impl FromStr for Pattern {
    type Err = PatternError;

    /// `10.0.0.0/8`, `fd00::/8`, `10.1.2.3`, `[::1]` (an address is a one-address network),
    /// `.example.com` or `*.example.com` (a suffix), `registry.example.com` (a host).
    fn from_str(text: &str) -> Result<Self, PatternError> {
        let error = |reason| PatternError { pattern: text.to_owned(), reason };
        let t = text.trim();
        if t.is_empty() {
            return Err(error("empty"));
        }
        if let Ok(net) = t.parse::<IpNet>() {
            return Ok(Pattern::Net(net.trunc()));
        }
        let bare = t.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = bare.parse::<IpAddr>() {
            return Ok(Pattern::Net(IpNet::from(canonical(ip))));
        }
        if t.contains('/') {
            return Err(error("not a CIDR network"));
        }
        let name = t.to_ascii_lowercase();
        let (suffix, name) = match name.strip_prefix("*.") {
            Some(rest) => (true, format!(".{rest}")),
            None => (name.starts_with('.'), name),
        };
        let labels = name.trim_start_matches('.');
        let valid = !labels.is_empty()
            && labels.len() <= 253
            && labels.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            });
        if !valid {
            return Err(error("not a host name, a .suffix or a CIDR network"));
        }
        Ok(if suffix { Pattern::Suffix(name) } else { Pattern::Host(name) })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pattern::Host(h) | Pattern::Suffix(h) => f.write_str(h),
            Pattern::Net(n) => write!(f, "{n}"),
        }
    }
}

/// Why an upstream was refused; each is a label of the refusal metric.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Refusal {
    /// One of this node's own listeners.
    OwnListener,
    /// A link-local address (cloud metadata services).
    LinkLocal,
    /// A loopback address.
    Loopback,
    /// An unspecified, multicast or broadcast address.
    NotUnicast,
    /// No allow pattern admits the host.
    NotAllowed,
    /// The URL has no usable host.
    BadHost,
}

impl Refusal {
    /// Every reason, in label order.
    pub const ALL: [Refusal; 6] = [
        Refusal::OwnListener,
        Refusal::LinkLocal,
        Refusal::Loopback,
        Refusal::NotUnicast,
        Refusal::NotAllowed,
        Refusal::BadHost,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::OwnListener => "own_listener",
            Refusal::LinkLocal => "link_local",
            Refusal::Loopback => "loopback",
            Refusal::NotUnicast => "not_unicast",
            Refusal::NotAllowed => "not_allowed",
            Refusal::BadHost => "bad_host",
        }
    }

    /// Parses a [`Refusal::label`].
    pub fn from_label(label: &str) -> Option<Refusal> {
        Refusal::ALL.into_iter().find(|r| r.label() == label)
    }

    /// A sentence for the 403 body.
    pub fn explain(self) -> &'static str {
        match self {
            Refusal::OwnListener => "the upstream is one of this node's own listeners",
            Refusal::LinkLocal => {
                "the upstream is a link-local address (metadata services); allow it with an \
                 explicit --allow-upstream CIDR"
            }
            Refusal::Loopback => {
                "the upstream is a loopback address; allow it with an explicit --allow-upstream CIDR"
            }
            Refusal::NotUnicast => "the upstream is not a unicast address",
            Refusal::NotAllowed => "no --allow-upstream pattern admits the upstream",
            Refusal::BadHost => "the upstream URL has no usable host",
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// The policy: allow patterns and the node's own listeners.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UpstreamPolicy {
    allow: Vec<Pattern>,
    listeners: Vec<SocketAddr>,
}

/// IPv4-mapped IPv6 addresses as the IPv4 address they carry.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

fn sensitive(ip: IpAddr) -> Option<Refusal> {
    match ip {
        IpAddr::V4(v4) => {
            if v4.is_link_local() {
                Some(Refusal::LinkLocal)
            } else if v4.is_loopback() {
                Some(Refusal::Loopback)
            } else if v4.is_unspecified() || v4.is_multicast() || v4.is_broadcast() {
                Some(Refusal::NotUnicast)
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if (v6.segments()[0] & 0xffc0) == 0xfe80 {
                Some(Refusal::LinkLocal)
            } else if v6.is_loopback() {
                Some(Refusal::Loopback)
            } else if v6.is_unspecified() || v6.is_multicast() {
                Some(Refusal::NotUnicast)
            } else {
                None
            }
        }
    }
}

/// A URL host as a name (lower case, no brackets) or an address.
enum Host {
    Name(String),
    Addr(IpAddr),
}

fn parse_host(host: &str) -> Option<Host> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    if bare.is_empty() {
        return None;
    }
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some(Host::Addr(canonical(ip)));
    }
    // Forms `getaddrinfo` would read as an IPv4 address (`2130706433`, `0x7f.1`, `127.1`) are
    // refused outright: a name must not be able to smuggle an address past the name checks.
    let numeric = bare.split('.').all(|l| {
        let l = l.strip_prefix("0x").or_else(|| l.strip_prefix("0X")).unwrap_or(l);
        !l.is_empty() && l.bytes().all(|b| b.is_ascii_hexdigit())
    }) && bare.bytes().next().is_some_and(|b| b.is_ascii_digit());
    if numeric {
        return None;
    }
    Some(Host::Name(bare.trim_end_matches('.').to_ascii_lowercase()))
}

impl UpstreamPolicy {
    /// A policy with `allow` patterns (none: admit every address but the sensitive ones) that
    /// refuses `listeners`, the node's own bound addresses.
    pub fn new(allow: Vec<Pattern>, listeners: Vec<SocketAddr>) -> Self {
        UpstreamPolicy { allow, listeners }
    }

    /// The allow patterns.
    pub fn allow(&self) -> &[Pattern] {
        &self.allow
    }

    /// Adds the node's own listener `addr` (learned once it is bound).
    pub fn add_listener(&mut self, addr: SocketAddr) {
        if !self.listeners.contains(&addr) {
            self.listeners.push(addr);
        }
    }

    fn own_listener(&self, addr: SocketAddr) -> bool {
        let ip = canonical(addr.ip());
        self.listeners.iter().any(|l| {
            l.port() == addr.port()
                && (canonical(l.ip()) == ip
                    || (l.ip().is_unspecified() && (ip.is_loopback() || ip.is_unspecified())))
        })
    }

    fn explicitly_allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|p| matches!(p, Pattern::Net(n) if n.contains(&ip)))
    }

    fn name_allowed(&self, name: &str) -> bool {
        self.allow.iter().any(|p| p.matches_name(name))
    }

    /// The check before any connection, by the URL's host and port: a literal address is judged
    /// as [`Self::check_addr`] judges it; a name is refused when allow patterns exist and none
    /// admits it by name or could admit it by address (a CIDR pattern defers the name to the
    /// dial-time check of what it resolves to).
    pub fn check_host(&self, host: &str, port: u16) -> Result<(), Refusal> {
        match parse_host(host).ok_or(Refusal::BadHost)? {
            Host::Addr(ip) => self.check_ip(None, SocketAddr::new(ip, port)),
            Host::Name(name) => {
                if name == "localhost" || name.ends_with(".localhost") {
                    // RFC 6761: always loopback, whatever a resolver says.
                    return self.check_ip(None, SocketAddr::new(Ipv4Addr::LOCALHOST.into(), port));
                }
                let any_net = self.allow.iter().any(|p| matches!(p, Pattern::Net(_)));
                if self.allow.is_empty() || any_net || self.name_allowed(&name) {
                    Ok(())
                } else {
                    Err(Refusal::NotAllowed)
                }
            }
        }
    }

    /// The check at dial time, for every address `host` resolved to, before connecting.
    pub fn check_addr(&self, host: &str, addr: SocketAddr) -> Result<(), Refusal> {
        let name = match parse_host(host) {
            Some(Host::Name(n)) => Some(n),
            Some(Host::Addr(_)) => None,
            None => return Err(Refusal::BadHost),
        };
        self.check_ip(name.as_deref(), addr)
    }

    fn check_ip(&self, name: Option<&str>, addr: SocketAddr) -> Result<(), Refusal> {
        let ip = canonical(addr.ip());
        if self.own_listener(SocketAddr::new(ip, addr.port())) {
            return Err(Refusal::OwnListener);
        }
        if let Some(refusal) = sensitive(ip) {
            return if self.explicitly_allowed(ip) { Ok(()) } else { Err(refusal) };
        }
        if self.allow.is_empty()
            || self.explicitly_allowed(ip)
            || name.is_some_and(|n| self.name_allowed(n))
        {
            Ok(())
        } else {
            Err(Refusal::NotAllowed)
        }
    }
}

/// The host and port a `http://` or `https://` URL names (userinfo skipped, brackets kept off an
/// IPv6 host), as the shell's dialer reads them; `None` for any other URL.
pub fn url_host_port(url: &str) -> Option<(&str, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let default_port = if scheme.eq_ignore_ascii_case("http") {
        80
    } else if scheme.eq_ignore_ascii_case("https") {
        443
    } else {
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(v6) = host_port.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        (host, after.strip_prefix(':'))
    } else {
        match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        }
    };
    let port = match port {
        None | Some("") => default_port,
        Some(p) => p.parse().ok()?,
    };
    (!host.is_empty()).then_some((host, port))
}

/// The loopback networks, for tests and demos that widen the policy to loopback origins.
pub fn loopback_patterns() -> Vec<Pattern> {
    vec![
        Pattern::Net("127.0.0.0/8".parse().expect("a CIDR")),
        Pattern::Net(IpNet::from(IpAddr::V6(Ipv6Addr::LOCALHOST))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Pattern {
        s.parse().expect("pattern")
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn patterns_parse_as_networks_suffixes_and_hosts() {
        assert_eq!(p("10.0.0.0/8"), Pattern::Net("10.0.0.0/8".parse().expect("net")));
        assert_eq!(p("10.1.2.3/8"), Pattern::Net("10.0.0.0/8".parse().expect("net")));
        assert_eq!(p("10.1.2.3"), Pattern::Net("10.1.2.3/32".parse().expect("net")));
        assert_eq!(p("[::1]"), Pattern::Net("::1/128".parse().expect("net")));
        assert_eq!(p(".Example.com"), Pattern::Suffix(".example.com".into()));
        assert_eq!(p("*.example.com"), Pattern::Suffix(".example.com".into()));
        assert_eq!(p("Registry.example.com"), Pattern::Host("registry.example.com".into()));
        for bad in ["", "10.0.0.0/33", "a..b", "exa mple.com", "*.", "foo/bar", "-/"] {
            assert!(bad.parse::<Pattern>().is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn by_default_metadata_loopback_and_own_listeners_are_refused_and_the_rest_admitted() {
        let policy = UpstreamPolicy::new(vec![], vec![sa("0.0.0.0:8080"), sa("10.0.0.5:9000")]);
        let check = |h: &str, a: &str| policy.check_addr(h, sa(a));
        assert_eq!(check("metadata", "169.254.169.254:80"), Err(Refusal::LinkLocal));
        assert_eq!(check("x", "[fe80::1]:80"), Err(Refusal::LinkLocal));
        assert_eq!(check("x", "[::ffff:169.254.169.254]:80"), Err(Refusal::LinkLocal));
        assert_eq!(check("x", "127.0.0.2:80"), Err(Refusal::Loopback));
        assert_eq!(check("x", "[::1]:80"), Err(Refusal::Loopback));
        assert_eq!(check("x", "127.0.0.1:8080"), Err(Refusal::OwnListener));
        assert_eq!(check("x", "10.0.0.5:9000"), Err(Refusal::OwnListener));
        assert_eq!(check("x", "0.0.0.0:80"), Err(Refusal::NotUnicast));
        assert_eq!(check("x", "224.0.0.1:80"), Err(Refusal::NotUnicast));
        assert_eq!(check("x", "10.0.0.5:80"), Ok(()));
        assert_eq!(check("x", "93.184.216.34:443"), Ok(()));
        assert_eq!(policy.check_host("169.254.169.254", 80), Err(Refusal::LinkLocal));
        assert_eq!(policy.check_host("[::1]", 80), Err(Refusal::Loopback));
        assert_eq!(policy.check_host("localhost", 80), Err(Refusal::Loopback));
        assert_eq!(policy.check_host("a.localhost.", 80), Err(Refusal::Loopback));
        assert_eq!(policy.check_host("2130706433", 80), Err(Refusal::BadHost));
        assert_eq!(policy.check_host("0x7f.1", 80), Err(Refusal::BadHost));
        assert_eq!(policy.check_host("", 80), Err(Refusal::BadHost));
        assert_eq!(policy.check_host("origin.internal", 80), Ok(()));
    }

    #[test]
    fn only_an_explicit_network_widens_a_sensitive_address() {
        let policy = UpstreamPolicy::new(vec![p("127.0.0.1"), p(".example.com")], vec![]);
        assert_eq!(policy.check_addr("x", sa("127.0.0.1:80")), Ok(()));
        assert_eq!(policy.check_addr("x", sa("127.0.0.2:80")), Err(Refusal::Loopback));
        assert_eq!(
            policy.check_addr("evil.example.com", sa("169.254.169.254:80")),
            Err(Refusal::LinkLocal),
            "a name pattern never admits a sensitive address"
        );
        let own = UpstreamPolicy::new(vec![p("127.0.0.0/8")], vec![sa("127.0.0.1:8080")]);
        assert_eq!(own.check_addr("x", sa("127.0.0.1:8080")), Err(Refusal::OwnListener));
    }

    #[test]
    fn allow_patterns_admit_hosts_by_name_suffix_and_network() {
        let policy = UpstreamPolicy::new(
            vec![p("registry.io"), p(".blobs.example.com"), p("10.0.0.0/8")],
            vec![],
        );
        let check = |h: &str, a: &str| policy.check_addr(h, sa(a));
        assert_eq!(check("registry.io", "1.2.3.4:443"), Ok(()));
        assert_eq!(check("a.blobs.example.com", "1.2.3.4:443"), Ok(()));
        assert_eq!(check("blobs.example.com", "1.2.3.4:443"), Err(Refusal::NotAllowed));
        assert_eq!(check("xblobs.example.com", "1.2.3.4:443"), Err(Refusal::NotAllowed));
        assert_eq!(check("anything", "10.9.9.9:80"), Ok(()), "admitted by address");
        assert_eq!(check("other.io", "1.2.3.4:443"), Err(Refusal::NotAllowed));
        assert_eq!(policy.check_host("other.io", 443), Ok(()), "a CIDR defers names to dial");
        let names = UpstreamPolicy::new(vec![p("registry.io")], vec![]);
        assert_eq!(names.check_host("other.io", 443), Err(Refusal::NotAllowed));
        assert_eq!(names.check_host("REGISTRY.io.", 443), Ok(()));
        assert_eq!(names.check_host("10.0.0.1", 443), Err(Refusal::NotAllowed));
    }

    #[test]
    fn urls_name_their_host_and_port_past_any_userinfo() {
        assert_eq!(url_host_port("http://origin/o"), Some(("origin", 80)));
        assert_eq!(url_host_port("HTTPS://origin:8443?x"), Some(("origin", 8443)));
        assert_eq!(url_host_port("http://a.com@169.254.169.254/"), Some(("169.254.169.254", 80)));
        assert_eq!(url_host_port("http://u:p@[::1]:81/x"), Some(("::1", 81)));
        assert_eq!(url_host_port("http://h:/x"), Some(("h", 80)));
        assert_eq!(url_host_port("http://h:99999/"), None);
        assert_eq!(url_host_port("ftp://h/"), None);
        assert_eq!(url_host_port("http:///x"), None);
    }

    #[test]
    fn refusal_labels_round_trip() {
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_label(r.label()), Some(r));
            assert!(!r.explain().is_empty());
        }
    }
}
