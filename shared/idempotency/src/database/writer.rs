//! SQLite's one writer, which commits concurrent transactions together.
//!
//! Why one writer and batches? SQLite lets one connection write at a time, and every commit
//! writes the pages it changed to the WAL (and syncs it, under `synchronous = FULL`). Concurrent
//! requests' transactions are committed together instead: the writer task holds the one write
//! connection, opens a transaction, and lends the connection to each waiting request in turn.
//! Each request's work runs inside a SAVEPOINT of its own, so a request that fails or is dropped
//! rolls back only its own statements while the others' stay in the batch; a request learns
//! that its work committed only once the whole batch has. A batch is whatever queued while the
//! previous member worked (up to [`SqliteSettings::max_batch`], with an optional wait for more): at one
//! request in flight, the batch is that request alone, and its first member needs no savepoint,
//! so it costs what a transaction of its own would.

use std::time::Duration;

use sqlx::{Executor, SqliteConnection};
use tokio::sync::{mpsc, oneshot};

use super::SqliteSettings;

/// A request for the write connection: answered with a [`Member`] of the current batch.
type Join = oneshot::Sender<Result<Member, sqlx::Error>>;

/// Requests waiting for the writer; more wait in their callers' pools and queues.
const QUEUE: usize = 1_024;

/// The handle of the writer task; the task ends once every handle is dropped.
#[derive(Debug, Clone)]
pub(super) struct Writer {
    joins: mpsc::Sender<Join>,
}

impl Writer {
    pub(super) fn spawn(connection: SqliteConnection, settings: &SqliteSettings) -> Self {
        let (joins, waiting) = mpsc::channel(QUEUE);
        let max_batch = settings.max_batch.get() as usize;
        tokio::spawn(run(connection, waiting, max_batch, Duration::from_micros(settings.batch_wait_us)));
        Self { joins }
    }

    /// Waits for this request's turn on the write connection, inside the current batch.
    pub(super) async fn join(&self) -> Result<Member, sqlx::Error> {
        let (join, member) = oneshot::channel();
        let turn = async {
            self.joins.send(join).await.map_err(|_| sqlx::Error::WorkerCrashed)?;
            member.await.map_err(|_| sqlx::Error::WorkerCrashed)?
        };
        tokio::time::timeout(super::WAIT, turn).await.map_err(|_| sqlx::Error::PoolTimedOut)?
    }
}

/// One request's turn on the write connection. [`Member::commit`] hands the connection back and
/// waits for the batch's commit; a member dropped without it hands the connection back too, and
/// its work is rolled back.
#[derive(Debug)]
pub(super) struct Member {
    connection: Option<SqliteConnection>,
    returned: Option<oneshot::Sender<Returned>>,
}

#[derive(Debug)]
struct Returned {
    connection: SqliteConnection,
    /// Where to say whether the batch committed; `None` when the member's work is to be undone.
    committed: Option<oneshot::Sender<Result<(), sqlx::Error>>>,
}

impl Member {
    pub(super) fn connection(&mut self) -> &mut SqliteConnection {
        self.connection.as_mut().expect("a member holds the connection until it hands it back")
    }

    pub(super) async fn commit(mut self) -> Result<(), sqlx::Error> {
        let (committed, outcome) = oneshot::channel();
        self.hand_back(Some(committed));
        outcome.await.map_err(|_| sqlx::Error::WorkerCrashed)?
    }

    fn hand_back(&mut self, committed: Option<oneshot::Sender<Result<(), sqlx::Error>>>) {
        if let (Some(connection), Some(returned)) = (self.connection.take(), self.returned.take()) {
            // Fails only when the writer is gone, and the connection with it.
            let _ = returned.send(Returned { connection, committed });
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.hand_back(None);
    }
}

/// The savepoint of every member but a batch's first. A kept member's savepoint is not
/// released: the batch's `COMMIT` releases them all, and leaving them nested saves a hand-off to
/// the connection's thread per member. One name serves, because `ROLLBACK TO` goes back to the
/// newest savepoint of that name, the current member's.
const SAVEPOINT: &str = "SAVEPOINT member";
const ROLLBACK_TO: &str = "ROLLBACK TO member";

async fn run(mut connection: SqliteConnection, mut waiting: mpsc::Receiver<Join>, max_batch: usize, batch_wait: Duration) {
    while let Some(first) = waiting.recv().await {
        // The members whose work is in the open transaction, told once it commits.
        let mut kept: Vec<oneshot::Sender<Result<(), sqlx::Error>>> = Vec::new();
        let mut open = false;
        let mut failure = None;
        let mut next = Some(first);
        while let Some(join) = next.take() {
            // The first member's work is undone by rolling the transaction back.
            let savepoint = !kept.is_empty();
            let started = if !open {
                connection.execute("BEGIN IMMEDIATE").await
            } else if savepoint {
                connection.execute(SAVEPOINT).await
            } else {
                Ok(Default::default())
            };
            if let Err(error) = started {
                let _ = join.send(Err(error));
                break;
            }
            open = true;
            let (returned, handed_back) = oneshot::channel();
            let member = Member { connection: Some(connection), returned: Some(returned) };
            let committed = match join.send(Ok(member)) {
                // The request stopped waiting before its turn: nothing of it ran.
                Err(unsent) => {
                    let mut member = unsent.expect("sent as Ok");
                    member.returned = None;
                    connection = member.connection.take().expect("an unsent member holds the connection");
                    None
                }
                Ok(()) => match handed_back.await {
                    Ok(back) => {
                        connection = back.connection;
                        back.committed
                    }
                    // A member is handed back when it is committed or dropped; only a runtime
                    // shutting down drops it in neither way, and the connection with it.
                    Err(_) => return,
                },
            };
            let settled = match (&committed, savepoint) {
                (Some(_), _) => Ok(()),
                (None, true) => connection.execute(ROLLBACK_TO).await.map(drop),
                (None, false) => {
                    open = false;
                    connection.execute("ROLLBACK").await.map(drop)
                }
            };
            kept.extend(committed);
            if let Err(error) = settled {
                failure = Some(error);
                break;
            }
            if kept.len() < max_batch {
                next = match waiting.try_recv() {
                    Ok(join) => Some(join),
                    Err(_) if batch_wait.is_zero() || kept.is_empty() => None,
                    Err(_) => tokio::time::timeout(batch_wait, waiting.recv()).await.ok().flatten(),
                };
            }
        }
        if !open {
            continue;
        }
        let failure = match failure {
            Some(error) => Some(error),
            None if kept.is_empty() => connection.execute("ROLLBACK").await.err(),
            None => connection.execute("COMMIT").await.err(),
        };
        match failure {
            None => kept.into_iter().for_each(|member| drop(member.send(Ok(())))),
            Some(error) => {
                tracing::error!(%error, members = kept.len(), "a SQLite batch failed and is rolled back whole");
                let _ = connection.execute("ROLLBACK").await;
                let message = error.to_string();
                for member in kept {
                    let _ = member.send(Err(sqlx::Error::Io(std::io::Error::other(format!("the batch of this transaction failed: {message}")))));
                }
            }
        }
    }
}
