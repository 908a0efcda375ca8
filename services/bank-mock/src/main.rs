use clap::Parser;
use settings::SettingsArgs;

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The bank at the end of the chain, with switchable faults.
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
    let settings: bank_mock::Settings = settings::load("BANK", &cli.settings)?;
    if let Some(rpc::health::Command::Healthcheck { timeout_ms }) = cli.command {
        let tls = rpc::tls::ServiceTls::load(bank_mock::HOP, &settings.tls)?;
        return Ok(rpc::health::check_as(
            settings.listen,
            bank_mock::HOP,
            &tls,
            std::time::Duration::from_millis(timeout_ms),
        )
        .await?);
    }
    let telemetry = telemetry::init(
        bank_mock::SERVICE,
        &telemetry::TelemetrySettings::from_env()?,
    )?;
    let token_generated = settings.admin_token.is_none();
    let app = bank_mock::Application::build(settings).await?;
    tracing::info!(grpc = %app.grpc_addr(), admin = %app.admin_addr(), "bank-mock listening");
    // A secret stays out of the logs and traces, which travel further than the terminal; a token
    // made here is shown once on the terminal, since nobody else knows it.
    if token_generated {
        println!(
            "bank-mock admin token (made at start; set admin_token to choose one): {}",
            app.admin_token()
        );
    }
    let served = app.run_until_stopped(rpc::shutdown_signal()).await;
    telemetry.shutdown().await;
    Ok(served?)
}
