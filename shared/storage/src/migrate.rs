//! Migrations, written as sqlx's `migrate!` embeds them, applied on either backend.
//!
//! Why apply SQLite's by hand? sqlx's migrator runs on sqlx's SQLite driver, which this crate
//! does not use. The history goes in the table sqlx would keep (`_sqlx_migrations_<owner>`,
//! same columns), so that a file migrated by either is read by the other.

use sqlx::PgPool;

use crate::{Error, Migrations};

/// Applies to SQLite's `connection`, inside the caller's transaction, the `migrations` not
/// applied yet; a migration applied with other contents than today's is an error.
pub(crate) fn sqlite(
    connection: &mut rusqlite::Connection,
    migrations: &[Migrations],
) -> Result<(), Error> {
    for (owner, migrator) in migrations {
        let table = format!("_sqlx_migrations_{owner}");
        connection.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {table} (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
             installed_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP, success BOOLEAN NOT NULL, \
             checksum BLOB NOT NULL, execution_time BIGINT NOT NULL)"
        ))?;
        for migration in migrator
            .iter()
            .filter(|migration| migration.migration_type.is_up_migration())
        {
            let applied: Option<Vec<u8>> = connection
                .query_row(
                    &format!("SELECT checksum FROM {table} WHERE version = ?1"),
                    [migration.version],
                    |row| row.get(0),
                )
                .map(Some)
                .or_else(|error| {
                    if error == rusqlite::Error::QueryReturnedNoRows {
                        Ok(None)
                    } else {
                        Err(error)
                    }
                })?;
            match applied {
                Some(checksum) if checksum == *migration.checksum => {}
                Some(_) => {
                    return Err(Error::MigrationChanged {
                        owner,
                        version: migration.version,
                    });
                }
                None => {
                    connection.execute_batch(migration.sql.as_str())?;
                    connection.execute(
                        &format!("INSERT INTO {table} (version, description, success, checksum, execution_time) VALUES (?1, ?2, TRUE, ?3, -1)"),
                        rusqlite::params![migration.version, &*migration.description, &*migration.checksum],
                    )?;
                }
            }
        }
    }
    Ok(())
}

/// Applies `migrations` to PostgreSQL with sqlx's migrator, each owner's history in its table.
pub(crate) async fn postgres(pool: &PgPool, migrations: Vec<Migrations>) -> Result<(), Error> {
    for (owner, mut migrator) in migrations {
        migrator.dangerous_set_table_name(format!("_sqlx_migrations_{owner}"));
        migrator.run(pool).await?;
    }
    Ok(())
}
