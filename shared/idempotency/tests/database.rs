//! The database's writes and reads: a read never queues behind a write, and sees the last
//! commit, not the write in progress (on a SQLite file, whose one writer connection a phase
//! holds for its whole transaction, and on PostgreSQL); SQLite's writer commits the transactions
//! that wait for it together, and one that fails takes only its own work back.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll, Waker},
    time::Duration,
};

use idempotency::Database;
use test_support::ScratchDatabase;

/// Long enough for any read on a loaded machine; far shorter than the 5 s a read would wait for
/// the writer's connection.
const READ_LIMIT: Duration = Duration::from_secs(2);

fn poll_once<F: Future>(future: Pin<&mut F>) -> Poll<F::Output> {
    future.poll(&mut Context::from_waker(Waker::noop()))
}

async fn insert_key(transaction: &mut idempotency::Transaction, key: &str) -> Result<(), sqlx::Error> {
    idempotency::on_driver!(transaction, |executor| sqlx::query(
        "INSERT INTO idempotency_keys (scope, idempotency_key, fingerprint, state, recovery_point, lock_token, locked_until, created_at, expires_at) \
         VALUES ('s', $1, 'f', 'in_flight', 'started', 1, 0, 0, 1)",
    )
    .bind(key)
    .execute(executor)
    .await
    .map(drop))
}

/// The keys a SQLite database holds, in order.
async fn committed_keys(database: &Database) -> Vec<String> {
    let mut committed: Vec<String> = match database.reader() {
        idempotency::Pool::Sqlite(pool) => sqlx::query_scalar("SELECT idempotency_key FROM idempotency_keys").fetch_all(pool).await.unwrap(),
        idempotency::Pool::Postgres(_) => unreachable!("the batching writer is SQLite's"),
    };
    committed.sort();
    committed
}

async fn keys(pool: &idempotency::Pool) -> i64 {
    idempotency::on_driver!(pool, |executor| sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys").fetch_one(executor).await.unwrap())
}

async fn a_read_does_not_wait_for_a_write_in_progress(backend: &str, database: &Database) {
    let mut write = database.begin().await.unwrap();
    insert_key(&mut write, "k").await.unwrap();

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

/// Three transactions wait for SQLite's writer together and are committed in one batch, each
/// in a savepoint of its own. The second fails midway (its second statement breaks the key's
/// uniqueness) and is dropped, as a request drops its transaction on an error: its first
/// statement is undone with it, and the first and third transactions commit.
///
/// The interleaving is forced, not hoped for: the second and third ask for the writer while the
/// first holds it, so the writer takes them into the transaction it has open; while the third
/// holds the writer, the first's commit has not returned and nothing of the batch is visible.
#[tokio::test]
async fn a_failing_transaction_in_a_batch_rolls_back_only_its_own_work() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut first = database.begin().await.unwrap();
    insert_key(&mut first, "first").await.unwrap();

    let mut failing = std::pin::pin!(async {
        let mut transaction = database.begin().await?;
        insert_key(&mut transaction, "failing").await?;
        insert_key(&mut transaction, "first").await?;
        transaction.commit().await
    });
    let mut third = std::pin::pin!(database.begin());
    assert!(poll_once(failing.as_mut()).is_pending(), "the second waits for the writer");
    assert!(poll_once(third.as_mut()).is_pending(), "the third waits behind it");

    let mut first_commit = std::pin::pin!(first.commit());
    assert!(poll_once(first_commit.as_mut()).is_pending(), "the first hands the writer on and waits for the batch");
    let (failed, third) = tokio::join!(failing, third);
    let failed = failed.expect_err("the second breaks the key's uniqueness");
    assert!(matches!(&failed, sqlx::Error::Database(error) if error.is_unique_violation()), "{failed}");
    let mut third = third.unwrap();
    insert_key(&mut third, "third").await.unwrap();
    assert!(poll_once(first_commit.as_mut()).is_pending(), "the first is committed with the batch, not before");
    assert_eq!(keys(database.reader()).await, 0, "nothing of an open batch is seen");

    let (first, third) = tokio::join!(first_commit, third.commit());
    first.unwrap();
    third.unwrap();
    let committed = committed_keys(&database).await;
    assert_eq!(committed, ["first", "third"], "the failed transaction's own insert is undone, the others' kept");
}

/// In a batch of four, the second and third members each run in a savepoint that stays open
/// until the batch commits; the third is dropped after its statement, and rolling back to the
/// newest savepoint undoes its work alone, not the second's, which sits in the savepoint below.
#[tokio::test]
async fn a_member_dropped_after_a_kept_one_undoes_only_its_own_work() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut first = database.begin().await.unwrap();
    let mut second = std::pin::pin!(database.begin());
    let mut third = std::pin::pin!(database.begin());
    let mut fourth = std::pin::pin!(database.begin());
    for waiting in [poll_once(second.as_mut()).is_pending(), poll_once(third.as_mut()).is_pending(), poll_once(fourth.as_mut()).is_pending()] {
        assert!(waiting, "the others queue behind the first");
    }
    insert_key(&mut first, "first").await.unwrap();
    let mut first_commit = std::pin::pin!(first.commit());
    assert!(poll_once(first_commit.as_mut()).is_pending(), "the first waits for the batch");

    let mut second = second.await.unwrap();
    insert_key(&mut second, "second").await.unwrap();
    let mut second_commit = std::pin::pin!(second.commit());
    assert!(poll_once(second_commit.as_mut()).is_pending(), "the second waits for the batch");

    let mut third = third.await.unwrap();
    insert_key(&mut third, "third").await.unwrap();
    drop(third);

    let mut fourth = fourth.await.unwrap();
    insert_key(&mut fourth, "fourth").await.unwrap();
    let (first, second, fourth) = tokio::join!(first_commit, second_commit, fourth.commit());
    first.unwrap();
    second.unwrap();
    fourth.unwrap();
    let committed = committed_keys(&database).await;
    assert_eq!(committed, ["first", "fourth", "second"], "only the dropped member's insert is undone");
}

/// Connections of this database that sit inside a transaction nobody is running statements in.
async fn idle_in_transaction(admin: &Database) -> i64 {
    sqlx::query_scalar("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'")
        .fetch_one(match admin.reader() {
            idempotency::Pool::Postgres(pool) => pool,
            idempotency::Pool::Sqlite(_) => unreachable!("pg_stat_activity is PostgreSQL's"),
        })
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
        .execute(match database.reader() {
            idempotency::Pool::Postgres(pool) => pool,
            idempotency::Pool::Sqlite(_) => unreachable!("this test runs on PostgreSQL"),
        })
        .await
        .unwrap();
        assert_eq!(keys(observer.reader()).await, step + 1, "the write after drop {step} is committed");
    }
    test_support::eventually(Duration::from_secs(5), "no connection left inside a transaction", || async {
        idle_in_transaction(&observer).await == 0
    })
    .await;
}

#[tokio::test]
async fn a_database_out_of_reach_is_told_apart_from_a_failed_statement() {
    use sqlx::Connection;
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let refused = sqlx::PgConnection::connect("postgres://chain:chain@127.0.0.1:1/orders").await.expect_err("nothing listens on port 1");
    assert!(idempotency::is_unreachable(&refused), "{refused:?}");
    let mut sqlite = sqlx::SqliteConnection::connect("sqlite::memory:").await.unwrap();
    let failed = sqlx::query("SELECT * FROM no_such_table").execute(&mut sqlite).await.expect_err("no such table");
    assert!(!idempotency::is_unreachable(&failed), "{failed:?}");
    assert!(!idempotency::is_unreachable(&sqlx::Error::RowNotFound));
    assert!(idempotency::is_unreachable(&sqlx::Error::PoolTimedOut));
}

/// Work sent to SQLite's writer ([`Database::transact`]) joins its batches as a lent transaction
/// does. Three jobs queue while a lent transaction holds the writer and are run in its batch;
/// the second fails at its second statement (the key's uniqueness), and only its own work is
/// undone: its caller gets the error, the others commit with the batch.
#[tokio::test]
async fn a_failing_job_in_a_batch_rolls_back_only_its_own_work() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut holder = database.begin().await.unwrap();
    insert_key(&mut holder, "holder").await.unwrap();

    let job = |keys: &'static [&'static str]| {
        let database = database.clone();
        async move {
            database
                .transact(move |transaction| {
                    Box::pin(async move {
                        for key in keys {
                            insert_key(transaction, key).await?;
                        }
                        Ok::<_, sqlx::Error>(())
                    })
                })
                .await
        }
    };
    assert_unique_violation(&batch_behind(holder, job(&["first"]), job(&["failing", "holder"]), job(&["third"])).await);
    assert_eq!(committed_keys(&database).await, ["first", "holder", "third"], "the failed job's own insert is undone, the others' kept");
}

/// Queues three writes behind `holder`, which holds SQLite's writer, so that they run in its
/// batch once it commits; the first and the third succeed, and the second's error is returned.
async fn batch_behind<F, G, H>(holder: idempotency::Transaction, first: F, failing: G, third: H) -> sqlx::Error
where
    F: Future<Output = Result<(), sqlx::Error>>,
    G: Future<Output = Result<(), sqlx::Error>>,
    H: Future<Output = Result<(), sqlx::Error>>,
{
    let (mut first, mut failing, mut third) = (std::pin::pin!(first), std::pin::pin!(failing), std::pin::pin!(third));
    for queued in [poll_once(first.as_mut()).is_pending(), poll_once(failing.as_mut()).is_pending(), poll_once(third.as_mut()).is_pending()] {
        assert!(queued, "each write queues behind the transaction that holds the writer");
    }
    let (holder, first, failing, third) = tokio::join!(holder.commit(), first, failing, third);
    holder.unwrap();
    first.unwrap();
    third.unwrap();
    failing.expect_err("the second fails")
}

/// The second of [`batch_behind`]'s writes broke the key's uniqueness (it inserted the holder's
/// key again).
fn assert_unique_violation(failed: &sqlx::Error) {
    assert!(matches!(failed, sqlx::Error::Database(error) if error.is_unique_violation()), "{failed}");
}

/// Statements that are each safe alone ([`Database::autocommit`]) join a batch without a
/// savepoint of their own: one that fails is undone by SQLite alone, the statements before it
/// stay, and nobody else's work is touched (going back to a savepoint there would undo the
/// member before it).
#[tokio::test]
async fn a_failing_autocommit_in_a_batch_undoes_only_its_failed_statement() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut holder = database.begin().await.unwrap();
    insert_key(&mut holder, "holder").await.unwrap();

    let failing = database.autocommit(|writes| {
        Box::pin(async move {
            insert_key(writes, "kept").await?;
            insert_key(writes, "holder").await
        })
    });
    let insert = |key: &'static str| database.transact(move |transaction| Box::pin(async move { insert_key(transaction, key).await }));
    assert_unique_violation(&batch_behind(holder, insert("first"), failing, insert("third")).await);
    assert_eq!(committed_keys(&database).await, ["first", "holder", "kept", "third"]);
}

/// A job that fails before its first statement opened nothing: the savepoint the writer would
/// have sent with that statement was never made, so nothing is rolled back for it. Going back to
/// the newest savepoint instead would undo the member before it, which its caller is told has
/// committed.
#[tokio::test]
async fn a_job_that_fails_before_its_first_statement_leaves_its_batch_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut holder = database.begin().await.unwrap();
    insert_key(&mut holder, "holder").await.unwrap();
    let insert = |key: &'static str| database.transact(move |transaction| Box::pin(async move { insert_key(transaction, key).await }));
    let refused = database.transact(|_| Box::pin(async move { Err::<(), _>(sqlx::Error::Protocol("refused before any statement".into())) }));
    let refused = batch_behind(holder, insert("first"), refused, insert("third")).await;
    assert!(matches!(refused, sqlx::Error::Protocol(_)), "the job's own error: {refused}");
    assert_eq!(committed_keys(&database).await, ["first", "holder", "third"]);
}

/// The writer's `BEGIN` or `SAVEPOINT` goes to SQLite with a job's first statement, and what
/// that statement reports is its own: an `UPDATE` that matches nothing changed 0 rows, though
/// SQLite reports, for the opening statement, the rows of the statement before it (how a phase
/// learns that its lease was lost). Both as the first of a batch and as a later member.
#[tokio::test]
async fn a_statement_sent_with_the_writers_opening_reports_only_its_own_rows() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let update_nothing = || {
        database.transact(|transaction| {
            Box::pin(async move {
                Ok::<_, sqlx::Error>(idempotency::on_driver!(transaction, |executor| sqlx::query(
                    "UPDATE idempotency_keys SET locked_until = 1 WHERE idempotency_key = 'nobody'"
                )
                .execute(executor)
                .await?
                .rows_affected()))
            })
        })
    };
    database.transact(|transaction| Box::pin(async move { insert_key(transaction, "before").await })).await.unwrap();
    assert_eq!(update_nothing().await.unwrap(), 0, "as the first of a batch, after an insert");

    let mut holder = database.begin().await.unwrap();
    insert_key(&mut holder, "holder").await.unwrap();
    let insert = database.transact(|transaction| Box::pin(async move { insert_key(transaction, "member").await }));
    let (mut insert, mut updated) = (std::pin::pin!(insert), std::pin::pin!(update_nothing()));
    assert!(poll_once(insert.as_mut()).is_pending() && poll_once(updated.as_mut()).is_pending(), "both queue behind the holder");
    let (holder, insert, updated) = tokio::join!(holder.commit(), insert, updated);
    holder.unwrap();
    insert.unwrap();
    assert_eq!(updated.unwrap(), 0, "as a later member, after another member's insert");
}

/// With nothing else waiting for SQLite's writer, statements each safe alone run outside any
/// transaction (no `BEGIN` and `COMMIT` round trips around them): SQLite runs a `VACUUM`, which
/// it refuses inside a transaction, as work in a transaction shows.
#[tokio::test]
async fn an_autocommit_alone_on_the_writer_runs_outside_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    fn vacuum(transaction: &mut idempotency::Transaction) -> futures::future::BoxFuture<'_, Result<(), sqlx::Error>> {
        Box::pin(async move { idempotency::on_driver!(transaction, |executor| sqlx::query("VACUUM").execute(executor).await.map(drop)) })
    }
    database.autocommit(vacuum).await.expect("alone, the statement runs by itself");
    let in_transaction = database.transact(vacuum).await.expect_err("SQLite refuses VACUUM inside a transaction");
    assert!(in_transaction.to_string().contains("within a transaction"), "{in_transaction}");
    database.autocommit(vacuum).await.expect("alone, the statement runs by itself");
}

/// A job whose caller stops waiting still runs and commits: like a reply lost on the way back,
/// the caller does not hear of it, and its work is not half-done.
#[tokio::test]
async fn a_job_whose_caller_stops_waiting_still_commits() {
    let dir = tempfile::tempdir().unwrap();
    let database = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let holder = database.begin().await.unwrap();
    let mut abandoned = Box::pin(database.transact(|transaction| Box::pin(async move { insert_key(transaction, "abandoned").await })));
    assert!(poll_once(abandoned.as_mut()).is_pending(), "the job is queued");
    drop(abandoned);
    holder.commit().await.unwrap();
    // The job runs on the writer after the holder's work, in the same batch or the next one.
    let committed = tokio::time::timeout(READ_LIMIT, async {
        loop {
            let committed = committed_keys(&database).await;
            if !committed.is_empty() {
                return committed;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("the abandoned job commits");
    assert_eq!(committed, ["abandoned"]);
}

/// On PostgreSQL, by contrast, `transact` runs its work in the caller's future: dropped after the
/// work's insert and before its `COMMIT`, the transaction is rolled back, and no connection is left
/// inside it.
#[tokio::test]
async fn a_transaction_whose_caller_stops_waiting_is_rolled_back_on_postgresql() {
    let Some(admin_url) = test_support::postgres_admin_url() else { return };
    let scratch = ScratchDatabase::create(&admin_url, "keys").await;
    let database = Database::connect(scratch.url()).await.unwrap();
    let (inserted, insert_made) = tokio::sync::oneshot::channel();
    let abandoned = database.transact(move |transaction| {
        Box::pin(async move {
            insert_key(transaction, "abandoned").await?;
            let _ = inserted.send(());
            std::future::pending::<Result<(), sqlx::Error>>().await
        })
    });
    tokio::select! {
        _ = abandoned => unreachable!("the work never ends"),
        _ = insert_made => {}
    }
    database.autocommit(|transaction| Box::pin(async move { insert_key(transaction, "later").await })).await.unwrap();
    let observer = Database::connect(scratch.url()).await.unwrap();
    test_support::eventually(Duration::from_secs(5), "no connection left inside a transaction", || async {
        idle_in_transaction(&observer).await == 0
    })
    .await;
    assert_eq!(keys(observer.reader()).await, 1, "the later write alone is committed");
}
