//! The registry mirror (spec/node.md §3): which requests under `/v2` are blobs the engine serves,
//! which are proxied to the upstream registry every time, and the digest check of a whole blob.
//!
//! A container runtime (containerd's `hosts.toml`, `skopeo`, Docker's `registry-mirrors`) sends
//! the node the requests it would send the registry. [`Registry::route`] sorts them:
//!
//! - `GET|HEAD /v2/<name>/blobs/<digest>`, where the **percent-decoded** path has a non-empty
//!   `<name>` before its last `/blobs/` and `<digest>` passes [`crate::identity::is_digest`]
//!   (the same rule object identity uses, so the cacheable set and the content-addressed set
//!   are one): a [`Route::Blob`], read through the engine (cache, peers, ranges) from
//!   `upstream + <the client's escaped path>`.
//! - Everything else under `/v2` (the `/v2/` ping, manifests, even by digest, tags, referrers,
//!   blob paths that fail the rule such as upload sessions or an upper-case algorithm): a
//!   [`Route::Proxy`] to `upstream + <the client's exact request-target>`, query included. The
//!   client's escaping is kept: a `%3F` in a repository name stays `%3F` and never becomes a
//!   query (known-bugs: registry mirror).
//! - Anything else: [`Route::NotFound`].
//!
//! Manifests are proxied, not cached, because a tag moves and a manifest by digest is small;
//! the bytes worth sharing between nodes are the layers.
//!
//! The digest check is the integrity check the earlier implementation lacked: a whole-blob read
//! is hashed as it is written (by the transport, off the node machine's thread: [`Hasher`],
//! [`crate::node::Output::Hash`]), which holds the last part back until the node machine has
//! compared the digest with [`expected`]. On a mismatch the node fails the response (the client
//! sees a truncated body, never a complete wrong one) and drops every cached block of the
//! object.

pub mod auth;

use ring::digest;
use thiserror::Error;

use crate::identity::{is_digest, percent_decode_path};

/// Why `--registry` was refused at start-up.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum RegistryError {
    /// Not `http://` or `https://`.
    #[error("registry upstream must start with http:// or https:// (got {0:?})")]
    NotHttp(String),
    /// No host after the scheme.
    #[error("registry upstream has no host (got {0:?})")]
    NoHost(String),
    /// A query, fragment, userinfo or control byte: none of them has a meaning for an upstream
    /// that every request path is appended to (credentials belong in `--registry-auth`).
    #[error("registry upstream must be scheme://host[:port][/path] without userinfo, query or fragment (got {0:?})")]
    Shape(String),
}

/// The upstream registry: `scheme://host[:port]` and an optional path prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Registry {
    /// `scheme://host[:port][/prefix]`, without a trailing `/`.
    base: String,
    /// `host[:port]` as written (the key credentials are looked up by).
    host: String,
}

/// Where a client-plane request goes in registry mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Route {
    /// A blob, served through the engine from `url`.
    Blob {
        /// The upstream URL: the base and the client's escaped path, no query.
        url: String,
        /// The digest from the decoded path, as the client wrote it (the
        /// `Docker-Content-Digest` answer).
        digest: String,
    },
    /// Proxied to `url` on every request.
    Proxy {
        /// The upstream URL: the base and the client's exact request-target.
        url: String,
    },
    /// Not under `/v2`.
    NotFound,
}

impl Registry {
    /// Parses `--registry`: `http(s)://host[:port][/path]`; a trailing `/` is trimmed.
    pub fn new(upstream: &str) -> Result<Self, RegistryError> {
        let scheme = ["http://", "https://"]
            .into_iter()
            .find(|s| upstream.starts_with(s))
            .ok_or_else(|| RegistryError::NotHttp(upstream.to_owned()))?;
        let rest = upstream[scheme.len()..].trim_end_matches('/');
        let trimmed = &upstream[..scheme.len() + rest.len()];
        let host = &rest[..rest.find('/').unwrap_or(rest.len())];
        if host.is_empty() {
            return Err(RegistryError::NoHost(upstream.to_owned()));
        }
        let bad = |b: u8| b <= 0x20 || b == 0x7f || matches!(b, b'?' | b'#');
        if trimmed.bytes().any(bad) || host.contains('@') {
            return Err(RegistryError::Shape(upstream.to_owned()));
        }
        Ok(Registry { base: trimmed.to_owned(), host: host.to_owned() })
    }

    /// `scheme://host[:port][/prefix]`.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// `host[:port]`.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// Sorts a raw request-target (path and query, uncleaned); see the module docs.
    pub fn route(&self, target: &str) -> Route {
        let path = &target[..target.find('?').unwrap_or(target.len())];
        if path != "/v2" && !path.starts_with("/v2/") {
            return Route::NotFound;
        }
        if let Some(digest) = blob_digest(path) {
            return Route::Blob { url: format!("{}{path}", self.base), digest };
        }
        Route::Proxy { url: format!("{}{target}", self.base) }
    }
}

/// The digest of a cacheable blob path (`/v2/<name>/blobs/<digest>` after percent-decoding,
/// anchored at the last `/blobs/`), or `None`.
pub fn blob_digest(path: &str) -> Option<String> {
    let decoded = String::from_utf8(percent_decode_path(path)?).ok()?;
    let rest = decoded.strip_prefix("/v2/")?;
    let anchor = rest.rfind("/blobs/")?;
    let (name, digest) = (&rest[..anchor], &rest[anchor + "/blobs/".len()..]);
    (!name.is_empty() && is_digest(digest)).then(|| digest.to_owned())
}

/// The repository name of a `/v2/...` path: what precedes the last `/blobs/`, else the last
/// `/manifests/`, `/tags/` or `/referrers/` (in that order); `None` for the ping and other
/// paths. The token scope `repository:<name>:pull` is derived from it.
pub fn repository(path: &str) -> Option<&str> {
    let rest = path.strip_prefix("/v2/")?;
    ["/blobs/", "/manifests/", "/tags/", "/referrers/"]
        .iter()
        .find_map(|anchor| rest.rfind(anchor).map(|i| &rest[..i]))
        .filter(|name| !name.is_empty())
}

/// A digest algorithm a node can compute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DigestAlgorithm {
    /// `sha256:`.
    Sha256,
    /// `sha512:`.
    Sha512,
}

/// The algorithm and expected value of `digest` (`algo:hex`, hex in either case); `None` for an
/// algorithm this node cannot compute. A right algorithm with malformed hex expects a value no
/// content has.
pub fn expected(digest: &str) -> Option<(DigestAlgorithm, Vec<u8>)> {
    let (algo, hex) = digest.split_once(':')?;
    let algorithm = match algo {
        "sha256" => DigestAlgorithm::Sha256,
        "sha512" => DigestAlgorithm::Sha512,
        _ => return None,
    };
    Some((algorithm, decode_hex(hex).unwrap_or_default()))
}

/// An incremental digest, for the transport that hashes a checked response's parts as it writes
/// them ([`crate::node::Output::Hash`]).
#[derive(Clone)]
pub struct Hasher(digest::Context);

impl Hasher {
    /// A fresh digest of `algorithm`.
    pub fn new(algorithm: DigestAlgorithm) -> Self {
        Hasher(digest::Context::new(match algorithm {
            DigestAlgorithm::Sha256 => &digest::SHA256,
            DigestAlgorithm::Sha512 => &digest::SHA512,
        }))
    }

    /// Feeds the next bytes.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The digest value of everything fed.
    pub fn finish(self) -> Vec<u8> {
        self.0.finish().as_ref().to_vec()
    }
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hasher")
    }
}

/// The `sha256:<hex>` digest of `data` (what a registry names a blob by).
pub fn sha256_digest(data: &[u8]) -> String {
    sha256_digest_parts([data])
}

/// The `sha256:<hex>` digest of the concatenation of `parts`.
pub fn sha256_digest_parts<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> String {
    let mut context = digest::Context::new(&digest::SHA256);
    for part in parts {
        context.update(part);
    }
    let value = context.finish();
    let mut out = String::with_capacity(7 + 64);
    out.push_str("sha256:");
    for b in value.as_ref() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

fn decode_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests;
