//! The sender's deliveries in flight, under one cap shared fairly between clients.
//!
//! Why? Each endpoint has its own limits and a client at most 20 endpoints, but 20 endpoints at
//! their maximum of 64 in flight are more than a sender carries: one client with saturated
//! endpoints would hold every connection and task, and another client's delivery would wait
//! behind them. A cap alone would not help either, since the saturated client takes each place as
//! soon as it is freed. So a client takes a place only while the sender has one free and the
//! client holds fewer than its fair share: the cap divided among the clients holding or waiting
//! for places, the asking one included, plus one share kept for a client that has none yet (at
//! least one place each). A client alone uses half the cap; a client that comes next finds places
//! free at once instead of waiting for a busy client's slow attempts to end, and once it waits,
//! the others' shares shrink, so the places they free come to it.
//!
//! (tokio's `Semaphore` and `resilience::shares` have fixed limits; a share that changes with the
//! number of clients needs its own count, kept here under one lock.)

use std::{
    collections::HashMap,
    sync::{Arc, Mutex, PoisonError},
};

use tokio::sync::Notify;

/// Places for deliveries in flight, `capacity` in all, shared fairly by client.
#[derive(Debug, Clone)]
pub(crate) struct FairShares {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    capacity: usize,
    held: Mutex<Held>,
    /// Wakes the waiting takers when a place is given back.
    freed: Notify,
}

#[derive(Debug, Default)]
struct Held {
    total: usize,
    /// Only clients holding or waiting for places: the table stays as small as they are.
    by_client: HashMap<String, Client>,
}

#[derive(Debug, Default)]
struct Client {
    holding: usize,
    waiting: usize,
}

impl Inner {
    fn held(&self) -> std::sync::MutexGuard<'_, Held> {
        // Plain counts: a panic elsewhere cannot leave them half-written.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts one of `client_id`'s holders or waiters less, forgetting a client with none left,
    /// and wakes the waiters: a place or a share may be theirs now.
    fn release(&self, client_id: &str, count: fn(&mut Client) -> &mut usize) {
        {
            let mut held = self.held();
            if let Some(client) = held.by_client.get_mut(client_id) {
                *count(client) -= 1;
                if client.holding == 0 && client.waiting == 0 {
                    held.by_client.remove(client_id);
                }
            }
        }
        self.freed.notify_waiters();
    }
}

impl FairShares {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                capacity: capacity.max(1),
                held: Mutex::default(),
                freed: Notify::new(),
            }),
        }
    }

    /// A place for one of `client_id`'s deliveries, waiting until the sender has one free and the
    /// client is under its fair share.
    pub(crate) async fn take(&self, client_id: &str) -> FairShare {
        let mut in_line = None;
        loop {
            // Registered before trying, so that a place given back in between is not missed.
            let freed = self.inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(share) = self.try_take(client_id) {
                return share;
            }
            // A waiting client counts among those the cap is shared by, so that the others'
            // shares shrink and the places they free come to it.
            in_line.get_or_insert_with(|| {
                self.inner
                    .held()
                    .by_client
                    .entry(client_id.to_owned())
                    .or_default()
                    .waiting += 1;
                Waiting {
                    inner: self.inner.clone(),
                    client_id: client_id.to_owned(),
                }
            });
            freed.await;
        }
    }

    /// A place for `client_id` now, or `None`.
    pub(crate) fn try_take(&self, client_id: &str) -> Option<FairShare> {
        let mut held = self.inner.held();
        let own = held.by_client.get(client_id).map(|client| client.holding);
        let clients = held.by_client.len() + usize::from(own.is_none());
        let fair = (self.inner.capacity / (clients + 1)).max(1);
        if held.total >= self.inner.capacity || own.unwrap_or(0) >= fair {
            return None;
        }
        held.total += 1;
        held.by_client
            .entry(client_id.to_owned())
            .or_default()
            .holding += 1;
        Some(FairShare {
            inner: self.inner.clone(),
            client_id: client_id.to_owned(),
        })
    }
}

/// One client's place, given back when dropped.
#[derive(Debug)]
pub(crate) struct FairShare {
    inner: Arc<Inner>,
    client_id: String,
}

impl Drop for FairShare {
    fn drop(&mut self) {
        self.inner.held().total -= 1;
        self.inner
            .release(&self.client_id, |client| &mut client.holding);
    }
}

/// A client waiting in [`FairShares::take`], counted until it has its place or stops waiting.
struct Waiting {
    inner: Arc<Inner>,
    client_id: String,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.inner
            .release(&self.client_id, |client| &mut client.waiting);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_client_alone_takes_half_and_a_newcomer_finds_places_free() {
        let shares = FairShares::new(4);
        let first: Vec<_> = (0..2)
            .map(|_| shares.try_take("a").expect("a place"))
            .collect();
        assert!(
            shares.try_take("a").is_none(),
            "half of the cap is kept for others"
        );
        let second = shares.try_take("b").expect("a place at once");
        assert!(
            shares.try_take("b").is_none(),
            "b's share of three ways is one"
        );
        drop((first, second));
        assert!(shares.try_take("a").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn places_freed_by_a_client_over_its_share_go_to_a_waiting_one() {
        let shares = FairShares::new(6);
        let mut first: Vec<_> = (0..3)
            .map(|_| shares.try_take("a").expect("a place"))
            .collect();
        let second: Vec<_> = (0..2)
            .map(|_| shares.try_take("b").expect("a place"))
            .collect();
        let third = shares.try_take("c").expect("the last place");
        let fourth = tokio::spawn({
            let shares = shares.clone();
            async move { shares.take("d").await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!fourth.is_finished(), "no place is free");
        first.pop();
        assert!(
            shares.try_take("a").is_none(),
            "with d waiting, a's share is one"
        );
        let fourth = tokio::time::timeout(Duration::from_secs(1), fourth)
            .await
            .expect("woken")
            .expect("no panic");
        assert_eq!(fourth.client_id, "d");
        drop((first, second, third, fourth));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_client_gets_the_next_place_given_back() {
        let shares = FairShares::new(1);
        let held = shares.try_take("a").expect("a place");
        let waiting = tokio::spawn({
            let shares = shares.clone();
            async move { shares.take("b").await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(
            !waiting.is_finished(),
            "b waits while a holds the only place"
        );
        drop(held);
        let place = tokio::time::timeout(Duration::from_secs(1), waiting)
            .await
            .expect("woken")
            .expect("no panic");
        assert_eq!(place.client_id, "b");
    }
}
