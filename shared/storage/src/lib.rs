#![doc = include_str!("../README.md")]

mod error;
mod migrate;
mod row;
mod sqlite;
mod statement;
mod tx;

use std::{num::NonZeroU32, sync::Arc, time::Duration};

use sqlx::{PgPool, postgres::PgPoolOptions};

pub use error::Error;
pub use row::{Column, FromRow, Nullable, Param, Row, Value};
pub use statement::Statement;
pub use tx::Tx;

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
/// the work that waits for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SqliteSettings {
    pub synchronous: Synchronous,
    /// Most units of work committed together.
    pub max_batch: NonZeroU32,
    /// How long a batch with room left waits for one more unit of work before it commits, in
    /// µs; 0 commits as soon as nobody is waiting.
    pub batch_wait_us: u64,
}

impl Default for SqliteSettings {
    fn default() -> Self {
        Self {
            synchronous: Synchronous::default(),
            max_batch: NonZeroU32::new(64).expect("not zero"),
            batch_wait_us: 0,
        }
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    pub fn of(url: &str) -> Result<Self, Error> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Backend::Postgres)
        } else if url.starts_with("sqlite:")
            && !url.contains(":memory:")
            && !url.contains("mode=memory")
        {
            Ok(Backend::Sqlite)
        } else {
            Err(Error::UnsupportedUrl(url.to_owned()))
        }
    }
}

/// The migrations of one crate, named by its owner: each owner's history is kept in a table of
/// its own (`_sqlx_migrations_<owner>`), so that two crates' versions never collide.
pub type Migrations = (&'static str, sqlx::migrate::Migrator);

/// A service's database: SQLite's one writer and its readers, or a PostgreSQL pool. Cheap to
/// clone; every clone shares the same connections.
#[derive(Debug, Clone)]
pub struct Database(Connections);

#[derive(Debug, Clone)]
enum Connections {
    Sqlite(Arc<sqlite::Sqlite>),
    Postgres(PgPool),
}

/// Most PostgreSQL connections a process keeps.
const POSTGRES_CONNECTIONS: u32 = 16;

/// How long a caller waits for a pooled PostgreSQL connection.
const POSTGRES_WAIT: Duration = Duration::from_secs(5);

/// A pooled PostgreSQL connection is checked before use (a ping, one round trip to the server)
/// only after it has sat idle this long. sqlx pings on every acquire by default, which adds a
/// round trip to each unit of work, while a connection just handed back is known to have worked.
const CHECK_AFTER_IDLE: Duration = Duration::from_secs(10);

impl Database {
    /// Connects (creating a SQLite file when missing, owner-only) and applies the migrations
    /// `migrations` chooses for the backend (a crate's `sqlx::migrate!` paths are its own),
    /// before the first request. On SQLite, every component of this process that opens the same
    /// file shares one writer (and the first opener's `sqlite` settings).
    pub async fn open(
        url: &str,
        sqlite: SqliteSettings,
        migrations: impl FnOnce(Backend) -> Vec<Migrations>,
    ) -> Result<Self, Error> {
        let backend = Backend::of(url)?;
        let migrations = migrations(backend);
        match backend {
            Backend::Sqlite => {
                let path = url.trim_start_matches("sqlite:").trim_start_matches("//");
                let path = path.split('?').next().unwrap_or_default();
                Ok(Self(Connections::Sqlite(
                    sqlite::Sqlite::open(path.as_ref(), &sqlite, migrations).await?,
                )))
            }
            Backend::Postgres => {
                let pool = PgPoolOptions::new()
                    .max_connections(POSTGRES_CONNECTIONS)
                    .acquire_timeout(POSTGRES_WAIT)
                    .test_before_acquire(false)
                    .before_acquire(|connection, idle| {
                        Box::pin(async move {
                            Ok(idle.idle_for < CHECK_AFTER_IDLE
                                || sqlx::Connection::ping(connection).await.is_ok())
                        })
                    })
                    .connect(url)
                    .await?;
                migrate::postgres(&pool, migrations).await?;
                Ok(Self(Connections::Postgres(pool)))
            }
        }
    }

    pub fn backend(&self) -> Backend {
        match self.0 {
            Connections::Sqlite(_) => Backend::Sqlite,
            Connections::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs `work` in a write transaction and commits it, unless `work` fails: then its work is
    /// rolled back and its error returned. Its result comes back once the commit is done.
    ///
    /// On SQLite, `work` runs on the file's one writer, from the writer's thread, as one member
    /// of its next batch (see [`SqliteSettings`]): it owns what it uses, as a spawned task does,
    /// and a caller waits for the writer once per unit of work, not once per statement. On
    /// PostgreSQL it runs on the caller's task, between a `BEGIN` and a `COMMIT`.
    ///
    /// Dropped before it returns, this future leaves different things on each backend. On
    /// SQLite, work whose turn has not come never runs; once it has run, it commits with its
    /// batch and the caller merely does not hear of it. On PostgreSQL, dropping it stops the
    /// work where it is and rolls its transaction back, unless the `COMMIT` was under way,
    /// which may or may not have taken effect.
    ///
    /// ```no_run
    /// # async fn insert(database: &storage::Database, id: String) -> Result<u64, storage::Error> {
    /// database.write(async move |tx| tx.execute("INSERT INTO notes (id) VALUES ($1)", &[&id]).await).await
    /// # }
    /// ```
    pub async fn write<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        match &self.0 {
            Connections::Sqlite(sqlite) => sqlite.write(work).await,
            Connections::Postgres(pool) => {
                let mut transaction = begin(pool, "BEGIN").await?;
                let done = work(&mut Tx::postgres(&mut transaction)).await?;
                transaction.commit().await.map_err(Error::from)?;
                Ok(done)
            }
        }
    }

    /// Runs one statement that writes, committed by itself; how many rows it changed. On
    /// PostgreSQL one round trip, with no `BEGIN` and `COMMIT` around it; on SQLite one member of
    /// the writer's batch, as [`Database::write`]'s work is.
    pub async fn execute(&self, sql: &str, params: &[&dyn Param]) -> Result<u64, Error> {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                let statement = Statement::new(sql.to_owned(), params);
                sqlite
                    .write(async move |tx: &mut Tx<'_>| {
                        tx.execute(statement.sql(), &statement.params()).await
                    })
                    .await
            }
            Connections::Postgres(pool) => {
                Tx::postgres(&mut *pool.acquire().await?)
                    .execute(sql, params)
                    .await
            }
        }
    }

    /// As [`Database::execute`], for a statement that returns a row (`… RETURNING`).
    pub async fn execute_returning<R: FromRow + Send + 'static>(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Option<R>, Error> {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                let statement = Statement::new(sql.to_owned(), params);
                sqlite
                    .write(async move |tx: &mut Tx<'_>| {
                        tx.fetch_optional(statement.sql(), &statement.params())
                            .await
                    })
                    .await
            }
            Connections::Postgres(pool) => {
                Tx::postgres(&mut *pool.acquire().await?)
                    .fetch_optional(sql, params)
                    .await
            }
        }
    }

    /// Runs `work`, which only reads, in one snapshot of the database. On SQLite, on a read
    /// connection of its own beside the writer (WAL), on the caller's thread: a read never
    /// waits for a write, nor hands off to another thread. On PostgreSQL, in a read-only
    /// transaction at `REPEATABLE READ` (one snapshot for all its statements; `READ COMMITTED`
    /// would take one per statement); a single read needs no transaction: see
    /// [`Database::fetch_optional`] and its siblings.
    pub async fn read<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<T, E>,
        E: From<Error>,
    {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                let mut reader = sqlite.reader()?;
                reader
                    .connection()
                    .execute_batch("BEGIN")
                    .map_err(Error::from)?;
                let done = work(&mut Tx::sqlite(reader.connection())).await;
                // Dropping the reader ends the snapshot.
                drop(reader);
                done
            }
            Connections::Postgres(pool) => {
                let mut transaction =
                    begin(pool, "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY").await?;
                let done = work(&mut Tx::postgres(&mut transaction)).await?;
                transaction.commit().await.map_err(Error::from)?;
                Ok(done)
            }
        }
    }

    /// One read statement's first row, if any: on SQLite on a read connection, on the caller's
    /// thread; on PostgreSQL on a pooled connection, one round trip.
    pub async fn fetch_optional<R: FromRow>(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Option<R>, Error> {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                Tx::sqlite(sqlite.reader()?.connection())
                    .fetch_optional(sql, params)
                    .await
            }
            Connections::Postgres(pool) => {
                Tx::postgres(&mut *pool.acquire().await?)
                    .fetch_optional(sql, params)
                    .await
            }
        }
    }

    /// One read statement's first row; an error when it returns none. See
    /// [`Database::fetch_optional`].
    pub async fn fetch_one<R: FromRow>(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<R, Error> {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                Tx::sqlite(sqlite.reader()?.connection())
                    .fetch_one(sql, params)
                    .await
            }
            Connections::Postgres(pool) => {
                Tx::postgres(&mut *pool.acquire().await?)
                    .fetch_one(sql, params)
                    .await
            }
        }
    }

    /// Every row of one read statement. See [`Database::fetch_optional`].
    pub async fn fetch_all<R: FromRow>(
        &self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Vec<R>, Error> {
        match &self.0 {
            Connections::Sqlite(sqlite) => {
                Tx::sqlite(sqlite.reader()?.connection())
                    .fetch_all(sql, params)
                    .await
            }
            Connections::Postgres(pool) => {
                Tx::postgres(&mut *pool.acquire().await?)
                    .fetch_all(sql, params)
                    .await
            }
        }
    }
}

/// Begins a PostgreSQL transaction on a task of its own, because of how sqlx 0.9 cancels a
/// `BEGIN`: if the caller's future is dropped while the `BEGIN` runs (a request's deadline
/// passing), its guard rolls nothing back, and the connection returns to the pool inside a
/// transaction that every later statement on it joins and none commits. On its own task the
/// `BEGIN` completes whatever happens to the caller, and a transaction nobody takes any more is
/// dropped there, which rolls it back. (sqlx issue 4393, fixed upstream after 0.9.0.)
async fn begin(
    pool: &PgPool,
    statement: &'static str,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin_with(statement).await }).await {
        Ok(begun) => Ok(begun?),
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}
