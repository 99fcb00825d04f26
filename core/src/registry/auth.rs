//! Upstream registry credentials (`--registry-auth`, spec/node.md §3): what an origin exchange
//! carries, what a `401` leads to, and the token cache. Pure: time comes in as [`Instant`], and
//! the I/O (the exchange, the token request, the singleflight) is the driver's
//! ([`AuthPlan`] says what to do next; the tokio shell's origin client carries it out).
//!
//! # The rules
//!
//! - **Whose credential.** Only a host in the map (`host[:port]`, exactly as in the URL) gets
//!   the operator's credential. A CDN or any other host gets nothing; a redirect target is
//!   another host.
//! - **The client's wins.** A request that carries the client's own `Authorization` is sent
//!   as it is, never given a cached token, never retried after a `401`: its `401` is the
//!   client's to answer.
//! - **The exchange.** A request to a credentialed host goes out with the cached bearer token of
//!   its (host, scope) if one is fresh, else with Basic (the host's credential). On a `401`
//!   with `WWW-Authenticate: Bearer realm=…,service=…,scope=…` the realm is asked (any host:
//!   the realm is trusted as the registry delivered it) with Basic and `service`/`scope` query
//!   parameters, the answer's `token` (or `access_token`) and `expires_in` (absent or ≤ 0:
//!   60 s) are cached, and the request is retried once with `Bearer`. A `Basic` (or other)
//!   challenge to a request that did not carry Basic is retried once with Basic. If the retry is
//!   refused too, the registry's first `401` is the answer.
//! - **The scope** is derived from the request path, not taken from the challenge:
//!   `repository:<name>:pull` (see [`super::repository`]); empty for `/v2/`. The token request
//!   asks for the advertised scope when there is one, else the derived one. The cache key is
//!   `host|derived scope`, so a registry that advertises something odd cannot make one
//!   repository's token serve another's requests.
//! - **The cache.** A token is not used within 30 s of its expiry. A token the registry refused
//!   is dropped only if the entry still holds that value (a fresher one may have replaced it).
//!   At most 1024 entries: when full, expired entries are swept, and if it is still full it is
//!   emptied.

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use thiserror::Error;

use crate::time::Instant;

/// At most this many cached tokens.
pub const TOKEN_CACHE_MAX: usize = 1024;
/// A token is not used this close to its expiry.
pub const EXPIRY_MARGIN: Duration = Duration::from_secs(30);
/// A token whose answer names no usable lifetime lives this long.
pub const DEFAULT_TOKEN_TTL: Duration = Duration::from_secs(60);
/// The token exchange's bound (it runs detached from the request that started it).
pub const TOKEN_EXCHANGE_BOUND: Duration = Duration::from_secs(60);
/// Longest token answer read.
pub const TOKEN_BODY_MAX: usize = 64 << 10;

/// Why a credentials file was refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CredentialsError {
    /// Not a JSON object of objects with string fields.
    #[error("registry credentials must be a JSON object {{\"host[:port]\": {{\"username\": .., \"password\": ..}}}}: {0}")]
    Json(String),
    /// An empty host key.
    #[error("registry credentials: an empty host key")]
    EmptyHost,
    /// An entry with neither field.
    #[error("registry credentials for {0:?} have neither username nor password")]
    Empty(String),
}

/// One host's credential.
#[derive(Clone, PartialEq, Eq)]
pub struct Basic {
    /// `Basic <base64(username:password)>`.
    header: String,
}

impl Basic {
    /// The credential of `username` and `password`.
    pub fn new(username: &str, password: &str) -> Self {
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
        Basic { header: format!("Basic {encoded}") }
    }

    /// The `Authorization` value.
    pub fn header(&self) -> &str {
        &self.header
    }
}

impl std::fmt::Debug for Basic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Basic(<redacted>)")
    }
}

/// The operator's credentials by registry host.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credentials {
    by_host: BTreeMap<String, Basic>,
}

impl Credentials {
    /// Parses `{"<host[:port]>": {"username": "..", "password": ".."}}`. Keys match a URL's
    /// host (and port) exactly; an empty key or an entry with neither field is an error.
    pub fn from_json(text: &[u8]) -> Result<Self, CredentialsError> {
        #[derive(serde::Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Entry {
            #[serde(default)]
            username: Option<String>,
            #[serde(default)]
            password: Option<String>,
        }
        let map: BTreeMap<String, Entry> =
            serde_json::from_slice(text).map_err(|e| CredentialsError::Json(e.to_string()))?;
        let mut by_host = BTreeMap::new();
        for (host, entry) in map {
            if host.is_empty() {
                return Err(CredentialsError::EmptyHost);
            }
            if entry.username.is_none() && entry.password.is_none() {
                return Err(CredentialsError::Empty(host));
            }
            let basic = Basic::new(
                entry.username.as_deref().unwrap_or_default(),
                entry.password.as_deref().unwrap_or_default(),
            );
            by_host.insert(host.to_ascii_lowercase(), basic);
        }
        Ok(Credentials { by_host })
    }

    /// The credential of `host` (`host[:port]` as the URL writes it), if any.
    pub fn for_host(&self, host: &str) -> Option<&Basic> {
        self.by_host.get(&host.to_ascii_lowercase())
    }

    /// The hosts with a credential.
    pub fn hosts(&self) -> impl Iterator<Item = &str> {
        self.by_host.keys().map(String::as_str)
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.by_host.is_empty()
    }
}

/// `host[:port]` and the path of an absolute `http(s)://` URL, or `None`.
pub fn host_and_path(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"))?;
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let host = &rest[..end];
    let authority = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let tail = &rest[end..];
    let path = &tail[..tail.find(['?', '#']).unwrap_or(tail.len())];
    Some((authority, if path.is_empty() { "/" } else { path }))
}

/// The token scope a request path needs: `repository:<name>:pull`, or empty.
pub fn scope_for(path: &str) -> String {
    super::repository(path).map(|name| format!("repository:{name}:pull")).unwrap_or_default()
}

/// A parsed `WWW-Authenticate` challenge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Challenge {
    /// The scheme, lower-cased (`bearer`, `basic`, ...).
    pub scheme: String,
    /// Its parameters, names lower-cased, values unquoted.
    pub params: BTreeMap<String, String>,
}

impl Challenge {
    /// Parses one challenge: `<scheme> name=value, name="quoted, value"`. Parameters are split
    /// on commas outside quotes; `None` without a scheme.
    pub fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, rest) = header.split_once(' ').unwrap_or((header, ""));
        if scheme.is_empty() {
            return None;
        }
        let mut params = BTreeMap::new();
        for part in split_outside_quotes(rest) {
            let Some((name, value)) = part.split_once('=') else { continue };
            let value = value.trim();
            let value = match value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\\\"", "\"").replace("\\\\", "\\"),
                None => value.to_owned(),
            };
            params.insert(name.trim().to_ascii_lowercase(), value);
        }
        Some(Challenge { scheme: scheme.to_ascii_lowercase(), params })
    }

    /// A bearer challenge with a realm.
    pub fn is_bearer(&self) -> bool {
        self.scheme == "bearer" && self.params.get("realm").is_some_and(|r| !r.is_empty())
    }

    /// The token request URL: the realm with `service` and `scope` (the advertised scope when
    /// there is one, else `derived`; neither when both are empty). `None` for a realm that is
    /// not `http(s)://`.
    pub fn token_url(&self, derived: &str) -> Option<String> {
        let realm = self.params.get("realm")?;
        host_and_path(realm)?;
        let mut url = realm.clone();
        let mut sep = if realm.contains('?') { '&' } else { '?' };
        if let Some(service) = self.params.get("service").filter(|s| !s.is_empty()) {
            url.push(sep);
            url.push_str("service=");
            url.push_str(&query_escape(service));
            sep = '&';
        }
        let scope = self.params.get("scope").map(String::as_str).filter(|s| !s.is_empty());
        if let Some(scope) = scope.or((!derived.is_empty()).then_some(derived)) {
            url.push(sep);
            url.push_str("scope=");
            url.push_str(&query_escape(scope));
        }
        Some(url)
    }
}

fn split_outside_quotes(s: &str) -> Vec<&str> {
    let (mut parts, mut start, mut quoted, mut escaped) = (Vec::new(), 0, false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ',' if !quoted => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts.into_iter().map(str::trim).filter(|p| !p.is_empty()).collect()
}

/// Percent-encodes a query value (everything but RFC 3986 unreserved characters).
fn query_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A token answer: `{"token": ..}` or `{"access_token": ..}`, with `expires_in` seconds.
pub fn parse_token(body: &[u8]) -> Option<(String, Duration)> {
    #[derive(serde::Deserialize)]
    struct Answer {
        #[serde(default)]
        token: Option<String>,
        #[serde(default)]
        access_token: Option<String>,
        #[serde(default)]
        expires_in: Option<i64>,
    }
    let a: Answer = serde_json::from_slice(body).ok()?;
    let token = a.token.filter(|t| !t.is_empty()).or(a.access_token.filter(|t| !t.is_empty()))?;
    let ttl = match a.expires_in {
        Some(s) if s > 0 => Duration::from_secs(s.unsigned_abs()),
        _ => DEFAULT_TOKEN_TTL,
    };
    Some((token, ttl))
}

/// The bounded cache of bearer tokens by `host|scope`.
#[derive(Clone, Debug, Default)]
pub struct TokenCache {
    entries: BTreeMap<String, (String, Instant)>,
}

/// A token cache key.
pub fn token_key(host: &str, scope: &str) -> String {
    format!("{}|{scope}", host.to_ascii_lowercase())
}

impl TokenCache {
    /// A fresh token for `key` (not within [`EXPIRY_MARGIN`] of its expiry).
    pub fn get(&self, key: &str, now: Instant) -> Option<&str> {
        let (token, expires) = self.entries.get(key)?;
        (now.saturating_add(EXPIRY_MARGIN) < *expires).then_some(token.as_str())
    }

    /// Stores `token` for `key`, valid for `ttl` from `now`.
    pub fn put(&mut self, key: &str, token: String, ttl: Duration, now: Instant) {
        if !self.entries.contains_key(key) && self.entries.len() >= TOKEN_CACHE_MAX {
            self.entries.retain(|_, (_, expires)| now.saturating_add(EXPIRY_MARGIN) < *expires);
            if self.entries.len() >= TOKEN_CACHE_MAX {
                self.entries.clear();
            }
        }
        self.entries.insert(key.to_owned(), (token, now.saturating_add(ttl)));
    }

    /// Drops `key`'s token if it is still `rejected` (a fresher token stays).
    pub fn drop_if(&mut self, key: &str, rejected: &str) {
        if self.entries.get(key).is_some_and(|(t, _)| t == rejected) {
            self.entries.remove(key);
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none are held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// What an origin exchange carries, decided before it is sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credential {
    /// Nothing of the operator's: the host has no credential, or the client sent its own.
    None,
    /// The host's Basic credential.
    Basic(String),
    /// A cached bearer token.
    Bearer(String),
}

impl Credential {
    /// The `Authorization` value, if any.
    pub fn header(&self) -> Option<String> {
        match self {
            Credential::None => None,
            Credential::Basic(h) => Some(h.clone()),
            Credential::Bearer(t) => Some(format!("Bearer {t}")),
        }
    }
}

/// The decisions of one origin exchange to a registry with credentials.
#[derive(Clone, Debug)]
pub struct AuthPlan {
    host: String,
    key: String,
    scope: String,
    basic: Option<Basic>,
    client_authorized: bool,
    retried: bool,
}

/// What to do with a `401`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OnUnauthorized {
    /// Answer it as it is.
    Answer,
    /// Retry once with this credential (Basic).
    Retry(Credential),
    /// Get a token from this URL with this `Authorization` (Basic), keyed `key` (singleflight
    /// and cache), then retry once with it.
    Exchange {
        /// The token request URL.
        url: String,
        /// Its `Authorization`.
        authorization: String,
        /// The cache and singleflight key.
        key: String,
    },
}

impl AuthPlan {
    /// The plan for `url` (an origin exchange) when the client did or did not send its own
    /// `Authorization`; `None` when the operator has no credential for its host.
    pub fn new(credentials: &Credentials, url: &str, client_authorized: bool) -> Option<Self> {
        let (host, path) = host_and_path(url)?;
        let basic = credentials.for_host(host)?.clone();
        let scope = scope_for(path);
        Some(AuthPlan {
            host: host.to_owned(),
            key: token_key(host, &scope),
            scope,
            basic: Some(basic),
            client_authorized,
            retried: false,
        })
    }

    /// The credential the first attempt carries.
    pub fn first(&self, cache: &TokenCache, now: Instant) -> Credential {
        if self.client_authorized {
            return Credential::None;
        }
        match cache.get(&self.key, now) {
            Some(token) => Credential::Bearer(token.to_owned()),
            None => self
                .basic
                .as_ref()
                .map_or(Credential::None, |b| Credential::Basic(b.header().to_owned())),
        }
    }

    /// The cache and singleflight key (`host|scope`).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The host.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// A `401` answered the attempt that carried `sent` with `challenge`: what next. A refused
    /// cached token is dropped (if the entry still holds it). At most one retry.
    pub fn on_unauthorized(
        &mut self,
        sent: &Credential,
        challenge: Option<&str>,
        cache: &mut TokenCache,
    ) -> OnUnauthorized {
        if let Credential::Bearer(token) = sent {
            cache.drop_if(&self.key, token);
        }
        if self.client_authorized || self.retried {
            return OnUnauthorized::Answer;
        }
        self.retried = true;
        let Some(basic) = self.basic.as_ref() else { return OnUnauthorized::Answer };
        match challenge.and_then(Challenge::parse) {
            Some(c) if c.is_bearer() => match c.token_url(&self.scope) {
                Some(url) => OnUnauthorized::Exchange {
                    url,
                    authorization: basic.header().to_owned(),
                    key: self.key.clone(),
                },
                None => OnUnauthorized::Answer,
            },
            _ if matches!(sent, Credential::Basic(_)) => OnUnauthorized::Answer,
            _ => OnUnauthorized::Retry(Credential::Basic(basic.header().to_owned())),
        }
    }
}

#[cfg(test)]
mod tests;
