//! The promises, checked on a recorded history and the database it left: each violation is
//! named after the property it breaks, with what shows it.

use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex},
};

/// What one create answered its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    Done {
        order: String,
        body: Vec<u8>,
    },
    Replayed {
        body: Vec<u8>,
    },
    /// Refused before anything could be charged; `order` is the one withdrawn (the client is
    /// not told it, the checker is).
    Refused {
        order: String,
    },
    Pending {
        order: String,
    },
    InFlight,
    /// The task was dropped before it answered.
    Dropped,
    Failed(String),
}

/// One entry of the history, in the order the simulation recorded them.
#[derive(Debug, Clone)]
pub(crate) enum Event {
    Invoked {
        call: u64,
        scope: String,
        key: String,
        clock_ms: i64,
    },
    Answered {
        call: u64,
        answer: Answer,
    },
    /// The bank executed a charge: the first call under its payment key.
    BankExecuted {
        order: String,
    },
    /// Phase 1 of a create committed `order`, as the create saw at `clock_ms` once it returned:
    /// a time by which the order existed. Its row's `created_ms`, taken just before the phase's
    /// statement, can be far earlier: the statement may wait for a row lock meanwhile.
    Made {
        order: String,
        clock_ms: i64,
    },
    /// Record phase `attempt` of `order` returned: `committed` or not.
    Recorded {
        order: String,
        attempt: i64,
        committed: bool,
    },
}

/// The history of one run, shared by every task that records into it.
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    events: Arc<Mutex<Vec<Event>>>,
}

impl History {
    pub(crate) fn record(&self, event: Event) {
        self.events.lock().expect("history lock").push(event);
    }

    pub(crate) fn events(&self) -> Vec<Event> {
        self.events.lock().expect("history lock").clone()
    }
}

storage::row! {
    /// An order row at the end of the run: `paid_from_ms` is the clock before its record phase
    /// began (the key's expiry is at least `paid_from_ms + ttl`), `paid_ms` the clock inside it
    /// (the expiry is at most `paid_ms + ttl`), `recorded_by` that phase's attempt.
    #[derive(Debug, Clone)]
    pub struct OrderRow {
        pub order_id: String,
        pub scope: String,
        pub idempotency_key: String,
        pub status: String,
        pub created_ms: i64,
        pub paid_from_ms: Option<i64>,
        pub paid_ms: Option<i64>,
        pub recorded_by: Option<i64>,
        pub charge_id: Option<i64>,
    }
}

storage::row! {
    /// A key row at the end of the run, as far as it names an order.
    #[derive(Debug, Clone)]
    pub struct KeyRow {
        pub scope: String,
        pub idempotency_key: String,
        pub resource_id: Option<String>,
    }
}

/// The answer a completed create stores for `order`, byte for byte.
pub(crate) fn stored_body(order: &str, charge_id: i64, attempt: i64) -> Vec<u8> {
    format!("{order} paid by charge {charge_id} in record attempt {attempt}").into_bytes()
}

impl OrderRow {
    /// The answer its record phase stored with the key.
    fn stored_body(&self) -> Option<Vec<u8>> {
        Some(stored_body(
            &self.order_id,
            self.charge_id?,
            self.recorded_by?,
        ))
    }
}

fn order_of(body: &[u8]) -> String {
    String::from_utf8_lossy(body)
        .split(' ')
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// What the history shows, for the report.
#[derive(Debug, Default)]
pub(crate) struct Summary {
    pub invocations: usize,
    pub by_answer: BTreeMap<&'static str, usize>,
    pub bank_executions: usize,
    pub orders: usize,
}

/// Checks every property; returns the violations, each prefixed with its property's name.
pub(crate) fn check(
    events: &[Event],
    orders: &[OrderRow],
    keys: &[KeyRow],
    ttl_ms: i64,
) -> (Summary, Vec<String>) {
    let mut violations = Vec::new();
    let by_id: HashMap<&str, &OrderRow> = orders
        .iter()
        .map(|order| (order.order_id.as_str(), order))
        .collect();
    let charged: Vec<&str> = events
        .iter()
        .filter_map(|event| match event {
            Event::BankExecuted { order } => Some(order.as_str()),
            _ => None,
        })
        .collect();
    let invoked: HashMap<u64, (&str, &str, i64)> = events
        .iter()
        .filter_map(|event| match event {
            Event::Invoked {
                call,
                scope,
                key,
                clock_ms,
            } => Some((*call, (scope.as_str(), key.as_str(), *clock_ms))),
            _ => None,
        })
        .collect();
    let mut summary = Summary {
        invocations: invoked.len(),
        bank_executions: charged.len(),
        orders: orders.len(),
        ..Summary::default()
    };

    // At most one bank charge per client intent while its key lives; no key naming two orders.
    // A key's next order may exist only once the one before was settled and its key expired:
    // a half-done key never expires, and a completed one lives at least `ttl` past its record.
    // An order existed by the time its create saw phase 1 return; one whose create was dropped
    // before it saw that has only its row's time, taken before the phase's statement.
    let made_events: HashMap<&str, i64> = events
        .iter()
        .filter_map(|event| match event {
            Event::Made { order, clock_ms } => Some((order.as_str(), *clock_ms)),
            _ => None,
        })
        .collect();
    let made_ms = |order: &OrderRow| {
        made_events
            .get(order.order_id.as_str())
            .copied()
            .unwrap_or(order.created_ms)
    };
    let mut per_key: BTreeMap<(&str, &str), Vec<&OrderRow>> = BTreeMap::new();
    for order in orders {
        per_key
            .entry((&order.scope, &order.idempotency_key))
            .or_default()
            .push(order);
    }
    for ((scope, key), mut made) in per_key {
        made.sort_by_key(|order| made_ms(order));
        for pair in made.windows(2) {
            let (earlier, later) = (pair[0], pair[1]);
            let ended_at = earlier.paid_from_ms.map(|paid_from| paid_from + ttl_ms);
            if ended_at.is_none_or(|ended_at| made_ms(later) < ended_at) {
                let both_charged = charged.contains(&earlier.order_id.as_str())
                    && charged.contains(&later.order_id.as_str());
                let property = if both_charged {
                    "at most one bank charge per client intent while its key lives"
                } else {
                    "no key naming two orders"
                };
                violations.push(format!(
                    "{property}: {scope}/{key} made {} at {} ms while its key still protected {} ({}, record began at {:?} ms, ttl {ttl_ms} ms)",
                    later.order_id,
                    made_ms(later),
                    earlier.order_id,
                    earlier.status,
                    earlier.paid_from_ms
                ));
            }
        }
    }

    // No order without its key: an order not settled is what its key names.
    for order in orders.iter().filter(|order| order.status != "paid") {
        let named = keys.iter().any(|key| {
            key.scope == order.scope
                && key.idempotency_key == order.idempotency_key
                && key.resource_id.as_deref() == Some(&order.order_id)
        });
        if !named {
            violations.push(format!(
                "no order without its key: {} of {}/{} is {} and no key names it",
                order.order_id, order.scope, order.idempotency_key, order.status
            ));
        }
    }

    // Every charged order eventually settled (the run ends with the completer drained).
    for order in &charged {
        if by_id.get(order).is_none_or(|row| row.status != "paid") {
            violations.push(format!(
                "every charged order eventually settled: {order} was charged and is {:?}",
                by_id.get(order).map(|row| &row.status)
            ));
        }
    }
    for order in orders.iter().filter(|order| order.status != "paid") {
        violations.push(format!(
            "every charged order eventually settled: {} is still {} after the completer drained",
            order.order_id, order.status
        ));
    }

    // A phase commits whole, with its key's move, or not at all: an order is paid by a record
    // phase that did not fail (one that was dropped may have committed).
    for order in orders.iter().filter(|order| order.status == "paid") {
        let failed = events.iter().any(|event| {
            matches!(event, Event::Recorded { order: recorded, attempt, committed: false } if *recorded == order.order_id && Some(*attempt) == order.recorded_by)
        });
        if failed {
            violations.push(format!(
                "a phase commits whole or not at all: {} was paid by record attempt {:?}, which failed",
                order.order_id, order.recorded_by
            ));
        }
    }

    for event in events {
        let Event::Answered { call, answer, .. } = event else {
            continue;
        };
        *summary.by_answer.entry(answer_kind(answer)).or_default() += 1;
        let (scope, key, invoked_ms) = invoked[call];
        match answer {
            Answer::Done { order, body } => match by_id.get(order.as_str()) {
                Some(row) if row.status == "paid" && row.stored_body().as_ref() == Some(body) => {}
                row => violations
                    .push(format!("a create answered done names a paid order: call {call} on {scope}/{key} answered {order}, which is {row:?}")),
            },
            Answer::Replayed { body } => {
                let order = order_of(body);
                match by_id.get(order.as_str()) {
                    Some(row) if row.stored_body().as_ref() == Some(body) => {
                        if row.paid_ms.is_some_and(|paid| invoked_ms >= paid + ttl_ms) {
                            violations.push(format!(
                                "a replay only of an unexpired answer, identical to the first: call {call} on {scope}/{key} invoked at {invoked_ms} ms replayed {order}, whose key expired by {} ms",
                                row.paid_ms.unwrap_or_default() + ttl_ms
                            ));
                        }
                    }
                    row => violations.push(format!(
                        "a replay only of an unexpired answer, identical to the first: call {call} on {scope}/{key} replayed {:?} for {row:?}",
                        String::from_utf8_lossy(body)
                    )),
                }
            }
            Answer::Refused { order } => {
                if charged.contains(&order.as_str()) || by_id.contains_key(order.as_str()) {
                    violations.push(format!("a create answered refused is never charged later: {order} of call {call} on {scope}/{key}"));
                }
            }
            Answer::Pending { order } => {
                if !by_id.contains_key(order.as_str()) {
                    violations.push(format!("a create answered pending names an order that exists: {order} of call {call} on {scope}/{key}"));
                }
            }
            Answer::InFlight | Answer::Dropped | Answer::Failed(_) => {}
        }
    }
    (summary, violations)
}

fn answer_kind(answer: &Answer) -> &'static str {
    match answer {
        Answer::Done { .. } => "done",
        Answer::Replayed { .. } => "replayed",
        Answer::Refused { .. } => "refused",
        Answer::Pending { .. } => "pending",
        Answer::InFlight => "in flight",
        Answer::Dropped => "dropped",
        Answer::Failed(_) => "failed",
    }
}
