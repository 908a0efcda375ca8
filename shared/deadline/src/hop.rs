//! The request-scoped record of one hop: its deadline and what it did with it.
//!
//! The server layer creates a [`Hop`] per request and hands it to the handler with the request
//! ([`Hop::of`]). The handler passes it on with each call it makes ([`Hop::request`]), where the
//! client layer finds the deadline to forward and records what it forwarded.

use std::collections::VecDeque;
use std::sync::{
    Arc, Mutex,
    atomic::{AtomicU64, Ordering},
};
use std::time::{Duration, SystemTime};

use telemetry::{
    attr,
    metrics::{self, Counter, Histogram, KeyValue},
};
use tokio::time::Instant;

use crate::{
    Deadline, Forward,
    ledger::{self, Entry},
};

/// How many answers a hop keeps with their ledgers, for its live view.
const RECENT_ANSWERS: usize = 20;

/// A request that came through no deadline layer, so has no hop: a service put together
/// without it, never a caller's doing.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the request was served outside the deadline layer: it has no deadline")]
pub struct NoHop;

impl From<NoHop> for tonic::Status {
    fn from(error: NoHop) -> Self {
        tonic::Status::internal(error.to_string())
    }
}

/// One request's view of the deadline at this hop.
#[derive(Debug)]
pub struct Hop {
    name: &'static str,
    deadline: Deadline,
    stats: Arc<HopStats>,
    previous_attempts: u32,
    record: Mutex<Record>,
}

#[derive(Debug, Default)]
struct Record {
    /// Time spent here before the (last) downstream call, and its slice.
    forward: Option<(Duration, Forward)>,
    /// The ledger the dependency sent back, entries for every hop below this one.
    downstream: Option<String>,
}

impl Hop {
    pub fn new(name: &'static str, deadline: Deadline, stats: Arc<HopStats>) -> Self {
        Self {
            name,
            deadline,
            stats,
            previous_attempts: 0,
            record: Mutex::new(Record::default()),
        }
    }

    /// Marks the request as a retry: `previous` attempts of the edge operation came before it.
    pub fn with_previous_attempts(mut self, previous: u32) -> Self {
        self.previous_attempts = previous;
        self
    }

    /// Attempts of the edge operation before this one (0: a first attempt).
    pub fn previous_attempts(&self) -> u32 {
        self.previous_attempts
    }

    /// The hop `request` is served under: the server layer attaches it to every request it
    /// passes on.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Arc<Hop>, NoHop> {
        request.extensions().get::<Arc<Hop>>().cloned().ok_or(NoHop)
    }

    /// `message` as a call to a dependency under this hop's deadline: the client layer forwards
    /// what is left of it. A call made without a hop is refused (see [`crate::client`]).
    pub fn request<T>(self: &Arc<Self>, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        self.attach(request.extensions_mut());
        request
    }

    /// Puts this hop's deadline on a call being built: what [`Hop::request`] does.
    pub fn attach(self: &Arc<Self>, extensions: &mut tonic::Extensions) {
        extensions.insert(self.clone());
    }

    pub fn stats(&self) -> &HopStats {
        &self.stats
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    pub fn deadline(&self) -> Deadline {
        self.deadline
    }

    pub(crate) fn record_forward(&self, now: Instant, forward: Forward) {
        let spent = self.deadline.elapsed_at(now);
        self.lock().forward = Some((spent, forward));
    }

    pub(crate) fn record_downstream(&self, ledger: String) {
        self.lock().downstream = Some(ledger);
    }

    /// This hop's own slice as of `now`.
    pub fn entry_at(&self, now: Instant) -> Entry {
        let (spent, reserved, forwarded) = match self.lock().forward {
            Some((spent, forward)) => (spent, forward.reserved, forward.forwarded),
            // A hop that called nobody spent all of its time locally.
            None => (
                self.deadline.elapsed_at(now),
                Duration::ZERO,
                Duration::ZERO,
            ),
        };
        Entry {
            hop: self.name.to_owned(),
            received: self.deadline.budget(),
            spent,
            reserved,
            forwarded,
            left: self.deadline.remaining_at(now),
        }
    }

    /// This hop's ledger entry as of `now`, followed by everything the dependency reported.
    pub fn ledger_at(&self, now: Instant) -> String {
        let entry = self.entry_at(now);
        match &self.lock().downstream {
            Some(downstream) => format!("{entry}, {downstream}"),
            None => entry.to_string(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Record> {
        // The record holds plain values; a panic elsewhere cannot leave it half-written.
        self.record
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// What happened to a request relative to its deadline, when it was not an answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Expired,
    FinishedLate,
    Abandoned,
    FailedFast,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Expired => "expired",
            Outcome::FinishedLate => "finished_late",
            Outcome::Abandoned => "abandoned",
            Outcome::FailedFast => "failed_fast",
        }
    }
}

/// Counters of what happened to requests at one hop relative to their deadlines, kept for the
/// hop's own reports and counted in the chain's metrics as well.
#[derive(Debug)]
pub struct HopStats {
    requests: AtomicU64,
    expired: AtomicU64,
    finished_late: AtomicU64,
    abandoned: AtomicU64,
    failed_fast: AtomicU64,
    outcomes: Counter<u64>,
    slack: Histogram<f64>,
    /// The last answers' ledgers, oldest first.
    recent: Mutex<VecDeque<(SystemTime, &'static str, String)>>,
}

/// One of the hop's last answers, with its ledger.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct RecentAnswer {
    /// When the hop answered, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// `in_time`, `finished_late` or `expired`.
    pub outcome: &'static str,
    /// This hop's slice, then every slice below it.
    pub ledger: Vec<Entry>,
}

/// A copy of [`HopStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct HopStatsSnapshot {
    /// Requests that reached the hop.
    pub requests: u64,
    /// Requests whose deadline passed while the hop worked on them: answered DEADLINE_EXCEEDED.
    pub expired: u64,
    /// Work that completed after its deadline (should stay zero: nobody reads that answer).
    pub finished_late: u64,
    /// Requests whose caller went away (cancelled or disconnected) before the answer.
    pub abandoned: u64,
    /// Downstream calls not made because too little budget was left.
    pub failed_fast: u64,
}

impl HopStats {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            requests: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            finished_late: AtomicU64::new(0),
            abandoned: AtomicU64::new(0),
            failed_fast: AtomicU64::new(0),
            outcomes: metrics::counter(
                metrics::name::DEADLINE_OUTCOMES,
                "Requests that ran into their deadline",
            ),
            slack: metrics::millisecond_histogram(
                metrics::name::DEADLINE_SLACK,
                "Budget left when the hop answered",
            ),
            recent: Mutex::new(VecDeque::with_capacity(RECENT_ANSWERS)),
        })
    }

    /// The last answers (20 at most), newest first.
    pub fn recent_answers(&self) -> Vec<RecentAnswer> {
        let recent = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        recent
            .iter()
            .rev()
            .map(|(at, outcome, ledger)| RecentAnswer {
                at_unix_ms: at
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .map_or(0, |since| since.as_millis() as u64),
                outcome,
                // Written by this crate: it parses.
                ledger: ledger::parse(ledger).unwrap_or_default(),
            })
            .collect()
    }

    /// Keeps an answer's ledger among the recent ones.
    pub(crate) fn remember(&self, outcome: &'static str, ledger: &str) {
        let at = SystemTime::now();
        // Plain values only: a panic elsewhere cannot leave the ring half-written.
        let mut recent = self
            .recent
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        // Once the ring is full, the oldest answer's text is written over: every request crosses
        // this, and a full ring allocates nothing.
        let mut text = if recent.len() == RECENT_ANSWERS {
            recent
                .pop_front()
                .map(|(_, _, text)| text)
                .unwrap_or_default()
        } else {
            String::new()
        };
        text.clear();
        text.push_str(ledger);
        recent.push_back((at, outcome, text));
    }

    pub fn snapshot(&self) -> HopStatsSnapshot {
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        HopStatsSnapshot {
            requests: read(&self.requests),
            expired: read(&self.expired),
            finished_late: read(&self.finished_late),
            abandoned: read(&self.abandoned),
            failed_fast: read(&self.failed_fast),
        }
    }

    pub(crate) fn count_request(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count(&self, hop: &'static str, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Expired => &self.expired,
            Outcome::FinishedLate => &self.finished_late,
            Outcome::Abandoned => &self.abandoned,
            Outcome::FailedFast => &self.failed_fast,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        self.outcomes.add(
            1,
            &[
                KeyValue::new(attr::HOP, hop),
                KeyValue::new("outcome", outcome.as_str()),
            ],
        );
    }

    /// Records the budget `left` when the hop answered.
    pub(crate) fn record_slack(&self, hop: &'static str, left: Duration) {
        self.slack.record(
            left.as_secs_f64() * 1_000.0,
            &[KeyValue::new(attr::HOP, hop)],
        );
    }
}
