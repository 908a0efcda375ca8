//! Comparison 6, idempotency: what a create costs the first time and when it is replayed from
//! its key, and how many creates per second the chain pays, on SQLite (with `synchronous` at
//! `FULL`, the default, a sync per commit, and at `NORMAL`, which a power loss may undo) and on
//! PostgreSQL.
//!
//! Orders and payment each keep their keys in their own database, in the same transactions as
//! the orders and payments, so the database is most of a create's cost. Each backend runs on a
//! fresh chain with an instant bank: first the creates at a fixed rate, then the same requests
//! again with the same keys (every one should be a replay), then closed-loop clients with new
//! keys for throughput. All over the gateway's HTTP face, where replays are marked.

use serde::Serialize;
use stack::ChainSettings;
use stack::chain::GATEWAY_HTTP;
use storage::Synchronous;

use crate::{
    BenchError, Coverage, NotMeasured,
    chains::{self, ChainStorage},
    clients::HttpOrders,
    load::{self, LoadPlan, Measurement},
    profile::Profile,
};

/// The class of a create that executed, and of one replayed from its key.
pub const CREATED: &str = "201 Created";
pub const REPLAYED: &str = "201 Created, replayed";

#[derive(Debug, Clone, Serialize)]
pub struct BackendIdempotency {
    pub backend: &'static str,
    /// The database server's version, where there is a server.
    pub server_version: Option<String>,
    pub first: Measurement,
    pub replay: Measurement,
    /// Closed-loop clients, new keys.
    pub throughput: Measurement,
}

#[derive(Debug, Clone, Serialize)]
pub struct Idempotency {
    pub sqlite: BackendIdempotency,
    /// SQLite with commits synced only at checkpoints (`synchronous = NORMAL`): what the
    /// default's sync per commit costs.
    pub sqlite_normal: BackendIdempotency,
    pub postgres: Coverage<BackendIdempotency>,
}

/// Where PostgreSQL comes from, when it does.
pub struct Postgres {
    pub url: String,
    pub version: String,
}

pub async fn measure(
    profile: &Profile,
    postgres: Option<&Postgres>,
) -> Result<Idempotency, BenchError> {
    let sqlite = measure_on(profile, &ChainStorage::Sqlite, "SQLite", None, |_| {}).await?;
    let sqlite_normal = measure_on(
        profile,
        &ChainStorage::Sqlite,
        "SQLite, synchronous = NORMAL",
        None,
        |chain| {
            chain.orders.sqlite.synchronous = Synchronous::Normal;
            chain.payment.sqlite.synchronous = Synchronous::Normal;
        },
    )
    .await?;
    let postgres = match postgres {
        Some(postgres) => Coverage::Measured(
            measure_on(
                profile,
                &ChainStorage::Postgres(postgres.url.clone()),
                "PostgreSQL",
                Some(postgres.version.clone()),
                |_| {},
            )
            .await?,
        ),
        None => Coverage::NotMeasured(NotMeasured {
            reason: "not measured: no PostgreSQL (set TEST_POSTGRES_URL or pass --postgres-url)"
                .into(),
        }),
    };
    Ok(Idempotency {
        sqlite,
        sqlite_normal,
        postgres,
    })
}

async fn measure_on(
    profile: &Profile,
    backend: &ChainStorage,
    name: &'static str,
    server_version: Option<String>,
    change: impl FnOnce(&mut ChainSettings),
) -> Result<BackendIdempotency, BenchError> {
    let settings = &profile.idempotency;
    let running = chains::start(backend, |chain| {
        chains::with_instant_bank(chain);
        change(chain);
    })
    .await?;
    let orders = HttpOrders::new(running.chain.address(&GATEWAY_HTTP), "idempotency", None);
    let plan = |what: &str| {
        LoadPlan::count(
            format!("{name}: {what}"),
            settings.requests,
            settings.per_second,
            profile.bounds,
        )
    };
    let first = {
        let orders = orders.clone();
        load::run(&plan("first executions"), move |index| orders.create(index)).await
    };
    let replay = {
        let orders = orders.clone();
        load::run(&plan("replays"), move |index| orders.create(index)).await
    };
    let throughput = {
        let orders = orders.keyed("throughput");
        let plan = LoadPlan::clients(
            format!("{name}: throughput"),
            settings.throughput_clients,
            settings.throughput_requests,
            settings.throughput_time_limit,
            profile.bounds,
        );
        load::run(&plan, move |index| orders.create(index)).await
    };
    running.stop().await?;
    Ok(BackendIdempotency {
        backend: name,
        server_version,
        first,
        replay,
        throughput,
    })
}
