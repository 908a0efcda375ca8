//! The gateway's retry policy, driven through `tower::retry::Retry` on tokio's paused clock.
//!
//! A scripted bank answers each attempt from a list, in order, and logs when it was called. Every
//! operation is a call under a gateway hop, whose deadline the policy reads. The paused clock moves on
//! by itself whenever all tasks are idle, so backoffs take no wall time and instants stay exact.

use std::{
    collections::VecDeque,
    iter::repeat_with,
    sync::{Arc, Mutex},
    time::Duration,
};

use deadline::{Deadline, ForwardPolicy, Hop, HopStats, Slice};
use resilience::retry::{Call, PreviousReplicas, RetryPolicy, RetrySettings, RetryStatsSnapshot};
use tokio::time::{Instant, Sleep, sleep};
use tonic::{Code, Status, metadata::MetadataMap};
use tower::{
    Service, ServiceExt,
    retry::{Policy, Retry},
    service_fn,
};

type Answer = Result<&'static str, Status>;

/// The gateway's forwarding toward orders, as configured by default: keep up to 20 ms, never call
/// with under 50 ms.
const TO_ORDERS: ForwardPolicy = ForwardPolicy {
    reserve_ms: 20,
    reserve_max_share: 0.2,
    cap_ms: None,
    min_forward_ms: 50,
};

const fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn retry_policy(settings: RetrySettings) -> RetryPolicy {
    RetryPolicy::new(&settings, TO_ORDERS).expect("valid retry settings")
}

fn unavailable() -> Status {
    Status::unavailable("bank down")
}

fn with_pushback(mut status: Status, millis: &str) -> Status {
    status
        .metadata_mut()
        .insert(wire::RETRY_PUSHBACK_MS, millis.parse().unwrap());
    status
}

/// A call made as the gateway makes it: under a hop whose deadline is `budget` from now.
fn call(budget: Duration) -> Call<&'static str> {
    let hop = Arc::new(Hop::new(
        "gateway",
        Deadline::after(Instant::now(), budget),
        HopStats::new(),
    ));
    Call::new("pay", MetadataMap::new(), hop)
}

/// What the bank saw of one attempt.
#[derive(Debug, Clone)]
struct Attempt {
    started: Instant,
    answered: Instant,
    previous_attempts: u32,
    /// `grpc-previous-rpc-attempts` of the request this attempt turns into.
    header: Option<String>,
}

/// A bank that answers attempts from a script, in order, each after `takes`.
#[derive(Clone)]
struct Bank {
    script: Arc<Mutex<VecDeque<Answer>>>,
    log: Arc<Mutex<Vec<Attempt>>>,
    takes: Duration,
}

impl Bank {
    fn new(script: impl IntoIterator<Item = Answer>) -> Self {
        Self {
            script: Arc::new(Mutex::new(script.into_iter().collect())),
            log: Arc::default(),
            takes: Duration::ZERO,
        }
    }

    /// Every attempt takes `takes` before it answers.
    fn taking(mut self, takes: Duration) -> Self {
        self.takes = takes;
        self
    }

    fn attempts(&self) -> Vec<Attempt> {
        self.log.lock().unwrap().clone()
    }

    fn service(
        &self,
    ) -> impl Service<Call<&'static str>, Response = &'static str, Error = Status> + Clone {
        let bank = self.clone();
        service_fn(move |call: Call<&'static str>| {
            let bank = bank.clone();
            async move {
                let started = Instant::now();
                let previous_attempts = call.previous_attempts;
                let request = call.into_request();
                let header = request
                    .metadata()
                    .get(wire::PREVIOUS_ATTEMPTS)
                    .map(|value| value.to_str().unwrap().to_owned());
                if !bank.takes.is_zero() {
                    sleep(bank.takes).await;
                }
                let answer = bank
                    .script
                    .lock()
                    .unwrap()
                    .pop_front()
                    .expect("more attempts than scripted");
                bank.log.lock().unwrap().push(Attempt {
                    started,
                    answered: Instant::now(),
                    previous_attempts,
                    header,
                });
                answer
            }
        })
    }
}

/// `RetryPolicy` unchanged, plus a log of each wait it hands to `Retry`, read from the `Sleep`'s
/// own deadline. That is exact; the bank sees the same wait rounded up to tokio's 1 ms timer tick.
#[derive(Clone)]
struct Probe {
    policy: RetryPolicy,
    waits: Arc<Mutex<Vec<Duration>>>,
}

impl<R> Policy<Call<&'static str>, R, Status> for Probe {
    type Future = Sleep;

    fn retry(
        &mut self,
        call: &mut Call<&'static str>,
        result: &mut Result<R, Status>,
    ) -> Option<Sleep> {
        let wait = Policy::<Call<&'static str>, R, Status>::retry(&mut self.policy, call, result)?;
        self.waits
            .lock()
            .unwrap()
            .push(wait.deadline() - Instant::now());
        Some(wait)
    }

    fn clone_request(&mut self, call: &Call<&'static str>) -> Option<Call<&'static str>> {
        Policy::<Call<&'static str>, R, Status>::clone_request(&mut self.policy, call)
    }
}

/// What one operation came to.
struct Run {
    result: Answer,
    attempts: Vec<Attempt>,
    waits: Vec<Duration>,
    took: Duration,
}

/// One operation at the gateway: `Retry` with `policy` around `bank`, under a `budget` deadline.
async fn operation(policy: &RetryPolicy, bank: &Bank, budget: Duration) -> Run {
    let waits = Arc::new(Mutex::new(Vec::new()));
    let retry = Retry::new(
        Probe {
            policy: policy.clone(),
            waits: Arc::clone(&waits),
        },
        bank.service(),
    );
    let start = Instant::now();
    let result = retry.oneshot(call(budget)).await;
    let took = start.elapsed();
    let waits = waits.lock().unwrap().clone();
    Run {
        result,
        attempts: bank.attempts(),
        waits,
        took,
    }
}

/// Time between one attempt's answer and the next attempt's start, as the bank sees it.
fn gaps(attempts: &[Attempt]) -> Vec<Duration> {
    attempts
        .windows(2)
        .map(|pair| pair[1].started - pair[0].answered)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn non_retryable_codes_get_exactly_one_attempt() {
    let failures = [
        Status::invalid_argument("bad amount"),
        Status::not_found("no such account"),
        Status::already_exists("already paid"),
        Status::failed_precondition("account closed"),
        Status::permission_denied("not yours"),
        Status::unauthenticated("who are you"),
        // Without pushback the server has not said when capacity returns: a retry only adds load.
        Status::resource_exhausted("busy"),
    ];
    for failure in failures {
        let code = failure.code();
        let policy = retry_policy(RetrySettings::default());
        // A scripted success behind the failure: a retry, if made, would show as a second attempt.
        let bank = Bank::new([Err(failure), Ok("paid")]);
        let run = operation(&policy, &bank, ms(5_000)).await;
        assert_eq!(run.attempts.len(), 1, "{code:?}");
        assert_eq!(run.result.unwrap_err().code(), code);
        assert_eq!(
            policy.stats(),
            RetryStatsSnapshot {
                requests: 1,
                stopped_non_retryable: 1,
                ..Default::default()
            },
            "{code:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn unavailable_twice_then_ok_backs_off_doubling_with_jitter() {
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new([Err(unavailable()), Err(unavailable()), Ok("paid")]);
    let run = operation(&policy, &bank, ms(5_000)).await;

    assert_eq!(run.result.unwrap(), "paid");
    let previous: Vec<u32> = run
        .attempts
        .iter()
        .map(|attempt| attempt.previous_attempts)
        .collect();
    assert_eq!(previous, [0, 1, 2]);
    let headers: Vec<Option<&str>> = run
        .attempts
        .iter()
        .map(|attempt| attempt.header.as_deref())
        .collect();
    assert_eq!(headers, [None, Some("1"), Some("2")]);

    // base·2^(n−1) plus a random part of the same size: [200, 400) ms, then [400, 800) ms.
    assert_eq!(run.waits.len(), 2);
    assert!(
        (ms(200)..ms(400)).contains(&run.waits[0]),
        "first wait {:?}",
        run.waits[0]
    );
    assert!(
        (ms(400)..ms(800)).contains(&run.waits[1]),
        "second wait {:?}",
        run.waits[1]
    );
    // The bank sees each wait, rounded up to the timer's 1 ms tick.
    for (gap, wait) in gaps(&run.attempts).into_iter().zip(&run.waits) {
        assert!(
            gap >= *wait && gap < *wait + ms(1),
            "gap {gap:?} for wait {wait:?}"
        );
    }

    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            retries: 2,
            stopped_success: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn always_unavailable_stops_after_max_attempts() {
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new(repeat_with(|| Err(unavailable())).take(10));
    let run = operation(&policy, &bank, ms(10_000)).await;

    assert_eq!(run.attempts.len(), 3);
    assert_eq!(run.result.unwrap_err().code(), Code::Unavailable);
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            retries: 2,
            stopped_attempts: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_is_waited_exactly_from_the_failed_answer() {
    let policy = retry_policy(RetrySettings::default());
    // The failing attempt takes 40 ms, so "after the answer" and "after the start" differ.
    let slow_down = with_pushback(Status::resource_exhausted("slow down"), "300");
    let bank = Bank::new([Err(slow_down), Ok("paid")]).taking(ms(40));
    let run = operation(&policy, &bank, ms(2_000)).await;

    assert_eq!(run.result.unwrap(), "paid");
    assert_eq!(run.attempts.len(), 2);
    // The server's wait replaces the backoff: no jitter, no base.
    assert_eq!(run.waits, [ms(300)]);
    assert_eq!(run.attempts[1].started - run.attempts[0].answered, ms(300));
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            retries: 1,
            stopped_success: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_beyond_the_deadline_returns_the_error_at_once() {
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new([
        Err(with_pushback(
            Status::resource_exhausted("slow down"),
            "5000",
        )),
        Ok("too late"),
    ]);
    // 1 s left cannot hold a 5 s wait: waiting part of it would only return the same error later.
    let run = operation(&policy, &bank, ms(1_000)).await;

    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.took, Duration::ZERO);
    let status = run.result.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    // The caller gets the server's own answer, pushback included, to pass on or obey.
    assert_eq!(
        status
            .metadata()
            .get(wire::RETRY_PUSHBACK_MS)
            .unwrap()
            .to_str()
            .unwrap(),
        "5000"
    );
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            stopped_pushback: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn negative_pushback_means_do_not_retry() {
    // On a transient code the negative pushback is the only thing that stops the retry.
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new([Err(with_pushback(unavailable(), "-1")), Ok("paid")]);
    let run = operation(&policy, &bank, ms(5_000)).await;
    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.result.unwrap_err().code(), Code::Unavailable);
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            stopped_pushback: 1,
            ..Default::default()
        }
    );

    // RESOURCE_EXHAUSTED with "-1": one attempt as well, stopped because the server said so.
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new([
        Err(with_pushback(Status::resource_exhausted("slow down"), "-1")),
        Ok("paid"),
    ]);
    let run = operation(&policy, &bank, ms(5_000)).await;
    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.result.unwrap_err().code(), Code::ResourceExhausted);
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            stopped_pushback: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn no_retry_when_the_deadline_cannot_hold_backoff_plus_an_attempt() {
    let policy = retry_policy(RetrySettings::default());
    // Budget 300 ms and the failing attempt takes 100 ms: 200 ms are left, less than the shortest
    // backoff (200 ms) plus the time an attempt is expected to take (at least min_attempt_ms, 50).
    let bank = Bank::new([Err(unavailable()), Ok("too late")]).taking(ms(100));
    let run = operation(&policy, &bank, ms(300)).await;

    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.result.unwrap_err().code(), Code::Unavailable);
    // Returned as soon as the attempt failed: no backoff slept first.
    assert_eq!(run.took, ms(100));
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            stopped_deadline: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn retry_is_made_when_the_deadline_holds_it() {
    let policy = retry_policy(RetrySettings::default());
    // Same attempt as above, but 2 s: 1.9 s left easily holds < 400 ms of backoff and an attempt.
    let bank = Bank::new([Err(unavailable()), Ok("paid")]).taking(ms(100));
    let run = operation(&policy, &bank, ms(2_000)).await;

    assert_eq!(run.attempts.len(), 2);
    assert_eq!(run.result.unwrap(), "paid");
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            retries: 1,
            stopped_success: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn the_time_of_successful_attempts_counts_against_the_deadline() {
    let policy = retry_policy(RetrySettings::default());
    // A successful attempt of 2 s moves the expected attempt time from 50 ms to
    // 0.8·50 + 0.2·2000 = 440 ms.
    let slow = Bank::new([Ok("paid")]).taking(ms(2_000));
    assert_eq!(
        operation(&policy, &slow, ms(2_500)).await.result.unwrap(),
        "paid"
    );
    // With 500 ms left the 50 ms default would have let any backoff (< 400 ms) through, but the
    // shortest backoff plus 440 ms (640 ms) does not fit.
    let bank = Bank::new([Err(unavailable()), Ok("too late")]);
    let run = operation(&policy, &bank, ms(500)).await;

    assert_eq!(run.attempts.len(), 1);
    assert_eq!(run.result.unwrap_err().code(), Code::Unavailable);
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 2,
            stopped_success: 1,
            stopped_deadline: 1,
            ..Default::default()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn failed_attempts_and_other_operations_leave_the_estimate_alone() {
    let policy = retry_policy(RetrySettings::default());
    // Another operation's slow successes are its own.
    let reads = policy.for_operation();
    let slow = Bank::new([Ok("order")]).taking(ms(2_000));
    assert_eq!(
        operation(&reads, &slow, ms(2_500)).await.result.unwrap(),
        "order"
    );
    // A failed attempt of 2 s says nothing about how long an answer takes: with 500 ms left a
    // backoff of 200 to 400 ms still leaves the 50 ms an attempt is assumed to need.
    let first_slow = Bank::new([Err(unavailable())]).taking(ms(2_000));
    assert_eq!(
        operation(&policy, &first_slow, ms(2_100))
            .await
            .attempts
            .len(),
        1,
        "no time left for a retry"
    );
    let bank = Bank::new([Err(unavailable()), Ok("paid")]);
    let run = operation(&policy, &bank, ms(500)).await;
    assert_eq!((run.attempts.len(), run.result.unwrap()), (2, "paid"));
}

#[tokio::test(start_paused = true)]
async fn a_retry_must_leave_the_hop_its_reserve_and_the_dependency_its_minimum() {
    let policy = retry_policy(RetrySettings::default());
    // The pushback of 340 ms leaves 60 ms of 400: enough for the 50 ms an attempt takes, but the
    // gateway keeps 12 ms of it (20 %) and orders would get 48 ms, under its 50 ms minimum.
    let bank = Bank::new([
        Err(with_pushback(
            Status::resource_exhausted("slow down"),
            "340",
        )),
        Ok("paid"),
    ]);
    let run = operation(&policy, &bank, ms(400)).await;
    assert_eq!(run.attempts.len(), 1);
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 1,
            stopped_pushback: 1,
            ..Default::default()
        }
    );
    // 40 ms less pushback, and the retry fits.
    let bank = Bank::new([
        Err(with_pushback(
            Status::resource_exhausted("slow down"),
            "300",
        )),
        Ok("paid"),
    ]);
    assert_eq!(
        operation(&policy, &bank, ms(400)).await.result.unwrap(),
        "paid"
    );
}

fn expired(slice: Option<Slice>) -> Status {
    let mut status = Status::deadline_exceeded("orders did not answer in time");
    if let Some(slice) = slice {
        status.metadata_mut().insert(
            wire::DEADLINE_SLICE,
            slice.header_value().to_str().unwrap().parse().unwrap(),
        );
    }
    status
}

#[tokio::test(start_paused = true)]
async fn an_expiry_is_retried_only_when_its_slice_was_capped_and_fits_again() {
    let policy = retry_policy(RetrySettings::default());
    // All the time there was: a retry would have less of it.
    for slice in [None, Some(Slice::new(ms(1_800), false))] {
        let bank = Bank::new([Err(expired(slice)), Ok("paid")]);
        let run = operation(&policy, &bank, ms(2_000)).await;
        assert_eq!(
            (run.attempts.len(), run.result.unwrap_err().code()),
            (1, Code::DeadlineExceeded),
            "{slice:?}"
        );
    }
    assert_eq!(policy.stats().stopped_deadline, 2);
    // A capped 300 ms slice, with time left for another 300 ms after the backoff.
    let bank = Bank::new([Err(expired(Some(Slice::new(ms(300), true)))), Ok("paid")]);
    assert_eq!(
        operation(&policy, &bank, ms(2_000)).await.result.unwrap(),
        "paid"
    );
    // A capped 300 ms slice with 500 ms left: after a backoff of at least 200 ms another 300 ms
    // (plus the gateway's reserve) does not fit.
    let bank = Bank::new([Err(expired(Some(Slice::new(ms(300), true)))), Ok("paid")]);
    assert_eq!(operation(&policy, &bank, ms(500)).await.attempts.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_failure_the_edge_stopped_retrying_for_its_limits_is_marked_for_its_clients() {
    let policy = retry_policy(RetrySettings {
        max_attempts: 2,
        ..Default::default()
    });
    let bank = Bank::new([Err(unavailable()), Err(unavailable())]);
    let failure = operation(&policy, &bank, ms(2_000))
        .await
        .result
        .unwrap_err();
    assert_eq!(
        failure.metadata().get(wire::RETRIES_SPENT).unwrap(),
        "attempts"
    );
    // A failure no retry could fix is not marked: the client may well send a corrected request.
    let bank = Bank::new([Err(Status::invalid_argument("bad amount"))]);
    let failure = operation(&policy, &bank, ms(2_000))
        .await
        .result
        .unwrap_err();
    assert!(failure.metadata().get(wire::RETRIES_SPENT).is_none());
}

#[tokio::test(start_paused = true)]
async fn a_failure_after_retries_says_how_many_attempts_came_before_it() {
    let policy = retry_policy(RetrySettings::default());
    let bank = Bank::new([Err(unavailable()), Err(unavailable()), Err(unavailable())]);
    let failure = operation(&policy, &bank, ms(10_000))
        .await
        .result
        .unwrap_err();
    assert_eq!(
        failure.metadata().get(wire::PREVIOUS_ATTEMPTS).unwrap(),
        "2"
    );
    // The only attempt's failure says nothing: there was none before it.
    let bank = Bank::new([Err(Status::invalid_argument("bad amount"))]);
    let failure = operation(&policy, &bank, ms(2_000))
        .await
        .result
        .unwrap_err();
    assert!(failure.metadata().get(wire::PREVIOUS_ATTEMPTS).is_none());
}

#[tokio::test(start_paused = true)]
async fn retry_budget_caps_retries_at_ten_percent_of_requests() {
    // The share alone: no floor (budget_min_per_sec 0) and no throttle (throttle_max_tokens 0),
    // which would otherwise stop every retry after ten failures. A retry is allowed while the
    // window's retries are fewer than 10 % of its requests: the first operation gets one, then
    // every tenth. The ten backoffs take about 3 s, well inside the 10 s window.
    let policy = retry_policy(RetrySettings {
        budget_min_per_sec: 0,
        throttle_max_tokens: 0,
        ..Default::default()
    });
    let bank = Bank::new(repeat_with(|| Err(unavailable())).take(300));
    let retry = Retry::new(policy.clone(), bank.service());
    for _ in 0..100 {
        // Each operation its own call, with a deadline that never stands in the way.
        let result = retry.clone().oneshot(call(ms(10_000))).await;
        assert_eq!(result.unwrap_err().code(), Code::Unavailable);
    }

    // The retried ones failed again, and their third attempt was refused by the budget too.
    assert_eq!(
        policy.stats(),
        RetryStatsSnapshot {
            requests: 100,
            retries: 10,
            stopped_budget: 100,
            ..Default::default()
        }
    );
    assert_eq!(bank.attempts().len(), 110);
    // Which operations were retried, counted by the first attempts before each retry.
    let mut operations = 0;
    let retried: Vec<u32> = bank
        .attempts()
        .iter()
        .filter_map(|attempt| match attempt.previous_attempts {
            0 => {
                operations += 1;
                None
            }
            _ => Some(operations),
        })
        .collect();
    assert_eq!(retried, [1, 11, 21, 31, 41, 51, 61, 71, 81, 91]);
}

#[tokio::test(start_paused = true)]
async fn first_backoff_is_spread_over_one_base() {
    // One policy for all operations, as at the gateway: each request must still draw its own
    // jitter. budget_percent 1 lets every request fund its own retry, so the budget stays out of it.
    let policy = retry_policy(RetrySettings {
        budget_percent: 1.0,
        ..Default::default()
    });
    let mut first_waits = Vec::new();
    for _ in 0..500 {
        let bank = Bank::new([Err(unavailable()), Ok("paid")]);
        let run = operation(&policy, &bank, ms(5_000)).await;
        assert_eq!(run.result.unwrap(), "paid");
        assert_eq!(run.waits.len(), 1);
        first_waits.push(run.waits[0]);
    }
    assert_eq!(policy.stats().retries, 500);

    for wait in &first_waits {
        assert!((ms(200)..ms(400)).contains(wait), "{wait:?}");
    }
    // Uniform over [200, 400) ms: both ends are reached and the mean (σ ≈ 2.6 ms over 500) is central.
    assert!(
        first_waits.iter().any(|wait| *wait < ms(250)),
        "none below 250 ms"
    );
    assert!(
        first_waits.iter().any(|wait| *wait > ms(350)),
        "none above 350 ms"
    );
    let mean = first_waits.iter().sum::<Duration>() / first_waits.len() as u32;
    assert!(mean > ms(270) && mean < ms(330), "mean {mean:?}");
}

#[tokio::test(start_paused = true)]
async fn backoff_never_exceeds_backoff_max() {
    // Five retries of one operation within about a second: a floor of 10 per second keeps the
    // budget out of the way (the default 2 per second only just pays for them), and five failures
    // leave the throttle open.
    let settings = RetrySettings {
        max_attempts: 6,
        backoff_max_ms: 300,
        budget_min_per_sec: 10,
        ..Default::default()
    };
    for _ in 0..50 {
        // A fresh policy per operation: five retries each would soon drain a shared budget.
        let policy = retry_policy(settings.clone());
        let bank = Bank::new(repeat_with(|| Err(unavailable())).take(6));
        let run = operation(&policy, &bank, ms(60_000)).await;

        assert_eq!(run.attempts.len(), 6);
        assert_eq!(run.waits.len(), 5);
        // The cap includes the jitter: the first wait is 200 ms plus at most 100 ms of jitter.
        assert!(
            (ms(200)..=ms(300)).contains(&run.waits[0]),
            "{:?}",
            run.waits
        );
        // From the second retry on, the doubled base (400 ms) is capped and leaves no room for jitter.
        assert!(
            run.waits[1..].iter().all(|wait| *wait == ms(300)),
            "{:?}",
            run.waits
        );
        assert!(gaps(&run.attempts).iter().all(|gap| *gap <= ms(300)));
        assert_eq!(policy.stats().stopped_attempts, 1);
    }
}

#[test]
fn into_request_numbers_only_retries() {
    let mut metadata = MetadataMap::new();
    metadata.insert("idempotency-key", "op-1".parse().unwrap());
    let first = Call {
        metadata,
        ..call(ms(2_000))
    };
    assert_eq!(first.previous_attempts, 0);

    let request = first.clone().into_request();
    assert_eq!(*request.get_ref(), "pay");
    assert_eq!(
        request
            .metadata()
            .get("idempotency-key")
            .unwrap()
            .to_str()
            .unwrap(),
        "op-1"
    );
    // A first attempt carries no header at all (not "0").
    assert!(request.metadata().get(wire::PREVIOUS_ATTEMPTS).is_none());

    let request = Call {
        previous_attempts: 2,
        ..first
    }
    .into_request();
    assert_eq!(*request.get_ref(), "pay");
    assert_eq!(
        request
            .metadata()
            .get("idempotency-key")
            .unwrap()
            .to_str()
            .unwrap(),
        "op-1"
    );
    assert_eq!(
        request
            .metadata()
            .get(wire::PREVIOUS_ATTEMPTS)
            .unwrap()
            .to_str()
            .unwrap(),
        "2"
    );
}

#[test]
fn every_attempt_of_a_call_shares_the_replicas_tried() {
    let first = call(ms(2_000));
    let replica = "10.0.0.1:50053".parse().unwrap();
    first
        .clone()
        .into_request()
        .extensions()
        .get::<PreviousReplicas>()
        .expect("carried by the request")
        .push(replica);
    let retry = Call {
        previous_attempts: 1,
        ..first.clone()
    }
    .into_request();
    assert!(
        retry
            .extensions()
            .get::<PreviousReplicas>()
            .unwrap()
            .contains(replica),
        "the retry knows where the first attempt went"
    );
    let other = call(ms(2_000)).into_request();
    assert!(
        !other
            .extensions()
            .get::<PreviousReplicas>()
            .unwrap()
            .contains(replica),
        "another call starts afresh"
    );
}
