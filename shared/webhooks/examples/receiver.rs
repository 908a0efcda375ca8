//! A webhook receiver: verifies each delivery's signature and timestamp, processes each
//! `webhook-id` once, and answers 2xx for every delivery it accepted (a repeat too, so that the
//! sender stops repeating it) and 401 for one it cannot trust.
//!
//! ```sh
//! cargo run -p webhooks --example receiver -- --secret whsec_… --listen 127.0.0.1:9000
//! ```

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use axum::{
    Router,
    body::Bytes,
    extract::State,
    http::{HeaderMap, StatusCode},
    routing::post,
};
use clap::Parser;
use webhooks::{
    dedupe::SeenIds,
    signature::{ReceivedHeaders, Secret, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP},
};

/// Receives webhooks on `POST /webhooks`.
#[derive(Parser)]
struct Cli {
    /// The endpoint's secret (`whsec_…`); given twice, either one is accepted (a rotation).
    #[arg(long = "secret", env = "WEBHOOK_SECRET", required = true)]
    secrets: Vec<Secret>,
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// How long processed ids are remembered: longer than the sender goes on retrying (its
    /// default schedule ends after about 28 hours).
    #[arg(long, default_value_t = 3 * 24 * 60 * 60)]
    retention_secs: u64,
}

struct Receiver {
    verifier: Verifier,
    seen: Mutex<SeenIds>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let mut secrets = cli.secrets.into_iter();
    let first = secrets.next().expect("clap requires a secret");
    let verifier = secrets.fold(Verifier::new(first), Verifier::with_secret);
    let receiver = Arc::new(Receiver { verifier, seen: Mutex::new(SeenIds::new(cli.retention_secs)) });
    let app = Router::new().route("/webhooks", post(receive)).with_state(receiver);
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    println!("receiving webhooks on http://{}/webhooks", listener.local_addr()?);
    axum::serve(listener, app).await?;
    Ok(())
}

async fn receive(State(receiver): State<Arc<Receiver>>, headers: HeaderMap, body: Bytes) -> (StatusCode, String) {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let received = ReceivedHeaders { id: header(WEBHOOK_ID), timestamp: header(WEBHOOK_TIMESTAMP), signature: header(WEBHOOK_SIGNATURE) };
    if let Err(error) = receiver.verifier.verify_now(&received, &body) {
        println!("rejected a delivery: {error}");
        return (StatusCode::UNAUTHORIZED, format!("{error}\n"));
    }
    let id = received.id.expect("a verified delivery has an id");
    let now_secs = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since_epoch| since_epoch.as_secs());
    // The ids are plain values; a panic elsewhere cannot leave them half-written.
    let first_time = receiver.seen.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).first_time(id, now_secs);
    if !first_time {
        println!("{id}: a repeat of a delivery already processed");
        return (StatusCode::OK, "already processed\n".into());
    }
    // Processing here is a line on the terminal and cannot fail. A receiver whose processing can
    // fail calls `SeenIds::forget` then and answers 5xx, so that the sender's retry is processed;
    // one that stores its work records the id in the same transaction instead.
    println!("{id}: processing {}", String::from_utf8_lossy(&body));
    (StatusCode::NO_CONTENT, String::new())
}
