//! The balancer's choices, against replicas that record their calls and answer as told.

use std::{
    collections::BTreeMap,
    sync::atomic::{AtomicBool, AtomicUsize},
};

use tokio::sync::Semaphore;

use super::*;

/// A replica's channel: records the calls it gets; refuses the connection while `down`, answers
/// `UNAVAILABLE` while `unavailable`; answers only once `gate` lets it.
#[derive(Clone)]
struct Fake {
    address: SocketAddr,
    calls: Arc<Mutex<Vec<SocketAddr>>>,
    down: Arc<AtomicBool>,
    unavailable: Arc<AtomicBool>,
    gate: Arc<Semaphore>,
}

impl Service<Request<()>> for Fake {
    type Response = Response<()>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<Response<()>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _request: Request<()>) -> Self::Future {
        let fake = self.clone();
        Box::pin(async move {
            if fake.down.load(Ordering::Relaxed) {
                return Err(io::Error::from(io::ErrorKind::ConnectionRefused));
            }
            fake.calls.lock().unwrap().push(fake.address);
            let _answer = fake.gate.acquire().await.expect("the gate stays open");
            let mut response = Response::new(());
            if fake.unavailable.load(Ordering::Relaxed) {
                response
                    .headers_mut()
                    .insert("grpc-status", http::HeaderValue::from_static("14"));
            }
            Ok(response)
        })
    }
}

/// Fakes sharing one call log; answering at once unless the gate is closed.
struct Replicas {
    calls: Arc<Mutex<Vec<SocketAddr>>>,
    down: Arc<Mutex<BTreeMap<SocketAddr, Arc<AtomicBool>>>>,
    unavailable: Arc<Mutex<BTreeMap<SocketAddr, Arc<AtomicBool>>>>,
    gate: Arc<Semaphore>,
    connected: Arc<AtomicUsize>,
}

impl Replicas {
    fn new() -> Self {
        Self {
            calls: Arc::default(),
            down: Arc::default(),
            unavailable: Arc::default(),
            gate: Arc::new(Semaphore::new(Semaphore::MAX_PERMITS)),
            connected: Arc::default(),
        }
    }

    fn connect(&self) -> impl Fn(SocketAddr) -> Fake + Send + 'static {
        let (calls, down, unavailable, gate, connected) = (
            self.calls.clone(),
            self.down.clone(),
            self.unavailable.clone(),
            self.gate.clone(),
            self.connected.clone(),
        );
        move |address| {
            connected.fetch_add(1, Ordering::Relaxed);
            let down = down.lock().unwrap().entry(address).or_default().clone();
            let unavailable = unavailable
                .lock()
                .unwrap()
                .entry(address)
                .or_default()
                .clone();
            Fake {
                address,
                calls: calls.clone(),
                down,
                unavailable,
                gate: gate.clone(),
            }
        }
    }

    /// A balancer over `addresses`, resolved once an hour.
    fn balance(&self, addresses: &[SocketAddr]) -> Balance<Fake> {
        let addresses: BTreeSet<SocketAddr> = addresses.iter().copied().collect();
        Balance::discovering(
            "payment",
            Duration::from_secs(3_600),
            move || std::future::ready(Ok(addresses.clone())),
            self.connect(),
        )
    }

    fn set_down(&self, address: SocketAddr, down: bool) {
        self.down
            .lock()
            .unwrap()
            .entry(address)
            .or_default()
            .store(down, Ordering::Relaxed);
    }

    fn set_unavailable(&self, address: SocketAddr, unavailable: bool) {
        self.unavailable
            .lock()
            .unwrap()
            .entry(address)
            .or_default()
            .store(unavailable, Ordering::Relaxed);
    }

    /// How many calls each replica got, and forgets them.
    fn take_counts(&self) -> BTreeMap<SocketAddr, usize> {
        let mut counts = BTreeMap::new();
        for address in std::mem::take(&mut *self.calls.lock().unwrap()) {
            *counts.entry(address).or_default() += 1;
        }
        counts
    }
}

fn replica(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 50053))
}

async fn call(balance: &Balance<Fake>, tried: Option<&PreviousReplicas>) -> Result<(), BoxError> {
    let mut request = Request::new(());
    if let Some(tried) = tried {
        request.extensions_mut().insert(tried.clone());
    }
    balance.clone().call(request).await.map(drop)
}

#[tokio::test]
async fn calls_one_at_a_time_spread_over_every_replica() {
    let replicas = Replicas::new();
    let balance = replicas.balance(&[replica(1), replica(2), replica(3)]);
    for _ in 0..600 {
        call(&balance, None).await.expect("answered");
    }
    let counts = replicas.take_counts();
    assert_eq!(counts.len(), 3, "every replica got calls: {counts:?}");
    assert!(
        counts.values().all(|&count| count >= 120),
        "each at least a fifth: {counts:?}"
    );
}

#[tokio::test]
async fn a_call_goes_to_the_less_busy_of_two() {
    let replicas = Replicas::new();
    replicas.gate.forget_permits(Semaphore::MAX_PERMITS);
    let balance = replicas.balance(&[replica(1), replica(2)]);
    let held: Vec<_> = (0..20)
        .map(|_| {
            tokio::spawn({
                let balance = balance.clone();
                async move { call(&balance, None).await }
            })
        })
        .collect();
    tokio::task::yield_now().await;
    while replicas.calls.lock().unwrap().len() < 20 {
        tokio::task::yield_now().await;
    }
    assert_eq!(
        replicas.take_counts(),
        BTreeMap::from([(replica(1), 10), (replica(2), 10)]),
        "held calls split evenly"
    );
    replicas.gate.add_permits(20);
    for call in held {
        call.await.expect("the call ran").expect("answered");
    }
}

#[tokio::test]
async fn a_retry_goes_to_a_replica_no_earlier_attempt_went_to() {
    let replicas = Replicas::new();
    let balance = replicas.balance(&[replica(1), replica(2), replica(3)]);
    for _ in 0..50 {
        let tried = PreviousReplicas::default();
        for _attempt in 0..3 {
            call(&balance, Some(&tried)).await.expect("answered");
        }
        let mut attempts = replicas.take_counts();
        assert!(
            attempts.len() == 3 && attempts.values().all(|&count| count == 1),
            "three attempts, three replicas: {attempts:?}"
        );
        call(&balance, Some(&tried))
            .await
            .expect("a fourth attempt still goes somewhere");
        attempts = replicas.take_counts();
        assert_eq!(attempts.values().sum::<usize>(), 1, "{attempts:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_connection_is_not_sent_and_its_replica_left_out_for_a_while() {
    let replicas = Replicas::new();
    let balance = replicas.balance(&[replica(1), replica(2)]);
    replicas.set_down(replica(1), true);
    let refusal = loop {
        if let Err(error) = call(&balance, None).await {
            break error;
        }
    };
    let status = refusal.downcast::<Status>().expect("a status");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert!(
        status
            .message()
            .starts_with("payment: 10.0.0.1:50053 did not take the call"),
        "{status:?}"
    );
    assert!(
        status.metadata().contains_key(wire::NOT_EXECUTED),
        "marked as never sent"
    );
    replicas.take_counts();

    for _ in 0..50 {
        call(&balance, None)
            .await
            .expect("the other replica answers");
    }
    assert_eq!(
        replicas.take_counts(),
        BTreeMap::from([(replica(2), 50)]),
        "the refusing replica is left out"
    );

    replicas.set_down(replica(1), false);
    tokio::time::advance(EJECTION).await;
    for _ in 0..100 {
        call(&balance, None).await.expect("answered");
    }
    assert_eq!(
        replicas.take_counts().len(),
        2,
        "back in the choice after the ejection"
    );
}

#[tokio::test(start_paused = true)]
async fn replicas_follow_the_name_as_it_resolves_again() {
    let replicas = Replicas::new();
    let answers = Arc::new(Mutex::new(vec![
        Ok(BTreeSet::from([replica(1), replica(2)])),
        Err(io::Error::other("name server down")),
        Ok(BTreeSet::from([replica(1)])),
        Ok(BTreeSet::from([replica(1), replica(2), replica(3)])),
    ]));
    let resolve = {
        let answers = answers.clone();
        move || std::future::ready(answers.lock().unwrap().remove(0))
    };
    let interval = Duration::from_secs(5);
    let balance = Balance::discovering("payment", interval, resolve, replicas.connect());
    let mut seen = Vec::new();
    for round in 0..4 {
        if round > 0 {
            // Just after the balancer's own wait, so that it resolved first.
            tokio::time::sleep(interval + Duration::from_millis(1)).await;
        }
        for _ in 0..200 {
            call(&balance, None).await.expect("answered");
        }
        seen.push(replicas.take_counts().into_keys().collect::<Vec<_>>());
    }
    assert_eq!(
        seen,
        [
            vec![replica(1), replica(2)],
            vec![replica(1), replica(2)],
            vec![replica(1)],
            vec![replica(1), replica(2), replica(3)]
        ],
        "a failed resolution keeps the replicas known"
    );
    assert_eq!(
        replicas.connected.load(Ordering::Relaxed),
        4,
        "a replica still listed keeps its channel; one that comes back gets a new one"
    );
}

#[tokio::test]
async fn a_name_that_never_resolved_fails_calls_as_not_sent() {
    let replicas = Replicas::new();
    let balance = Balance::discovering(
        "payment",
        Duration::from_secs(5),
        || std::future::ready(Err(io::Error::other("no such host"))),
        replicas.connect(),
    );
    let status = call(&balance, None)
        .await
        .expect_err("no replica")
        .downcast::<Status>()
        .expect("a status");
    assert_eq!(
        (status.code(), status.message()),
        (
            tonic::Code::Unavailable,
            "payment: no replica resolved: no such host"
        )
    );
    assert!(status.metadata().contains_key(wire::NOT_EXECUTED));
}

#[tokio::test]
async fn an_address_literal_is_one_replica_at_once() {
    let replicas = Replicas::new();
    let balance = Balance::resolving(
        "payment",
        "[::1]",
        50053,
        Duration::from_secs(5),
        replicas.connect(),
    );
    call(&balance, None).await.expect("answered");
    assert_eq!(
        replicas.take_counts(),
        BTreeMap::from([("[::1]:50053".parse().unwrap(), 1)])
    );
}

#[tokio::test(start_paused = true)]
async fn a_replica_that_answers_unavailable_in_a_row_is_left_out_longer_each_time_until_it_answers()
{
    let replicas = Replicas::new();
    let balance = replicas.balance(&[replica(1), replica(2)]);
    replicas.set_unavailable(replica(1), true);
    // Until the first ejection, replica 1 gets its share of the calls.
    let mut calls_to_first = 0;
    while calls_to_first < FAILURES_TO_EJECT {
        call(&balance, None)
            .await
            .expect("an answer, UNAVAILABLE or not");
        calls_to_first += replicas
            .take_counts()
            .get(&replica(1))
            .copied()
            .unwrap_or(0) as u32;
    }
    for ejection in [EJECTION, EJECTION * 2, EJECTION * 4] {
        for _ in 0..20 {
            call(&balance, None).await.expect("answered");
        }
        assert_eq!(
            replicas.take_counts(),
            BTreeMap::from([(replica(2), 20)]),
            "left out for {ejection:?}"
        );
        tokio::time::advance(ejection).await;
        // Back in the choice: its next failure ejects it again, for twice as long.
        while !replicas.take_counts().contains_key(&replica(1)) {
            call(&balance, None).await.expect("answered");
        }
    }
    // A success ends the run of failures and of ejections.
    replicas.set_unavailable(replica(1), false);
    tokio::time::advance(EJECTION * 8).await;
    for _ in 0..200 {
        call(&balance, None).await.expect("answered");
    }
    assert_eq!(
        replicas.take_counts().len(),
        2,
        "answering again, it gets calls again"
    );
}

#[tokio::test]
async fn a_call_never_sent_is_told_from_one_that_may_have_been() {
    let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
    assert!(never_sent(&refused));
    let elapsed = tokio::time::timeout(Duration::ZERO, std::future::pending::<()>())
        .await
        .expect_err("no time at all");
    assert!(
        never_sent(&io::Error::new(io::ErrorKind::TimedOut, elapsed)),
        "the connect timeout"
    );
    assert!(
        !never_sent(&io::Error::from(io::ErrorKind::TimedOut)),
        "a socket's own timeout may come after the call was written"
    );
    assert!(
        never_sent(&io::Error::other(h2::Error::from(
            h2::Reason::REFUSED_STREAM
        ))),
        "found in the source chain"
    );
    for maybe_sent in [
        io::Error::from(io::ErrorKind::ConnectionReset),
        io::Error::other(h2::Error::from(h2::Reason::CANCEL)),
    ] {
        assert!(!never_sent(&maybe_sent), "{maybe_sent}");
    }
}
