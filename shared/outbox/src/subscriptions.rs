use storage::{Backend, Database, Tx};
use webhooks::{signature::Secret, ssrf};

use crate::{
    ENDPOINT_PING, NewEvent, OutboxError,
    event::{Recipients, record_for, subscribable_event_types},
    new_id,
    redeliveries::{self, RedeliveryLimits, RedeliveryRange},
    sealed::SecretKeys,
};

/// The most endpoints one client may have: each gets a worker and connections in the sender, so
/// the sender's resources are shared out fairly among clients.
pub const MAX_ENDPOINTS_PER_CLIENT: u32 = 20;
/// The class of PostgreSQL's advisory locks that serialise a client's endpoint creations (the
/// second key is the client's hash): a number of ours, apart from any other lock's.
const ENDPOINT_CREATION_LOCK: i32 = 0x0E0B_400C;

/// How hard one endpoint may be pushed: its deliveries in flight at once, and started per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndpointLimits {
    pub max_in_flight: u32,
    pub rate_per_sec: u32,
}

impl EndpointLimits {
    /// The most a client may ask for; more would let one recipient take the sender over.
    pub const MAX: Self = Self {
        max_in_flight: 64,
        rate_per_sec: 1_000,
    };
}

impl Default for EndpointLimits {
    fn default() -> Self {
        Self {
            max_in_flight: 4,
            rate_per_sec: 50,
        }
    }
}

/// A recipient to create.
#[derive(Debug, Clone)]
pub struct NewEndpoint {
    pub url: String,
    pub event_types: Vec<String>,
    pub limits: EndpointLimits,
}

impl NewEndpoint {
    /// Checks what can be checked before any delivery: the URL under `policy` (see
    /// [`ssrf::Target::parse`]), known event types, limits within [`EndpointLimits::MAX`]; and
    /// puts the URL in its normalised form, the one stored and shown.
    /// Names are resolved and vetted again at every delivery, since what they resolve to changes.
    pub fn validate(&mut self, policy: &ssrf::DestinationPolicy) -> Result<(), OutboxError> {
        self.url = vetted_url(&self.url, policy)?;
        check_event_types(&self.event_types)?;
        check_limit(
            "max_in_flight",
            self.limits.max_in_flight,
            EndpointLimits::MAX.max_in_flight,
        )?;
        check_limit(
            "rate_per_sec",
            self.limits.rate_per_sec,
            EndpointLimits::MAX.rate_per_sec,
        )
    }
}

/// What to change of an endpoint: only the fields given.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndpointUpdate {
    pub url: Option<String>,
    /// The event types it receives from now on, in place of those it had.
    pub event_types: Option<Vec<String>>,
    pub max_in_flight: Option<u32>,
    pub rate_per_sec: Option<u32>,
}

impl EndpointUpdate {
    /// The checks of [`NewEndpoint::validate`], on the fields given; at least one must be.
    pub fn validate(&mut self, policy: &ssrf::DestinationPolicy) -> Result<(), OutboxError> {
        if *self == Self::default() {
            return Err(OutboxError::Invalid("body: name at least one of url, event_types, max_in_flight, rate_per_sec to change".into()));
        }
        if let Some(url) = &mut self.url {
            *url = vetted_url(url, policy)?;
        }
        if let Some(event_types) = &self.event_types {
            check_event_types(event_types)?;
        }
        if let Some(max_in_flight) = self.max_in_flight {
            check_limit(
                "max_in_flight",
                max_in_flight,
                EndpointLimits::MAX.max_in_flight,
            )?;
        }
        if let Some(rate_per_sec) = self.rate_per_sec {
            check_limit(
                "rate_per_sec",
                rate_per_sec,
                EndpointLimits::MAX.rate_per_sec,
            )?;
        }
        Ok(())
    }
}

/// `url` vetted under `policy`, in its normalised form.
fn vetted_url(url: &str, policy: &ssrf::DestinationPolicy) -> Result<String, OutboxError> {
    let target = ssrf::Target::parse(url, policy)
        .map_err(|error| OutboxError::Invalid(format!("url: {error}")))?;
    Ok(target.normalised().to_owned())
}

/// At least one event type, each one an endpoint can subscribe to.
fn check_event_types(event_types: &[String]) -> Result<(), OutboxError> {
    let known = || subscribable_event_types().collect::<Vec<_>>().join(", ");
    if event_types.is_empty() {
        return Err(OutboxError::Invalid(format!(
            "event_types: name at least one of {}",
            known()
        )));
    }
    if let Some(unknown) = event_types
        .iter()
        .find(|event_type| !subscribable_event_types().any(|known| known == event_type.as_str()))
    {
        return Err(OutboxError::Invalid(format!(
            "event_types: unknown {unknown:?}; known are {}",
            known()
        )));
    }
    Ok(())
}

fn check_limit(field: &str, value: u32, max: u32) -> Result<(), OutboxError> {
    if !(1..=max).contains(&value) {
        return Err(OutboxError::Invalid(format!("{field}: must be 1..={max}")));
    }
    Ok(())
}

/// A recipient as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub endpoint_id: String,
    pub url: String,
    pub event_types: Vec<String>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub failing_since_ms: Option<i64>,
    pub limits: EndpointLimits,
    pub created_at_ms: i64,
    /// When it was created or last changed by its owner (an update of its URL, event types or limits).
    pub updated_at_ms: i64,
}

storage::row! {
    #[derive(Debug)]
    struct EndpointRow {
        endpoint_id: String,
        url: String,
        state: String,
        disabled_reason: Option<String>,
        failing_since_ms: Option<i64>,
        max_in_flight: i64,
        rate_per_sec: i64,
        created_at_ms: i64,
        updated_at_ms: i64,
    }
}

const SELECT_ENDPOINT: &str = "SELECT endpoint_id, url, state, disabled_reason, failing_since_ms, max_in_flight, rate_per_sec, created_at_ms, \
     updated_at_ms FROM webhook_endpoints";

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting for its next attempt (or for its endpoint to be enabled again).
    Pending,
    Delivered,
    /// The retry schedule ran out; only a redelivery tries again.
    Undelivered,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Undelivered => "undelivered",
        }
    }

    /// The state named `text` (`pending`, `delivered`, `undelivered`).
    pub fn from_name(text: &str) -> Option<Self> {
        [Self::Pending, Self::Delivered, Self::Undelivered]
            .into_iter()
            .find(|state| state.as_str() == text)
    }

    fn parse(text: &str) -> Result<Self, OutboxError> {
        Self::from_name(text).ok_or_else(|| {
            OutboxError::Storage(storage::Error::Corrupt(format!(
                "unknown delivery state {text:?}"
            )))
        })
    }
}

/// One event's delivery to one endpoint, with every attempt recorded so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryLog {
    pub event_id: String,
    pub event_type: String,
    pub state: DeliveryState,
    pub next_attempt_at_ms: Option<i64>,
    pub created_at_ms: i64,
    pub attempts: Vec<AttemptLog>,
}

/// One attempt as recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptLog {
    pub attempt: i64,
    pub started_at_ms: i64,
    pub duration_ms: i64,
    pub status_code: Option<i64>,
    pub outcome: String,
    pub error: Option<String>,
}

/// Which deliveries of an endpoint the log shows, at most `limit` of them, newest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryQuery {
    pub limit: u32,
    pub state: Option<DeliveryState>,
    pub event_type: Option<String>,
    /// Only deliveries older than this one: the previous page's [`DeliveryPage::next`].
    pub after: Option<LogCursor>,
}

impl DeliveryQuery {
    /// The newest `limit` deliveries, whatever their state and type.
    pub fn newest(limit: u32) -> Self {
        Self {
            limit,
            state: None,
            event_type: None,
            after: None,
        }
    }
}

/// A page of the delivery log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryPage {
    pub deliveries: Vec<DeliveryLog>,
    /// Where the next page starts, when there is one.
    pub next: Option<LogCursor>,
}

/// A place in the delivery log: the last delivery of a page. Its text form, `<ms>_<event id>`,
/// is opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogCursor {
    created_at_ms: i64,
    event_id: String,
}

impl std::fmt::Display for LogCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}_{}", self.created_at_ms, self.event_id)
    }
}

impl std::str::FromStr for LogCursor {
    type Err = OutboxError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || OutboxError::Invalid("cursor: not a cursor this log gave".into());
        let (ms, event_id) = text.split_once('_').ok_or_else(invalid)?;
        let created_at_ms = ms.parse().map_err(|_| invalid())?;
        if event_id.is_empty() {
            return Err(invalid());
        }
        Ok(Self {
            created_at_ms,
            event_id: event_id.to_owned(),
        })
    }
}

storage::row! {
    /// A delivery of a log page with one of its attempts (none: the attempt's columns are NULL).
    #[derive(Debug)]
    struct LogRow {
        event_id: String,
        event_type: String,
        state: String,
        next_attempt_at_ms: i64,
        created_at_ms: i64,
        attempt: Option<i64>,
        started_at_ms: Option<i64>,
        duration_ms: Option<i64>,
        status_code: Option<i64>,
        outcome: Option<String>,
        error: Option<String>,
    }
}

impl LogRow {
    fn attempt(&self) -> Option<AttemptLog> {
        Some(AttemptLog {
            attempt: self.attempt?,
            started_at_ms: self.started_at_ms?,
            duration_ms: self.duration_ms?,
            status_code: self.status_code,
            outcome: self.outcome.clone()?,
            error: self.error.clone(),
        })
    }
}

/// The recipients' side of the webhook tables, each call scoped to one client.
#[derive(Debug, Clone)]
pub struct Subscriptions {
    database: Database,
    /// What seals the endpoints' secrets at rest.
    keys: SecretKeys,
}

impl Subscriptions {
    pub fn new(database: Database, keys: SecretKeys) -> Self {
        Self { database, keys }
    }

    /// The keys that seal the secrets this stores.
    pub fn keys(&self) -> &SecretKeys {
        &self.keys
    }

    /// Creates an enabled endpoint and its first secret, in `tx` (inside the caller's
    /// transaction, e.g. an idempotency key's phase). `new` must have been validated.
    pub async fn create_endpoint(
        &self,
        tx: &mut Tx<'_>,
        client_id: &str,
        new: &NewEndpoint,
        now_ms: i64,
    ) -> Result<(Endpoint, Secret), OutboxError> {
        let endpoint_id = new_id("ep");
        // Counted after the insert, in its transaction, one creation per client at a time: on
        // SQLite the one writer runs them in turn; on PostgreSQL, under READ COMMITTED, two at
        // once would each count its own row and not the other's, so each takes the client's lock
        // first (held to the end of its transaction), and the second counts after the first.
        if tx.backend() == Backend::Postgres {
            // The lock's class is bound as a BIGINT: the two-key lock takes two INTEGERs.
            tx.execute(
                "SELECT pg_advisory_xact_lock($1::INTEGER, hashtext($2))",
                &[&ENDPOINT_CREATION_LOCK, &client_id],
            )
            .await?;
        }
        tx.execute(
            "INSERT INTO webhook_endpoints (endpoint_id, client_id, url, state, max_in_flight, rate_per_sec, created_at_ms, updated_at_ms) \
             VALUES ($1, $2, $3, 'enabled', $4, $5, $6, $6)",
            &[&endpoint_id, &client_id, &new.url, &new.limits.max_in_flight, &new.limits.rate_per_sec, &now_ms],
        )
        .await?;
        let (endpoints,): (i64,) = tx
            .fetch_one(
                "SELECT COUNT(*) FROM webhook_endpoints WHERE client_id = $1",
                &[&client_id],
            )
            .await?;
        if endpoints > i64::from(MAX_ENDPOINTS_PER_CLIENT) {
            return Err(OutboxError::Invalid(format!(
                "a client has at most {MAX_ENDPOINTS_PER_CLIENT} endpoints"
            )));
        }
        let event_types = insert_subscriptions(tx, &endpoint_id, &new.event_types).await?;
        let secret = insert_secret(tx, &self.keys, &endpoint_id, now_ms).await?;
        let endpoint = Endpoint {
            endpoint_id,
            url: new.url.clone(),
            event_types,
            enabled: true,
            disabled_reason: None,
            failing_since_ms: None,
            limits: new.limits,
            created_at_ms: now_ms,
            updated_at_ms: now_ms,
        };
        Ok((endpoint, secret))
    }

    /// A new secret for the endpoint, in `tx`. The current secret keeps signing for
    /// `overlap_ms` more (both signatures go with every delivery meanwhile), so the receiver can
    /// switch to the new one without losing a delivery. An older secret still in its overlap
    /// stops signing now: there are never more than two, so repeated rotations cannot pile up
    /// HMACs per delivery and a `webhook-signature` header that receivers refuse.
    pub async fn rotate_secret(
        &self,
        tx: &mut Tx<'_>,
        client_id: &str,
        endpoint_id: &str,
        overlap_ms: i64,
        now_ms: i64,
    ) -> Result<Secret, OutboxError> {
        lock_owned_endpoint(tx, client_id, endpoint_id).await?;
        // Every secret but the current one goes (expired or still in an overlap); the current one
        // becomes the previous, signing until the overlap ends.
        tx.execute(
            "DELETE FROM webhook_secrets WHERE endpoint_id = $1 AND expires_at_ms IS NOT NULL",
            &[&endpoint_id],
        )
        .await?;
        tx.execute(
            "UPDATE webhook_secrets SET expires_at_ms = $1 WHERE endpoint_id = $2 AND expires_at_ms IS NULL",
            &[&now_ms.saturating_add(overlap_ms), &endpoint_id],
        )
        .await?;
        insert_secret(tx, &self.keys, endpoint_id, now_ms).await
    }

    /// Changes what `update` names of the endpoint, in one transaction, and answers the endpoint
    /// as it is then. `update` must have been validated. New event types replace the old ones
    /// (deliveries already queued stay); a new URL is a new recipient, so the failures counted
    /// against the old one and any pause it asked for are forgotten.
    pub async fn update_endpoint(
        &self,
        client_id: &str,
        endpoint_id: &str,
        update: &EndpointUpdate,
        now_ms: i64,
    ) -> Result<Endpoint, OutboxError> {
        let (client_id, endpoint_id, update) =
            (client_id.to_owned(), endpoint_id.to_owned(), update.clone());
        self.database
            .write(async move |tx| {
                lock_owned_endpoint(tx, &client_id, &endpoint_id).await?;
                tx.execute(
                    "UPDATE webhook_endpoints SET url = COALESCE($1, url), max_in_flight = COALESCE($2, max_in_flight), \
                       rate_per_sec = COALESCE($3, rate_per_sec), updated_at_ms = $4, \
                       failing_since_ms = CASE WHEN $1 IS NULL OR $1 = url THEN failing_since_ms END, \
                       failures_since_success = CASE WHEN $1 IS NULL OR $1 = url THEN failures_since_success ELSE 0 END, \
                       paused_until_ms = CASE WHEN $1 IS NULL OR $1 = url THEN paused_until_ms END \
                     WHERE endpoint_id = $5",
                    &[&update.url, &update.max_in_flight, &update.rate_per_sec, &now_ms, &endpoint_id],
                )
                .await?;
                if let Some(event_types) = &update.event_types {
                    tx.execute("DELETE FROM webhook_subscriptions WHERE endpoint_id = $1", &[&endpoint_id]).await?;
                    insert_subscriptions(tx, &endpoint_id, event_types).await?;
                }
                let row = owned_endpoint(tx, &client_id, &endpoint_id).await?;
                with_event_types(tx, row).await
            })
            .await
    }

    /// Sends the endpoint an [`ENDPOINT_PING`] event now, through the pipeline every event takes
    /// (signed, retried on the schedule, in the delivery log), whatever it subscribes to; returns
    /// the event's id. A disabled endpoint's ping waits, as its other deliveries do.
    pub async fn ping(
        &self,
        client_id: &str,
        endpoint_id: &str,
        now_ms: i64,
    ) -> Result<String, OutboxError> {
        let (client_id, endpoint_id) = (client_id.to_owned(), endpoint_id.to_owned());
        self.database
            .write(async move |tx| {
                lock_owned_endpoint(tx, &client_id, &endpoint_id).await?;
                let data = serde_json::json!({ "endpoint_id": endpoint_id });
                let event = NewEvent {
                    event_type: ENDPOINT_PING,
                    version: 1,
                    data: &data,
                };
                record_for(
                    tx,
                    &client_id,
                    &event,
                    Recipients::Only(&endpoint_id),
                    now_ms,
                )
                .await?
                .ok_or_else(|| OutboxError::EndpointNotFound(endpoint_id.clone()))
            })
            .await
    }

    pub async fn endpoints(&self, client_id: &str) -> Result<Vec<Endpoint>, OutboxError> {
        self.database
            .read(async |tx| {
                let statement = format!(
                    "{SELECT_ENDPOINT} WHERE client_id = $1 ORDER BY created_at_ms, endpoint_id"
                );
                let rows: Vec<EndpointRow> = tx.fetch_all(&statement, &[&client_id]).await?;
                let mut endpoints = Vec::with_capacity(rows.len());
                for row in rows {
                    endpoints.push(with_event_types(tx, row).await?);
                }
                Ok(endpoints)
            })
            .await
    }

    pub async fn endpoint(
        &self,
        client_id: &str,
        endpoint_id: &str,
    ) -> Result<Endpoint, OutboxError> {
        self.database
            .read(async |tx| {
                let row = owned_endpoint(tx, client_id, endpoint_id).await?;
                with_event_types(tx, row).await
            })
            .await
    }

    /// Enables the endpoint (forgetting its failures: it starts afresh, and its pending deliveries
    /// go out again) or disables it (nothing is sent to it; its deliveries wait).
    pub async fn set_enabled(
        &self,
        client_id: &str,
        endpoint_id: &str,
        enabled: bool,
    ) -> Result<Endpoint, OutboxError> {
        let statement = if enabled {
            "UPDATE webhook_endpoints SET state = 'enabled', disabled_reason = NULL, failing_since_ms = NULL, failures_since_success = 0 \
             WHERE endpoint_id = $1 AND client_id = $2"
        } else {
            "UPDATE webhook_endpoints SET state = 'disabled', disabled_reason = 'disabled by its owner' WHERE endpoint_id = $1 AND client_id = $2 AND state = 'enabled'"
        };
        let (endpoint, client) = (endpoint_id.to_owned(), client_id.to_owned());
        self.database
            .write(async move |tx| tx.execute(statement, &[&endpoint, &client]).await)
            .await?;
        self.endpoint(client_id, endpoint_id).await
    }

    /// Deletes the endpoint with its subscriptions, secrets, deliveries and their attempts, in
    /// one transaction: nothing more is sent to it, and its place under
    /// [`MAX_ENDPOINTS_PER_CLIENT`] is free. The events stay (other endpoints may deliver them).
    /// An attempt in flight meanwhile finds its delivery gone and is not recorded.
    pub async fn delete_endpoint(
        &self,
        client_id: &str,
        endpoint_id: &str,
    ) -> Result<(), OutboxError> {
        let (client_id, endpoint_id) = (client_id.to_owned(), endpoint_id.to_owned());
        self.database
            .write(async move |tx| {
                lock_owned_endpoint(tx, &client_id, &endpoint_id).await?;
                // Children before parents: every table refers to the endpoint (attempts through deliveries).
                for statement in [
                    "DELETE FROM webhook_attempts WHERE endpoint_id = $1",
                    "DELETE FROM webhook_deliveries WHERE endpoint_id = $1",
                    "DELETE FROM webhook_redeliveries WHERE endpoint_id = $1",
                    "DELETE FROM webhook_secrets WHERE endpoint_id = $1",
                    "DELETE FROM webhook_subscriptions WHERE endpoint_id = $1",
                    "DELETE FROM webhook_endpoints WHERE endpoint_id = $1",
                ] {
                    tx.execute(statement, &[&endpoint_id]).await?;
                }
                Ok(())
            })
            .await
    }

    /// A page of the endpoint's deliveries that match `query`, newest first, each with its
    /// attempts: one statement whatever the page's size (the page joined with its attempts).
    pub async fn deliveries(
        &self,
        client_id: &str,
        endpoint_id: &str,
        query: &DeliveryQuery,
    ) -> Result<DeliveryPage, OutboxError> {
        let (after_ms, after_event_id) = match &query.after {
            Some(cursor) => (Some(cursor.created_at_ms), cursor.event_id.as_str()),
            None => (None, ""),
        };
        let rows: Vec<LogRow> = self
            .database
            .read(async |tx| {
                owned_endpoint(tx, client_id, endpoint_id).await?;
                // One more than the page, to know whether another follows.
                Ok::<_, OutboxError>(
                    tx.fetch_all(
                        "SELECT p.event_id, p.event_type, p.state, p.next_attempt_at_ms, p.created_at_ms, \
                           a.attempt, a.started_at_ms, a.duration_ms, a.status_code, a.outcome, a.error \
                         FROM (SELECT d.event_id, e.event_type, d.state, d.next_attempt_at_ms, d.created_at_ms \
                               FROM webhook_deliveries d JOIN webhook_events e ON e.event_id = d.event_id \
                               WHERE d.endpoint_id = $1 AND ($2 IS NULL OR d.state = $2) AND ($3 IS NULL OR e.event_type = $3) \
                                 AND ($4 IS NULL OR d.created_at_ms < $4 OR (d.created_at_ms = $4 AND d.event_id < $5)) \
                               ORDER BY d.created_at_ms DESC, d.event_id DESC LIMIT $6) p \
                         LEFT JOIN webhook_attempts a ON a.endpoint_id = $1 AND a.event_id = p.event_id \
                         ORDER BY p.created_at_ms DESC, p.event_id DESC, a.attempt",
                        &[
                            &endpoint_id,
                            &query.state.map(DeliveryState::as_str),
                            &query.event_type,
                            &after_ms,
                            &after_event_id,
                            &(i64::from(query.limit) + 1),
                        ],
                    )
                    .await?,
                )
            })
            .await?;
        let mut deliveries: Vec<DeliveryLog> = Vec::new();
        for row in rows {
            if deliveries
                .last()
                .is_none_or(|last| last.event_id != row.event_id)
            {
                let state = DeliveryState::parse(&row.state)?;
                deliveries.push(DeliveryLog {
                    event_id: row.event_id.clone(),
                    event_type: row.event_type.clone(),
                    state,
                    next_attempt_at_ms: (state == DeliveryState::Pending)
                        .then_some(row.next_attempt_at_ms),
                    created_at_ms: row.created_at_ms,
                    attempts: Vec::new(),
                });
            }
            if let Some(attempt) = row.attempt() {
                deliveries
                    .last_mut()
                    .expect("pushed above")
                    .attempts
                    .push(attempt);
            }
        }
        let next = (deliveries.len() > query.limit as usize).then(|| {
            deliveries.truncate(query.limit as usize);
            let last = deliveries.last().expect("a full page has a last delivery");
            LogCursor {
                created_at_ms: last.created_at_ms,
                event_id: last.event_id.clone(),
            }
        });
        Ok(DeliveryPage { deliveries, next })
    }

    /// Sends one event to the endpoint again, now, with a fresh retry schedule and the same
    /// `webhook-id`. An attempt in flight loses its lease, so its outcome cannot undo this.
    pub async fn redeliver(
        &self,
        client_id: &str,
        endpoint_id: &str,
        event_id: &str,
        now_ms: i64,
    ) -> Result<(), OutboxError> {
        self.endpoint(client_id, endpoint_id).await?;
        let (endpoint, event) = (endpoint_id.to_owned(), event_id.to_owned());
        let updated = self
            .database
            .write(async move |tx| {
                tx.execute(
                    "UPDATE webhook_deliveries SET state = 'pending', schedule_step = 0, next_attempt_at_ms = $1, updated_at_ms = $1, \
                       claim_token = NULL, claimed_until_ms = NULL \
                     WHERE endpoint_id = $2 AND event_id = $3",
                    &[&now_ms, &endpoint, &event],
                )
                .await
            })
            .await?;
        if updated == 0 {
            return Err(OutboxError::DeliveryNotFound {
                endpoint_id: endpoint_id.to_owned(),
                event_id: event_id.to_owned(),
            });
        }
        Ok(())
    }

    /// Sends again the events of the client in `range` that the endpoint subscribes to: those
    /// not delivered (or every one, with `include_delivered`), and those it missed while disabled
    /// (never those from before it existed). Checked against `limits` now, run by the sender in
    /// batches; returns how many deliveries it will queue.
    pub async fn redeliver_range(
        &self,
        client_id: &str,
        endpoint_id: &str,
        range: RedeliveryRange,
        limits: RedeliveryLimits,
        now_ms: i64,
    ) -> Result<u64, OutboxError> {
        self.endpoint(client_id, endpoint_id).await?;
        redeliveries::request(
            &self.database,
            client_id,
            endpoint_id,
            range,
            limits,
            now_ms,
        )
        .await
    }
}

async fn with_event_types(tx: &mut Tx<'_>, row: EndpointRow) -> Result<Endpoint, OutboxError> {
    let event_types: Vec<(String,)> =
        tx.fetch_all("SELECT event_type FROM webhook_subscriptions WHERE endpoint_id = $1 ORDER BY event_type", &[&row.endpoint_id]).await?;
    row.into_endpoint(
        event_types
            .into_iter()
            .map(|(event_type,)| event_type)
            .collect(),
    )
}

/// Locks the client's endpoint for the rest of the transaction, or says it has no such endpoint.
/// Writing first takes the endpoint's row lock (PostgreSQL: a concurrent rotation or delete
/// waits, then sees what this one did); on SQLite the one writer runs a transaction alone, so no
/// read of it can go stale before its writes.
async fn lock_owned_endpoint(
    tx: &mut Tx<'_>,
    client_id: &str,
    endpoint_id: &str,
) -> Result<(), OutboxError> {
    let owned = tx
        .execute(
            "UPDATE webhook_endpoints SET state = state WHERE endpoint_id = $1 AND client_id = $2",
            &[&endpoint_id, &client_id],
        )
        .await?;
    if owned == 0 {
        return Err(OutboxError::EndpointNotFound(endpoint_id.to_owned()));
    }
    Ok(())
}

async fn owned_endpoint(
    tx: &mut Tx<'_>,
    client_id: &str,
    endpoint_id: &str,
) -> Result<EndpointRow, OutboxError> {
    let statement = format!("{SELECT_ENDPOINT} WHERE endpoint_id = $1 AND client_id = $2");
    tx.fetch_optional(&statement, &[&endpoint_id, &client_id])
        .await?
        .ok_or_else(|| OutboxError::EndpointNotFound(endpoint_id.to_owned()))
}

/// Subscribes the endpoint to `event_types` (each once); returns them sorted.
async fn insert_subscriptions(
    tx: &mut Tx<'_>,
    endpoint_id: &str,
    event_types: &[String],
) -> Result<Vec<String>, OutboxError> {
    let mut event_types = event_types.to_vec();
    event_types.sort();
    event_types.dedup();
    for event_type in &event_types {
        tx.execute(
            "INSERT INTO webhook_subscriptions (endpoint_id, event_type) VALUES ($1, $2)",
            &[&endpoint_id, event_type],
        )
        .await?;
    }
    Ok(event_types)
}

/// A new secret for the endpoint, stored sealed under `keys`.
async fn insert_secret(
    tx: &mut Tx<'_>,
    keys: &SecretKeys,
    endpoint_id: &str,
    now_ms: i64,
) -> Result<Secret, OutboxError> {
    let secret = Secret::generate();
    let sealed = keys.seal(endpoint_id, &secret)?;
    tx.execute(
        "INSERT INTO webhook_secrets (secret_id, endpoint_id, secret, created_at_ms) VALUES ($1, $2, $3, $4)",
        &[&new_id("sec"), &endpoint_id, &sealed, &now_ms],
    )
    .await?;
    Ok(secret)
}

impl EndpointRow {
    fn into_endpoint(self, event_types: Vec<String>) -> Result<Endpoint, OutboxError> {
        let corrupt = |what: &str| {
            OutboxError::Storage(storage::Error::Corrupt(format!(
                "endpoint {}: {what}",
                self.endpoint_id
            )))
        };
        let enabled = match self.state.as_str() {
            "enabled" => true,
            "disabled" => false,
            _ => return Err(corrupt("unknown state")),
        };
        let limits = EndpointLimits {
            max_in_flight: u32::try_from(self.max_in_flight)
                .map_err(|_| corrupt("max_in_flight out of range"))?,
            rate_per_sec: u32::try_from(self.rate_per_sec)
                .map_err(|_| corrupt("rate_per_sec out of range"))?,
        };
        Ok(Endpoint {
            endpoint_id: self.endpoint_id,
            url: self.url,
            event_types,
            enabled,
            disabled_reason: self.disabled_reason,
            failing_since_ms: self.failing_since_ms,
            limits,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
        })
    }
}
