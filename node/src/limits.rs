//! Process limits: the open-file soft limit raised to the hard limit at start (as Go's runtime
//! does), and the inbound connection budget that keeps the node under it.

/// Descriptors set aside for everything but the data listeners' connections: the listeners,
/// the cache's files, standard streams, the admin plane's connections
/// ([`ADMIN_CONNECTIONS_MAX`]) and idle outbound connections kept for reuse.
pub const FD_RESERVE: u64 = 128;
/// Most connections the admin listener serves at once (scrapes and probes are light; a flood of
/// them must not take descriptors the data planes need).
pub const ADMIN_CONNECTIONS_MAX: usize = 32;
/// Fewest connections a data listener is given however low the open-file limit.
pub const CONNECTIONS_FLOOR: usize = 16;

/// The open-file limits before and after [`raise_open_file_limit`] (`None`: unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenFiles {
    /// Soft limit found at start.
    pub before: Option<u64>,
    /// Soft limit in force now.
    pub after: Option<u64>,
    /// Hard limit.
    pub hard: Option<u64>,
}

/// Raises the open-file soft limit to the hard limit, as Go's runtime does at start for the
/// earlier implementation: the common soft limit of 1,024 is far below what a node serving
/// thousands of clients needs, while the hard limit is usually generous. A refusal leaves the
/// limit as it was.
pub fn raise_open_file_limit() -> OpenFiles {
    use rustix::process::{getrlimit, setrlimit, Resource};
    let found = getrlimit(Resource::Nofile);
    let wanted = rustix::process::Rlimit { current: found.maximum, ..found };
    if found.current.is_some() && found.maximum != found.current {
        if let Err(e) = setrlimit(Resource::Nofile, wanted) {
            tracing::warn!(error = %e, "could not raise the open-file soft limit");
        }
    }
    let now = getrlimit(Resource::Nofile);
    OpenFiles { before: found.current, after: now.current, hard: now.maximum }
}

/// The open-file soft limit in force (`None`: unlimited).
pub fn open_file_limit() -> Option<u64> {
    rustix::process::getrlimit(rustix::process::Resource::Nofile).current
}

/// Most connections each of `data_listeners` listeners (client, peer) may serve so that the
/// process stays under `soft_limit` descriptors: every inbound request may hold one outbound
/// exchange (an origin or peer fetch, a passthrough), so each connection counts twice.
pub fn connection_budget(soft_limit: Option<u64>, data_listeners: usize) -> usize {
    assert!(data_listeners > 0, "at least the client listener");
    let Some(limit) = soft_limit else { return usize::MAX };
    let per_listener = limit.saturating_sub(FD_RESERVE) / (2 * data_listeners as u64);
    usize::try_from(per_listener).unwrap_or(usize::MAX).max(CONNECTIONS_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_the_reserve_and_a_descriptor_per_exchange() {
        assert_eq!(connection_budget(Some(1024), 1), 448);
        assert_eq!(connection_budget(Some(1024), 2), 224);
        assert_eq!(connection_budget(Some(1 << 20), 1), ((1 << 20) - 128) / 2);
        assert_eq!(connection_budget(None, 2), usize::MAX);
    }

    #[test]
    fn a_tiny_limit_still_leaves_a_floor() {
        assert_eq!(connection_budget(Some(100), 1), CONNECTIONS_FLOOR);
        assert_eq!(connection_budget(Some(0), 2), CONNECTIONS_FLOOR);
    }

    #[test]
    fn raising_never_lowers_the_soft_limit() {
        let before = open_file_limit();
        let limits = raise_open_file_limit();
        assert_eq!(limits.after, open_file_limit());
        if let (Some(b), Some(a)) = (before, limits.after) {
            assert!(a >= b, "{a} < {b}");
        }
    }
}
