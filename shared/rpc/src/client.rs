use std::time::Duration;

use deadline::{ForwardPolicy, client::{ForwardDeadline, ForwardDeadlineLayer}};
use serde::{Deserialize, Serialize};
use tonic::transport::{Channel, Endpoint};
use resilience::{
    ChainMode,
    naive::{NaiveRetry, NaiveRetryLayer, NaiveSettings},
};
use tower::{Layer, util::Either};

/// How to reach one dependency, and how much of the deadline to give it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dependency {
    /// `http://host:port` of the dependency.
    pub endpoint: String,
    /// Limit on establishing a TCP connection (short: the peer is near or it is not there).
    pub connect_timeout_ms: u64,
    /// Limit on silence of an established connection: an HTTP/2 ping unanswered for this long
    /// closes it. Unlike a deadline it does not bound the length of an answer.
    pub idle_timeout_ms: u64,
    /// How the operation deadline is shared with this dependency.
    pub deadline: ForwardPolicy,
}

impl Default for Dependency {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:50051".into(),
            connect_timeout_ms: 250,
            idle_timeout_ms: 5_000,
            deadline: ForwardPolicy::default(),
        }
    }
}

/// A channel to one dependency: under its deadline policy, or (naive chain) retried per hop.
pub type Client = Either<ForwardDeadline<Channel>, NaiveRetry<Channel>>;

/// Builds the client for `dependency`, named `name` in ledgers and errors. Connects lazily, so
/// services can start in any order, and reconnects by itself. It never retries in the budgeted
/// chain: retries belong to the gateway alone.
pub fn connect(
    name: &'static str,
    dependency: &Dependency,
    mode: ChainMode,
    naive: NaiveSettings,
) -> Result<Client, tonic::transport::Error> {
    let idle = Duration::from_millis(dependency.idle_timeout_ms);
    let channel = Endpoint::from_shared(dependency.endpoint.clone())?
        .connect_timeout(Duration::from_millis(dependency.connect_timeout_ms))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(idle)
        .keep_alive_timeout(idle)
        .keep_alive_while_idle(true)
        .connect_lazy();
    Ok(match mode {
        ChainMode::Budgeted => Either::Left(ForwardDeadlineLayer::new(name, dependency.deadline).layer(channel)),
        ChainMode::Naive => Either::Right(NaiveRetryLayer::new(naive).layer(channel)),
    })
}
