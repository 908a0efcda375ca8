//! The `healthcheck` subcommand of every service binary: asks the service running beside it
//! whether it serves, over `grpc.health.v1`, so that container images need neither a shell nor a
//! probe program of their own.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

use crate::tls::ServiceTls;
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};

/// The subcommands every service binary has besides serving.
#[derive(Debug, Clone, Copy, clap::Subcommand)]
pub enum Command {
    /// Exit 0 when the service on this host's configured address answers SERVING (for container
    /// health checks), 1 otherwise.
    Healthcheck {
        /// How long to wait for the answer.
        #[arg(long, default_value_t = 2_000)]
        timeout_ms: u64,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    #[error("cannot reach {addr}: {source}")]
    Unreachable {
        addr: SocketAddr,
        source: tonic::transport::Error,
    },
    #[error("{addr} answered the health check with {status}")]
    Failed {
        addr: SocketAddr,
        status: tonic::Status,
    },
    #[error("{addr} is {status:?}")]
    NotServing {
        addr: SocketAddr,
        status: ServingStatus,
    },
    #[error("{addr} did not answer within {timeout:?}")]
    Timeout { addr: SocketAddr, timeout: Duration },
}

/// Checks the server listening on `listen` in plain text; an unspecified address (`0.0.0.0`) is
/// checked on loopback, where a server bound to every interface also answers.
pub async fn check(listen: SocketAddr, timeout: Duration) -> Result<(), HealthError> {
    check_as(listen, "", &ServiceTls::Plaintext, timeout).await
}

/// [`check`] of `service`'s own server, presenting its certificate when `tls` has one.
pub async fn check_as(
    listen: SocketAddr,
    service: &str,
    tls: &ServiceTls,
    timeout: Duration,
) -> Result<(), HealthError> {
    let addr = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port())
        }
        _ => listen,
    };
    let ask = async {
        let endpoint = crate::endpoint(&addr.to_string())
            .map_err(|source| HealthError::Unreachable { addr, source })?;
        let answer = HealthClient::new(crate::channel(&endpoint, service, tls))
            .check(HealthCheckRequest {
                service: String::new(),
            })
            .await
            .map_err(|status| HealthError::Failed { addr, status })?;
        match answer.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            status => Err(HealthError::NotServing { addr, status }),
        }
    };
    tokio::time::timeout(timeout, ask)
        .await
        .map_err(|_| HealthError::Timeout { addr, timeout })?
}
