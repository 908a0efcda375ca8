//! Receivers process each delivery once: a sender repeats a delivery, with the same `webhook-id`,
//! whenever it cannot tell that the last attempt arrived (a timeout, a lost answer, a crash
//! between sending and recording), so a receiver remembers the ids it has processed.
//!
//! Why remember for a retention period and not only the verification window? Each retry carries a
//! new `webhook-timestamp`, and retries go on for hours, so an id can come back long after its
//! first timestamp has left the ±5 min window. The retention must outlast the sender's whole
//! retry schedule; then memory is bounded by the delivery rate times the retention, not by
//! history. A receiver that must survive its own restarts keeps the ids in its database instead.

use std::collections::{BTreeSet, HashSet};

/// The `webhook-id`s processed within the retention period.
#[derive(Debug, Clone)]
pub struct SeenIds {
    retention_secs: u64,
    ids: HashSet<String>,
    /// The same ids by the time they were first seen, oldest first, to forget them in order.
    by_time: BTreeSet<(u64, String)>,
}

impl SeenIds {
    /// Remembers ids for `retention_secs` after they were first seen.
    pub fn new(retention_secs: u64) -> Self {
        Self { retention_secs, ids: HashSet::new(), by_time: BTreeSet::new() }
    }

    /// Records `id` as seen at `now_secs`; `true` the first time within the retention period,
    /// when the delivery should be processed.
    pub fn first_time(&mut self, id: &str, now_secs: u64) -> bool {
        self.forget_before(now_secs.saturating_sub(self.retention_secs));
        if self.ids.contains(id) {
            return false;
        }
        self.ids.insert(id.to_owned());
        self.by_time.insert((now_secs, id.to_owned()));
        true
    }

    /// Forgets `id`, whose processing failed: the sender's next attempt is then processed.
    pub fn forget(&mut self, id: &str) {
        if self.ids.remove(id) {
            self.by_time.retain(|(_, seen)| seen != id);
        }
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    fn forget_before(&mut self, cutoff: u64) {
        while let Some((seen, _)) = self.by_time.first()
            && *seen < cutoff
        {
            let (_, id) = self.by_time.pop_first().expect("a first entry exists");
            self.ids.remove(&id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: u64 = 24 * 60 * 60;

    #[test]
    fn a_repeated_id_is_processed_once() {
        let mut seen = SeenIds::new(3 * DAY);
        assert!(seen.first_time("msg_1", 1_000));
        assert!(!seen.first_time("msg_1", 1_000), "the same delivery again");
        assert!(!seen.first_time("msg_1", 1_000 + 10 * 60 * 60), "a retry ten hours later");
        assert!(seen.first_time("msg_2", 1_001), "another delivery");
    }

    #[test]
    fn a_forgotten_id_is_processed_again() {
        let mut seen = SeenIds::new(DAY);
        assert!(seen.first_time("msg_1", 10));
        seen.forget("msg_1");
        assert!(seen.first_time("msg_1", 20), "its processing failed: the retry is processed");
        assert_eq!(seen.len(), 1);
    }

    #[test]
    fn ids_are_forgotten_after_the_retention_and_only_then() {
        let mut seen = SeenIds::new(DAY);
        assert!(seen.first_time("old", 0));
        assert!(seen.first_time("newer", DAY / 2));
        assert!(!seen.first_time("old", DAY), "still within the retention");
        assert!(seen.first_time("fresh", DAY + 1));
        assert_eq!(seen.len(), 2, "`old` is forgotten, `newer` and `fresh` are kept");
        assert!(seen.first_time("old", DAY + 2), "forgotten: it counts as new");
    }
}
