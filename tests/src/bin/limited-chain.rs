//! Runs the chain as `stack up` does, in a process whose limit on open descriptors (soft and hard)
//! is lowered first: the server half of the descriptor-exhaustion test, so that the limit binds
//! the chain alone and not the test or its flood.
//!
//! `limited-chain <descriptors>` prints `serving ` and a JSON object, `{"addresses": {<listener
//! key>: <address>}, "certs": <directory of the development CA>, "admin_token": <the bank's>}`, on
//! a line of its own once the chain serves (among its logs), and stops it when its standard input
//! closes.

use std::process::ExitCode;

use stack::{Chain, ChainSettings};

async fn run(descriptors: u64) -> Result<(), Box<dyn std::error::Error>> {
    rlimit::setrlimit(rlimit::Resource::NOFILE, descriptors, descriptors)?;
    let telemetry = telemetry::init_hosting(
        stack::SERVICE,
        &stack::SERVICES,
        &telemetry::TelemetrySettings::from_env()?,
    )?;
    let data = tempfile::tempdir()?;
    let mut chain = Chain::start(
        ChainSettings::default()
            .ephemeral()
            .with_data_dir(data.path()),
    )
    .await?;
    let certs = chain
        .dev_certs()
        .ok_or("the chain runs with its development CA")?
        .ca();
    let certs = certs.parent().ok_or("the CA is in a directory")?;
    let ready = serde_json::json!({"addresses": chain.addresses(), "certs": certs, "admin_token": chain.admin_token});
    println!("serving {ready}");
    let token = chain.shutdown_token();
    tokio::task::spawn_blocking(move || {
        let _ = std::io::copy(&mut std::io::stdin(), &mut std::io::sink());
        token.cancel();
    });
    let served = chain.wait().await;
    telemetry.shutdown().await;
    Ok(served?)
}

#[tokio::main]
async fn main() -> ExitCode {
    let descriptors = match std::env::args().nth(1).map(|limit| limit.parse::<u64>()) {
        Some(Ok(descriptors)) => descriptors,
        _ => {
            eprintln!("usage: limited-chain <descriptors>");
            return ExitCode::FAILURE;
        }
    };
    match run(descriptors).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}
