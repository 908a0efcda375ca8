use clap::Parser;
use settings::SettingsArgs;

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Delivers the orders database's webhook outbox.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(flatten)]
    settings: SettingsArgs,
    #[command(subcommand)]
    command: Option<rpc::health::Command>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cli = Cli::parse();
    let settings: webhook_sender::Settings = settings::load("WEBHOOK_SENDER", &cli.settings)?;
    if let Some(rpc::health::Command::Healthcheck { timeout_ms }) = cli.command {
        return Ok(rpc::health::check(
            settings.listen,
            std::time::Duration::from_millis(timeout_ms),
        )
        .await?);
    }
    let telemetry = telemetry::init(
        webhook_sender::SERVICE,
        &telemetry::TelemetrySettings::from_env()?,
    )?;
    let app = webhook_sender::Application::build(settings).await?;
    tracing::info!(health = %app.local_addr(), "webhook-sender delivering");
    let sent = app.run_until_stopped(rpc::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(sent?)
}
