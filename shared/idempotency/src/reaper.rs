use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::KeyStore;

/// Runs [`KeyStore::reap_expired`] every `reap_interval_ms` until `shutdown` is cancelled.
pub fn spawn_reaper(store: KeyStore, shutdown: CancellationToken) -> JoinHandle<()> {
    let interval = Duration::from_millis(store.settings().reap_interval_ms.max(1));
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = ticks.tick() => match store.reap_expired().await {
                    Ok(0) => {}
                    Ok(deleted) => tracing::info!(deleted, "expired idempotency keys reaped"),
                    Err(error) => tracing::warn!(%error, "reaping idempotency keys failed; will try again"),
                },
            }
        }
    })
}
