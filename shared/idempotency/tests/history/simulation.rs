//! orders' create flow and completer, played over the public `KeyStore` API against a fake bank,
//! with clients repeating their keys, the reaper, a clock that moves by jumps, faults, and the
//! store's pause points held at random: everything recorded into a `History`.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use futures::future::BoxFuture;
use idempotency::{
    Begin, BeginWith, Clock, Effects, KeyError, KeySettings, KeyStore, Lease, ManualClock,
    Progress, ResumePolicy, Stored, StrandedKey,
    pause::{Pause, PauseHook},
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use storage::{Database, Statement, Tx};
use tokio_util::sync::CancellationToken;

use crate::check::{Answer, Event, History, KeyRow, OrderRow, stored_body};

/// Times on the store's clock, in ms: a lease, a key's TTL, the completer's grace.
pub(crate) const LEASE_MS: u64 = 200;
pub(crate) const TTL_MS: u64 = 1_000;
const GRACE_MS: u64 = 50;
const START_MS: i64 = 1_800_000_000_000;

/// Clients, keys and repeats of one run.
const KEYS: u64 = 8;
const CLIENTS: u64 = 4;
const ATTEMPTS_PER_KEY: u64 = 5;

/// Chances of each fault, in percent.
const LOST_REQUEST: u32 = 10;
const LOST_REPLY: u32 = 10;
const REFUSED_UNEXECUTED: u32 = 10;
const DROPPED_TASK: u32 = 10;
const HELD_AT_PAUSE_POINT: u32 = 50;
/// A task stalls between two of its steps (scheduling, a slow network), in percent.
const STALLED: u32 = 25;

/// Completer rounds that settle what the run left, at most.
const DRAIN_ROUNDS: usize = 20;

const ORDERS_TABLE: &str = "CREATE TABLE orders (order_id TEXT PRIMARY KEY, scope TEXT NOT NULL, idempotency_key TEXT NOT NULL, \
     status TEXT NOT NULL, created_ms BIGINT NOT NULL, paid_from_ms BIGINT, paid_ms BIGINT, charge_id BIGINT, recorded_by BIGINT)";

/// One run: a store on a fresh database, its clock, the fake bank and the history.
pub(crate) struct World {
    store: KeyStore,
    clock: Arc<ManualClock>,
    pauses: Arc<RandomPauses>,
    bank: Bank,
    history: History,
    seed: u64,
    faults: AtomicBool,
    next_call: AtomicU64,
    next_order: AtomicU64,
    next_record: AtomicU64,
}

/// What a run left: its history and the rows of the database.
pub(crate) struct Outcome {
    pub events: Vec<Event>,
    pub orders: Vec<OrderRow>,
    pub keys: Vec<KeyRow>,
}

impl World {
    pub(crate) async fn new(database: Database, seed: u64) -> Arc<Self> {
        database
            .write(async |tx: &mut Tx<'_>| tx.execute(ORDERS_TABLE, &[]).await)
            .await
            .expect("create the orders table");
        let clock = Arc::new(ManualClock::starting_at(START_MS));
        let pauses = Arc::new(RandomPauses {
            clock: clock.clone(),
            seed,
            held: AtomicBool::new(true),
            streams: Mutex::default(),
        });
        let settings = KeySettings {
            ttl_ms: TTL_MS,
            ..KeySettings::default()
        };
        let store =
            KeyStore::with_clock(database, settings, clock.clone()).with_pause_hook(pauses.clone());
        let history = History::default();
        Arc::new(Self {
            store,
            clock,
            pauses,
            bank: Bank {
                charges: Mutex::default(),
                history: history.clone(),
            },
            history,
            seed,
            faults: AtomicBool::new(true),
            next_call: AtomicU64::new(0),
            next_order: AtomicU64::new(0),
            next_record: AtomicU64::new(0),
        })
    }

    fn rng(&self, stream: u64) -> StdRng {
        StdRng::seed_from_u64(self.seed ^ stream.wrapping_mul(0x9e37_79b9_7f4a_7c15))
    }

    /// The run: clients repeat their keys under faults while two completers, the reaper and the
    /// clock go on; then faults stop and the completer settles what is left.
    pub(crate) async fn run(self: &Arc<Self>) -> Outcome {
        let background = CancellationToken::new();
        let mut tasks = Vec::new();
        tasks.push(tokio::spawn(
            self.clone().move_the_clock(background.clone()),
        ));
        tasks.push(tokio::spawn(self.clone().reap(background.clone())));
        for replica in 0..2 {
            tasks.push(tokio::spawn(
                self.clone().complete(replica, background.clone()),
            ));
        }
        let clients: Vec<_> = (0..KEYS)
            .map(|key| tokio::spawn(self.clone().repeat_key(key)))
            .collect();
        for client in clients {
            client.await.expect("a client task");
        }
        background.cancel();
        for task in tasks {
            task.await.expect("a background task");
        }
        self.drain().await;
        self.outcome().await
    }

    /// One client key: a few creates, some concurrent, some after a wait long enough for the
    /// clock to pass leases and TTLs; some dropped midway.
    async fn repeat_key(self: Arc<Self>, key_index: u64) {
        let mut rng = self.rng(1_000 + key_index);
        let (scope, key) = (
            format!("client-{}", key_index % CLIENTS),
            format!("key-{key_index}"),
        );
        let mut concurrent = Vec::new();
        for attempt in 0..ATTEMPTS_PER_KEY {
            let pause = if rng.random_ratio(1, 4) {
                rng.random_range(20..60)
            } else {
                rng.random_range(0..15)
            };
            tokio::time::sleep(Duration::from_millis(pause)).await;
            let create = tokio::spawn(self.clone().invoke(
                scope.clone(),
                key.clone(),
                self.rng(key_index << 32 | attempt),
            ));
            if rng.random_bool(0.5) {
                concurrent.push(create);
            } else {
                create.await.expect("a create task");
            }
        }
        for create in concurrent {
            create.await.expect("a create task");
        }
    }

    /// One create, recorded from its invocation to its answer (or its drop).
    async fn invoke(self: Arc<Self>, scope: String, key: String, mut rng: StdRng) {
        let call = self.next_call.fetch_add(1, Ordering::Relaxed);
        self.history.record(Event::Invoked {
            call,
            scope: scope.clone(),
            key: key.clone(),
            clock_ms: self.clock.now_ms(),
        });
        let answer = match Plan::dropped_after(&mut rng) {
            Some(after) => tokio::time::timeout(after, self.create(&scope, &key, &mut rng))
                .await
                .unwrap_or(Answer::Dropped),
            None => self.create(&scope, &key, &mut rng).await,
        };
        self.history.record(Event::Answered { call, answer });
    }

    /// orders' `create`, step for step: the order made with the key's claim (or after a
    /// takeover at `started`), the charge under a key derived from the order, then the outcome
    /// recorded, or the key withdrawn (refused before the bank) or released (outcome unknown).
    /// Half of the creates claim with `begin` and make the order in a phase of its own, the
    /// store's other way, which leaves keys at `started` between the two.
    async fn create(&self, scope: &str, key: &str, rng: &mut StdRng) -> Answer {
        let new = self.new_order(scope, key);
        let claimed = if rng.random_bool(0.5) {
            self.store
                .begin_with_first_phase(scope, key, "fingerprint", lease(), || {
                    new.phase(self.clock.now_ms())
                })
                .await
        } else {
            self.store
                .begin(scope, key, "fingerprint", lease())
                .await
                .map(BeginWith::Found)
        };
        let (mut lease, order, created_now) = match claimed {
            Ok(BeginWith::Executed(lease)) => (lease, self.made(new.order), true),
            Ok(BeginWith::Found(Begin::Replay(stored))) => {
                return Answer::Replayed { body: stored.body };
            }
            Ok(BeginWith::Found(Begin::Execute(mut lease))) => match lease.resource_id.clone() {
                Some(order) => (lease, order, false),
                None => {
                    self.stall(rng).await;
                    let (effects, created) = new.phase(self.clock.now_ms());
                    match self
                        .store
                        .atomic_statements(&mut lease, effects, created)
                        .await
                    {
                        Ok(()) => (lease, self.made(new.order), true),
                        Err(error) => return unsettled(error),
                    }
                }
            },
            Err(error) => return unsettled(error),
        };
        self.stall(rng).await;
        let charged = self
            .bank
            .charge(&payment_key(scope, key, &order), &order, self.fault(rng))
            .await;
        self.stall(rng).await;
        match charged {
            Ok(charge_id) => self.record(&mut lease, order, charge_id).await,
            Err(BankFailure::NotExecuted) if created_now => {
                let withdrawn = order.clone();
                match self
                    .store
                    .withdraw(lease, async move |tx: &mut Tx<'_>| {
                        delete_order(tx, &withdrawn).await
                    })
                    .await
                {
                    Ok(()) => Answer::Refused { order },
                    Err(_) => Answer::Pending { order },
                }
            }
            Err(_) => {
                let _ = self.store.release(&mut lease).await;
                Answer::Pending { order }
            }
        }
    }

    /// `order`, whose phase 1 has just committed, recorded as made.
    fn made(&self, order: String) -> String {
        self.history.record(Event::Made {
            order: order.clone(),
            clock_ms: self.clock.now_ms(),
        });
        order
    }

    /// The bank's fault for one call, while faults are on.
    fn fault(&self, rng: &mut StdRng) -> Option<BankFault> {
        BankFault::draw(rng).filter(|_| self.faults.load(Ordering::Relaxed))
    }

    /// Sometimes a task stalls between two steps, and the clock may pass its lease meanwhile:
    /// the old holder then goes on beside whoever takes its key over.
    async fn stall(&self, rng: &mut StdRng) {
        if !self.faults.load(Ordering::Relaxed) || !rng.random_ratio(STALLED, 100) {
            return;
        }
        if rng.random_bool(0.5) {
            self.clock
                .advance_ms(rng.random_range(0..=LEASE_MS as i64 + 50));
        }
        tokio::time::sleep(Duration::from_millis(rng.random_range(1..15))).await;
    }

    /// Phase 3: the order paid and the key completed with its answer, in one transaction.
    async fn record(&self, lease: &mut Lease, order: String, charge_id: i64) -> Answer {
        let (clock, paid_from_ms) = (self.clock.clone(), self.clock.now_ms());
        let attempt = self.next_record.fetch_add(1, Ordering::Relaxed) as i64;
        let (body, recorded_order, pending) = (
            stored_body(&order, charge_id, attempt),
            order.clone(),
            Answer::Pending {
                order: order.clone(),
            },
        );
        let recorded = self
            .store
            .atomic_phase(lease, async move |tx: &mut Tx<'_>| {
                tx.execute(
                    "UPDATE orders SET status = 'paid', paid_from_ms = $1, paid_ms = $2, charge_id = $3, recorded_by = $5 WHERE order_id = $4",
                    &[&paid_from_ms, &clock.now_ms(), &charge_id, &order, &attempt],
                )
                .await?;
                let answer = Stored { code: 0, body: stored_body(&order, charge_id, attempt) };
                Ok::<_, KeyError>((order, Progress::Completed(answer)))
            })
            .await;
        self.history.record(Event::Recorded {
            order: recorded_order,
            attempt,
            committed: recorded.is_ok(),
        });
        match recorded {
            Ok(order) => Answer::Done { order, body },
            Err(_) => pending,
        }
    }

    /// Phase 1's order, numbered now.
    fn new_order(&self, scope: &str, key: &str) -> NewOrder {
        let order = format!("order-{}", self.next_order.fetch_add(1, Ordering::Relaxed));
        NewOrder {
            order,
            scope: scope.to_owned(),
            key: key.to_owned(),
        }
    }

    /// A replica's completer: stranded creates resumed as orders' completer does, until told
    /// to stop.
    async fn complete(self: Arc<Self>, replica: u64, stop: CancellationToken) {
        let mut rng = self.rng(2_000 + replica);
        while !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(2..10))).await;
            let Ok(stranded) = self.store.stranded(&policy(), 10).await else {
                continue;
            };
            for key in stranded {
                match Plan::dropped_after(&mut rng) {
                    Some(after) => {
                        drop(tokio::time::timeout(after, self.settle(&key, &mut rng)).await)
                    }
                    None => self.settle(&key, &mut rng).await,
                }
            }
        }
    }

    /// orders' completer `settle`: take the key over, charge, record or release.
    async fn settle(&self, stranded: &StrandedKey, rng: &mut StdRng) {
        let Ok(Some(mut lease)) = self.store.resume(stranded, lease()).await else {
            return;
        };
        let order = lease
            .resource_id
            .clone()
            .expect("a stranded key is past started, so it names its order");
        self.stall(rng).await;
        let charged = self
            .bank
            .charge(
                &payment_key(&stranded.scope, &stranded.key, &order),
                &order,
                self.fault(rng),
            )
            .await;
        self.stall(rng).await;
        match charged {
            Ok(charge_id) => drop(self.record(&mut lease, order, charge_id).await),
            Err(_) => drop(self.store.release(&mut lease).await),
        }
    }

    async fn reap(self: Arc<Self>, stop: CancellationToken) {
        let mut rng = self.rng(3_000);
        while !stop.is_cancelled() {
            // Sometimes late, so that an expired key is still there for a repeat to find.
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..15))).await;
            let _ = self.store.reap_expired().await;
        }
    }

    /// The clock moves by jumps of up to a fifth of a lease every few ms: over a run it
    /// passes leases and TTLs several times.
    async fn move_the_clock(self: Arc<Self>, stop: CancellationToken) {
        let mut rng = self.rng(4_000);
        while !stop.is_cancelled() {
            tokio::time::sleep(Duration::from_millis(rng.random_range(1..4))).await;
            self.clock
                .advance_ms(rng.random_range(0..=LEASE_MS as i64 / 5));
        }
    }

    /// Faults and pauses stop; the clock passes every lease and grace, and the completer runs
    /// until nothing is stranded: what a run leaves unsettled then, it leaves for good.
    async fn drain(&self) {
        self.faults.store(false, Ordering::Relaxed);
        self.pauses.held.store(false, Ordering::Relaxed);
        // On SQLite the work of a dropped task, once the writer has run it, still commits: a
        // write queued behind it returns once it has.
        self.store
            .database()
            .write(async |_: &mut Tx<'_>| Ok::<_, storage::Error>(()))
            .await
            .expect("the writer's queue drained");
        let mut rng = self.rng(5_000);
        for _ in 0..DRAIN_ROUNDS {
            // Past any grace doubled by the resumes a run can count.
            self.clock.advance_ms((GRACE_MS << 12) as i64);
            let stranded = self
                .store
                .stranded(&policy(), 100)
                .await
                .expect("stranded keys");
            if stranded.is_empty() {
                return;
            }
            for key in stranded {
                self.settle(&key, &mut rng).await;
            }
        }
    }

    async fn outcome(&self) -> Outcome {
        let database = self.store.database();
        let orders = database
            .fetch_all("SELECT order_id, scope, idempotency_key, status, created_ms, paid_from_ms, paid_ms, charge_id, recorded_by FROM orders", &[])
            .await
            .expect("read the orders");
        let keys = database
            .fetch_all(
                "SELECT scope, idempotency_key, resource_id FROM idempotency_keys",
                &[],
            )
            .await
            .expect("read the keys");
        Outcome {
            events: self.history.events(),
            orders,
            keys,
        }
    }
}

fn lease() -> Duration {
    Duration::from_millis(LEASE_MS)
}

fn policy() -> ResumePolicy {
    ResumePolicy {
        grace: Duration::from_millis(GRACE_MS),
        window: Duration::from_secs(1_000_000),
        max_attempts: 64,
    }
}

/// A create's answer once it failed before it could say more: `ABORTED` for a key in flight
/// or a lease lost (nothing of this request's was committed), else a storage failure.
fn unsettled(error: KeyError) -> Answer {
    match error {
        KeyError::InFlight | KeyError::LeaseLost => Answer::InFlight,
        other => Answer::Failed(other.to_string()),
    }
}

/// Payment's key, derived from the client's key and the order, as orders derives it.
fn payment_key(scope: &str, key: &str, order: &str) -> String {
    format!("payment/{scope}/{key}/{order}")
}

/// Phase 1: a new order row, and the key at `order_created` naming it.
struct NewOrder {
    order: String,
    scope: String,
    key: String,
}

impl NewOrder {
    /// Phase 1: the order row, made at `now_ms`, and the key at `order_created` naming it.
    fn phase(&self, now_ms: i64) -> (Effects, Progress) {
        let insert = Effects::default().then(Statement::new(
            "INSERT INTO orders (order_id, scope, idempotency_key, status, created_ms) SELECT $1, $2, $3, 'pending_payment', $4 FROM moved",
            &[&self.order, &self.scope, &self.key, &now_ms],
        ));
        (
            insert,
            Progress::At {
                point: "order_created",
                resource_id: Some(self.order.clone()),
            },
        )
    }
}

/// Undoes phase 1 of a create refused before the bank: its order goes with its key.
async fn delete_order(tx: &mut Tx<'_>, order: &str) -> Result<(), KeyError> {
    tx.execute(
        "DELETE FROM orders WHERE order_id = $1 AND status = 'pending_payment'",
        &[&order],
    )
    .await?;
    Ok(())
}

/// Whether a create or a resume is dropped (its deadline, a crash), and how long after it
/// starts: wherever it is then.
struct Plan;

impl Plan {
    fn dropped_after(rng: &mut StdRng) -> Option<Duration> {
        rng.random_ratio(DROPPED_TASK, 100)
            .then(|| Duration::from_millis(rng.random_range(1..25)))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BankFault {
    RequestLost,
    ReplyLost,
    /// Refused before the bank was called (payment's breaker open): known not executed.
    RefusedUnexecuted,
}

impl BankFault {
    fn draw(rng: &mut StdRng) -> Option<Self> {
        let roll = rng.random_range(0..100);
        if roll < LOST_REQUEST {
            Some(BankFault::RequestLost)
        } else if roll < LOST_REQUEST + LOST_REPLY {
            Some(BankFault::ReplyLost)
        } else if roll < LOST_REQUEST + LOST_REPLY + REFUSED_UNEXECUTED {
            Some(BankFault::RefusedUnexecuted)
        } else {
            None
        }
    }
}

enum BankFailure {
    NotExecuted,
    Unknown,
}

/// The bank (with payment in front of it): one execution per payment key, whose repeats get
/// the first charge back.
struct Bank {
    charges: Mutex<HashMap<String, i64>>,
    history: History,
}

impl Bank {
    async fn charge(
        &self,
        payment_key: &str,
        order: &str,
        fault: Option<BankFault>,
    ) -> Result<i64, BankFailure> {
        tokio::task::yield_now().await;
        match fault {
            Some(BankFault::RequestLost) => return Err(BankFailure::Unknown),
            Some(BankFault::RefusedUnexecuted) => return Err(BankFailure::NotExecuted),
            Some(BankFault::ReplyLost) | None => {}
        }
        let charge_id = {
            let mut charges = self.charges.lock().expect("bank lock");
            let next = charges.len() as i64 + 1;
            *charges.entry(payment_key.to_owned()).or_insert_with(|| {
                self.history.record(Event::BankExecuted {
                    order: order.to_owned(),
                });
                next
            })
        };
        tokio::task::yield_now().await;
        if fault == Some(BankFault::ReplyLost) {
            return Err(BankFailure::Unknown);
        }
        Ok(charge_id)
    }
}

/// Holds requests at the store's pause points at random, for a few ms, and sometimes moves the
/// clock meanwhile, so that a lease runs out or a TTL passes inside the gap the point marks.
/// Each key draws from a stream of its own, so a seed replays its choices.
#[derive(Debug)]
struct RandomPauses {
    clock: Arc<ManualClock>,
    seed: u64,
    held: AtomicBool,
    streams: Mutex<HashMap<(String, u8), StdRng>>,
}

impl PauseHook for RandomPauses {
    fn reached(&self, at: Pause, key: &str) -> BoxFuture<'static, ()> {
        if !self.held.load(Ordering::Relaxed) {
            return Box::pin(async {});
        }
        let point = at as u8;
        let (hold, jump) = {
            let mut streams = self.streams.lock().expect("pause lock");
            let rng = streams.entry((key.to_owned(), point)).or_insert_with(|| {
                let stream = key.bytes().fold(u64::from(point), |hash, byte| {
                    hash.wrapping_mul(31).wrapping_add(u64::from(byte))
                });
                StdRng::seed_from_u64(self.seed ^ stream)
            });
            if !rng.random_ratio(HELD_AT_PAUSE_POINT, 100) {
                return Box::pin(async {});
            }
            let jump = match rng.random_range(0..100) {
                // Past the key's TTL: a row a phase is moving may match the expiry rule.
                0..15 => rng.random_range(0..=(TTL_MS + LEASE_MS) as i64),
                15..50 => rng.random_range(0..=LEASE_MS as i64 + 50),
                _ => 0,
            };
            (Duration::from_millis(rng.random_range(1..=30)), jump)
        };
        self.clock.advance_ms(jump);
        Box::pin(tokio::time::sleep(hold))
    }
}
