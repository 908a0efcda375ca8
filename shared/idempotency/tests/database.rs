//! The database's two pools: a read never queues behind a write, and sees the last commit, not
//! the write in progress. On a SQLite file, whose one writer connection a phase holds for its
//! whole transaction, and on PostgreSQL.

use std::{
    future::Future,
    task::{Context, Waker},
    time::Duration,
};

use idempotency::Database;
use test_support::ScratchDatabase;

/// Long enough for any read on a loaded machine; far shorter than the 5 s a read would wait for
/// the writer's connection.
const READ_LIMIT: Duration = Duration::from_secs(2);

async fn keys(pool: &sqlx::AnyPool) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys").fetch_one(pool).await.unwrap()
}

async fn a_read_does_not_wait_for_a_write_in_progress(backend: &str, database: &Database) {
    let mut write = database.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, state, recovery_point, lock_token, locked_until, created_at, expires_at) \
         VALUES ('s', 'k', 'f', 'in_flight', 'started', 1, 0, 0, 1)",
    )
    .execute(&mut *write)
    .await
    .unwrap();

    let during = tokio::time::timeout(READ_LIMIT, keys(database.reader())).await;
    let during = during.unwrap_or_else(|_| panic!("{backend}: the read waited for the write"));
    assert_eq!(during, 0, "{backend}: the write in progress is not seen");
    write.commit().await.unwrap();
    assert_eq!(keys(database.reader()).await, 1, "{backend}: the committed write is seen at once");
}

#[tokio::test]
async fn reads_go_beside_a_write_in_progress_and_see_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    a_read_does_not_wait_for_a_write_in_progress("sqlite", &sqlite).await;
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let scratch = ScratchDatabase::create(&admin_url, "keys").await;
        let postgres = Database::connect(scratch.url()).await.unwrap();
        a_read_does_not_wait_for_a_write_in_progress("postgres", &postgres).await;
    }
}

/// Connections of this database that sit inside a transaction nobody is running statements in.
async fn idle_in_transaction(admin: &Database) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'")
        .fetch_one(admin.pool())
        .await
        .unwrap()
}

/// A request whose deadline passes while its phase's `BEGIN` runs drops that future at any
/// point: here after one to four polls, with the `BEGIN` on its way or answered. No connection may
/// go back to the pool inside the transaction, and a write right after each drop is committed,
/// as seen from another connection.
#[tokio::test]
async fn a_begin_dropped_midway_leaves_no_connection_inside_a_transaction() {
    let Some(admin_url) = test_support::postgres_admin_url() else { return };
    let scratch = ScratchDatabase::create(&admin_url, "keys").await;
    let database = Database::connect(scratch.url()).await.unwrap();
    let observer = Database::connect(scratch.url()).await.unwrap();
    for step in 0..40 {
        let mut begin = std::pin::pin!(database.begin());
        for _ in 0..=step % 4 {
            // Answered already: the transaction it returns is dropped, the way a caller drops it.
            if begin.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready() {
                break;
            }
            tokio::task::yield_now().await;
        }
        sqlx::query(
            "INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, state, recovery_point, lock_token, locked_until, created_at, expires_at) \
             VALUES ('s', $1, 'f', 'in_flight', 'started', 1, 0, 0, 1)",
        )
        .bind(format!("k-{step}"))
        .execute(database.pool())
        .await
        .unwrap();
        assert_eq!(keys(observer.pool()).await, step + 1, "the write after drop {step} is committed");
    }
    test_support::eventually(Duration::from_secs(5), "no connection left inside a transaction", || async { idle_in_transaction(&observer).await == 0 }).await;
}
