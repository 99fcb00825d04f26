//! The outbound HTTP/1.1 client: keep-alive connections pooled per (scheme, host, port) over the
//! seam's dialer, spoken with hyper's low-level connection API. It has no timeouts of its own: the
//! node machine bounds every exchange with its timers and cancels what runs too long, which drops
//! the connection.

use crate::seam::{dial_maybe_tls, DialError, Dialer};
use bytes::Bytes;
use dart_core::policy::UpstreamPolicy;
use http_body_util::Full;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A connection pool's key.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PoolKey {
    /// TLS (an `https://` origin).
    pub https: bool,
    /// Host name or address, without brackets.
    pub host: String,
    /// Port.
    pub port: u16,
    /// An origin connection: dialed under the upstream policy, never shared with peer
    /// connections.
    pub origin: bool,
}

/// Where a request goes: the pool key, the `Host` header and the origin-form target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The connection pool.
    pub key: PoolKey,
    /// The `Host` header value.
    pub authority: String,
    /// Path and query.
    pub path_and_query: String,
}

/// Parses an absolute `http://` or `https://` URL into a [`Target`].
pub fn parse_target(url: &str) -> Result<Target, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("invalid URL: {e}"))?;
    let https = match uri.scheme_str() {
        Some("http") => false,
        Some("https") => true,
        _ => return Err("the URL must be http:// or https://".into()),
    };
    let authority = uri.authority().ok_or("the URL has no host")?;
    let host = authority.host().trim_start_matches('[').trim_end_matches(']').to_owned();
    if host.is_empty() {
        return Err("the URL has no host".into());
    }
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    let path_and_query = uri.path_and_query().map_or("/", |pq| pq.as_str()).to_owned();
    Ok(Target {
        key: PoolKey { https, host, port, origin: false },
        authority: authority.as_str().to_owned(),
        path_and_query,
    })
}

struct Idle {
    sender: SendRequest<Full<Bytes>>,
    since: tokio::time::Instant,
}

type Pools = BTreeMap<PoolKey, Vec<Idle>>;

/// The pooled client; cheap to clone.
pub struct HttpClient<D: Dialer> {
    dialer: D,
    policy: Option<Arc<UpstreamPolicy>>,
    tls: Option<tokio_rustls::TlsConnector>,
    idle: Arc<Mutex<Pools>>,
    idle_per_host: usize,
    idle_timeout: Duration,
    /// The registry credentials origin exchanges carry ([`crate::registry_auth`]).
    auth: Option<Arc<crate::registry_auth::RegistryAuth>>,
}

impl<D: Dialer> Clone for HttpClient<D> {
    fn clone(&self) -> Self {
        HttpClient {
            dialer: self.dialer.clone(),
            policy: self.policy.clone(),
            tls: self.tls.clone(),
            idle: self.idle.clone(),
            idle_per_host: self.idle_per_host,
            idle_timeout: self.idle_timeout,
            auth: self.auth.clone(),
        }
    }
}

impl<D: Dialer> HttpClient<D> {
    /// A client dialing through `dialer`, speaking TLS to `https://` targets when `tls` is given,
    /// keeping at most `idle_per_host` idle connections per pool for at most `idle_timeout`.
    pub fn new(
        dialer: D,
        tls: Option<Arc<rustls::ClientConfig>>,
        idle_per_host: usize,
        idle_timeout: Duration,
    ) -> Self {
        HttpClient {
            dialer,
            policy: None,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            idle: Arc::new(Mutex::new(BTreeMap::new())),
            idle_per_host,
            idle_timeout,
            auth: None,
        }
    }

    /// Origin exchanges to the hosts in `credentials` carry them (`--registry-auth`).
    pub fn with_registry_auth(
        mut self,
        credentials: dart_core::registry::auth::Credentials,
    ) -> Self {
        self.auth = Some(Arc::new(crate::registry_auth::RegistryAuth::new(credentials)));
        self
    }

    /// The registry credentials' state, if any.
    pub fn registry_auth(&self) -> Option<&Arc<crate::registry_auth::RegistryAuth>> {
        self.auth.as_ref()
    }

    /// The dialer (and its resolver).
    pub fn dialer(&self) -> &D {
        &self.dialer
    }

    /// Dials origin connections ([`PoolKey::origin`]) under `policy`.
    pub fn with_policy(mut self, policy: UpstreamPolicy) -> Self {
        self.policy = Some(Arc::new(policy));
        self
    }

    /// A connection ready to send: a pooled one if any is alive (`true`: reused), else a fresh
    /// dial. Unbounded: the caller's timers bound it.
    pub async fn connect(
        &self,
        key: &PoolKey,
    ) -> Result<(SendRequest<Full<Bytes>>, bool), DialError> {
        if let Some(sender) = self.take_idle(key) {
            return Ok((sender, true));
        }
        self.dial(key).await.map(|s| (s, false))
    }

    /// A fresh connection, never a pooled one.
    pub async fn dial(&self, key: &PoolKey) -> Result<SendRequest<Full<Bytes>>, DialError> {
        let policy = if key.origin { self.policy.as_deref() } else { None };
        let (host, port, https) = (&key.host, key.port, key.https);
        let stream =
            dial_maybe_tls(&self.dialer, self.tls.as_ref(), host, port, https, policy).await?;
        let (sender, conn) = hyper::client::conn::http1::Builder::new()
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| DialError::Io(std::io::Error::other(e)))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(sender)
    }

    fn take_idle(&self, key: &PoolKey) -> Option<SendRequest<Full<Bytes>>> {
        let mut pools = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let idle = pools.get_mut(key)?;
        while let Some(conn) = idle.pop() {
            let fresh = conn.since.elapsed() < self.idle_timeout;
            if fresh && conn.sender.is_ready() {
                return Some(conn.sender);
            }
        }
        None
    }

    /// Hands back a connection whose response was read to its end; it rejoins the pool once
    /// hyper has it ready for the next request (a closed one is dropped).
    pub fn release(&self, key: PoolKey, mut sender: SendRequest<Full<Bytes>>) {
        let idle = self.idle.clone();
        let cap = self.idle_per_host;
        tokio::spawn(async move {
            if sender.ready().await.is_err() {
                return;
            }
            let mut pools = idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            let list = pools.entry(key).or_default();
            if list.len() < cap {
                list.push(Idle { sender, since: tokio::time::Instant::now() });
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_keep_the_query_and_default_the_port() {
        let t = parse_target("https://reg.example/v2/x?sig=1").expect("target");
        assert_eq!(
            t.key,
            PoolKey { https: true, host: "reg.example".into(), port: 443, origin: false }
        );
        assert_eq!(
            (t.authority.as_str(), t.path_and_query.as_str()),
            ("reg.example", "/v2/x?sig=1")
        );
        let t = parse_target("http://[::1]:9000/peer/v1/roster").expect("target");
        assert_eq!(t.key, PoolKey { https: false, host: "::1".into(), port: 9000, origin: false });
        assert!(parse_target("ftp://h/x").is_err());
        assert!(parse_target("not a url").is_err());
    }
}
