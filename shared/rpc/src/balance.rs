//! Per-call balancing across every replica of a dependency.
//!
//! One HTTP/2 connection carries every call, so a channel to a Service name talks to whichever
//! replica it connected to first, and replicas added later get nothing from callers already
//! connected. [`Balance`] instead resolves the endpoint's host name again and again (every
//! address of a headless Kubernetes Service or of a Compose service's replicas), keeps a channel
//! per address, and picks one per call: of two replicas drawn at random, the one with fewer calls
//! in flight (power of two choices, as tower's `balance` does). It skips
//! - a replica ejected for failing: at once for a refused connection, after
//!   [`FAILURES_TO_EJECT`] failures in a row otherwise (a call that failed, or was answered
//!   `UNAVAILABLE`), for [`EJECTION`], twice as long at each ejection in a row up to
//!   [`MAX_EJECTION`], so that a replica gone or broken does not attract calls by failing them
//!   fast (Envoy's outlier detection, in its simplest form);
//! - a replica an earlier attempt of the same call went to ([`PreviousReplicas`]), so that the
//!   edge's retry lands elsewhere;
//!
//! unless no other is left.
//!
//! Why not tower's `Balance`: it is not `Clone`, so every caller would share it behind a
//! `Buffer`, one more task hand-off per call, and it cannot see which replica a call's earlier
//! attempts went to.
//!
//! Breakers, bulkheads and the self-limit stay per dependency, above the balancer: they protect
//! the caller from the dependency as a whole, and the ejection above handles one replica that
//! cannot be reached.

use std::{
    collections::BTreeSet,
    future::Future,
    io,
    net::{IpAddr, SocketAddr},
    pin::Pin,
    sync::{
        Arc, Mutex, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    task::{Context, Poll},
    time::Duration,
};

use http::{Request, Response};
use rand::Rng;
use resilience::retry::PreviousReplicas;
use tokio::{sync::watch, time::Instant};
use tonic::{Status, metadata::MetadataValue};
use tower::{BoxError, Service, ServiceExt};

/// How long a failing replica is first left out of the choice.
pub(crate) const EJECTION: Duration = Duration::from_secs(1);
/// The longest an ejection lasts, however often the replica failed.
pub(crate) const MAX_EJECTION: Duration = Duration::from_secs(30);
/// Failures in a row, each a call that failed or was answered `UNAVAILABLE`, that eject a
/// replica. A refused connection ejects it at once.
pub(crate) const FAILURES_TO_EJECT: u32 = 5;

/// A `Clone` service that sends each call to one replica of a dependency (see the module).
pub(crate) struct Balance<S> {
    service: &'static str,
    replicas: watch::Receiver<Replicas<S>>,
}

impl<S> Clone for Balance<S> {
    fn clone(&self) -> Self {
        Self {
            service: self.service,
            replicas: self.replicas.clone(),
        }
    }
}

/// The replicas known at one moment; `None` until the first resolution answered.
struct Replicas<S> {
    resolved: Option<Resolved<S>>,
}

/// What a resolution gave: the replicas, or why there are none.
type Resolved<S> = Result<Arc<[Arc<Replica<S>>]>, Arc<str>>;

impl<S> Clone for Replicas<S> {
    fn clone(&self) -> Self {
        Self {
            resolved: self.resolved.clone(),
        }
    }
}

struct Replica<S> {
    address: SocketAddr,
    channel: S,
    in_flight: AtomicUsize,
    health: Mutex<Health>,
}

/// A replica's recent record, for ejecting one that fails while others answer.
#[derive(Default)]
struct Health {
    /// Calls failed since the last that did not.
    failures: u32,
    /// Ejections since the last call that did not fail.
    ejections: u32,
    ejected_until: Option<Instant>,
}

impl<S> Replica<S> {
    fn health(&self) -> std::sync::MutexGuard<'_, Health> {
        self.health.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn ejected(&self, now: Instant) -> bool {
        self.health().ejected_until.is_some_and(|until| now < until)
    }

    fn succeeded(&self) {
        let mut health = self.health();
        (health.failures, health.ejections) = (0, 0);
    }

    /// Counts a failure; ejects the replica at once for a call it did not take, else after
    /// [`FAILURES_TO_EJECT`] in a row; each ejection in a row twice as long, up to
    /// [`MAX_EJECTION`].
    fn failed(&self, not_taken: bool, now: Instant) {
        let mut health = self.health();
        health.failures += 1;
        if not_taken || health.failures >= FAILURES_TO_EJECT {
            let length = EJECTION
                .saturating_mul(1 << health.ejections.min(16))
                .min(MAX_EJECTION);
            health.ejections += 1;
            health.ejected_until = Some(now + length);
        }
    }
}

impl<S: Send + Sync + 'static> Balance<S> {
    /// Balances over the addresses `host:port` resolves to, resolved every `interval` while any
    /// clone of the balancer is alive, each reached through the channel `connect` makes for it.
    /// An address literal is its own one replica, never resolved.
    pub(crate) fn resolving(
        service: &'static str,
        host: &str,
        port: u16,
        interval: Duration,
        connect: impl Fn(SocketAddr) -> S + Send + 'static,
    ) -> Self {
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        if let Ok(ip) = host.parse::<IpAddr>() {
            let replica = Arc::new(Replica::new(SocketAddr::new(ip, port), &connect));
            let (_, replicas) = watch::channel(Replicas {
                resolved: Some(Ok(Arc::from([replica]))),
            });
            return Self { service, replicas };
        }
        let resolve = move || {
            let host = host.clone();
            async move {
                tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .map(Iterator::collect)
            }
        };
        Self::discovering(service, interval, resolve, connect)
    }

    /// Balances over the addresses `resolve` answers, asked every `interval`. On a failed
    /// resolution the replicas known stay (a name server's hiccup must not empty the list).
    fn discovering<R, F>(
        service: &'static str,
        interval: Duration,
        resolve: R,
        connect: impl Fn(SocketAddr) -> S + Send + 'static,
    ) -> Self
    where
        R: Fn() -> F + Send + 'static,
        F: Future<Output = io::Result<BTreeSet<SocketAddr>>> + Send,
    {
        let (sender, replicas) = watch::channel(Replicas { resolved: None });
        tokio::spawn(async move {
            loop {
                let resolved = resolve().await;
                let known = sender.borrow().resolved.clone();
                let next = match (resolved, known) {
                    (Ok(addresses), Some(Ok(known)))
                        if known
                            .iter()
                            .map(|replica| replica.address)
                            .eq(addresses.iter().copied()) =>
                    {
                        None
                    }
                    (Ok(addresses), known) => {
                        tracing::info!(service, replicas = ?addresses, "replicas resolved");
                        let known = known.and_then(Result::ok).unwrap_or_default();
                        let kept = |address| {
                            known
                                .iter()
                                .find(|replica| replica.address == address)
                                .cloned()
                        };
                        Some(Ok(addresses
                            .into_iter()
                            .map(|address| {
                                kept(address)
                                    .unwrap_or_else(|| Arc::new(Replica::new(address, &connect)))
                            })
                            .collect()))
                    }
                    (Err(error), Some(Ok(_))) => {
                        tracing::warn!(service, %error, "replicas not resolved again; the known ones stay");
                        None
                    }
                    (Err(error), _) => Some(Err(Arc::from(error.to_string()))),
                };
                if let Some(next) = next {
                    sender.send_replace(Replicas {
                        resolved: Some(next),
                    });
                }
                tokio::select! {
                    () = tokio::time::sleep(interval) => {}
                    () = sender.closed() => return,
                }
            }
        });
        Self { service, replicas }
    }
}

impl<S> Replica<S> {
    fn new(address: SocketAddr, connect: &impl Fn(SocketAddr) -> S) -> Self {
        Self {
            address,
            channel: connect(address),
            in_flight: AtomicUsize::new(0),
            health: Mutex::default(),
        }
    }
}

/// Of `replicas`, the one a call goes to: two drawn at random among the best-placed (neither
/// ejected nor tried by this call; else not ejected; else any), the less busy of the two.
fn pick<'a, S>(
    replicas: &'a [Arc<Replica<S>>],
    tried: Option<&PreviousReplicas>,
    now: Instant,
) -> Option<&'a Arc<Replica<S>>> {
    // One replica (an address literal, a single pod): it is the choice whatever its record, so
    // none of the records is read.
    if let [only] = replicas {
        return Some(only);
    }
    let eligible = |tier: usize, replica: &Arc<Replica<S>>| match tier {
        0 => !replica.ejected(now) && !tried.is_some_and(|tried| tried.contains(replica.address)),
        1 => !replica.ejected(now),
        _ => true,
    };
    let mut random = rand::rng();
    (0..3).find_map(|tier| {
        let candidates = || {
            replicas
                .iter()
                .filter(move |replica| eligible(tier, replica))
        };
        let count = candidates().count();
        let first = candidates().nth(random.random_range(0..count.max(1)))?;
        if count == 1 {
            return Some(first);
        }
        let second = candidates()
            .filter(|replica| !Arc::ptr_eq(replica, first))
            .nth(random.random_range(0..count - 1))?;
        Some(
            if second.in_flight.load(Ordering::Relaxed) < first.in_flight.load(Ordering::Relaxed) {
                second
            } else {
                first
            },
        )
    })
}

/// Counts a call in flight on its replica until the call ends, however it ends.
struct InFlight<S>(Arc<Replica<S>>);

impl<S> InFlight<S> {
    fn start(replica: Arc<Replica<S>>) -> Self {
        replica.in_flight.fetch_add(1, Ordering::Relaxed);
        Self(replica)
    }
}

impl<S> Drop for InFlight<S> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<S, B, ResBody> Service<Request<B>> for Balance<S>
where
    S: Service<Request<B>, Response = Response<ResBody>> + Clone + Send + Sync + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
    B: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<ResBody>, BoxError>> + Send>>;

    /// Always ready: each replica's channel queues its own calls.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let service = self.service;
        let known = self.replicas.borrow().resolved.clone();
        let mut changes = self.replicas.clone();
        Box::pin(async move {
            let known = match known {
                Some(known) => Some(known),
                // Only the calls before the first resolution wait.
                None => changes
                    .wait_for(|replicas| replicas.resolved.is_some())
                    .await
                    .ok()
                    .and_then(|replicas| replicas.resolved.clone()),
            };
            let replicas = match known {
                Some(Ok(replicas)) => replicas,
                Some(Err(error)) => {
                    return Err(not_sent(service, &format!("no replica resolved: {error}")));
                }
                None => return Err(not_sent(service, "no replica resolved")),
            };
            let tried = request.extensions().get::<PreviousReplicas>();
            let Some(replica) = pick(&replicas, tried, Instant::now()).cloned() else {
                return Err(not_sent(service, "no replica resolved"));
            };
            if let Some(tried) = tried {
                tried.push(replica.address);
            }
            let in_flight = InFlight::start(replica.clone());
            let answer = replica
                .channel
                .clone()
                .oneshot(request)
                .await
                .map_err(Into::into);
            drop(in_flight);
            match answer {
                Ok(response) => {
                    if unavailable(&response) {
                        replica.failed(false, Instant::now())
                    } else {
                        replica.succeeded()
                    }
                    Ok(response)
                }
                Err(error) => {
                    let never_sent = never_sent(&*error);
                    tracing::debug!(service, replica = %replica.address, never_sent, ?error, "call failed");
                    replica.failed(never_sent, Instant::now());
                    Err(if never_sent {
                        not_sent(
                            service,
                            &format!("{} did not take the call: {error}", replica.address),
                        )
                    } else {
                        error
                    })
                }
            }
        })
    }
}

/// Whether a call was answered `UNAVAILABLE` in its headers (as unary failures are: the status
/// of a streamed answer comes in trailers, which the balancer does not wait for).
fn unavailable<B>(response: &Response<B>) -> bool {
    response
        .headers()
        .get("grpc-status")
        .is_some_and(|code| code.as_bytes() == b"14")
}

/// Whether the call never reached the replica: the connection was refused or not made in time;
/// it was closed before the call was written (hyper's "canceled", or "closed" when the call found
/// it so); or the server
/// left the stream unprocessed (HTTP/2 `REFUSED_STREAM`, or a graceful GOAWAY whose last stream
/// came before it, as a server that drains sends).
fn never_sent(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(error) = source {
        let not_taken = error.downcast_ref::<io::Error>().is_some_and(|error| {
            error.kind() == io::ErrorKind::ConnectionRefused
                // The channel's connect timeout (tonic's, tokio's `Elapsed`): a replica gone
                // without a word, its address not answering at all.
                || (error.kind() == io::ErrorKind::TimedOut && error.get_ref().is_some_and(|inner| inner.is::<tokio::time::error::Elapsed>()))
        }) || error.downcast_ref::<hyper::Error>().is_some_and(|error| error.is_canceled() || error.is_closed())
            || error.downcast_ref::<h2::Error>().is_some_and(|error| {
                error.reason() == Some(h2::Reason::REFUSED_STREAM)
                    || (error.is_go_away() && error.is_remote() && error.reason() == Some(h2::Reason::NO_ERROR))
            });
        if not_taken {
            return true;
        }
        // An io::Error's source skips the error it wraps: look at that one first.
        source = match error
            .downcast_ref::<io::Error>()
            .and_then(io::Error::get_ref)
        {
            Some(wrapped) => Some(wrapped),
            None => error.source(),
        };
    }
    false
}

/// UNAVAILABLE for a call that was never sent, marked so: a hop may undo what it did for it, and
/// the edge may repeat it.
fn not_sent(service: &str, reason: &str) -> BoxError {
    let mut status = Status::unavailable(format!("{service}: {reason}"));
    status
        .metadata_mut()
        .insert(wire::NOT_EXECUTED, MetadataValue::from_static("true"));
    status.into()
}

#[cfg(test)]
mod tests;
