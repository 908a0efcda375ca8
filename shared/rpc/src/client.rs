use std::{sync::Arc, time::Duration};

use deadline::{EstimateSettings, ForwardPolicy, LatencyEstimate, client::ForwardDeadlineLayer};
use http::{Request, Response};
use resilience::{
    breaker::{Breaker, BreakerLayer, BreakerSettings},
    bulkhead::{AdaptiveSettings, Bulkhead, BulkheadLayer},
    rate_limit::{QuotaSettings, SelfLimitLayer},
};
use serde::{Deserialize, Serialize};
use telemetry::{metrics::CallMetricsLayer, trace::ClientTraceLayer};
use tonic::transport::Endpoint;
use tonic::{Status, body::Body};
use tower::{BoxError, Layer, ServiceBuilder, util::BoxCloneSyncService};

use crate::{balance::Balance, guards::DependencyGuards, tls::ServiceTls};

/// How to reach one dependency, and how much of the deadline to give it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Dependency {
    /// `host:port` of the dependency as a URL (`http://host:port`). Whether the channel speaks
    /// TLS is the service's `tls` setting, never the scheme, so a typo cannot turn TLS off.
    pub endpoint: String,
    /// The service behind the endpoint (`orders`, `payment`, `bank-mock`): its certificate must
    /// name it (`orders.chain.internal`), whatever host name or address the endpoint has.
    pub service: String,
    /// How often the endpoint's host name is resolved again, to follow replicas as they come
    /// and go: each call goes to one of the addresses it resolves to (see the `balance` module).
    pub resolve_interval_ms: u64,
    /// Limit on establishing a TCP connection (short: the peer is near or it is not there).
    pub connect_timeout_ms: u64,
    /// Limit on silence of an established connection: an HTTP/2 ping unanswered for this long
    /// closes it. Unlike a deadline it does not bound the length of an answer.
    pub idle_timeout_ms: u64,
    /// How the operation deadline is shared with this dependency.
    pub deadline: ForwardPolicy,
    /// What this dependency has been taking, and whether a call with less is made.
    pub latency_estimate: EstimateSettings,
    /// The circuit breaker in front of this dependency.
    pub breaker: BreakerSettings,
    /// The bulkhead: calls in flight to this dependency at most; the next is rejected at once.
    pub max_concurrent: u32,
    /// The bulkhead's adaptive mode: a limit below `max_concurrent` that follows the latency.
    pub adaptive_limit: AdaptiveSettings,
    /// The dependency's known quota, kept by refusing the excess locally (rate 0: none).
    pub quota: QuotaSettings,
}

impl Default for Dependency {
    fn default() -> Self {
        Self {
            endpoint: "http://127.0.0.1:50051".into(),
            service: "gateway".into(),
            resolve_interval_ms: 5_000,
            connect_timeout_ms: 250,
            idle_timeout_ms: 5_000,
            deadline: ForwardPolicy::default(),
            latency_estimate: EstimateSettings::default(),
            breaker: BreakerSettings::default(),
            max_concurrent: 100,
            adaptive_limit: AdaptiveSettings::default(),
            quota: QuotaSettings::default(),
        }
    }
}

/// A channel to one dependency behind its guards: its bulkhead, self-limit and breaker, under its
/// deadline policy. Boxed, so that a service's code names one type (one allocation per call,
/// nothing beside a network call). Its error is the [`Status`] tonic would make of the layers'
/// error anyway ([`Status::from_error`]): a concrete type, because a boxed error inside the boxed
/// future trips the compiler's `Send` check of the handlers that await it.
pub type Client = BoxCloneSyncService<Request<Body>, Response<Body>, Status>;

/// An endpoint at `address` with `dependency`'s connection settings.
fn endpoint_to(
    address: &str,
    dependency: &Dependency,
) -> Result<Endpoint, tonic::transport::Error> {
    let idle = Duration::from_millis(dependency.idle_timeout_ms);
    Ok(crate::endpoint(address)?
        .connect_timeout(Duration::from_millis(dependency.connect_timeout_ms))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(idle)
        .keep_alive_timeout(idle)
        .keep_alive_while_idle(true))
}

/// A client and the guards in front of it, whose state the service shows.
pub struct Connection {
    pub client: Client,
    pub guards: DependencyGuards,
}

/// Builds `hop`'s client for `dependency`, named `name` in ledgers, errors and metrics. Connects
/// lazily, so services can start in any order, and reconnects by itself. It never retries: retries belong to the gateway alone. With
/// certificates in `tls`, it dials TLS and presents `hop`'s certificate.
pub fn connect(
    hop: &'static str,
    name: &'static str,
    dependency: &Dependency,
    tls: &ServiceTls,
) -> Result<Connection, tonic::transport::Error> {
    let endpoint = endpoint_to(&dependency.endpoint, dependency)?;
    let trace = ClientTraceLayer::new(name, endpoint.uri());
    let timed = CallMetricsLayer::new(endpoint.uri());
    let (host, port) = (
        endpoint.uri().host().unwrap_or_default(),
        endpoint.uri().port_u16().unwrap_or(80),
    );
    let interval = Duration::from_millis(dependency.resolve_interval_ms.max(1));
    let channel = Balance::resolving(name, host, port, interval, {
        let (dependency, tls, origin) = (dependency.clone(), tls.clone(), endpoint.uri().clone());
        move |replica| {
            // Requests still name the dependency (`:authority`), whichever replica takes them.
            let endpoint = endpoint_to(&replica.to_string(), &dependency)
                .expect("a socket address is a valid authority")
                .origin(origin.clone());
            crate::channel(&endpoint, &dependency.service, &tls)
        }
    });
    let breaker = Breaker::new(hop, name, dependency.breaker);
    let bulkhead = Bulkhead::new(
        hop,
        name,
        dependency.max_concurrent,
        dependency.adaptive_limit,
    );
    let latency_estimate = Arc::new(LatencyEstimate::new(dependency.latency_estimate));
    // The bulkhead and the self-limit answer before the breaker, so that their refusals never
    // count against the dependency; the breaker sits above the deadline so that it sees
    // DEADLINE_EXCEEDED.
    let client = BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_err(|error: BoxError| Status::from_error(error))
            .layer(BulkheadLayer::new(bulkhead.clone()))
            .layer(SelfLimitLayer::new(hop, name, dependency.quota))
            .layer(BreakerLayer::new(breaker.clone()))
            .layer(
                ForwardDeadlineLayer::new(name, dependency.deadline)
                    .with_estimate(latency_estimate.clone()),
            )
            .service(trace.layer(timed.layer(channel))),
    );
    Ok(Connection {
        client,
        guards: DependencyGuards {
            name,
            breaker,
            bulkhead,
            latency_estimate,
            retry: None,
        },
    })
}
