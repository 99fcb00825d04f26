//! The registry credentials' state in the shell: the token cache and the singleflight of token
//! exchanges. What a request carries and what a `401` leads to are
//! [`dart_core::registry::auth`]'s decisions; this module only holds their state across
//! exchanges and runs one token request per key at a time.
//!
//! The exchange runs detached from the request that started it (its own task, bounded by
//! [`TOKEN_EXCHANGE_BOUND`]): a leader whose read is cancelled never fails its followers, and the
//! cache is filled before the in-flight marker is removed, so a request arriving in between finds
//! the token instead of starting a second exchange.

use dart_core::registry::auth::{
    AuthPlan, Credential, Credentials, OnUnauthorized, TokenCache, TOKEN_EXCHANGE_BOUND,
};
use dart_core::time::Instant;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::watch;

/// The outcome of a token exchange, once known: the token, or `None` (refused, unreachable,
/// malformed, out of time).
type Outcome = Option<Option<String>>;

/// The operator's registry credentials and the tokens they bought.
pub struct RegistryAuth {
    credentials: Credentials,
    state: Mutex<State>,
    /// Token exchanges started (one per key at a time).
    pub exchanges: AtomicU64,
    /// Token exchanges that produced a token.
    pub exchanges_ok: AtomicU64,
    /// Token exchanges that produced no token.
    pub exchanges_failed: AtomicU64,
}

#[derive(Default)]
struct State {
    cache: TokenCache,
    in_flight: BTreeMap<String, watch::Receiver<Outcome>>,
}

/// Whether the caller leads a token exchange or waits for one.
pub enum Turn {
    /// Run the exchange, then [`RegistryAuth::finish`] with this sender.
    Lead(watch::Sender<Outcome>, watch::Receiver<Outcome>),
    /// Wait on this receiver.
    Follow(watch::Receiver<Outcome>),
    /// A fresh token is already cached.
    Cached(String),
}

impl RegistryAuth {
    /// State for `credentials`.
    pub fn new(credentials: Credentials) -> Self {
        RegistryAuth {
            credentials,
            state: Mutex::new(State::default()),
            exchanges: AtomicU64::new(0),
            exchanges_ok: AtomicU64::new(0),
            exchanges_failed: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The plan of an origin exchange to `url`; `None` when its host has no credential.
    pub fn plan(&self, url: &str, client_authorized: bool) -> Option<AuthPlan> {
        AuthPlan::new(&self.credentials, url, client_authorized)
    }

    /// What the first attempt carries.
    pub fn first(&self, plan: &AuthPlan, now: Instant) -> Credential {
        plan.first(&self.lock().cache, now)
    }

    /// The decision on a `401` to the attempt that carried `sent`.
    pub fn on_unauthorized(
        &self,
        plan: &mut AuthPlan,
        sent: &Credential,
        challenge: Option<&str>,
    ) -> OnUnauthorized {
        plan.on_unauthorized(sent, challenge, &mut self.lock().cache)
    }

    /// Joins the exchange for `key`, or leads it.
    pub fn turn(&self, key: &str, now: Instant) -> Turn {
        let mut state = self.lock();
        if let Some(token) = state.cache.get(key, now) {
            return Turn::Cached(token.to_owned());
        }
        if let Some(rx) = state.in_flight.get(key) {
            return Turn::Follow(rx.clone());
        }
        let (tx, rx) = watch::channel(None);
        state.in_flight.insert(key.to_owned(), rx.clone());
        self.exchanges.fetch_add(1, Ordering::Relaxed);
        Turn::Lead(tx, rx)
    }

    /// Ends the exchange for `key`: caches its token, then removes the in-flight marker, then
    /// wakes the waiters.
    pub fn finish(
        &self,
        key: &str,
        got: Option<(String, Duration)>,
        now: Instant,
        tx: watch::Sender<Outcome>,
    ) {
        let token = {
            let mut state = self.lock();
            let token = got.map(|(token, ttl)| {
                state.cache.put(key, token.clone(), ttl, now);
                token
            });
            state.in_flight.remove(key);
            token
        };
        let outcome = if token.is_some() { &self.exchanges_ok } else { &self.exchanges_failed };
        outcome.fetch_add(1, Ordering::Relaxed);
        let _ = tx.send(Some(token));
    }

    /// Waits for an exchange's outcome (bounded like the exchange itself).
    pub async fn wait(mut rx: watch::Receiver<Outcome>) -> Option<String> {
        let waited = tokio::time::timeout(TOKEN_EXCHANGE_BOUND, rx.wait_for(Option::is_some));
        match waited.await {
            Ok(Ok(outcome)) => outcome.clone().flatten(),
            _ => None,
        }
    }
}
