//! What the gateway keeps to answer when a source cannot: the last known copy of each order and
//! the last exchange rate of each currency, each with the time it was current.

use std::{num::NonZeroUsize, sync::Mutex, time::SystemTime};

use lru::LruCache;
use proto::{bank::v1::ExchangeRate, common::v1::Order};
use tonic::Code;

/// Failures that a stale copy can stand in for: the source is unreachable, overloaded, too slow
/// or broken. An answer such as NOT_FOUND is the truth and is passed on.
pub(crate) fn stands_in_for(code: Code) -> bool {
    matches!(
        code,
        Code::Unavailable
            | Code::DeadlineExceeded
            | Code::ResourceExhausted
            | Code::Internal
            | Code::Unknown
            | Code::Cancelled
    )
}

/// The last known copy of recently seen orders, per client, bounded (least recently used go first).
#[derive(Debug)]
pub(crate) struct OrderCache {
    orders: Mutex<LruCache<(String, String), (Order, SystemTime)>>,
}

impl OrderCache {
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = NonZeroUsize::new(capacity).unwrap_or(NonZeroUsize::MIN);
        Self {
            orders: Mutex::new(LruCache::new(capacity)),
        }
    }

    pub(crate) fn remember(&self, client_id: &str, order: &Order) {
        let key = (client_id.to_owned(), order.order_id.clone());
        lock(&self.orders).put(key, (order.clone(), SystemTime::now()));
    }

    /// The last copy of the order and when it was current.
    pub(crate) fn last_known(
        &self,
        client_id: &str,
        order_id: &str,
    ) -> Option<(Order, SystemTime)> {
        lock(&self.orders)
            .get(&(client_id.to_owned(), order_id.to_owned()))
            .cloned()
    }
}

/// The last rate the bank quoted for each currency (the quote carries its own time).
#[derive(Debug, Default)]
pub(crate) struct RateCache {
    rates: Mutex<std::collections::HashMap<String, ExchangeRate>>,
}

impl RateCache {
    pub(crate) fn remember(&self, rate: &ExchangeRate) {
        lock(&self.rates).insert(rate.currency.clone(), rate.clone());
    }

    pub(crate) fn last_known(&self, currency: &str) -> Option<ExchangeRate> {
        lock(&self.rates).get(currency).cloned()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // The caches hold plain values; a panic elsewhere cannot leave them half-written.
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
