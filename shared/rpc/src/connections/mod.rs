//! Limits on the connections one listener keeps: how many at once, whose place a newcomer takes
//! when the port is full, and how long one may stay without a request.
//!
//! Why: an open connection costs a file descriptor and buffers whether or not it ever sends a
//! request, and the process has one descriptor table for all its ports. Each port therefore keeps
//! at most its share of the process's descriptors (`descriptors`), so that a flood of one port
//! cannot take the descriptors of the others. Idle is judged by requests, not by bytes: a
//! connection with no open request is idle whatever pings cross it, since answering pings costs an
//! attacker nothing. A full port makes room for a newcomer by closing an idle connection, chosen
//! by `places`, rather than refusing it. The HTTP limits (header read time, HTTP/2 pings) are
//! kept by `crate::serve`.

mod descriptors;
mod limited;
mod places;

use serde::{Deserialize, Serialize};

pub use limited::{Limited, LimitedListener};
pub(crate) use places::{OpenRequest, Place, Placed};

/// How many connections a listener keeps, and for how long (one listener: every port of a
/// service has limits of its own, so that a flood on one does not close the others).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionLimits {
    /// Connections open at once on one port, at most: fewer when the port's share of the process's
    /// descriptors is smaller. At the cap, an idle connection is closed to make room.
    pub max_open: usize,
    /// A connection with no open request for this long is closed, whatever pings it answers.
    pub idle_timeout_ms: u64,
    /// An HTTP/1 request whose headers have not all arrived this long after it started is
    /// refused and its connection closed.
    pub header_read_timeout_ms: u64,
    /// HTTP/2: a ping is sent after this long without frames from the peer...
    pub keepalive_interval_ms: u64,
    /// ...and the connection is closed when its answer has not come within this long.
    pub keepalive_timeout_ms: u64,
    /// A connection this old (give or take a tenth, so that a crowd of them does not end at
    /// once) is asked to end: HTTP/2 GOAWAY, the requests in flight finish, and the client
    /// connects again, through its load balancer, perhaps to another replica. 0: no limit.
    pub max_age_ms: u64,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            max_open: 2_000,
            idle_timeout_ms: 30_000,
            header_read_timeout_ms: 10_000,
            keepalive_interval_ms: 20_000,
            keepalive_timeout_ms: 10_000,
            max_age_ms: 300_000,
        }
    }
}

impl ConnectionLimits {
    /// How long one new connection may live: `max_age_ms` less up to a tenth, drawn at random.
    pub(crate) fn max_age(&self) -> Option<std::time::Duration> {
        (self.max_age_ms > 0).then(|| {
            std::time::Duration::from_millis(self.max_age_ms)
                .mul_f64(1.0 - rand::random::<f64>() / 10.0)
        })
    }
}
