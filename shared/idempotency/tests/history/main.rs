//! A history checker against the real store, Jepsen's way: many clients run orders' create
//! flow over `KeyStore` on SQLite and on PostgreSQL, with two completers, the reaper, a clock that
//! jumps, faults (lost bank requests and replies, refusals before the bank, tasks dropped
//! midway) and the store's pause points held at random; every invocation, answer and bank
//! execution is recorded, and the promises are checked on the history and the rows it left.
//!
//! Each run prints its seed. `HISTORY_SEED=<seed>` replays one (its random choices: the
//! interleaving itself is the scheduler's and the database's); `HISTORY_SEEDS=<n>` runs `n`
//! seeds from a random start instead of the default few.

mod check;
mod simulation;

use std::time::{Duration, Instant};

use storage::{Database, SqliteSettings};
use test_support::ScratchDatabase;

use crate::simulation::{TTL_MS, World};

/// Seeds per backend in an ordinary run (CI's).
const DEFAULT_SEEDS: u64 = 3;
/// A run that takes longer than this is stuck: the seed fails instead of hanging.
const RUN_LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_on_sqlite_keep_every_promise() {
    for seed in seeds() {
        let dir = tempfile::tempdir().unwrap();
        let database = connect(&format!(
            "sqlite://{}",
            dir.path().join("history.db").display()
        ))
        .await;
        run_seed("sqlite", database, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histories_on_postgres_keep_every_promise() {
    let Some(admin_url) = test_support::postgres_admin_url() else {
        return;
    };
    for seed in seeds() {
        let scratch = ScratchDatabase::create(&admin_url, "history").await;
        run_seed("postgres", connect(scratch.url()).await, seed).await;
    }
}

async fn connect(url: &str) -> Database {
    Database::open(url, SqliteSettings::default(), |backend| {
        vec![idempotency::migrations(backend)]
    })
    .await
    .unwrap()
}

/// `HISTORY_SEED` alone, or `HISTORY_SEEDS` (default `DEFAULT_SEEDS`) consecutive seeds from a
/// random one.
fn seeds() -> Vec<u64> {
    if let Ok(seed) = std::env::var("HISTORY_SEED") {
        return vec![seed.parse().expect("HISTORY_SEED is a number")];
    }
    let count = std::env::var("HISTORY_SEEDS").map_or(DEFAULT_SEEDS, |count| {
        count.parse().expect("HISTORY_SEEDS is a number")
    });
    let first: u64 = rand::random();
    (0..count).map(|n| first.wrapping_add(n)).collect()
}

async fn run_seed(backend: &str, database: Database, seed: u64) {
    let started = Instant::now();
    let world = World::new(database, seed).await;
    let outcome = tokio::time::timeout(RUN_LIMIT, world.run())
        .await
        .unwrap_or_else(|_| {
            panic!("{backend}, HISTORY_SEED={seed}: the run did not end within {RUN_LIMIT:?}")
        });
    let (summary, violations) = check::check(
        &outcome.events,
        &outcome.orders,
        &outcome.keys,
        TTL_MS as i64,
    );
    println!(
        "history on {backend}, HISTORY_SEED={seed}: {} creates answered {:?}, {} orders, {} bank executions, in {:.1} s",
        summary.invocations,
        summary.by_answer,
        summary.orders,
        summary.bank_executions,
        started.elapsed().as_secs_f64()
    );
    assert!(
        violations.is_empty(),
        "{backend}, HISTORY_SEED={seed} (replay: HISTORY_SEED={seed} cargo test -p idempotency --test history {backend}):\n{}",
        violations.join("\n")
    );
}
