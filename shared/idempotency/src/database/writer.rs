//! SQLite's one writer, which commits concurrent transactions together.
//!
//! Why one writer and batches? SQLite lets one connection write at a time, and every commit
//! writes the pages it changed to the WAL (and syncs it, under `synchronous = FULL`). Concurrent
//! requests' transactions are committed together instead: the writer holds the one write
//! connection, opens a transaction, and runs each waiting request's work in turn. Each request's
//! work runs inside a SAVEPOINT of its own, so a request that fails or is dropped rolls back only
//! its own statements while the others' stay in the batch; a request learns that its work
//! committed only once the whole batch has. A batch is whatever queued while the previous member
//! worked (up to [`SqliteSettings::max_batch`], with an optional wait for more): at one request
//! in flight, the batch is that request alone, and its first member needs no savepoint, so it
//! costs what a transaction of its own would.
//!
//! Why a thread of its own, and work sent to it? Every statement is a round trip to sqlx's
//! connection thread. Work sent to the writer ([`Writer::run`]) runs its statements from the
//! writer's thread, where nothing else is scheduled: a request is woken once per unit of work,
//! not once per statement behind every other task of the process, and the writer is never held
//! by a request waiting for its turn to run. Work that must run on the request's own task (it
//! borrows the request's state) is lent the connection instead ([`Writer::join`]).
//!
//! Why does the writer open its connection itself? So that sqlx's connection thread starts on
//! the writer's CPU and the two take turns there (see [`super::affinity`]); once connected, the
//! writer lets the connection thread finish what it is doing before it runs (see
//! [`super::wakeup`]).
//!
//! Why work whose statements are each safe alone ([`Writer::autocommit`]) is told apart? Each
//! query costs a round trip to sqlx's connection thread, and so does the batch's `COMMIT` (a
//! job's `BEGIN` or `SAVEPOINT` goes with its first statement, see [`super::sqlite_executor`]).
//! Such work needs none of them: with nothing waiting behind it, it runs outside any
//! transaction, each statement committing as it runs (a single `INSERT` is one round trip, not
//! two); in a batch it runs without a savepoint, because a statement that fails is undone by
//! SQLite itself and the ones before it may stay.

use std::time::Duration;

use futures::future::BoxFuture;
use sqlx::{Executor, SqliteConnection, sqlite::SqliteConnectOptions};
use tokio::sync::{mpsc, oneshot};

use super::{DatabaseError, Migrations, Open, SqliteSettings, Transaction, affinity, sqlite_executor::Opening, wakeup};

/// A request for the write connection: answered with a [`Member`] of the current batch.
type Join = oneshot::Sender<Result<Member, sqlx::Error>>;

/// Work the writer runs itself, as one member of a batch, in its transaction: `Some` keeps the
/// work, and is told whether its batch committed; `None` rolls it back.
pub(super) type Job = Box<dyn for<'t> FnOnce(&'t mut Transaction) -> BoxFuture<'t, Option<Settle>> + Send>;

/// Told whether the batch of a kept member committed.
pub(super) type Settle = Box<dyn FnOnce(Result<(), sqlx::Error>) + Send>;

/// What waits for the writer.
enum Work {
    Lend(Join),
    Run(Job),
    /// A job whose statements are each safe alone: no transaction or savepoint of its own.
    Autocommit(Job),
}

/// Requests waiting for the writer; more wait in their callers' pools and queues.
const QUEUE: usize = 1_024;

/// The handle of the writer; its thread ends once every handle is dropped.
#[derive(Clone)]
pub(super) struct Writer {
    work: mpsc::Sender<Work>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("waiting", &(QUEUE - self.work.capacity())).finish()
    }
}

impl Writer {
    /// Starts the writer's thread, which opens the write connection with `options` and applies
    /// `migrations` before it takes work; returns once they are applied.
    pub(super) async fn spawn(options: SqliteConnectOptions, migrations: Vec<Migrations>, settings: &SqliteSettings) -> Result<Self, DatabaseError> {
        let (work, waiting) = mpsc::channel(QUEUE);
        let max_batch = settings.max_batch.get() as usize;
        let batch_wait = Duration::from_micros(settings.batch_wait_us);
        let runtime = tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(sqlx::Error::Io)?;
        let (opened, open) = oneshot::channel();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || {
                affinity::stay_on_current_cpu();
                runtime.block_on(async move {
                    match super::connect_writer(&options, migrations).await {
                        Ok(connection) => {
                            wakeup::wait_for_the_waker();
                            if opened.send(Ok(())).is_ok() {
                                run(connection, waiting, max_batch, batch_wait).await;
                            }
                        }
                        Err(error) => drop(opened.send(Err(error))),
                    }
                })
            })
            .map_err(sqlx::Error::Io)?;
        open.await.map_err(|_| sqlx::Error::WorkerCrashed)??;
        Ok(Self { work })
    }

    /// Waits for this request's turn on the write connection, inside the current batch.
    pub(super) async fn join(&self) -> Result<Member, sqlx::Error> {
        let (join, member) = oneshot::channel();
        let turn = async {
            self.work.send(Work::Lend(join)).await.map_err(|_| sqlx::Error::WorkerCrashed)?;
            member.await.map_err(|_| sqlx::Error::WorkerCrashed)?
        };
        tokio::time::timeout(super::WAIT, turn).await.map_err(|_| sqlx::Error::PoolTimedOut)?
    }

    /// Has the writer run `job` in the current batch. The job reports its own outcome (see
    /// [`Job`]); this only fails when the job could not be queued in time.
    pub(super) async fn run(&self, job: Job) -> Result<(), sqlx::Error> {
        self.queue(Work::Run(job)).await
    }

    /// As [`Writer::run`], for a job whose statements are each safe alone, as a statement that
    /// commits by itself is: it runs outside any transaction when nothing waits behind it, and
    /// without a savepoint in a batch. A job that fails keeps the statements that succeeded.
    pub(super) async fn autocommit(&self, job: Job) -> Result<(), sqlx::Error> {
        self.queue(Work::Autocommit(job)).await
    }

    async fn queue(&self, work: Work) -> Result<(), sqlx::Error> {
        let queued = self.work.send(work);
        tokio::time::timeout(super::WAIT, queued).await.map_err(|_| sqlx::Error::PoolTimedOut)?.map_err(|_| sqlx::Error::WorkerCrashed)
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

async fn run(mut connection: SqliteConnection, mut waiting: mpsc::Receiver<Work>, max_batch: usize, batch_wait: Duration) {
    while let Some(first) = waiting.recv().await {
        // The members whose work is in the open transaction, told once it commits.
        let mut kept: Vec<Settle> = Vec::new();
        let mut open = false;
        let mut failure = None;
        let mut next = Some(first);
        while let Some(work) = next.take() {
            // With no transaction open and nothing behind it, work whose statements are each
            // safe alone runs by itself: no BEGIN and COMMIT around it.
            let work = match work {
                Work::Autocommit(job) if !open && waiting.is_empty() => {
                    let (back, settle) = on_writer(connection, job, &mut Opening::default()).await;
                    connection = back;
                    if let Some(settle) = settle {
                        settle(Ok(()));
                    }
                    next = waiting.try_recv().ok();
                    continue;
                }
                work => work,
            };
            // What a failed member leaves is undone: the first's by rolling the transaction
            // back, a later one's by going back to its savepoint. Statements each safe alone
            // are not undone, so they need no savepoint. A job's opening statement goes with its
            // first statement (see [`super::sqlite_executor`]); a member lent the connection
            // gets it at once.
            let each_alone = matches!(work, Work::Autocommit(_));
            let savepoint = open && !each_alone && !kept.is_empty();
            let mut opening = Opening::new(if !open {
                Some("BEGIN IMMEDIATE")
            } else if savepoint {
                Some(SAVEPOINT)
            } else {
                None
            });
            let settle = match work {
                Work::Lend(join) => {
                    if let Some(statement) = opening.take_statement()
                        && let Err(error) = connection.execute(statement).await
                    {
                        drop(join.send(Err(error)));
                        break;
                    }
                    match lend(connection, join).await {
                        Some((back, settle)) => {
                            connection = back;
                            settle
                        }
                        // A member is handed back when it is committed or dropped; only a
                        // runtime shutting down drops it in neither way, and the connection
                        // with it.
                        None => return,
                    }
                }
                Work::Run(job) | Work::Autocommit(job) => {
                    let (back, settle) = on_writer(connection, job, &mut opening).await;
                    connection = back;
                    settle
                }
            };
            // A member that ran no statement opened nothing: no savepoint to go back to, and,
            // as the first, no transaction yet.
            let opened = opening.ran();
            open = open || opened;
            let settled = match &settle {
                Some(_) => Ok(()),
                None if each_alone || !opened => Ok(()),
                None if savepoint => connection.execute(ROLLBACK_TO).await.map(drop),
                None => {
                    open = false;
                    connection.execute("ROLLBACK").await.map(drop)
                }
            };
            kept.extend(settle);
            if let Err(error) = settled {
                failure = Some(error);
                break;
            }
            if kept.len() < max_batch {
                next = match waiting.try_recv() {
                    Ok(work) => Some(work),
                    Err(_) if batch_wait.is_zero() || kept.is_empty() => None,
                    Err(_) => tokio::time::timeout(batch_wait, waiting.recv()).await.ok().flatten(),
                };
            }
        }
        if !open {
            // Members that ran no statement: nothing to commit.
            kept.into_iter().for_each(|settle| settle(Ok(())));
            continue;
        }
        let failure = match failure {
            Some(error) => Some(error),
            None if kept.is_empty() => connection.execute("ROLLBACK").await.err(),
            None => connection.execute("COMMIT").await.err(),
        };
        match failure {
            None => kept.into_iter().for_each(|settle| settle(Ok(()))),
            Some(error) => {
                tracing::error!(%error, members = kept.len(), "a SQLite batch failed and is rolled back whole");
                let _ = connection.execute("ROLLBACK").await;
                let message = error.to_string();
                for settle in kept {
                    settle(Err(sqlx::Error::Io(std::io::Error::other(format!("the batch of this transaction failed: {message}")))));
                }
            }
        }
    }
}

/// Runs `job` on the writer's connection, in whatever transaction is open on it, with `opening`
/// sent in front of its first statement.
async fn on_writer(connection: SqliteConnection, job: Job, opening: &mut Opening) -> (SqliteConnection, Option<Settle>) {
    let mut transaction = Transaction(Open::OnWriter(connection, std::mem::take(opening)));
    let settle = job(&mut transaction).await;
    let Transaction(Open::OnWriter(connection, left)) = transaction else { unreachable!("a job cannot replace its transaction") };
    *opening = left;
    (connection, settle)
}

/// Lends the connection to a request and waits for it back, with how to tell the request about
/// the batch's commit (`None` when its work is to be undone); `None` when it never comes back.
async fn lend(connection: SqliteConnection, join: Join) -> Option<(SqliteConnection, Option<Settle>)> {
    let (returned, handed_back) = oneshot::channel();
    let member = Member { connection: Some(connection), returned: Some(returned) };
    match join.send(Ok(member)) {
        // The request stopped waiting before its turn: nothing of it ran.
        Err(unsent) => {
            let mut member = unsent.expect("sent as Ok");
            member.returned = None;
            Some((member.connection.take().expect("an unsent member holds the connection"), None))
        }
        Ok(()) => {
            let back = handed_back.await.ok()?;
            let settle = back.committed.map(|committed| -> Settle { Box::new(move |outcome| drop(committed.send(outcome))) });
            Some((back.connection, settle))
        }
    }
}
