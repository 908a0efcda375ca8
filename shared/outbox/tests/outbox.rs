//! The webhook tables on SQLite (always) and PostgreSQL (when `TEST_POSTGRES_URL` names a server
//! whose user may create databases; required in CI, reported loudly when missing elsewhere).

use outbox::{
    Attempt, Deliveries, DeliveryOutcome, DeliveryQuery, DeliveryState, DisableRule,
    ENDPOINT_ATTEMPTS_EXHAUSTED, ENDPOINT_PING, Endpoint, EndpointLimits, EndpointUpdate,
    NewEndpoint, NewEvent, ORDER_PAID, ORDER_PAYMENT_DECLINED, OutboxError, RedeliveryLimits,
    RedeliveryRange, SecretKeys, Subscriptions,
};
use serde_json::json;
use std::{
    sync::{Arc, LazyLock},
    time::Duration,
};
use storage::Database;
use webhooks::signature::Secret;

use test_support::{ScratchDatabase, eventually};

const CLIENT: &str = "demo-client-1";
const T0: i64 = 1_800_000_000_000;
const DAY_MS: i64 = 86_400_000;
/// A lease short enough to run out, in real time, within a test.
const LEASE_MS: i64 = 300;
/// Failing for a day, from the second failure on.
const RULE: DisableRule = DisableRule {
    after_ms: DAY_MS,
    after_failures: 2,
};

/// What keeps a test's database alive: the SQLite file's directory, or the PostgreSQL scratch
/// database, dropped with it.
enum Scratch {
    Sqlite { _dir: tempfile::TempDir },
    Postgres { _database: ScratchDatabase },
}

/// A fresh, migrated database of each available backend.
async fn databases() -> Vec<(Database, Scratch)> {
    let dir = tempfile::tempdir().expect("temporary directory");
    let sqlite = Database::open(
        &format!("sqlite://{}", dir.path().join("webhooks.db").display()),
        Default::default(),
        |backend| vec![outbox::migrations(backend)],
    )
    .await
    .expect("sqlite");
    let mut databases = vec![(sqlite, Scratch::Sqlite { _dir: dir })];
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let scratch = ScratchDatabase::create(&admin_url, "outbox").await;
        let postgres = Database::open(scratch.url(), Default::default(), |backend| {
            vec![outbox::migrations(backend)]
        })
        .await
        .expect("postgres database");
        databases.push((postgres, Scratch::Postgres { _database: scratch }));
    }
    databases
}

/// The key that seals the tests' endpoint secrets.
fn keys() -> SecretKeys {
    static KEYS: LazyLock<SecretKeys> = LazyLock::new(|| SecretKeys::generate("test"));
    KEYS.clone()
}

fn subscriptions(database: &Database) -> Subscriptions {
    Subscriptions::new(database.clone(), keys())
}

fn deliveries(database: &Database) -> Deliveries {
    Deliveries::new(database.clone(), keys())
}

async fn endpoint(database: &Database, event_types: &[&str]) -> String {
    endpoint_with(database, event_types, EndpointLimits::default()).await
}

async fn endpoint_with(
    database: &Database,
    event_types: &[&str],
    limits: EndpointLimits,
) -> String {
    let new = NewEndpoint {
        url: "https://hooks.example.com/orders".into(),
        event_types: event_types.iter().map(|t| t.to_string()).collect(),
        limits,
    };
    let (endpoint, _secret) = create(database, CLIENT, new).await.expect("endpoint");
    endpoint.endpoint_id
}

/// Creates `new` for `client` in a transaction of its own.
async fn create(
    database: &Database,
    client: &'static str,
    new: NewEndpoint,
) -> Result<(Endpoint, Secret), OutboxError> {
    let subscriptions = subscriptions(database);
    database
        .write(async move |tx| subscriptions.create_endpoint(tx, client, &new, T0).await)
        .await
}

/// Rotates the endpoint's secret in a transaction of its own; the new secret.
async fn rotate(database: &Database, endpoint_id: &str, overlap_ms: i64, now_ms: i64) -> Secret {
    let (subscriptions, endpoint_id) = (subscriptions(database), endpoint_id.to_owned());
    database
        .write(async move |tx| {
            subscriptions
                .rotate_secret(tx, CLIENT, &endpoint_id, overlap_ms, now_ms)
                .await
        })
        .await
        .expect("rotate")
}

/// Commits an `order.paid` event; its id, or `None` when no endpoint subscribes (nothing kept).
async fn record_paid(database: &Database, now_ms: i64) -> Option<String> {
    database
        .write(async move |tx| {
            let data = json!({"order_id": "ord_1"});
            outbox::record(
                tx,
                CLIENT,
                &NewEvent {
                    event_type: ORDER_PAID,
                    version: 2,
                    data: &data,
                },
                now_ms,
            )
            .await
        })
        .await
        .expect("record")
}

async fn paid(database: &Database, now_ms: i64) -> String {
    record_paid(database, now_ms)
        .await
        .expect("an endpoint subscribes")
}

async fn count(database: &Database, table: &'static str) -> i64 {
    let (n,): (i64,) = database
        .fetch_one(&format!("SELECT COUNT(*) FROM {table}"), &[])
        .await
        .expect("count");
    n
}

fn answered(status: u16, at: i64) -> Attempt {
    Attempt {
        started_at_ms: at,
        duration_ms: 3,
        status_code: Some(status),
        error: (status >= 300).then(|| format!("answered {status}")),
    }
}

/// As statements, an event writes what `record` writes, and nothing when its condition fails.
#[tokio::test]
async fn an_event_as_statements_is_written_only_when_its_condition_holds() {
    for (database, _scratch) in databases().await {
        endpoint(&database, &[ORDER_PAID]).await;
        for (when, written) in [("1 = 0", 0), ("1 = 1", 1)] {
            let data = json!({"order_id": "ord_1"});
            let statements = outbox::record_statements(
                CLIENT,
                &NewEvent {
                    event_type: ORDER_PAID,
                    version: 2,
                    data: &data,
                },
                T0,
                when,
            )
            .unwrap();
            database
                .write(async move |tx| {
                    for statement in &statements {
                        tx.execute(statement.sql(), &statement.params()).await?;
                    }
                    Ok::<_, storage::Error>(())
                })
                .await
                .unwrap();
            assert_eq!(
                count(&database, "webhook_events").await,
                written,
                "when {when}"
            );
            assert_eq!(
                count(&database, "webhook_deliveries").await,
                written,
                "when {when}"
            );
        }
    }
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_event_and_no_delivery() {
    for (database, _scratch) in databases().await {
        endpoint(&database, &[ORDER_PAID]).await;
        let rolled_back = database
            .write(async |tx| {
                let data = json!({"order_id": "ord_1"});
                outbox::record(
                    tx,
                    CLIENT,
                    &NewEvent {
                        event_type: ORDER_PAID,
                        version: 2,
                        data: &data,
                    },
                    T0,
                )
                .await?;
                Err::<(), _>(OutboxError::Invalid(
                    "the state change failed after the event was recorded".into(),
                ))
            })
            .await;
        assert!(
            matches!(rolled_back, Err(OutboxError::Invalid(_))),
            "{rolled_back:?}"
        );
        assert_eq!(count(&database, "webhook_events").await, 0);
        assert_eq!(count(&database, "webhook_deliveries").await, 0);

        paid(&database, T0).await;
        assert_eq!(count(&database, "webhook_events").await, 1);
        assert_eq!(
            count(&database, "webhook_deliveries").await,
            1,
            "one delivery per subscribed endpoint"
        );
    }
}

#[tokio::test]
async fn events_reach_only_enabled_endpoints_of_the_client_that_subscribe_to_their_type() {
    for (database, _scratch) in databases().await {
        let subscribed = endpoint(&database, &[ORDER_PAID]).await;
        endpoint(&database, &[outbox::ORDER_PAYMENT_DECLINED]).await;
        let disabled = endpoint(&database, &[ORDER_PAID]).await;
        let subscriptions = subscriptions(&database);
        subscriptions
            .set_enabled(CLIENT, &disabled, false)
            .await
            .expect("disable");
        paid(&database, T0).await;
        let due = deliveries(&database).due_endpoints(T0).await.expect("due");
        assert_eq!(
            due.iter()
                .map(|e| e.endpoint_id.as_str())
                .collect::<Vec<_>>(),
            [subscribed.as_str()]
        );
        assert!(
            subscriptions
                .endpoint("another-client", &subscribed)
                .await
                .is_err(),
            "endpoints are scoped per client"
        );
    }
}

#[tokio::test]
async fn a_claimed_delivery_is_nobody_elses_until_its_lease_runs_out_on_the_databases_clock() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let event_id = paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let first = deliveries
            .claim(&endpoint_id, T0, LEASE_MS)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(
            (first.event_id.as_str(), first.attempt),
            (event_id.as_str(), 1)
        );
        // A sender whose clock runs a day ahead still sees the lease: leases are on the
        // database's clock, not the claimer's.
        assert!(
            deliveries
                .claim(&endpoint_id, T0 + DAY_MS, LEASE_MS)
                .await
                .expect("claim")
                .is_none(),
            "leased"
        );

        // The first sender died after sending: its lease runs out, and the delivery goes out again
        // as the same event.
        let second = eventually(Duration::from_secs(5), "the lease runs out", || async {
            deliveries
                .claim(&endpoint_id, T0, LEASE_MS)
                .await
                .expect("claim")
        })
        .await;
        assert_eq!(
            (second.event_id.as_str(), second.attempt),
            (event_id.as_str(), 2)
        );
        let late = deliveries
            .finish(
                &first,
                &answered(200, T0),
                DeliveryOutcome::Delivered,
                RULE,
                T0 + 30_001,
            )
            .await
            .expect("finish");
        assert!(
            late.lease_lost,
            "a lease taken over is not the first sender's to finish"
        );
        let finished = deliveries
            .finish(
                &second,
                &answered(200, T0 + 30_000),
                DeliveryOutcome::Delivered,
                RULE,
                T0 + 30_002,
            )
            .await
            .expect("finish");
        assert!(!finished.lease_lost);

        let log = subscriptions(&database)
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert_eq!(log[0].state, DeliveryState::Delivered);
        assert_eq!(
            log[0]
                .attempts
                .iter()
                .map(|a| a.attempt)
                .collect::<Vec<_>>(),
            [1, 2],
            "both attempts are logged"
        );
    }
}

#[tokio::test]
async fn concurrent_claims_never_share_a_delivery() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint_with(&database, &[ORDER_PAID], EndpointLimits::MAX).await;
        for n in 0..20 {
            paid(&database, T0 + n).await;
        }
        let claimers = (0..4).map(|_| {
            let deliveries = deliveries(&database);
            let endpoint_id = endpoint_id.clone();
            tokio::spawn(async move {
                let mut mine = Vec::new();
                while let Some(claim) = deliveries
                    .claim(&endpoint_id, T0 + 1_000, 30_000)
                    .await
                    .expect("claim")
                {
                    mine.push(claim.event_id);
                }
                mine
            })
        });
        let mut claimed: Vec<String> = Vec::new();
        for claimer in claimers {
            claimed.extend(claimer.await.expect("claimer"));
        }
        let total = claimed.len();
        claimed.sort();
        claimed.dedup();
        assert_eq!(
            (total, claimed.len()),
            (20, 20),
            "every delivery claimed exactly once"
        );
    }
}

#[tokio::test]
async fn the_schedule_runs_out_into_undelivered_and_a_redelivery_keeps_the_event_id() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let event_id = paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let claim = deliveries
            .claim(&endpoint_id, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        deliveries
            .finish(
                &claim,
                &answered(500, T0),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 5_000),
                },
                RULE,
                T0,
            )
            .await
            .expect("finish");
        assert!(
            deliveries
                .claim(&endpoint_id, T0 + 4_999, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "not due yet"
        );
        let claim = deliveries
            .claim(&endpoint_id, T0 + 5_000, 30_000)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(claim.schedule_step, 1);
        deliveries
            .finish(
                &claim,
                &answered(500, T0 + 5_000),
                DeliveryOutcome::Failed { retry_at_ms: None },
                RULE,
                T0 + 5_000,
            )
            .await
            .expect("finish");
        let subscriptions = subscriptions(&database);
        let log = subscriptions
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert_eq!(
            (log[0].state, log[0].attempts.len()),
            (DeliveryState::Undelivered, 2)
        );
        assert!(
            deliveries
                .claim(&endpoint_id, T0 + DAY_MS, 30_000)
                .await
                .expect("claim")
                .is_none()
        );

        subscriptions
            .redeliver(CLIENT, &endpoint_id, &event_id, T0 + 10_000)
            .await
            .expect("redeliver");
        let again = deliveries
            .claim(&endpoint_id, T0 + 10_000, 30_000)
            .await
            .expect("claim")
            .expect("due again");
        assert_eq!(
            (again.event_id.as_str(), again.schedule_step, again.attempt),
            (event_id.as_str(), 0, 3)
        );
    }
}

#[tokio::test]
async fn a_pause_holds_every_delivery_of_the_endpoint_for_every_sender_and_only_grows() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        paid(&database, T0).await;
        let one = deliveries(&database);
        let claim = one
            .claim(&endpoint_id, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let pause = DeliveryOutcome::Paused {
            retry_at_ms: Some(T0 + 60_000),
            until_ms: T0 + 60_000,
        };
        one.finish(&claim, &answered(429, T0), pause, RULE, T0)
            .await
            .expect("finish");
        // A shorter pause recorded later does not cut the first one short.
        paid(&database, T0 + 1).await;
        let two = deliveries(&database);
        assert!(
            two.claim(&endpoint_id, T0 + 1, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "another sender sees the pause"
        );
        assert!(
            two.due_endpoints(T0 + 59_999)
                .await
                .expect("due")
                .is_empty(),
            "nothing is due while paused"
        );
        assert_eq!(
            two.next_due_ms().await.expect("next due"),
            Some(T0 + 60_000)
        );
        let resumed = two
            .claim(&endpoint_id, T0 + 60_000, 30_000)
            .await
            .expect("claim")
            .expect("the pause is over");
        let shorter = DeliveryOutcome::Paused {
            retry_at_ms: Some(T0 + 61_000),
            until_ms: T0 + 10_000,
        };
        two.finish(
            &resumed,
            &answered(429, T0 + 60_000),
            shorter,
            RULE,
            T0 + 60_000,
        )
        .await
        .expect("finish");
        assert_eq!(
            one.due_endpoints(T0 + 60_000).await.expect("due").len(),
            1,
            "the pause ended; the other event is due"
        );
        let longer = one
            .claim(&endpoint_id, T0 + 60_000, 30_000)
            .await
            .expect("claim")
            .expect("due");
        one.finish(
            &longer,
            &answered(503, T0 + 60_000),
            DeliveryOutcome::Paused {
                retry_at_ms: None,
                until_ms: T0 + 120_000,
            },
            RULE,
            T0 + 60_000,
        )
        .await
        .expect("finish");
        assert!(
            two.due_endpoints(T0 + 119_999)
                .await
                .expect("due")
                .is_empty()
        );
        assert_eq!(two.due_endpoints(T0 + 120_000).await.expect("due").len(), 1);
    }
}

#[tokio::test]
async fn an_endpoint_failing_for_a_day_or_gone_is_disabled_and_its_owner_told() {
    for (database, _scratch) in databases().await {
        let failing = endpoint(&database, &[ORDER_PAID]).await;
        let owner = endpoint(&database, &[outbox::ENDPOINT_DISABLED]).await;
        let deliveries = deliveries(&database);
        paid(&database, T0).await;
        let claim = deliveries
            .claim(&failing, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let first = deliveries
            .finish(
                &claim,
                &answered(503, T0),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + DAY_MS),
                },
                RULE,
                T0,
            )
            .await
            .expect("finish");
        assert_eq!(first.endpoint_disabled, None);
        let claim = deliveries
            .claim(&failing, T0 + DAY_MS, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let last = deliveries
            .finish(
                &claim,
                &answered(503, T0 + DAY_MS),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 2 * DAY_MS),
                },
                RULE,
                T0 + DAY_MS,
            )
            .await
            .expect("finish");
        assert!(
            last.endpoint_disabled.is_some(),
            "failing for a day disables"
        );
        let subscriptions = subscriptions(&database);
        assert!(
            !subscriptions
                .endpoint(CLIENT, &failing)
                .await
                .expect("endpoint")
                .enabled
        );
        let told = subscriptions
            .deliveries(CLIENT, &owner, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert_eq!(
            told.iter()
                .map(|d| d.event_type.as_str())
                .collect::<Vec<_>>(),
            [outbox::ENDPOINT_DISABLED]
        );

        // Enabled again, it starts afresh and its waiting delivery goes out.
        subscriptions
            .set_enabled(CLIENT, &failing, true)
            .await
            .expect("enable");
        let claim = deliveries
            .claim(&failing, T0 + 2 * DAY_MS, 30_000)
            .await
            .expect("claim")
            .expect("waiting delivery");
        let gone = deliveries
            .finish(
                &claim,
                &answered(410, T0 + 2 * DAY_MS),
                DeliveryOutcome::Gone {
                    retry_at_ms: Some(T0 + 3 * DAY_MS),
                },
                RULE,
                T0 + 2 * DAY_MS,
            )
            .await
            .expect("finish");
        assert!(
            gone.endpoint_disabled
                .expect("410 disables")
                .contains("410")
        );
    }
}

/// Fails the endpoint's oldest due delivery at `now_ms`, due again a minute later; whether that
/// disabled the endpoint.
async fn fail_one(
    deliveries: &Deliveries,
    endpoint_id: &str,
    rule: DisableRule,
    now_ms: i64,
) -> bool {
    let claim = deliveries
        .claim(endpoint_id, now_ms, 30_000)
        .await
        .expect("claim")
        .expect("due");
    let outcome = DeliveryOutcome::Failed {
        retry_at_ms: Some(now_ms + 60_000),
    };
    deliveries
        .finish(&claim, &answered(500, now_ms), outcome, rule, now_ms)
        .await
        .expect("finish")
        .endpoint_disabled
        .is_some()
}

#[tokio::test]
async fn an_endpoint_is_disabled_only_after_failing_for_days_and_often() {
    for (database, _scratch) in databases().await {
        let rule = DisableRule {
            after_ms: 5 * DAY_MS,
            after_failures: 10,
        };
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        paid(&database, T0).await;
        let deliveries = deliveries(&database);
        assert!(!fail_one(&deliveries, &endpoint_id, rule, T0).await);
        // A quiet week: one more failure six days later is not enough.
        assert!(
            !fail_one(&deliveries, &endpoint_id, rule, T0 + 6 * DAY_MS).await,
            "two failures in six days"
        );
        // A success starts afresh: eight failures more (ten since the first) do not disable it.
        paid(&database, T0 + 6 * DAY_MS).await;
        deliver_one(&deliveries, &endpoint_id, T0 + 6 * DAY_MS + 60_000).await;
        let mut now_ms = T0 + 6 * DAY_MS + 60_000;
        for _ in 0..9 {
            assert!(
                !fail_one(&deliveries, &endpoint_id, rule, now_ms).await,
                "failing since the success, not for five days yet"
            );
            now_ms += DAY_MS / 2;
        }
        // Five days and ten failures since the success.
        assert!(
            fail_one(&deliveries, &endpoint_id, rule, T0 + 11 * DAY_MS + 60_000).await,
            "failing for five days, ten times"
        );
        let endpoint = subscriptions(&database)
            .endpoint(CLIENT, &endpoint_id)
            .await
            .expect("endpoint");
        assert!(!endpoint.enabled);
        assert!(
            endpoint
                .disabled_reason
                .expect("a reason")
                .contains("(10) for 432000 s")
        );
    }
}

#[tokio::test]
async fn a_rotated_secret_signs_beside_the_old_one_until_the_overlap_ends() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        rotate(&database, &endpoint_id, DAY_MS, T0 + 1).await;
        paid(&database, T0 + 2).await;
        let deliveries = deliveries(&database);
        let during = deliveries
            .claim(&endpoint_id, T0 + 2, 30_000)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(
            during.secrets.len(),
            2,
            "old and new sign during the overlap"
        );
        deliveries
            .finish(
                &during,
                &answered(500, T0 + 2),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 1 + DAY_MS),
                },
                DisableRule {
                    after_ms: 2 * DAY_MS,
                    ..RULE
                },
                T0 + 2,
            )
            .await
            .expect("finish");
        let after = deliveries
            .claim(&endpoint_id, T0 + 1 + DAY_MS, 30_000)
            .await
            .expect("claim")
            .expect("due again");
        assert_eq!(after.secrets.len(), 1, "only the new one after it");
        assert_eq!(
            after.secrets[0].to_string(),
            during.secrets[0].to_string(),
            "the newest signs first"
        );
    }
}

#[tokio::test]
async fn rotations_keep_the_current_secret_and_one_previous_at_most() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let mut rotated = Vec::new();
        for n in 1..=4 {
            rotated.push(
                rotate(&database, &endpoint_id, 30 * DAY_MS, T0 + n)
                    .await
                    .to_string(),
            );
        }
        paid(&database, T0 + 10).await;
        let claim = deliveries(&database)
            .claim(&endpoint_id, T0 + 10, 1)
            .await
            .expect("claim")
            .expect("due");
        let signing: Vec<String> = claim.secrets.iter().map(ToString::to_string).collect();
        assert_eq!(
            signing,
            [rotated[3].clone(), rotated[2].clone()],
            "the newest and the one before it, nothing older"
        );
        assert_eq!(
            count(&database, "webhook_secrets").await,
            2,
            "older secrets are not kept"
        );
    }
}

#[tokio::test]
async fn a_long_error_is_stored_cut_to_a_kilobyte() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let claim = deliveries
            .claim(&endpoint_id, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let huge = Attempt {
            error: Some("é".repeat(200_000)),
            ..answered(302, T0)
        };
        deliveries
            .finish(
                &claim,
                &huge,
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 5_000),
                },
                RULE,
                T0,
            )
            .await
            .expect("finish");
        let log = subscriptions(&database)
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(1))
            .await
            .expect("log")
            .deliveries;
        let stored = log[0].attempts[0].error.clone().expect("an error");
        assert!(
            stored.len() <= 1_024 && stored.len() > 1_000,
            "{} bytes",
            stored.len()
        );
        assert!(
            stored.ends_with("é…"),
            "cut on a character boundary, and marked"
        );
    }
}

#[tokio::test]
async fn redelivering_a_range_includes_events_missed_while_disabled_but_none_from_before_the_endpoint()
 {
    for (database, _scratch) in databases().await {
        assert_eq!(
            record_paid(&database, T0 - 5).await,
            None,
            "an event nobody subscribes to is not kept"
        );
        assert_eq!(count(&database, "webhook_events").await, 0);
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let subscriptions = subscriptions(&database);
        paid(&database, T0 + 10).await;
        subscriptions
            .set_enabled(CLIENT, &endpoint_id, false)
            .await
            .expect("disable");
        paid(&database, T0 + 20).await;
        paid(&database, T0 + 30).await;
        subscriptions
            .set_enabled(CLIENT, &endpoint_id, true)
            .await
            .expect("enable");
        let range = RedeliveryRange {
            from_ms: T0 - 10,
            until_ms: T0 + 30,
            include_delivered: false,
        };
        let queued = subscriptions
            .redeliver_range(
                CLIENT,
                &endpoint_id,
                range,
                RedeliveryLimits::default(),
                T0 + 40,
            )
            .await
            .expect("range");
        assert_eq!(
            queued, 2,
            "the one it was sent and the one it missed; not the one from before it, nor the one after the range"
        );
        let deliveries = deliveries(&database);
        assert_eq!(
            deliveries
                .redeliver_next_batch(100, T0 + 41)
                .await
                .expect("batch"),
            Some(2)
        );
        assert_eq!(
            deliveries
                .redeliver_next_batch(100, T0 + 42)
                .await
                .expect("batch"),
            None,
            "the range is done"
        );
        assert_eq!(
            count(&database, "webhook_deliveries").await,
            2,
            "the missed one in the range inserted, not the one after it"
        );
    }
}

/// Delivers the endpoint's oldest due delivery.
async fn deliver_one(deliveries: &Deliveries, endpoint_id: &str, now_ms: i64) -> String {
    let claim = deliveries
        .claim(endpoint_id, now_ms, 30_000)
        .await
        .expect("claim")
        .expect("due");
    deliveries
        .finish(
            &claim,
            &answered(204, now_ms),
            DeliveryOutcome::Delivered,
            RULE,
            now_ms,
        )
        .await
        .expect("finish");
    claim.event_id
}

#[tokio::test]
async fn a_range_redelivery_runs_in_batches_and_skips_delivered_events_unless_asked() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        for n in 0..5 {
            paid(&database, T0 + n).await;
        }
        let deliveries = deliveries(&database);
        let delivered = [
            deliver_one(&deliveries, &endpoint_id, T0 + 10).await,
            deliver_one(&deliveries, &endpoint_id, T0 + 10).await,
        ];
        let subscriptions = subscriptions(&database);
        let limits = RedeliveryLimits::default();
        let range = RedeliveryRange {
            from_ms: T0,
            until_ms: T0 + 5,
            include_delivered: false,
        };
        assert_eq!(
            subscriptions
                .redeliver_range(CLIENT, &endpoint_id, range, limits, T0 + 20)
                .await
                .expect("range"),
            3
        );
        let busy = subscriptions
            .redeliver_range(CLIENT, &endpoint_id, range, limits, T0 + 20)
            .await;
        assert!(
            matches!(busy, Err(OutboxError::Busy(_))),
            "one range at a time per endpoint: {busy:?}"
        );

        let mut ran = Vec::new();
        for now_ms in T0 + 21..T0 + 24 {
            ran.push(
                deliveries
                    .redeliver_next_batch(2, now_ms)
                    .await
                    .expect("batch"),
            );
        }
        assert_eq!(ran, [Some(2), Some(1), None], "batches of two, then done");
        let log = subscriptions
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        for delivery in &log {
            let expected = if delivered.contains(&delivery.event_id) {
                DeliveryState::Delivered
            } else {
                DeliveryState::Pending
            };
            assert_eq!(delivery.state, expected, "{}", delivery.event_id);
        }

        let everything = RedeliveryRange {
            include_delivered: true,
            ..range
        };
        assert_eq!(
            subscriptions
                .redeliver_range(CLIENT, &endpoint_id, everything, limits, T0 + 30)
                .await
                .expect("range again"),
            5,
            "the last range is done"
        );
        while deliveries
            .redeliver_next_batch(2, T0 + 31)
            .await
            .expect("batch")
            .is_some()
        {}
        let log = subscriptions
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert!(
            log.iter()
                .all(|delivery| delivery.state == DeliveryState::Pending),
            "delivered ones too, when asked"
        );
    }
}

#[tokio::test]
async fn the_delivery_log_pages_with_a_cursor_and_filters() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let mut events = Vec::new();
        for n in 0..5 {
            events.push(paid(&database, T0 + n).await);
        }
        let deliveries = deliveries(&database);
        let delivered = deliver_one(&deliveries, &endpoint_id, T0 + 10).await;
        let subscriptions = subscriptions(&database);
        let mut query = DeliveryQuery::newest(2);
        let mut pages = Vec::new();
        loop {
            let page = subscriptions
                .deliveries(CLIENT, &endpoint_id, &query)
                .await
                .expect("page");
            pages.push(
                page.deliveries
                    .iter()
                    .map(|delivery| delivery.event_id.clone())
                    .collect::<Vec<_>>(),
            );
            let Some(next) = page.next else { break };
            query.after = Some(next.to_string().parse().expect("a cursor reads back"));
        }
        events.reverse();
        assert_eq!(
            pages,
            [&events[0..2], &events[2..4], &events[4..5]],
            "newest first, two at a time"
        );

        let only_delivered = DeliveryQuery {
            state: Some(DeliveryState::Delivered),
            ..DeliveryQuery::newest(10)
        };
        let page = subscriptions
            .deliveries(CLIENT, &endpoint_id, &only_delivered)
            .await
            .expect("filtered");
        assert_eq!(
            page.deliveries
                .iter()
                .map(|delivery| (delivery.event_id.as_str(), delivery.attempts.len()))
                .collect::<Vec<_>>(),
            [(delivered.as_str(), 1)]
        );
        let other_type = DeliveryQuery {
            event_type: Some(outbox::ORDER_PAYMENT_DECLINED.into()),
            ..DeliveryQuery::newest(10)
        };
        assert_eq!(
            subscriptions
                .deliveries(CLIENT, &endpoint_id, &other_type)
                .await
                .expect("filtered")
                .deliveries,
            []
        );
        assert!("nonsense".parse::<outbox::LogCursor>().is_err());
    }
}

#[tokio::test]
async fn events_past_retention_are_reaped_in_batches_unless_still_being_delivered() {
    const RETENTION_MS: i64 = 30 * DAY_MS;
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let deliveries = deliveries(&database);
        let subscriptions = subscriptions(&database);
        let delivered = [paid(&database, T0).await, paid(&database, T0 + 1).await];
        for _ in &delivered {
            deliver_one(&deliveries, &endpoint_id, T0 + 10).await;
        }
        let pending = paid(&database, T0 + 2).await;
        let leased = paid(&database, T0 + 3).await;
        // Claimed, due again later: leased and pending, and after the lease only pending.
        let claim = deliveries
            .claim(&endpoint_id, T0 + 10, 30_000)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(claim.event_id, pending);
        deliveries
            .finish(
                &claim,
                &answered(500, T0 + 10),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 40 * DAY_MS),
                },
                RULE,
                T0 + 10,
            )
            .await
            .expect("finish");
        deliveries
            .claim(&endpoint_id, T0 + 10, 30_000)
            .await
            .expect("claim")
            .expect("the leased one");
        let recent = paid(&database, T0 + 20 * DAY_MS).await;

        assert_eq!(
            deliveries
                .reap_expired(RETENTION_MS, 1, T0 + RETENTION_MS)
                .await
                .expect("reap"),
            0,
            "nothing is past retention yet"
        );
        assert_eq!(
            deliveries
                .reap_expired(RETENTION_MS, 1, T0 + RETENTION_MS + 10)
                .await
                .expect("reap"),
            2,
            "the delivered two, one per batch"
        );
        let left = |log: Vec<outbox::DeliveryLog>| {
            let mut ids: Vec<String> = log.into_iter().map(|delivery| delivery.event_id).collect();
            ids.sort();
            ids
        };
        let mut kept = vec![pending.clone(), leased.clone(), recent.clone()];
        kept.sort();
        assert_eq!(
            left(
                subscriptions
                    .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
                    .await
                    .expect("log")
                    .deliveries
            ),
            kept
        );
        assert_eq!(
            count(&database, "webhook_attempts").await,
            1,
            "the reaped deliveries' attempts went with them"
        );

        // Disabled, the endpoint sends nothing: its pending deliveries no longer keep their events.
        subscriptions
            .set_enabled(CLIENT, &endpoint_id, false)
            .await
            .expect("disable");
        assert_eq!(
            deliveries
                .reap_expired(RETENTION_MS, 10, T0 + RETENTION_MS + 10)
                .await
                .expect("reap"),
            1,
            "the pending one; the leased one stays"
        );
        assert_eq!(count(&database, "webhook_events").await, 2);
    }
}

#[tokio::test]
async fn a_range_redelivery_beyond_its_caps_is_refused_and_names_the_cap() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        for n in 0..3 {
            paid(&database, T0 + n).await;
        }
        let subscriptions = subscriptions(&database);
        let limits = RedeliveryLimits {
            max_days: 1,
            max_events: 2,
        };
        let too_long = RedeliveryRange {
            from_ms: T0 - DAY_MS,
            until_ms: T0 + 1,
            include_delivered: false,
        };
        let error = subscriptions
            .redeliver_range(CLIENT, &endpoint_id, too_long, limits, T0 + 10)
            .await
            .expect_err("longer than a day");
        assert!(error.to_string().contains("at most 1 days"), "{error}");
        let too_many = RedeliveryRange {
            from_ms: T0,
            until_ms: T0 + 3,
            include_delivered: false,
        };
        let error = subscriptions
            .redeliver_range(CLIENT, &endpoint_id, too_many, limits, T0 + 10)
            .await
            .expect_err("three events");
        assert!(
            error.to_string().contains("more than 2 deliveries"),
            "{error}"
        );
        assert_eq!(
            count(&database, "webhook_redeliveries").await,
            0,
            "nothing stored"
        );
        let two = RedeliveryRange {
            from_ms: T0,
            until_ms: T0 + 2,
            include_delivered: false,
        };
        assert_eq!(
            subscriptions
                .redeliver_range(CLIENT, &endpoint_id, two, limits, T0 + 10)
                .await
                .expect("within the caps"),
            2
        );
    }
}

#[tokio::test]
async fn a_redelivery_during_an_attempt_is_not_undone_by_the_attempts_outcome() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let event_id = paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let in_flight = deliveries
            .claim(&endpoint_id, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let subscriptions = subscriptions(&database);
        subscriptions
            .redeliver(CLIENT, &endpoint_id, &event_id, T0 + 1)
            .await
            .expect("redeliver");

        let finished = deliveries
            .finish(
                &in_flight,
                &answered(410, T0),
                DeliveryOutcome::Gone {
                    retry_at_ms: Some(T0 + 5_000),
                },
                RULE,
                T0 + 2,
            )
            .await
            .expect("finish");
        assert!(finished.lease_lost, "the redelivery took the lease away");
        assert_eq!(
            finished.endpoint_disabled, None,
            "a lost lease changes nothing of the endpoint"
        );
        assert!(
            subscriptions
                .endpoint(CLIENT, &endpoint_id)
                .await
                .expect("endpoint")
                .enabled
        );
        let again = deliveries
            .claim(&endpoint_id, T0 + 2, 30_000)
            .await
            .expect("claim")
            .expect("the redelivery is due now");
        assert_eq!(again.event_id, event_id);
        let log = subscriptions
            .deliveries(CLIENT, &endpoint_id, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert_eq!(log[0].attempts.len(), 1, "the attempt itself is logged");
    }
}

#[tokio::test]
async fn claims_of_every_sender_together_keep_to_the_endpoints_concurrency_limit() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint_with(
            &database,
            &[ORDER_PAID],
            EndpointLimits {
                max_in_flight: 2,
                rate_per_sec: 50,
            },
        )
        .await;
        for n in 0..3 {
            paid(&database, T0 + n).await;
        }
        // Two senders, each with its own view: the third claim waits for a slot.
        let (one, two) = (deliveries(&database), deliveries(&database));
        let first = one
            .claim(&endpoint_id, T0 + 10, 30_000)
            .await
            .expect("claim")
            .expect("a slot");
        two.claim(&endpoint_id, T0 + 10, 30_000)
            .await
            .expect("claim")
            .expect("the second slot");
        assert!(
            one.claim(&endpoint_id, T0 + 10, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "two in flight already"
        );
        one.finish(
            &first,
            &answered(204, T0 + 10),
            DeliveryOutcome::Delivered,
            RULE,
            T0 + 11,
        )
        .await
        .expect("finish");
        assert!(
            two.claim(&endpoint_id, T0 + 11, 30_000)
                .await
                .expect("claim")
                .is_some(),
            "a slot came free"
        );
    }
}

#[tokio::test]
async fn a_client_has_a_bounded_number_of_endpoints() {
    for (database, _scratch) in databases().await {
        for _ in 0..outbox::MAX_ENDPOINTS_PER_CLIENT {
            endpoint(&database, &[ORDER_PAID]).await;
        }
        let new = NewEndpoint {
            url: "https://hooks.example.com/one-more".into(),
            event_types: vec![ORDER_PAID.into()],
            limits: EndpointLimits::default(),
        };
        let refused = create(&database, CLIENT, new.clone())
            .await
            .expect_err("over the bound");
        assert!(refused.to_string().contains("at most"), "{refused}");
        create(&database, "another-client", new)
            .await
            .expect("the bound is per client");
    }
}

/// Two creations at once for the last place, each in its own transaction, both holding it open
/// after counting: under READ COMMITTED each would count only its own new row, unless they take
/// turns (then the second waits for the first's commit, and its own wait for the first times out).
#[tokio::test]
async fn two_creations_at_once_do_not_both_take_the_last_place() {
    for (database, _scratch) in databases().await {
        for _ in 1..outbox::MAX_ENDPOINTS_PER_CLIENT {
            endpoint(&database, &[ORDER_PAID]).await;
        }
        let both_counted = Arc::new(tokio::sync::Barrier::new(2));
        let mut creations = tokio::task::JoinSet::new();
        for n in 0..2 {
            let (database, both_counted) = (database.clone(), both_counted.clone());
            creations.spawn(async move {
                let new = NewEndpoint {
                    url: format!("https://hooks.example.com/last-{n}"),
                    event_types: vec![ORDER_PAID.into()],
                    limits: EndpointLimits::default(),
                };
                let subscriptions = subscriptions(&database);
                // A creation refused is rolled back; one made commits after the wait.
                let created = database
                    .write(async move |tx| {
                        let created = subscriptions.create_endpoint(tx, CLIENT, &new, T0).await;
                        let _ =
                            tokio::time::timeout(Duration::from_millis(500), both_counted.wait())
                                .await;
                        created
                    })
                    .await;
                created.is_ok()
            });
        }
        let created = creations
            .join_all()
            .await
            .into_iter()
            .filter(|created| *created)
            .count();
        assert_eq!(created, 1, "{:?}", database.backend());
        assert_eq!(
            count(&database, "webhook_endpoints").await,
            i64::from(outbox::MAX_ENDPOINTS_PER_CLIENT),
            "{:?}",
            database.backend()
        );
    }
}

#[test]
fn an_update_is_vetted_as_a_creation_is() {
    let policy = webhooks::ssrf::DestinationPolicy::default();
    let mut moved = EndpointUpdate {
        url: Some("https://Hooks.Example.com:443/new".into()),
        ..EndpointUpdate::default()
    };
    moved.validate(&policy).expect("a public https URL");
    assert_eq!(
        moved.url.as_deref(),
        Some("https://hooks.example.com/new"),
        "normalised as on creation"
    );
    for (mut update, field) in [
        (EndpointUpdate::default(), "body"),
        (
            EndpointUpdate {
                url: Some("http://hooks.example.com/".into()),
                ..EndpointUpdate::default()
            },
            "url",
        ),
        (
            EndpointUpdate {
                url: Some("https://10.0.0.1/".into()),
                ..EndpointUpdate::default()
            },
            "url",
        ),
        (
            EndpointUpdate {
                event_types: Some(vec![]),
                ..EndpointUpdate::default()
            },
            "event_types",
        ),
        (
            EndpointUpdate {
                event_types: Some(vec!["order.shipped".into()]),
                ..EndpointUpdate::default()
            },
            "event_types",
        ),
        (
            EndpointUpdate {
                event_types: Some(vec![ENDPOINT_PING.into()]),
                ..EndpointUpdate::default()
            },
            "event_types",
        ),
        (
            EndpointUpdate {
                max_in_flight: Some(0),
                ..EndpointUpdate::default()
            },
            "max_in_flight",
        ),
        (
            EndpointUpdate {
                rate_per_sec: Some(1_001),
                ..EndpointUpdate::default()
            },
            "rate_per_sec",
        ),
    ] {
        let error = update.validate(&policy).expect_err(field).to_string();
        assert!(error.contains(&format!("{field}: ")), "{field}: {error}");
    }
}

#[tokio::test]
async fn an_update_changes_only_what_it_names_and_routes_new_events_by_the_new_types() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        let subscriptions = subscriptions(&database);
        let limits = EndpointUpdate {
            max_in_flight: Some(8),
            ..EndpointUpdate::default()
        };
        let updated = subscriptions
            .update_endpoint(CLIENT, &endpoint_id, &limits, T0 + 1)
            .await
            .expect("update");
        assert_eq!(
            (updated.limits, updated.updated_at_ms),
            (
                EndpointLimits {
                    max_in_flight: 8,
                    rate_per_sec: 50
                },
                T0 + 1
            )
        );
        assert_eq!(
            (updated.url.as_str(), updated.event_types.clone()),
            (
                "https://hooks.example.com/orders",
                vec![ORDER_PAID.to_owned()]
            )
        );

        let types = EndpointUpdate {
            event_types: Some(vec![
                ORDER_PAYMENT_DECLINED.into(),
                ORDER_PAYMENT_DECLINED.into(),
            ]),
            ..EndpointUpdate::default()
        };
        let updated = subscriptions
            .update_endpoint(CLIENT, &endpoint_id, &types, T0 + 2)
            .await
            .expect("update");
        assert_eq!(
            updated.event_types,
            [ORDER_PAYMENT_DECLINED],
            "replaced, each once"
        );
        assert_eq!(
            updated.limits.max_in_flight, 8,
            "what it does not name stays"
        );
        assert_eq!(
            record_paid(&database, T0 + 3).await,
            None,
            "no longer subscribed to order.paid"
        );

        let moved = EndpointUpdate {
            url: Some("https://other.example.com/hooks".into()),
            ..EndpointUpdate::default()
        };
        let updated = subscriptions
            .update_endpoint(CLIENT, &endpoint_id, &moved, T0 + 4)
            .await
            .expect("update");
        assert_eq!(
            (
                updated.url.as_str(),
                updated.updated_at_ms,
                updated.created_at_ms
            ),
            ("https://other.example.com/hooks", T0 + 4, T0)
        );
        assert_eq!(
            subscriptions
                .endpoint(CLIENT, &endpoint_id)
                .await
                .expect("endpoint"),
            updated,
            "as stored"
        );

        let refused = subscriptions
            .update_endpoint("another-client", &endpoint_id, &moved, T0 + 5)
            .await;
        assert!(
            matches!(refused, Err(OutboxError::EndpointNotFound(_))),
            "another client's endpoint: {refused:?}"
        );
    }
}

#[tokio::test]
async fn a_new_url_forgets_the_old_ones_failures_and_pause() {
    for (database, _scratch) in databases().await {
        let endpoint_id = endpoint(&database, &[ORDER_PAID]).await;
        paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let claim = deliveries
            .claim(&endpoint_id, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        let pause = DeliveryOutcome::Paused {
            retry_at_ms: Some(T0 + 1),
            until_ms: T0 + DAY_MS,
        };
        deliveries
            .finish(&claim, &answered(429, T0), pause, RULE, T0)
            .await
            .expect("finish");
        let subscriptions = subscriptions(&database);
        assert!(
            subscriptions
                .endpoint(CLIENT, &endpoint_id)
                .await
                .expect("endpoint")
                .failing_since_ms
                .is_some()
        );
        let same = EndpointUpdate {
            url: Some("https://hooks.example.com/orders".into()),
            ..EndpointUpdate::default()
        };
        subscriptions
            .update_endpoint(CLIENT, &endpoint_id, &same, T0 + 1)
            .await
            .expect("update");
        assert!(
            deliveries
                .claim(&endpoint_id, T0 + 2, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "the same URL: still paused"
        );
        let moved = EndpointUpdate {
            url: Some("https://other.example.com/hooks".into()),
            ..EndpointUpdate::default()
        };
        let updated = subscriptions
            .update_endpoint(CLIENT, &endpoint_id, &moved, T0 + 3)
            .await
            .expect("update");
        assert_eq!(updated.failing_since_ms, None);
        assert!(
            deliveries
                .claim(&endpoint_id, T0 + 3, 30_000)
                .await
                .expect("claim")
                .is_some(),
            "a new recipient is not paused"
        );
    }
}

#[tokio::test]
async fn a_ping_goes_to_its_endpoint_only_as_any_event_does() {
    for (database, _scratch) in databases().await {
        let pinged = endpoint(&database, &[ORDER_PAID]).await;
        let other = endpoint(&database, &[ORDER_PAID]).await;
        let subscriptions = subscriptions(&database);
        let event_id = subscriptions.ping(CLIENT, &pinged, T0).await.expect("ping");
        let deliveries = deliveries(&database);
        assert!(
            deliveries
                .claim(&other, T0, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "only the endpoint pinged"
        );
        let claim = deliveries
            .claim(&pinged, T0, 30_000)
            .await
            .expect("claim")
            .expect("due at once");
        assert_eq!(claim.event_id, event_id);
        assert_eq!(claim.secrets.len(), 1, "signed as any delivery");
        let body: serde_json::Value = serde_json::from_str(&claim.payload).expect("json");
        assert_eq!(
            (
                body["id"].as_str(),
                body["type"].as_str(),
                body["data"]["endpoint_id"].as_str()
            ),
            (
                Some(event_id.as_str()),
                Some(ENDPOINT_PING),
                Some(pinged.as_str())
            )
        );
        deliveries
            .finish(
                &claim,
                &answered(500, T0),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 5_000),
                },
                RULE,
                T0,
            )
            .await
            .expect("finish");
        let log = subscriptions
            .deliveries(CLIENT, &pinged, &DeliveryQuery::newest(10))
            .await
            .expect("log")
            .deliveries;
        assert_eq!(
            (
                log[0].event_type.as_str(),
                log[0].state,
                log[0].attempts.len()
            ),
            (ENDPOINT_PING, DeliveryState::Pending, 1),
            "logged, and retried"
        );
        assert!(matches!(
            subscriptions.ping("another-client", &pinged, T0).await,
            Err(OutboxError::EndpointNotFound(_))
        ));
    }
}

#[tokio::test]
async fn a_delivery_out_of_attempts_is_told_to_the_owners_other_endpoints_in_the_same_transaction()
{
    for (database, _scratch) in databases().await {
        let failing = endpoint(&database, &[ORDER_PAID, ENDPOINT_ATTEMPTS_EXHAUSTED]).await;
        let told = endpoint(&database, &[ENDPOINT_ATTEMPTS_EXHAUSTED]).await;
        let disabled = endpoint(&database, &[ENDPOINT_ATTEMPTS_EXHAUSTED]).await;
        let subscriptions = subscriptions(&database);
        subscriptions
            .set_enabled(CLIENT, &disabled, false)
            .await
            .expect("disable");
        let event_id = paid(&database, T0).await;
        let deliveries = deliveries(&database);
        let claim = deliveries
            .claim(&failing, T0, 30_000)
            .await
            .expect("claim")
            .expect("due");
        deliveries
            .finish(
                &claim,
                &answered(500, T0),
                DeliveryOutcome::Failed {
                    retry_at_ms: Some(T0 + 5_000),
                },
                RULE,
                T0,
            )
            .await
            .expect("finish");
        assert_eq!(
            count(&database, "webhook_events").await,
            1,
            "a retry still to come tells nobody"
        );
        let claim = deliveries
            .claim(&failing, T0 + 5_000, 30_000)
            .await
            .expect("claim")
            .expect("due");
        deliveries
            .finish(
                &claim,
                &answered(500, T0 + 5_000),
                DeliveryOutcome::Failed { retry_at_ms: None },
                RULE,
                T0 + 5_000,
            )
            .await
            .expect("finish");

        assert!(
            deliveries
                .claim(&failing, T0 + 5_000, 30_000)
                .await
                .expect("claim")
                .is_none(),
            "not the endpoint that ran out"
        );
        assert!(
            deliveries
                .claim(&disabled, T0 + 5_000, 30_000)
                .await
                .expect("claim")
                .is_none()
        );
        let notice = deliveries
            .claim(&told, T0 + 5_000, 30_000)
            .await
            .expect("claim")
            .expect("the other endpoint is told");
        let body: serde_json::Value = serde_json::from_str(&notice.payload).expect("json");
        assert_eq!(body["type"], ENDPOINT_ATTEMPTS_EXHAUSTED);
        assert_eq!(body["id"], notice.event_id.as_str());
        assert_eq!(
            body["data"],
            json!({"endpoint_id": failing, "event_id": event_id, "event_type": ORDER_PAID})
        );

        // The notice running out itself tells nobody: no endless echo between failing endpoints.
        deliveries
            .finish(
                &notice,
                &answered(500, T0 + 5_000),
                DeliveryOutcome::Failed { retry_at_ms: None },
                RULE,
                T0 + 5_000,
            )
            .await
            .expect("finish");
        assert_eq!(count(&database, "webhook_events").await, 2);
    }
}

#[tokio::test]
async fn secrets_are_sealed_at_rest_and_rows_from_before_are_sealed_at_start() {
    for (database, _scratch) in databases().await {
        let new = NewEndpoint {
            url: "https://hooks.example.com/orders".into(),
            event_types: vec![ORDER_PAID.into()],
            limits: EndpointLimits::default(),
        };
        let (created, secret) = create(&database, CLIENT, new).await.expect("endpoint");
        let stored = || async {
            let (value,): (String,) = database
                .fetch_one("SELECT secret FROM webhook_secrets", &[])
                .await
                .expect("the secret's row");
            value
        };
        let sealed = stored().await;
        let bare = secret.to_string();
        let key_material = bare.trim_start_matches("whsec_");
        assert!(
            sealed.starts_with("sealed1:test:") && !sealed.contains(key_material),
            "{sealed}"
        );
        paid(&database, T0).await;
        let claim = deliveries(&database)
            .claim(&created.endpoint_id, T0, 1)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(
            claim
                .secrets
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            [bare.as_str()],
            "opened to sign"
        );
        // Once the first claim's 1 ms lease has run out on the database's clock, the delivery is
        // claimed again, and its secret opened with another key.
        let other_key = Deliveries::new(database.clone(), SecretKeys::generate("test"));
        let reclaimed = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match other_key.claim(&created.endpoint_id, T0 + DAY_MS, 1).await {
                    Ok(None) => tokio::time::sleep(Duration::from_millis(1)).await,
                    reclaimed => return reclaimed,
                }
            }
        })
        .await
        .expect("the first claim's lease runs out");
        assert!(reclaimed.is_err(), "another key does not open it");

        // A row stored in plain text by a version from before sealing.
        let plain = bare.clone();
        database
            .write(async move |tx| {
                tx.execute("UPDATE webhook_secrets SET secret = $1", &[&plain])
                    .await
            })
            .await
            .expect("plain text");
        assert_eq!(
            outbox::seal_plaintext_secrets(&database, &keys())
                .await
                .expect("seal"),
            1
        );
        assert_eq!(
            outbox::seal_plaintext_secrets(&database, &keys())
                .await
                .expect("seal"),
            0,
            "nothing left"
        );
        assert!(stored().await.starts_with("sealed1:test:"));
        let claim = deliveries(&database)
            .claim(&created.endpoint_id, T0 + DAY_MS, 1)
            .await
            .expect("claim")
            .expect("due");
        assert_eq!(claim.secrets[0].to_string(), bare);
    }
}
