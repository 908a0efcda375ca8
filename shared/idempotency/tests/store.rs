//! The key store against both backends: SQLite always, PostgreSQL when `TEST_POSTGRES_URL` names a
//! server whose user may create databases (CI starts one; without it these tests say so loudly).

use std::{io::Write, sync::Arc, time::Duration};

use idempotency::{Begin, Database, KeyError, KeySettings, KeyStore, ManualClock, Stored};
use sqlx::{Connection, Executor};

const LEASE: Duration = Duration::from_secs(2);
const START_MS: i64 = 1_800_000_000_000;

/// A fresh database of each available backend.
async fn databases() -> Vec<(&'static str, Database, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = Database::connect(&format!("sqlite://{}", dir.path().join("keys.db").display())).await.unwrap();
    let mut all = vec![("sqlite", sqlite, Some(dir))];
    match std::env::var("TEST_POSTGRES_URL") {
        Ok(admin_url) => {
            let name = format!("keys_{}", uuid::Uuid::now_v7().simple());
            let mut admin = sqlx::PgConnection::connect(&admin_url).await.expect("TEST_POSTGRES_URL is reachable");
            admin.execute(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}"))).await.unwrap();
            let url = format!("{}/{name}", admin_url.rsplit_once('/').unwrap().0);
            all.push(("postgres", Database::connect(&url).await.unwrap(), None));
        }
        // Written past the test harness's capture, so that the skip shows even when tests pass.
        Err(_) => {
            let _ = writeln!(std::io::stderr(), "SKIPPED: TEST_POSTGRES_URL is not set; the PostgreSQL half of this test did not run");
        }
    }
    all
}

fn store(database: &Database, settings: KeySettings) -> (KeyStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::starting_at(START_MS));
    (KeyStore::with_clock(database.clone(), settings, clock.clone()), clock)
}

fn execute(begin: Begin) -> idempotency::Lease {
    match begin {
        Begin::Execute(lease) => lease,
        Begin::Replay(stored) => panic!("expected to execute, got a replay of {stored:?}"),
    }
}

#[tokio::test]
async fn a_key_executes_once_and_then_replays_its_exact_answer() {
    for (backend, database, _dir) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("client-a", "k-1", "fp-1", LEASE).await.unwrap());
        assert_eq!(lease.recovery_point, "started", "{backend}");

        assert!(matches!(store.begin("client-a", "k-1", "fp-1", LEASE).await, Err(KeyError::InFlight)), "{backend}");
        assert!(matches!(store.begin("client-a", "k-1", "fp-2", LEASE).await, Err(KeyError::Mismatch)), "{backend}");

        let answer = Stored { code: 0, body: vec![0, 1, 2, 255, 10, 13] };
        store.phase(&mut lease).await.unwrap().complete(&answer).await.unwrap();
        match store.begin("client-a", "k-1", "fp-1", LEASE).await.unwrap() {
            Begin::Replay(stored) => assert_eq!(stored, answer, "{backend}: byte-identical replay"),
            Begin::Execute(_) => panic!("{backend}: a completed key executed again"),
        }
        assert!(matches!(store.begin("client-a", "k-1", "fp-2", LEASE).await, Err(KeyError::Mismatch)), "{backend}");

        // Keys are scoped per client.
        execute(store.begin("client-b", "k-1", "fp-2", LEASE).await.unwrap());
    }
}

#[tokio::test]
async fn phases_commit_effects_with_the_recovery_point_and_a_released_key_resumes_there() {
    for (backend, database, _dir) in databases().await {
        database
            .pool()
            .execute(sqlx::AssertSqlSafe(format!("CREATE TABLE effects_{backend} (id TEXT PRIMARY KEY)")))
            .await
            .unwrap();
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("c", "k-2", "fp", LEASE).await.unwrap());
        let mut phase = store.phase(&mut lease).await.unwrap();
        phase
            .connection()
            .execute(sqlx::AssertSqlSafe(format!("INSERT INTO effects_{backend} (id) VALUES ('order-1')")))
            .await
            .unwrap();
        phase.commit_at("order_created", Some("order-1")).await.unwrap();
        assert_eq!((lease.recovery_point.as_str(), lease.resource_id.as_deref()), ("order_created", Some("order-1")));

        // A failure a retry may fix: the key is released and the repeat resumes where it stopped.
        store.release(&lease).await.unwrap();
        let resumed = execute(store.begin("c", "k-2", "fp", LEASE).await.unwrap());
        assert_eq!((resumed.recovery_point.as_str(), resumed.resource_id.as_deref()), ("order_created", Some("order-1")), "{backend}");
    }
}

#[tokio::test]
async fn a_phase_whose_effects_fail_leaves_nothing_behind() {
    for (backend, database, _dir) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("c", "k-3", "fp", LEASE).await.unwrap());
        {
            let mut phase = store.phase(&mut lease).await.unwrap();
            phase.connection().execute("INSERT INTO no_such_table VALUES (1)").await.unwrap_err();
            // Dropped without commit: rolled back.
        }
        store.release(&lease).await.unwrap();
        let resumed = execute(store.begin("c", "k-3", "fp", LEASE).await.unwrap());
        assert_eq!(resumed.recovery_point, "started", "{backend}");
    }
}

#[tokio::test]
async fn a_lease_that_ran_out_is_taken_over_and_the_old_holder_cannot_commit() {
    for (backend, database, _dir) in databases().await {
        let (store, clock) = store(&database, KeySettings::default());
        let mut stale = execute(store.begin("c", "k-4", "fp", Duration::from_millis(500)).await.unwrap());
        clock.advance_ms(400);
        assert!(matches!(store.begin("c", "k-4", "fp", LEASE).await, Err(KeyError::InFlight)), "{backend}");
        clock.advance_ms(200);
        let mut current = execute(store.begin("c", "k-4", "fp", LEASE).await.unwrap());
        let lost = store.phase(&mut stale).await.unwrap().commit_at("order_created", Some("x")).await;
        assert!(matches!(lost, Err(KeyError::LeaseLost)), "{backend}");
        store.phase(&mut current).await.unwrap().complete(&Stored { code: 0, body: b"ok".to_vec() }).await.unwrap();
    }
}

#[tokio::test]
async fn fifty_concurrent_repeats_execute_once() {
    for (backend, database, _dir) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let attempts = (0..50).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.begin("c", "storm", "fp", LEASE).await })
        });
        let results = futures::future::join_all(attempts).await;
        let executed = results.iter().filter(|r| matches!(r.as_ref().unwrap(), Ok(Begin::Execute(_)))).count();
        let in_flight = results.iter().filter(|r| matches!(r.as_ref().unwrap(), Err(KeyError::InFlight))).count();
        assert_eq!((executed, in_flight), (1, 49), "{backend}");
    }
}

#[tokio::test]
async fn expired_keys_are_reaped_in_batches_and_then_execute_afresh() {
    for (backend, database, _dir) in databases().await {
        let settings = KeySettings { ttl_ms: 10_000, reap_interval_ms: 1_000, reap_batch: 2 };
        let (store, clock) = store(&database, settings);
        let scope = format!("reap-{}", uuid::Uuid::now_v7().simple());
        for n in 0..5 {
            let mut lease = execute(store.begin(&scope, &format!("old-{n}"), "fp", LEASE).await.unwrap());
            store.phase(&mut lease).await.unwrap().complete(&Stored { code: 0, body: vec![] }).await.unwrap();
        }
        clock.advance_ms(6_000);
        let mut young = execute(store.begin(&scope, "young", "fp", LEASE).await.unwrap());
        store.phase(&mut young).await.unwrap().complete(&Stored { code: 0, body: b"kept".to_vec() }).await.unwrap();
        clock.advance_ms(5_000); // the five old keys are 11 s old, the young one 5 s

        assert_eq!(store.reap_expired().await.unwrap(), 5, "{backend}: only the expired rows, 2 at a time");
        assert_eq!(store.reap_expired().await.unwrap(), 0, "{backend}");
        assert!(matches!(store.begin(&scope, "young", "fp", LEASE).await, Ok(Begin::Replay(_))), "{backend}: kept");
        let fresh = execute(store.begin(&scope, "old-0", "another request", LEASE).await.unwrap());
        assert_eq!(fresh.recovery_point, "started", "{backend}: a reaped key executes afresh");
    }
}

#[tokio::test]
async fn an_expired_key_the_reaper_has_not_reached_executes_afresh() {
    for (backend, database, _dir) in databases().await {
        let (store, clock) = store(&database, KeySettings { ttl_ms: 1_000, ..KeySettings::default() });
        let mut lease = execute(store.begin("c", "k-5", "fp", LEASE).await.unwrap());
        store.phase(&mut lease).await.unwrap().complete(&Stored { code: 0, body: b"first".to_vec() }).await.unwrap();
        clock.advance_ms(1_000);
        let fresh = execute(store.begin("c", "k-5", "fp", LEASE).await.unwrap());
        assert_eq!(fresh.recovery_point, "started", "{backend}");
    }
}
