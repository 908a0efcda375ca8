//! Receivers process each delivery once: a sender repeats a delivery, with the same `webhook-id`,
//! whenever it cannot tell that the last attempt arrived (a timeout, a lost answer, a crash
//! between sending and recording), so a receiver remembers the ids it has processed.
//!
//! Why remember for a retention period and not only the verification window? Each retry carries a
//! new `webhook-timestamp`, and retries go on for hours, so an id can come back long after its
//! first timestamp has left the ±5 min window. The retention must outlast the sender's whole
//! retry schedule. A receiver that must survive its own restarts keeps the ids in its database
//! instead.
//!
//! Why an id in progress apart from a processed one? A repeat can arrive while the first delivery
//! is still being processed (a redelivery takes over an attempt in flight by design). Answering
//! it 2xx would tell the sender the event is done; if the first processing then fails and the id
//! is forgotten, nobody sends the event again and it is lost. So a repeat of an id in progress is
//! told to come back later ([`Seen::InProgress`], a 409 in the example receiver).
//!
//! Why a hard cap? Memory would otherwise grow with the delivery rate times the retention, which
//! a burst can make as large as it likes. At the cap the oldest id is forgotten first: a repeat of
//! it, if one ever came, would be processed again. Every operation is O(1): the ids are kept in
//! first-seen order in a linked hash map (the `lru` crate's, never reordered by a look-up).

use std::num::NonZeroUsize;

use lru::LruCache;

/// What is known of an id when a delivery of it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// Never seen within the retention: process it; it is now in progress.
    New,
    /// Another delivery of it is being processed: ask the sender to come back later.
    InProgress,
    /// Processed already: acknowledge without processing it again.
    Processed,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    first_seen_secs: u64,
    processed: bool,
}

/// The `webhook-id`s in progress or processed within the retention period, at most `max_ids`.
#[derive(Debug)]
pub struct SeenIds {
    retention_secs: u64,
    /// Oldest first: a look-up uses `peek`, so the order stays the order ids were first seen.
    ids: LruCache<String, Entry>,
}

impl SeenIds {
    /// Remembers ids for `retention_secs` after they were first seen, and never more than
    /// `max_ids` at once (the oldest go first).
    pub fn new(retention_secs: u64, max_ids: NonZeroUsize) -> Self {
        Self {
            retention_secs,
            ids: LruCache::new(max_ids),
        }
    }

    /// What is known of `id` at `now_secs`; a [`Seen::New`] id is recorded as in progress.
    pub fn begin(&mut self, id: &str, now_secs: u64) -> Seen {
        self.forget_before(now_secs.saturating_sub(self.retention_secs));
        if let Some(entry) = self.ids.peek(id) {
            return if entry.processed {
                Seen::Processed
            } else {
                Seen::InProgress
            };
        }
        self.ids.push(
            id.to_owned(),
            Entry {
                first_seen_secs: now_secs,
                processed: false,
            },
        );
        Seen::New
    }

    /// Records that `id`, begun earlier, was processed: its repeats are acknowledged from now on.
    pub fn processed(&mut self, id: &str) {
        if let Some(entry) = self.ids.peek_mut(id) {
            entry.processed = true;
        }
    }

    /// Forgets `id`, whose processing failed: the sender's next attempt is then processed.
    pub fn forget(&mut self, id: &str) {
        self.ids.pop(id);
    }

    /// Ids remembered now, in progress or processed.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn forget_before(&mut self, cutoff: u64) {
        while let Some((_, entry)) = self.ids.peek_lru()
            && entry.first_seen_secs < cutoff
        {
            self.ids.pop_lru();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 60 * 60;

    fn seen_ids(retention_secs: u64) -> SeenIds {
        SeenIds::new(retention_secs, NonZeroUsize::new(1_000).expect("not zero"))
    }

    #[test]
    fn a_repeated_id_is_processed_once() {
        let mut seen = seen_ids(3 * DAY);
        assert_eq!(seen.begin("msg_1", 1_000), Seen::New);
        seen.processed("msg_1");
        assert_eq!(
            seen.begin("msg_1", 1_000),
            Seen::Processed,
            "the same delivery again"
        );
        assert_eq!(
            seen.begin("msg_1", 1_000 + 10 * 60 * 60),
            Seen::Processed,
            "a retry ten hours later"
        );
        assert_eq!(seen.begin("msg_2", 1_001), Seen::New, "another delivery");
    }

    #[test]
    fn a_repeat_during_processing_is_told_so_and_a_failure_lets_the_next_one_in() {
        let mut seen = seen_ids(DAY);
        assert_eq!(seen.begin("msg_1", 10), Seen::New);
        assert_eq!(
            seen.begin("msg_1", 11),
            Seen::InProgress,
            "not acknowledged while the first may still fail"
        );
        seen.forget("msg_1");
        assert_eq!(
            seen.begin("msg_1", 20),
            Seen::New,
            "its processing failed: the retry is processed"
        );
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn ids_are_forgotten_after_the_retention_and_only_then() {
        let mut seen = seen_ids(DAY);
        for (id, at) in [("old", 0), ("newer", DAY / 2)] {
            assert_eq!(seen.begin(id, at), Seen::New);
            seen.processed(id);
        }
        assert_eq!(
            seen.begin("old", DAY),
            Seen::Processed,
            "still within the retention"
        );
        assert_eq!(seen.begin("fresh", DAY + 1), Seen::New);
        assert_eq!(
            seen.len(),
            2,
            "`old` is forgotten, `newer` and `fresh` are kept"
        );
        assert_eq!(
            seen.begin("old", DAY + 2),
            Seen::New,
            "forgotten: it counts as new"
        );
    }

    #[test]
    fn the_cap_is_hard_and_the_oldest_go_first() {
        let mut seen = SeenIds::new(DAY, NonZeroUsize::new(3).expect("not zero"));
        for n in 0..10 {
            assert_eq!(seen.begin(&format!("msg_{n}"), n), Seen::New);
            seen.processed(&format!("msg_{n}"));
        }
        assert_eq!(seen.len(), 3);
        assert_eq!(
            seen.begin("msg_9", 10),
            Seen::Processed,
            "the newest are kept"
        );
        assert_eq!(seen.begin("msg_0", 10), Seen::New, "the oldest went first");
    }

    #[test]
    fn forgetting_one_of_many_ids_takes_constant_time() {
        // 200,000 forgets in a set of 200,000 ids: a scan per forget would be some 10^10 steps,
        // minutes at the least; O(1) each is a moment.
        let size = 200_000;
        let mut seen = SeenIds::new(DAY, NonZeroUsize::new(size).expect("not zero"));
        for n in 0..size {
            seen.begin(&n.to_string(), 0);
        }
        for n in 0..size {
            seen.forget(&n.to_string());
        }
        assert!(seen.is_empty());
    }
}
