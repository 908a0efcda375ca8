//! Two gateways, three replicas of orders and of payment, two webhook senders against one
//! PostgreSQL: `deploy/compose.replicas.yaml`, the users' overlay, with the test's
//! `tests/compose/replicas.yaml`, on the compose test's images. The overlays set `deploy.replicas`
//! (what `--scale` does, kept in the file beside the gateway's share of the quotas); Compose
//! numbers the replicas, publishes each gateway on a host port of its own and lists each
//! replica's container, so the test reaches, counts and stops each one by itself.
//!
//! A hop reaches the replicas of the next by the service's name and spreads its calls over all of
//! them (shared/rpc's README, "Balancing"). Each replica's share is read from its own metrics
//! (`/metrics` on its operations port, from the host), and the connections from the containers'
//! TCP tables (`/proc/<pid>/net/tcp` of their network namespaces).
//!
//! Checked: the same idempotency key through both gateways, one after the other and 50 at once,
//! makes one order and one bank charge; every webhook event reaches each of two endpoints once
//! with both senders running; under a steady load each orders replica serves at least a fifth of
//! the creates; a replica started under load serves creates within 30 s; replicas stopped under
//! load, or one that fails every create, lose no create (the edge retries on another replica what
//! it can, and what fails says to repeat it with its key, which completes it once); and killing
//! one replica of each service under a bounded load loses no order a client was told of and
//! charges none twice.

use std::{
    collections::{BTreeMap, BTreeSet},
    net::Ipv4Addr,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use bank_mock::BankStats;
use futures::{StreamExt, future::join_all, stream};
use reqwest::StatusCode;

use super::{
    ADMIN_TOKEN, Stack, build_images, compose_files, compose_program, docker_inspect, run, say,
};

/// Every service with a health check, each with the replicas the overlay gives it.
const SERVICES: [(&str, usize); 6] = [
    ("postgres", 1),
    ("gateway", 2),
    ("orders", 3),
    ("payment", 3),
    ("bank-mock", 1),
    ("webhook-sender", 2),
];
const ORDERS_PORT: u16 = 50052;
const PAYMENT_PORT: u16 = 50053;
/// The operations ports (plain HTTP `/metrics`) of orders and payment.
const ORDERS_OPS_PORT: u16 = 9465;
const PAYMENT_OPS_PORT: u16 = 9466;
/// The load of the kill: orders, clients sending them at once, and the attempts of each.
const LOAD_ORDERS: usize = 120;
const LOAD_CLIENTS: usize = 8;
const LOAD_ATTEMPTS: usize = 60;
/// The pause before a failed attempt is repeated.
const RETRY_PAUSE: Duration = Duration::from_millis(250);

#[tokio::test(flavor = "multi_thread")]
async fn two_replicas_of_each_service_keep_every_order_once() {
    let Some(program) = compose_program() else {
        e2e::missing(
            "a Docker engine with Compose",
            "the replicas stack was not built or tested",
        );
        return;
    };
    build_images();

    let mut stack = Stack::new(
        program,
        compose_files(&[
            "deploy/compose.replicas.yaml",
            "tests/compose/replicas.yaml",
        ]),
    );
    let started = Instant::now();
    run(stack.compose().args(["up", "--detach", "--no-build"]));
    eventually_healthy(&stack).await;
    say(&format!(
        "replicas stack: up to all healthy in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
    stack.admin_port = stack.published_port("bank-mock", 8099, 1);
    let client = Client {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .expect("an HTTP client"),
        gateways: [1, 2].map(|index| stack.published_port("gateway", 8080, index)),
        admin_port: stack.admin_port,
    };

    one_key_through_both_gateways_one_after_the_other(&stack, &client).await;
    one_key_fifty_times_at_once_through_both_gateways(&stack, &client).await;
    every_event_reaches_each_endpoint_once_with_two_senders(&stack, &client).await;
    a_steady_load_spreads_over_every_replica(&stack, &client).await;
    replicas_started_and_stopped_under_load_lose_no_create(&stack, &client).await;
    a_replica_failing_every_create_costs_no_create(&stack, &client).await;
    killing_a_replica_of_each_service_loses_no_order_and_charges_none_twice(&stack, &client).await;
}

async fn eventually_healthy(stack: &Stack) {
    e2e::eventually(
        Duration::from_secs(180),
        "every replica healthy",
        || async {
            SERVICES.iter().all(|(service, replicas)| {
                stack.containers(service).len() == *replicas && stack.healthy(service)
            })
        },
    )
    .await;
}

/// The test's client of the two gateways and of the bank's admin API.
#[derive(Clone)]
struct Client {
    http: reqwest::Client,
    /// Each gateway's published HTTP port, by replica.
    gateways: [u16; 2],
    admin_port: u16,
}

/// A gateway's answer to a create.
struct Answer {
    status: StatusCode,
    replayed: bool,
    body: Vec<u8>,
}

impl Client {
    /// A create of one order of `customer` through gateway `gateway` (0 or 1) under `key`.
    async fn create(&self, gateway: usize, key: &str, customer: &str) -> reqwest::Result<Answer> {
        let response = self
            .http
            .post(format!("http://127.0.0.1:{}/v1/orders", self.gateways[gateway]))
            .bearer_auth("demo-key-1")
            .header("idempotency-key", key)
            .json(&serde_json::json!({"customer_id": customer, "items": [{"sku": "sku-1", "quantity": 1}], "amount_minor": 700, "currency": "EUR"}))
            .send()
            .await?;
        let status = response.status();
        let replayed = response
            .headers()
            .get("idempotent-replayed")
            .is_some_and(|value| value == "true");
        Ok(Answer {
            status,
            replayed,
            body: response.bytes().await?.to_vec(),
        })
    }

    /// The bank's counters (`/admin/stats` has them at its top level).
    async fn bank(&self) -> BankStats {
        self.http
            .get(format!("http://127.0.0.1:{}/admin/stats", self.admin_port))
            .header(wire::ADMIN_TOKEN, ADMIN_TOKEN)
            .send()
            .await
            .expect("the bank's admin API answers")
            .json()
            .await
            .expect("the bank's counters")
    }

    /// A webhook endpoint for `url`, created through gateway `gateway`: its id and secret.
    async fn endpoint(&self, gateway: usize, url: &str) -> (String, String) {
        let response = self
            .http
            .post(format!(
                "http://127.0.0.1:{}/v1/webhooks/endpoints",
                self.gateways[gateway]
            ))
            .bearer_auth("demo-key-1")
            .header("idempotency-key", format!("replicas-endpoint-{gateway}"))
            .json(&serde_json::json!({"url": url, "event_types": ["order.paid"]}))
            .send()
            .await
            .expect("the gateway answers");
        assert_eq!(response.status(), 201, "the endpoint for {url} is created");
        let created: serde_json::Value = response.json().await.expect("the endpoint as JSON");
        (
            created["endpoint"]["endpoint_id"]
                .as_str()
                .expect("an endpoint id")
                .to_owned(),
            created["secret"].as_str().expect("a secret").to_owned(),
        )
    }
}

/// What the bank did between `before` and `after`: calls, committed charges, and calls that
/// repeated a key already charged (a second execution, which `charges` alone would not show).
fn bank_work(before: BankStats, after: BankStats) -> (u64, u64, u64) {
    (
        after.calls - before.calls,
        after.charges - before.charges,
        after.duplicate_keys - before.duplicate_keys,
    )
}

impl Stack {
    /// `query`'s rows in `database`, as psql prints them unaligned (`|` between columns).
    fn sql(&self, database: &str, query: &str) -> String {
        let output = run(std::process::Command::new("docker").args([
            "exec",
            &self.container("postgres"),
            "sh",
            "-c",
            r#"PGPASSWORD="$POSTGRES_PASSWORD" psql -h 127.0.0.1 -U chain -v ON_ERROR_STOP=1 -tA -d "$0" -c "$1""#,
            database,
            query,
        ]));
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }

    /// How many orders `customer` has, and how many of them are paid: `count|paid`.
    fn orders_of(&self, customer: &str) -> String {
        self.sql("orders", &format!("SELECT count(*), count(*) FILTER (WHERE status = 'paid') FROM orders WHERE customer_id = '{customer}'"))
    }
}

/// The address of `container` on the stack's network (each service here has one).
fn address(container: &str) -> Ipv4Addr {
    let addresses = docker_inspect(
        container,
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
    );
    addresses
        .split_whitespace()
        .next()
        .and_then(|address| address.parse().ok())
        .unwrap_or_else(|| panic!("{container} has an address"))
}

/// The peers of `container`'s established TCP connections to `port`, read from its network
/// namespace's table (`/proc/<pid>/net/tcp`: addresses in hex, as the kernel holds them).
fn peers(container: &str, port: u16) -> BTreeSet<Ipv4Addr> {
    let pid = docker_inspect(container, "{{.State.Pid}}");
    let table = std::fs::read_to_string(format!("/proc/{pid}/net/tcp"))
        .unwrap_or_else(|error| panic!("the TCP table of {container}: {error}"));
    const ESTABLISHED: &str = "01";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (peer, peer_port) = fields.get(2)?.split_once(':')?;
            let wanted = fields.get(3) == Some(&ESTABLISHED)
                && u16::from_str_radix(peer_port, 16).ok()? == port;
            wanted.then(|| {
                Ipv4Addr::from(
                    u32::from_str_radix(peer, 16)
                        .expect("a hex address")
                        .to_ne_bytes(),
                )
            })
        })
        .collect()
}

/// Of `candidates` (containers of the next hop), the ones `container` is connected to on `port`.
fn connected(container: &str, port: u16, candidates: &[String]) -> Vec<String> {
    let peers = peers(container, port);
    candidates
        .iter()
        .filter(|candidate| peers.contains(&address(candidate)))
        .cloned()
        .collect()
}

/// a. One key, through one gateway and then the other, four times: one order, one charge, and the
/// first answer replayed byte for byte by both gateways.
async fn one_key_through_both_gateways_one_after_the_other(stack: &Stack, client: &Client) {
    let before = client.bank().await;
    let mut first = None;
    for attempt in 0..4 {
        let answer = client
            .create(attempt % 2, "replicas-alternating", "replicas-alternating")
            .await
            .expect("the gateway answers");
        assert_eq!(answer.status, 201, "attempt {attempt}: {:?}", answer.body);
        assert_eq!(
            answer.replayed,
            attempt > 0,
            "attempt {attempt} is marked as a replay exactly when it repeats"
        );
        assert_eq!(
            first.get_or_insert_with(|| answer.body.clone()),
            &answer.body,
            "attempt {attempt} replays the first answer"
        );
    }
    assert_eq!(
        bank_work(before, client.bank().await),
        (1, 1, 0),
        "one bank call and one charge (calls, charges, repeated keys)"
    );
    assert_eq!(
        stack.orders_of("replicas-alternating"),
        "1|1",
        "one order, paid"
    );
    say("replicas stack: one key through both gateways in turn: one order, one charge");
}

/// b. 50 repeats of one key at once, half through each gateway: one charge; every other repeat
/// is the replay or a 409 (the first still in flight).
async fn one_key_fifty_times_at_once_through_both_gateways(stack: &Stack, client: &Client) {
    let before = client.bank().await;
    let answers = join_all(
        (0..50).map(|repeat| client.create(repeat % 2, "replicas-at-once", "replicas-at-once")),
    )
    .await;
    let mut statuses = BTreeMap::<u16, usize>::new();
    let mut bodies = BTreeSet::new();
    for answer in answers {
        let answer = answer.expect("the gateway answers");
        *statuses.entry(answer.status.as_u16()).or_default() += 1;
        match answer.status.as_u16() {
            201 => bodies.insert(answer.body),
            409 => false,
            other => panic!("a repeat got {other}: {:?}", answer.body),
        };
    }
    assert_eq!(
        bodies.len(),
        1,
        "every 201 carries the same order: {statuses:?}"
    );
    let after_all = client
        .create(0, "replicas-at-once", "replicas-at-once")
        .await
        .expect("the gateway answers");
    assert!(
        after_all.replayed && bodies.contains(&after_all.body),
        "a repeat once all have finished is the replay"
    );
    assert_eq!(
        bank_work(before, client.bank().await),
        (1, 1, 0),
        "one bank call and one charge (calls, charges, repeated keys)"
    );
    assert_eq!(
        stack.orders_of("replicas-at-once"),
        "1|1",
        "one order, paid"
    );
    say(&format!(
        "replicas stack: one key 50 times at once through both gateways: one charge; statuses {statuses:?}"
    ));
}

/// c. Two endpoints (a receiver each, reachable by both senders), 20 paid orders through both
/// gateways: each receiver processes each event once (the example receiver keeps the `webhook-id`s
/// it has processed), and the senders' attempts log shows one attempt per event and endpoint.
async fn every_event_reaches_each_endpoint_once_with_two_senders(stack: &Stack, client: &Client) {
    const EVENTS: usize = 20;
    let receivers = ["webhook-receiver", "second-receiver"];
    let mut endpoints = Vec::new();
    for (gateway, receiver) in receivers.iter().enumerate() {
        endpoints.push(
            client
                .endpoint(gateway, &format!("http://{receiver}:9000/webhooks"))
                .await,
        );
    }
    run(stack
        .compose()
        .env("WEBHOOK_SECRET", &endpoints[0].1)
        .env("SECOND_WEBHOOK_SECRET", &endpoints[1].1)
        .args([
            "--profile",
            "webhooks",
            "up",
            "--detach",
            "--no-build",
            receivers[0],
            receivers[1],
        ]));

    let answers = join_all((0..EVENTS).map(|order| async move {
        client
            .create(
                order % 2,
                &format!("replicas-webhook-{order}"),
                "replicas-webhooks",
            )
            .await
    }))
    .await;
    let order_ids: BTreeSet<String> = answers
        .into_iter()
        .map(|answer| {
            let answer = answer.expect("the gateway answers");
            assert_eq!(answer.status, 201, "{:?}", answer.body);
            let order: serde_json::Value = serde_json::from_slice(&answer.body).expect("an order");
            order["order_id"].as_str().expect("an order id").to_owned()
        })
        .collect();
    for receiver in receivers {
        // The receiver prints `<webhook-id>: <event>` once per id it processes.
        let processed = || {
            let logs = String::from_utf8_lossy(
                &run(stack.compose().args(["logs", "--no-color", receiver])).stdout,
            )
            .into_owned();
            let mut events = BTreeMap::<String, Vec<String>>::new();
            for line in logs.lines().filter(|line| line.contains("\"order.paid\"")) {
                let (_, printed) = line.split_once(" | ").unwrap_or(("", line));
                let (id, _) = printed.split_once(": ").expect("`<webhook-id>: <event>`");
                if let Some(order) = order_ids.iter().find(|order| line.contains(order.as_str())) {
                    events
                        .entry(order.clone())
                        .or_default()
                        .push(id.trim().to_owned());
                }
            }
            events
        };
        let events = e2e::eventually(
            Duration::from_secs(60),
            &format!("{receiver} processed an event of each order"),
            || async {
                let events = processed();
                (events.len() == EVENTS).then_some(events)
            },
        )
        .await;
        assert!(
            events.values().all(|ids| ids.len() == 1),
            "{receiver} processed one event per order: {events:?}"
        );
    }
    for (endpoint, _) in &endpoints {
        let attempts = format!(
            "SELECT count(*), count(DISTINCT event_id), count(*) FILTER (WHERE outcome = 'delivered') FROM webhook_attempts WHERE endpoint_id = '{endpoint}'"
        );
        e2e::eventually(Duration::from_secs(30), "every attempt logged", || async {
            stack.sql("orders", &attempts) == format!("{EVENTS}|{EVENTS}|{EVENTS}")
        })
        .await;
    }
    let senders = stack.containers("webhook-sender");
    assert!(
        stack.healthy("webhook-sender") && senders.len() == 2,
        "both senders ran throughout"
    );
    let delivered_by: Vec<usize> = senders
        .iter()
        .map(|sender| {
            let logs = run(std::process::Command::new("docker").args(["logs", sender]));
            let logs = String::from_utf8_lossy(&logs.stdout).into_owned()
                + &String::from_utf8_lossy(&logs.stderr);
            logs.lines()
                .filter(|line| line.contains("delivered"))
                .count()
        })
        .collect();
    say(&format!(
        "replicas stack: {EVENTS} events × 2 endpoints, each processed once, one attempt each; deliveries by sender: {delivered_by:?}"
    ));
}

/// Calls of `method` that `container` has served, read from its metrics on `ops_port`.
async fn served(http: &reqwest::Client, container: &str, ops_port: u16, method: &str) -> u64 {
    let metrics = http
        .get(format!("http://{}:{ops_port}/metrics", address(container)))
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .unwrap_or_else(|error| panic!("the metrics of {container}: {error}"));
    let text = metrics.text().await.expect("metrics as text");
    let label = format!("rpc_method=\"{method}\"");
    text.lines()
        .filter(|line| {
            line.starts_with("rpc_server_call_duration")
                && line.contains("_count{")
                && line.contains(&label)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Calls of `method` each of `containers` has served.
async fn served_by(
    http: &reqwest::Client,
    containers: &[String],
    ops_port: u16,
    method: &str,
) -> Vec<u64> {
    join_all(
        containers
            .iter()
            .map(|container| served(http, container, ops_port, method)),
    )
    .await
}

/// What each of `containers` served between two readings.
fn between(before: &[u64], after: &[u64]) -> Vec<u64> {
    after
        .iter()
        .zip(before.iter().chain(std::iter::repeat(&0)))
        .map(|(after, before)| after - before)
        .collect()
}

/// A create that did not get its 201: its key, and what it got instead.
struct Failed {
    key: String,
    answer: String,
    /// Whether the client may repeat it with the same key: a 5xx, a 409 or a 429 (each says so),
    /// or no answer at all.
    repeatable: bool,
}

impl std::fmt::Debug for Failed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.key, self.answer)
    }
}

/// The creates numbered `orders` of `customer` from `clients` clients at once, through both
/// gateways in turn, each sent once: those that did not get their 201.
async fn single_attempts(
    client: &Client,
    customer: &str,
    orders: impl Iterator<Item = usize>,
    clients: usize,
) -> Vec<Failed> {
    stream::iter(orders)
        .map(|order| async move {
            let key = format!("{customer}-{order}");
            match client.create(order % 2, &key, customer).await {
                Ok(answer) if answer.status == 201 => None,
                Ok(answer) => Some(Failed {
                    repeatable: answer.status.is_server_error()
                        || [409, 429].contains(&answer.status.as_u16()),
                    answer: format!(
                        "{} {}",
                        answer.status,
                        String::from_utf8_lossy(&answer.body)
                    ),
                    key,
                }),
                Err(error) => Some(Failed {
                    key,
                    answer: error.to_string(),
                    repeatable: true,
                }),
            }
        })
        .buffer_unordered(clients)
        .filter_map(std::future::ready)
        .collect()
        .await
}

/// e. 300 creates from 6 clients, each sent once: every one a 201, and each orders replica
/// serving at least a fifth of them (an even share is a third).
async fn a_steady_load_spreads_over_every_replica(stack: &Stack, client: &Client) {
    const CREATES: usize = 300;
    let [orders, payments] = ["orders", "payment"].map(|service| stack.containers(service));
    let before = (
        served_by(&client.http, &orders, ORDERS_OPS_PORT, "CreateOrder").await,
        served_by(&client.http, &payments, PAYMENT_OPS_PORT, "Pay").await,
    );
    let failed = single_attempts(client, "replicas-spread", 0..CREATES, 6).await;
    assert!(
        failed.is_empty(),
        "every create succeeds at its first request: {failed:?}"
    );
    let creates = between(
        &before.0,
        &served_by(&client.http, &orders, ORDERS_OPS_PORT, "CreateOrder").await,
    );
    let payments = between(
        &before.1,
        &served_by(&client.http, &payments, PAYMENT_OPS_PORT, "Pay").await,
    );
    assert_eq!(
        creates.iter().sum::<u64>(),
        CREATES as u64,
        "each create served once: {creates:?}"
    );
    assert!(
        creates.iter().all(|&served| served * 5 >= CREATES as u64),
        "each orders replica serves at least a fifth: {creates:?}"
    );
    assert_eq!(
        stack.orders_of("replicas-spread"),
        format!("{CREATES}|{CREATES}"),
        "one order per key, each paid"
    );
    say(&format!(
        "replicas stack: {CREATES} creates through 2 gateways: served by the orders replicas {creates:?}, payments by the payment replicas {payments:?}"
    ));
}

/// A bounded load of single requests from 4 clients, running until `stop` is set: each create's
/// key is `<customer>-<n>`. Ends with how many were sent and those that failed.
struct Load {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<Vec<Failed>>,
}

impl Load {
    /// The most creates a load sends, whatever happens.
    const MOST_CREATES: usize = 30_000;

    fn start(client: &Client, customer: &'static str) -> Self {
        let (stop, sent) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let task = tokio::spawn({
            let (client, stop, sent) = (client.clone(), stop.clone(), sent.clone());
            async move {
                let orders = (0..Self::MOST_CREATES)
                    .take_while(move |_| !stop.load(Ordering::Relaxed))
                    .inspect(move |_| {
                        sent.fetch_add(1, Ordering::Relaxed);
                    });
                single_attempts(&client, customer, orders, 4).await
            }
        });
        Self { stop, sent, task }
    }

    async fn finish(self) -> (usize, Vec<Failed>) {
        self.stop.store(true, Ordering::Relaxed);
        let failed = tokio::time::timeout(Duration::from_secs(60), self.task)
            .await
            .expect("the load ends in time")
            .expect("the load ran");
        (self.sent.load(Ordering::Relaxed), failed)
    }
}

/// Each of `failed` repeated with its key, as its answer says, until its 201.
async fn repeat_until_created(client: &Client, customer: &str, failed: &[Failed]) {
    assert!(
        failed.iter().all(|failed| failed.repeatable),
        "every failure may be repeated with its key: {failed:?}"
    );
    for failure in failed {
        let mut completed = false;
        for _ in 0..LOAD_ATTEMPTS {
            if matches!(client.create(1, &failure.key, customer).await, Ok(answer) if answer.status == 201)
            {
                completed = true;
                break;
            }
            tokio::time::sleep(RETRY_PAUSE).await;
        }
        assert!(completed, "{failure:?}: no 201 in {LOAD_ATTEMPTS} repeats");
    }
}

/// f. Under a load of single requests: a fourth orders replica started serves creates within
/// 30 s; then one orders and one payment replica stopped (SIGTERM: they drain) lose no create:
/// what fails says to repeat it with its key, and the repeat completes it, once.
async fn replicas_started_and_stopped_under_load_lose_no_create(stack: &Stack, client: &Client) {
    let first_orders = stack.containers("orders");
    let load = Load::start(client, "replicas-churn");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    run(stack.compose().args([
        "up",
        "--detach",
        "--no-build",
        "--no-recreate",
        "--scale",
        "orders=4",
        "orders",
    ]));
    let newcomer = stack
        .containers("orders")
        .into_iter()
        .find(|replica| !first_orders.contains(replica))
        .expect("a fourth orders replica");
    e2e::eventually(
        Duration::from_secs(30),
        "the new orders replica serves creates",
        || async { served(&client.http, &newcomer, ORDERS_OPS_PORT, "CreateOrder").await > 0 },
    )
    .await;
    let serving_after = started.elapsed();
    let (orders_stopped, payment_stopped) = (
        first_orders[0].clone(),
        stack.containers("payment")[0].clone(),
    );
    run(std::process::Command::new("docker").args(["stop", &orders_stopped, &payment_stopped]));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (creates, failed) = load.finish().await;
    run(std::process::Command::new("docker").args(["rm", &orders_stopped, &payment_stopped]));
    repeat_until_created(client, "replicas-churn", &failed).await;
    assert_eq!(
        stack.orders_of("replicas-churn"),
        format!("{creates}|{creates}"),
        "one order per key, each paid"
    );
    let logs = String::from_utf8_lossy(
        &run(stack.compose().args(["logs", "--no-color", "orders"])).stdout,
    )
    .into_owned();
    let causes: Vec<&str> = logs
        .lines()
        .filter(|line| line.contains("call failed"))
        .take(3)
        .collect();
    say(&format!(
        "replicas stack: orders' failed calls to payment while replicas stopped, a sample: {causes:#?}"
    ));
    say(&format!(
        "replicas stack: a fourth orders replica served creates {:.1} s after it was started; one orders and one payment replica stopped under load: {creates} creates, {} failed at their first request, each completed by a repeat with its key: {:?}",
        serving_after.as_secs_f64(),
        failed.len(),
        &failed[..failed.len().min(3)]
    ));
}

/// g. Under a load of single requests, one more replica joins under the name `orders` that fails
/// every create: the creates it failed are retried by the edge on the other replicas (its
/// failures outnumber the creates that failed), and what still fails is completed by a repeat.
async fn a_replica_failing_every_create_costs_no_create(stack: &Stack, client: &Client) {
    let load = Load::start(client, "replicas-broken");
    tokio::time::sleep(Duration::from_secs(2)).await;
    run(stack.compose().args([
        "--profile",
        "faults",
        "up",
        "--detach",
        "--no-build",
        "broken-orders",
    ]));
    let broken = stack.container("broken-orders");
    // The gateways find it at their next resolution (every 5 s), once it is healthy.
    e2e::eventually(
        Duration::from_secs(60),
        "the broken replica tried",
        || async { served(&client.http, &broken, ORDERS_OPS_PORT, "CreateOrder").await > 0 },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (creates, failed) = load.finish().await;
    let tried = served(&client.http, &broken, ORDERS_OPS_PORT, "CreateOrder").await;
    run(stack.compose().args([
        "--profile",
        "faults",
        "rm",
        "--stop",
        "--force",
        "broken-orders",
    ]));
    repeat_until_created(client, "replicas-broken", &failed).await;
    assert!(
        (failed.len() as u64) < tried,
        "the edge retried on the others what the broken replica failed: {} creates failed, {tried} calls to it: {failed:?}",
        failed.len()
    );
    assert_eq!(
        stack.orders_of("replicas-broken"),
        format!("{creates}|{creates}"),
        "one order per key, each paid"
    );
    say(&format!(
        "replicas stack: {creates} creates while a replica failing every create joined: it was tried {tried} times (ejected in between), {} creates failed at their first request",
        failed.len()
    ));
}

/// d. 120 orders from 8 clients, each order's key repeated on failure through the other gateway;
/// a third of the way, one replica of the gateway, orders, payment and the sender killed
/// (SIGKILL), the orders and payment replicas chosen among those in use. Then: every key got its
/// 201, which the surviving gateway replays byte for byte; one order per key, each paid; one
/// charge per order; no order with two payments; and the surviving hops connected to survivors.
async fn killing_a_replica_of_each_service_loses_no_order_and_charges_none_twice(
    stack: &Stack,
    client: &Client,
) {
    let [gateways, orders, payments, senders] =
        ["gateway", "orders", "payment", "webhook-sender"].map(|service| stack.containers(service));
    // Chosen among the connections of the phases before, so that the kill is quick: the gateway of
    // replica 1 goes; the orders replica the other gateway is connected to, and the
    // payment replica the surviving orders replica (or else the other) is connected to.
    let orders_victim = connected(&gateways[1], ORDERS_PORT, &orders)
        .into_iter()
        .next()
        .unwrap_or_else(|| orders[0].clone());
    let orders_survivor = orders
        .iter()
        .find(|replica| **replica != orders_victim)
        .expect("two orders replicas")
        .clone();
    let payment_victim = [&orders_survivor, &orders_victim]
        .into_iter()
        .find_map(|replica| {
            connected(replica, PAYMENT_PORT, &payments)
                .into_iter()
                .next()
        })
        .unwrap_or_else(|| payments[0].clone());
    let before = client.bank().await;
    let client = Arc::new(Client {
        http: client.http.clone(),
        gateways: client.gateways,
        admin_port: client.admin_port,
    });
    let created = Arc::new(AtomicUsize::new(0));
    let load = tokio::spawn({
        let (client, created) = (client.clone(), created.clone());
        async move {
            stream::iter(0..LOAD_ORDERS)
                .map(|order| {
                    let (client, created) = (client.clone(), created.clone());
                    async move {
                        let key = format!("replicas-load-{order}");
                        for attempt in 0..LOAD_ATTEMPTS {
                            match client
                                .create((order + attempt) % 2, &key, "replicas-load")
                                .await
                            {
                                Ok(answer) if answer.status == 201 => {
                                    created.fetch_add(1, Ordering::Relaxed);
                                    return (key, answer.body, attempt);
                                }
                                // In flight elsewhere, a hop gone or pushing back: the same key again.
                                Ok(answer)
                                    if [409, 429].contains(&answer.status.as_u16())
                                        || answer.status.is_server_error() => {}
                                Ok(answer) => panic!("{key}: {} {:?}", answer.status, answer.body),
                                Err(_unreachable) => {}
                            }
                            tokio::time::sleep(RETRY_PAUSE).await;
                        }
                        panic!("{key}: no 201 in {LOAD_ATTEMPTS} attempts")
                    }
                })
                .buffer_unordered(LOAD_CLIENTS)
                .collect::<Vec<_>>()
                .await
        }
    });

    e2e::eventually(
        Duration::from_secs(60),
        "a third of the orders created",
        || async { created.load(Ordering::Relaxed) >= LOAD_ORDERS / 3 },
    )
    .await;
    let victims = [&gateways[0], &orders_victim, &payment_victim, &senders[0]];
    let killed_at = created.load(Ordering::Relaxed);
    run(std::process::Command::new("docker")
        .arg("kill")
        .args(victims));
    say(&format!(
        "replicas stack: one replica of each service killed after {killed_at} of {LOAD_ORDERS} orders"
    ));

    let answers = tokio::time::timeout(Duration::from_secs(240), load)
        .await
        .expect("the load ends in time")
        .expect("every order gets its 201");
    let most_attempts = answers
        .iter()
        .map(|(_, _, attempt)| attempt + 1)
        .max()
        .unwrap_or(0);

    // The survivors reach the survivors only: the name resolved again dropped the victims.
    let surviving = |replicas: &[String], victim: &str| -> BTreeSet<Ipv4Addr> {
        replicas
            .iter()
            .filter(|replica| *replica != victim)
            .map(|replica| address(replica))
            .collect()
    };
    let (orders_alive, payments_alive) = (
        surviving(&orders, &orders_victim),
        surviving(&payments, &payment_victim),
    );
    e2e::eventually(
        Duration::from_secs(30),
        "the surviving hops connected to the surviving replicas only",
        || async {
            let (to_orders, to_payment) = (
                peers(&gateways[1], ORDERS_PORT),
                peers(&orders_survivor, PAYMENT_PORT),
            );
            !to_orders.is_empty()
                && to_orders.is_subset(&orders_alive)
                && !to_payment.is_empty()
                && to_payment.is_subset(&payments_alive)
        },
    )
    .await;

    // Every 201 a client got is kept: the surviving gateway replays it byte for byte.
    let replays = stream::iter(&answers)
        .map(|(key, body, _)| {
            let client = client.clone();
            async move {
                (
                    key,
                    body,
                    client
                        .create(1, key, "replicas-load")
                        .await
                        .expect("the surviving gateway answers"),
                )
            }
        })
        .buffer_unordered(LOAD_CLIENTS)
        .collect::<Vec<_>>()
        .await;
    for (key, body, replay) in replays {
        assert!(
            replay.status == 201 && replay.replayed && replay.body == *body,
            "{key} is replayed byte for byte: {} {:?}",
            replay.status,
            replay.body
        );
    }
    assert_eq!(
        stack.orders_of("replicas-load"),
        format!("{LOAD_ORDERS}|{LOAD_ORDERS}"),
        "one order per key, each paid"
    );
    let twice_paid = stack.sql("payment", "SELECT count(*) FROM (SELECT order_id FROM payments GROUP BY order_id HAVING count(*) > 1) AS twice");
    assert_eq!(twice_paid, "0", "no order has two payments");
    let (calls, charges, repeated_keys) = bank_work(before, client.bank().await);
    assert_eq!(
        charges, LOAD_ORDERS as u64,
        "one charge per order, none twice (bank calls {calls}, repeated keys {repeated_keys})"
    );
    say(&format!(
        "replicas stack: {LOAD_ORDERS} orders under the kill, each once: {charges} charges, {calls} bank calls ({repeated_keys} repeated a key), at most {most_attempts} attempts for one order"
    ));
}
