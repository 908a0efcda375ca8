//! One call sets up logging for a service binary.
//!
//! The filter comes from `RUST_LOG` (default `info`) and applies to the log output only, so that
//! span-consuming layers added later are never silenced by a quiet log level.

use tracing_subscriber::{EnvFilter, Layer, layer::SubscriberExt, util::SubscriberInitExt};

/// Installs the global subscriber; a second call (several services in one process) is a no-op.
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_target(false).with_filter(filter);
    let _ = tracing_subscriber::registry().with(fmt).try_init();
}
