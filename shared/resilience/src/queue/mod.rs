//! Admission by queueing time: `workers` requests run at once, the rest wait their turn, and a
//! queue that stands (CoDel's test, see `codel.rs`) sheds the requests that waited longest.
//!
//! Why not only a count? An intake that admits by count keeps every admitted request, however
//! long it has waited and however little of its deadline is left. Under overload all of them
//! slow down together until none meets its deadline. A queue in front of a bounded number of
//! workers keeps the work in progress at what the server can do; CoDel notices when the queue no
//! longer drains and sheds from it; and while overloaded the newest request is served first
//! (adaptive LIFO, as Facebook's servers do), because the newest has the most deadline left,
//! while the oldest would likely run out anyway. A waiting request whose deadline passes is
//! answered by the deadline layer around this one and leaves the queue. Shed requests get the
//! intake's refusal: 503 with `Retry-After` over HTTP, RESOURCE_EXHAUSTED with a pushback over
//! gRPC, marked as never executed.

mod codel;

use std::{
    collections::VecDeque,
    future::Future,
    pin::Pin,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    task::{Context, Poll, ready},
    time::Duration,
};

use http::{Request, Response, StatusCode};
use pin_project_lite::pin_project;
use serde::{Deserialize, Serialize};
use tokio::{sync::oneshot, time::Instant};
use tower::{Layer, Service};

use crate::load_shed::{is_grpc, refused};
use codel::Codel;

/// The queue in front of a server's handlers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// Queue by time (`false`: every admitted request runs at once, limited by count only).
    pub enabled: bool,
    /// Requests running at once; the next ones wait.
    pub workers: u32,
    /// The queueing delay that a standing queue exceeds even for its luckiest request.
    pub target_ms: u64,
    /// How long the luckiest request is watched before the queue is judged.
    pub interval_ms: u64,
    /// Requests waiting at most; the next is refused at once.
    pub max_waiting: u32,
}

impl Default for QueueSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            workers: 64,
            target_ms: 5,
            interval_ms: 100,
            max_waiting: 1_000,
        }
    }
}

/// A copy of a queue's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct QueueStats {
    pub workers: u32,
    pub running: u32,
    pub waiting: usize,
    pub overloaded: bool,
    /// Requests shed from the queue, and refused for a full queue.
    pub shed: u64,
    pub refused: u64,
}

/// The queue of one server, shared by every clone of its service.
#[derive(Debug)]
pub struct Queue {
    name: &'static str,
    settings: QueueSettings,
    state: Mutex<State>,
    shed: AtomicU64,
    refused: AtomicU64,
}

#[derive(Debug)]
struct State {
    running: u32,
    waiting: VecDeque<Waiter>,
    codel: Codel,
}

/// A request waiting for a worker: woken with `true` to run, `false` when shed.
#[derive(Debug)]
struct Waiter {
    since: Instant,
    turn: oneshot::Sender<bool>,
}

impl Queue {
    pub fn new(name: &'static str, settings: QueueSettings) -> Arc<Self> {
        let codel = Codel::new(
            Instant::now(),
            Duration::from_millis(settings.target_ms),
            Duration::from_millis(settings.interval_ms),
        );
        let state = State {
            running: 0,
            waiting: VecDeque::new(),
            codel,
        };
        Arc::new(Self {
            name,
            settings,
            state: Mutex::new(state),
            shed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        })
    }

    pub fn stats(&self) -> QueueStats {
        let state = self.lock();
        QueueStats {
            workers: self.settings.workers,
            running: state.running,
            waiting: state.waiting.len(),
            overloaded: state.codel.overloaded(),
            shed: self.shed.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state holds counts and senders; a panic elsewhere cannot leave it half-written.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A worker now, a place in the queue, or a refusal when the queue is full.
    fn arrive(self: &Arc<Self>) -> Arrival {
        let mut state = self.lock();
        let now = Instant::now();
        if state.running < self.settings.workers.max(1) && state.waiting.is_empty() {
            state.running += 1;
            state.codel.shed(now, Duration::ZERO);
            return Arrival::Run(Worker {
                queue: self.clone(),
            });
        }
        if state.waiting.len() >= self.settings.max_waiting as usize {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Arrival::Refused;
        }
        let (turn, wait) = oneshot::channel();
        state.waiting.push_back(Waiter { since: now, turn });
        Arrival::Wait(wait)
    }

    /// A worker is free: it goes to the next waiter still there (the newest while overloaded),
    /// shedding those CoDel says to shed on the way; with none left it is given back.
    fn release(&self) {
        let mut state = self.lock();
        let now = Instant::now();
        loop {
            let next = if state.codel.overloaded() {
                state.waiting.pop_back()
            } else {
                state.waiting.pop_front()
            };
            let Some(waiter) = next else {
                state.running -= 1;
                return;
            };
            if state.codel.shed(now, now - waiter.since) {
                self.shed.fetch_add(1, Ordering::Relaxed);
                let _ = waiter.turn.send(false);
                continue;
            }
            // A waiter gone (its deadline passed, its caller left) cannot take the worker.
            if waiter.turn.send(true).is_ok() {
                return;
            }
        }
    }
}

enum Arrival {
    Run(Worker),
    Wait(oneshot::Receiver<bool>),
    Refused,
}

/// A running request's worker, handed on when it is dropped.
#[derive(Debug)]
pub struct Worker {
    queue: Arc<Queue>,
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.queue.release();
    }
}

/// Applies [`QueueService`].
#[derive(Debug, Clone)]
pub struct QueueLayer {
    queue: Arc<Queue>,
}

impl QueueLayer {
    pub fn new(queue: Arc<Queue>) -> Self {
        Self { queue }
    }
}

impl<S> Layer<S> for QueueLayer {
    type Service = QueueService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        QueueService {
            inner,
            queue: self.queue.clone(),
        }
    }
}

/// Runs requests on the queue's workers; see the module docs.
#[derive(Debug, Clone)]
pub struct QueueService<S> {
    inner: S,
    queue: Arc<Queue>,
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for QueueService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone,
    ResBody: Default + From<String>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let grpc = is_grpc(&request);
        let queue = self.queue.clone();
        match queue.arrive() {
            Arrival::Run(worker) => ResponseFuture::Running {
                inner: self.inner.call(request),
                worker,
            },
            Arrival::Wait(turn) => {
                // The service that was made ready runs this request; a fresh clone takes its place.
                let fresh = self.inner.clone();
                let service = std::mem::replace(&mut self.inner, fresh);
                ResponseFuture::Waiting {
                    turn: Turn(turn, queue),
                    call: Some((service, request, grpc)),
                }
            }
            Arrival::Refused => {
                let detail = format!(
                    "{}: {} requests already waiting; retry shortly",
                    queue.name, queue.settings.max_waiting
                );
                ResponseFuture::Answered {
                    response: Some(refused(
                        grpc,
                        queue.name,
                        detail,
                        StatusCode::SERVICE_UNAVAILABLE,
                        "Overloaded",
                    )),
                }
            }
        }
    }
}

/// A waiter's end of its turn. Dropped before it was read (the request's deadline passed), a
/// turn already given is given back, so that no worker is lost.
#[derive(Debug)]
pub struct Turn(oneshot::Receiver<bool>, Arc<Queue>);

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.close();
        if let Ok(true) = self.0.try_recv() {
            self.1.release();
        }
    }
}

pin_project! {
    /// Response future of [`QueueService`].
    #[project = Projection]
    pub enum ResponseFuture<S: Service<Request<ReqBody>>, ReqBody, ResBody> {
        Answered { response: Option<Response<ResBody>> },
        Waiting { turn: Turn, call: Option<(S, Request<ReqBody>, bool)> },
        Running { #[pin] inner: S::Future, worker: Worker },
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody, ResBody>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    ResBody: Default + From<String>,
{
    type Output = Result<Response<ResBody>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            match self.as_mut().project() {
                Projection::Answered { response } => {
                    return Poll::Ready(Ok(response.take().expect("polled after completion")));
                }
                Projection::Running { inner, .. } => return inner.poll(cx),
                Projection::Waiting { turn, call } => {
                    let run = ready!(Pin::new(&mut turn.0).poll(cx)).unwrap_or(false);
                    let queue = turn.1.clone();
                    let (mut service, request, grpc) =
                        call.take().expect("polled after completion");
                    let next = if run {
                        // The turn was read: the worker is this request's now, not the Turn's.
                        ResponseFuture::Running {
                            inner: service.call(request),
                            worker: Worker { queue },
                        }
                    } else {
                        let detail = format!(
                            "{}: shed after waiting in a standing queue; retry shortly",
                            queue.name
                        );
                        let response = refused(
                            grpc,
                            queue.name,
                            detail,
                            StatusCode::SERVICE_UNAVAILABLE,
                            "Overloaded",
                        );
                        ResponseFuture::Answered {
                            response: Some(response),
                        }
                    };
                    self.set(next);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
