use std::{net::SocketAddr, num::NonZeroUsize, sync::Arc};

use clap::Parser;
use webhook_receiver::{DEFAULT_MAX_IDS, PATH, Receiver};
use webhooks::{
    dedupe::SeenIds,
    signature::{Secret, Verifier},
};

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Receives the chain's webhooks on `POST /webhooks` and prints each event once.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// The endpoint's secret (`whsec_…`); given twice, either one is accepted (a rotation).
    #[arg(
        long = "secret",
        env = "WEBHOOK_SECRET",
        value_delimiter = ',',
        required = true
    )]
    secrets: Vec<Secret>,
    #[arg(
        long,
        env = "WEBHOOK_RECEIVER_LISTEN",
        default_value = "127.0.0.1:9000"
    )]
    listen: SocketAddr,
    /// How long processed ids are remembered, in seconds.
    #[arg(long, default_value_t = 3 * 24 * 60 * 60)]
    retention_secs: u64,
    /// The most ids remembered at once; the oldest are forgotten first.
    #[arg(long, default_value_t = DEFAULT_MAX_IDS)]
    max_ids: NonZeroUsize,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let mut secrets = cli.secrets.into_iter();
    let first = secrets.next().expect("clap requires a secret");
    let verifier = secrets.fold(Verifier::new(first), Verifier::with_secret);
    let seen = SeenIds::new(cli.retention_secs, cli.max_ids);
    let receiver = Arc::new(Receiver::with_seen_ids(verifier, seen, |delivery| {
        println!(
            "{}: {}",
            delivery.id,
            String::from_utf8_lossy(&delivery.body)
        );
    }));
    let listener = tokio::net::TcpListener::bind(cli.listen).await?;
    println!(
        "receiving webhooks on http://{}{PATH}",
        listener.local_addr()?
    );
    axum::serve(listener, receiver.router())
        .with_graceful_shutdown(terminated())
        .await?;
    Ok(())
}

/// Ctrl-C or SIGTERM: as PID 1 of a container, the process gets no default action for SIGTERM.
async fn terminated() {
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
}
