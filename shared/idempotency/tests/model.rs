//! A model of one client key's life under orders' create, checked exhaustively by Stateright: a
//! client repeating its key, request tasks and the completers of two orders replicas, the reaper,
//! payment and the bank, with lost payment requests and replies, crashed tasks, leases running
//! out under running tasks, and the clock passing the key's TTL. Every step is one statement or
//! one transaction of the store (PostgreSQL's interleavings, which include SQLite's), named as
//! in `src/store.rs` and orders' `create` (the README's "Tests" lists the properties).

use std::{collections::BTreeSet, time::Instant};

use stateright::{Checker, HasDiscoveries, Model, Property};

/// Requests the client sends under its key.
const CLIENT_ATTEMPTS: u8 = 3;
/// Faults injected along one path: lost payment requests and replies, refusals before the bank,
/// crashed tasks, leases run out under a running task. Fewer than `MAX_ATTEMPTS`, so that under
/// this fairness (finitely many faults) the completer never parks the key.
const FAULTS: u8 = 2;
/// A lease, in ticks of the clock.
const LEASE: u8 = 1;
/// `ttl_ms`, in ticks.
const TTL: u8 = 2;
/// The clock stops here, unless a crashed holder's lease still has to run out.
const LAST_TICK: u8 = 4;
/// The completer's `max_attempts`.
const MAX_ATTEMPTS: u8 = 3;
/// Rounds of `KeyStore::claim` before it answers `InFlight`.
const CLAIM_ROUNDS: u8 = 3;
/// Orders replicas, each with a completer.
const REPLICAS: u8 = 2;

type OrderId = u8;
type Token = u8;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum KeyState {
    InFlight,
    Completed,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum RecoveryPoint {
    Started,
    OrderCreated,
    Finished,
}

/// The key's row in `idempotency_keys`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct KeyRow {
    state: KeyState,
    recovery_point: RecoveryPoint,
    resource_id: Option<OrderId>,
    lock_token: Token,
    locked_until: u8,
    expires_at: u8,
    resume_attempts: u8,
    /// `response_body`: the paid order.
    response: Option<OrderId>,
    /// Which insert made this row (not a column): a row deleted and claimed again is another
    /// row, as a statement's snapshot tells them apart.
    row_id: u8,
}

impl KeyRow {
    /// `KeyRow::expired_and_settled` at `now`, as `bug` may have it.
    fn expired_and_settled(&self, now: u8, bug: Option<PastBug>) -> bool {
        if bug == Some(PastBug::ExpiryOfALiveLease) {
            return self.expires_at <= now;
        }
        self.expired_and_settled_as_promised(now)
    }

    /// The rule of expiry as the README promises it: expired, and nothing can still be done.
    fn expired_and_settled_as_promised(&self, now: u8) -> bool {
        self.expires_at <= now
            && (self.state == KeyState::Completed
                || (self.recovery_point == RecoveryPoint::Started && self.locked_until <= now))
    }

    /// `KeyRow::judge`, for the one fingerprint the client sends.
    fn judge(&self, now: u8, bug: Option<PastBug>) -> Lookup {
        if self.expired_and_settled(now, bug) {
            return Lookup::Unused;
        }
        self.judge_unexpired(now)
    }

    fn judge_unexpired(&self, now: u8) -> Lookup {
        match (self.state, self.response) {
            (KeyState::Completed, Some(order)) => Lookup::Completed(order),
            _ if self.locked_until > now => Lookup::InFlight,
            _ => Lookup::Unsettled,
        }
    }
}

enum Lookup {
    Unused,
    Completed(OrderId),
    InFlight,
    Unsettled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum OrderStatus {
    PendingPayment,
    Paid,
    /// Deleted with its key by `withdraw` (kept here so that order ids stay indices).
    Withdrawn,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Order {
    status: OrderStatus,
    /// The client intent it was made for (not a column): see `State::intent`.
    intent: u8,
}

/// Who runs a request task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Origin {
    Client,
    /// A replica's completer resuming a stranded create.
    Completer(u8),
}

/// Where a request task stands: the next statement or call it makes.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum TaskStep {
    /// `begin_with_first_phase`: the key read before the claim.
    BeginRead,
    /// The claim: the key inserted at `order_created` with the first phase (the order), or
    /// nothing when the key appeared meanwhile.
    FirstPhase,
    /// A round of `claim` that inserts the key at `started` (`FirstRound::Insert`).
    ClaimInsert { round: u8 },
    /// A round of `claim` that reads the key (`FirstRound::Read`).
    ClaimRead { round: u8 },
    /// `delete_if_expired_and_settled` of the row `read` at `now`, then the next round.
    DeleteExpired { round: u8, read: KeyRow, now: u8 },
    /// `take_over`: the compare-and-set on the `lock_token` of the row `read`.
    TakeOver { round: u8, read: KeyRow },
    /// Phase 1 under a lease taken over at `started`: `atomic_statements(insert)`.
    InsertOrder { lock_token: Token },
    /// Phase 2: the payment call, on its way to payment and the bank.
    Charge {
        lock_token: Token,
        order: OrderId,
        created_now: bool,
    },
    /// The bank charged; payment's reply on its way back.
    ChargeReply { lock_token: Token, order: OrderId },
    /// Phase 3: `atomic_statements(record_payment)`, the key completed with the answer.
    RecordPayment { lock_token: Token, order: OrderId },
    /// The payment call failed, refused before the bank was called (`not_executed`) or not
    /// known: `withdraw` or `release`.
    PaymentFailed {
        lock_token: Token,
        order: OrderId,
        created_now: bool,
        not_executed: bool,
    },
}

impl TaskStep {
    /// The lease the task holds, once it holds one.
    fn lock_token(&self) -> Option<Token> {
        match *self {
            TaskStep::InsertOrder { lock_token }
            | TaskStep::Charge { lock_token, .. }
            | TaskStep::ChargeReply { lock_token, .. }
            | TaskStep::RecordPayment { lock_token, .. }
            | TaskStep::PaymentFailed { lock_token, .. } => Some(lock_token),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Task {
    origin: Origin,
    step: TaskStep,
}

/// What a create answered the client: the contract's three kinds (done, refused, pending), or
/// `ABORTED` (in flight).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Answer {
    Done {
        order: OrderId,
    },
    /// A stored answer replayed; `expired`: its key's TTL had passed when it was decided (not
    /// part of the answer, for the property).
    Replayed {
        order: OrderId,
        expired: bool,
    },
    /// Refused before anything could be charged; `order` is the one withdrawn (not part of the
    /// answer, for the property).
    Refused {
        order: OrderId,
    },
    Pending {
        order: OrderId,
    },
    InFlight,
}

/// A completer's round: the stranded key it found, before it resumes it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Completer {
    Idle,
    Stranded {
        lock_token: Token,
        resume_attempts: u8,
    },
}

/// The reaper's `DELETE … WHERE (scope, key) IN (SELECT … <rule>) AND <rule>`: between its
/// snapshot's sub-select and the row lock, other statements commit.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Reaper {
    Idle,
    Selected { row_id: u8, now: u8 },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    now: u8,
    faults_left: u8,
    attempts_left: u8,
    /// The next lease's `lock_token` (unique per lease, as the random 64-bit ones are).
    next_token: Token,
    rows_inserted: u8,
    key: Option<KeyRow>,
    orders: Vec<Order>,
    /// Orders the bank charged: one execution per bank key, which is derived from the order.
    bank_charges: BTreeSet<OrderId>,
    /// Running request tasks, sorted (tasks of one origin are interchangeable).
    tasks: Vec<Task>,
    completers: Vec<Completer>,
    reaper: Reaper,
    /// Every answer a client task gave, sorted.
    answers: Vec<Answer>,
    /// The client's intent (not a column): it changes only when the key's row is withdrawn or
    /// deleted by the expiry rule the README promises, after which the key is unused.
    intent: u8,
    intent_over: bool,
}

impl State {
    /// `INSERT … ON CONFLICT DO NOTHING` of a new key at `recovery_point`, leased now; its
    /// `lock_token`.
    fn insert_key(&mut self, recovery_point: RecoveryPoint) -> Token {
        if self.intent_over {
            self.intent += 1;
            self.intent_over = false;
        }
        let lock_token = self.new_lease();
        self.key = Some(KeyRow {
            state: KeyState::InFlight,
            recovery_point,
            resource_id: None,
            lock_token,
            locked_until: self.now + LEASE,
            expires_at: self.now + TTL,
            resume_attempts: 0,
            response: None,
            row_id: self.rows_inserted,
        });
        self.rows_inserted += 1;
        lock_token
    }

    fn delete_key(&mut self) {
        let promised = self
            .key
            .as_ref()
            .is_some_and(|row| row.expired_and_settled_as_promised(self.now));
        self.intent_over |= promised;
        self.key = None;
    }

    fn new_lease(&mut self) -> Token {
        self.next_token += 1;
        self.next_token
    }

    fn new_order(&mut self) -> OrderId {
        self.orders.push(Order {
            status: OrderStatus::PendingPayment,
            intent: self.intent,
        });
        (self.orders.len() - 1) as OrderId
    }

    fn holds_key(&self, lock_token: Token) -> bool {
        self.key
            .as_ref()
            .is_some_and(|row| row.lock_token == lock_token)
    }

    /// Ends task `index`, with `answer` if a client's task gave one.
    fn finish(&mut self, index: usize, answer: Option<Answer>) {
        let task = self.tasks.remove(index);
        if let (Origin::Client, Some(answer)) = (task.origin, answer) {
            let at = self.answers.partition_point(|given| *given <= answer);
            self.answers.insert(at, answer);
        }
    }

    fn set_step(&mut self, index: usize, step: TaskStep) {
        self.tasks[index].step = step;
        self.tasks.sort();
    }

    fn spawn(&mut self, task: Task) {
        let at = self.tasks.partition_point(|running| *running <= task);
        self.tasks.insert(at, task);
    }

    /// The live lease of the key whose holder still runs: the clock passing it is a fault.
    fn lease_runs_out_under_its_holder(&self) -> bool {
        self.key.as_ref().is_some_and(|row| {
            row.state == KeyState::InFlight
                && row.locked_until > self.now
                && row.locked_until <= self.now + 1
                && self
                    .tasks
                    .iter()
                    .any(|task| task.step.lock_token() == Some(row.lock_token))
        })
    }

    fn stranded(&self) -> Option<&KeyRow> {
        self.key.as_ref().filter(|row| {
            row.state == KeyState::InFlight
                && row.recovery_point != RecoveryPoint::Started
                && row.locked_until <= self.now
                && row.resume_attempts < MAX_ATTEMPTS
        })
    }
}

/// The interleavings and faults of the store that two rounds of review found one at a time,
/// put back into the model to show which property catches each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PastBug {
    /// A takeover resumes from the recovery point it read, not the one its UPDATE returned.
    StaleTakeover,
    /// The expiry rule is `expires_at <= now` alone: a live lease, or half-done work, expires.
    ExpiryOfALiveLease,
    /// The reaper's DELETE trusts its sub-select: no rule re-checked on the row it locks.
    ReaperWithoutOuterRecheck,
    /// A claim whose delete of an expired row found nothing decides from the row it read.
    ExpiredAnswerReplayed,
}

/// Steps, each one statement, one transaction or one call.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Step {
    /// The client sends a create under its key (to either replica: they share the database).
    ClientSends,
    /// The task at this index runs its next statement; at `Charge` payment charges at the
    /// bank, at `ChargeReply` its reply arrives.
    Proceed(usize),
    PaymentRequestLost(usize),
    /// Payment refuses before calling the bank (its breaker is open): `not_executed`.
    PaymentRefusesUnexecuted(usize),
    PaymentReplyLost(usize),
    /// The task is dropped while it holds a lease (its deadline passed, or its process died):
    /// nothing released, its transaction, if any, rolled back.
    Crash(usize),
    /// `KeyStore::stranded` on this replica's completer.
    CompleterFindsStranded(u8),
    /// `KeyStore::resume`: the takeover, counted in `resume_attempts`.
    CompleterResumes(u8),
    ReaperSelects,
    ReaperDeletes,
    /// The clock moves one tick: leases run out, keys pass their TTL.
    Tick,
}

struct KeyModel {
    bug: Option<PastBug>,
}

impl KeyModel {
    /// A claim's decision on `read`, judged at `now` in round `round`: the task's next step,
    /// or its answer.
    fn decide(&self, state: &mut State, index: usize, round: u8, read: KeyRow, now: u8) {
        match read.judge(now, self.bug) {
            Lookup::Unused => state.set_step(index, TaskStep::DeleteExpired { round, read, now }),
            Lookup::Completed(order) => state.finish(
                index,
                Some(Answer::Replayed {
                    order,
                    expired: read.expires_at <= now,
                }),
            ),
            Lookup::InFlight => state.finish(index, Some(Answer::InFlight)),
            Lookup::Unsettled => state.set_step(index, TaskStep::TakeOver { round, read }),
        }
    }

    /// The next round of a claim, or `InFlight` after the last.
    fn next_round(state: &mut State, index: usize, round: u8) {
        if round + 1 < CLAIM_ROUNDS {
            state.set_step(index, TaskStep::ClaimInsert { round: round + 1 });
        } else {
            state.finish(index, Some(Answer::InFlight));
        }
    }

    /// A lease won at `point` naming `resource_id`: phase 1 if no order exists yet, else the
    /// payment of the order it names.
    fn execute(state: &mut State, index: usize, lock_token: Token, resource_id: Option<OrderId>) {
        let step = match resource_id {
            Some(order) => TaskStep::Charge {
                lock_token,
                order,
                created_now: false,
            },
            None => TaskStep::InsertOrder { lock_token },
        };
        state.set_step(index, step);
    }

    fn proceed(&self, state: &mut State, index: usize) {
        let now = state.now;
        match state.tasks[index].step.clone() {
            TaskStep::BeginRead => match state.key.clone() {
                None => state.set_step(index, TaskStep::FirstPhase),
                Some(read) => self.decide(state, index, 0, read, now),
            },
            TaskStep::FirstPhase => {
                if state.key.is_some() {
                    state.set_step(index, TaskStep::ClaimRead { round: 0 });
                    return;
                }
                let lock_token = state.insert_key(RecoveryPoint::OrderCreated);
                let order = state.new_order();
                state.key.as_mut().expect("just inserted").resource_id = Some(order);
                state.set_step(
                    index,
                    TaskStep::Charge {
                        lock_token,
                        order,
                        created_now: true,
                    },
                );
            }
            TaskStep::ClaimInsert { round } => {
                if state.key.is_some() {
                    state.set_step(index, TaskStep::ClaimRead { round });
                    return;
                }
                let lock_token = state.insert_key(RecoveryPoint::Started);
                state.set_step(index, TaskStep::InsertOrder { lock_token });
            }
            TaskStep::ClaimRead { round } => match state.key.clone() {
                None => Self::next_round(state, index, round),
                Some(read) => self.decide(state, index, round, read, now),
            },
            TaskStep::DeleteExpired {
                round,
                read,
                now: judged_at,
            } => {
                let deleted = state
                    .key
                    .as_ref()
                    .is_some_and(|row| row.expired_and_settled(judged_at, self.bug));
                if deleted {
                    state.delete_key();
                } else if self.bug == Some(PastBug::ExpiredAnswerReplayed)
                    && let Lookup::Completed(order) = read.judge_unexpired(judged_at)
                {
                    state.finish(
                        index,
                        Some(Answer::Replayed {
                            order,
                            expired: read.expires_at <= judged_at,
                        }),
                    );
                    return;
                }
                Self::next_round(state, index, round);
            }
            TaskStep::TakeOver { round, read } => {
                let returned = state.key.as_ref().filter(|row| {
                    row.lock_token == read.lock_token
                        && row.state == KeyState::InFlight
                        && row.locked_until <= now
                });
                let Some(returned) = returned.map(|row| row.resource_id) else {
                    Self::next_round(state, index, round);
                    return;
                };
                let won = if self.bug == Some(PastBug::StaleTakeover) {
                    read.resource_id
                } else {
                    returned
                };
                let lock_token = state.new_lease();
                let row = state.key.as_mut().expect("won above");
                row.lock_token = lock_token;
                row.locked_until = now + LEASE;
                Self::execute(state, index, lock_token, won);
            }
            TaskStep::InsertOrder { lock_token } => {
                if !state.holds_key(lock_token) {
                    // LeaseLost: the phase rolls back, no order exists.
                    state.finish(index, Some(Answer::InFlight));
                    return;
                }
                let order = state.new_order();
                let row = state.key.as_mut().expect("held");
                row.recovery_point = RecoveryPoint::OrderCreated;
                row.resource_id = Some(order);
                state.set_step(
                    index,
                    TaskStep::Charge {
                        lock_token,
                        order,
                        created_now: true,
                    },
                );
            }
            TaskStep::Charge {
                lock_token, order, ..
            } => {
                state.bank_charges.insert(order);
                state.set_step(index, TaskStep::ChargeReply { lock_token, order });
            }
            TaskStep::ChargeReply { lock_token, order } => {
                state.set_step(index, TaskStep::RecordPayment { lock_token, order })
            }
            TaskStep::RecordPayment { lock_token, order } => {
                if !state.holds_key(lock_token) {
                    state.finish(index, Some(Answer::Pending { order }));
                    return;
                }
                state.orders[order as usize].status = OrderStatus::Paid;
                let row = state.key.as_mut().expect("held");
                row.state = KeyState::Completed;
                row.recovery_point = RecoveryPoint::Finished;
                row.response = Some(order);
                row.locked_until = 0;
                row.expires_at = row.expires_at.max(now + TTL);
                state.finish(index, Some(Answer::Done { order }));
            }
            TaskStep::PaymentFailed {
                lock_token,
                order,
                created_now: true,
                not_executed: true,
            } => {
                let withdrawn = state.key.as_ref().is_some_and(|row| {
                    row.lock_token == lock_token && row.state == KeyState::InFlight
                });
                if !withdrawn {
                    state.finish(index, Some(Answer::Pending { order }));
                    return;
                }
                state.key = None;
                state.intent_over = true;
                state.orders[order as usize].status = OrderStatus::Withdrawn;
                state.finish(index, Some(Answer::Refused { order }));
            }
            TaskStep::PaymentFailed {
                lock_token, order, ..
            } => {
                if let Some(row) = state
                    .key
                    .as_mut()
                    .filter(|row| row.lock_token == lock_token)
                {
                    row.locked_until = now;
                }
                state.finish(index, Some(Answer::Pending { order }));
            }
        }
    }

    fn fail_payment(state: &mut State, index: usize, not_executed: bool) {
        let (lock_token, order, created_now) = match state.tasks[index].step {
            TaskStep::Charge {
                lock_token,
                order,
                created_now,
            } => (lock_token, order, created_now),
            TaskStep::ChargeReply { lock_token, order } => (lock_token, order, false),
            ref other => unreachable!("no payment call at {other:?}"),
        };
        state.faults_left -= 1;
        state.set_step(
            index,
            TaskStep::PaymentFailed {
                lock_token,
                order,
                created_now,
                not_executed,
            },
        );
    }
}

impl Model for KeyModel {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            now: 0,
            faults_left: FAULTS,
            attempts_left: CLIENT_ATTEMPTS,
            next_token: 0,
            rows_inserted: 0,
            key: None,
            orders: Vec::new(),
            bank_charges: BTreeSet::new(),
            tasks: Vec::new(),
            completers: vec![Completer::Idle; REPLICAS as usize],
            reaper: Reaper::Idle,
            answers: Vec::new(),
            intent: 0,
            intent_over: false,
        }]
    }

    fn actions(&self, state: &State, steps: &mut Vec<Step>) {
        if state.attempts_left > 0 {
            steps.push(Step::ClientSends);
        }
        let faults = state.faults_left > 0;
        for (index, task) in state.tasks.iter().enumerate() {
            steps.push(Step::Proceed(index));
            match task.step {
                TaskStep::Charge { .. } if faults => {
                    steps.extend([
                        Step::PaymentRequestLost(index),
                        Step::PaymentRefusesUnexecuted(index),
                    ]);
                }
                TaskStep::ChargeReply { .. } if faults => steps.push(Step::PaymentReplyLost(index)),
                _ => {}
            }
            // A task dropped before it holds a lease leaves nothing behind, as a lost request.
            if faults && task.step.lock_token().is_some() {
                steps.push(Step::Crash(index));
            }
        }
        for replica in 0..REPLICAS {
            let resuming = state
                .tasks
                .iter()
                .any(|task| task.origin == Origin::Completer(replica));
            match state.completers[replica as usize] {
                Completer::Idle if !resuming && state.stranded().is_some() => {
                    steps.push(Step::CompleterFindsStranded(replica))
                }
                Completer::Stranded { .. } => steps.push(Step::CompleterResumes(replica)),
                Completer::Idle => {}
            }
        }
        match state.reaper {
            Reaper::Idle
                if state
                    .key
                    .as_ref()
                    .is_some_and(|row| row.expired_and_settled(state.now, self.bug)) =>
            {
                steps.push(Step::ReaperSelects)
            }
            Reaper::Selected { .. } => steps.push(Step::ReaperDeletes),
            Reaper::Idle => {}
        }
        let crashed_holders_lease = state
            .key
            .as_ref()
            .is_some_and(|row| row.state == KeyState::InFlight && row.locked_until > state.now);
        let ticks = if state.lease_runs_out_under_its_holder() {
            faults && state.now < LAST_TICK
        } else {
            state.now < LAST_TICK || crashed_holders_lease
        };
        if ticks {
            steps.push(Step::Tick);
        }
    }

    fn next_state(&self, last: &State, step: Step) -> Option<State> {
        let mut state = last.clone();
        match step {
            Step::ClientSends => {
                state.attempts_left -= 1;
                state.spawn(Task {
                    origin: Origin::Client,
                    step: TaskStep::BeginRead,
                });
            }
            Step::Proceed(index) => self.proceed(&mut state, index),
            Step::PaymentRequestLost(index) | Step::PaymentReplyLost(index) => {
                Self::fail_payment(&mut state, index, false)
            }
            Step::PaymentRefusesUnexecuted(index) => Self::fail_payment(&mut state, index, true),
            Step::Crash(index) => {
                state.faults_left -= 1;
                state.finish(index, None);
            }
            Step::CompleterFindsStranded(replica) => {
                let row = state.stranded().expect("offered only when stranded");
                state.completers[replica as usize] = Completer::Stranded {
                    lock_token: row.lock_token,
                    resume_attempts: row.resume_attempts,
                };
            }
            Step::CompleterResumes(replica) => {
                let Completer::Stranded {
                    lock_token: seen, ..
                } = state.completers[replica as usize]
                else {
                    unreachable!("offered when stranded")
                };
                state.completers[replica as usize] = Completer::Idle;
                let now = state.now;
                let won = state.key.as_ref().is_some_and(|row| {
                    row.lock_token == seen
                        && row.state == KeyState::InFlight
                        && row.locked_until <= now
                });
                if won {
                    let lock_token = state.new_lease();
                    let row = state.key.as_mut().expect("won");
                    row.lock_token = lock_token;
                    row.locked_until = now + LEASE;
                    row.resume_attempts += 1;
                    let order = row.resource_id.expect("stranded keys are past started");
                    state.spawn(Task {
                        origin: Origin::Completer(replica),
                        step: TaskStep::Charge {
                            lock_token,
                            order,
                            created_now: false,
                        },
                    });
                }
            }
            Step::ReaperSelects => {
                let row_id = state
                    .key
                    .as_ref()
                    .expect("offered when a row matches")
                    .row_id;
                state.reaper = Reaper::Selected {
                    row_id,
                    now: state.now,
                };
            }
            Step::ReaperDeletes => {
                let Reaper::Selected { row_id, now } = state.reaper else {
                    unreachable!("offered when selected")
                };
                state.reaper = Reaper::Idle;
                let trusts_its_sub_select = self.bug == Some(PastBug::ReaperWithoutOuterRecheck);
                let deletes = state.key.as_ref().is_some_and(|row| {
                    row.row_id == row_id
                        && (trusts_its_sub_select || row.expired_and_settled(now, self.bug))
                });
                if deletes {
                    state.delete_key();
                }
            }
            Step::Tick => {
                if state.lease_runs_out_under_its_holder() {
                    state.faults_left -= 1;
                }
                state.now += 1;
            }
        }
        Some(state)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "at most one bank charge per client intent while its key lives",
                |_, state: &State| {
                    (0..=state.intent).all(|intent| {
                        state
                            .bank_charges
                            .iter()
                            .filter(|order: &&OrderId| {
                                state.orders[**order as usize].intent == intent
                            })
                            .count()
                            <= 1
                    })
                },
            ),
            Property::always(
                "a replay only of an unexpired answer, identical to the first",
                |_, state: &State| {
                    state.answers.iter().all(|answer| match *answer {
                        Answer::Replayed { order, expired } => {
                            !expired && state.key_answers_agree(order)
                        }
                        Answer::Done { order } => state.key_answers_agree(order),
                        _ => true,
                    })
                },
            ),
            Property::always("no order without its key", |_, state: &State| {
                state.orders.iter().enumerate().all(|(order, placed)| {
                    placed.status != OrderStatus::PendingPayment
                        || state
                            .key
                            .as_ref()
                            .is_some_and(|row| row.resource_id == Some(order as OrderId))
                })
            }),
            Property::always("no key naming two orders", |_, state: &State| {
                (0..=state.intent).all(|intent| {
                    state
                        .orders
                        .iter()
                        .filter(|order| {
                            order.intent == intent && order.status != OrderStatus::Withdrawn
                        })
                        .count()
                        <= 1
                })
            }),
            Property::always(
                "a create answered refused is never charged",
                |_, state: &State| {
                    state.answers.iter().all(|answer| !matches!(answer, Answer::Refused { order } if state.bank_charges.contains(order)))
                },
            ),
            Property::always(
                "a create answered pending names an order that exists",
                |_, state: &State| {
                    state
                    .answers
                    .iter()
                    .all(|answer| !matches!(answer, Answer::Pending { order } if state.orders[*order as usize].status == OrderStatus::Withdrawn))
                },
            ),
            Property::always(
                "a create answered done names a paid order",
                |_, state: &State| {
                    state.answers.iter().all(|answer| match *answer {
                        Answer::Done { order } | Answer::Replayed { order, .. } => {
                            state.orders[order as usize].status == OrderStatus::Paid
                        }
                        _ => true,
                    })
                },
            ),
            Property::eventually(
                "every charged order eventually settled",
                |_, state: &State| {
                    state.attempts_left == 0
                        && state.tasks.is_empty()
                        && state
                            .orders
                            .iter()
                            .all(|order| order.status != OrderStatus::PendingPayment)
                },
            ),
            Property::sometimes("a replay", |_, state: &State| {
                state
                    .answers
                    .iter()
                    .any(|answer| matches!(answer, Answer::Replayed { .. }))
            }),
            Property::sometimes("a refusal", |_, state: &State| {
                state
                    .answers
                    .iter()
                    .any(|answer| matches!(answer, Answer::Refused { .. }))
            }),
            Property::sometimes(
                "a pending create settled by a completer",
                |_, state: &State| {
                    state
                    .answers
                    .iter()
                    .any(|answer| matches!(answer, Answer::Pending { order } if state.orders[*order as usize].status == OrderStatus::Paid))
                    && state.tasks.is_empty()
                },
            ),
            Property::sometimes(
                "a key reused after its TTL, charged again",
                |_, state: &State| state.intent > 0 && state.bank_charges.len() > 1,
            ),
        ]
    }
}

impl State {
    /// Every done answer (fresh or replayed) of `order`'s intent names `order`.
    fn key_answers_agree(&self, order: OrderId) -> bool {
        let intent = self.orders[order as usize].intent;
        self.answers.iter().all(|answer| match *answer {
            Answer::Done { order: other } | Answer::Replayed { order: other, .. } => {
                self.orders[other as usize].intent != intent || other == order
            }
            _ => true,
        })
    }
}

#[test]
fn the_model_of_a_key_keeps_every_promise() {
    let started = Instant::now();
    let checker = KeyModel { bug: None }
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    println!(
        "model of a key: {} states explored ({} distinct), depth {}, in {:.1} s",
        checker.state_count(),
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed().as_secs_f64()
    );
    checker.assert_properties();
}

/// Each past bug, put back into the model, is caught by the property named after the promise
/// it broke (the search stops at the first counterexample).
#[test]
fn the_model_catches_each_past_bug() {
    for (bug, property) in [
        (PastBug::StaleTakeover, "no key naming two orders"),
        (PastBug::ExpiryOfALiveLease, "no order without its key"),
        (
            PastBug::ReaperWithoutOuterRecheck,
            "no order without its key",
        ),
        (
            PastBug::ExpiredAnswerReplayed,
            "a replay only of an unexpired answer, identical to the first",
        ),
    ] {
        let started = Instant::now();
        let checker = KeyModel { bug: Some(bug) }
            .checker()
            .threads(2)
            .finish_when(HasDiscoveries::AnyOf(BTreeSet::from([property])))
            .spawn_bfs()
            .join();
        let path = checker
            .discovery(property)
            .unwrap_or_else(|| panic!("{bug:?} is not caught by \"{property}\""));
        println!(
            "{bug:?}: caught by \"{property}\" in {:.1} s, after {:?}",
            started.elapsed().as_secs_f64(),
            path.into_actions()
        );
    }
}
