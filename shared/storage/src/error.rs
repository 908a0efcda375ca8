/// Why a statement, a transaction or opening the database failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("SQLite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] sqlx::Error),
    /// The transaction this work was in failed after the work ran: none of it was committed.
    #[error("the transaction was rolled back: {0}")]
    RolledBack(String),
    /// The writer did not take the work in time: nothing of it ran.
    #[error("the database's writer is busy: nothing was written")]
    WriterBusy,
    /// The writer stopped (the process is shutting down): whether the work committed is unknown.
    #[error("the database's writer stopped")]
    WriterStopped,
    /// A value read from the database is not what the code expects.
    #[error("unexpected data: {0}")]
    Corrupt(String),
    #[error("unsupported database URL {0:?}: use sqlite://FILE or postgres://…")]
    UnsupportedUrl(String),
    #[error("migrating the database: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("migration {version} of {owner} was changed after it was applied")]
    MigrationChanged { owner: &'static str, version: i64 },
    #[error("opening the database file: {0}")]
    File(#[from] std::io::Error),
}

impl Error {
    /// Whether the database could not be reached rather than a statement failed: no connection
    /// (refused, name not resolved, lost midway, none free in time), the server shutting down or
    /// starting up, or SQLite's file locked by another process past the busy timeout. Such a
    /// failure passes once the database is back, so a service answers it as unavailable
    /// (retryable), not as an internal error; nothing of the work was committed.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Error::Postgres(
                sqlx::Error::Io(_)
                | sqlx::Error::Tls(_)
                | sqlx::Error::PoolTimedOut
                | sqlx::Error::PoolClosed,
            ) => true,
            // SQLSTATE class 08 (connection exception), 57P01..57P03 (shutdown, crash, starting up).
            Error::Postgres(sqlx::Error::Database(error)) => error.code().is_some_and(|code| {
                code.starts_with("08") || matches!(&*code, "57P01" | "57P02" | "57P03")
            }),
            Error::Sqlite(rusqlite::Error::SqliteFailure(error, _)) => {
                matches!(
                    error.code,
                    rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
                )
            }
            Error::WriterBusy | Error::WriterStopped => true,
            Error::RolledBack(_) => true,
            _ => false,
        }
    }
}
