//! Places where a test can hold a request inside the store, to force an interleaving that
//! timing alone would almost never produce (feature `pause-points`, enabled by tests only).

use std::fmt::Debug;

use futures::future::BoxFuture;

/// A place in the store's code where a request can be held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// In [`KeyStore::begin`](crate::KeyStore::begin), after the key's row was read and before
    /// anything is decided from it (a takeover, a delete of an expired row).
    BeginRead,
    /// In [`KeyStore::begin_with_first_phase`](crate::KeyStore::begin_with_first_phase), after
    /// a read found no key and before the claim and the first phase are written.
    NewKeyRead,
    /// In [`KeyStore::atomic_phase`](crate::KeyStore::atomic_phase), inside its transaction,
    /// after the key was moved to where the phase leaves it and before the commit: on
    /// PostgreSQL the phase then holds the key's row lock, on SQLite the one writer.
    PhaseMoved,
}

/// Decides how long a request on `key` waits at `at`.
pub trait PauseHook: Send + Sync + Debug {
    /// Called when a request on `key` reaches `at`; the request goes on when the future ends.
    fn reached(&self, at: Pause, key: &str) -> BoxFuture<'static, ()>;
}
