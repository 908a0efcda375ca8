//! Places per key (a client, a peer address): one key holds at most `limit` at once, each given
//! back when its [`Share`] is dropped. A key that holds none is forgotten, so the table is only as
//! large as the keys holding places now, whatever number of keys ever came.

use std::{
    collections::HashMap,
    hash::Hash,
    sync::{Arc, Mutex},
};

/// The places each key holds, shared by every clone.
#[derive(Debug, Clone)]
pub struct Shares<K> {
    limit: usize,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash + Clone> Shares<K> {
    /// At most `limit` places per key (at least 1).
    pub fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            held: Arc::default(),
        }
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// A place for `key`, or `None` when it holds all of its share.
    pub fn take(&self, key: &K) -> Option<Share<K>> {
        let mut held = self
            .held
            .lock()
            .expect("the shares' table is never poisoned");
        let count = held.entry(key.clone()).or_default();
        if *count >= self.limit {
            return None;
        }
        *count += 1;
        Some(Share {
            key: key.clone(),
            held: self.held.clone(),
        })
    }
}

/// One place of one key, given back when dropped.
#[derive(Debug)]
pub struct Share<K: Eq + Hash> {
    key: K,
    held: Arc<Mutex<HashMap<K, usize>>>,
}

impl<K: Eq + Hash> Drop for Share<K> {
    fn drop(&mut self) {
        let mut held = self
            .held
            .lock()
            .expect("the shares' table is never poisoned");
        if let Some(count) = held.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                held.remove(&self.key);
            }
        }
    }
}
