//! Where a unit of work's statements run: the same calls on both backends.

use sqlx::PgConnection;

use crate::{
    Backend, Error,
    row::{FromRow, Param, Row, bind_postgres},
    statement::numbered,
};

/// The connection a unit of work runs its statements on, inside its transaction (see
/// [`Database::write`](crate::Database::write) and [`Database::read`](crate::Database::read)).
/// Statements are written once, with PostgreSQL's `$1` parameters, and bound from
/// `&[&dyn Param]`.
///
/// On SQLite every call runs the statement at once, on the thread the work runs on (the
/// writer's, or the reader's caller): its future is ready when first polled. Each statement is
/// a `storage::statement` event at DEBUG, with its SQL in `sql` (sqlx reports PostgreSQL's as
/// `sqlx::query`).
pub struct Tx<'c>(Connection<'c>);

enum Connection<'c> {
    Sqlite(&'c mut rusqlite::Connection),
    Postgres(&'c mut PgConnection),
}

impl<'c> Tx<'c> {
    pub(crate) fn sqlite(connection: &'c mut rusqlite::Connection) -> Self {
        Self(Connection::Sqlite(connection))
    }

    pub(crate) fn postgres(connection: &'c mut PgConnection) -> Self {
        Self(Connection::Postgres(connection))
    }

    /// The SQLite connection itself, for what only it can run (a migration's several statements).
    pub(crate) fn sqlite_connection(&mut self) -> &mut rusqlite::Connection {
        match &mut self.0 {
            Connection::Sqlite(connection) => connection,
            Connection::Postgres(_) => unreachable!("only SQLite's work asks for its connection"),
        }
    }

    pub fn backend(&self) -> Backend {
        match self.0 {
            Connection::Sqlite(_) => Backend::Sqlite,
            Connection::Postgres(_) => Backend::Postgres,
        }
    }

    /// Runs a statement that returns no rows; how many rows it changed.
    pub async fn execute(&mut self, sql: &str, params: &[&dyn Param]) -> Result<u64, Error> {
        match &mut self.0 {
            Connection::Sqlite(connection) => {
                Ok(prepare(connection, sql)?.execute(bound(params))? as u64)
            }
            Connection::Postgres(connection) => {
                Ok(bind_postgres(sqlx::query(sqlx::AssertSqlSafe(sql)), params)
                    .execute(&mut **connection)
                    .await?
                    .rows_affected())
            }
        }
    }

    /// The first row a statement returns, if any.
    pub async fn fetch_optional<R: FromRow>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Option<R>, Error> {
        match &mut self.0 {
            Connection::Sqlite(connection) => prepare(connection, sql)?
                .query(bound(params))?
                .next()?
                .map(|row| R::from_row(&Row::Sqlite(row)))
                .transpose(),
            Connection::Postgres(connection) => {
                let row = bind_postgres(sqlx::query(sqlx::AssertSqlSafe(sql)), params)
                    .fetch_optional(&mut **connection)
                    .await?;
                row.map(|row| R::from_row(&Row::Postgres(&row))).transpose()
            }
        }
    }

    /// The first row a statement returns; an error when it returns none.
    pub async fn fetch_one<R: FromRow>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<R, Error> {
        self.fetch_optional(sql, params)
            .await?
            .ok_or_else(|| Error::Corrupt(format!("no row for {sql:?}")))
    }

    /// Every row a statement returns.
    pub async fn fetch_all<R: FromRow>(
        &mut self,
        sql: &str,
        params: &[&dyn Param],
    ) -> Result<Vec<R>, Error> {
        match &mut self.0 {
            Connection::Sqlite(connection) => {
                let mut statement = prepare(connection, sql)?;
                let mut rows = statement.query(bound(params))?;
                let mut all = Vec::new();
                while let Some(row) = rows.next()? {
                    all.push(R::from_row(&Row::Sqlite(row))?);
                }
                Ok(all)
            }
            Connection::Postgres(connection) => {
                let rows = bind_postgres(sqlx::query(sqlx::AssertSqlSafe(sql)), params)
                    .fetch_all(&mut **connection)
                    .await?;
                rows.iter()
                    .map(|row| R::from_row(&Row::Postgres(row)))
                    .collect()
            }
        }
    }
}

/// A SQLite statement from the connection's cache of prepared statements, announced as a
/// `storage::statement` event.
fn prepare<'c>(
    connection: &'c rusqlite::Connection,
    sql: &str,
) -> rusqlite::Result<rusqlite::CachedStatement<'c>> {
    tracing::debug!(target: "storage::statement", sql);
    connection.prepare_cached(&numbered(sql))
}

/// `params` as rusqlite binds them.
fn bound<'p>(params: &'p [&dyn Param]) -> impl rusqlite::Params + 'p {
    rusqlite::params_from_iter(params.iter().map(|param| param.value()))
}
