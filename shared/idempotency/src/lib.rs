//! Receiver-side idempotency keys: a repeat of a write executes once and gets the first answer.
//!
//! Why in the database and why this way? The key row is the lock and the record of what happened,
//! so it must change in the same transaction as the effects it guards: an INSERT with conflict
//! handling (never check-then-insert, which lets a concurrent repeat slip in between). A request
//! runs as a sequence of atomic phases, each committing its effects together with the key's new
//! recovery point, so a crash or a cancellation between phases leaves a state a retry can resume,
//! never a half-done one. The key is leased until the request's deadline: past it nobody is
//! working on the key any more, and a retry takes the lease over.
//!
//! - [`Database`]: SQLite (the embedded default: one writer that commits concurrent
//!   transactions together, WAL readers beside it) or PostgreSQL, through sqlx's typed drivers,
//!   with the migrations of the right backend; [`on_driver!`] runs one statement on either.
//! - [`KeyStore`]: [`KeyStore::begin`] → [`Begin::Execute`] with a [`Lease`] (new key, or a
//!   stale lease taken over, resuming at its recovery point) or [`Begin::Replay`] of the stored
//!   answer; [`KeyStore::phase`] for each atomic phase; [`KeyStore::release`] after a failure
//!   that a retry may fix; [`KeyStore::reap_expired`] and [`spawn_reaper`] for expiry.

mod clock;
mod database;
#[cfg(feature = "pause-points")]
pub mod pause;
mod reaper;
mod store;

pub use clock::{Clock, ManualClock, SystemClock};
pub use database::{Backend, Database, DatabaseError, Driver, Executors, Migrations, Pool, SqliteSettings, Synchronous, Transaction, is_unreachable};
pub use reaper::spawn_reaper;
pub use store::{Begin, KeyError, KeySettings, KeyStore, Lease, Phase, Stored, StrandedKey, TtlTooShort};

use sha2::{Digest, Sha256};

/// The fingerprint of a request: SHA-256 of its canonical bytes, hex-encoded.
pub fn fingerprint(request: &[u8]) -> String {
    hex::encode(Sha256::digest(request))
}
