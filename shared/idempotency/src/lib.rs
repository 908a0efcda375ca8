#![doc = include_str!("../README.md")]

mod clock;
#[cfg(feature = "pause-points")]
pub mod pause;
mod reaper;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use reaper::spawn_reaper;
pub use store::{
    Begin, BeginWith, Effects, KeyError, KeySettings, KeyStore, Lease, Lookup, Progress,
    ResumePolicy, Stored, StrandedKey, TtlTooShort,
};

use sha2::{Digest, Sha256};

/// The key store's table, for [`storage::Database::open`] to apply with the service's own.
pub fn migrations(backend: storage::Backend) -> storage::Migrations {
    let migrator = match backend {
        storage::Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
        storage::Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
    };
    ("idempotency", migrator)
}

/// The fingerprint of a request: SHA-256 of its canonical bytes, hex-encoded.
pub fn fingerprint(request: &[u8]) -> String {
    hex::encode(Sha256::digest(request))
}
