use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use rpc::dev_certs::OPERATOR;
use settings::SettingsArgs;
use stack::{Chain, ChainSettings, chain::GATEWAY_HTTP, scenario};

/// mimalloc rather than the system's allocator: a request makes many small, short-lived
/// allocations on several threads (see the bench's README, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Runs gateway → orders → payment → bank-mock in one process.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the chain on its configured addresses and serve until Ctrl-C.
    // The chain's settings are each service's under its name; the help's examples say so.
    #[command(mut_arg("overrides", |arg| arg.help(
        "One setting as KEY=VALUE, repeatable: `--set gateway.http_listen=127.0.0.1:8081`, `--set bank.faults.hang=true` \
         (keys: the settings table of each service's README, under the service's name)"
    )))]
    Up {
        /// Keep the SQLite databases of orders and payment here (default: a temporary directory
        /// removed at exit).
        #[arg(long, value_name = "DIR")]
        data_dir: Option<PathBuf>,
        #[command(flatten)]
        settings: SettingsArgs,
    },
    /// Start the chain on free ports, drive one named scenario through it and print a report.
    Scenario {
        /// Scenario name (see --list).
        #[arg(required_unless_present = "list")]
        name: Option<String>,
        /// List the scenarios.
        #[arg(long)]
        list: bool,
        /// Also write the report as JSON to this file.
        #[arg(long, value_name = "PATH")]
        json: Option<PathBuf>,
        #[command(flatten)]
        settings: SettingsArgs,
    },
}

/// Errors end the process with one line on stderr, not `main`'s debug dump of them.
#[tokio::main]
async fn main() -> ExitCode {
    match run(Cli::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    match cli.command {
        Command::Up { data_dir, settings } => up(data_dir, &settings).await,
        Command::Scenario { list: true, .. } => {
            for s in scenario::catalogue() {
                println!("{:<22} {}", s.name, s.about);
            }
            Ok(())
        }
        Command::Scenario {
            name,
            json,
            settings,
            ..
        } => {
            let name = name.expect("clap requires a name without --list");
            let scenario = scenario::find(&name)
                .ok_or_else(|| format!("no scenario {name:?}; try `scenario --list`"))?;
            let chain_settings: ChainSettings = settings::load("STACK", &settings)?;
            let reports = scenario::run_variants(&scenario, &chain_settings).await?;
            for report in &reports {
                println!("{report}");
            }
            if reports.len() > 1 {
                println!("{}", scenario::Comparison(&reports));
            }
            if let Some(path) = json {
                std::fs::write(&path, serde_json::to_string_pretty(&reports)?)?;
                println!("  report written to {}", path.display());
            }
            Ok(())
        }
    }
}

async fn up(
    data_dir: Option<PathBuf>,
    settings: &SettingsArgs,
) -> Result<(), Box<dyn std::error::Error>> {
    // Settings first: a mistake in them is reported before anything is made.
    let chain_settings: ChainSettings = settings::load("STACK", settings)?;
    let telemetry = telemetry::init_hosting(
        stack::SERVICE,
        &stack::SERVICES,
        &telemetry::TelemetrySettings::from_env()?,
    )?;
    let temporary = match &data_dir {
        Some(_) => None,
        None => Some(tempfile::tempdir()?),
    };
    let dir = data_dir
        .as_deref()
        .or(temporary.as_ref().map(|t| t.path()))
        .expect("one of them is set");
    std::fs::create_dir_all(dir)?;
    let plaintext = chain_settings.plaintext;
    let mut chain = Chain::start(chain_settings.with_data_dir(dir)).await?;
    println!(
        "gateway → orders → payment → bank-mock, and the webhook sender, are up (Ctrl-C stops them)"
    );
    for listener in stack::chain::LISTENERS {
        let shown = listener
            .shown
            .replace("{addr}", &chain.address(listener).to_string())
            .replace("{admin_token}", &chain.admin_token);
        println!("  {:<18}{shown}", listener.label);
    }
    let databases: Vec<String> = chain
        .databases()
        .iter()
        .map(|(_, url)| redact(url))
        .collect();
    println!("  databases         {}", databases.join(", "));
    println!(
        "  API keys          demo-key-1 (client demo-client-1), demo-key-2 (client demo-client-2)"
    );
    match chain.dev_certs() {
        Some(certs) => {
            println!(
                "  mutual TLS        orders, payment and bank-mock answer only the chain's certificates"
            );
            println!("  dev CA            {}", certs.ca().display());
            println!("  operator cert     {}", certs.cert(OPERATOR).display());
            println!(
                "  operator key      {}  (health and reflection of every inner service)",
                certs.key(OPERATOR).display()
            );
        }
        None if plaintext => {
            eprintln!(
                "WARNING: plaintext = true: the hops talk plain-text gRPC and orders, payment and bank-mock"
            );
            eprintln!(
                "         answer any caller that can reach them, in any client's name. For experiments only."
            );
        }
        None => println!("  mutual TLS        with the certificate files named in the settings"),
    }
    println!();
    println!("Try:");
    println!(
        "  curl -si http://{}/v1/orders -H 'Authorization: Bearer demo-key-1' -H 'Idempotency-Key: order-1' \\\n    \
         -H 'Content-Type: application/json' \\\n    \
         -d '{{\"customer_id\": \"c-1\", \"items\": [{{\"sku\": \"sku-1\", \"quantity\": 2}}], \"amount_minor\": 1299, \"currency\": \"EUR\"}}'",
        chain.address(&GATEWAY_HTTP)
    );
    let stop = rpc::shutdown_signal();
    let token = chain.shutdown_token();
    tokio::spawn(async move {
        stop.cancelled().await;
        token.cancel();
    });
    let served = chain.wait().await;
    telemetry.shutdown().await;
    Ok(served?)
}

/// A database URL without its password, for printing.
fn redact(url: &str) -> String {
    match (url.find("://"), url.find('@')) {
        (Some(scheme), Some(at)) if scheme < at => match url[scheme + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://chain:secret@db:5432/orders"),
            "postgres://chain:***@db:5432/orders"
        );
        assert_eq!(
            redact("postgres://chain@db/orders"),
            "postgres://chain@db/orders"
        );
        assert_eq!(redact("sqlite:///tmp/orders.db"), "sqlite:///tmp/orders.db");
    }
}
