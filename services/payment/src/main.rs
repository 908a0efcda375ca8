use clap::Parser;
use settings::SettingsArgs;

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Charges orders through the bank.
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
    let settings: payment::Settings = settings::load("PAYMENT", &cli.settings)?;
    if let Some(rpc::health::Command::Healthcheck { timeout_ms }) = cli.command {
        let tls = rpc::tls::ServiceTls::load(payment::HOP, &settings.tls)?;
        return Ok(rpc::health::check_as(
            settings.listen,
            payment::HOP,
            &tls,
            std::time::Duration::from_millis(timeout_ms),
        )
        .await?);
    }
    let telemetry = telemetry::init(payment::SERVICE, &telemetry::TelemetrySettings::from_env()?)?;
    let app = payment::Application::build(settings).await?;
    tracing::info!(grpc = %app.grpc_addr(), "payment listening");
    let served = app.run_until_stopped(rpc::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(served?)
}
