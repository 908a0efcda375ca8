//! A statement with its parameters owned, and the one place that reads parameters in SQL text.

use std::{borrow::Cow, fmt::Write as _};

use crate::row::{Owned, Param};

/// A statement and its parameters, copied: one that can go to another thread (SQLite's writer),
/// wait to run later, or become part of a larger statement ([`Statement::append`]). Written, as
/// every statement here, with PostgreSQL's `$1` parameters.
#[derive(Debug, Clone)]
pub struct Statement {
    sql: Cow<'static, str>,
    params: Vec<Owned>,
}

impl Statement {
    pub fn new(sql: impl Into<Cow<'static, str>>, params: &[&dyn Param]) -> Self {
        Self {
            sql: sql.into(),
            params: params
                .iter()
                .map(|param| Owned::from(param.value()))
                .collect(),
        }
    }

    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Its parameters, as [`Tx::execute`](crate::Tx::execute) and its siblings bind them.
    pub fn params(&self) -> Vec<&dyn Param> {
        self.params
            .iter()
            .map(|param| param as &dyn Param)
            .collect()
    }

    /// Appends SQL text that binds nothing: the glue of a statement built from several.
    pub fn push_sql(&mut self, sql: &str) {
        self.sql.to_mut().push_str(sql);
    }

    /// Appends `other`, its parameters numbered after this statement's (with two parameters
    /// here, `other`'s `$1` becomes `$3`).
    pub fn append(&mut self, other: &Statement) {
        let before = self.params.len();
        rewrite_parameters(&other.sql, self.sql.to_mut(), |digits, sql| {
            let number: usize = digits.parse().expect("a parameter's number fits a usize");
            write!(sql, "${}", number + before).expect("a String takes any text");
        });
        self.params.extend(other.params.iter().cloned());
    }
}

/// `sql` with SQLite's numbered parameters (`?1`) for PostgreSQL's (`$1`). SQLite reads `$1` as
/// a named parameter and numbers it by its first appearance, so a statement that uses `$2`
/// before `$1` would bind them swapped; `?N` is numbered by its digits.
pub(crate) fn numbered(sql: &str) -> Cow<'_, str> {
    if !sql.contains('$') {
        return Cow::Borrowed(sql);
    }
    let mut translated = String::with_capacity(sql.len());
    rewrite_parameters(sql, &mut translated, |digits, sql| {
        sql.push('?');
        sql.push_str(digits);
    });
    Cow::Owned(translated)
}

/// Appends `sql` to `out`, each parameter (`$` and digits) written by `parameter` from its
/// digits. No statement here has a `$` in a literal.
fn rewrite_parameters(sql: &str, out: &mut String, mut parameter: impl FnMut(&str, &mut String)) {
    let mut rest = sql;
    while let Some(dollar) = rest.find('$') {
        out.push_str(&rest[..dollar]);
        let after = &rest[dollar + 1..];
        let digits = after.len()
            - after
                .trim_start_matches(|character: char| character.is_ascii_digit())
                .len();
        if digits == 0 {
            out.push('$');
        } else {
            parameter(&after[..digits], out);
        }
        rest = &after[digits..];
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::{Statement, numbered};

    #[test]
    fn parameters_are_numbered_by_their_digits() {
        assert_eq!(
            numbered("UPDATE t SET a = $2 WHERE b = $1 AND c = $12"),
            "UPDATE t SET a = ?2 WHERE b = ?1 AND c = ?12"
        );
        assert_eq!(numbered("SELECT 1"), "SELECT 1");
    }

    #[test]
    fn an_appended_statement_numbers_its_parameters_after_the_others() {
        let mut joined = Statement::new(
            "WITH a AS (UPDATE t SET x = $1 WHERE y = $2 RETURNING 1) ",
            &[&1_i64, &2_i64],
        );
        joined.append(&Statement::new(
            "INSERT INTO u SELECT $2, $1, $10 FROM a",
            &[&"one", &"two", &"three"],
        ));
        assert_eq!(
            joined.sql(),
            "WITH a AS (UPDATE t SET x = $1 WHERE y = $2 RETURNING 1) INSERT INTO u SELECT $4, $3, $12 FROM a"
        );
        assert_eq!(joined.params().len(), 5);
    }
}
