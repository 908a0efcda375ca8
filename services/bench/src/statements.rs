//! Comparison 8, statements: how often one create waits for the databases, and the SQL
//! statements it runs there, of which kinds, on each backend, one create at a time and with many
//! clients at once.
//!
//! Why count them? On a create's path it is the waits, more than the databases' work, that
//! cost. On SQLite a write waits once per unit of work, handed to the file's writer thread and
//! back, whatever its statements (a read runs on the caller's thread, no hand-off); on
//! PostgreSQL every query is a network round trip (sqlx does not pipeline). Both are counted as
//! trips, and the statements apart, by their first word.
//!
//! The counts are the drivers' own events: on SQLite `storage`'s (`storage::write`, one per unit
//! of work handed to the writer; `storage::statement`, one per statement run, with its SQL in
//! `sql`), on PostgreSQL sqlx's (`sqlx::query`, one per query, `BEGIN` and `COMMIT`
//! included).
//! A tracing subscriber is installed once per process, and comparison 7 installs telemetry's,
//! so each backend is counted in a child process of this harness (see [`count_in_this_process`]),
//! whose subscriber counts those events and nothing else.
//!
//! Background work of the chain (the sender's and the completer's polls) runs meanwhile and is
//! counted too: a few statements a second, a small share of a round's.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use serde::{Deserialize, Serialize};
use stack::chain::GATEWAY_HTTP;
use tracing_subscriber::{Layer, filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};

use crate::{
    BenchError, Coverage, NotMeasured,
    chains::{self, ChainStorage},
    clients::HttpOrders,
    idempotency::{CREATED, Postgres, REPLAYED},
    load::{self, LoadPlan},
    profile::Profile,
};

/// The statements of one round of requests, divided by the requests that succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub label: String,
    pub clients: usize,
    pub successes: usize,
    /// Waits for the database per success: on SQLite the units of work handed to the writer's
    /// thread and back, on PostgreSQL the queries, each a round trip.
    pub trips_per_request: f64,
    /// Statements per success, by their first word (`INSERT`, `COMMIT`, …).
    pub per_request: BTreeMap<String, f64>,
    pub total_per_request: f64,
}

/// Every round on one backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendStatements {
    pub backend: String,
    pub rounds: Vec<Round>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Statements {
    /// Clients of the concurrent rounds.
    pub clients: usize,
    pub sqlite: BackendStatements,
    pub postgres: Coverage<BackendStatements>,
}

/// Counts each backend in a child process: `bench` is the path of this harness's executable,
/// which counts when started with `--count-statements`.
pub async fn measure(
    profile: &Profile,
    postgres: Option<&Postgres>,
    bench: &Path,
) -> Result<Statements, BenchError> {
    let smoke = profile.name == "smoke";
    let sqlite = in_child(bench, "sqlite", None, smoke).await?;
    let postgres = match postgres {
        Some(postgres) => {
            Coverage::Measured(in_child(bench, "postgres", Some(&postgres.url), smoke).await?)
        }
        None => Coverage::NotMeasured(NotMeasured {
            reason: "not measured: no PostgreSQL (set TEST_POSTGRES_URL or pass --postgres-url)"
                .into(),
        }),
    };
    Ok(Statements {
        clients: profile.statements.clients,
        sqlite,
        postgres,
    })
}

async fn in_child(
    bench: &Path,
    backend: &str,
    postgres_url: Option<&str>,
    smoke: bool,
) -> Result<BackendStatements, BenchError> {
    let mut command = std::process::Command::new(bench);
    command.args(["--count-statements", backend]);
    if let Some(url) = postgres_url {
        command.args(["--postgres-url", url]);
    }
    if smoke {
        command.arg("--smoke");
    }
    // Its progress lines go where the harness's own go; its result comes on stdout.
    command.stderr(std::process::Stdio::inherit());
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("the child's wait does not panic")
        .map_err(BenchError::Io)?;
    if !output.status.success() {
        return Err(BenchError::Child(format!(
            "counting statements on {backend} ended with {} (its output is above)",
            output.status
        )));
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Trips and statements seen since the last [`Counts::take`].
#[derive(Clone)]
struct Counts {
    counted: Arc<Mutex<Counted>>,
    /// Whether each statement is a trip of its own (PostgreSQL's queries), rather than run where
    /// the unit of work already is (SQLite's, on the writer's thread or the reader's caller).
    statements_are_trips: bool,
}

#[derive(Default)]
struct Counted {
    /// Waits for the database: units of work handed to SQLite's writer, or PostgreSQL's queries.
    trips: u64,
    /// Statements, by first word.
    statements: BTreeMap<String, u64>,
}

/// The targets of `storage`'s events on SQLite: a unit of work handed to the writer, and a
/// statement run.
const WRITE: &str = "storage::write";
const STATEMENT: &str = "storage::statement";

impl Counts {
    fn take(&self) -> Counted {
        std::mem::take(&mut *self.counted.lock().expect("never poisoned"))
    }
}

impl<S: tracing::Subscriber> Layer<S> for Counts {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut counted = self.counted.lock().expect("never poisoned");
        if event.metadata().target() == WRITE {
            counted.trips += 1;
            return;
        }
        let mut query = Query::default();
        event.record(&mut query);
        // sqlx gives the whole SQL only when its summary (the first words) leaves some out.
        let sql = query
            .statement
            .filter(|sql| !sql.trim().is_empty())
            .or(query.summary)
            .unwrap_or_default();
        if self.statements_are_trips {
            counted.trips += 1;
        }
        // The statements here hold no `;` of their own, so it separates them.
        for statement in sql
            .split(';')
            .map(str::trim)
            .filter(|statement| !statement.is_empty())
        {
            let kind = statement
                .split_whitespace()
                .next()
                .unwrap_or("?")
                .to_uppercase();
            *counted.statements.entry(kind).or_default() += 1;
        }
    }
}

/// The fields of a statement's event: sqlx's summary (the first words) and, when that is not all
/// of it, the whole SQL (`db.statement`); `storage`'s whole SQL (`sql`).
#[derive(Default)]
struct Query {
    summary: Option<String>,
    statement: Option<String>,
}

impl Query {
    fn record(&mut self, field: &tracing::field::Field, value: String) {
        match field.name() {
            "summary" => self.summary = Some(value),
            "db.statement" | "sql" => self.statement = Some(value),
            _ => {}
        }
    }
}

impl tracing::field::Visit for Query {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record(field, value.to_owned());
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}").trim_matches('"').to_owned());
    }
}

/// The child's side: counts the statements of a chain on `backend` in this process and returns
/// them, for the parent to read as JSON. Installs this process's tracing subscriber.
pub async fn count_in_this_process(
    profile: &Profile,
    backend: &ChainStorage,
) -> Result<BackendStatements, BenchError> {
    let (counts, events) = match backend {
        ChainStorage::Sqlite => (
            Counts {
                counted: Arc::default(),
                statements_are_trips: false,
            },
            [WRITE, STATEMENT].as_slice(),
        ),
        ChainStorage::Postgres(_) => (
            Counts {
                counted: Arc::default(),
                statements_are_trips: true,
            },
            ["sqlx::query"].as_slice(),
        ),
    };
    let events = events.iter().fold(Targets::new(), |targets, target| {
        targets.with_target(*target, tracing::Level::DEBUG)
    });
    tracing_subscriber::registry()
        .with(counts.clone().with_filter(events))
        .try_init()
        .map_err(|error| {
            BenchError::Child(format!(
                "a tracing subscriber was already installed: {error}"
            ))
        })?;
    let settings = &profile.statements;
    let running = chains::start(backend, chains::with_instant_bank).await?;
    let orders = HttpOrders::new(running.chain.address(&GATEWAY_HTTP), "statements", None);
    let name = match backend {
        ChainStorage::Sqlite => "SQLite",
        ChainStorage::Postgres(_) => "PostgreSQL",
    };
    let plan = |label: &str, clients: usize| {
        LoadPlan::clients(
            format!("{name}: {label}"),
            clients,
            settings.requests,
            settings.time_limit,
            profile.bounds,
        )
    };
    // Connections, caches and prepared statements warm up first.
    let warm = orders.keyed("warm-up");
    load::run(&plan("warm-up", 1), move |index| warm.create(index)).await;
    counts.take();

    let mut rounds = Vec::new();
    let one = orders.keyed("one at a time");
    for (label, clients, class) in [
        ("creates, one at a time", 1, CREATED),
        ("replays, one at a time", 1, REPLAYED),
    ] {
        let creates = one.clone();
        let measured = load::run(&plan(label, clients), move |index| creates.create(index)).await;
        rounds.push(round(label, clients, measured.count(class), counts.take()));
    }
    let many = orders.keyed("many at once");
    let label = "creates, many at once";
    let measured = load::run(&plan(label, settings.clients), move |index| {
        many.create(index)
    })
    .await;
    rounds.push(round(
        label,
        settings.clients,
        measured.count(CREATED),
        counts.take(),
    ));
    running.stop().await?;
    Ok(BackendStatements {
        backend: name.into(),
        rounds,
    })
}

fn round(label: &str, clients: usize, successes: usize, counted: Counted) -> Round {
    let per = |count: u64| count as f64 / successes.max(1) as f64;
    Round {
        label: label.into(),
        clients,
        successes,
        trips_per_request: per(counted.trips),
        total_per_request: per(counted.statements.values().sum()),
        per_request: counted
            .statements
            .into_iter()
            .map(|(kind, count)| (kind, per(count)))
            .collect(),
    }
}
