use std::time::Duration;

use sqlx::{
    Any, AnyPool, Executor, Transaction,
    any::AnyPoolOptions,
    migrate::{MigrateError, Migrator},
};

/// When a SQLite commit is on disk (`PRAGMA synchronous` in WAL mode). PostgreSQL's is the
/// server's `synchronous_commit` (`on` by default: a commit waits for its WAL to be flushed).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Synchronous {
    /// The WAL is synced at checkpoints, not at each commit: a commit survives a crash of the
    /// process, and the last commits before a power loss or an OS crash may be rolled back.
    #[default]
    Normal,
    /// The WAL is synced at every commit: a commit survives a power loss too.
    Full,
}

impl Synchronous {
    fn pragma(self) -> &'static str {
        match self {
            Synchronous::Normal => "PRAGMA synchronous = NORMAL",
            Synchronous::Full => "PRAGMA synchronous = FULL",
        }
    }
}

/// Which database a URL names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A connection pool to a service's database, SQLite or PostgreSQL, behind one query interface,
/// and a pool for reads that write nothing.
#[derive(Debug, Clone)]
pub struct Database {
    pool: AnyPool,
    reader: AnyPool,
    backend: Backend,
}

async fn begin_on(pool: &AnyPool) -> Result<Transaction<'static, Any>, sqlx::Error> {
    let pool = pool.clone();
    match tokio::spawn(async move { pool.begin().await }).await {
        Ok(begun) => begun,
        Err(failed) => std::panic::resume_unwind(failed.into_panic()),
    }
}

/// Connections of the SQLite reader pool: reads beside the one writer, in WAL mode.
const SQLITE_READERS: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum DatabaseError {
    #[error("unsupported database URL {0:?}: use sqlite://… or postgres://…")]
    UnsupportedUrl(String),
    #[error("connecting to the database: {0}")]
    Connect(#[from] sqlx::Error),
    #[error("migrating the database: {0}")]
    Migrate(#[from] MigrateError),
}

impl Database {
    /// Connects (creating a SQLite file when missing) with [`Synchronous::Normal`] and applies the
    /// key store's migrations.
    pub async fn connect(url: &str) -> Result<Self, DatabaseError> {
        Self::connect_with(url, Synchronous::default()).await
    }

    /// As [`Database::connect`], with SQLite's commits on disk as `synchronous` says.
    pub async fn connect_with(url: &str, synchronous: Synchronous) -> Result<Self, DatabaseError> {
        sqlx::any::install_default_drivers();
        // A SQLite file is created when missing and opened read-only for the reader pool, unless
        // the URL chose a mode itself (an in-memory database, for one, exists only on its own
        // connection, so it has no readers apart).
        let (backend, url, reader_url) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (Backend::Postgres, url.to_owned(), None)
        } else if url.starts_with("sqlite:") {
            if url.contains("mode=") || url.contains(":memory:") {
                (Backend::Sqlite, url.to_owned(), None)
            } else {
                let separator = if url.contains('?') { '&' } else { '?' };
                (Backend::Sqlite, format!("{url}{separator}mode=rwc"), Some(format!("{url}{separator}mode=ro")))
            }
        } else {
            return Err(DatabaseError::UnsupportedUrl(url.to_owned()));
        };
        // SQLite has a single writer: one connection queues writes in the pool instead of in
        // SQLite's busy handler, whose sleeps cost a p99 of ~100 ms at 16 clients.
        let pool = AnyPoolOptions::new()
            .max_connections(if backend == Backend::Sqlite { 1 } else { 16 })
            .acquire_timeout(Duration::from_secs(5))
            .after_connect(move |connection, _| {
                Box::pin(async move {
                    if backend == Backend::Sqlite {
                        // WAL lets readers run beside the one writer; the busy timeout makes
                        // concurrent writers wait their turn instead of failing.
                        for pragma in ["PRAGMA journal_mode = WAL", synchronous.pragma(), "PRAGMA busy_timeout = 5000"] {
                            connection.execute(pragma).await?;
                        }
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        let reader = match reader_url {
            // Opened after the writer, which creates the file.
            Some(reader_url) => AnyPoolOptions::new()
                .max_connections(SQLITE_READERS)
                .acquire_timeout(Duration::from_secs(5))
                .after_connect(|connection, _| Box::pin(async move { connection.execute("PRAGMA busy_timeout = 5000").await.map(drop) }))
                .connect(&reader_url)
                .await?,
            None => pool.clone(),
        };
        let database = Self { pool, reader, backend };
        let keys = match backend {
            Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
        };
        database.migrate("idempotency", keys).await?;
        Ok(database)
    }

    /// Connects and applies the key store's migrations and then `owner`'s, chosen for the backend
    /// (a service's `sqlx::migrate!` paths are its own, so it chooses).
    pub async fn open(url: &str, synchronous: Synchronous, owner: &'static str, migrations: impl FnOnce(Backend) -> Migrator) -> Result<Self, DatabaseError> {
        let database = Self::connect_with(url, synchronous).await?;
        database.migrate(owner, migrations(database.backend)).await?;
        Ok(database)
    }

    /// Applies the migrations of `owner` (a crate with its own migration history, kept in its
    /// own table so that the key store's and the service's versions never collide).
    pub async fn migrate(&self, owner: &'static str, mut migrator: Migrator) -> Result<(), MigrateError> {
        migrator.dangerous_set_table_name(format!("_sqlx_migrations_{owner}"));
        migrator.run(&self.pool).await
    }

    /// The pool for writes, and for reads inside or right before a write.
    pub fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Begins a transaction on [`Database::pool`].
    ///
    /// On a task of its own, because of how sqlx 0.9 cancels a PostgreSQL `BEGIN`: if the future
    /// is dropped while the `BEGIN` runs (a request's deadline passing), its guard rolls nothing
    /// back (it only rolls back a transaction already counted), and the connection returns to the
    /// pool inside a transaction that every later statement on it joins and none commits: their
    /// writes are lost when it closes, and their row locks held until then. On its own task the
    /// `BEGIN` completes whatever happens to the caller, and a transaction nobody takes any more
    /// is dropped there, which rolls it back. (sqlx issue 4393, fixed upstream after 0.9.0; the
    /// test `a_begin_dropped_midway_leaves_no_connection_inside_a_transaction` shows both.)
    pub async fn begin(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        begin_on(&self.pool).await
    }

    /// As [`Database::begin`], on [`Database::reader`]: one snapshot for several reads.
    pub async fn begin_read(&self) -> Result<Transaction<'static, Any>, sqlx::Error> {
        begin_on(&self.reader).await
    }

    /// The pool for reads that write nothing. On a SQLite file, connections of their own that
    /// read beside the one writer (WAL), each read seeing the last commit, so that a read never
    /// queues behind a write; on PostgreSQL (and an in-memory SQLite database), the same pool as
    /// [`Database::pool`].
    pub fn reader(&self) -> &AnyPool {
        &self.reader
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }
}
