//! Comparison 8, statements: how many SQL statements one create sends to the databases, of
//! which kinds, on each backend, one create at a time and with many clients at once.
//!
//! Why count statements? On SQLite every statement is a hand-off to the connection's own thread
//! and back, and on PostgreSQL a network round trip (sqlx does not pipeline): on a create's path
//! it is their number, more than the databases' work, that costs. The count is sqlx's own: it
//! reports every statement it runs (`BEGIN` and `COMMIT` included) as a `sqlx::query` event.
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
    chains::{self, Backend},
    clients::HttpOrders,
    idempotency::{CREATED, Postgres, REPLAYED},
    load::{self, Plan},
    profile::Profile,
};

/// The statements of one round of requests, divided by the requests that succeeded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Round {
    pub label: String,
    pub clients: usize,
    pub successes: usize,
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
pub async fn measure(profile: &Profile, postgres: Option<&Postgres>, bench: &Path) -> Result<Statements, BenchError> {
    let smoke = profile.name == "smoke";
    let sqlite = in_child(bench, "sqlite", None, smoke).await?;
    let postgres = match postgres {
        Some(postgres) => Coverage::Measured(in_child(bench, "postgres", Some(&postgres.url), smoke).await?),
        None => Coverage::NotMeasured(NotMeasured { reason: "not measured: no PostgreSQL (set TEST_POSTGRES_URL or pass --postgres-url)".into() }),
    };
    Ok(Statements { clients: profile.statements.clients, sqlite, postgres })
}

async fn in_child(bench: &Path, backend: &str, postgres_url: Option<&str>, smoke: bool) -> Result<BackendStatements, BenchError> {
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
    let output = tokio::task::spawn_blocking(move || command.output()).await.expect("the child's wait does not panic").map_err(BenchError::Io)?;
    if !output.status.success() {
        return Err(BenchError::Child(format!("counting statements on {backend} ended with {} (its output is above)", output.status)));
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Statements seen since the last [`Counts::take`], by kind.
#[derive(Clone, Default)]
struct Counts(Arc<Mutex<BTreeMap<String, u64>>>);

impl Counts {
    fn take(&self) -> BTreeMap<String, u64> {
        std::mem::take(&mut *self.0.lock().expect("never poisoned"))
    }
}

impl<S: tracing::Subscriber> Layer<S> for Counts {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let mut summary = Summary(None);
        event.record(&mut summary);
        let kind = summary.0.as_deref().and_then(|text| text.split_whitespace().next()).unwrap_or("?").to_uppercase();
        *self.0.lock().expect("never poisoned").entry(kind).or_default() += 1;
    }
}

/// The `summary` field of sqlx's event: the statement's first words.
struct Summary(Option<String>);

impl tracing::field::Visit for Summary {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "summary" {
            self.0 = Some(value.to_owned());
        }
    }

    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "summary" {
            self.0 = Some(format!("{value:?}").trim_matches('"').to_owned());
        }
    }
}

/// The child's side: counts the statements of a chain on `backend` in this process and returns
/// them, for the parent to read as JSON. Installs this process's tracing subscriber.
pub async fn count_in_this_process(profile: &Profile, backend: &Backend) -> Result<BackendStatements, BenchError> {
    let counts = Counts::default();
    tracing_subscriber::registry()
        .with(counts.clone().with_filter(Targets::new().with_target("sqlx::query", tracing::Level::DEBUG)))
        .try_init()
        .map_err(|error| BenchError::Child(format!("a tracing subscriber was already installed: {error}")))?;
    let settings = &profile.statements;
    let running = chains::start(backend, |chain| chain.bank.faults = chains::instant_bank()).await?;
    let orders = HttpOrders::new(running.chain.address(&GATEWAY_HTTP), "statements", None);
    let name = match backend {
        Backend::Sqlite => "SQLite",
        Backend::Postgres(_) => "PostgreSQL",
    };
    let plan =
        |label: &str, clients: usize| Plan::clients(format!("{name}: {label}"), clients, settings.requests, settings.time_limit, profile.bounds);
    // Connections, caches and prepared statements warm up first.
    let warm = orders.keyed("warm-up");
    load::run(&plan("warm-up", 1), move |index| warm.create(index)).await;
    counts.take();

    let mut rounds = Vec::new();
    let one = orders.keyed("one at a time");
    for (label, clients, class) in [("creates, one at a time", 1, CREATED), ("replays, one at a time", 1, REPLAYED)] {
        let creates = one.clone();
        let measured = load::run(&plan(label, clients), move |index| creates.create(index)).await;
        rounds.push(round(label, clients, measured.count(class), counts.take()));
    }
    let many = orders.keyed("many at once");
    let label = "creates, many at once";
    let measured = load::run(&plan(label, settings.clients), move |index| many.create(index)).await;
    rounds.push(round(label, settings.clients, measured.count(CREATED), counts.take()));
    running.stop().await?;
    Ok(BackendStatements { backend: name.into(), rounds })
}

fn round(label: &str, clients: usize, successes: usize, counted: BTreeMap<String, u64>) -> Round {
    let per = |count: u64| count as f64 / successes.max(1) as f64;
    Round {
        label: label.into(),
        clients,
        successes,
        total_per_request: per(counted.values().sum()),
        per_request: counted.into_iter().map(|(kind, count)| (kind, per(count))).collect(),
    }
}
