//! The client-plane URL contract (spec/node.md §2): which upstream URL a request-target names.

use thiserror::Error;

/// How the client plane maps a request to an upstream URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamMode {
    /// Every request reads this one URL (`--origin`).
    Static(String),
    /// `/<prefix>/<upstream-url>`: the rest of the target, query included, is the upstream URL.
    Prefix(String),
    /// A registry mirror (`--registry`, spec/node.md §3): blobs under `/v2` are read through
    /// the engine, the rest of `/v2` is proxied ([`crate::registry::Route`]); other targets
    /// take the prefix API with `prefix` (never `v2`), and are not found without it.
    Registry {
        /// The upstream registry.
        registry: crate::registry::Registry,
        /// The prefix API's path segment beside the mirror.
        prefix: String,
    },
}

/// Why a request-target names no upstream (the client gets 400).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum ResolveError {
    /// The target does not start with `/<prefix>/`.
    #[error("request path must start with /{0}/")]
    MissingPrefix(String),
    /// The upstream URL is not http:// or https://.
    #[error("upstream URL must start with http:// or https://")]
    NotHttp,
    /// The upstream URL has no host.
    #[error("upstream URL has no host")]
    NoHost,
    /// Registry mode: the target is neither under `/v2` nor under `/<prefix>/` (the client
    /// gets 404).
    #[error("not found: this node serves /v2 (registry mirror) and /{0}/<url>")]
    NotRegistry(String),
}

impl UpstreamMode {
    /// A prefix mode; surrounding `/` are trimmed (`/dart/` → `dart`).
    pub fn prefix(prefix: &str) -> Self {
        UpstreamMode::Prefix(prefix.trim_matches('/').to_owned())
    }

    /// Resolves a raw request-target (path and query, uncleaned: cleaning would collapse `//`);
    /// in registry mode, the URL its [`crate::registry::Route`] reads or proxies.
    pub fn resolve(&self, target: &str) -> Result<String, ResolveError> {
        match self {
            UpstreamMode::Static(url) => Ok(url.clone()),
            UpstreamMode::Registry { registry, prefix } => match registry.route(target) {
                crate::registry::Route::Blob { url, .. }
                | crate::registry::Route::Proxy { url } => Ok(url),
                crate::registry::Route::NotFound => {
                    UpstreamMode::Prefix(prefix.clone()).resolve(target).map_err(|e| match e {
                        ResolveError::MissingPrefix(_) => ResolveError::NotRegistry(prefix.clone()),
                        e => e,
                    })
                }
            },
            UpstreamMode::Prefix(prefix) => {
                let rest = target
                    .strip_prefix('/')
                    .and_then(|t| t.strip_prefix(prefix.as_str()))
                    .and_then(|t| t.strip_prefix('/'))
                    .ok_or_else(|| ResolveError::MissingPrefix(prefix.clone()))?;
                let after_scheme = rest
                    .strip_prefix("http://")
                    .or_else(|| rest.strip_prefix("https://"))
                    .ok_or(ResolveError::NotHttp)?;
                let host_end = after_scheme.find(['/', '?', '#']).unwrap_or(after_scheme.len());
                if host_end == 0 {
                    return Err(ResolveError::NoHost);
                }
                Ok(rest.to_owned())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_mode_takes_the_rest_of_the_target_query_included() {
        let m = UpstreamMode::prefix("/dart/");
        let got = m.resolve("/dart/https://reg.example/v2/x/blobs/sha256:ab?sig=1&e=2");
        assert_eq!(got.as_deref(), Ok("https://reg.example/v2/x/blobs/sha256:ab?sig=1&e=2"));
    }

    #[test]
    fn prefix_mode_refuses_other_paths_and_schemes() {
        let m = UpstreamMode::prefix("dart");
        assert!(matches!(m.resolve("/other/http://h/x"), Err(ResolveError::MissingPrefix(_))));
        assert!(matches!(m.resolve("/dartx/http://h/x"), Err(ResolveError::MissingPrefix(_))));
        assert_eq!(m.resolve("/dart/ftp://h/x"), Err(ResolveError::NotHttp));
        assert_eq!(m.resolve("/dart/http:///x"), Err(ResolveError::NoHost));
        assert_eq!(m.resolve("/dart"), Err(ResolveError::MissingPrefix("dart".into())));
    }

    #[test]
    fn registry_mode_serves_v2_and_the_prefix_api_beside_it() {
        let registry = crate::registry::Registry::new("http://reg:5000").unwrap();
        let m = UpstreamMode::Registry { registry, prefix: "dart".into() };
        assert_eq!(m.resolve("/v2/").as_deref(), Ok("http://reg:5000/v2/"));
        assert_eq!(m.resolve("/dart/http://o/x").as_deref(), Ok("http://o/x"));
        assert_eq!(m.resolve("/dart/ftp://o/x"), Err(ResolveError::NotHttp));
        assert_eq!(m.resolve("/other"), Err(ResolveError::NotRegistry("dart".into())));
    }

    #[test]
    fn static_mode_ignores_the_target() {
        let m = UpstreamMode::Static("http://o/obj".into());
        assert_eq!(m.resolve("/anything?x").as_deref(), Ok("http://o/obj"));
    }
}
