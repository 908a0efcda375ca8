//! The process's file descriptors, split among the ports it serves.
//!
//! Why: once a process's descriptor table is full, the kernel refuses its every `accept`, file
//! open and outbound connection, whichever port filled it. So the limit is raised once, to the hard
//! limit (container runtimes often start a process at a soft limit of 1,024 under a far higher hard
//! one); a part is kept back for all that is not a served connection (database files and pools,
//! channels to the next hop, webhook deliveries, the runtime's own); and the rest is split evenly
//! among the ports that serve, so that the caps of all the ports together stay below the limit.

use std::{
    net::SocketAddr,
    sync::{
        OnceLock,
        atomic::{AtomicUsize, Ordering},
    },
};

/// Kept back from the ports: a quarter of the limit, and at least this many.
const RESERVED_AT_LEAST: u64 = 128;

/// The limit assumed when the process's own cannot be read (the usual soft limit).
const ASSUMED_LIMIT: u64 = 1_024;

/// Connections of one port closed to make room whose descriptors are not free yet, at most (the
/// accept loop waits for them beyond it): each port keeps room for them in its share.
pub(super) const CLOSING_AT_MOST: usize = 16;

/// The process's limit and how many ports share it now.
struct Process {
    limit: u64,
    ports: AtomicUsize,
}

static PROCESS: OnceLock<Process> = OnceLock::new();

/// The process, its limit raised the first time it is asked for (when its first port starts
/// serving).
fn process() -> &'static Process {
    PROCESS.get_or_init(|| Process {
        limit: raise_limit(),
        ports: AtomicUsize::new(0),
    })
}

/// Raises the soft limit on open descriptors to the hard limit; the limit in force after.
fn raise_limit() -> u64 {
    let before = rlimit::Resource::NOFILE.get_soft();
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(limit) => {
            match before {
                Ok(before) if before < limit => tracing::info!(
                    from = before,
                    to = limit,
                    "raised the limit on open descriptors to the hard limit"
                ),
                _ => tracing::info!(limit, "limit on open descriptors (the hard limit)"),
            }
            limit
        }
        Err(error) => {
            let limit = before.unwrap_or(ASSUMED_LIMIT);
            tracing::warn!(%error, limit, "cannot raise the limit on open descriptors: the ports share the soft limit");
            limit
        }
    }
}

/// How the descriptors under `limit` are split among `ports` ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Split {
    pub limit: u64,
    /// Kept back for everything but served connections.
    pub reserved: u64,
    pub ports: usize,
    /// Descriptors of each port.
    pub per_port: u64,
}

impl Split {
    pub(super) fn new(limit: u64, ports: usize) -> Self {
        let reserved = (limit / 4).max(RESERVED_AT_LEAST).min(limit);
        Self {
            limit,
            reserved,
            ports,
            per_port: (limit - reserved) / ports.max(1) as u64,
        }
    }

    /// Connections one port may keep: its descriptors, less the room for those closing.
    pub(super) fn connections(&self) -> usize {
        usize::try_from(self.per_port)
            .unwrap_or(usize::MAX)
            .saturating_sub(CLOSING_AT_MOST)
            .max(1)
    }
}

/// One port's part of the split, for as long as it serves: the port's cap shrinks when another
/// port starts serving and grows when one stops.
pub(super) struct PortShare {
    max_open: usize,
}

impl PortShare {
    /// Counts the port at `addr` among the process's ports, and says what it may keep.
    pub(super) fn register(addr: Option<SocketAddr>, max_open: usize) -> Self {
        let process = process();
        let ports = process.ports.fetch_add(1, Ordering::SeqCst) + 1;
        let share = Self { max_open };
        let split = Split::new(process.limit, ports);
        tracing::info!(
            port = ?addr,
            cap = share.cap(),
            max_open,
            limit = split.limit,
            reserved = split.reserved,
            ports = split.ports,
            per_port = split.per_port,
            "connections: the port keeps at most `cap`; of the descriptor limit, `reserved` are kept back and `ports` ports share the rest, `per_port` each"
        );
        share
    }

    /// Connections the port may keep now.
    pub(super) fn cap(&self) -> usize {
        let process = process();
        self.max_open
            .min(Split::new(process.limit, process.ports.load(Ordering::SeqCst)).connections())
            .max(1)
    }
}

impl Drop for PortShare {
    fn drop(&mut self) {
        process().ports.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quarter_is_kept_back_and_the_rest_split_evenly() {
        // The chain in one process (`stack up`) serves eight ports.
        let split = Split::new(1_024, 8);
        assert_eq!(
            (split.reserved, split.per_port, split.connections()),
            (256, 96, 80)
        );
        // The gateway alone serves three.
        assert_eq!(Split::new(1_024, 3).connections(), 256 - CLOSING_AT_MOST);
        assert_eq!(Split::new(1_048_576, 3).per_port, 262_144);
    }

    #[test]
    fn a_small_limit_keeps_its_reserve_and_every_port_one_place() {
        assert_eq!(Split::new(256, 2).reserved, 128);
        assert_eq!(
            Split::new(100, 8),
            Split {
                limit: 100,
                reserved: 100,
                ports: 8,
                per_port: 0
            }
        );
        assert_eq!(Split::new(100, 8).connections(), 1);
    }

    #[test]
    fn the_ports_together_stay_within_what_is_not_kept_back() {
        let total: usize = (0..8)
            .map(|_| Split::new(1_024, 8).connections() + CLOSING_AT_MOST)
            .sum();
        assert!(total as u64 <= 1_024 - Split::new(1_024, 8).reserved);
    }
}
