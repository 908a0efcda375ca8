use std::{sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};
use storage::{Backend, Database, FromRow, Row, Statement, Tx};

use crate::{Clock, SystemClock};

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
            return Err(TtlTooShort {
                ttl_ms: self.ttl_ms,
                needed_ms,
                why: why.into(),
            });
        }
        Ok(())
    }
}

impl Default for KeySettings {
    fn default() -> Self {
        Self {
            ttl_ms: 24 * 3_600_000,
            reap_interval_ms: 60_000,
            reap_batch: 500,
        }
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
}

impl Lease {
    /// Where the lease stands once a phase that left its key at `progress` has committed.
    fn advance(&mut self, progress: Progress) {
        match progress {
            Progress::At { point, resource_id } => {
                self.recovery_point = point.to_owned();
                if resource_id.is_some() {
                    self.resource_id = resource_id;
                }
            }
            Progress::Completed(_) => self.recovery_point = FINISHED.to_owned(),
        }
    }

    fn new(
        scope: &str,
        key: &str,
        token: i64,
        recovery_point: String,
        resource_id: Option<String>,
    ) -> Self {
        Self {
            scope: scope.to_owned(),
            key: key.to_owned(),
            token,
            recovery_point,
            resource_id,
        }
    }
}

/// A key whose work was left half-done and nobody holds: see [`KeyStore::stranded`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StrandedKey {
    pub scope: String,
    pub key: String,
    /// The holder it was left by, so that resuming it takes over only what was found.
    lock_token: i64,
    pub recovery_point: String,
    pub resource_id: Option<String>,
    /// When the key was first used, ms since the epoch.
    pub created_at_ms: i64,
    /// How many times a completer took it over before ([`KeyStore::resume`]).
    pub resume_attempts: u32,
}

impl FromRow for StrandedKey {
    fn from_row(row: &Row) -> Result<Self, storage::Error> {
        let resume_attempts: i64 = row.get("resume_attempts")?;
        Ok(Self {
            scope: row.get("scope")?,
            key: row.get("idempotency_key")?,
            lock_token: row.get("lock_token")?,
            recovery_point: row.get("recovery_point")?,
            resource_id: row.get("resource_id")?,
            created_at_ms: row.get("created_at")?,
            resume_attempts: u32::try_from(resume_attempts).map_err(|_| {
                storage::Error::Corrupt(format!("resume_attempts {resume_attempts}"))
            })?,
        })
    }
}

/// Which half-done keys a completer resumes, and when it gives one up: see
/// [`KeyStore::stranded`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResumePolicy {
    /// How long a key is left to its client's own retry once its lease ended; doubled for each
    /// resume of it that failed, so that a key failing for its own reasons is tried less and
    /// less often, and one caught in an outage is not given up within minutes.
    pub grace: Duration,
    /// Only keys first used within this long ago are resumed.
    pub window: Duration,
    /// After this many resumes a key is parked: no longer resumed, left to an operator (see
    /// [`KeyStore::parked`]). At most 64: the wait is halved per resume by a 64-bit shift.
    pub max_attempts: u32,
}

/// What [`KeyStore::begin`] found.
#[derive(Debug)]
pub enum Begin {
    /// Work on the key, from the lease's recovery point.
    Execute(Lease),
    /// The key completed earlier: answer with this.
    Replay(Stored),
}

/// What [`KeyStore::begin_with_first_phase`] found.
#[derive(Debug)]
pub enum BeginWith {
    /// A new key, claimed with its first phase in one transaction: go on from the lease's
    /// recovery point.
    Executed(Lease),
    /// A key already there, as [`KeyStore::begin`] answers for it; its first phase did not
    /// commit (a lease taken over at `started` runs one with [`KeyStore::atomic_phase`]).
    Found(Begin),
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
    Storage(#[from] storage::Error),
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

storage::row! {
    #[derive(Debug)]
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
}

impl KeyRow {
    /// [`expired_and_settled`] judged on a row read at `now`: whether it counts as unused.
    fn expired_and_settled(&self, now: i64) -> bool {
        self.expires_at <= now
            && (self.state == COMPLETED
                || (self.recovery_point == STARTED && self.locked_until <= now))
    }

    /// What the row says about its key to a request with `fingerprint` at `now`, in the order
    /// [`KeyStore::begin`] decides (see [`Lookup`]).
    fn judge(self, fingerprint: &str, now: i64) -> Result<Lookup, KeyError> {
        if self.expired_and_settled(now) {
            return Ok(Lookup::Unused);
        }
        if self.fingerprint != fingerprint {
            return Err(KeyError::Mismatch);
        }
        if self.state == COMPLETED {
            return Ok(Lookup::Completed(Stored {
                code: self.response_code.unwrap_or_default() as i32,
                body: self.response_body.unwrap_or_default(),
            }));
        }
        if self.locked_until > now {
            return Ok(Lookup::InFlight);
        }
        Ok(Lookup::Unsettled {
            recovery_point: self.recovery_point,
            resource_id: self.resource_id,
        })
    }
}

/// What [`KeyStore::lookup`] found under a key, without claiming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// No row, or one expired with nothing left to do: a request would execute afresh.
    Unused,
    /// Completed: a request would replay this answer.
    Completed(Stored),
    /// Another request holds it: a request would get [`KeyError::InFlight`].
    InFlight,
    /// Not completed, and nobody holds it (its lease ran out or was released): a request would
    /// take it over and resume after `recovery_point`, with what the phases created
    /// (`resource_id`, e.g. the order id).
    Unsettled {
        recovery_point: String,
        resource_id: Option<String>,
    },
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
/// the statement's parameter that holds the current time (e.g. `$3`). The same rule judges a
/// row read, in [`KeyRow::expired_and_settled`]: the two must agree.
fn expired_and_settled(now: &str) -> String {
    format!(
        "expires_at <= {now} AND (state = '{COMPLETED}' OR (recovery_point = '{STARTED}' AND locked_until <= {now}))"
    )
}

/// The row of a key claimed now.
struct NewKey {
    scope: String,
    key: String,
    fingerprint: String,
    token: i64,
    now: i64,
    locked_until: i64,
    expires_at: i64,
}

/// Inserts a key unless it exists; 1 row when it was inserted. Its parameters are
/// [`NewKey::inserted_at`]'s.
const INSERT_KEY: &str = "INSERT INTO idempotency_keys \
     (scope, idempotency_key, fingerprint, state, recovery_point, resource_id, lock_token, locked_until, \
      response_code, response_body, created_at, expires_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
     ON CONFLICT (scope, idempotency_key) DO NOTHING";

/// The columns of a new key that depend on where it is inserted.
struct Inserted<'p> {
    state: &'static str,
    point: &'p str,
    resource_id: Option<&'p str>,
    locked_until: i64,
    code: Option<i64>,
    body: Option<&'p [u8]>,
}

impl NewKey {
    /// The key at `started` (`progress` `None`), or already where a first phase committed with
    /// it left it: one statement where a claim and then a move would be two.
    fn inserted_at<'p>(&self, progress: Option<&'p Progress>) -> Inserted<'p> {
        match progress {
            None => Inserted {
                state: IN_FLIGHT,
                point: STARTED,
                resource_id: None,
                locked_until: self.locked_until,
                code: None,
                body: None,
            },
            Some(Progress::At { point, resource_id }) => Inserted {
                state: IN_FLIGHT,
                point,
                resource_id: resource_id.as_deref(),
                locked_until: self.locked_until,
                code: None,
                body: None,
            },
            Some(Progress::Completed(answer)) => Inserted {
                state: COMPLETED,
                point: FINISHED,
                resource_id: None,
                locked_until: 0,
                code: Some(i64::from(answer.code)),
                body: Some(&answer.body),
            },
        }
    }

    /// The statement that inserts this key unless it exists, where a first phase that committed
    /// with it left it (`progress`), or at `started`.
    fn insert(&self, progress: Option<&Progress>) -> Statement {
        Statement::new(INSERT_KEY, &self.params(&self.inserted_at(progress)))
    }

    /// [`INSERT_KEY`]'s parameters for this key, inserted as `at` says.
    fn params<'a>(&'a self, at: &'a Inserted<'a>) -> [&'a dyn storage::Param; 12] {
        [
            &self.scope,
            &self.key,
            &self.fingerprint,
            &at.state,
            &at.point,
            &at.resource_id,
            &self.token,
            &at.locked_until,
            &at.code,
            &at.body,
            &self.now,
            &self.expires_at,
        ]
    }
}

/// Reads a key's row, on the reader: what `begin` and its siblings decide from.
const READ_KEY: &str = "SELECT fingerprint, state, recovery_point, resource_id, lock_token, locked_until, response_code, response_body, expires_at \
                        FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2";

/// Where a claim's first round starts.
enum FirstRound {
    /// Insert the key, then read it if it was there.
    Insert,
    /// Read the key: the caller's own insert has just found it there.
    Read,
    /// Decide on this row, just read.
    Decide(KeyRow),
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
    pub async fn begin(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        lease: Duration,
    ) -> Result<Begin, KeyError> {
        self.claim(
            scope,
            key,
            fingerprint,
            lease,
            rand::random(),
            FirstRound::Insert,
        )
        .await
    }

    /// As [`KeyStore::begin`], for a request whose first phase needs nothing from outside the
    /// database: a new key's claim and the phase's effects commit together, the key already
    /// where the phase leaves it, as one statement on PostgreSQL (see [`Effects`]). `first_phase`
    /// makes the effects and that [`Progress`], only once the key is known to be new and just
    /// before they are written, so that what they record (a time) is of the claim. A failing
    /// effect takes the claim back with it, as if the request had never come.
    ///
    /// The key is read first, on the reader: a repeat finds it there and is decided as
    /// [`KeyStore::begin`] would, with nothing written and no effect run. A key claimed by
    /// another request between that read and the claim makes the claim insert nothing, and its
    /// effects do nothing: the key is then decided as it now stands.
    pub async fn begin_with_first_phase(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        lease: Duration,
        first_phase: impl FnOnce() -> (Effects, Progress),
    ) -> Result<BeginWith, KeyError> {
        let token = rand::random::<i64>();
        if let Some(row) = self.read(scope, key).await? {
            return Ok(BeginWith::Found(
                self.claim(
                    scope,
                    key,
                    fingerprint,
                    lease,
                    token,
                    FirstRound::Decide(row),
                )
                .await?,
            ));
        }
        #[cfg(feature = "pause-points")]
        self.pause(crate::pause::Pause::NewKeyRead, key).await;
        let new = self.new_key(scope, key, fingerprint, lease, token);
        let (effects, progress) = first_phase();
        if !self
            .with_effects(new.insert(Some(&progress)), effects)
            .await?
        {
            return Ok(BeginWith::Found(
                self.claim(scope, key, fingerprint, lease, token, FirstRound::Read)
                    .await?,
            ));
        }
        let mut lease = Lease::new(scope, key, token, STARTED.into(), None);
        lease.advance(progress);
        Ok(BeginWith::Executed(lease))
    }

    /// Runs `key`, a statement on one key's row, and then `effects` if it changed the row, all
    /// or nothing; whether it changed the row. On PostgreSQL one statement: `key` as the
    /// data-modifying `WITH` table `moved` (`RETURNING 1`, one row when it changed the key), each
    /// effect as a table after it, and the count of `moved`. On SQLite one unit of work of the
    /// writer, where each effect finds `moved` as one row: the key's statement has already
    /// changed the row when they run.
    async fn with_effects(&self, key: Statement, effects: Effects) -> Result<bool, KeyError> {
        if self.database.backend() == Backend::Postgres {
            let mut phase = Statement::new("WITH moved AS (", &[]);
            phase.append(&key);
            phase.push_sql(" RETURNING 1)");
            for (index, effect) in effects.0.iter().enumerate() {
                phase.push_sql(&format!(", effect_{index} AS ("));
                phase.append(effect);
                phase.push_sql(")");
            }
            phase.push_sql(" SELECT COUNT(*) FROM moved");
            let moved: Option<i64> = self
                .database
                .execute_returning(phase.sql(), &phase.params())
                .await?;
            return Ok(moved == Some(1));
        }
        let moved = self
            .database
            .write(async move |tx| {
                if tx.execute(key.sql(), &key.params()).await? == 0 {
                    return Ok::<_, KeyError>(false);
                }
                for effect in &effects.0 {
                    tx.execute(
                        &format!("WITH moved AS (SELECT 1) {}", effect.sql()),
                        &effect.params(),
                    )
                    .await?;
                }
                Ok(true)
            })
            .await?;
        Ok(moved)
    }

    /// What `key` holds for a request with `fingerprint`, read on the reader without claiming
    /// or writing anything: for a request that will not execute now (its dependency refuses it)
    /// but must answer as its key says, a completed key's repeat with the stored answer, a
    /// half-done one with what it created. Decided as [`KeyStore::begin`] decides: an expired
    /// key with nothing left to do is [`Lookup::Unused`], its answer never replayed; a key used
    /// for another request is [`KeyError::Mismatch`].
    pub async fn lookup(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
    ) -> Result<Lookup, KeyError> {
        let now = self.clock.now_ms();
        match self.read(scope, key).await? {
            Some(row) => row.judge(fingerprint, now),
            None => Ok(Lookup::Unused),
        }
    }

    /// The key's row as the last commit left it, read on the reader so that the writer stays free.
    async fn read(&self, scope: &str, key: &str) -> Result<Option<KeyRow>, KeyError> {
        Ok(self
            .database
            .fetch_optional(READ_KEY, &[&scope, &key])
            .await?)
    }

    /// A new key's row, leased from now for `lease`.
    fn new_key(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        lease: Duration,
        token: i64,
    ) -> NewKey {
        let now = self.clock.now_ms();
        NewKey {
            scope: scope.to_owned(),
            key: key.to_owned(),
            fingerprint: fingerprint.to_owned(),
            token,
            now,
            locked_until: now + lease.as_millis() as i64,
            expires_at: now + self.settings.ttl_ms as i64,
        }
    }

    /// Claims the key for the holder `token`, its first round starting from `first`.
    async fn claim(
        &self,
        scope: &str,
        key: &str,
        fingerprint: &str,
        lease: Duration,
        token: i64,
        first: FirstRound,
    ) -> Result<Begin, KeyError> {
        // A few rounds at most: each one that does not decide follows a change another request
        // made in between (an expired row deleted, a takeover lost to a completion), and the next
        // round sees what that change left.
        let mut round = first;
        for _ in 0..3 {
            let new = self.new_key(scope, key, fingerprint, lease, token);
            let now = new.now;
            let row = match std::mem::replace(&mut round, FirstRound::Insert) {
                FirstRound::Insert => {
                    let inserted = self
                        .database
                        .execute(INSERT_KEY, &new.params(&new.inserted_at(None)))
                        .await?;
                    if inserted == 1 {
                        return Ok(Begin::Execute(Lease::new(
                            scope,
                            key,
                            token,
                            STARTED.into(),
                            None,
                        )));
                    }
                    self.read(scope, key).await?
                }
                FirstRound::Read => self.read(scope, key).await?,
                FirstRound::Decide(row) => Some(row),
            };
            // Deleted since the insert collided with it (the next round inserts afresh), or
            // inserted by a batch that has not committed yet (the next rounds find it in flight).
            let Some(row) = row else { continue };
            #[cfg(feature = "pause-points")]
            self.pause(crate::pause::Pause::BeginRead, key).await;
            let seen_token = row.lock_token;
            match row.judge(fingerprint, now)? {
                // An expired key with nothing left to do counts as unused: it is deleted (the
                // delete checks the rule again on the row as it is now, see
                // `expired_and_settled`) and the next round inserts afresh. If the delete finds
                // nothing, the row changed since it was read (a concurrent repeat deleted it and
                // may have executed afresh, or its holder moved on): the next round reads it
                // again, since deciding from the stale row could replay the expired answer.
                Lookup::Unused => {
                    self.delete_if_expired_and_settled(scope, key, now).await?;
                    continue;
                }
                Lookup::Completed(stored) => return Ok(Begin::Replay(stored)),
                Lookup::InFlight => return Err(KeyError::InFlight),
                // The lease ran out (its request was cancelled, crashed or failed): take it over.
                Lookup::Unsettled { .. } => match self
                    .take_over(scope, key, seen_token, token, lease, 0)
                    .await?
                {
                    Some(lease) => {
                        tracing::info!(scope, recovery_point = %lease.recovery_point, "resuming an idempotency key whose lease ran out");
                        return Ok(Begin::Execute(lease));
                    }
                    // Another request changed the key since it was read: completed it (the next
                    // round replays its answer) or took it over (the next round finds it in flight).
                    None => continue,
                },
            }
        }
        Err(KeyError::InFlight)
    }

    /// Deletes the key if the expiry rule holds for it now; whether it did, the caller reads it
    /// again.
    async fn delete_if_expired_and_settled(
        &self,
        scope: &str,
        key: &str,
        now: i64,
    ) -> Result<(), KeyError> {
        let statement = format!(
            "DELETE FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2 AND {}",
            expired_and_settled("$3")
        );
        self.database
            .execute(&statement, &[&scope, &key, &now])
            .await?;
        Ok(())
    }

    /// Takes over, leased for `lease`, a key whose lease has run out, if the holder `seen` still
    /// holds it. The update returns the recovery point and resource it won, so the new holder
    /// resumes from what the key says now: the old holder may have committed a phase after the
    /// key was read, and resuming from that read would redo the phase (a second order).
    /// `resumes` (0 or 1) is added to the key's count of a completer's resumes.
    async fn take_over(
        &self,
        scope: &str,
        key: &str,
        seen: i64,
        token: i64,
        lease: Duration,
        resumes: i64,
    ) -> Result<Option<Lease>, KeyError> {
        let now = self.clock.now_ms();
        let locked_until = now + lease.as_millis() as i64;
        let won: Option<(String, Option<String>)> = self
            .database
            .execute_returning(
                "UPDATE idempotency_keys SET lock_token = $1, locked_until = $2, resume_attempts = resume_attempts + $3 \
                 WHERE scope = $4 AND idempotency_key = $5 AND lock_token = $6 AND state = $7 AND locked_until <= $8 \
                 RETURNING recovery_point, resource_id",
                &[&token, &locked_until, &resumes, &scope, &key, &seen, &IN_FLIGHT, &now],
            )
            .await?;
        Ok(won.map(|(recovery_point, resource_id)| {
            Lease::new(scope, key, token, recovery_point, resource_id)
        }))
    }

    /// Keys whose work was left half-done, for a completer to resume: past their first phase,
    /// not completed, first used within `policy.window`, resumed fewer than
    /// `policy.max_attempts` times, and released or with a lease that ran out at least
    /// `policy.grace` ago, doubled for each earlier resume. At most `limit`, those resumed the
    /// fewest times first (a key never tried goes before any that failed), then those waiting
    /// the longest: keys that keep failing take turns behind the others, rather than the oldest
    /// being taken every round.
    pub async fn stranded(
        &self,
        policy: &ResumePolicy,
        limit: u32,
    ) -> Result<Vec<StrandedKey>, KeyError> {
        let now = self.clock.now_ms();
        // The states are written out, not bound, so that both backends use the partial index
        // `idempotency_keys_unsettled`, whose condition this must repeat. The wait is halved
        // per resume rather than the grace doubled: no overflow, whatever the settings.
        let keys = self
            .database
            .fetch_all(
                "SELECT scope, idempotency_key, lock_token, recovery_point, resource_id, created_at, resume_attempts FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND created_at > $1 AND resume_attempts < $2 \
             AND locked_until <= $3 AND (($3 - locked_until) >> CAST(resume_attempts AS INTEGER)) >= $4 \
             ORDER BY resume_attempts, locked_until LIMIT $5",
                &[
                    &(now - policy.window.as_millis() as i64),
                    &i64::from(policy.max_attempts),
                    &now,
                    &(policy.grace.as_millis() as i64),
                    &i64::from(limit.max(1)),
                ],
            )
            .await?;
        Ok(keys)
    }

    /// Keys [`KeyStore::stranded`] no longer gives a completer: half-done, first used within
    /// `policy.window`, resumed `policy.max_attempts` times. Oldest first, at most `limit`, for
    /// an operator to settle, or to re-arm by setting their `resume_attempts` back to 0.
    pub async fn parked(
        &self,
        policy: &ResumePolicy,
        limit: u32,
    ) -> Result<Vec<StrandedKey>, KeyError> {
        let now = self.clock.now_ms();
        let keys = self
            .database
            .fetch_all(
                "SELECT scope, idempotency_key, lock_token, recovery_point, resource_id, created_at, resume_attempts FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND created_at > $1 AND resume_attempts >= $2 \
             ORDER BY created_at LIMIT $3",
                &[&(now - policy.window.as_millis() as i64), &i64::from(policy.max_attempts), &i64::from(limit.max(1))],
            )
            .await?;
        Ok(keys)
    }

    /// How many keys [`KeyStore::parked`] would list without a limit.
    pub async fn count_parked(&self, policy: &ResumePolicy) -> Result<u64, KeyError> {
        let now = self.clock.now_ms();
        let count: i64 = self
            .database
            .fetch_one(
                "SELECT COUNT(*) FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND created_at > $1 AND resume_attempts >= $2",
                &[&(now - policy.window.as_millis() as i64), &i64::from(policy.max_attempts)],
            )
            .await?;
        Ok(count as u64)
    }

    /// Keys past their first phase and not completed that were first used longer than `window`
    /// ago: work nobody resumes by itself any more, left for an operator to settle.
    pub async fn count_unsettled_before(&self, window: Duration) -> Result<u64, KeyError> {
        let now = self.clock.now_ms();
        let count: i64 = self
            .database
            .fetch_one(
                "SELECT COUNT(*) FROM idempotency_keys \
             WHERE state = 'in_flight' AND recovery_point <> 'started' AND created_at <= $1",
                &[&(now - window.as_millis() as i64)],
            )
            .await?;
        Ok(count as u64)
    }

    /// Takes over a key [`KeyStore::stranded`] found, leased for `lease`, and counts the
    /// attempt against it (it has then been resumed `stranded.resume_attempts + 1` times);
    /// `None` when another request or completer got to it first.
    pub async fn resume(
        &self,
        stranded: &StrandedKey,
        lease: Duration,
    ) -> Result<Option<Lease>, KeyError> {
        self.take_over(
            &stranded.scope,
            &stranded.key,
            stranded.lock_token,
            rand::random(),
            lease,
            1,
        )
        .await
    }

    /// Runs one atomic phase: `effects`, then the key moved to the [`Progress`] they return, in one
    /// transaction; their result once it has committed. A failure of `effects` rolls them back
    /// and is returned as it is; a lease lost in the meantime rolls them back with
    /// [`KeyError::LeaseLost`].
    ///
    /// Why `effects` own what they use: on SQLite the phase runs on the database's one writer, as
    /// one member of its batch (see [`Database::write`]), so that a request waits for the
    /// writer once per phase rather than once per statement.
    pub async fn atomic_phase<T, E, F>(&self, lease: &mut Lease, effects: F) -> Result<T, E>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<(T, Progress), E> + Send + 'static,
        T: Send + 'static,
        E: From<KeyError> + Send + 'static,
    {
        let holder = Holder {
            scope: lease.scope.clone(),
            key: lease.key.clone(),
            token: lease.token,
        };
        let keep_until = self.clock.now_ms() + self.settings.ttl_ms as i64;
        #[cfg(feature = "pause-points")]
        let pause = self.pause.clone();
        let (done, progress) = self
            .database
            .write(async move |tx| {
                let moved = holder.run(tx, effects, keep_until).await?;
                #[cfg(feature = "pause-points")]
                if let Some(hook) = pause {
                    hook.reached(crate::pause::Pause::PhaseMoved, &holder.key)
                        .await;
                }
                Ok(moved)
            })
            .await
            .map_err(PhaseFailed::into_error)?;
        lease.advance(progress);
        Ok(done)
    }

    /// As [`KeyStore::atomic_phase`], for a phase whose effects are statements that need no answer
    /// from the database (see [`Effects`]): on PostgreSQL the key's move and the effects are one
    /// statement, one round trip with no `BEGIN` or `COMMIT`.
    pub async fn atomic_statements(
        &self,
        lease: &mut Lease,
        effects: Effects,
        progress: Progress,
    ) -> Result<(), KeyError> {
        let holder = Holder {
            scope: lease.scope.clone(),
            key: lease.key.clone(),
            token: lease.token,
        };
        let keep_until = self.clock.now_ms() + self.settings.ttl_ms as i64;
        if !self
            .with_effects(holder.moved(&progress, keep_until), effects)
            .await?
        {
            return Err(KeyError::LeaseLost);
        }
        lease.advance(progress);
        Ok(())
    }

    /// Takes back a request that stopped before anything outside the database happened under
    /// its key (refused before anything could be charged): `effects` undo what its phases wrote
    /// (e.g. delete the order), and the key's row goes with them, in one transaction, only while
    /// `lease` still holds the key and it is not completed (else nothing commits:
    /// [`KeyError::LeaseLost`]). The key is then unused, as if the request had never come: no
    /// completer resumes it, and a repeat executes afresh. A failure of `effects` rolls back
    /// and is returned as it is.
    pub async fn withdraw<E, F>(&self, lease: Lease, effects: F) -> Result<(), E>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<(), E> + Send + 'static,
        E: From<KeyError> + Send + 'static,
    {
        let holder = Holder {
            scope: lease.scope,
            key: lease.key,
            token: lease.token,
        };
        self.database
            .write(async move |tx| {
                // The key first: its row lock keeps a takeover out while the effects run.
                if holder.delete(tx).await? == 0 {
                    return Err(PhaseFailed::Key(KeyError::LeaseLost));
                }
                effects(tx).await.map_err(PhaseFailed::Effects)
            })
            .await
            .map_err(PhaseFailed::into_error)
    }

    /// Gives the key up after a failure a retry may fix: the next repeat resumes at once from the
    /// last recovery point instead of waiting for the lease to run out. The lease ends now, which
    /// tells [`KeyStore::stranded`] how long the key has waited.
    pub async fn release(&self, lease: &mut Lease) -> Result<(), KeyError> {
        let now = self.clock.now_ms();
        self.database
            .execute(
                "UPDATE idempotency_keys SET locked_until = $1 WHERE scope = $2 AND idempotency_key = $3 AND lock_token = $4",
                &[&now, &lease.scope, &lease.key, &lease.token],
            )
            .await?;
        Ok(())
    }

    /// Deletes expired keys that nothing can still be done under (see `expired_and_settled`),
    /// `reap_batch` rows per statement; returns how many.
    pub async fn reap_expired(&self) -> Result<u64, storage::Error> {
        let now = self.clock.now_ms();
        // The rule stands twice. The sub-select picks the rows from the statement's snapshot;
        // under READ COMMITTED, a row a phase changed while the DELETE waited for its lock is
        // then checked again against the DELETE's own WHERE only, and without the rule there a
        // key moved past `started` or leased again meanwhile would be deleted (a repeat would
        // then execute afresh beside its work). Rather than `FOR UPDATE SKIP LOCKED` in the
        // sub-select, which SQLite does not know: one statement for both backends, at the price
        // of waiting for a phase's commit, which is short.
        let rule = expired_and_settled("$1");
        let statement = format!(
            "DELETE FROM idempotency_keys WHERE (scope, idempotency_key) IN \
             (SELECT scope, idempotency_key FROM idempotency_keys WHERE {rule} LIMIT $2) AND {rule}"
        );
        let mut deleted = 0;
        loop {
            let limit = i64::from(self.settings.reap_batch.max(1));
            let batch = self.database.execute(&statement, &[&now, &limit]).await?;
            deleted += batch;
            if batch < u64::from(self.settings.reap_batch.max(1)) {
                return Ok(deleted);
            }
        }
    }
}

/// Where an atomic phase leaves its key: see [`KeyStore::atomic_phase`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// At a recovery point, with what the phase created (e.g. the order id), if anything.
    At {
        point: &'static str,
        resource_id: Option<String>,
    },
    /// Completed: later repeats replay this answer.
    Completed(Stored),
}

/// A phase's effects written as statements, for a phase that needs no answer from the database
/// ([`KeyStore::begin_with_first_phase`], [`KeyStore::atomic_statements`]). Each must act only
/// when the phase's key moved: it reads the table `moved`, which has one row when the key moved
/// and none when the lease was lost (`INSERT … SELECT … FROM moved`, `UPDATE … WHERE … AND
/// EXISTS (SELECT 1 FROM moved)`). On PostgreSQL they all run in one statement with the key's
/// move, so each sees the database as it was before it: none sees another's rows.
#[derive(Debug, Default)]
pub struct Effects(Vec<Statement>);

impl Effects {
    /// The condition that makes a statement act only when the key moved, for statements made
    /// elsewhere that take a condition to add to their own.
    pub const WHEN_MOVED: &'static str = "EXISTS (SELECT 1 FROM moved)";

    /// These effects, then `statement`.
    pub fn then(mut self, statement: Statement) -> Self {
        self.0.push(statement);
        self
    }
}

/// Why an atomic phase rolled back: its own effects failed, or the key's part did.
enum PhaseFailed<E> {
    Effects(E),
    Key(KeyError),
}

impl<E: From<KeyError>> PhaseFailed<E> {
    fn into_error(self) -> E {
        match self {
            PhaseFailed::Effects(error) => error,
            PhaseFailed::Key(error) => E::from(error),
        }
    }
}

impl<E> From<storage::Error> for PhaseFailed<E> {
    fn from(error: storage::Error) -> Self {
        PhaseFailed::Key(KeyError::Storage(error))
    }
}

/// A lease's holder, owned, as the statements that move its key need it.
struct Holder {
    scope: String,
    key: String,
    token: i64,
}

impl Holder {
    /// Runs an atomic phase's `effects`, then moves the key to where they say, in `transaction`.
    async fn run<T, E, F>(
        &self,
        tx: &mut Tx<'_>,
        effects: F,
        keep_until: i64,
    ) -> Result<(T, Progress), PhaseFailed<E>>
    where
        F: AsyncFnOnce(&mut Tx<'_>) -> Result<(T, Progress), E>,
    {
        let (done, progress) = effects(tx).await.map_err(PhaseFailed::Effects)?;
        let moved = self.moved(&progress, keep_until);
        if tx.execute(moved.sql(), &moved.params()).await? == 0 {
            return Err(PhaseFailed::Key(KeyError::LeaseLost));
        }
        Ok((done, progress))
    }

    /// The statement that moves the key to where `progress` says: to a recovery point (and
    /// remembers the resource), or completed with its answer, kept at least until `keep_until`.
    /// It changes no row when the lease was lost.
    fn moved(&self, progress: &Progress, keep_until: i64) -> Statement {
        match progress {
            Progress::At { point, resource_id } => Statement::new(
                "UPDATE idempotency_keys SET recovery_point = $1, resource_id = COALESCE($2, resource_id) \
                 WHERE scope = $3 AND idempotency_key = $4 AND lock_token = $5",
                &[point, resource_id, &self.scope, &self.key, &self.token],
            ),
            Progress::Completed(answer) => Statement::new(
                "UPDATE idempotency_keys SET state = $1, recovery_point = $2, response_code = $3, response_body = $4, \
                 locked_until = 0, expires_at = CASE WHEN expires_at < $8 THEN $8 ELSE expires_at END \
                 WHERE scope = $5 AND idempotency_key = $6 AND lock_token = $7",
                &[
                    &COMPLETED,
                    &FINISHED,
                    &i64::from(answer.code),
                    &answer.body,
                    &self.scope,
                    &self.key,
                    &self.token,
                    &keep_until,
                ],
            ),
        }
    }

    /// Deletes the key unless it completed; 0 rows when the lease was lost.
    async fn delete(&self, tx: &mut Tx<'_>) -> Result<u64, storage::Error> {
        tx.execute(
            "DELETE FROM idempotency_keys WHERE scope = $1 AND idempotency_key = $2 AND lock_token = $3 AND state = $4",
            &[&self.scope, &self.key, &self.token, &IN_FLIGHT],
        )
        .await
    }
}
