use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use sqlx::FromRow;

use crate::{Clock, Database, SystemClock, Transaction, on_driver};

/// Expiry and reaping of one store's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeySettings {
    /// How long a key (and its stored answer) is kept after its first use.
    pub ttl_ms: u64,
    /// How often the reaper looks for expired keys.
    pub reap_interval_ms: u64,
    /// Rows deleted per statement, so that reaping never holds a long lock.
    pub reap_batch: u32,
}

/// A key TTL too short for the work done under the keys: a key that expires while its work can
/// still go on (or be resumed) stops protecting it.
#[derive(Debug, thiserror::Error)]
#[error("idempotency.ttl_ms is {ttl_ms} ms but must be at least {needed_ms} ms: {why}")]
pub struct TtlTooShort {
    pub ttl_ms: u64,
    pub needed_ms: u64,
    pub why: String,
}

impl KeySettings {
    /// Refuses a TTL shorter than `needed`, the longest a key's work can go on (`why` says what
    /// makes it that long, for the error).
    pub fn require_ttl(&self, needed: Duration, why: impl Into<String>) -> Result<(), TtlTooShort> {
        let needed_ms = needed.as_millis() as u64;
        if self.ttl_ms < needed_ms {
            return Err(TtlTooShort { ttl_ms: self.ttl_ms, needed_ms, why: why.into() });
        }
        Ok(())
    }
}

impl Default for KeySettings {
    fn default() -> Self {
        Self { ttl_ms: 24 * 3_600_000, reap_interval_ms: 60_000, reap_batch: 500 }
    }
}

/// An answer stored under a key: a gRPC code and the exact bytes of the message (a success's
/// encoded response, or a failure's message).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stored {
    pub code: i32,
    pub body: Vec<u8>,
}

/// The right to work on a key, until the lease runs out or another request takes it over.
#[derive(Debug)]
pub struct Lease {
    scope: String,
    key: String,
    token: i64,
    /// The last phase committed under this key (`"started"` for a new one).
    pub recovery_point: String,
    /// What an earlier phase created, e.g. the order id.
    pub resource_id: Option<String>,
    /// A new key's claim, not committed yet: see [`KeyStore::begin_with_first_phase`].
    open: Option<Transaction>,
}

impl Lease {
    fn new(scope: &str, key: &str, token: i64, recovery_point: String, resource_id: Option<String>) -> Self {
        Self { scope: scope.to_owned(), key: key.to_owned(), token, recovery_point, resource_id, open: None }
    }
}

/// A key whose work was left half-done and nobody holds: see [`KeyStore::stranded`].
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct StrandedKey {
    pub scope: String,
    #[sqlx(rename = "idempotency_key")]
    pub key: String,
    /// The holder it was left by, so that resuming it takes over only what was found.
    lock_token: i64,
    pub recovery_point: String,
    pub resource_id: Option<String>,
    /// When the key was first used, ms since the epoch.
    #[sqlx(rename = "created_at")]
    pub created_at_ms: i64,
}

/// What [`KeyStore::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// Work on the key, from the lease's recovery point.
    Execute(Lease),
    /// The key completed earlier: answer with this.
    Replay(Stored),
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Another request holds the key right now; retrying later is safe.
    #[error("a request with this idempotency key is still in flight; retry later")]
    InFlight,
    /// The key was used for a different request; nothing was executed.
    #[error("the idempotency key was already used for a different request")]
    Mismatch,
    /// Another request took the key over after this one's lease ran out.
    #[error("the idempotency key's lease was taken over by another request")]
    LeaseLost,
    #[error("idempotency store: {0}")]
    Storage(#[from] sqlx::Error),
}

/// The idempotency keys of one service.
#[derive(Debug, Clone)]
pub struct KeyStore {
    database: Database,
    clock: Arc<dyn Clock>,
    settings: KeySettings,
    #[cfg(feature = "pause-points")]
    pause: Option<Arc<dyn crate::pause::PauseHook>>,
}

#[derive(Debug, FromRow)]
struct KeyRow {
    fingerprint: String,
    state: String,
    lock_token: i64,
    locked_until: i64,
    response_code: Option<i64>,
    response_body: Option<Vec<u8>>,
    expires_at: i64,
}

const STARTED: &str = "started";
const FINISHED: &str = "finished";
const IN_FLIGHT: &str = "in_flight";
const COMPLETED: &str = "completed";

/// The one rule of expiry, for the reaper and `begin`: a key is deleted once it has expired and
/// nothing can still be done under it, that is when it completed, or when it never got past its
/// first phase and nobody holds it. A key with a live lease, or one whose work is half-done
/// (past `started`, not completed), is kept whatever its age: deleting it would let a repeat
/// execute afresh beside the work already done (a second order, a second charge). `now` names
/// the statement's parameter that holds the current time (e.g. `$3`).
fn expired_and_settled(now: &str) -> String {
    format!("expires_at <= {now} AND (state = '{COMPLETED}' OR (recovery_point = '{STARTED}' AND locked_until <= {now}))")
}

/// Whether a new key's claim commits at once or with the request's first phase.
#[derive(Debug, Clone, Copy)]
enum Claim {
    Committed,
    WithFirstPhase,
}

/// The row of a key claimed now.
struct NewKey<'a> {
    scope: &'a str,
    key: &'a str,
    fingerprint: &'a str,
    token: i64,
    now: i64,
    locked_until: i64,
    expires_at: i64,
}

impl NewKey<'_> {
    /// Inserts the key unless it exists; 1 when it was inserted.
    async fn insert(&self, transaction: &mut Transaction) -> Result<u64, sqlx::Error> {
        Ok(on_driver!(transaction, |executor| sqlx::query(
            "INSERT INTO idempotency_keys \
             (scope, idempotency_key, fingerprint, state, recovery_point, lock_token, locked_until, created_at, expires_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (scope, idempotency_key) DO NOTHING",
        )
        .bind(self.scope)
        .bind(self.key)
        .bind(self.fingerprint)
        .bind(IN_FLIGHT)
        .bind(STARTED)
        .bind(self.token)
        .bind(self.locked_until)
        .bind(self.now)
        .bind(self.expires_at)
        .execute(executor)
        .await?
        .rows_affected()))
    }
}

impl KeyStore {
    pub fn new(database: Database, settings: KeySettings) -> Self {
        Self::with_clock(database, settings, Arc::new(SystemClock))
    }

    pub fn with_clock(database: Database, settings: KeySettings, clock: Arc<dyn Clock>) -> Self {
        Self {
            database,
            clock,
            settings,
            #[cfg(feature = "pause-points")]
            pause: None,
        }
    }

    /// Holds requests at the store's pause points while `hook` says so, to force interleavings
    /// in tests.
    #[cfg(feature = "pause-points")]
    pub fn with_pause_hook(mut self, hook: Arc<dyn crate::pause::PauseHook>) -> Self {
        self.pause = Some(hook);
        self
    }

    #[cfg(feature = "pause-points")]
    async fn pause(&self, at: crate::pause::Pause, key: &str) {
        if let Some(hook) = &self.pause {
            hook.reached(at, key).await;
        }
    }

    pub fn settings(&self) -> KeySettings {
        self.settings
    }

    pub fn database(&self) -> &Database {
        &self.database
    }

    /// Claims `key` in `scope` for a request with `fingerprint`, leased for `lease` (the
    /// request's remaining deadline: after it, nobody is working on the key any more). A new
    /// key's claim is committed before this returns, so that work outside the database (a call
    /// to another service) may follow at once.
    pub async fn begin(&self, scope: &str, key: &str, fingerprint: &str, lease: Duration) -> Result<Begin, KeyError> {
        self.claim(scope, key, fingerprint, lease, Claim::Committed).await
    }

    /// As [`KeyStore::begin`], for a request whose first phase follows its claim at once: a new
    /// key's claim is left open, and the first [`KeyStore::phase`] continues its transaction, so
    /// that the claim commits with that phase's effects, one transaction instead of two. Until
    /// then the claim holds a write transaction (on SQLite, the one writer): run nothing else
    /// before the phase. Dropped or released before it, the claim is undone, as if the request
    /// had never come.
    pub async fn begin_with_first_phase(&self, scope: &str, key: &str, fingerprint: &str, lease: Duration) -> Result<Begin, KeyError> {
        self.claim(scope, key, fingerprint, lease, Claim::WithFirstPhase).await
    }

    async fn claim(&self, scope: &str, key: &str, fingerprint: &str, lease: Duration, claim: Claim) -> Result<Begin, KeyError> {
        let token = rand::random::<i64>();
        // A few rounds at most: each one that does not decide follows a change another request
        // made in between (an expired row deleted, a takeover lost to a completion), and the next
        // round sees what that change left.
        for _ in 0..3 {
            let now = self.clock.now_ms();
            let new = NewKey {
                scope,
                key,
                fingerprint,
                token,
                now,
                locked_until: now + lease.as_millis() as i64,
                expires_at: now + self.settings.ttl_ms as i64,
            };
            let claimed = match claim {
                Claim::Committed => (self.database.autocommit(async |writes| new.insert(writes).await).await? == 1).then_some(None),
                // A key already there leaves this transaction with nothing done: it is dropped.
                Claim::WithFirstPhase => {
                    let mut transaction = self.database.begin().await?;
                    (new.insert(&mut transaction).await? == 1).then_some(Some(transaction))
                }
            };
            if let Some(open) = claimed {
                return Ok(Begin::Execute(Lease { open, ..Lease::new(scope, key, token, STARTED.into(), None) }));
            }

            // On the reader: the row is what the last commit left, and the writer stays free.
            let row: Option<KeyRow> = on_driver!(self.database.reader(), |executor| sqlx::query_as(
                "SELECT fingerprint, state, lock_token, locked_until, \
                 response_code, response_body, expires_at \
                 FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2",
            )
            .bind(scope)
            .bind(key)
            .fetch_optional(executor)
            .await?);
            // Deleted since the insert collided with it (the next round inserts afresh), or
            // inserted by a batch that has not committed yet (the next rounds find it in flight).
            let Some(row) = row else { continue };
            #[cfg(feature = "pause-points")]
            self.pause(crate::pause::Pause::BeginRead, key).await;
            // An expired key counts as unused, but only once nothing can still be done under it:
            // the delete checks that in the same statement (see `expired_and_settled`), and a row
            // it keeps is handled as an unexpired one.
            if row.expires_at <= now {
                let statement = format!("DELETE FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2 AND {}", expired_and_settled("$3"));
                let deleted = self
                    .database
                    .autocommit(async |writes| {
                        Ok(on_driver!(writes, |executor| sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                            .bind(scope)
                            .bind(key)
                            .bind(now)
                            .execute(executor)
                            .await?
                            .rows_affected()))
                    })
                    .await?;
                if deleted == 1 {
                    continue;
                }
            }
            if row.fingerprint != fingerprint {
                return Err(KeyError::Mismatch);
            }
            if row.state == COMPLETED {
                let code = row.response_code.unwrap_or_default() as i32;
                return Ok(Begin::Replay(Stored { code, body: row.response_body.unwrap_or_default() }));
            }
            if row.locked_until > now {
                return Err(KeyError::InFlight);
            }
            // The lease ran out (its request was cancelled, crashed or failed): take it over.
            match self.take_over(scope, key, row.lock_token, token, now, new.locked_until).await? {
                Some(lease) => {
                    tracing::info!(scope, recovery_point = %lease.recovery_point, "resuming an idempotency key whose lease ran out");
                    return Ok(Begin::Execute(lease));
                }
                // Another request changed the key since it was read: completed it (the next
                // round replays its answer) or took it over (the next round finds it in flight).
                None => continue,
            }
        }
        Err(KeyError::InFlight)
    }

    /// Takes over the lease of a key whose lease has run out, if it is still the one `seen_token`
    /// names. The update returns the recovery point and resource it won, so the new holder
    /// resumes from what the key says now: the old holder may have committed a phase after the
    /// key was read, and resuming from that read would redo the phase (a second order).
    async fn take_over(&self, scope: &str, key: &str, seen_token: i64, token: i64, now: i64, locked_until: i64) -> Result<Option<Lease>, KeyError> {
        let won: Option<(String, Option<String>)> = self
            .database
            .autocommit(async |writes| {
                Ok(on_driver!(writes, |executor| sqlx::query_as(
                    "UPDATE idempotency_keys SET lock_token = $1, locked_until = $2 \
                     WHERE scope = $3 AND idempotency_key = $4 AND lock_token = $5 AND state = $6 AND locked_until <= $7 \
                     RETURNING recovery_point, resource_id",
                )
                .bind(token)
                .bind(locked_until)
                .bind(scope)
                .bind(key)
                .bind(seen_token)
                .bind(IN_FLIGHT)
                .bind(now)
                .fetch_optional(executor)
                .await?))
            })
            .await?;
        Ok(won.map(|(recovery_point, resource_id)| Lease::new(scope, key, token, recovery_point, resource_id)))
    }

    /// Keys whose work was left half-done: past their first phase, not completed, and released
    /// or with a lease that ran out at least `grace` ago (time for the client's own retry),
    /// first used within `window`. Oldest first, at most `limit`.
    pub async fn stranded(&self, grace: Duration, window: Duration, limit: u32) -> Result<Vec<StrandedKey>, KeyError> {
        let now = self.clock.now_ms();
        // The states are written out, not bound, so that both backends use the partial index
        // `idempotency_keys_unsettled`, whose condition this must repeat.
        let keys = on_driver!(self.database.reader(), |executor| sqlx::query_as(
            "SELECT scope, idempotency_key, lock_token, recovery_point, resource_id, created_at FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND locked_until <= $1 AND created_at > $2 \
             ORDER BY created_at LIMIT $3",
        )
        .bind(now - grace.as_millis() as i64)
        .bind(now - window.as_millis() as i64)
        .bind(i64::from(limit.max(1)))
        .fetch_all(executor)
        .await?);
        Ok(keys)
    }

    /// Keys past their first phase and not completed that were first used longer than `window`
    /// ago: work nobody resumes by itself any more, left for an operator to settle.
    pub async fn count_unsettled_before(&self, window: Duration) -> Result<u64, KeyError> {
        let now = self.clock.now_ms();
        let count: i64 = on_driver!(self.database.reader(), |executor| sqlx::query_scalar(
            "SELECT COUNT(*) FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND created_at <= $1",
        )
        .bind(now - window.as_millis() as i64)
        .fetch_one(executor)
        .await?);
        Ok(count as u64)
    }

    /// Takes over a key [`KeyStore::stranded`] found, leased for `lease`; `None` when another
    /// request or completer got to it first.
    pub async fn resume(&self, stranded: &StrandedKey, lease: Duration) -> Result<Option<Lease>, KeyError> {
        let now = self.clock.now_ms();
        let token = rand::random::<i64>();
        self.take_over(&stranded.scope, &stranded.key, stranded.lock_token, token, now, now + lease.as_millis() as i64).await
    }

    /// Starts an atomic phase: run its effects in [`Phase::transaction`], then commit them with
    /// the key's next recovery point ([`Phase::commit_at`]) or its final answer ([`Phase::complete`]).
    pub async fn phase<'l>(&self, lease: &'l mut Lease) -> Result<Phase<'l>, KeyError> {
        let keep_until = self.clock.now_ms() + self.settings.ttl_ms as i64;
        let transaction = match lease.open.take() {
            Some(claim) => claim,
            None => self.database.begin().await?,
        };
        Ok(Phase { transaction, lease, keep_until })
    }

    /// Gives the key up after a failure a retry may fix: the next repeat resumes at once from the
    /// last recovery point instead of waiting for the lease to run out. The lease ends now, which
    /// tells [`KeyStore::stranded`] how long the key has waited. A claim not committed yet is
    /// undone instead: the key was never there.
    pub async fn release(&self, lease: &mut Lease) -> Result<(), KeyError> {
        if lease.open.take().is_some() {
            return Ok(());
        }
        let now = self.clock.now_ms();
        self.database
            .autocommit(async |writes| {
                on_driver!(writes, |executor| sqlx::query(
                    "UPDATE idempotency_keys SET locked_until = $1 WHERE scope = $2 AND idempotency_key = $3 AND lock_token = $4"
                )
                .bind(now)
                .bind(&lease.scope)
                .bind(&lease.key)
                .bind(lease.token)
                .execute(executor)
                .await
                .map(drop))
            })
            .await?;
        Ok(())
    }

    /// Deletes expired keys that nothing can still be done under (see `expired_and_settled`),
    /// `reap_batch` rows per statement; returns how many.
    pub async fn reap_expired(&self) -> Result<u64, sqlx::Error> {
        let now = self.clock.now_ms();
        let statement = format!(
            "DELETE FROM idempotency_keys WHERE (scope, idempotency_key) IN \
             (SELECT scope, idempotency_key FROM idempotency_keys WHERE {} LIMIT $2)",
            expired_and_settled("$1")
        );
        let mut deleted = 0;
        loop {
            let limit = i64::from(self.settings.reap_batch.max(1));
            let batch = self
                .database
                .autocommit(async |writes| {
                    Ok(on_driver!(writes, |executor| sqlx::query(sqlx::AssertSqlSafe(statement.as_str()))
                        .bind(now)
                        .bind(limit)
                        .execute(executor)
                        .await?
                        .rows_affected()))
                })
                .await?;
            deleted += batch;
            if batch < u64::from(self.settings.reap_batch.max(1)) {
                return Ok(deleted);
            }
        }
    }
}

/// One atomic phase: the caller's effects and the key's progress in one transaction.
pub struct Phase<'l> {
    transaction: Transaction,
    lease: &'l mut Lease,
    /// A key completed now is kept at least until then, so that even work finished late (a
    /// create the completer settled) can be replayed for a full TTL.
    keep_until: i64,
}

impl Phase<'_> {
    /// Where the phase's own statements run.
    pub fn transaction(&mut self) -> &mut Transaction {
        &mut self.transaction
    }

    /// Commits the phase's effects with the key moved to `point` (and `resource_id` remembered).
    pub async fn commit_at(mut self, point: &str, resource_id: Option<&str>) -> Result<(), KeyError> {
        let updated = on_driver!(&mut self.transaction, |executor| sqlx::query(
            "UPDATE idempotency_keys SET recovery_point = $1, resource_id = COALESCE($2, resource_id) \
             WHERE scope = $3 AND idempotency_key = $4 AND lock_token = $5",
        )
        .bind(point)
        .bind(resource_id)
        .bind(&self.lease.scope)
        .bind(&self.lease.key)
        .bind(self.lease.token)
        .execute(executor)
        .await?
        .rows_affected());
        if updated == 0 {
            return Err(KeyError::LeaseLost);
        }
        self.transaction.commit().await?;
        self.lease.recovery_point = point.to_owned();
        if let Some(resource_id) = resource_id {
            self.lease.resource_id = Some(resource_id.to_owned());
        }
        Ok(())
    }

    /// Commits the phase's effects with the key completed: later repeats replay `answer`.
    pub async fn complete(mut self, answer: &Stored) -> Result<(), KeyError> {
        let updated = on_driver!(&mut self.transaction, |executor| sqlx::query(
            "UPDATE idempotency_keys SET state = $1, recovery_point = $2, response_code = $3, response_body = $4, \
             locked_until = 0, expires_at = CASE WHEN expires_at < $8 THEN $8 ELSE expires_at END \
             WHERE scope = $5 AND idempotency_key = $6 AND lock_token = $7",
        )
        .bind(COMPLETED)
        .bind(FINISHED)
        .bind(i64::from(answer.code))
        .bind(answer.body.as_slice())
        .bind(&self.lease.scope)
        .bind(&self.lease.key)
        .bind(self.lease.token)
        .bind(self.keep_until)
        .execute(executor)
        .await?
        .rows_affected());
        if updated == 0 {
            return Err(KeyError::LeaseLost);
        }
        self.transaction.commit().await?;
        self.lease.recovery_point = FINISHED.to_owned();
        Ok(())
    }
}
