//! The places of one port's connections: which connections hold one, which of them are idle and
//! since when, and whose place a newcomer takes when the port is full.
//!
//! Why this order: an idle connection costs its client little to open again, while a request in
//! flight would be lost; so only idle connections are closed to make room (and callers without a
//! certificate, whose requests are all refused), the longest idle first.
//! While the port is full, each address has a share of it (the cap divided among the addresses
//! holding places): the connections of an address over its share go first, and a newcomer from an
//! address at its share can only take the place of one of its own address's idle connections.
//! Below the cap no address is limited, so that clients behind one address (a NAT, a load
//! balancer) are served whenever there is room. A caller that presented no certificate on an inner
//! port keeps its place only until its handshake's time is up, and is the first to go.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    future::Future,
    io,
    net::IpAddr,
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll, Waker},
    time::Duration,
};

use tokio::{
    sync::Notify,
    time::{Instant, Sleep},
};

/// How long the accept loop waits for connections closed to make room to be gone before it goes
/// on regardless (they are idle and close as soon as they are polled: only a starved runtime is
/// this late).
const CLOSING_WAIT: Duration = Duration::from_secs(1);

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The places of one port.
#[derive(Default)]
pub(crate) struct Port {
    table: Mutex<Table>,
    /// Told whenever a connection closed to make room is gone.
    gone: Notify,
}

impl Port {
    /// A place for a connection from `peer` among at most `cap`, closing idle connections to make
    /// room when the port is full; `None` when none of those the newcomer may displace is idle.
    pub(super) fn admit(
        self: &Arc<Self>,
        peer: IpAddr,
        cap: usize,
        idle_timeout: Duration,
    ) -> Option<Place> {
        let mut table = lock(&self.table);
        // Bounded: every turn takes one connection out of the live ones.
        while table.live() >= cap {
            let victim = table.victim(peer, cap)?;
            table.make_room(victim);
        }
        let watch = Arc::new(Mutex::new(Watch::default()));
        let id = table.insert(peer, watch.clone());
        drop(table);
        Some(Place {
            port: self.clone(),
            id,
            watch,
            idle_timeout,
            timer: Box::pin(tokio::time::sleep(idle_timeout)),
        })
    }

    /// Waits until fewer than `at_most` connections closed to make room still hold their
    /// descriptors, or [`CLOSING_WAIT`] has passed.
    pub(super) async fn closing_below(&self, at_most: usize) {
        let give_up = Instant::now() + CLOSING_WAIT;
        // Bounded in time by `give_up`, and in count: only this port's accept loop, which is
        // waiting here, makes room, so each turn sees one fewer.
        loop {
            let gone = self.gone.notified();
            let closing = lock(&self.table).closing;
            if closing < at_most {
                return;
            }
            if tokio::time::timeout_at(give_up, gone).await.is_err() {
                tracing::warn!(
                    closing,
                    "connections closed to make room are slow to go; accepting regardless"
                );
                return;
            }
        }
    }

    fn request_started(&self, id: u64) {
        let mut table = lock(&self.table);
        let Some(held) = table.places.get_mut(&id) else {
            return;
        };
        held.open_requests += 1;
        if held.open_requests == 1 {
            table.busy(id);
        }
    }

    fn request_ended(&self, id: u64) {
        let mut table = lock(&self.table);
        let Some(held) = table.places.get_mut(&id) else {
            return;
        };
        held.open_requests -= 1;
        if held.open_requests == 0 && !held.closing {
            table.idle(id);
        }
    }

    fn uncertified(&self, id: u64, until: Instant) {
        let mut table = lock(&self.table);
        let Some(held) = table.places.get(&id) else {
            return;
        };
        if held.closing {
            return;
        }
        Watch::tell(&held.watch, |watch| watch.expires = Some(until));
        table.uncertified.insert(id);
    }

    fn release(&self, id: u64) {
        let mut table = lock(&self.table);
        let Some(held) = table.places.remove(&id) else {
            return;
        };
        if held.closing {
            table.closing -= 1;
            drop(table);
            self.gone.notify_waiters();
        } else {
            table.forget(id, held.peer, held.idle_order);
        }
    }
}

/// What the port knows of one connection's place.
struct Held {
    peer: IpAddr,
    open_requests: usize,
    /// Its turn among the idle connections, while it is idle.
    idle_order: Option<u64>,
    /// Closed to make room, not gone yet.
    closing: bool,
    watch: Arc<Mutex<Watch>>,
}

/// The places held from one address.
#[derive(Default)]
struct Holder {
    held: usize,
    /// Its idle connections, by their turn (the longest idle first).
    idle: BTreeMap<u64, u64>,
}

#[derive(Default)]
struct Table {
    /// Numbers places and turns alike: later is larger.
    counter: u64,
    /// Every connection that holds a descriptor, those closing to make room included.
    places: HashMap<u64, Held>,
    /// Connections closed to make room, not gone yet.
    closing: usize,
    /// The idle connections by their turn, the longest idle first.
    idle: BTreeMap<u64, u64>,
    /// Live places by address.
    holders: HashMap<IpAddr, Holder>,
    /// Addresses by the places they hold, the most last.
    by_held: BTreeSet<(usize, IpAddr)>,
    /// Connections of callers without a certificate: the first to go.
    uncertified: BTreeSet<u64>,
}

impl Table {
    fn live(&self) -> usize {
        self.places.len() - self.closing
    }

    fn next(&mut self) -> u64 {
        self.counter += 1;
        self.counter
    }

    fn insert(&mut self, peer: IpAddr, watch: Arc<Mutex<Watch>>) -> u64 {
        let id = self.next();
        self.places.insert(
            id,
            Held {
                peer,
                open_requests: 0,
                idle_order: None,
                closing: false,
                watch,
            },
        );
        let holder = self.holders.entry(peer).or_default();
        self.by_held.remove(&(holder.held, peer));
        holder.held += 1;
        self.by_held.insert((holder.held, peer));
        // Idle until its first request: a connection that never sends one is idle from the start.
        self.idle(id);
        id
    }

    /// The connection whose place a newcomer from `newcomer` takes, if any.
    fn victim(&self, newcomer: IpAddr, cap: usize) -> Option<u64> {
        if let Some(&id) = self.uncertified.first() {
            return Some(id);
        }
        let addresses = self.holders.len() + usize::from(!self.holders.contains_key(&newcomer));
        let share = (cap / addresses).max(1);
        let over_share = self
            .by_held
            .iter()
            .rev()
            .take_while(|(held, _)| *held > share)
            .filter_map(|(_, address)| self.holders[address].idle.first_key_value())
            .min_by_key(|(turn, _)| **turn);
        if let Some((_, &id)) = over_share {
            return Some(id);
        }
        match self.holders.get(&newcomer) {
            Some(own) if own.held >= share => own.idle.first_key_value().map(|(_, &id)| id),
            _ => self.idle.first_key_value().map(|(_, &id)| id),
        }
    }

    /// Tells `id` to close; it keeps its descriptor until it is gone, but no longer its place.
    fn make_room(&mut self, id: u64) {
        let Some(held) = self.places.get_mut(&id) else {
            return;
        };
        held.closing = true;
        Watch::tell(&held.watch, |watch| watch.closed_for_room = true);
        let (peer, idle_order) = (held.peer, held.idle_order.take());
        self.closing += 1;
        self.forget(id, peer, idle_order);
    }

    /// Takes a live place, from `peer` and idle at `idle_order` if at all, out of the indexes.
    fn forget(&mut self, id: u64, peer: IpAddr, idle_order: Option<u64>) {
        if let Some(turn) = idle_order {
            self.idle.remove(&turn);
        }
        self.uncertified.remove(&id);
        let Some(holder) = self.holders.get_mut(&peer) else {
            return;
        };
        if let Some(turn) = idle_order {
            holder.idle.remove(&turn);
        }
        self.by_held.remove(&(holder.held, peer));
        holder.held -= 1;
        if holder.held == 0 {
            self.holders.remove(&peer);
        } else {
            self.by_held.insert((holder.held, peer));
        }
    }

    fn idle(&mut self, id: u64) {
        let turn = self.next();
        let Some(held) = self.places.get_mut(&id) else {
            return;
        };
        held.idle_order = Some(turn);
        Watch::tell(&held.watch, |watch| watch.idle_since = Some(Instant::now()));
        self.idle.insert(turn, id);
        if let Some(holder) = self.holders.get_mut(&held.peer) {
            holder.idle.insert(turn, id);
        }
    }

    fn busy(&mut self, id: u64) {
        let Some(held) = self.places.get_mut(&id) else {
            return;
        };
        lock(&held.watch).idle_since = None;
        let Some(turn) = held.idle_order.take() else {
            return;
        };
        self.idle.remove(&turn);
        if let Some(holder) = self.holders.get_mut(&held.peer) {
            holder.idle.remove(&turn);
        }
    }
}

/// What a connection's own task watches to know when it must close.
#[derive(Default)]
struct Watch {
    closed_for_room: bool,
    /// Since when it has had no open request (`None`: it has one).
    idle_since: Option<Instant>,
    /// When a caller without a certificate loses its place.
    expires: Option<Instant>,
    /// The connection's task, woken when any of the above changes.
    waker: Option<Waker>,
}

impl Watch {
    /// Changes what the connection's task watches, and wakes it to look.
    fn tell(watch: &Mutex<Watch>, change: impl FnOnce(&mut Watch)) {
        let mut state = lock(watch);
        change(&mut state);
        let waker = state.waker.take();
        drop(state);
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

/// Why a connection must close.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Its place went to a newer connection while it was idle.
    MadeRoom,
    /// No open request for the idle timeout.
    Idle,
    /// A caller without a certificate whose handshake's time is up.
    Uncertified,
}

impl From<End> for io::Error {
    fn from(end: End) -> Self {
        match end {
            End::MadeRoom => io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "closed to make room for a newer connection",
            ),
            End::Idle => io::Error::new(io::ErrorKind::TimedOut, "no request for the idle timeout"),
            End::Uncertified => io::Error::new(
                io::ErrorKind::TimedOut,
                "no certificate: the handshake's time is up",
            ),
        }
    }
}

/// One connection's place on its port, given back when it is dropped (with the connection).
pub(crate) struct Place {
    port: Arc<Port>,
    id: u64,
    watch: Arc<Mutex<Watch>>,
    idle_timeout: Duration,
    timer: Pin<Box<Sleep>>,
}

impl Place {
    /// What the connection's requests hold while they are open.
    pub(crate) fn requests(&self) -> Requests {
        Requests {
            port: self.port.clone(),
            id: self.id,
        }
    }

    /// The connection's caller presented no certificate: it keeps its place until `until` at the
    /// latest, and is the first to go when the port is full.
    pub(crate) fn uncertified_until(&self, until: Instant) {
        self.port.uncertified(self.id, until);
    }

    /// Ready with the reason once the connection must close; until then, the task polling it is
    /// woken when that may have changed.
    pub(crate) fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<End> {
        let deadline = {
            let mut watch = lock(&self.watch);
            if watch.closed_for_room {
                return Poll::Ready(End::MadeRoom);
            }
            if !watch
                .waker
                .as_ref()
                .is_some_and(|waker| waker.will_wake(cx.waker()))
            {
                watch.waker = Some(cx.waker().clone());
            }
            let idle = watch
                .idle_since
                .map(|since| (since + self.idle_timeout, End::Idle));
            let uncertified = watch.expires.map(|until| (until, End::Uncertified));
            idle.into_iter()
                .chain(uncertified)
                .min_by_key(|(at, _)| *at)
        };
        let Some((at, end)) = deadline else {
            return Poll::Pending;
        };
        if self.timer.deadline() != at {
            self.timer.as_mut().reset(at);
        }
        self.timer.as_mut().poll(cx).map(|()| end)
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        self.port.release(self.id);
    }
}

/// Opens requests on one connection.
#[derive(Clone)]
pub(crate) struct Requests {
    port: Arc<Port>,
    id: u64,
}

impl Requests {
    /// One request begun: the connection is not idle until it (and every other) is dropped.
    pub(crate) fn open(&self) -> OpenRequest {
        self.port.request_started(self.id);
        OpenRequest {
            port: self.port.clone(),
            id: self.id,
        }
    }
}

/// A request in flight on a connection (its answer not all sent).
pub(crate) struct OpenRequest {
    port: Arc<Port>,
    id: u64,
}

impl Drop for OpenRequest {
    fn drop(&mut self) {
        self.port.request_ended(self.id);
    }
}

/// A connection that holds a place.
pub(crate) trait Placed {
    fn place(&self) -> &Place;
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    const IDLE: Duration = Duration::from_secs(30);

    fn address(last: u8) -> IpAddr {
        Ipv4Addr::new(127, 0, 0, last).into()
    }

    /// Why `place` must close now, if it must.
    fn end(place: &mut Place) -> Option<End> {
        match place.poll_end(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(end) => Some(end),
            Poll::Pending => None,
        }
    }

    fn admit(port: &Arc<Port>, from: u8, cap: usize) -> Place {
        port.admit(address(from), cap, IDLE).expect("admitted")
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_port_closes_its_longest_idle_connection_for_a_newcomer() {
        let port = Arc::new(Port::default());
        let mut places: Vec<Place> = (0..3).map(|_| admit(&port, 1, 3)).collect();
        let newcomer = admit(&port, 1, 3);
        assert_eq!(end(&mut places[0]), Some(End::MadeRoom));
        assert_eq!(
            places.iter_mut().skip(1).map(end).collect::<Vec<_>>(),
            [None, None]
        );
        drop(newcomer);
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_with_an_open_request_is_never_closed_to_make_room() {
        let port = Arc::new(Port::default());
        let mut first = admit(&port, 1, 2);
        let _busy = first.requests().open();
        let mut second = admit(&port, 1, 2);
        let mut third = admit(&port, 1, 2);
        assert_eq!(
            (end(&mut first), end(&mut second)),
            (None, Some(End::MadeRoom))
        );
        let _also_busy = third.requests().open();
        assert!(
            port.admit(address(1), 2, IDLE).is_none(),
            "every connection busy: the newcomer is refused"
        );
        assert_eq!((end(&mut first), end(&mut third)), (None, None));
    }

    #[tokio::test(start_paused = true)]
    async fn below_the_cap_one_address_may_hold_every_place() {
        let port = Arc::new(Port::default());
        let mut places: Vec<Place> = (0..100).map(|_| admit(&port, 1, 100)).collect();
        assert!(places.iter_mut().all(|place| end(place).is_none()));
    }

    #[tokio::test(start_paused = true)]
    async fn while_the_port_is_full_an_address_over_its_share_gives_up_its_longest_idle_first() {
        let port = Arc::new(Port::default());
        let mut alone = admit(&port, 2, 4);
        let mut crowd: Vec<Place> = (0..3).map(|_| admit(&port, 1, 4)).collect();
        // Three addresses share four places: one each. The crowd's oldest goes, not the older
        // connection of an address within its share.
        let _newcomer = admit(&port, 3, 4);
        assert_eq!(end(&mut alone), None);
        assert_eq!(end(&mut crowd[0]), Some(End::MadeRoom));
    }

    #[tokio::test(start_paused = true)]
    async fn a_newcomer_from_an_address_at_its_share_takes_only_its_own_address_place() {
        let port = Arc::new(Port::default());
        let mut others: Vec<Place> = (0..2).map(|_| admit(&port, 1, 4)).collect();
        let mut own: Vec<Place> = (0..2).map(|_| admit(&port, 2, 4)).collect();
        let _newcomer = admit(&port, 2, 4);
        assert_eq!(others.iter_mut().map(end).collect::<Vec<_>>(), [None, None]);
        assert_eq!(end(&mut own[0]), Some(End::MadeRoom));
        // Its own all busy, it gets nothing, however idle the others' are.
        let _busy = [own[1].requests().open(), _newcomer.requests().open()];
        assert!(port.admit(address(2), 4, IDLE).is_none());
        assert!(
            port.admit(address(3), 4, IDLE).is_some(),
            "an address below its share still gets in"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_caller_without_a_certificate_goes_first_and_leaves_when_its_time_is_up() {
        let port = Arc::new(Port::default());
        let mut certified = admit(&port, 1, 2);
        let mut uncertified = admit(&port, 2, 2);
        let _busy = uncertified.requests().open();
        uncertified.uncertified_until(Instant::now() + Duration::from_secs(5));
        let _newcomer = admit(&port, 1, 2);
        assert_eq!(
            (end(&mut certified), end(&mut uncertified)),
            (None, Some(End::MadeRoom))
        );

        let mut late = admit(&port, 3, 10);
        let _busy = late.requests().open();
        late.uncertified_until(Instant::now() + Duration::from_secs(5));
        tokio::time::advance(Duration::from_millis(4_900)).await;
        assert_eq!(end(&mut late), None);
        tokio::time::advance(Duration::from_millis(100)).await;
        assert_eq!(
            end(&mut late),
            Some(End::Uncertified),
            "a request in flight does not keep it"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn idle_is_counted_from_the_end_of_the_last_open_request() {
        let port = Arc::new(Port::default());
        let mut place = admit(&port, 1, 10);
        let requests = place.requests();
        let (first, second) = (requests.open(), requests.open());
        tokio::time::advance(IDLE * 3).await;
        assert_eq!(end(&mut place), None, "two requests open");
        drop(first);
        tokio::time::advance(IDLE * 3).await;
        assert_eq!(end(&mut place), None, "one request open");
        drop(second);
        tokio::time::advance(IDLE - Duration::from_millis(1)).await;
        assert_eq!(end(&mut place), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(end(&mut place), Some(End::Idle));
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_closed_to_make_room_counts_until_it_is_gone() {
        let port = Arc::new(Port::default());
        let first = admit(&port, 1, 1);
        let _second = admit(&port, 1, 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(10), port.closing_below(1))
                .await
                .is_err(),
            "the first still holds its descriptor"
        );
        drop(first);
        tokio::time::timeout(Duration::from_millis(10), port.closing_below(1))
            .await
            .expect("gone");
    }
}
