//! How fast the sender delivers: commits N `order.paid` events (default 2,000) into an SQLite
//! outbox while a sender delivers them to one receiver on loopback, then reports the delivery
//! throughput and the commit→receipt latency (commit time = the event's `created_at_ms`, receipt
//! time = when the receiver got it).
//!
//! Committed as fast as possible, the events pile up and the latency is mostly queueing; with a
//! commit rate below what the endpoint may take (its limit is 1,000/s), it is the sender's own.
//!
//! ```sh
//! cargo run --release -p webhook-sender --example throughput -- 2000        # as fast as possible
//! cargo run --release -p webhook-sender --example throughput -- 2000 500    # 500 commits/s
//! ```

use std::{
    collections::HashMap,
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{Router, extract::State, http::HeaderMap, http::StatusCode, routing::post};
use hdrhistogram::Histogram;
use idempotency::{Clock, SystemClock};
use outbox::{EndpointLimits, NewEndpoint, NewEvent, ORDER_PAID, SecretKeys, Subscriptions};
use storage::Database;
use tokio_util::sync::CancellationToken;
use webhook_sender::{Application, Settings};

const CLIENT: &str = "bench-client";

/// Receipt time by `webhook-id`.
type Receipts = Arc<Mutex<HashMap<String, i64>>>;

async fn receive(State(receipts): State<Receipts>, headers: HeaderMap) -> StatusCode {
    let at = SystemClock.now_ms();
    if let Some(id) = headers
        .get("webhook-id")
        .and_then(|value| value.to_str().ok())
    {
        receipts
            .lock()
            .expect("not poisoned")
            .entry(id.to_owned())
            .or_insert(at);
    }
    StatusCode::NO_CONTENT
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let events: usize = args.next().map(|n| n.parse()).transpose()?.unwrap_or(2_000);
    let commits_per_sec: Option<u32> = args.next().map(|n| n.parse()).transpose()?;
    let dir = tempfile::tempdir()?;
    let database_url = format!("sqlite://{}", dir.path().join("orders.db").display());
    let database = Database::open(&database_url, Default::default(), |backend| {
        vec![outbox::migrations(backend)]
    })
    .await?;

    let receipts = Receipts::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let receiver: SocketAddr = listener.local_addr()?;
    tokio::spawn(
        axum::serve(
            listener,
            Router::new()
                .route("/hook", post(receive))
                .with_state(receipts.clone()),
        )
        .into_future(),
    );

    // The most an endpoint may ask for: 64 in flight, 1,000 per second.
    let endpoint = NewEndpoint {
        url: format!("http://{receiver}/hook"),
        event_types: vec![ORDER_PAID.into()],
        limits: EndpointLimits::MAX,
    };
    let secret_keys = SecretKeys::generate("example");
    let subscriptions = Subscriptions::new(database.clone(), secret_keys.clone());
    database
        .write(async move |tx| {
            subscriptions
                .create_endpoint(tx, CLIENT, &endpoint, SystemClock.now_ms())
                .await
        })
        .await?;

    let settings = Settings {
        database_url,
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        poll_interval_ms: 10,
        test_hosts: vec![receiver.to_string()],
        // One client at its endpoint's maximum: the client's own budget must not be the limit.
        client_rate_per_sec: EndpointLimits::MAX.rate_per_sec,
        secret_keys,
        ..Settings::default()
    };
    let sender = Application::build_with_clock(settings, Arc::new(SystemClock)).await?;
    let stop = CancellationToken::new();
    let running = tokio::spawn(sender.run_until_stopped(stop.clone()));

    let pace = match commits_per_sec {
        Some(rate) => format!("{rate} commits/s"),
        None => "as fast as possible".to_owned(),
    };
    println!(
        "committing {events} events ({pace}) for one endpoint (limits: 64 in flight, 1,000/s) on SQLite; receiver on {receiver}"
    );
    let mut ticks =
        commits_per_sec.map(|rate| tokio::time::interval(Duration::from_secs(1) / rate.max(1)));
    let started = Instant::now();
    let mut committed_at = HashMap::with_capacity(events);
    let data =
        serde_json::json!({"order_id": "ord_bench", "amount_minor": 1299, "currency": "EUR"});
    for n in 1..=events {
        if let Some(ticks) = ticks.as_mut() {
            ticks.tick().await;
        }
        let at = SystemClock.now_ms();
        let data = data.clone();
        let id = database
            .write(async move |tx| {
                outbox::record(
                    tx,
                    CLIENT,
                    &NewEvent {
                        event_type: ORDER_PAID,
                        version: 1,
                        data: &data,
                    },
                    at,
                )
                .await
            })
            .await?
            .ok_or("the endpoint subscribes to order.paid")?;
        committed_at.insert(id, at);
        if n % 500 == 0 {
            println!(
                "  committed {n}, delivered {}",
                receipts.lock().expect("not poisoned").len()
            );
        }
    }
    let committing = started.elapsed();

    let limit = Duration::from_secs(120);
    let mut last_report = Instant::now();
    loop {
        let delivered = receipts.lock().expect("not poisoned").len();
        if delivered >= events {
            break;
        }
        if started.elapsed() > limit {
            return Err(format!("only {delivered} of {events} delivered within {limit:?}").into());
        }
        if last_report.elapsed() >= Duration::from_secs(1) {
            println!("  delivered {delivered} of {events}");
            last_report = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let total = started.elapsed();
    stop.cancel();
    running.await??;

    let mut latency = Histogram::<u64>::new(3)?;
    for (id, received_at) in receipts.lock().expect("not poisoned").iter() {
        latency.record(u64::try_from(received_at - committed_at[id]).unwrap_or(0))?;
    }
    println!();
    println!("events                    {events} ({pace})");
    println!(
        "committing took           {:.2} s ({:.0} events/s)",
        committing.as_secs_f64(),
        events as f64 / committing.as_secs_f64()
    );
    println!("all delivered after       {:.2} s", total.as_secs_f64());
    println!(
        "delivery throughput       {:.0} events/s",
        events as f64 / total.as_secs_f64()
    );
    println!(
        "commit→receipt latency    p50 {} ms, p99 {} ms, max {} ms",
        latency.value_at_quantile(0.5),
        latency.value_at_quantile(0.99),
        latency.max()
    );
    Ok(())
}
