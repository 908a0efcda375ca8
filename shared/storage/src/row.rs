//! What goes into a statement and what comes out of it, the same on both backends.

use sqlx::{Postgres, Row as _, postgres::PgRow};

use crate::Error;

/// A statement's parameter, as a value SQLite and PostgreSQL both bind. A missing value keeps
/// its type (`Integer(None)`), because PostgreSQL checks a `NULL`'s type against its column.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value<'a> {
    Integer(Option<i64>),
    Bool(Option<bool>),
    Text(Option<&'a str>),
    Blob(Option<&'a [u8]>),
}

/// Something a statement binds: `&[&scope, &key, &now]`.
pub trait Param: Sync {
    fn value(&self) -> Value<'_>;
}

/// A parameter's type, for the `NULL` that `None` binds.
pub trait Nullable {
    const NULL: Value<'static>;
}

macro_rules! param {
    ($($type:ty => |$value:ident| $bound:expr, $null:expr;)*) => {$(
        impl Param for $type {
            fn value(&self) -> Value<'_> {
                let $value = self;
                $bound
            }
        }
        impl Nullable for $type {
            const NULL: Value<'static> = $null;
        }
        impl Nullable for &$type {
            const NULL: Value<'static> = $null;
        }
    )*};
}

param! {
    i64 => |integer| Value::Integer(Some(*integer)), Value::Integer(None);
    i32 => |integer| Value::Integer(Some(i64::from(*integer))), Value::Integer(None);
    u32 => |integer| Value::Integer(Some(i64::from(*integer))), Value::Integer(None);
    bool => |bool| Value::Bool(Some(*bool)), Value::Bool(None);
    String => |text| Value::Text(Some(text)), Value::Text(None);
    Vec<u8> => |blob| Value::Blob(Some(blob)), Value::Blob(None);
}

impl Param for str {
    fn value(&self) -> Value<'_> {
        Value::Text(Some(self))
    }
}

impl Nullable for &str {
    const NULL: Value<'static> = Value::Text(None);
}

impl Param for [u8] {
    fn value(&self) -> Value<'_> {
        Value::Blob(Some(self))
    }
}

impl Nullable for &[u8] {
    const NULL: Value<'static> = Value::Blob(None);
}

impl<T: Param + ?Sized> Param for &T {
    fn value(&self) -> Value<'_> {
        (**self).value()
    }
}

impl<T: Param + Nullable> Param for Option<T> {
    fn value(&self) -> Value<'_> {
        match self {
            Some(value) => value.value(),
            None => T::NULL,
        }
    }
}

/// A parameter's value copied, for a [`Statement`](crate::Statement).
#[derive(Debug, Clone)]
pub(crate) enum Owned {
    Integer(Option<i64>),
    Bool(Option<bool>),
    Text(Option<String>),
    Blob(Option<Vec<u8>>),
}

impl From<Value<'_>> for Owned {
    fn from(value: Value<'_>) -> Self {
        match value {
            Value::Integer(integer) => Owned::Integer(integer),
            Value::Bool(bool) => Owned::Bool(bool),
            Value::Text(text) => Owned::Text(text.map(str::to_owned)),
            Value::Blob(blob) => Owned::Blob(blob.map(<[u8]>::to_vec)),
        }
    }
}

impl Param for Owned {
    fn value(&self) -> Value<'_> {
        match self {
            Owned::Integer(integer) => Value::Integer(*integer),
            Owned::Bool(bool) => Value::Bool(*bool),
            Owned::Text(text) => Value::Text(text.as_deref()),
            Owned::Blob(blob) => Value::Blob(blob.as_deref()),
        }
    }
}

impl rusqlite::ToSql for Value<'_> {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        use rusqlite::types::{ToSqlOutput, ValueRef};
        Ok(ToSqlOutput::Borrowed(match *self {
            Value::Integer(Some(integer)) => ValueRef::Integer(integer),
            Value::Bool(Some(bool)) => ValueRef::Integer(i64::from(bool)),
            Value::Text(Some(text)) => ValueRef::Text(text.as_bytes()),
            Value::Blob(Some(blob)) => ValueRef::Blob(blob),
            Value::Integer(None) | Value::Bool(None) | Value::Text(None) | Value::Blob(None) => {
                ValueRef::Null
            }
        }))
    }
}

/// Binds `params` to a PostgreSQL statement, each as its type.
pub(crate) fn bind_postgres<'q>(
    mut query: sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments>,
    params: &[&'q dyn Param],
) -> sqlx::query::Query<'q, Postgres, sqlx::postgres::PgArguments> {
    for param in params {
        query = match param.value() {
            Value::Integer(integer) => query.bind(integer),
            Value::Bool(bool) => query.bind(bool),
            Value::Text(text) => query.bind(text),
            Value::Blob(blob) => query.bind(blob),
        };
    }
    query
}

/// A column's value that both drivers decode: `i64`, `bool`, `String`, `Vec<u8>`, and their
/// `Option`s for nullable columns.
pub trait Column:
    rusqlite::types::FromSql + sqlx::Type<Postgres> + for<'r> sqlx::Decode<'r, Postgres>
{
}

impl<T> Column for T where
    T: rusqlite::types::FromSql + sqlx::Type<Postgres> + for<'r> sqlx::Decode<'r, Postgres>
{
}

/// One row of a result, on either backend.
pub enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r PgRow),
}

impl Row<'_> {
    /// The value of the column `name`.
    pub fn get<T: Column>(&self, name: &str) -> Result<T, Error> {
        match self {
            Row::Sqlite(row) => Ok(row.get(name)?),
            Row::Postgres(row) => Ok(row.try_get(name)?),
        }
    }

    /// The value of the column at `index`, counted from 0.
    pub fn get_at<T: Column>(&self, index: usize) -> Result<T, Error> {
        match self {
            Row::Sqlite(row) => Ok(row.get(index)?),
            Row::Postgres(row) => Ok(row.try_get(index)?),
        }
    }
}

/// A type a row is read into. Tuples of [`Column`]s read the columns in order; a struct
/// names its columns:
///
/// ```
/// struct Note { id: String, words: i64 }
///
/// impl storage::FromRow for Note {
///     fn from_row(row: &storage::Row) -> Result<Self, storage::Error> {
///         Ok(Note { id: row.get("id")?, words: row.get("words")? })
///     }
/// }
/// ```
pub trait FromRow: Sized {
    fn from_row(row: &Row) -> Result<Self, Error>;
}

macro_rules! tuple_from_row {
    ($($column:ident $index:tt),*) => {
        impl<$($column: Column),*> FromRow for ($($column,)*) {
            fn from_row(row: &Row) -> Result<Self, Error> {
                Ok(($(row.get_at::<$column>($index)?,)*))
            }
        }
    };
}
tuple_from_row!(A 0);
tuple_from_row!(A 0, B 1);
tuple_from_row!(A 0, B 1, C 2);
tuple_from_row!(A 0, B 1, C 2, D 3);

/// A single column read on its own: `let count: i64 = database.fetch_one("SELECT COUNT(*) …")`.
macro_rules! scalar_from_row {
    ($($scalar:ty),*) => {$(
        impl FromRow for $scalar {
            fn from_row(row: &Row) -> Result<Self, Error> {
                row.get_at(0)
            }
        }
    )*};
}
scalar_from_row!(i64, bool, String, Vec<u8>, Option<i64>, Option<String>);

/// Declares a struct whose fields are named as the columns of a row, and reads it with
/// [`FromRow`]:
///
/// ```
/// storage::row! {
///     /// A note as stored.
///     #[derive(Debug)]
///     pub struct Note {
///         pub id: String,
///         words: Option<i64>,
///     }
/// }
/// ```
#[macro_export]
macro_rules! row {
    ($(#[$meta:meta])* $vis:vis struct $name:ident { $($(#[$field_meta:meta])* $field_vis:vis $field:ident : $type:ty),* $(,)? }) => {
        $(#[$meta])*
        $vis struct $name {
            $($(#[$field_meta])* $field_vis $field: $type),*
        }

        impl $crate::FromRow for $name {
            fn from_row(row: &$crate::Row) -> ::std::result::Result<Self, $crate::Error> {
                Ok(Self { $($field: row.get(stringify!($field))?),* })
            }
        }
    };
}
