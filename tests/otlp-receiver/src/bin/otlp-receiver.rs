//! The OTLP/gRPC receiver as a program, for the compose test stack: prints one line per span it
//! receives (`span trace_id=… service=… name=…`), so the test reads what the services exported
//! from the container's log.

use std::net::SocketAddr;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let listen: SocketAddr = match std::env::args().nth(1) {
        Some(listen) => listen.parse()?,
        None => SocketAddr::from(([0, 0, 0, 0], 4317)),
    };
    let receiver = otlp_receiver::OtlpReceiver::start_on(listen, true).await?;
    println!("receiving OTLP on {}", receiver.endpoint());
    // In a container it is process 1, which the kernel sends no default signal handling: it must
    // end on SIGTERM itself, or every `compose down` waits for the kill.
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        interrupted = tokio::signal::ctrl_c() => interrupted?,
        _ = terminate.recv() => {}
    }
    Ok(())
}
