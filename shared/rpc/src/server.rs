use std::{future::Future, io, net::SocketAddr, sync::Arc, time::Duration};

use deadline::{
    HopStats, InboundPolicy,
    server::{DeadlineLayer, Grpc},
};
use resilience::{
    load_shed::{Intake, LoadShedLayer},
    queue::{Queue, QueueLayer},
};
use telemetry::{metrics::RequestMetricsLayer, trace::ServerTraceLayer};
use tokio::net::{TcpListener, TcpSocket};
use tokio_util::sync::CancellationToken;
use tonic::{server::NamedService, service::Routes};
use tonic_health::{ServingStatus, pb::health_server, server::HealthReporter};
use tower::ServiceExt;

use prost::Message;
use prost_types::{FileDescriptorProto, FileDescriptorSet};

use crate::{
    authorize::{AuthorizeLayer, Policy},
    connections::{ConnectionLimits, LimitedListener},
    listener::TlsListener,
    ops::Drain,
    tls::ServiceTls,
};

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind { addr: SocketAddr, source: io::Error },
    #[error("reflection service: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("serving: {0}")]
    Serve(io::Error),
    #[error("invalid settings: {0}")]
    Settings(String),
    #[error("reflection descriptors: {0}")]
    Descriptors(#[from] prost::DecodeError),
}

/// Connections the kernel completes and queues for a port before the server accepts them
/// (capped by `net.core.somaxconn`, 4,096 by default). Larger than the usual 128, so that a burst
/// of connections is queued rather than dropped (a dropped handshake is retried after a second,
/// which is how long a new client would wait behind a flood).
const ACCEPT_QUEUE: u32 = 4_096;

/// Binds `addr` (port 0 picks a free port).
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServerError> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    };
    let listen = || {
        let socket = socket?;
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(ACCEPT_QUEUE)
    };
    listen().map_err(|source| ServerError::Bind { addr, source })
}

/// Serves an HTTP router (admin APIs, metrics) until `shutdown` completes, under the default
/// [`ConnectionLimits`].
pub async fn serve_http(
    listener: TcpListener,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    serve_http_with(listener, ConnectionLimits::default(), router, shutdown).await
}

/// [`serve_http`] under `limits`.
pub async fn serve_http_with(
    listener: TcpListener,
    limits: ConnectionLimits,
    router: axum::Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServerError> {
    crate::serve::serve(
        LimitedListener::new(listener, limits),
        &limits,
        router,
        shutdown,
    )
    .await;
    Ok(())
}

/// A token cancelled on Ctrl-C or SIGTERM, for `run_until_stopped`.
pub fn shutdown_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(_) => std::future::pending().await,
            }
        };
        #[cfg(not(unix))]
        let terminate = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {}
            () = terminate => {}
        }
        tracing::info!("shutting down");
        cancel.cancel();
    });
    token
}

/// How long a TLS handshake may take before the connection is closed.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a server sits in the chain, and so whom it answers.
#[derive(Clone)]
pub enum Role {
    /// Where operations start: requests from outside, who prove who they are with API keys.
    /// Reflection describes the public services only.
    Edge,
    /// Behind the edge: requests from other hops, over mutual TLS with `tls`, each caller
    /// admitted by `callers` (in plain text, every caller is admitted).
    Inner { tls: ServiceTls, callers: Policy },
}

/// A bound gRPC server for one hop, not yet serving.
pub struct GrpcServer {
    hop: &'static str,
    /// The paths of the methods it serves, the only ones its metrics name.
    methods: Vec<String>,
    role: Role,
    listener: TcpListener,
    routes: axum::Router,
    /// `grpc.health.v1`, served outside every layer of `routes`: a probe is answered however
    /// busy the server is, and says NOT_SERVING once the drain has started.
    health: (HealthReporter, axum::Router),
    /// The names whose status `health` reports.
    names: Vec<&'static str>,
    stats: Arc<HopStats>,
    limits: ConnectionLimits,
}

/// A gRPC service as tonic generates it (`…Server::new(handler)`), ready to be routed.
pub trait GrpcService:
    tower::Service<
        http::Request<tonic::body::Body>,
        Error = std::convert::Infallible,
        Response: axum::response::IntoResponse,
        Future: Send + 'static,
    > + NamedService
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<S> GrpcService for S where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Error = std::convert::Infallible,
            Response: axum::response::IntoResponse,
            Future: Send + 'static,
        > + NamedService
        + Clone
        + Send
        + Sync
        + 'static
{
}

/// The gRPC services that one server serves, each reported SERVING by its health service.
pub struct Services {
    routes: Routes,
    names: Vec<&'static str>,
    queue: Option<Arc<Queue>>,
}

impl Services {
    pub fn new<S: GrpcService>(service: S) -> Self {
        Self {
            routes: Routes::new(service),
            names: vec![S::NAME],
            queue: None,
        }
    }

    /// Runs the services' requests on `queue`'s workers, inside the deadline (a request's wait
    /// is spent from its budget, and one whose deadline passes while waiting leaves the queue).
    pub fn queued(self, queue: Arc<Queue>) -> Self {
        Self {
            queue: Some(queue),
            ..self
        }
    }

    /// Serves `service` too, on the same port.
    pub fn add_service<S: GrpcService>(mut self, service: S) -> Self {
        self.routes = self.routes.add_service(service);
        self.names.push(S::NAME);
        self
    }
}

impl GrpcServer {
    /// Binds `addr` (port 0 picks a free port) and mounts `service` with health and reflection,
    /// every request under the deadline layer as hop `hop`, in the chain at `role`.
    pub async fn bind(
        hop: &'static str,
        role: Role,
        addr: SocketAddr,
        inbound: InboundPolicy,
        service: impl GrpcService,
    ) -> Result<Self, ServerError> {
        Self::bind_all(hop, role, addr, inbound, Services::new(service)).await
    }

    /// [`GrpcServer::bind`] for several services on one port.
    pub async fn bind_all(
        hop: &'static str,
        role: Role,
        addr: SocketAddr,
        inbound: InboundPolicy,
        services: Services,
    ) -> Result<Self, ServerError> {
        let listener = bind(addr).await?;
        let (health, health_service) = tonic_health::server::health_reporter();
        for name in &services.names {
            health
                .set_service_status(*name, ServingStatus::Serving)
                .await;
        }
        let health_route = axum::Router::new().route_service(
            &format!("/{}/{{*method}}", health_server::SERVICE_NAME),
            health_service.map_request(|request: http::Request<axum::body::Body>| {
                request.map(tonic::body::Body::new)
            }),
        );
        let descriptors = match &role {
            Role::Edge => public_descriptors(&services.names)?,
            Role::Inner { .. } => FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET)?,
        };
        let (reflection_v1, reflection_v1alpha) = reflection(&descriptors)?;
        let methods = method_paths(&descriptors, &services.names)?;
        let stats = HopStats::new();
        let routes = services
            .routes
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .prepare()
            .into_axum_router()
            .layer(axum::middleware::map_response(
                crate::decode::undecodable_is_invalid_argument,
            ))
            .layer(tower::util::option_layer(
                services.queue.map(QueueLayer::new),
            ))
            .layer(match &role {
                Role::Edge => DeadlineLayer::new(hop, Grpc::new(inbound), stats.clone()).at_edge(),
                Role::Inner { .. } => DeadlineLayer::new(hop, Grpc::new(inbound), stats.clone()),
            })
            // Outside the deadline: a refused request costs no deadline bookkeeping.
            .layer(LoadShedLayer::new(Intake::new(hop, inbound.max_in_flight)))
            .layer(ServerTraceLayer::new(hop));
        Ok(Self {
            hop,
            methods,
            role,
            listener,
            routes,
            health: (health, health_route),
            names: services.names,
            stats,
            limits: ConnectionLimits::default(),
        })
    }

    /// Puts `layer` in front of every request, outside the deadline layer (e.g. an edge's rate
    /// limit, which must answer before anything else is done).
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: tower::Layer<axum::routing::Route> + Clone + Send + Sync + 'static,
        L::Service: tower::Service<axum::extract::Request> + Clone + Send + Sync + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Response:
            axum::response::IntoResponse + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Error:
            Into<std::convert::Infallible> + 'static,
        <L::Service as tower::Service<axum::extract::Request>>::Future: Send + 'static,
    {
        self.routes = self.routes.layer(layer);
        self
    }

    /// Keeps this server's connections to `limits` instead of the defaults.
    pub fn connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Deadline counters of this hop's requests.
    pub fn stats(&self) -> Arc<HopStats> {
        self.stats.clone()
    }

    /// Serves until `drain` closes the port, then finishes the requests in flight; from the
    /// drain's start, health says NOT_SERVING. Every answer is counted, those of layers added
    /// with [`GrpcServer::layer`] too. `/metrics` is served on the operations port
    /// ([`crate::ops`]), not here.
    ///
    /// An inner server with certificates serves TLS only, and checks every request, health
    /// included, against its callers before anything else.
    pub async fn serve(self, drain: Drain) -> Result<(), ServerError> {
        let (reporter, health) = self.health;
        let (names, drain_started, closing) = (self.names, drain.started(), drain.closing());
        let report_drain = async move {
            drain_started.await;
            for name in names.into_iter().chain([""]) {
                reporter
                    .set_service_status(name, ServingStatus::NotServing)
                    .await;
            }
        };
        // Merged after the service's layers, which so do not wrap it; one router, one lookup.
        let routes = self
            .routes
            .merge(health)
            .layer(RequestMetricsLayer::new(self.hop, self.methods));
        let serving = async {
            let config = match self.role {
                Role::Inner { tls, callers } => tls.server_config().map(|config| (config, callers)),
                Role::Edge => None,
            };
            match config {
                None => serve_http_with(self.listener, self.limits, routes, closing).await,
                Some((config, callers)) => {
                    let routes = routes.layer(AuthorizeLayer::new(callers));
                    let listener = TlsListener::new(
                        LimitedListener::new(self.listener, self.limits),
                        config,
                        HANDSHAKE_TIMEOUT,
                    );
                    crate::serve::serve(listener, &self.limits, routes, closing).await;
                    Ok(())
                }
            }
        };
        let ((), served) = tokio::join!(report_drain, serving);
        served
    }
}

/// The paths (`/orders.v1.Orders/CreateOrder`) of the methods of the `services` in `descriptors`,
/// of health and of both reflections: what a server with them serves.
fn method_paths(
    descriptors: &FileDescriptorSet,
    services: &[&str],
) -> Result<Vec<String>, prost::DecodeError> {
    let mut sets = vec![descriptors.clone()];
    for encoded in [
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ] {
        sets.push(FileDescriptorSet::decode(encoded)?);
    }
    let served = |name: &str| {
        services.contains(&name)
            || name.starts_with("grpc.health.")
            || name.starts_with("grpc.reflection.")
    };
    Ok(sets
        .iter()
        .flat_map(|set| &set.file)
        .flat_map(|file| {
            file.service
                .iter()
                .map(move |service| (format!("{}.{}", file.package(), service.name()), service))
        })
        .filter(|(name, _)| served(name))
        .flat_map(|(name, service)| {
            service
                .method
                .iter()
                .map(move |method| format!("/{name}/{}", method.name()))
        })
        .collect())
}

/// Reflection of `descriptors` in both versions, `grpc.reflection.v1` and `grpc.reflection.v1alpha`
/// (which older clients ask, Python's grpcio-reflection among them). Each describes both
/// reflection services too: the port serves both.
pub fn reflection(
    descriptors: &FileDescriptorSet,
) -> Result<(impl GrpcService, impl GrpcService), ServerError> {
    let configure = || {
        tonic_reflection::server::Builder::configure()
            .include_reflection_service(false)
            .register_encoded_file_descriptor_set(tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(
                tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
            )
            .register_file_descriptor_set(descriptors.clone())
    };
    Ok((configure().build_v1()?, configure().build_v1alpha()?))
}

/// The descriptors of `services` and of the files they import, and nothing else: what the public
/// port's reflection may show.
fn public_descriptors(services: &[&str]) -> Result<FileDescriptorSet, prost::DecodeError> {
    let all = FileDescriptorSet::decode(proto::FILE_DESCRIPTOR_SET)?;
    let defines_served = |file: &FileDescriptorProto| {
        file.service.iter().any(|service| {
            services.contains(&format!("{}.{}", file.package(), service.name()).as_str())
        })
    };
    let mut wanted: Vec<String> = all
        .file
        .iter()
        .filter(|file| defines_served(file))
        .map(|file| file.name().to_owned())
        .collect();
    let mut index = 0;
    while let Some(name) = wanted.get(index).cloned() {
        if let Some(file) = all.file.iter().find(|file| file.name() == name) {
            for dependency in &file.dependency {
                if !wanted.contains(dependency) {
                    wanted.push(dependency.clone());
                }
            }
        }
        index += 1;
    }
    Ok(FileDescriptorSet {
        file: all
            .file
            .into_iter()
            .filter(|file| wanted.contains(&file.name().to_owned()))
            .collect(),
    })
}
