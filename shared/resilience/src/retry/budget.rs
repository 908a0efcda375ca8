//! The retry budget: retries at most a share of recent requests, plus a floor rate for quiet times.
//!
//! Why our own and not tower's `TpsBudget`? We keep tower's [`Budget`] trait and its `Retry`, but
//! tower 0.5.3's implementation (`retry/budget/tps_budget.rs`) allows more than its settings say:
//! - its floor is a reserve, not a rate: `min_per_sec × ttl` retries (20 with 2/s over 10 s) are
//!   added to the balance at all times, so all of them can be spent at once, and they are back as
//!   soon as the retries that spent them leave the window;
//! - its `expire()` steps one slot too far whenever it runs later than exactly one slot after the
//!   previous step: the loop clears the next slot while the time passed is more than one slot,
//!   and the index then moves past that slot as well; the new slot's clock also starts at that late
//!   instant rather than on the boundary. Under real traffic every step is late, so it uses every
//!   other slot, five of ten, each overwritten five steps later: a deposit counts for 5 to 6 s of a
//!   10 s window, and the reserve of 20 comes back every 6 s.
//!
//! Measured on a paused clock, a request every 25.000001 ms each wanting a retry: 18.3 % of
//! requests retried instead of 10 % + 2/s = 15 %; with no traffic, 20 retries at once and then
//! 3.3 per second.
//!
//! No crate offers a sliding window of requests and retries; governor could pay the floor, but its
//! clocks do not follow tokio's, which the paused-clock tests need, and floor and share are
//! decided together under one lock. So both are written here, small:
//! - the window is 10 slots of `window / 10` on a fixed grid from the budget's creation: a slot
//!   ends on its boundary however late the next call comes, and every slot whose time has passed is
//!   cleared, none skipped. The window is the current slot and the nine before it: a request or a
//!   retry counts for the window less at most one slot (9 to 10 s of 10 s);
//! - the share: a retry is allowed while the window's retries are fewer than `percent` of its
//!   requests. (Requiring room for the retry itself, a request's tenth could only be spent once
//!   the tenth request had come, and with 30 % of attempts failing 1.7 % of the share went
//!   unspent, measured.)
//! - the floor: a token bucket that fills at `min_per_sec` per second and holds at most one
//!   second's worth. It pays first, and the retries it pays for are not counted against the
//!   share, so under steady load the two add up: retries = `percent` × requests + `min_per_sec`
//!   per second. First, because a full bucket stops filling while an unspent share lasts as long
//!   as its requests stay in the window: paying from the share first would leave the bucket full
//!   and idle whenever a share set free at once (after a quiet spell or an outage) is spent.

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;
use tower::retry::budget::Budget;

/// Slots per window: a request leaves the window at most one slot early.
const SLOTS: usize = 10;

/// The share is kept in parts per million so that counting stays exact: `0.1f32` is 0.100000001,
/// which would let a 41st retry through for 400 requests.
const PARTS: u64 = 1_000_000;

/// A retry budget shared by every request of one policy; see the module docs.
#[derive(Debug)]
pub struct RetryBudget {
    slot_length: Duration,
    /// Share of requests that may be retried, in millionths.
    share: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    slots: [Slot; SLOTS],
    current: usize,
    /// Start of the current slot, always on the grid.
    current_started: Instant,
    floor: Option<Floor>,
}

#[derive(Debug, Clone, Copy, Default)]
struct Slot {
    requests: u64,
    /// Retries paid for by the share, not those the floor paid for.
    retries: u64,
}

/// A token bucket kept as time: `saved` is how much retry time has accrued, each retry costs
/// `cost` (one second over `min_per_sec`), and at most one second is kept.
#[derive(Debug)]
struct Floor {
    cost: Duration,
    most: Duration,
    saved: Duration,
    updated: Instant,
}

impl State {
    /// The requests and the share's retries of the window.
    fn in_window(&self) -> (u64, u64) {
        self.slots.iter().fold((0, 0), |(requests, retries), slot| {
            (requests + slot.requests, retries + slot.retries)
        })
    }
}

impl Floor {
    /// What the bucket holds at `now`: what it saved, filled since, at most `most`.
    fn saved_at(&self, now: Instant) -> Duration {
        (self.saved + now.saturating_duration_since(self.updated)).min(self.most)
    }
}

impl RetryBudget {
    /// `window` is the sliding window (a tenth of it is a slot, at least 1 ns); `percent` the
    /// share of requests that may be retried (clamped to 0 to 1); `min_per_sec` the floor's rate,
    /// 0 for none.
    pub fn new(window: Duration, min_per_sec: u32, percent: f32) -> Self {
        let now = Instant::now();
        let floor = (min_per_sec > 0).then(|| {
            let cost = Duration::from_secs(1) / min_per_sec;
            // A full bucket at the start, so that a quiet gateway can retry at once.
            let most = cost * min_per_sec;
            Floor {
                cost,
                most,
                saved: most,
                updated: now,
            }
        });
        Self {
            slot_length: (window / SLOTS as u32).max(Duration::from_nanos(1)),
            share: (f64::from(percent.clamp(0.0, 1.0)) * PARTS as f64).round() as u64,
            state: Mutex::new(State {
                slots: [Slot::default(); SLOTS],
                current: 0,
                current_started: now,
                floor,
            }),
        }
    }

    /// How many retries the budget would allow now, one after another: what the floor has saved
    /// and what is left of the share.
    pub fn available(&self) -> u64 {
        let (state, now) = self.state_now();
        let from_floor = state.floor.as_ref().map_or(0, |floor| {
            (floor.saved_at(now).as_nanos() / floor.cost.as_nanos()) as u64
        });
        let (requests, retries) = state.in_window();
        // `withdraw` allows a retry while retries × PARTS < share × requests.
        let from_share = (self.share * requests)
            .div_ceil(PARTS)
            .saturating_sub(retries);
        from_floor + from_share
    }

    /// The state with every slot that ended by now cleared.
    fn state_now(&self) -> (MutexGuard<'_, State>, Instant) {
        // Nothing under the lock can panic halfway through an update: a poisoned lock is still whole.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let now = Instant::now();
        let since = now.saturating_duration_since(state.current_started);
        let slot = self.slot_length.as_nanos();
        let ended = since.as_nanos() / slot;
        if ended > 0 {
            let current = state.current;
            for step in 1..=ended.min(SLOTS as u128) as usize {
                state.slots[(current + step) % SLOTS] = Slot::default();
            }
            state.current = (current + (ended % SLOTS as u128) as usize) % SLOTS;
            // Back to the grid: the new slot started on its boundary, not at this late call.
            state.current_started = now - Duration::from_nanos((since.as_nanos() % slot) as u64);
        }
        (state, now)
    }
}

impl Budget for RetryBudget {
    fn deposit(&self) {
        let (mut state, _) = self.state_now();
        let current = state.current;
        state.slots[current].requests += 1;
    }

    fn withdraw(&self) -> bool {
        let (mut state, now) = self.state_now();
        if let Some(floor) = state.floor.as_mut() {
            floor.saved = floor.saved_at(now);
            floor.updated = now;
            if floor.saved >= floor.cost {
                floor.saved -= floor.cost;
                return true;
            }
        }
        let (requests, retries) = state.in_window();
        if retries * PARTS < self.share * requests {
            let current = state.current;
            state.slots[current].retries += 1;
            return true;
        }
        false
    }
}
