//! One service's database, SQLite or PostgreSQL, through sqlx's typed drivers.

mod affinity;
mod sqlite_executor;
mod wakeup;
mod writer;

pub use sqlite_executor::SqliteExecutor;

use std::{num::NonZeroU32, str::FromStr, time::Duration};

use futures::future::BoxFuture;
use sqlx::{
    PgConnection, PgPool, Postgres, Sqlite, SqliteConnection, SqlitePool,
    migrate::{MigrateError, Migrator},
    pool::PoolConnection,
    postgres::PgPoolOptions,
    sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous},
};
use tokio::sync::oneshot;

/// When a SQLite commit is on disk (`PRAGMA synchronous` in WAL mode). PostgreSQL's is the
/// server's `synchronous_commit` (`on` by default: a commit waits for its WAL to be flushed).
/// `Full` by default, as PostgreSQL's: a commit forgotten after a power loss is an answer a
/// client already has (a paid create), and its repeat would then pay a second order.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// The WAL is synced at checkpoints, not at each commit: a commit survives a crash of the
    /// process, and the last commits before a power loss or an OS crash may be rolled back.
    Normal,
    /// The WAL is synced at every commit: a commit survives a power loss too.
    #[default]
    Full,
}

/// How a SQLite database is written: when a commit is on disk, and how the one writer batches
/// the transactions that wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqliteSettings {
    pub synchronous: Synchronous,
    /// Most transactions committed together.
    pub max_batch: NonZeroU32,
    /// How long a batch with room left waits for one more transaction before it commits, in
    /// µs; 0 commits as soon as nobody is waiting.
    pub batch_wait_us: u64,
}

impl Default for SqliteSettings {
    fn default() -> Self {
        Self { synchronous: Synchronous::default(), max_batch: NonZeroU32::new(64).expect("not zero"), batch_wait_us: 0 }
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of(url: &str) -> Result<Self, DatabaseError> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:") && !url.contains(":memory:") && !url.contains("mode=memory") {
            Ok(Backend::Sqlite)
        } else {
            Err(DatabaseError::UnsupportedUrl(url.to_owned()))
        }
    }
}

/// A pool of one driver or the other, for reads: see [`Database::reader`].
#[derive(Debug, Clone)]
pub enum Pool {
    Sqlite(SqlitePool),
    Postgres(PgPool),
}

/// A service's database: SQLite's one batching writer and its readers, or a PostgreSQL pool.
#[derive(Debug, Clone)]
pub struct Database {
    writes: Writes,
    reader: Pool,
}

#[derive(Debug, Clone)]
enum Writes {
    Sqlite(writer::Writer),
    Postgres(PgPool),
}

/// Connections of the SQLite reader pool: reads beside the one writer, in WAL mode.
const SQLITE_READERS: u32 = 4;

/// How long SQLite waits for another process's write lock, and anyone for a pooled connection.
const WAIT: Duration = Duration::from_secs(5);

/// A pooled PostgreSQL connection is checked before use (a ping, one round trip to the server)
/// only after it has sat idle this long. sqlx pings on every acquire by default, which adds a
/// round trip to each transaction, while a connection just handed back is known to have worked
/// (sqlx pings it on release too). SQLite's readers are never checked: a file does not hang up.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error("unsupported database URL {0:?}: use sqlite://FILE or postgres://…")]
    UnsupportedUrl(String),
    #[error("connecting to the database: {0}")]
    Connect(#[from] sqlx::Error),
    #[error("migrating the database: {0}")]
    Migrate(#[from] MigrateError),
    #[error("creating the database file: {0}")]
    Create(#[from] std::io::Error),
}

/// Creates the SQLite file `path`, when missing, readable and writable by its owner only: it holds
/// every order and payment, and the stored answers. SQLite gives its `-wal` and `-shm` files the
/// permissions of the database file.
fn create_private(path: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path) {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => Err(error),
        _ => Ok(()),
    }
}

/// Whether `error` says the database could not be reached rather than that a statement failed:
/// no connection (refused, name not resolved, lost midway, none free in time), or the server
/// shutting down or not yet accepting connections. Such a failure passes once the database is
/// back, so a service answers it as unavailable (retryable), not as an internal error.
pub fn is_unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed => true,
        // SQLSTATE class 08 (connection exception), 57P01..57P03 (shutdown, crash, starting up).
        sqlx::Error::Database(error) => error.code().is_some_and(|code| code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")),
        _ => false,
    }
}

/// The migrations of one crate, named by its owner: each owner's history is kept in a table of
/// its own (`_sqlx_migrations_<owner>`), so that two crates' versions never collide.
pub type Migrations = (&'static str, Migrator);

impl Database {
    /// Connects with the default [`SqliteSettings`] and applies the key store's migrations.
    pub async fn connect(url: &str) -> Result<Self, DatabaseError> {
        Self::open(url, SqliteSettings::default(), |_| Vec::new()).await
    }

    /// Connects (creating a SQLite file when missing), applies the key store's migrations and
    /// then those `migrations` chooses for the backend (a crate's `sqlx::migrate!` paths are its
    /// own, so it chooses), all before the first request.
    pub async fn open(url: &str, sqlite: SqliteSettings, migrations: impl FnOnce(Backend) -> Vec<Migrations>) -> Result<Self, DatabaseError> {
        let backend = Backend::of(url)?;
        let mut all = vec![(
            "idempotency",
            match backend {
                Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
                Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
            },
        )];
        all.extend(migrations(backend));
        match backend {
            Backend::Sqlite => {
                let options = SqliteConnectOptions::from_str(url)?.busy_timeout(WAIT);
                create_private(options.get_filename())?;
                // WAL lets the readers run beside the one writer, which creates the file. A
                // batch's savepoints keep the pages their members change in a sub-journal, a
                // temporary file once it outgrows 64 KiB: kept in memory, it is never written.
                let writes = options
                    .clone()
                    .create_if_missing(true)
                    .journal_mode(SqliteJournalMode::Wal)
                    .synchronous(match sqlite.synchronous {
                        Synchronous::Normal => SqliteSynchronous::Normal,
                        Synchronous::Full => SqliteSynchronous::Full,
                    })
                    .pragma("temp_store", "memory");
                let writer = writer::Writer::spawn(writes, all, &sqlite).await?;
                let reader = SqlitePoolOptions::new()
                    .max_connections(SQLITE_READERS)
                    .acquire_timeout(WAIT)
                    .test_before_acquire(false)
                    .connect_with(options.read_only(true))
                    .await?;
                Ok(Self { writes: Writes::Sqlite(writer), reader: Pool::Sqlite(reader) })
            }
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(WAIT)
                    .test_before_acquire(false)
                    .before_acquire(|connection, idle| {
                        Box::pin(async move { Ok(idle.idle_for < CHECK_AFTER_IDLE || sqlx::Connection::ping(connection).await.is_ok()) })
                    })
                    .connect(url)
                    .await?;
                for (owner, migrator) in all {
                    migrate(owner, migrator, &pool).await?;
                }
                Ok(Self { writes: Writes::Postgres(pool.clone()), reader: Pool::Postgres(pool) })
            }
        }
    }

    /// Begins a write transaction.
    ///
    /// On SQLite, the transaction is one member of the writer's current batch (see
    /// [`SqliteSettings`]): its statements run on the one writer connection inside a SAVEPOINT of
    /// their own, and [`Transaction::commit`] returns once the whole batch is committed.
    ///
    /// On PostgreSQL, the `BEGIN` runs on a task of its own, because of how sqlx 0.9 cancels it:
    /// if the future is dropped while the `BEGIN` runs (a request's deadline passing), its guard
    /// rolls nothing back (it only rolls back a transaction already counted), and the connection
    /// returns to the pool inside a transaction that every later statement on it joins and none
    /// commits: their writes are lost when it closes, and their row locks held until then. On its
    /// own task the `BEGIN` completes whatever happens to the caller, and a transaction nobody
    /// takes any more is dropped there, which rolls it back. (sqlx issue 4393, fixed upstream
    /// after 0.9.0; the test `a_begin_dropped_midway_leaves_no_connection_inside_a_transaction`
    /// shows both.)
    ///
    /// The transaction returned is the caller's: dropped without [`Transaction::commit`], on
    /// either backend, its work is rolled back.
    pub async fn begin(&self) -> Result<Transaction, sqlx::Error> {
        match &self.writes {
            Writes::Sqlite(writer) => Ok(Transaction(Open::Batched(writer.join().await?))),
            Writes::Postgres(pool) => Ok(Transaction(Open::Postgres(begin_on(pool).await?))),
        }
    }

    /// Runs `statements`, which write without a transaction of their own, each committing by
    /// itself as it runs: no `BEGIN` and `COMMIT` around them (two round trips fewer on PostgreSQL,
    /// one on SQLite, whose writer sends a `BEGIN` with the first statement). On SQLite
    /// they run on the one writer: by themselves when nothing waits for it, else in its current
    /// batch (without a savepoint, so that they commit with the batch). For a write of one
    /// statement, or of several that are each safe alone (a failure keeps the ones before it);
    /// `statements` own what they use, as [`Database::transact`]'s do. Dropped before it
    /// returns: on SQLite as [`Database::transact`] (once queued, the statements run); on
    /// PostgreSQL they run in this future, so those already run have committed, the one in
    /// flight may or may not have, and the rest never run.
    pub async fn autocommit<T, F>(&self, statements: F) -> Result<T, sqlx::Error>
    where
        F: for<'t> FnOnce(&'t mut Transaction) -> BoxFuture<'t, Result<T, sqlx::Error>> + Send + 'static,
        T: Send + 'static,
    {
        match &self.writes {
            Writes::Sqlite(writer) => {
                let (job, outcome) = writer_job(statements);
                writer.autocommit(job).await?;
                outcome.await.map_err(|_| sqlx::Error::WorkerCrashed)?
            }
            Writes::Postgres(pool) => statements(&mut Transaction(Open::PostgresAutocommit(pool.acquire().await?))).await,
        }
    }

    /// Runs `work` in a write transaction and commits it, unless `work` fails: then its work is
    /// rolled back and its error returned. The way to write from a request's path: on SQLite the
    /// one writer runs `work` itself, from its own thread, as one member of its batch (see
    /// [`SqliteSettings`]), so that a request waits for the writer once, not once per statement;
    /// on PostgreSQL it runs on the caller's task. `work` owns what it needs, as for a spawned
    /// task; its result comes back once its transaction (on SQLite, its batch) has committed.
    ///
    /// Dropped before it returns, this future leaves different things on each backend. On
    /// SQLite, `work` is queued to the writer at once (unless a thousand jobs wait), and once
    /// queued it runs and commits with its batch: the caller merely does not hear of it;
    /// dropped while still waiting to be queued, it never runs. On PostgreSQL, `work` runs in
    /// this future: dropping it stops the work where it is and rolls its transaction back,
    /// unless the `COMMIT` was under way, which may or may not have taken effect.
    ///
    /// ```no_run
    /// # async fn insert(database: &idempotency::Database, id: String) -> Result<(), sqlx::Error> {
    /// database
    ///     .transact(move |transaction| {
    ///         Box::pin(async move {
    ///             idempotency::on_driver!(transaction, |executor| {
    ///                 sqlx::query("INSERT INTO notes (id) VALUES ($1)").bind(&id).execute(executor).await.map(drop)
    ///             })
    ///         })
    ///     })
    ///     .await
    /// # }
    /// ```
    pub async fn transact<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: for<'t> FnOnce(&'t mut Transaction) -> BoxFuture<'t, Result<T, E>> + Send + 'static,
        T: Send + 'static,
        E: From<sqlx::Error> + Send + 'static,
    {
        match &self.writes {
            Writes::Sqlite(writer) => {
                let (job, outcome) = writer_job(work);
                writer.run(job).await?;
                outcome.await.map_err(|_| E::from(sqlx::Error::WorkerCrashed))?
            }
            Writes::Postgres(pool) => {
                let mut transaction = Transaction(Open::Postgres(begin_on(pool).await?));
                let done = work(&mut transaction).await?;
                transaction.commit().await?;
                Ok(done)
            }
        }
    }

    /// As [`Database::begin`], on [`Database::reader`]: one snapshot for several reads.
    pub async fn begin_read(&self) -> Result<Transaction, sqlx::Error> {
        match &self.reader {
            Pool::Sqlite(pool) => Ok(Transaction(Open::SqliteRead(begin_on(pool).await?))),
            Pool::Postgres(pool) => Ok(Transaction(Open::Postgres(begin_on(pool).await?))),
        }
    }

    /// The pool for reads that write nothing. On SQLite, connections of their own that read
    /// beside the one writer (WAL), each read seeing the last commit, so that a read never
    /// queues behind a write; on PostgreSQL, the pool writes use too.
    pub fn reader(&self) -> &Pool {
        &self.reader
    }

    pub fn backend(&self) -> Backend {
        match self.reader {
            Pool::Sqlite(_) => Backend::Sqlite,
            Pool::Postgres(_) => Backend::Postgres,
        }
    }
}

/// `work` as a job for SQLite's writer, and where its result arrives: its error as soon as it
/// fails, its value once its batch has committed.
fn writer_job<T, E, F>(work: F) -> (writer::Job, oneshot::Receiver<Result<T, E>>)
where
    F: for<'t> FnOnce(&'t mut Transaction) -> BoxFuture<'t, Result<T, E>> + Send + 'static,
    T: Send + 'static,
    E: From<sqlx::Error> + Send + 'static,
{
    let (reply, outcome) = oneshot::channel();
    let job: writer::Job = Box::new(move |transaction| {
        Box::pin(async move {
            match work(transaction).await {
                Ok(done) => Some(Box::new(move |committed: Result<(), sqlx::Error>| {
                    let _ = reply.send(committed.map(|()| done).map_err(E::from));
                }) as writer::Settle),
                Err(error) => {
                    let _ = reply.send(Err(error));
                    None
                }
            }
        })
    });
    (job, outcome)
}

/// SQLite's write connection, with `migrations` applied.
async fn connect_writer(options: &SqliteConnectOptions, migrations: Vec<Migrations>) -> Result<SqliteConnection, DatabaseError> {
    let mut connection = <SqliteConnection as sqlx::Connection>::connect_with(options).await?;
    for (owner, migrator) in migrations {
        migrate(owner, migrator, &mut connection).await?;
    }
    Ok(connection)
}

async fn migrate<'a, A: sqlx::Acquire<'a>>(owner: &'static str, mut migrator: Migrator, on: A) -> Result<(), MigrateError>
where
    <A::Connection as std::ops::Deref>::Target: sqlx::migrate::Migrate,
{
    migrator.dangerous_set_table_name(format!("_sqlx_migrations_{owner}"));
    migrator.run(on).await
}

async fn begin_on<DB: sqlx::Database>(pool: &sqlx::Pool<DB>) -> Result<sqlx::Transaction<'static, DB>, sqlx::Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => begun,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// A transaction of [`Database::begin`] or [`Database::begin_read`] (or the statements of
/// [`Database::autocommit`]):
/// its statements run through [`on_driver!`]; dropped without [`Transaction::commit`], its
/// work is rolled back.
#[derive(Debug)]
pub struct Transaction(Open);

#[derive(Debug)]
enum Open {
    Batched(writer::Member),
    /// The writer's own connection, while it runs a [`Database::transact`] job, with the
    /// statement that opens the job's work until it is sent with the job's first.
    OnWriter(SqliteConnection, sqlite_executor::Opening),
    SqliteRead(sqlx::Transaction<'static, Sqlite>),
    Postgres(sqlx::Transaction<'static, Postgres>),
    PostgresAutocommit(PoolConnection<Postgres>),
}

impl Transaction {
    /// Commits, and returns once the work is durable as the backend's settings say. Dropped
    /// before it returns: on SQLite, the work was handed to the writer when this was first
    /// polled and commits with its batch; on PostgreSQL, the `COMMIT` may or may not have
    /// taken effect.
    pub async fn commit(self) -> Result<(), sqlx::Error> {
        match self.0 {
            Open::Batched(member) => member.commit().await,
            // A job's transaction is committed by the writer, with its batch.
            Open::OnWriter(..) => Ok(()),
            Open::SqliteRead(transaction) => transaction.commit().await,
            Open::Postgres(transaction) => transaction.commit().await,
            Open::PostgresAutocommit(_) => Ok(()),
        }
    }
}

/// A value for one driver or the other: what [`on_driver!`] matches on.
pub enum Driver<S, P> {
    Sqlite(S),
    Postgres(P),
}

/// Something statements run on, seen as its driver's typed executor.
pub trait Executors {
    type Sqlite;
    type Postgres;
    fn driver(self) -> Driver<Self::Sqlite, Self::Postgres>;
}

impl<'a> Executors for &'a Pool {
    type Sqlite = &'a SqlitePool;
    type Postgres = &'a PgPool;
    fn driver(self) -> Driver<Self::Sqlite, Self::Postgres> {
        match self {
            Pool::Sqlite(pool) => Driver::Sqlite(pool),
            Pool::Postgres(pool) => Driver::Postgres(pool),
        }
    }
}

impl<'a> Executors for &'a mut Transaction {
    type Sqlite = SqliteExecutor<'a>;
    type Postgres = &'a mut PgConnection;
    fn driver(self) -> Driver<Self::Sqlite, Self::Postgres> {
        match &mut self.0 {
            Open::Batched(member) => Driver::Sqlite(SqliteExecutor::new(member.connection(), None)),
            Open::OnWriter(connection, opening) => Driver::Sqlite(SqliteExecutor::new(connection, Some(opening))),
            Open::SqliteRead(transaction) => Driver::Sqlite(SqliteExecutor::new(transaction, None)),
            Open::Postgres(transaction) => Driver::Postgres(transaction),
            Open::PostgresAutocommit(connection) => Driver::Postgres(connection),
        }
    }
}

/// Runs `$body` with `$executor` bound to the typed executor behind `$on` (a `&mut`
/// [`Transaction`] or a `&` [`Pool`]): each statement is written once, with `$1` parameters,
/// and compiled for both drivers. sqlx's `Any` driver would do the same at run time, at the
/// price of a boxed future and a copy of every argument and every row.
///
/// ```no_run
/// # async fn count(database: &idempotency::Database) -> Result<i64, sqlx::Error> {
/// let keys: i64 = idempotency::on_driver!(database.reader(), |executor| {
///     sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys").fetch_one(executor).await?
/// });
/// # Ok(keys) }
/// ```
#[macro_export]
macro_rules! on_driver {
    ($on:expr, |$executor:ident| $body:expr) => {
        match $crate::Executors::driver($on) {
            $crate::Driver::Sqlite($executor) => $body,
            $crate::Driver::Postgres($executor) => $body,
        }
    };
}
