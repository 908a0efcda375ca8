//! The charge endpoint: faults first, then a deduplicated charge in an in-memory ledger.

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use deadline::{Deadline, Hop};
use proto::bank::v1::{
    ChargeOutcome, ChargeReply, ChargeRequest, ExchangeRate, ExchangeRateRequest, bank_server::Bank,
};
use serde::Serialize;
use tonic::{Request, Response, Status};

use crate::{
    error::ChargeError,
    faults::{Faults, Plan},
};

/// State shared by the gRPC service and the admin API.
#[derive(Debug)]
pub struct BankState {
    faults: Mutex<Faults>,
    initial_faults: Faults,
    ledger: Mutex<HashMap<String, Charge>>,
    /// Every key that reached the bank: one per user operation, however often it was retried.
    keys_seen: Mutex<HashSet<String>>,
    /// The counters of `GET /admin/stats`, but `distinct_keys`, which is `keys_seen`'s length.
    counters: Mutex<BankStats>,
}

#[derive(Debug, Clone)]
struct Charge {
    request: ChargeRequest,
    reply: ChargeReply,
}

/// `GET /admin/stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct BankStats {
    /// Every attempt that reached the bank.
    pub calls: u64,
    /// Calls marked as retries of an edge operation (`grpc-previous-rpc-attempts` > 0).
    pub retried_calls: u64,
    /// Distinct idempotency keys seen: user operations, so `calls / distinct_keys` is the number
    /// of bank calls per user operation.
    pub distinct_keys: u64,
    /// Distinct committed charges (approved or declined).
    pub charges: u64,
    pub declines: u64,
    /// Calls that repeated a key already charged and got the stored reply.
    pub duplicate_keys: u64,
    pub injected_unavailable: u64,
    pub injected_resource_exhausted: u64,
    pub dropped_replies: u64,
    /// Calls that hung until their caller gave up.
    pub hung: u64,
    /// Charges completed after the caller's deadline: work nobody would read.
    pub late_completions: u64,
}

impl BankState {
    pub fn new(faults: Faults) -> Arc<Self> {
        Arc::new(Self {
            faults: Mutex::new(faults.clone()),
            initial_faults: faults,
            ledger: Mutex::default(),
            keys_seen: Mutex::default(),
            counters: Mutex::default(),
        })
    }

    pub fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    pub fn update_faults<T>(&self, change: impl FnOnce(&mut Faults) -> T) -> T {
        change(&mut lock(&self.faults))
    }

    /// Back to the faults from settings, an empty ledger and zero counters.
    pub fn reset(&self) {
        *lock(&self.faults) = self.initial_faults.clone();
        lock(&self.ledger).clear();
        lock(&self.keys_seen).clear();
        *lock(&self.counters) = BankStats::default();
    }

    pub fn stats(&self) -> BankStats {
        BankStats {
            distinct_keys: lock(&self.keys_seen).len() as u64,
            ..*lock(&self.counters)
        }
    }

    /// Adds one to the counter `counter` picks.
    fn count(&self, counter: fn(&mut BankStats) -> &mut u64) {
        *counter(&mut lock(&self.counters)) += 1;
    }

    /// Commits a charge under `key` once; a repeat with the same request gets the stored reply.
    /// Returns whether this call committed it.
    fn commit(
        &self,
        key: &str,
        request: &ChargeRequest,
        decline: bool,
    ) -> Result<(ChargeReply, bool), ChargeError> {
        let mut ledger = lock(&self.ledger);
        if let Some(existing) = ledger.get(key) {
            if existing.request != *request {
                return Err(ChargeError::KeyReused(existing.reply.charge_id.clone()));
            }
            self.count(|stats| &mut stats.duplicate_keys);
            return Ok((existing.reply.clone(), false));
        }
        let reply = ChargeReply {
            charge_id: format!("ch_{}", uuid::Uuid::now_v7().simple()),
            outcome: if decline {
                ChargeOutcome::Declined
            } else {
                ChargeOutcome::Approved
            } as i32,
            decline_reason: if decline {
                "insufficient_funds".into()
            } else {
                String::new()
            },
        };
        ledger.insert(
            key.to_owned(),
            Charge {
                request: request.clone(),
                reply: reply.clone(),
            },
        );
        self.count(|stats| &mut stats.charges);
        if decline {
            self.count(|stats| &mut stats.declines);
        }
        Ok((reply, true))
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The gRPC `bank.v1.Bank` service.
#[derive(Debug, Clone)]
pub(crate) struct BankService {
    state: Arc<BankState>,
}

impl BankService {
    pub(crate) fn new(state: Arc<BankState>) -> Self {
        Self { state }
    }

    /// Plays this call's faults: hangs, refuses or fails it, or lets it through after its latency
    /// with what a charge should do.
    async fn faults(&self) -> Result<(bool, bool), ChargeError> {
        let (latency, plan) = {
            let faults = self.state.faults();
            let mut rng = rand::rng();
            (faults.latency(&mut rng), faults.plan(&mut rng))
        };
        match plan {
            Plan::Hang => {
                self.state.count(|stats| &mut stats.hung);
                tracing::info!("fault: hanging until the caller gives up");
                // The deadline layer answers and drops this future when the caller's time is up.
                std::future::pending().await
            }
            Plan::ResourceExhausted { pushback_ms } => {
                self.state
                    .count(|stats| &mut stats.injected_resource_exhausted);
                Err(ChargeError::ResourceExhausted { pushback_ms })
            }
            Plan::Unavailable => {
                answer_after(latency).await;
                self.state.count(|stats| &mut stats.injected_unavailable);
                Err(ChargeError::Unavailable)
            }
            Plan::Charge {
                decline,
                drop_reply,
            } => {
                answer_after(latency).await;
                Ok((decline, drop_reply))
            }
        }
    }

    async fn charge(
        &self,
        hop: &Hop,
        key: &str,
        request: &ChargeRequest,
    ) -> Result<ChargeReply, ChargeError> {
        validate(request)?;
        let deadline = hop.deadline();
        let faults = self.state.faults();
        if !faults.ignores_deadlines || faults.hang {
            return self.run_charge(key, request, deadline, true).await;
        }
        // On a task of its own, which the deadline layer cannot end by dropping this future.
        let (bank, key, request) = (self.clone(), key.to_owned(), request.clone());
        tokio::spawn(async move { bank.run_charge(&key, &request, deadline, false).await })
            .await
            .map_err(|_| ChargeError::Unavailable)?
    }

    /// Plays the faults and commits the charge; one that `honours_deadline` commits nothing once
    /// `deadline` has passed.
    async fn run_charge(
        &self,
        key: &str,
        request: &ChargeRequest,
        deadline: Deadline,
        honours_deadline: bool,
    ) -> Result<ChargeReply, ChargeError> {
        let (decline, drop_reply) = self.faults().await?;
        let expired = || deadline.is_expired_at(tokio::time::Instant::now());
        // Nobody reads an answer after the caller's deadline: do not charge for it.
        if honours_deadline && expired() {
            return Err(ChargeError::DeadlinePassed);
        }
        let (reply, committed) = self.state.commit(key, request, decline)?;
        if expired() {
            self.state.count(|stats| &mut stats.late_completions);
        }
        // Only a call that committed can lose its reply; a repeat finds the charge and answers.
        if drop_reply && committed {
            self.state.count(|stats| &mut stats.dropped_replies);
            tracing::info!(charge_id = %reply.charge_id, "fault: dropping the reply of a committed charge");
            return Err(ChargeError::ReplyLost {
                charge_id: reply.charge_id,
            });
        }
        Ok(reply)
    }
}

/// USD per unit of each settled currency, as the bank quotes it.
const USD_RATES: &[(&str, &str)] = &[
    ("CHF", "1.1300"),
    ("CZK", "0.0430"),
    ("DKK", "0.1450"),
    ("EUR", "1.0800"),
    ("GBP", "1.2700"),
    ("JPY", "0.0067"),
    ("NOK", "0.0920"),
    ("PLN", "0.2500"),
    ("SEK", "0.0950"),
    ("USD", "1.0000"),
];

/// Waits `latency`; a zero latency does not wait at all (a timer would round it up to the next
/// millisecond tick).
async fn answer_after(latency: std::time::Duration) {
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
}

fn validate(request: &ChargeRequest) -> Result<(), ChargeError> {
    if !(1..=proto::validate::MAX_AMOUNT_MINOR).contains(&request.amount_minor) {
        return Err(ChargeError::InvalidRequest {
            field: "amount_minor",
            reason: "must be a positive amount within limits".into(),
        });
    }
    if !proto::validate::CURRENCIES.contains(&request.currency.as_str()) {
        return Err(ChargeError::InvalidRequest {
            field: "currency",
            reason: format!("{:?} is not settled here", request.currency),
        });
    }
    Ok(())
}

#[tonic::async_trait]
impl Bank for BankService {
    async fn charge(
        &self,
        request: Request<ChargeRequest>,
    ) -> Result<Response<ChargeReply>, Status> {
        self.state.count(|stats| &mut stats.calls);
        let key = request
            .metadata()
            .get(wire::IDEMPOTENCY_KEY)
            .and_then(|value| value.to_str().ok())
            .map(str::to_owned)
            .ok_or_else(|| ChargeError::MissingKey("absent or not ASCII".into()))?;
        proto::validate::idempotency_key(&key)
            .map_err(|error| ChargeError::MissingKey(error.reason))?;
        let hop = Hop::of(&request)?;
        if hop.previous_attempts() > 0 {
            self.state.count(|stats| &mut stats.retried_calls);
        }
        lock(&self.state.keys_seen).insert(key.clone());
        let reply = BankService::charge(self, &hop, &key, request.get_ref()).await?;
        Ok(Response::new(reply))
    }

    async fn get_exchange_rate(
        &self,
        request: Request<ExchangeRateRequest>,
    ) -> Result<Response<ExchangeRate>, Status> {
        let currency = request.into_inner().currency;
        let Some((_, rate)) = USD_RATES.iter().find(|(code, _)| *code == currency) else {
            return Err(ChargeError::InvalidRequest {
                field: "currency",
                reason: format!("{currency:?} is not quoted here"),
            }
            .into());
        };
        self.faults().await?;
        Ok(Response::new(ExchangeRate {
            currency,
            base: "USD".into(),
            rate: (*rate).to_owned(),
            as_of: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
        }))
    }
}
