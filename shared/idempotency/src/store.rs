use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use sqlx::{Any, AnyConnection, FromRow, Transaction};

use crate::{Clock, Database, SystemClock};

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    scope: String,
    key: String,
    token: i64,
    /// The last phase committed under this key (`"started"` for a new one).
    pub recovery_point: String,
    /// What an earlier phase created, e.g. the order id.
    pub resource_id: Option<String>,
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
}

#[derive(Debug, FromRow)]
struct KeyRow {
    fingerprint: String,
    state: String,
    recovery_point: String,
    resource_id: Option<String>,
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

impl KeyStore {
    pub fn new(database: Database, settings: KeySettings) -> Self {
        Self::with_clock(database, settings, Arc::new(SystemClock))
    }

    pub fn with_clock(database: Database, settings: KeySettings, clock: Arc<dyn Clock>) -> Self {
        Self { database, clock, settings }
    }

    pub fn settings(&self) -> KeySettings {
        self.settings
    }

    pub fn database(&self) -> &Database {
        &self.database
    }

    /// Claims `key` in `scope` for a request with `fingerprint`, leased for `lease` (the
    /// request's remaining deadline: after it, nobody is working on the key any more).
    pub async fn begin(&self, scope: &str, key: &str, fingerprint: &str, lease: Duration) -> Result<Begin, KeyError> {
        let token = rand::random::<i64>();
        // Two rounds at most: the second after deleting an expired row that the reaper has not
        // reached yet, so that an expired key executes afresh.
        for _ in 0..2 {
            let now = self.clock.now_ms();
            let locked_until = now + lease.as_millis() as i64;
            let inserted = sqlx::query(
                "INSERT INTO idempotency_keys \
                 (scope, idempotency_key, fingerprint, state, recovery_point, lock_token, locked_until, created_at, expires_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
                 ON CONFLICT (scope, idempotency_key) DO NOTHING",
            )
            .bind(scope)
            .bind(key)
            .bind(fingerprint)
            .bind(IN_FLIGHT)
            .bind(STARTED)
            .bind(token)
            .bind(locked_until)
            .bind(now)
            .bind(now + self.settings.ttl_ms as i64)
            .execute(self.database.pool())
            .await?
            .rows_affected();
            if inserted == 1 {
                return Ok(Begin::Execute(self.lease(scope, key, token, STARTED.into(), None)));
            }

            let row: KeyRow = sqlx::query_as(
                "SELECT fingerprint, state, recovery_point, resource_id, lock_token, locked_until, \
                 response_code, response_body, expires_at \
                 FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2",
            )
            .bind(scope)
            .bind(key)
            .fetch_one(self.database.pool())
            .await?;
            if row.expires_at <= now {
                sqlx::query("DELETE FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2 AND expires_at <= $3")
                    .bind(scope)
                    .bind(key)
                    .bind(now)
                    .execute(self.database.pool())
                    .await?;
                continue;
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
            // The lease ran out (its request was cancelled, crashed or failed): take it over,
            // unless another repeat got there first.
            let taken = sqlx::query(
                "UPDATE idempotency_keys SET lock_token = $1, locked_until = $2 \
                 WHERE scope = $3 AND idempotency_key = $4 AND lock_token = $5 AND state = $6",
            )
            .bind(token)
            .bind(locked_until)
            .bind(scope)
            .bind(key)
            .bind(row.lock_token)
            .bind(IN_FLIGHT)
            .execute(self.database.pool())
            .await?
            .rows_affected();
            if taken == 0 {
                return Err(KeyError::InFlight);
            }
            tracing::info!(scope, recovery_point = %row.recovery_point, "resuming an idempotency key whose lease ran out");
            return Ok(Begin::Execute(self.lease(scope, key, token, row.recovery_point, row.resource_id)));
        }
        Err(KeyError::InFlight)
    }

    fn lease(&self, scope: &str, key: &str, token: i64, recovery_point: String, resource_id: Option<String>) -> Lease {
        Lease { scope: scope.to_owned(), key: key.to_owned(), token, recovery_point, resource_id }
    }

    /// Starts an atomic phase: run its effects on [`Phase::connection`], then commit them with
    /// the key's next recovery point ([`Phase::commit_at`]) or its final answer ([`Phase::complete`]).
    pub async fn phase<'l>(&self, lease: &'l mut Lease) -> Result<Phase<'l>, KeyError> {
        Ok(Phase { transaction: self.database.pool().begin().await?, lease })
    }

    /// Gives the key up after a failure a retry may fix: the next repeat resumes at once from the
    /// last recovery point instead of waiting for the lease to run out.
    pub async fn release(&self, lease: &Lease) -> Result<(), KeyError> {
        sqlx::query("UPDATE idempotency_keys SET locked_until = 0 WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3")
            .bind(&lease.scope)
            .bind(&lease.key)
            .bind(lease.token)
            .execute(self.database.pool())
            .await?;
        Ok(())
    }

    /// Deletes expired keys, `reap_batch` rows per statement; returns how many.
    pub async fn reap_expired(&self) -> Result<u64, sqlx::Error> {
        let now = self.clock.now_ms();
        let mut deleted = 0;
        loop {
            let batch = sqlx::query(
                "DELETE FROM idempotency_keys WHERE (scope, idempotency_key) IN \
                 (SELECT scope, idempotency_key FROM idempotency_keys WHERE expires_at <= $1 LIMIT $2)",
            )
            .bind(now)
            .bind(i64::from(self.settings.reap_batch.max(1)))
            .execute(self.database.pool())
            .await?
            .rows_affected();
            deleted += batch;
            if batch < u64::from(self.settings.reap_batch.max(1)) {
                return Ok(deleted);
            }
        }
    }
}

/// One atomic phase: the caller's effects and the key's progress in one transaction.
pub struct Phase<'l> {
    transaction: Transaction<'static, Any>,
    lease: &'l mut Lease,
}

impl Phase<'_> {
    /// Where the phase's own statements run.
    pub fn connection(&mut self) -> &mut AnyConnection {
        &mut self.transaction
    }

    /// Commits the phase's effects with the key moved to `point` (and `resource_id` remembered).
    pub async fn commit_at(mut self, point: &str, resource_id: Option<&str>) -> Result<(), KeyError> {
        let updated = sqlx::query(
            "UPDATE idempotency_keys SET recovery_point = $1, resource_id = COALESCE($2, resource_id) \
             WHERE scope = $3 AND idempotency_key = $4 AND lock_token = $5",
        )
        .bind(point)
        .bind(resource_id)
        .bind(&self.lease.scope)
        .bind(&self.lease.key)
        .bind(self.lease.token)
        .execute(&mut *self.transaction)
        .await?
        .rows_affected();
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
        let updated = sqlx::query(
            "UPDATE idempotency_keys SET state = $1, recovery_point = $2, response_code = $3, response_body = $4, \
             locked_until = 0 WHERE scope = $5 AND idempotency_key = $6 AND lock_token = $7",
        )
        .bind(COMPLETED)
        .bind(FINISHED)
        .bind(i64::from(answer.code))
        .bind(answer.body.clone())
        .bind(&self.lease.scope)
        .bind(&self.lease.key)
        .bind(self.lease.token)
        .execute(&mut *self.transaction)
        .await?
        .rows_affected();
        if updated == 0 {
            return Err(KeyError::LeaseLost);
        }
        self.transaction.commit().await?;
        self.lease.recovery_point = FINISHED.to_owned();
        Ok(())
    }
}
