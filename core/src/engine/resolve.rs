//! The client-plane URL contract (spec/node.md §2): which upstream URL a request-target names.

use thiserror::Error;

/// How the client plane maps a request to an upstream URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpstreamMode {
    /// Every request reads this one URL (`--origin`).
    Static(String),
    /// `/<prefix>/<upstream-url>`: the rest of the target, query included, is the upstream URL.
    Prefix(String),
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
}

impl UpstreamMode {
    /// A prefix mode; surrounding `/` are trimmed (`/dart/` → `dart`).
    pub fn prefix(prefix: &str) -> Self {
        UpstreamMode::Prefix(prefix.trim_matches('/').to_owned())
    }

    /// Resolves a raw request-target (path and query, uncleaned: cleaning would collapse `//`).
    pub fn resolve(&self, target: &str) -> Result<String, ResolveError> {
        match self {
            UpstreamMode::Static(url) => Ok(url.clone()),
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
    fn static_mode_ignores_the_target() {
        let m = UpstreamMode::Static("http://o/obj".into());
        assert_eq!(m.resolve("/anything?x").as_deref(), Ok("http://o/obj"));
    }
}
