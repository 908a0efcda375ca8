//! SQLite through rusqlite: one writer thread per file and process, readers beside it.

mod writer;

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, LazyLock, Mutex, Weak},
    time::Duration,
};

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

use crate::{Error, Migrations, SqliteSettings, Synchronous, Tx};

/// How long SQLite waits for another process's write lock, and a caller for the writer to take
/// its work.
const WAIT: Duration = Duration::from_secs(5);

/// Read connections kept open between reads.
const IDLE_READERS: usize = 8;

/// Statements each connection keeps prepared.
const PREPARED: usize = 64;

/// One SQLite file of this process: its writer and its readers, shared by everyone who opens it.
#[derive(Debug)]
pub(crate) struct Sqlite {
    writer: writer::Writer,
    path: PathBuf,
    idle_readers: Mutex<Vec<Connection>>,
}

/// The files this process has open, so that every component opening one shares its writer:
/// two writers on one file would take turns at its lock instead of batching.
static OPEN: LazyLock<Mutex<HashMap<PathBuf, Weak<Sqlite>>>> = LazyLock::new(Mutex::default);

impl Sqlite {
    /// Opens the file `path` (created owner-only when missing) and applies `migrations`; the
    /// file's writer is shared with whoever in this process has it open already, and then the
    /// first opener's `settings` stay in force.
    pub(crate) async fn open(
        path: &Path,
        settings: &SqliteSettings,
        migrations: Vec<Migrations>,
    ) -> Result<Arc<Self>, Error> {
        create_private(path)?;
        let path = std::fs::canonicalize(path)?;
        let shared = {
            let mut open = OPEN
                .lock()
                .expect("the registry of open files is never poisoned");
            open.retain(|_, sqlite| sqlite.strong_count() > 0);
            match open.get(&path).and_then(Weak::upgrade) {
                Some(sqlite) => sqlite,
                None => {
                    let sqlite = Arc::new(Self::start(&path, settings)?);
                    open.insert(path.clone(), Arc::downgrade(&sqlite));
                    sqlite
                }
            }
        };
        shared
            .write(async move |tx: &mut Tx<'_>| {
                crate::migrate::sqlite(tx.sqlite_connection(), &migrations)
            })
            .await?;
        Ok(shared)
    }

    fn start(path: &Path, settings: &SqliteSettings) -> Result<Self, Error> {
        let connection = Connection::open(path)?;
        connection.busy_timeout(WAIT)?;
        connection.set_prepared_statement_cache_capacity(PREPARED);
        // WAL lets the readers run beside the writer. A batch's savepoints keep the pages their
        // members change in a sub-journal, in memory rather than in a temporary file.
        let synchronous = match settings.synchronous {
            Synchronous::Normal => "NORMAL",
            Synchronous::Full => "FULL",
        };
        connection.execute_batch(&format!("PRAGMA journal_mode = WAL; PRAGMA synchronous = {synchronous}; PRAGMA temp_store = MEMORY;"))?;
        let writer = writer::Writer::spawn(
            connection,
            settings.max_batch.get() as usize,
            Duration::from_micros(settings.batch_wait_us),
        )?;
        Ok(Self {
            writer,
            path: path.to_owned(),
            idle_readers: Mutex::default(),
        })
    }

    /// Runs `work` on the writer, as one member of its next batch: see [`writer`].
    pub(crate) async fn write<T, E, F>(&self, work: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<T, E> + Send + 'static,
        T: Send + 'static,
        E: From<Error> + Send + 'static,
    {
        // Counted by whoever listens (the benchmark's trips per request).
        tracing::debug!(target: "storage::write", "a unit of work for the writer");
        let (reply, answer) = oneshot::channel::<Result<T, E>>();
        let job: writer::Job = Box::new(move |turn| {
            let turn = match turn {
                Ok(turn) => turn,
                Err(error) => {
                    let _ = reply.send(Err(E::from(error)));
                    return None;
                }
            };
            // The caller stopped waiting before its turn: nothing of its work runs.
            if reply.is_closed() {
                return None;
            }
            let mut tx = Tx::sqlite(turn.connection);
            match turn.runtime.block_on(work(&mut tx)) {
                Ok(done) => Some(Box::new(move |committed: Result<(), String>| {
                    let _ = reply.send(
                        committed
                            .map(|()| done)
                            .map_err(|failure| E::from(Error::RolledBack(failure))),
                    );
                })),
                Err(error) => {
                    let _ = reply.send(Err(error));
                    None
                }
            }
        });
        self.writer.queue(job, WAIT).await?;
        answer.await.map_err(|_| E::from(Error::WriterStopped))?
    }

    /// A read connection: see [`crate::Database::read`].
    pub(crate) fn reader(&self) -> Result<Reader<'_>, Error> {
        let idle = self
            .idle_readers
            .lock()
            .expect("the idle readers are never poisoned")
            .pop();
        let connection = match idle {
            Some(connection) => connection,
            None => {
                let connection = Connection::open_with_flags(
                    &self.path,
                    OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
                )?;
                connection.busy_timeout(WAIT)?;
                connection.set_prepared_statement_cache_capacity(PREPARED);
                connection
            }
        };
        Ok(Reader {
            connection: Some(connection),
            sqlite: self,
        })
    }
}

/// A read connection, back among the idle ones when dropped (closed if too many are).
pub(crate) struct Reader<'s> {
    connection: Option<Connection>,
    sqlite: &'s Sqlite,
}

impl Reader<'_> {
    pub(crate) fn connection(&mut self) -> &mut Connection {
        self.connection
            .as_mut()
            .expect("a reader holds its connection until dropped")
    }
}

impl Drop for Reader<'_> {
    fn drop(&mut self) {
        let Some(connection) = self.connection.take() else {
            return;
        };
        // A read dropped midway leaves its snapshot open: end it, or the next read sees old data.
        if !connection.is_autocommit() && connection.execute_batch("ROLLBACK").is_err() {
            return;
        }
        let mut idle = self
            .sqlite
            .idle_readers
            .lock()
            .expect("the idle readers are never poisoned");
        if idle.len() < IDLE_READERS {
            idle.push(connection);
        }
    }
}

/// Creates the SQLite file `path`, when missing, readable and writable by its owner only: it holds
/// every order and payment, and the stored answers. SQLite gives its `-wal` and `-shm` files the
/// permissions of the database file.
fn create_private(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => Err(error),
        _ => Ok(()),
    }
}
