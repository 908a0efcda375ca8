//! A fresh chain for every measurement, so that no section inherits another's keys, counters or
//! open breakers: on SQLite in a temporary directory, or on scratch PostgreSQL databases.

use std::time::Duration;

use bank_mock::{Faults, Latency};
use deadline::HopStatsSnapshot;
use resilience::rate_limit::QuotaSettings;
use serde::Serialize;
use sqlx::{Connection, Executor, PgConnection};
use stack::{
    Chain, ChainHopStats, ChainSettings,
    chain::{GATEWAY_GRPC, GATEWAY_HTTP},
};
use tempfile::TempDir;

use crate::BenchError;

/// Where orders and payment keep their data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChainStorage {
    Sqlite,
    /// A PostgreSQL server, by the URL of a database whose user may create databases.
    Postgres(String),
}

/// A running chain and the storage it lives on, removed by [`Running::stop`].
pub struct Running {
    pub chain: Chain,
    _data: TempDir,
    scratch: Option<Scratch>,
}

/// Databases made for one chain on a PostgreSQL server.
struct Scratch {
    admin_url: String,
    databases: Vec<String>,
}

/// A bank that answers at once and publishes no quota: the chain's own cost, nothing of the
/// bank's. Payment still checks its own limit toward the bank on every call, set beyond reach:
/// the default settings' quota (2,000 calls a second) would otherwise be the ceiling of every
/// measurement on a fast machine, the bank's number rather than the chain's.
pub fn with_instant_bank(settings: &mut ChainSettings) {
    settings.bank.faults = Faults {
        latency_ms: Latency {
            mean: 0.0,
            stddev: 0.0,
        },
        ..Faults::HEALTHY
    };
    settings.payment.bank.quota = QuotaSettings {
        per_second: u32::MAX / 2,
        burst: u32::MAX / 2,
    };
}

/// Starts the chain on `backend` with the default settings after `change`.
pub async fn start(
    backend: &ChainStorage,
    change: impl FnOnce(&mut ChainSettings),
) -> Result<Running, BenchError> {
    let data = tempfile::tempdir().map_err(BenchError::Io)?;
    let mut settings = ChainSettings::default()
        .ephemeral()
        .with_data_dir(data.path());
    let scratch = match backend {
        ChainStorage::Sqlite => None,
        ChainStorage::Postgres(admin_url) => {
            Some(scratch_databases(admin_url, &mut settings).await?)
        }
    };
    change(&mut settings);
    let chain = Chain::start(settings).await?;
    Ok(Running {
        chain,
        _data: data,
        scratch,
    })
}

/// Creates a database for orders and one for payment, and points the settings at them.
async fn scratch_databases(
    admin_url: &str,
    settings: &mut ChainSettings,
) -> Result<Scratch, BenchError> {
    let mut admin = PgConnection::connect(admin_url).await?;
    let base = admin_url
        .rsplit_once('/')
        .map_or(admin_url, |(base, _)| base);
    let mut databases = Vec::new();
    for url in [
        &mut settings.orders.database_url,
        &mut settings.payment.database_url,
    ] {
        let name = format!("bench_{}", uuid::Uuid::now_v7().simple());
        admin
            .execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .await?;
        *url = format!("{base}/{name}");
        databases.push(name);
    }
    Ok(Scratch {
        admin_url: admin_url.to_owned(),
        databases,
    })
}

/// The server version of the PostgreSQL at `url`, which also proves it is reachable.
pub async fn postgres_version(url: &str) -> Result<String, BenchError> {
    let mut connection = PgConnection::connect(url).await?;
    Ok(sqlx::query_scalar("SHOW server_version")
        .fetch_one(&mut connection)
        .await?)
}

impl Running {
    /// Stops the chain and drops its scratch databases.
    pub async fn stop(self) -> Result<(), BenchError> {
        self.chain.stop().await?;
        if let Some(scratch) = self.scratch {
            let mut admin = PgConnection::connect(&scratch.admin_url).await?;
            for name in scratch.databases {
                admin
                    .execute(sqlx::AssertSqlSafe(format!(
                        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
                    )))
                    .await?;
            }
        }
        Ok(())
    }

    /// Bank calls that arrive during `settle` after the clients have all left: work for nobody.
    pub async fn bank_calls_during(&self, settle: Duration) -> u64 {
        let before = self.chain.bank().stats().calls;
        tokio::time::sleep(settle).await;
        self.chain.bank().stats().calls - before
    }
}

/// What one hop did relative to its deadlines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct HopWork {
    pub hop: &'static str,
    #[serde(flatten)]
    pub stats: HopStatsSnapshot,
}

/// The gateway's face that clients used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Face {
    #[serde(rename = "gRPC")]
    Grpc,
    #[serde(rename = "HTTP")]
    Http,
}

impl Face {
    pub fn name(self) -> &'static str {
        match self {
            Face::Grpc => "gRPC",
            Face::Http => "HTTP",
        }
    }
}

/// Every hop's counters, outermost first, the gateway's for `face`.
pub fn hops(stats: &ChainHopStats, face: Face) -> Vec<HopWork> {
    let other_face = match face {
        Face::Grpc => &GATEWAY_HTTP,
        Face::Http => &GATEWAY_GRPC,
    };
    stats
        .iter()
        .filter(|(listener, _)| listener.key != other_face.key)
        .map(|(listener, stats)| HopWork {
            hop: listener.hop,
            stats: *stats,
        })
        .collect()
}
