//! The database's promises, on a SQLite file and on PostgreSQL: a read never waits for a write
//! and sees the last commit; SQLite's writer commits the work that waits for it together, a
//! failing member takes back only its own work, a caller hears "committed" only after the
//! commit, work whose caller left before its turn never runs, and when the transaction itself
//! is lost (a `BEGIN` refused, a rollback SQLite made on its own) every member is told.
//!
//! The interleavings are forced, not hoped for: a first member holds the writer (its work waits
//! for the test) while the others queue behind it.

use std::{
    task::{Context, Waker},
    time::Duration,
};

use storage::{Database, Error, SqliteSettings, Tx};
use test_support::ScratchDatabase;
use tokio::{sync::oneshot, task::JoinHandle};

const NOTES: &str = "CREATE TABLE notes (id TEXT PRIMARY KEY)";

/// Long enough for any read on a loaded machine; far shorter than the 5 s a caller would wait
/// for the writer.
const READ_LIMIT: Duration = Duration::from_secs(2);

async fn sqlite(dir: &tempfile::TempDir) -> Database {
    let url = format!("sqlite://{}", dir.path().join("notes.db").display());
    let database = Database::open(&url, SqliteSettings::default(), |_| Vec::new())
        .await
        .unwrap();
    database
        .write(async |tx: &mut Tx<'_>| tx.execute(NOTES, &[]).await)
        .await
        .unwrap();
    database
}

async fn postgres(scratch: &ScratchDatabase) -> Database {
    let database = Database::open(scratch.url(), SqliteSettings::default(), |_| Vec::new())
        .await
        .unwrap();
    database
        .write(async |tx: &mut Tx<'_>| tx.execute(NOTES, &[]).await)
        .await
        .unwrap();
    database
}

async fn insert(tx: &mut Tx<'_>, id: &str) -> Result<u64, Error> {
    tx.execute("INSERT INTO notes (id) VALUES ($1)", &[&id])
        .await
}

/// The notes committed, in order.
async fn notes(database: &Database) -> Vec<String> {
    database
        .fetch_all("SELECT id FROM notes ORDER BY id", &[])
        .await
        .unwrap()
}

/// Writes `id`, then holds the writer (on SQLite) or its transaction until `release` fires.
fn hold(
    database: &Database,
    id: &'static str,
) -> (
    JoinHandle<Result<(), Error>>,
    oneshot::Sender<()>,
    oneshot::Receiver<()>,
) {
    let (release, released) = oneshot::channel::<()>();
    let (holding, held) = oneshot::channel::<()>();
    let database = database.clone();
    let holder = tokio::spawn(async move {
        database
            .write(async move |tx: &mut Tx<'_>| {
                insert(tx, id).await?;
                let _ = holding.send(());
                let _ = released.await;
                Ok(())
            })
            .await
    });
    (holder, release, held)
}

/// Queues work on a database's writer from a task of its own. (A macro: a generic function
/// could not tell that the work's future may be sent to another task.)
macro_rules! queue {
    ($database:expr, $work:expr) => {{
        let database = $database.clone();
        tokio::spawn(async move { database.write($work).await })
    }};
}

/// Lets every spawned task run up to where it waits (the test runs on one thread).
async fn settle() {
    for _ in 0..8 {
        tokio::task::yield_now().await;
    }
}

async fn a_read_does_not_wait_for_a_write_in_progress(backend: &str, database: &Database) {
    let (holder, release, held) = hold(database, "a");
    held.await.unwrap();
    let during = tokio::time::timeout(READ_LIMIT, notes(database)).await;
    let during = during.unwrap_or_else(|_| panic!("{backend}: the read waited for the write"));
    assert!(
        during.is_empty(),
        "{backend}: the write in progress is not seen"
    );
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    assert_eq!(
        notes(database).await,
        ["a"],
        "{backend}: the committed write is seen at once"
    );
}

#[tokio::test]
async fn reads_go_beside_a_write_in_progress_and_see_the_last_commit() {
    let dir = tempfile::tempdir().unwrap();
    a_read_does_not_wait_for_a_write_in_progress("sqlite", &sqlite(&dir).await).await;
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let scratch = ScratchDatabase::create(&admin_url, "storage").await;
        a_read_does_not_wait_for_a_write_in_progress("postgres", &postgres(&scratch).await).await;
    }
}

/// Three members behind a holder form one batch with it. The second fails midway (its second
/// insert breaks uniqueness against the holder's uncommitted row, which it sees: same
/// transaction): its first insert is undone with it, its caller gets its error, and the others
/// commit, told so only once the batch has.
#[tokio::test]
async fn a_failing_member_of_a_batch_rolls_back_only_its_own_work() {
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let (holder, release, held) = hold(&database, "a");
    held.await.unwrap();
    let first = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "b")
        .await
        .map(drop));
    let failing = queue!(database, async |tx: &mut Tx<'_>| {
        insert(tx, "c").await?;
        insert(tx, "a").await.map(drop)
    });
    let third = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "d")
        .await
        .map(drop));
    settle().await;
    assert!(
        !first.is_finished(),
        "a member is not told before its batch commits"
    );
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    first.await.unwrap().unwrap();
    let failed = failing
        .await
        .unwrap()
        .expect_err("the second insert of the failing member breaks uniqueness");
    assert!(matches!(failed, Error::Sqlite(_)), "{failed:?}");
    third.await.unwrap().unwrap();
    assert_eq!(notes(&database).await, ["a", "b", "d"]);
}

/// A caller that stops waiting before its work's turn (a request's deadline passing) leaves
/// nothing behind: its work never runs.
#[tokio::test]
async fn work_whose_caller_left_before_its_turn_never_runs() {
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let (holder, release, held) = hold(&database, "a");
    held.await.unwrap();
    let abandoned = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "abandoned")
        .await
        .map(drop));
    let kept = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "kept")
        .await
        .map(drop));
    settle().await;
    abandoned.abort();
    settle().await;
    release.send(()).unwrap();
    holder.await.unwrap().unwrap();
    kept.await.unwrap().unwrap();
    assert_eq!(notes(&database).await, ["a", "kept"]);
}

/// When SQLite rolls the whole transaction back by itself (after BUSY, FULL, IOERR or NOMEM
/// inside a statement; here forced with a `ROLLBACK` of the member's own), every member of the
/// batch is told that its work is gone, none that it committed, and the members after it run in
/// a transaction of their own.
#[tokio::test]
async fn a_transaction_sqlite_rolled_back_is_reported_to_every_member() {
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let (holder, release, held) = hold(&database, "a");
    held.await.unwrap();
    let before = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "b")
        .await
        .map(drop));
    let rolling_back = queue!(database, async |tx: &mut Tx<'_>| {
        insert(tx, "c").await?;
        tx.execute("ROLLBACK", &[]).await.map(drop)
    });
    settle().await;
    let after = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "d")
        .await
        .map(drop));
    let after_that = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "e")
        .await
        .map(drop));
    settle().await;
    release.send(()).unwrap();
    for (member, outcome) in [
        ("holder", holder.await.unwrap()),
        ("before", before.await.unwrap()),
        ("rolling back", rolling_back.await.unwrap()),
    ] {
        let error = outcome.expect_err(member);
        assert!(matches!(error, Error::RolledBack(_)), "{member}: {error:?}");
    }
    after.await.unwrap().unwrap();
    after_that.await.unwrap().unwrap();
    assert_eq!(notes(&database).await, ["d", "e"]);
}

/// Another process holds the file's write lock past the busy timeout: the writer's `BEGIN`
/// fails, and the work it was for is refused (as the database out of reach: retryable) without
/// running; work queued behind it runs in a transaction of its own once the lock is free, and
/// is told the truth: nothing committed that a caller was told was rolled back.
#[tokio::test]
async fn a_begin_refused_by_a_lock_runs_nothing_outside_a_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let outside = rusqlite::Connection::open(dir.path().join("notes.db")).unwrap();
    outside.execute_batch("BEGIN IMMEDIATE").unwrap();
    let refused = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "refused")
        .await
        .map(drop));
    settle().await;
    let behind = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "behind")
        .await
        .map(drop));
    let behind_too = queue!(database, async |tx: &mut Tx<'_>| insert(tx, "behind too")
        .await
        .map(drop));
    let error = refused
        .await
        .unwrap()
        .expect_err("the lock outlasts the busy timeout");
    assert!(
        error.is_unreachable(),
        "a locked file is a retryable failure: {error:?}"
    );
    outside.execute_batch("COMMIT").unwrap();
    behind.await.unwrap().unwrap();
    behind_too.await.unwrap().unwrap();
    assert_eq!(notes(&database).await, ["behind", "behind too"]);
}

/// Connections of this database that sit inside a transaction nobody is running statements in.
async fn idle_in_transaction(database: &Database) -> i64 {
    database
        .fetch_one("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%'", &[])
        .await
        .unwrap()
}

/// A request whose deadline passes drops its write at any point: here after one to four polls,
/// with the `BEGIN` on its way, answered, or the work under way. No connection may go back to
/// the pool inside a transaction, and nothing of the dropped work is committed, while a write
/// after each drop is.
#[tokio::test]
async fn a_write_dropped_midway_on_postgresql_leaves_no_connection_inside_a_transaction() {
    let Some(admin_url) = test_support::postgres_admin_url() else {
        return;
    };
    let scratch = ScratchDatabase::create(&admin_url, "storage").await;
    let database = postgres(&scratch).await;
    for step in 0..40 {
        let dropped = format!("dropped-{step}");
        let mut write = std::pin::pin!(database.write(async move |tx: &mut Tx<'_>| {
            insert(tx, &dropped).await?;
            std::future::pending::<Result<(), Error>>().await
        }));
        for _ in 0..=step % 4 {
            let _ = write.as_mut().poll(&mut Context::from_waker(Waker::noop()));
            tokio::task::yield_now().await;
        }
        let kept = format!("kept-{step:02}");
        database
            .write(async move |tx: &mut Tx<'_>| insert(tx, &kept).await)
            .await
            .unwrap();
    }
    test_support::eventually(
        Duration::from_secs(5),
        "no connection left inside a transaction",
        || async { idle_in_transaction(&database).await == 0 },
    )
    .await;
    let committed = notes(&database).await;
    assert_eq!(
        committed,
        (0..40)
            .map(|step| format!("kept-{step:02}"))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn a_database_out_of_reach_is_told_apart_from_a_failed_statement() {
    // Port 1 on loopback: nothing listens there, the connection is refused.
    let refused = Database::open(
        "postgres://chain:chain@127.0.0.1:1/orders",
        SqliteSettings::default(),
        |_| Vec::new(),
    )
    .await
    .expect_err("nothing listens on port 1");
    assert!(refused.is_unreachable(), "{refused:?}");
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let failed = database
        .fetch_all::<(String,)>("SELECT * FROM no_such_table", &[])
        .await
        .expect_err("no such table");
    assert!(!failed.is_unreachable(), "{failed:?}");
}

/// A statement that names `$2` before `$1` binds each by its number on SQLite too.
#[tokio::test]
async fn parameters_bind_by_their_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let database = sqlite(&dir).await;
    let row: (String, i64) = database
        .fetch_one("SELECT $2, $1", &[&7_i64, &"second"])
        .await
        .unwrap();
    assert_eq!(row, ("second".to_owned(), 7));
}
