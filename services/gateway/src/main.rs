use clap::Parser;
use settings::SettingsArgs;

/// The edge of the chain: HTTP/JSON and gRPC in.
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
    let settings: gateway::Settings = settings::load("GATEWAY", &cli.settings)?;
    if let Some(rpc::health::Command::Healthcheck { timeout_ms }) = cli.command {
        return Ok(rpc::health::check(settings.grpc_listen, std::time::Duration::from_millis(timeout_ms)).await?);
    }
    let telemetry = telemetry::init("gateway", &telemetry::TelemetrySettings::from_env())?;
    let app = gateway::Application::build(settings).await?;
    tracing::info!(http = %app.http_addr(), grpc = %app.grpc_addr(), "gateway listening");
    let served = app.run_until_stopped(rpc::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(served?)
}
