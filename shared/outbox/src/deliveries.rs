use storage::{Backend, Database, Tx};
use webhooks::signature::Secret;

use crate::{
    ENDPOINT_ATTEMPTS_EXHAUSTED, ENDPOINT_DISABLED, NewEvent, OutboxError,
    event::{Recipients, record_for},
    new_id, record,
    sealed::SecretKeys,
};

storage::row! {
    /// An endpoint with deliveries due, as the sender needs it.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct DueEndpoint {
        pub endpoint_id: String,
        /// The endpoint's owner, whose share of the sender it draws on.
        pub client_id: String,
        pub max_in_flight: i64,
        pub rate_per_sec: i64,
    }
}

/// A delivery claimed by one sender until `claimed_until_ms` (on the database's clock).
#[derive(Debug, Clone)]
pub struct Claim {
    pub endpoint_id: String,
    pub event_id: String,
    /// Where the endpoint receives its deliveries, as stored at the claim: an update of the URL
    /// applies to the next claim.
    pub url: String,
    /// The attempt's number, counted over every claim of this delivery.
    pub attempt: i64,
    /// Failures so far in this round of the retry schedule.
    pub schedule_step: i64,
    pub payload: String,
    /// The secrets that sign the delivery, newest first.
    pub secrets: Vec<Secret>,
    pub claimed_until_ms: i64,
    token: String,
}

/// The most of an attempt's error that is stored, in bytes: the text comes partly from the
/// recipient (a redirect's `Location`, for one), and the delivery log must stay small.
pub const MAX_ERROR_BYTES: usize = 1_024;

/// `text` cut to at most `max` bytes, on a character boundary, with `…` when cut.
pub fn truncated(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let ellipsis = '…';
    let end = text.floor_char_boundary(max.saturating_sub(ellipsis.len_utf8()));
    format!("{}{ellipsis}", &text[..end])
}

/// What an attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub started_at_ms: i64,
    pub duration_ms: i64,
    /// The recipient's HTTP status, when it answered.
    pub status_code: Option<u16>,
    /// Why it failed, when it did; stored cut to [`MAX_ERROR_BYTES`].
    pub error: Option<String>,
}

/// What comes after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryOutcome {
    Delivered,
    /// It failed: try again at `retry_at_ms`, or never when the schedule is spent (`None`: the
    /// delivery is marked undelivered).
    Failed {
        retry_at_ms: Option<i64>,
    },
    /// The recipient answered 410 Gone: the endpoint is disabled, and the delivery waits (at its
    /// next step of the schedule) in case its owner enables the endpoint again.
    Gone {
        retry_at_ms: Option<i64>,
    },
    /// It failed, and the recipient asked for no deliveries before `until_ms` (a 429 or 503 with
    /// `Retry-After`): as `Failed`, and the whole endpoint pauses until then, for every sender.
    Paused {
        retry_at_ms: Option<i64>,
        until_ms: i64,
    },
}

/// When failures disable an endpoint: it has failed every attempt for `after_ms` and at least
/// `after_failures` attempts since its last success. Both, so that neither a single failure on a
/// quiet day, long ago, nor a burst of failures in a short outage disables it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisableRule {
    pub after_ms: i64,
    pub after_failures: i64,
}

/// What [`Deliveries::finish`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// The lease had run out and another sender had taken the delivery over: the attempt is
    /// logged, the delivery is left to the other sender.
    pub lease_lost: bool,
    /// The endpoint was disabled by this attempt, and why.
    pub endpoint_disabled: Option<String>,
}

storage::row! {
    #[derive(Debug)]
    struct ClaimedRow {
        event_id: String,
        claimed_until_ms: i64,
        attempts: i64,
        schedule_step: i64,
    }
}

/// The sender's side of the webhook tables.
#[derive(Debug, Clone)]
pub struct Deliveries {
    database: Database,
    /// What opens the endpoints' secrets.
    keys: SecretKeys,
}

impl Deliveries {
    pub fn new(database: Database, keys: SecretKeys) -> Self {
        Self { database, keys }
    }

    /// Enabled endpoints, not paused, with at least one delivery due at `now_ms` and not leased
    /// to a sender (leases are compared on the database's clock).
    pub async fn due_endpoints(&self, now_ms: i64) -> Result<Vec<DueEndpoint>, OutboxError> {
        let statement = match self.database.backend() {
            Backend::Postgres => DUE_ENDPOINTS_POSTGRES,
            Backend::Sqlite => DUE_ENDPOINTS_SQLITE,
        };
        Ok(self.database.fetch_all(statement, &[&now_ms]).await?)
    }

    /// Claims the endpoint's oldest due delivery for `lease_ms` on the database's clock, if there is one, the
    /// endpoint is enabled and fewer than its `max_in_flight` deliveries are claimed (by every
    /// sender, so several senders together keep to the limit too; two claiming at the same
    /// instant on PostgreSQL can each take the last slot). Two senders never hold the same
    /// delivery at once.
    pub async fn claim(
        &self,
        endpoint_id: &str,
        now_ms: i64,
        lease_ms: i64,
    ) -> Result<Option<Claim>, OutboxError> {
        // PostgreSQL: the row lock of FOR UPDATE SKIP LOCKED keeps concurrent senders on different
        // rows without waiting for each other. SQLite runs one write statement at a time, so the
        // same UPDATE without the lock clause is already atomic.
        let statement = match self.database.backend() {
            Backend::Postgres => CLAIM_POSTGRES,
            Backend::Sqlite => CLAIM_SQLITE,
        };
        let token = new_id("claim");
        let (endpoint_id, keys) = (endpoint_id.to_owned(), self.keys.clone());
        self.database
            .write(async move |tx| {
                let row: Option<ClaimedRow> = tx.fetch_optional(statement, &[&token, &lease_ms, &now_ms, &endpoint_id]).await?;
                let Some(row) = row else {
                    return Ok(None);
                };
                let (payload, url): (String, String) = tx
                    .fetch_one(
                        "SELECT ev.payload, en.url FROM webhook_events ev JOIN webhook_endpoints en ON en.endpoint_id = $2 WHERE ev.event_id = $1",
                        &[&row.event_id, &endpoint_id],
                    )
                    .await?;
                // Opened in the transaction: a secret that does not open leaves the delivery
                // unclaimed.
                let secrets = active_secrets(tx, &keys, &endpoint_id, now_ms).await?;
                Ok(Some(Claim {
                    endpoint_id,
                    event_id: row.event_id,
                    url,
                    attempt: row.attempts,
                    schedule_step: row.schedule_step,
                    payload,
                    secrets,
                    claimed_until_ms: row.claimed_until_ms,
                    token,
                }))
            })
            .await
    }

    /// Records `attempt` and applies `outcome`, both in one transaction; the delivery and its
    /// endpoint change only while `claim` is still the delivery's lease. Failures that meet
    /// `disable_rule` disable the endpoint, as a 410 does; a disabled endpoint's owner is told by an
    /// [`ENDPOINT_DISABLED`] event to its other endpoints. A delivery whose schedule is spent is
    /// marked undelivered, and the owner's other endpoints get an [`ENDPOINT_ATTEMPTS_EXHAUSTED`]
    /// event, in the same transaction.
    pub async fn finish(
        &self,
        claim: &Claim,
        attempt: &Attempt,
        outcome: DeliveryOutcome,
        disable_rule: DisableRule,
        now_ms: i64,
    ) -> Result<Finished, OutboxError> {
        let outcome_name = if outcome == DeliveryOutcome::Delivered {
            "delivered"
        } else {
            "failed"
        };
        let (claim, error) = (
            claim.clone(),
            attempt
                .error
                .as_deref()
                .map(|error| truncated(error, MAX_ERROR_BYTES)),
        );
        let (started_at_ms, duration_ms, status_code) = (
            attempt.started_at_ms,
            attempt.duration_ms,
            attempt.status_code.map(i64::from),
        );
        self.database
            .write(async move |tx| {
                if let DeliveryOutcome::Paused { until_ms, .. } = outcome {
                    // Recorded even when the lease is lost: the answer says what the recipient can
                    // take now, whichever sender asked. Only ever lengthened, so a late short pause
                    // cannot cut a longer one short.
                    tx.execute(
                        "UPDATE webhook_endpoints SET paused_until_ms = $1 \
                         WHERE endpoint_id = $2 AND (paused_until_ms IS NULL OR paused_until_ms < $1)",
                        &[&until_ms, &claim.endpoint_id],
                    )
                    .await?;
                }
                tx.execute(
                    "INSERT INTO webhook_attempts (endpoint_id, event_id, attempt, started_at_ms, duration_ms, status_code, outcome, error) \
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
                    &[&claim.endpoint_id, &claim.event_id, &claim.attempt, &started_at_ms, &duration_ms, &status_code, &outcome_name, &error],
                )
                .await?;

                let (state, next_attempt_at_ms, step) = match outcome {
                    DeliveryOutcome::Delivered => ("delivered", now_ms, claim.schedule_step),
                    DeliveryOutcome::Failed { retry_at_ms: Some(at) }
                    | DeliveryOutcome::Gone { retry_at_ms: Some(at) }
                    | DeliveryOutcome::Paused { retry_at_ms: Some(at), .. } => ("pending", at, claim.schedule_step + 1),
                    DeliveryOutcome::Failed { retry_at_ms: None } | DeliveryOutcome::Gone { retry_at_ms: None } | DeliveryOutcome::Paused { retry_at_ms: None, .. } => {
                        ("undelivered", now_ms, claim.schedule_step + 1)
                    }
                };
                let updated = tx
                    .execute(
                        "UPDATE webhook_deliveries SET state = $1, next_attempt_at_ms = $2, schedule_step = $3, \
                           claim_token = NULL, claimed_until_ms = NULL, updated_at_ms = $4 \
                         WHERE endpoint_id = $5 AND event_id = $6 AND claim_token = $7",
                        &[&state, &next_attempt_at_ms, &step, &now_ms, &claim.endpoint_id, &claim.event_id, &claim.token],
                    )
                    .await?;

                let lease_lost = updated == 0;
                if lease_lost {
                    // Another sender holds the delivery now (or a redelivery reset it): only the
                    // attempt is this sender's to record, not what it means for the delivery or the
                    // endpoint.
                    return Ok(Finished { lease_lost, endpoint_disabled: None });
                }
                let disable_reason = match outcome {
                    DeliveryOutcome::Delivered => {
                        tx.execute(
                            "UPDATE webhook_endpoints SET failing_since_ms = NULL, failures_since_success = 0 \
                             WHERE endpoint_id = $1 AND failing_since_ms IS NOT NULL",
                            &[&claim.endpoint_id],
                        )
                        .await?;
                        None
                    }
                    DeliveryOutcome::Gone { .. } => Some("the endpoint answered 410 Gone".to_owned()),
                    DeliveryOutcome::Failed { .. } | DeliveryOutcome::Paused { .. } => {
                        // One statement: a success recorded at the same time cannot clear it in between.
                        let (failing_since_ms, failures): (i64, i64) = tx
                            .fetch_one(
                                "UPDATE webhook_endpoints SET failing_since_ms = COALESCE(failing_since_ms, $1), \
                                   failures_since_success = failures_since_success + 1 \
                                 WHERE endpoint_id = $2 RETURNING failing_since_ms, failures_since_success",
                                &[&now_ms, &claim.endpoint_id],
                            )
                            .await?;
                        let failing_ms = now_ms - failing_since_ms;
                        (failing_ms >= disable_rule.after_ms && failures >= disable_rule.after_failures)
                            .then(|| format!("the endpoint has failed every attempt ({failures}) for {} s", failing_ms / 1000))
                    }
                };
                if state == "undelivered" {
                    exhausted(tx, &claim, now_ms).await?;
                }
                let endpoint_disabled = match disable_reason {
                    Some(reason) => disable(tx, &claim.endpoint_id, &reason, now_ms).await?.then_some(reason),
                    None => None,
                };
                Ok(Finished { lease_lost, endpoint_disabled })
            })
            .await
    }

    /// Runs the next batch, of at most `batch` deliveries, of the range redelivery whose turn is
    /// oldest (they take turns, a batch each), in one short transaction; returns how many
    /// deliveries it queued, or `None` when no range redelivery is running.
    pub async fn redeliver_next_batch(
        &self,
        batch: u32,
        now_ms: i64,
    ) -> Result<Option<u64>, OutboxError> {
        crate::redeliveries::next_batch(&self.database, batch, now_ms).await
    }

    /// Deletes the events created more than `retention_ms` before `now_ms` that nothing still
    /// delivers (no delivery leased, none pending at an enabled endpoint), with their deliveries
    /// and attempts, `batch` events per transaction; returns how many events.
    pub async fn reap_expired(
        &self,
        retention_ms: i64,
        batch: u32,
        now_ms: i64,
    ) -> Result<u64, OutboxError> {
        crate::retention::reap(&self.database, retention_ms, batch, now_ms).await
    }

    /// The earliest time a pending delivery of an enabled endpoint falls due (its endpoint's
    /// pause included), if any.
    pub async fn next_due_ms(&self) -> Result<Option<i64>, OutboxError> {
        let (next,): (Option<i64>,) = self
            .database
            .fetch_one(
                "SELECT MIN(CASE WHEN e.paused_until_ms > d.next_attempt_at_ms THEN e.paused_until_ms ELSE d.next_attempt_at_ms END) \
                 FROM webhook_deliveries d JOIN webhook_endpoints e ON e.endpoint_id = d.endpoint_id \
                 WHERE d.state = 'pending' AND e.state = 'enabled'",
                &[],
            )
            .await?;
        Ok(next)
    }
}

// Leases are on the database's clock, the one clock every sender shares: were each sender's own
// clock used, one running ahead of the others by more than a lease's margin would see live leases
// as run out and take deliveries that another sender is still sending. Due times stay on the
// sender's clock (`now_ms`): a sender whose clock drifts sends early or late, never twice.
// Both expressions give milliseconds since the Unix epoch.
macro_rules! postgres_now_ms {
    () => {
        "(EXTRACT(EPOCH FROM statement_timestamp()) * 1000)::BIGINT"
    };
}
macro_rules! sqlite_now_ms {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)"
    };
}

/// The due endpoints' statement, with the database's clock `$now` for the leases.
macro_rules! due_endpoints_statement {
    ($now:expr) => {
        concat!(
            "SELECT e.endpoint_id, e.client_id, e.max_in_flight, e.rate_per_sec FROM webhook_endpoints e \
             WHERE e.state = 'enabled' AND EXISTS (SELECT 1 FROM webhook_deliveries d \
               WHERE d.endpoint_id = e.endpoint_id AND d.state = 'pending' AND d.next_attempt_at_ms <= $1 \
                 AND (d.claimed_until_ms IS NULL OR d.claimed_until_ms <= ",
            $now,
            ")) AND (e.paused_until_ms IS NULL OR e.paused_until_ms <= $1)"
        )
    };
}

const DUE_ENDPOINTS_POSTGRES: &str = due_endpoints_statement!(postgres_now_ms!());
const DUE_ENDPOINTS_SQLITE: &str = due_endpoints_statement!(sqlite_now_ms!());

/// The claim statement, with the database's clock `$now` for the leases and `$lock` after its
/// row choice: the differences between backends. `$2` is the lease's length.
macro_rules! claim_statement {
    ($now:expr, $lock:literal) => {
        concat!(
            "UPDATE webhook_deliveries SET claim_token = $1, claimed_until_ms = ",
            $now,
            " + $2, attempts = attempts + 1, updated_at_ms = $3 \
             WHERE endpoint_id = $4 AND event_id = (SELECT d.event_id FROM webhook_deliveries d \
               JOIN webhook_endpoints e ON e.endpoint_id = d.endpoint_id \
               WHERE d.endpoint_id = $4 AND e.state = 'enabled' AND d.state = 'pending' AND d.next_attempt_at_ms <= $3 \
                 AND (e.paused_until_ms IS NULL OR e.paused_until_ms <= $3) \
                 AND (d.claimed_until_ms IS NULL OR d.claimed_until_ms <= ",
            $now,
            ") AND (SELECT COUNT(*) FROM webhook_deliveries c WHERE c.endpoint_id = $4 AND c.claimed_until_ms > ",
            $now,
            ") < e.max_in_flight \
               ORDER BY d.next_attempt_at_ms, d.event_id LIMIT 1",
            $lock,
            ") RETURNING event_id, claimed_until_ms, attempts, schedule_step"
        )
    };
}

const CLAIM_POSTGRES: &str = claim_statement!(postgres_now_ms!(), " FOR UPDATE OF d SKIP LOCKED");
const CLAIM_SQLITE: &str = claim_statement!(sqlite_now_ms!(), "");

/// The endpoint's secrets that sign at `now_ms`, newest first, opened with `keys`.
async fn active_secrets(
    tx: &mut Tx<'_>,
    keys: &SecretKeys,
    endpoint_id: &str,
    now_ms: i64,
) -> Result<Vec<Secret>, OutboxError> {
    let rows: Vec<(String,)> = tx
        .fetch_all(
            "SELECT secret FROM webhook_secrets WHERE endpoint_id = $1 AND (expires_at_ms IS NULL OR expires_at_ms > $2) \
             ORDER BY created_at_ms DESC, secret_id DESC",
            &[&endpoint_id, &now_ms],
        )
        .await?;
    rows.into_iter()
        .map(|(sealed,)| keys.open(endpoint_id, &sealed))
        .collect()
}

/// Tells the owner of the claim's endpoint, through its other endpoints, that the claimed
/// delivery ran out of its schedule. Not for an exhausted [`ENDPOINT_ATTEMPTS_EXHAUSTED`] event
/// itself: two failing endpoints would otherwise tell each other about each other for ever.
async fn exhausted(tx: &mut Tx<'_>, claim: &Claim, now_ms: i64) -> Result<(), OutboxError> {
    let (client_id, event_type): (String, String) = tx
        .fetch_one(
            "SELECT e.client_id, e.event_type FROM webhook_events e WHERE e.event_id = $1",
            &[&claim.event_id],
        )
        .await?;
    if event_type == ENDPOINT_ATTEMPTS_EXHAUSTED {
        return Ok(());
    }
    let data = serde_json::json!({ "endpoint_id": claim.endpoint_id, "event_id": claim.event_id, "event_type": event_type });
    let event = NewEvent {
        event_type: ENDPOINT_ATTEMPTS_EXHAUSTED,
        version: 1,
        data: &data,
    };
    record_for(
        tx,
        &client_id,
        &event,
        Recipients::Subscribers {
            except: Some(&claim.endpoint_id),
        },
        now_ms,
    )
    .await?;
    Ok(())
}

/// Disables an enabled endpoint and tells its owner; `false` when it was not enabled.
async fn disable(
    tx: &mut Tx<'_>,
    endpoint_id: &str,
    reason: &str,
    now_ms: i64,
) -> Result<bool, OutboxError> {
    let disabled = tx
        .execute(
            "UPDATE webhook_endpoints SET state = 'disabled', disabled_reason = $1 WHERE endpoint_id = $2 AND state = 'enabled'",
            &[&reason, &endpoint_id],
        )
        .await?;
    if disabled == 0 {
        return Ok(false);
    }
    let (client_id, url): (String, String) = tx
        .fetch_one(
            "SELECT client_id, url FROM webhook_endpoints WHERE endpoint_id = $1",
            &[&endpoint_id],
        )
        .await?;
    let data = serde_json::json!({ "endpoint_id": endpoint_id, "url": url, "reason": reason });
    record(
        tx,
        &client_id,
        &NewEvent {
            event_type: ENDPOINT_DISABLED,
            version: 1,
            data: &data,
        },
        now_ms,
    )
    .await?;
    Ok(true)
}
