//! The executor of a SQLite transaction's statements: the connection, and on the one writer the
//! statement that opens a member's work (`BEGIN IMMEDIATE` or `SAVEPOINT`), sent with the
//! member's first statement.
//!
//! Why? Every statement sent to sqlx's connection thread is a hand-off there and back, and the
//! writer's own `BEGIN` and `SAVEPOINT` were one each. sqlx runs a query of several statements
//! in one hand-off, binding each statement's `$N` parameters from the same arguments, so the
//! opening statement goes in front of the member's first statement instead: a member that runs
//! three statements costs three hand-offs, not four. The writer learns from [`Opening::ran`]
//! whether it was sent, because a member that ran nothing opened nothing: there is no savepoint
//! to go back to, and no transaction to roll back.

use futures::{
    future::{self, BoxFuture, FutureExt},
    stream::{self, BoxStream, StreamExt},
};
use sqlx::{
    AssertSqlSafe, Describe, Either, Execute, Executor, SqlSafeStr, SqlStr, Sqlite, SqliteConnection,
    sqlite::{SqliteArguments, SqliteQueryResult, SqliteRow, SqliteStatement, SqliteTypeInfo},
};

/// The statement that opens a member's work, until it is sent with the member's first.
#[derive(Debug, Default)]
pub(super) struct Opening(Option<&'static str>);

impl Opening {
    pub(super) fn new(statement: Option<&'static str>) -> Self {
        Self(statement)
    }

    /// The statement, for the writer to run by itself.
    pub(super) fn take_statement(&mut self) -> Option<&'static str> {
        self.0.take()
    }

    /// Whether the opening statement went with a statement of the member's (or there was none).
    pub(super) fn ran(&self) -> bool {
        self.0.is_none()
    }
}

/// Where a SQLite transaction's statements run: see the module's documentation.
#[derive(Debug)]
pub struct SqliteExecutor<'c> {
    connection: &'c mut SqliteConnection,
    opening: Option<&'c mut Opening>,
}

impl<'c> SqliteExecutor<'c> {
    pub(super) fn new(connection: &'c mut SqliteConnection, opening: Option<&'c mut Opening>) -> Self {
        Self { connection, opening }
    }

    /// `query`, with the opening statement in front of it if it has not run yet. Its arguments
    /// are taken first: a query whose arguments fail to encode is never sent, and must not
    /// count as having opened anything.
    fn opened<'q, E: Execute<'q, Sqlite>>(self, mut query: E) -> Result<(&'c mut SqliteConnection, Prepared), sqlx::Error> {
        let arguments = query.take_arguments().map_err(sqlx::Error::Encode)?;
        let persistent = query.persistent() && arguments.is_some();
        let (sql, opened) = match self.opening.and_then(Opening::take_statement) {
            Some(opening) => (AssertSqlSafe(format!("{opening}; {}", query.sql().as_str())).into_sql_str(), true),
            None => (query.sql(), false),
        };
        Ok((self.connection, Prepared { sql, opened, arguments, persistent }))
    }
}

/// A query taken apart: its SQL (with the opening statement in front, if `opened`) and its
/// arguments.
struct Prepared {
    sql: SqlStr,
    opened: bool,
    arguments: Option<SqliteArguments>,
    persistent: bool,
}

impl Execute<'_, Sqlite> for Prepared {
    fn sql(self) -> SqlStr {
        self.sql
    }

    fn statement(&self) -> Option<&SqliteStatement> {
        None
    }

    fn take_arguments(&mut self) -> Result<Option<SqliteArguments>, sqlx::error::BoxDynError> {
        Ok(self.arguments.take())
    }

    fn persistent(&self) -> bool {
        self.persistent
    }
}

impl<'c> Executor<'c> for SqliteExecutor<'c> {
    type Database = Sqlite;

    fn fetch_many<'e, 'q: 'e, E>(self, query: E) -> BoxStream<'e, Result<Either<SqliteQueryResult, SqliteRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Sqlite>,
    {
        match self.opened(query) {
            Ok((connection, prepared)) => {
                // The opening statement's own result is left out: SQLite reports for it the rows
                // the connection's previous statement changed, which would count as the member's.
                let mut opening_result = prepared.opened;
                connection.fetch_many(prepared).filter(move |result| future::ready(!(std::mem::take(&mut opening_result) && result.is_ok()))).boxed()
            }
            Err(error) => stream::once(future::ready(Err(error))).boxed(),
        }
    }

    fn fetch_optional<'e, 'q: 'e, E>(self, query: E) -> BoxFuture<'e, Result<Option<SqliteRow>, sqlx::Error>>
    where
        'c: 'e,
        E: 'q + Execute<'q, Sqlite>,
    {
        match self.opened(query) {
            Ok((connection, prepared)) => connection.fetch_optional(prepared),
            Err(error) => future::ready(Err(error)).boxed(),
        }
    }

    fn prepare_with<'e>(self, sql: SqlStr, parameters: &'e [SqliteTypeInfo]) -> BoxFuture<'e, Result<SqliteStatement, sqlx::Error>>
    where
        'c: 'e,
    {
        self.connection.prepare_with(sql, parameters)
    }

    // Part of the trait while sqlx's `macros` feature is on, as it is here.
    fn describe<'e>(self, sql: SqlStr) -> BoxFuture<'e, Result<Describe<Sqlite>, sqlx::Error>>
    where
        'c: 'e,
    {
        self.connection.describe(sql)
    }
}
