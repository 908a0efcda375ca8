#![doc = include_str!("../README.md")]

mod clock;
mod database;
#[cfg(feature = "pause-points")]
pub mod pause;
mod reaper;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use database::{
    Backend, Database, DatabaseError, Driver, Executors, Migrations, Pool, SqliteExecutor, SqliteSettings, Synchronous, Transaction, is_unreachable,
};
pub use reaper::spawn_reaper;
pub use store::{Begin, BeginWith, KeyError, KeySettings, KeyStore, Lease, Lookup, Phase, Progress, ResumePolicy, Stored, StrandedKey, TtlTooShort};

use sha2::{Digest, Sha256};

/// The fingerprint of a request: SHA-256 of its canonical bytes, hex-encoded.
pub fn fingerprint(request: &[u8]) -> String {
    hex::encode(Sha256::digest(request))
}
