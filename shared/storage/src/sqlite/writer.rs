//! SQLite's one writer: a thread that owns the write connection and commits the work of
//! concurrent callers together (group commit).
//!
//! Why one writer and batches? SQLite lets one connection write at a time, and every commit
//! writes the pages it changed to the WAL and syncs it (`synchronous = FULL`). The writer opens
//! a transaction, runs each waiting caller's work in turn, each inside a SAVEPOINT of its own
//! (a failing member rolls back only its own statements), and commits once for all of them; a
//! caller hears that its work committed only after that commit. A batch is whatever queued
//! while the previous member ran, up to `max_batch`: at one request in flight it is that
//! request alone.
//!
//! Why a thread, and work sent to it as a closure? The work's statements then run where the
//! connection is, one function call each: a caller waits for the writer once per unit of work,
//! not once per statement.
//!
//! The writer knows whether its transaction is open. A `BEGIN` that failed (the file locked by
//! another process past the busy timeout) opened nothing, and its work is refused, not run
//! outside a transaction. After an error SQLite may roll the whole transaction back by itself
//! (BUSY, FULL, IOERR, NOMEM): the writer checks after every member, and then tells every member
//! of the batch that its work is gone.

use std::{panic::AssertUnwindSafe, time::Duration};

use rusqlite::Connection;
use tokio::sync::mpsc;

use crate::Error;

/// A caller's work: given the connection, inside the batch's transaction and a savepoint of its
/// own, or told why it cannot run. `Some` keeps the work and is told whether the batch
/// committed; `None` rolls it back (the caller has its answer already).
pub(crate) type Job = Box<dyn FnOnce(Result<Turn<'_>, Error>) -> Option<Settle> + Send>;

/// A member's turn on the writer: the connection, and the writer's runtime, in which the
/// member's work runs to its end (on SQLite it never waits for I/O; the runtime lets it use
/// tokio's timers and channels).
pub(crate) struct Turn<'w> {
    pub(crate) connection: &'w mut Connection,
    pub(crate) runtime: &'w tokio::runtime::Runtime,
}

/// Told whether the batch of a kept member committed: `Err` with why it was rolled back.
pub(crate) type Settle = Box<dyn FnOnce(Result<(), String>) + Send>;

/// Work waiting for the writer; more waits in the callers' own queues.
const QUEUE: usize = 1_024;

/// The handle of the writer; its thread ends once every handle is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Writer {
    jobs: mpsc::Sender<Job>,
}

impl Writer {
    /// Starts the writer's thread on `connection`.
    pub(crate) fn spawn(
        connection: Connection,
        max_batch: usize,
        batch_wait: Duration,
    ) -> Result<Self, Error> {
        let (jobs, queue) = mpsc::channel(QUEUE);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()?;
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                let mut batches = Batches {
                    connection,
                    queue,
                    max_batch,
                    batch_wait,
                    runtime,
                };
                while batches.commit_next() {}
            })?;
        Ok(Self { jobs })
    }

    /// Queues `job`; fails when the writer did not take it within `wait` (nothing of it runs).
    pub(crate) async fn queue(&self, job: Job, wait: Duration) -> Result<(), Error> {
        match tokio::time::timeout(wait, self.jobs.send(job)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => Err(Error::WriterStopped),
            Err(_) => Err(Error::WriterBusy),
        }
    }
}

struct Batches {
    connection: Connection,
    queue: mpsc::Receiver<Job>,
    max_batch: usize,
    batch_wait: Duration,
    runtime: tokio::runtime::Runtime,
}

impl Batches {
    /// Commits the next batch; `false` once every handle is gone.
    fn commit_next(&mut self) -> bool {
        let Some(first) = self.queue.blocking_recv() else {
            return false;
        };
        if let Err(error) = self.connection.execute_batch("BEGIN IMMEDIATE") {
            tracing::warn!(%error, "a SQLite transaction could not begin");
            first(Err(error.into()));
            return true;
        }
        let mut kept: Vec<Settle> = Vec::new();
        let mut next = Some(first);
        let mut failure = None;
        while let Some(job) = next.take() {
            if let Err(error) = self.connection.execute_batch("SAVEPOINT member") {
                job(Err(Error::RolledBack(error.to_string())));
                failure = Some(error.to_string());
                break;
            }
            // A panic in one caller's work must not stop the writer of every other: the caller
            // hears that the writer dropped its work, which is rolled back.
            let settle = std::panic::catch_unwind(AssertUnwindSafe(|| {
                job(Ok(Turn {
                    connection: &mut self.connection,
                    runtime: &self.runtime,
                }))
            }))
            .unwrap_or(None);
            if self.connection.is_autocommit() {
                kept.extend(settle);
                failure = Some("SQLite rolled the transaction back after an error".to_owned());
                break;
            }
            let closed = match settle {
                Some(settle) => {
                    kept.push(settle);
                    self.connection.execute_batch("RELEASE member")
                }
                None => self
                    .connection
                    .execute_batch("ROLLBACK TO member; RELEASE member"),
            };
            if let Err(error) = closed {
                failure = Some(error.to_string());
                break;
            }
            if kept.len() < self.max_batch {
                next = self.more();
            }
        }
        let failure = match failure {
            None => self
                .connection
                .execute_batch("COMMIT")
                .err()
                .map(|error| error.to_string()),
            failure => failure,
        };
        match failure {
            None => kept.into_iter().for_each(|settle| settle(Ok(()))),
            Some(failure) => {
                tracing::error!(%failure, members = kept.len(), "a SQLite batch failed and is rolled back whole");
                if !self.connection.is_autocommit() {
                    let _ = self.connection.execute_batch("ROLLBACK");
                }
                kept.into_iter()
                    .for_each(|settle| settle(Err(failure.clone())));
            }
        }
        true
    }

    /// The next member of the batch: work that queued meanwhile, or that comes within
    /// `batch_wait`.
    fn more(&mut self) -> Option<Job> {
        match self.queue.try_recv() {
            Ok(job) => Some(job),
            Err(_) if self.batch_wait.is_zero() => None,
            Err(_) => self
                .runtime
                .block_on(tokio::time::timeout(self.batch_wait, self.queue.recv()))
                .ok()
                .flatten(),
        }
    }
}
