//! The key store against both backends: SQLite always, PostgreSQL when `TEST_POSTGRES_URL` names a
//! server whose user may create databases (required in CI; elsewhere its absence is reported
//! loudly).

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use idempotency::{
    Begin, BeginWith, Effects, KeyError, KeySettings, KeyStore, Lease, Lookup, ManualClock,
    Progress, ResumePolicy, Stored,
    pause::{Pause, PauseHook},
};
use storage::{Database, SqliteSettings, Statement, Tx};
use test_support::ScratchDatabase;
use tokio::sync::{Barrier, Notify};

const LEASE: Duration = Duration::from_secs(2);
const START_MS: i64 = 1_800_000_000_000;

/// What keeps a test's database alive: the SQLite file's directory, or the PostgreSQL scratch
/// database, dropped with it.
enum Scratch {
    Sqlite { _dir: tempfile::TempDir },
    Postgres { _database: ScratchDatabase },
}

/// A database with the key store's table.
async fn connect(url: &str) -> Database {
    Database::open(url, SqliteSettings::default(), |backend| {
        vec![idempotency::migrations(backend)]
    })
    .await
    .unwrap()
}

/// A fresh database of each available backend.
async fn databases() -> Vec<(&'static str, Database, Scratch)> {
    let dir = tempfile::tempdir().unwrap();
    let sqlite = connect(&format!(
        "sqlite://{}",
        dir.path().join("keys.db").display()
    ))
    .await;
    let mut all = vec![("sqlite", sqlite, Scratch::Sqlite { _dir: dir })];
    if let Some(admin_url) = test_support::postgres_admin_url() {
        let scratch = ScratchDatabase::create(&admin_url, "keys").await;
        all.push((
            "postgres",
            connect(scratch.url()).await,
            Scratch::Postgres { _database: scratch },
        ));
    }
    all
}

/// Completes `lease`'s key with `answer`, in a phase of no effects of its own.
async fn complete(store: &KeyStore, lease: &mut Lease, answer: &Stored) -> Result<(), KeyError> {
    let answer = answer.clone();
    store
        .atomic_phase(lease, async move |_: &mut Tx<'_>| {
            Ok::<_, KeyError>(((), Progress::Completed(answer)))
        })
        .await
}

/// Moves `lease`'s key to `point`, naming `resource_id`, in a phase of no effects of its own.
async fn commit_at(
    store: &KeyStore,
    lease: &mut Lease,
    point: &'static str,
    resource_id: Option<&str>,
) -> Result<(), KeyError> {
    let resource_id = resource_id.map(str::to_owned);
    store
        .atomic_phase(lease, async move |_: &mut Tx<'_>| {
            Ok::<_, KeyError>(((), Progress::At { point, resource_id }))
        })
        .await
}

fn store(database: &Database, settings: KeySettings) -> (KeyStore, Arc<ManualClock>) {
    let clock = Arc::new(ManualClock::starting_at(START_MS));
    (
        KeyStore::with_clock(database.clone(), settings, clock.clone()),
        clock,
    )
}

/// The effects of a first phase as orders' is: one row in `table`, and the key at
/// `order_created` naming it; or the row, then a failure (the transaction's work undone). A
/// macro, so that each is a closure of its own type, whose future the compiler sees is `Send`.
macro_rules! first_phase {
    ($table:expr, $id:expr, $fails:expr) => {{
        let (statement, id, fails): (String, String, bool) = (
            format!("INSERT INTO {} (id) VALUES ('{}')", $table, $id),
            $id.to_string(),
            $fails,
        );
        async move |tx: &mut Tx<'_>| {
            tx.execute(&statement, &[]).await?;
            if fails {
                return Err(KeyError::Storage(storage::Error::Corrupt(
                    "the first phase fails after its insert".into(),
                )));
            }
            Ok((
                id.clone(),
                Progress::At {
                    point: "order_created",
                    resource_id: Some(id),
                },
            ))
        }
    }};
}

/// Claims `key` as orders' create does, with a first phase of statements: one row `id` in
/// `table`, and the key at `order_created` naming it. With `fails`, the row is inserted twice:
/// the second insert's error takes back the first, and the claim.
async fn claim_with_row(
    store: &KeyStore,
    key: &str,
    table: &str,
    id: &str,
    fails: bool,
) -> Result<BeginWith, KeyError> {
    store
        .begin_with_first_phase("c", key, "fp", LEASE, || {
            let insert = format!("INSERT INTO {table} (id) SELECT $1 FROM moved");
            let mut effects = Effects::default().then(Statement::new(insert.clone(), &[&id]));
            if fails {
                effects = effects.then(Statement::new(insert, &[&id]));
            }
            (
                effects,
                Progress::At {
                    point: "order_created",
                    resource_id: Some(id.to_owned()),
                },
            )
        })
        .await
}

/// Undoes what `first_phase!` wrote: its row in `table`.
macro_rules! delete_effect {
    ($table:expr, $id:expr) => {{
        let statement = format!("DELETE FROM {} WHERE id = '{}'", $table, $id);
        async move |tx: &mut Tx<'_>| {
            tx.execute(&statement, &[])
                .await
                .map(drop)
                .map_err(KeyError::from)
        }
    }};
}

fn execute(begin: Begin) -> idempotency::Lease {
    match begin {
        Begin::Execute(lease) => lease,
        Begin::Replay(stored) => panic!("expected to execute, got a replay of {stored:?}"),
    }
}

#[tokio::test]
async fn a_key_executes_once_and_then_replays_its_exact_answer() {
    for (backend, database, _scratch) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("client-a", "k-1", "fp-1", LEASE).await.unwrap());
        assert_eq!(lease.recovery_point, "started", "{backend}");

        assert!(
            matches!(
                store.begin("client-a", "k-1", "fp-1", LEASE).await,
                Err(KeyError::InFlight)
            ),
            "{backend}"
        );
        assert!(
            matches!(
                store.begin("client-a", "k-1", "fp-2", LEASE).await,
                Err(KeyError::Mismatch)
            ),
            "{backend}"
        );

        let answer = Stored {
            code: 0,
            body: vec![0, 1, 2, 255, 10, 13],
        };
        complete(&store, &mut lease, &answer).await.unwrap();
        match store.begin("client-a", "k-1", "fp-1", LEASE).await.unwrap() {
            Begin::Replay(stored) => assert_eq!(stored, answer, "{backend}: byte-identical replay"),
            Begin::Execute(_) => panic!("{backend}: a completed key executed again"),
        }
        assert!(
            matches!(
                store.begin("client-a", "k-1", "fp-2", LEASE).await,
                Err(KeyError::Mismatch)
            ),
            "{backend}"
        );

        // Keys are scoped per client.
        execute(store.begin("client-b", "k-1", "fp-2", LEASE).await.unwrap());
    }
}

/// `lookup` answers what `begin` would decide, without claiming or writing anything: an
/// expired key with nothing left to do is unused (its answer never replayed), a half-done one is
/// unsettled whatever its age.
#[tokio::test]
async fn a_lookup_reads_the_key_as_begin_would_decide_without_claiming_it() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 10_000,
                ..KeySettings::default()
            },
        );
        assert_eq!(
            store.lookup("c", "k-done", "fp").await.unwrap(),
            Lookup::Unused,
            "{backend}"
        );
        let mut done = execute(store.begin("c", "k-done", "fp", LEASE).await.unwrap());
        assert_eq!(
            store.lookup("c", "k-done", "fp").await.unwrap(),
            Lookup::InFlight,
            "{backend}"
        );
        assert!(
            matches!(
                store.lookup("c", "k-done", "other").await,
                Err(KeyError::Mismatch)
            ),
            "{backend}"
        );
        let answer = Stored {
            code: 0,
            body: vec![7, 0, 255],
        };
        complete(&store, &mut done, &answer).await.unwrap();
        assert_eq!(
            store.lookup("c", "k-done", "fp").await.unwrap(),
            Lookup::Completed(answer),
            "{backend}: byte for byte"
        );

        let mut half = execute(store.begin("c", "k-half", "fp", LEASE).await.unwrap());
        commit_at(&store, &mut half, "order_created", Some("order-1"))
            .await
            .unwrap();
        store.release(&mut half).await.unwrap();
        let unsettled = Lookup::Unsettled {
            recovery_point: "order_created".into(),
            resource_id: Some("order-1".into()),
        };
        assert_eq!(
            store.lookup("c", "k-half", "fp").await.unwrap(),
            unsettled,
            "{backend}"
        );
        // Looking up claimed nothing: an unused key looked up before is still free to execute.
        execute(store.begin("c", "k-unused", "fp", LEASE).await.unwrap());

        clock.advance_ms(10_000);
        assert_eq!(
            store.lookup("c", "k-done", "fp").await.unwrap(),
            Lookup::Unused,
            "{backend}: expired, never replayed"
        );
        assert_eq!(
            store.lookup("c", "k-done", "other").await.unwrap(),
            Lookup::Unused,
            "{backend}: as begin would execute it afresh"
        );
        assert_eq!(
            store.lookup("c", "k-half", "fp").await.unwrap(),
            unsettled,
            "{backend}: half-done keys outlive their TTL"
        );
    }
}

#[tokio::test]
async fn phases_commit_effects_with_the_recovery_point_and_a_released_key_resumes_there() {
    for (backend, database, _scratch) in databases().await {
        effects_table(&database, backend, "effects").await;
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("c", "k-2", "fp", LEASE).await.unwrap());
        store
            .atomic_phase(
                &mut lease,
                first_phase!(&format!("effects_{backend}"), "order-1", false),
            )
            .await
            .unwrap();
        assert_eq!(
            (lease.recovery_point.as_str(), lease.resource_id.as_deref()),
            ("order_created", Some("order-1"))
        );

        // A failure a retry may fix: the key is released and the repeat resumes where it stopped.
        store.release(&mut lease).await.unwrap();
        let resumed = execute(store.begin("c", "k-2", "fp", LEASE).await.unwrap());
        assert_eq!(
            (
                resumed.recovery_point.as_str(),
                resumed.resource_id.as_deref()
            ),
            ("order_created", Some("order-1")),
            "{backend}"
        );
    }
}

#[tokio::test]
async fn a_phase_whose_effects_fail_leaves_nothing_behind() {
    for (backend, database, _scratch) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = execute(store.begin("c", "k-3", "fp", LEASE).await.unwrap());
        let failed = store
            .atomic_phase(&mut lease, async |tx: &mut Tx<'_>| {
                tx.execute("INSERT INTO no_such_table VALUES (1)", &[])
                    .await?;
                Ok::<_, KeyError>((
                    (),
                    Progress::At {
                        point: "order_created",
                        resource_id: None,
                    },
                ))
            })
            .await;
        assert!(
            matches!(failed, Err(KeyError::Storage(_))),
            "{backend}: {failed:?}"
        );
        store.release(&mut lease).await.unwrap();
        let resumed = execute(store.begin("c", "k-3", "fp", LEASE).await.unwrap());
        assert_eq!(resumed.recovery_point, "started", "{backend}");
    }
}

#[tokio::test]
async fn a_lease_that_ran_out_is_taken_over_and_the_old_holder_cannot_commit() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(&database, KeySettings::default());
        let mut stale = execute(
            store
                .begin("c", "k-4", "fp", Duration::from_millis(500))
                .await
                .unwrap(),
        );
        clock.advance_ms(400);
        assert!(
            matches!(
                store.begin("c", "k-4", "fp", LEASE).await,
                Err(KeyError::InFlight)
            ),
            "{backend}"
        );
        clock.advance_ms(200);
        let mut current = execute(store.begin("c", "k-4", "fp", LEASE).await.unwrap());
        let lost = commit_at(&store, &mut stale, "order_created", Some("x")).await;
        assert!(matches!(lost, Err(KeyError::LeaseLost)), "{backend}");
        complete(
            &store,
            &mut current,
            &Stored {
                code: 0,
                body: b"ok".to_vec(),
            },
        )
        .await
        .unwrap();
    }
}

#[tokio::test]
async fn fifty_concurrent_repeats_execute_once() {
    for (backend, database, _scratch) in databases().await {
        let (store, _) = store(&database, KeySettings::default());
        let attempts = (0..50).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.begin("c", "storm", "fp", LEASE).await })
        });
        let results = futures::future::join_all(attempts).await;
        let executed = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Ok(Begin::Execute(_))))
            .count();
        let in_flight = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Err(KeyError::InFlight)))
            .count();
        let others: Vec<String> = results
            .iter()
            .filter_map(|r| r.as_ref().unwrap().as_ref().err())
            .filter(|e| !matches!(e, KeyError::InFlight))
            .map(|e| e.to_string())
            .collect();
        assert_eq!((executed, in_flight), (1, 49), "{backend}: {others:?}");
    }
}

/// A new key's claim commits with its first phase, or not at all: a failing first phase takes
/// the claim back with its own insert, and the key's repeat executes afresh.
#[tokio::test]
async fn a_claim_commits_with_its_first_phase_or_not_at_all() {
    for (backend, database, _scratch) in databases().await {
        let table = effects_table(&database, backend, "claimed").await;
        let (store, _) = store(&database, KeySettings::default());
        let mut lease = match claim_with_row(&store, "k-both", &table, "order-1", false)
            .await
            .unwrap()
        {
            BeginWith::Executed(lease) => lease,
            BeginWith::Found(found) => panic!("{backend}: a new key, found as {found:?}"),
        };
        assert_eq!(
            (lease.recovery_point.as_str(), lease.resource_id.as_deref()),
            ("order_created", Some("order-1")),
            "{backend}"
        );
        assert!(
            matches!(
                store.begin("c", "k-both", "fp", LEASE).await,
                Err(KeyError::InFlight)
            ),
            "{backend}: the claim is committed"
        );
        store.release(&mut lease).await.unwrap();
        let resumed = execute(store.begin("c", "k-both", "fp", LEASE).await.unwrap());
        assert_eq!(
            (
                resumed.recovery_point.as_str(),
                resumed.resource_id.as_deref()
            ),
            ("order_created", Some("order-1")),
            "{backend}"
        );

        let failed = claim_with_row(&store, "k-neither", &table, "order-2", true).await;
        assert!(
            matches!(failed, Err(KeyError::Storage(_))),
            "{backend}: {failed:?}"
        );
        let fresh = execute(
            store
                .begin("c", "k-neither", "another request", LEASE)
                .await
                .unwrap(),
        );
        assert_eq!(
            fresh.recovery_point, "started",
            "{backend}: the key was never claimed, so it executes afresh"
        );
        assert_eq!(
            count_effects(&database, &table).await,
            1,
            "{backend}: only the committed phase's effect"
        );
    }
}

/// A repeat that claims with its first phase finds the key: in flight while its holder works,
/// and once the holder has given it up, taken over at the holder's recovery point, without
/// running its own first phase (the holder's committed it already).
#[tokio::test]
async fn a_repeat_claiming_with_its_first_phase_finds_the_key_and_runs_nothing() {
    for (backend, database, _scratch) in databases().await {
        let table = effects_table(&database, backend, "repeated").await;
        let (store, _) = store(&database, KeySettings::default());
        let mut holder = match claim_with_row(&store, "k", &table, "order-1", false)
            .await
            .unwrap()
        {
            BeginWith::Executed(lease) => lease,
            BeginWith::Found(found) => panic!("{backend}: a new key, found as {found:?}"),
        };
        let in_flight = claim_with_row(&store, "k", &table, "order-2", false).await;
        assert!(
            matches!(in_flight, Err(KeyError::InFlight)),
            "{backend}: {in_flight:?}"
        );
        store.release(&mut holder).await.unwrap();
        match claim_with_row(&store, "k", &table, "order-3", false)
            .await
            .unwrap()
        {
            BeginWith::Found(Begin::Execute(lease)) => {
                assert_eq!(lease.resource_id.as_deref(), Some("order-1"), "{backend}")
            }
            other => panic!("{backend}: expected a takeover, got {other:?}"),
        }
        assert_eq!(
            count_effects(&database, &table).await,
            1,
            "{backend}: the repeats' first phases never ran"
        );
    }
}

/// Fifty repeats at once, each claiming with its first phase: one executes (one row written),
/// the others find it in flight.
#[tokio::test]
async fn fifty_concurrent_repeats_claiming_with_their_first_phase_execute_once() {
    for (backend, database, _scratch) in databases().await {
        let table = effects_table(&database, backend, "storm").await;
        let (store, _) = store(&database, KeySettings::default());
        let attempts = (0..50).map(|attempt| {
            let (store, table) = (store.clone(), table.clone());
            tokio::spawn(async move {
                claim_with_row(&store, "storm", &table, &format!("order-{attempt}"), false).await
            })
        });
        let results = futures::future::join_all(attempts).await;
        let executed = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Ok(BeginWith::Executed(_))))
            .count();
        let in_flight = results
            .iter()
            .filter(|r| matches!(r.as_ref().unwrap(), Err(KeyError::InFlight)))
            .count();
        assert_eq!((executed, in_flight), (1, 49), "{backend}");
        assert_eq!(count_effects(&database, &table).await, 1, "{backend}");
    }
}

/// A new key's claim and first phase are written after a read found no key. A request held in
/// that gap, with a repeat sent meanwhile: the repeat claims the key, and the held request's
/// claim inserts nothing and its first phase does nothing: the key is decided as it stands.
/// Here the repeat first holds the key (in flight), then completes it (a replay), and no first
/// phase of the held requests commits anything.
#[tokio::test]
async fn a_first_phase_whose_key_is_claimed_meanwhile_is_rolled_back() {
    for (backend, database, _scratch) in databases().await {
        let table = effects_table(&database, backend, "taken").await;
        for (key, completes) in [("k-taken-in-flight", false), ("k-taken-completed", true)] {
            let hold = HoldOnce::new(Pause::NewKeyRead, key);
            let (store, _) = store(&database, KeySettings::default());
            let store = store.with_pause_hook(hold.clone());
            let held = tokio::spawn({
                let (store, table) = (store.clone(), table.clone());
                async move { claim_with_row(&store, key, &table, &format!("{key}-held"), false).await }
            });
            hold.held().await;
            let repeat = tokio::spawn({
                let store = store.clone();
                async move { store.begin("c", key, "fp", LEASE).await }
            });
            let mut other = execute(repeat.await.unwrap().unwrap());
            if completes {
                complete(
                    &store,
                    &mut other,
                    &Stored {
                        code: 0,
                        body: b"first".to_vec(),
                    },
                )
                .await
                .unwrap();
            }
            hold.let_go();
            match (held.await.unwrap(), completes) {
                (Err(KeyError::InFlight), false) => {}
                (Ok(BeginWith::Found(Begin::Replay(stored))), true) => {
                    assert_eq!(stored.body, b"first", "{backend}")
                }
                (other, _) => panic!("{backend}, {key}: {other:?}"),
            }
        }
        assert_eq!(
            count_effects(&database, &table).await,
            0,
            "{backend}: no first phase of a request that lost its key committed"
        );
    }
}

/// A request withdrawn before anything outside the database happened under its key leaves
/// nothing behind: its first phase's row and its key go together, no completer finds it, and a
/// repeat executes afresh. A holder whose lease was taken over withdraws nothing, nor does a
/// withdrawal whose effects fail.
#[tokio::test]
async fn a_withdrawn_key_leaves_nothing_behind_and_its_repeat_executes_afresh() {
    for (backend, database, _scratch) in databases().await {
        let orders = effects_table(&database, backend, "withdrawn").await;
        let (store, clock) = store(&database, KeySettings::default());
        let refused = match claim_with_row(&store, "k-refused", &orders, "order-1", false)
            .await
            .unwrap()
        {
            BeginWith::Executed(lease) => lease,
            BeginWith::Found(found) => panic!("{backend}: a new key, found as {found:?}"),
        };
        store
            .withdraw(refused, delete_effect!(orders, "order-1"))
            .await
            .unwrap();
        assert_eq!(
            count_effects(&database, &orders).await,
            0,
            "{backend}: the order went with its key"
        );
        assert_eq!(
            store.lookup("c", "k-refused", "fp").await.unwrap(),
            Lookup::Unused,
            "{backend}"
        );
        clock.advance_ms(60_000);
        assert_eq!(
            store.stranded(&POLICY, 10).await.unwrap(),
            vec![],
            "{backend}"
        );
        let fresh = execute(
            store
                .begin("c", "k-refused", "another request", LEASE)
                .await
                .unwrap(),
        );
        assert_eq!(
            fresh.recovery_point, "started",
            "{backend}: executed afresh, as a new key"
        );

        let mut stale = execute(
            store
                .begin("c", "k-taken", "fp", Duration::from_millis(500))
                .await
                .unwrap(),
        );
        store
            .atomic_phase(&mut stale, first_phase!(orders, "order-2", false))
            .await
            .unwrap();
        clock.advance_ms(600);
        let current = execute(store.begin("c", "k-taken", "fp", LEASE).await.unwrap());
        let lost = store
            .withdraw(stale, delete_effect!(orders, "order-2"))
            .await;
        assert!(
            matches!(lost, Err(KeyError::LeaseLost)),
            "{backend}: {lost:?}"
        );
        assert_eq!(
            count_effects(&database, &orders).await,
            1,
            "{backend}: the order the new holder resumes is kept"
        );
        assert_eq!(current.resource_id.as_deref(), Some("order-2"), "{backend}");
        assert_eq!(
            store.lookup("c", "k-taken", "fp").await.unwrap(),
            Lookup::InFlight,
            "{backend}"
        );

        let kept = match claim_with_row(&store, "k-kept", &orders, "order-3", false)
            .await
            .unwrap()
        {
            BeginWith::Executed(lease) => lease,
            BeginWith::Found(found) => panic!("{backend}: a new key, found as {found:?}"),
        };
        let failed = store
            .withdraw(kept, delete_effect!("no_such_table", "order-3"))
            .await;
        assert!(
            matches!(failed, Err(KeyError::Storage(_))),
            "{backend}: {failed:?}"
        );
        assert_eq!(
            count_effects(&database, &orders).await,
            2,
            "{backend}: a failed withdrawal undoes nothing"
        );
        assert_eq!(
            store.lookup("c", "k-kept", "fp").await.unwrap(),
            Lookup::InFlight,
            "{backend}: nor deletes the key"
        );
    }
}

/// An atomic phase of a holder whose lease was taken over commits nothing, whether its effects
/// run in a transaction or as statements: `LeaseLost`, and the new holder's phase commits.
#[tokio::test]
async fn an_atomic_phase_after_its_lease_was_taken_over_commits_nothing() {
    for (backend, database, _scratch) in databases().await {
        let table = effects_table(&database, backend, "lost").await;
        let (store, clock) = store(&database, KeySettings::default());
        let mut stale = execute(
            store
                .begin("c", "k", "fp", Duration::from_millis(500))
                .await
                .unwrap(),
        );
        clock.advance_ms(600);
        let mut current = execute(store.begin("c", "k", "fp", LEASE).await.unwrap());
        let lost = store
            .atomic_phase(&mut stale, first_phase!(table, "order-stale", false))
            .await;
        assert!(
            matches!(lost, Err(KeyError::LeaseLost)),
            "{backend}: {lost:?}"
        );
        assert_eq!(
            stale.recovery_point, "started",
            "{backend}: the stale lease did not move"
        );
        // The same as statements (one on PostgreSQL): the key's move finds nothing, so the
        // effect, which reads `moved`, inserts nothing.
        let effects = Effects::default().then(Statement::new(
            format!("INSERT INTO {table} (id) SELECT $1 FROM moved"),
            &[&"order-stale-statement"],
        ));
        let lost = store
            .atomic_statements(
                &mut stale,
                effects,
                Progress::At {
                    point: "order_created",
                    resource_id: None,
                },
            )
            .await;
        assert!(
            matches!(lost, Err(KeyError::LeaseLost)),
            "{backend}: {lost:?}"
        );
        store
            .atomic_phase(&mut current, first_phase!(table, "order-current", false))
            .await
            .unwrap();
        assert_eq!(
            (
                current.recovery_point.as_str(),
                current.resource_id.as_deref()
            ),
            ("order_created", Some("order-current")),
            "{backend}"
        );
        assert_eq!(
            count_effects(&database, &table).await,
            1,
            "{backend}: the stale phase's insert is undone"
        );
    }
}

#[tokio::test]
async fn expired_keys_are_reaped_in_batches_and_then_execute_afresh() {
    for (backend, database, _scratch) in databases().await {
        let settings = KeySettings {
            ttl_ms: 10_000,
            reap_interval_ms: 1_000,
            reap_batch: 2,
        };
        let (store, clock) = store(&database, settings);
        let scope = format!("reap-{}", uuid::Uuid::now_v7().simple());
        for n in 0..5 {
            let mut lease = execute(
                store
                    .begin(&scope, &format!("old-{n}"), "fp", LEASE)
                    .await
                    .unwrap(),
            );
            complete(
                &store,
                &mut lease,
                &Stored {
                    code: 0,
                    body: vec![],
                },
            )
            .await
            .unwrap();
        }
        clock.advance_ms(6_000);
        let mut young = execute(store.begin(&scope, "young", "fp", LEASE).await.unwrap());
        complete(
            &store,
            &mut young,
            &Stored {
                code: 0,
                body: b"kept".to_vec(),
            },
        )
        .await
        .unwrap();
        clock.advance_ms(5_000); // the five old keys are 11 s old, the young one 5 s

        assert_eq!(
            store.reap_expired().await.unwrap(),
            5,
            "{backend}: only the expired rows, 2 at a time"
        );
        assert_eq!(store.reap_expired().await.unwrap(), 0, "{backend}");
        assert!(
            matches!(
                store.begin(&scope, "young", "fp", LEASE).await,
                Ok(Begin::Replay(_))
            ),
            "{backend}: kept"
        );
        let fresh = execute(
            store
                .begin(&scope, "old-0", "another request", LEASE)
                .await
                .unwrap(),
        );
        assert_eq!(
            fresh.recovery_point, "started",
            "{backend}: a reaped key executes afresh"
        );
    }
}

#[tokio::test]
async fn an_expired_key_the_reaper_has_not_reached_executes_afresh() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 1_000,
                ..KeySettings::default()
            },
        );
        let mut lease = execute(store.begin("c", "k-5", "fp", LEASE).await.unwrap());
        complete(
            &store,
            &mut lease,
            &Stored {
                code: 0,
                body: b"first".to_vec(),
            },
        )
        .await
        .unwrap();
        clock.advance_ms(1_000);
        let fresh = execute(store.begin("c", "k-5", "fp", LEASE).await.unwrap());
        assert_eq!(fresh.recovery_point, "started", "{backend}");
    }
}

/// A key at `started` whose lease ran out matches the reaper's rule once it has expired. Its
/// holder, still running past its lease, commits its first phase (an order) while the reaper's
/// DELETE waits for the row lock that phase holds (on SQLite, for the writer it holds). The
/// reaper must judge the key as the phase left it, half-done, and keep it: deleted, a repeat
/// would execute afresh and make a second order beside the first.
#[tokio::test]
async fn the_reaper_keeps_a_key_that_a_phase_moved_past_started_while_it_waited() {
    for (backend, database, _scratch) in databases().await {
        let orders = effects_table(&database, backend, "reaped_orders").await;
        let hold = HoldOnce::new(Pause::PhaseMoved, "k-reaped");
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 10_000,
                ..KeySettings::default()
            },
        );
        let store = store.with_pause_hook(hold.clone());
        let mut holder = execute(
            store
                .begin("c", "k-reaped", "fp", Duration::from_millis(500))
                .await
                .unwrap(),
        );
        clock.advance_ms(11_000);
        let phase = tokio::spawn({
            let (store, effects) = (store.clone(), first_phase!(orders, "order-1", false));
            async move {
                store
                    .atomic_phase(&mut holder, effects)
                    .await
                    .map(|_| holder)
            }
        });
        hold.held().await;
        let reaper = tokio::spawn({
            let store = store.clone();
            async move { store.reap_expired().await }
        });
        waits_behind_the_held_phase(&database, backend, &reaper).await;
        hold.let_go();

        let holder = phase.await.unwrap().unwrap();
        assert_eq!(
            reaper.await.unwrap().unwrap(),
            0,
            "{backend}: the reaper deleted a key whose order exists"
        );
        assert_eq!(holder.recovery_point, "order_created", "{backend}");
        let resumed = execute(store.begin("c", "k-reaped", "fp", LEASE).await.unwrap());
        assert_eq!(
            (
                resumed.recovery_point.as_str(),
                resumed.resource_id.as_deref()
            ),
            ("order_created", Some("order-1")),
            "{backend}"
        );
        assert_eq!(
            count_effects(&database, &orders).await,
            1,
            "{backend}: one order under one key"
        );
    }
}

/// Returns once `reaper` waits behind the phase held at its pause point: on PostgreSQL, once its
/// DELETE waits for a row lock; on SQLite, where it waits for the writer and nothing shows it,
/// once it has had time to finish and has not.
async fn waits_behind_the_held_phase(
    database: &Database,
    backend: &str,
    reaper: &tokio::task::JoinHandle<Result<u64, storage::Error>>,
) {
    if backend == "sqlite" {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !reaper.is_finished(),
            "the reaper waits for the writer the held phase holds"
        );
        return;
    }
    test_support::eventually(Duration::from_secs(10), "the reaper's DELETE waits for the key's row lock", || async {
        let waiting: i64 = database
            .fetch_one(
                "SELECT COUNT(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE 'DELETE FROM idempotency_keys%'",
                &[],
            )
            .await
            .unwrap();
        waiting == 1
    })
    .await;
}

/// Sixteen repeats of a completed key past its TTL, each held after reading the key until all
/// have read it: one deletes the expired row and executes afresh, and none of the others may
/// replay the expired answer from the row it read before the delete; they find the new
/// execution in flight.
#[tokio::test]
async fn concurrent_repeats_of_an_expired_key_never_replay_its_answer_and_execute_once() {
    const REPEATS: usize = 16;
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 1_000,
                ..KeySettings::default()
            },
        );
        let store =
            store.with_pause_hook(HoldTogether::new(Pause::BeginRead, "k-expired", REPEATS));
        let mut first = execute(store.begin("c", "k-expired", "fp", LEASE).await.unwrap());
        complete(
            &store,
            &mut first,
            &Stored {
                code: 0,
                body: b"expired".to_vec(),
            },
        )
        .await
        .unwrap();
        clock.advance_ms(1_000);

        let repeats = (0..REPEATS).map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.begin("c", "k-expired", "fp", LEASE).await })
        });
        let answers =
            tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(repeats))
                .await
                .expect("every repeat answers");
        let (mut executed, mut in_flight, mut replayed) = (0, 0, Vec::new());
        for answer in answers {
            match answer.unwrap() {
                Ok(Begin::Execute(_)) => executed += 1,
                Err(KeyError::InFlight) => in_flight += 1,
                Ok(Begin::Replay(stored)) => {
                    replayed.push(String::from_utf8_lossy(&stored.body).into_owned())
                }
                Err(other) => panic!("{backend}: {other}"),
            }
        }
        assert_eq!(
            (executed, in_flight, replayed),
            (1, REPEATS - 1, Vec::<String>::new()),
            "{backend}"
        );
    }
}

/// Holds the first `count` requests that reach `at` on `key` until all of them are there.
#[derive(Debug)]
struct HoldTogether {
    at: Pause,
    key: &'static str,
    count: usize,
    arrived: AtomicUsize,
    all_there: Arc<Barrier>,
}

impl HoldTogether {
    fn new(at: Pause, key: &'static str, count: usize) -> Arc<Self> {
        Arc::new(Self {
            at,
            key,
            count,
            arrived: AtomicUsize::new(0),
            all_there: Arc::new(Barrier::new(count)),
        })
    }
}

impl PauseHook for HoldTogether {
    fn reached(&self, at: Pause, key: &str) -> BoxFuture<'static, ()> {
        if at != self.at
            || key != self.key
            || self.arrived.fetch_add(1, Ordering::SeqCst) >= self.count
        {
            return Box::pin(async {});
        }
        let all_there = self.all_there.clone();
        Box::pin(async move {
            all_there.wait().await;
        })
    }
}

/// Holds the first request that reaches `at` on `key` until the test lets it go.
#[derive(Debug)]
struct HoldOnce {
    at: Pause,
    key: &'static str,
    armed: AtomicBool,
    reached: Arc<Notify>,
    go_on: Arc<Notify>,
}

impl HoldOnce {
    fn new(at: Pause, key: &'static str) -> Arc<Self> {
        Arc::new(Self {
            at,
            key,
            armed: AtomicBool::new(true),
            reached: Arc::default(),
            go_on: Arc::default(),
        })
    }

    /// Waits until the held request is there (at most 10 s, so that a regression fails instead
    /// of hanging).
    async fn held(&self) {
        tokio::time::timeout(Duration::from_secs(10), self.reached.notified())
            .await
            .expect("a request reached the pause point");
    }

    fn let_go(&self) {
        self.go_on.notify_one();
    }
}

impl PauseHook for HoldOnce {
    fn reached(&self, at: Pause, key: &str) -> BoxFuture<'static, ()> {
        if at != self.at || key != self.key || !self.armed.swap(false, Ordering::SeqCst) {
            return Box::pin(async {});
        }
        self.reached.notify_one();
        let go_on = self.go_on.clone();
        Box::pin(async move { go_on.notified().await })
    }
}

/// An order-like effect table for the tests that play a service's phases.
async fn effects_table(database: &Database, backend: &str, name: &str) -> String {
    let table = format!("{name}_{backend}");
    let statement = format!("CREATE TABLE {table} (id TEXT PRIMARY KEY)");
    database
        .write(async move |tx: &mut Tx<'_>| tx.execute(&statement, &[]).await)
        .await
        .unwrap();
    table
}

async fn count_effects(database: &Database, table: &str) -> i64 {
    database
        .fetch_one(&format!("SELECT COUNT(*) FROM {table}"), &[])
        .await
        .unwrap()
}

/// A holder of `key` whose 500 ms lease has run out, and a repeat of it held after reading the
/// key, before it decides anything: the gap in which the tests below let the old holder act.
struct HeldRepeat {
    store: KeyStore,
    old: idempotency::Lease,
    hold: Arc<HoldOnce>,
    repeat: tokio::task::JoinHandle<Result<Begin, KeyError>>,
}

async fn repeat_held_after_its_read(database: &Database, key: &'static str) -> HeldRepeat {
    let hold = HoldOnce::new(Pause::BeginRead, key);
    let (store, clock) = store(database, KeySettings::default());
    let store = store.with_pause_hook(hold.clone());
    let old = execute(
        store
            .begin("c", key, "fp", Duration::from_millis(500))
            .await
            .unwrap(),
    );
    clock.advance_ms(600);
    let repeat = tokio::spawn({
        let store = store.clone();
        async move { store.begin("c", key, "fp", LEASE).await }
    });
    hold.held().await;
    HeldRepeat {
        store,
        old,
        hold,
        repeat,
    }
}

/// The old holder of a lease that ran out commits its first phase between a repeat's read of
/// the key and its takeover: the repeat resumes after that phase instead of redoing it.
#[tokio::test]
async fn a_takeover_resumes_from_the_phase_the_old_holder_committed_meanwhile() {
    for (backend, database, _scratch) in databases().await {
        let orders = effects_table(&database, backend, "race_orders").await;
        let HeldRepeat {
            store,
            mut old,
            hold,
            repeat,
        } = repeat_held_after_its_read(&database, "k-race").await;
        // Still running past its lease (a clock step, a COMMIT in flight when its deadline fired).
        store
            .atomic_phase(&mut old, first_phase!(&orders, "order-1", false))
            .await
            .unwrap();
        hold.let_go();

        let mut taken = execute(repeat.await.unwrap().unwrap());
        assert_eq!(
            (taken.recovery_point.as_str(), taken.resource_id.as_deref()),
            ("order_created", Some("order-1")),
            "{backend}"
        );
        // What a service does with its lease: a lease at `started` makes the order.
        if taken.resource_id.is_none() {
            store
                .atomic_phase(&mut taken, first_phase!(&orders, "order-2", false))
                .await
                .unwrap();
        }
        assert_eq!(
            count_effects(&database, &orders).await,
            1,
            "{backend}: one order under one key"
        );
        let lost = complete(
            &store,
            &mut old,
            &Stored {
                code: 0,
                body: vec![],
            },
        )
        .await;
        assert!(
            matches!(lost, Err(KeyError::LeaseLost)),
            "{backend}: the old holder cannot complete"
        );
    }
}

/// A repeat that finds a lease run out loses its takeover to the old holder completing the key:
/// it replays that answer instead of answering "in flight".
#[tokio::test]
async fn a_takeover_lost_to_a_completion_replays_it() {
    for (backend, database, _scratch) in databases().await {
        let HeldRepeat {
            store,
            mut old,
            hold,
            repeat,
        } = repeat_held_after_its_read(&database, "k-done").await;
        let answer = Stored {
            code: 0,
            body: b"paid".to_vec(),
        };
        complete(&store, &mut old, &answer).await.unwrap();
        hold.let_go();

        match repeat.await.unwrap() {
            Ok(Begin::Replay(stored)) => assert_eq!(stored, answer, "{backend}"),
            other => panic!("{backend}: expected the completed answer, got {other:?}"),
        }
    }
}

/// A key resumed just before its TTL is still being worked on when the TTL passes: neither the
/// reaper nor another repeat may delete it and start afresh beside that work.
#[tokio::test]
async fn an_expired_key_with_a_live_lease_is_kept_and_stays_in_flight() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 10_000,
                ..KeySettings::default()
            },
        );
        let mut first = execute(store.begin("c", "k-live", "fp", LEASE).await.unwrap());
        commit_at(&store, &mut first, "order_created", Some("order-1"))
            .await
            .unwrap();
        store.release(&mut first).await.unwrap();

        clock.advance_ms(9_000);
        let mut resumed = execute(store.begin("c", "k-live", "fp", LEASE).await.unwrap());
        assert_eq!(resumed.recovery_point, "order_created", "{backend}");
        clock.advance_ms(1_500); // expired 0.5 s ago; the resumed request holds the key 0.5 s more

        assert_eq!(
            store.reap_expired().await.unwrap(),
            0,
            "{backend}: the reaper keeps a key with a live lease"
        );
        match store.begin("c", "k-live", "fp", LEASE).await {
            Err(KeyError::InFlight) => {}
            other => panic!(
                "{backend}: expected in flight while the resumed request pays, got {other:?}"
            ),
        }
        let answer = Stored {
            code: 0,
            body: b"paid".to_vec(),
        };
        complete(&store, &mut resumed, &answer).await.unwrap();
        // Completed after its TTL, it is kept a full TTL from then, for the client's repeat.
        clock.advance_ms(9_000);
        assert_eq!(store.reap_expired().await.unwrap(), 0, "{backend}");
        assert!(
            matches!(store.begin("c", "k-live", "fp", LEASE).await, Ok(Begin::Replay(stored)) if stored == answer),
            "{backend}"
        );
    }
}

/// A create left after its first phase (an order made, its payment unsettled) outlives its TTL:
/// deleting it would lose the link between the order and its payment, and a repeat would pay a
/// second order.
#[tokio::test]
async fn an_expired_key_whose_work_is_half_done_is_kept_and_resumes_where_it_stopped() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(
            &database,
            KeySettings {
                ttl_ms: 10_000,
                ..KeySettings::default()
            },
        );
        let mut first = execute(store.begin("c", "k-half", "fp", LEASE).await.unwrap());
        commit_at(&store, &mut first, "order_created", Some("order-1"))
            .await
            .unwrap();
        store.release(&mut first).await.unwrap();
        // Never started: nothing was committed under it, so it expires like any other.
        let mut never = execute(store.begin("c", "k-never", "fp", LEASE).await.unwrap());
        store.release(&mut never).await.unwrap();

        clock.advance_ms(11_000);
        assert_eq!(
            store.reap_expired().await.unwrap(),
            1,
            "{backend}: only the key that never got past its first phase"
        );
        let resumed = execute(store.begin("c", "k-half", "fp", LEASE).await.unwrap());
        assert_eq!(
            (
                resumed.recovery_point.as_str(),
                resumed.resource_id.as_deref()
            ),
            ("order_created", Some("order-1")),
            "{backend}"
        );
        let afresh = execute(
            store
                .begin("c", "k-never", "another request", LEASE)
                .await
                .unwrap(),
        );
        assert_eq!(afresh.recovery_point, "started", "{backend}");
    }
}

/// What a completer sees: half-done keys nobody holds, after the grace left for the client's own
/// retry and within its window; resuming one takes it over once.
#[tokio::test]
async fn stranded_keys_are_found_after_their_grace_and_resumed_once() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(&database, KeySettings::default());
        let policy = ResumePolicy {
            window: Duration::from_secs(60),
            ..POLICY
        };
        let mut released = execute(store.begin("c", "k-released", "fp", LEASE).await.unwrap());
        commit_at(&store, &mut released, "order_created", Some("order-1"))
            .await
            .unwrap();
        store.release(&mut released).await.unwrap();
        let mut held = execute(store.begin("c", "k-held", "fp", LEASE).await.unwrap());
        commit_at(&store, &mut held, "order_created", Some("order-2"))
            .await
            .unwrap();
        let mut unstarted = execute(store.begin("c", "k-unstarted", "fp", LEASE).await.unwrap());
        store.release(&mut unstarted).await.unwrap();
        let mut done = execute(store.begin("c", "k-done", "fp", LEASE).await.unwrap());
        complete(
            &store,
            &mut done,
            &Stored {
                code: 0,
                body: vec![],
            },
        )
        .await
        .unwrap();

        clock.advance_ms(500);
        assert_eq!(
            store.stranded(&policy, 10).await.unwrap(),
            vec![],
            "{backend}: within the grace"
        );
        clock.advance_ms(600);
        let found = store.stranded(&policy, 10).await.unwrap();
        let keys: Vec<&str> = found.iter().map(|stranded| stranded.key.as_str()).collect();
        assert_eq!(keys, ["k-released"], "{backend}");
        assert_eq!(found[0].resource_id.as_deref(), Some("order-1"));

        let resumed = store
            .resume(&found[0], LEASE)
            .await
            .unwrap()
            .expect("taken over");
        assert_eq!(
            (
                resumed.recovery_point.as_str(),
                resumed.resource_id.as_deref()
            ),
            ("order_created", Some("order-1")),
            "{backend}"
        );
        let lost = complete(
            &store,
            &mut released,
            &Stored {
                code: 0,
                body: vec![],
            },
        )
        .await;
        assert!(
            matches!(lost, Err(KeyError::LeaseLost)),
            "{backend}: the request that released it cannot complete it"
        );
        assert!(
            store.resume(&found[0], LEASE).await.unwrap().is_none(),
            "{backend}: a second completer gets nothing"
        );
        assert!(
            matches!(
                store.begin("c", "k-released", "fp", LEASE).await,
                Err(KeyError::InFlight)
            ),
            "{backend}"
        );

        // The held key strands once its lease has run out and the grace has passed.
        clock.advance_ms(2_000);
        let keys: Vec<String> = store
            .stranded(&policy, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|stranded| stranded.key)
            .collect();
        assert_eq!(
            keys,
            ["k-held"],
            "{backend}: the resumed key holds a live lease again"
        );

        // Past the window a completer leaves them to an operator.
        clock.advance_ms(60_000);
        assert_eq!(
            store.stranded(&policy, 10).await.unwrap(),
            vec![],
            "{backend}"
        );
        assert_eq!(
            store.count_unsettled_before(policy.window).await.unwrap(),
            2,
            "{backend}"
        );
    }
}

/// A key whose resumes keep failing (its payment always fails, say) waits twice as long after
/// each, comes after keys tried fewer times, and is parked once resumed `max_attempts` times:
/// listed for an operator and no longer given to a completer, until re-armed. A good key
/// stranded behind it is taken first.
#[tokio::test]
async fn a_key_whose_resumes_keep_failing_is_parked_and_does_not_go_before_others() {
    for (backend, database, _scratch) in databases().await {
        let (store, clock) = store(&database, KeySettings::default());
        let stranded_keys = async |store: &KeyStore| -> Vec<(String, u32)> {
            store
                .stranded(&POLICY, 10)
                .await
                .unwrap()
                .into_iter()
                .map(|stranded| (stranded.key, stranded.resume_attempts))
                .collect()
        };
        strand(&store, "k-poison").await;
        clock.advance_ms(1_000);
        fail_resume(&store, "k-poison").await;

        strand(&store, "k-good").await;
        clock.advance_ms(1_000);
        assert_eq!(
            stranded_keys(&store).await,
            [("k-good".into(), 0)],
            "{backend}: the poison key waits 2 s after its first failure"
        );
        clock.advance_ms(1_000);
        assert_eq!(
            stranded_keys(&store).await,
            [("k-good".into(), 0), ("k-poison".into(), 1)],
            "{backend}: never tried goes first"
        );
        let good = store.stranded(&POLICY, 1).await.unwrap().remove(0);
        let mut settling = store
            .resume(&good, LEASE)
            .await
            .unwrap()
            .expect("taken over");
        complete(
            &store,
            &mut settling,
            &Stored {
                code: 0,
                body: b"paid".to_vec(),
            },
        )
        .await
        .unwrap();
        fail_resume(&store, "k-poison").await;

        clock.advance_ms(3_999);
        assert_eq!(
            stranded_keys(&store).await,
            [],
            "{backend}: 4 s after its second failure"
        );
        clock.advance_ms(1);
        fail_resume(&store, "k-poison").await;
        clock.advance_ms(600_000);
        assert_eq!(
            stranded_keys(&store).await,
            [],
            "{backend}: parked after 3 resumes"
        );
        let parked: Vec<(String, u32)> = store
            .parked(&POLICY, 10)
            .await
            .unwrap()
            .into_iter()
            .map(|parked| (parked.key, parked.resume_attempts))
            .collect();
        assert_eq!(parked, [("k-poison".into(), 3)], "{backend}");
        assert_eq!(store.count_parked(&POLICY).await.unwrap(), 1, "{backend}");

        // The client's own repeat still resumes it, and counts no attempt.
        let mut repeat = execute(store.begin("c", "k-poison", "fp", LEASE).await.unwrap());
        assert_eq!(
            repeat.resource_id.as_deref(),
            Some("order-k-poison"),
            "{backend}"
        );
        store.release(&mut repeat).await.unwrap();
        assert_eq!(store.count_parked(&POLICY).await.unwrap(), 1, "{backend}");

        // An operator re-arms it as the README says.
        database
            .write(async |tx: &mut Tx<'_>| {
                tx.execute("UPDATE idempotency_keys SET resume_attempts = 0 WHERE scope = 'c' AND idempotency_key = 'k-poison'", &[]).await
            })
            .await
            .unwrap();
        clock.advance_ms(1_000);
        assert_eq!(
            stranded_keys(&store).await,
            [("k-poison".into(), 0)],
            "{backend}: resumed again once re-armed"
        );
        assert_eq!(store.count_parked(&POLICY).await.unwrap(), 0, "{backend}");
    }
}

/// The completer's policy in the tests: a grace of 1 s, parked after 3 resumes.
const POLICY: ResumePolicy = ResumePolicy {
    grace: Duration::from_secs(1),
    window: Duration::from_secs(3_600),
    max_attempts: 3,
};

/// Leaves `key` half-done and released, as a create whose payment failed: its order made
/// (`order-<key>`), its outcome unknown.
async fn strand(store: &KeyStore, key: &str) {
    let mut lease = execute(store.begin("c", key, "fp", LEASE).await.unwrap());
    commit_at(
        store,
        &mut lease,
        "order_created",
        Some(&format!("order-{key}")),
    )
    .await
    .unwrap();
    store.release(&mut lease).await.unwrap();
}

/// Resumes `key`, which must be stranded now, and fails, as a completer whose payment call
/// fails does: the key is released.
async fn fail_resume(store: &KeyStore, key: &str) {
    let stranded = store
        .stranded(&POLICY, 10)
        .await
        .unwrap()
        .into_iter()
        .find(|stranded| stranded.key == key)
        .expect("stranded now");
    let mut lease = store
        .resume(&stranded, LEASE)
        .await
        .unwrap()
        .expect("taken over");
    store.release(&mut lease).await.unwrap();
}
