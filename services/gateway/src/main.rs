use std::path::PathBuf;

use clap::{Parser, Subcommand};
use settings::SettingsArgs;

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The edge of the chain: HTTP/JSON and gRPC in.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Service(rpc::health::Command),
    /// Write a development CA, with a certificate and key for every service of the chain and
    /// for the operator, into DIR, unless a complete set is there already (the compose demo's
    /// first step; real deployments install certificates of their own).
    DevCerts {
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
    },
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let settings: gateway::Settings = settings::load("GATEWAY", &cli.settings)?;
    match cli.command {
        Some(Command::Service(rpc::health::Command::Healthcheck { timeout_ms })) => {
            return Ok(rpc::health::check(
                settings.grpc_listen,
                std::time::Duration::from_millis(timeout_ms),
            )
            .await?);
        }
        Some(Command::DevCerts { dir }) => {
            let certs = rpc::dev_certs::DevCerts::generate_once(&dir)?;
            println!("development CA in {}", certs.ca().display());
            return Ok(());
        }
        None => {}
    }
    let telemetry = telemetry::init(gateway::SERVICE, &telemetry::TelemetrySettings::from_env()?)?;
    let app = gateway::Application::build(settings).await?;
    tracing::info!(http = %app.http_addr(), grpc = %app.grpc_addr(), "gateway listening");
    let served = app.run_until_stopped(rpc::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(served?)
}
