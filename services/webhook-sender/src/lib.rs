#![doc = include_str!("../README.md")]

mod delivery;
mod dns;
mod error;
mod fair_share;
pub mod metrics;
mod retry_after;
mod schedule;
mod settings;
mod vetted_dns;
mod worker;

pub use delivery::USER_AGENT;
pub use dns::DnsResolver;
pub use error::SenderError;
pub use settings::{Delay, DnsSettings, InvalidSetting, Settings};

use std::{net::SocketAddr, num::NonZeroU32, sync::Arc, time::Duration};

use governor::{Quota, RateLimiter};
use idempotency::{Clock, SystemClock};
use outbox::{Deliveries, DisableRule};
use rpc::{guards::Guards, ops::Drain};
use storage::Database;
use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use webhooks::ssrf::Resolve;

use crate::{
    delivery::Deliverer,
    fair_share::FairShares,
    metrics::SenderMetrics,
    worker::{Retention, Sender},
};

/// This service in telemetry: the `service.name` and `service.version` of its spans.
pub const SERVICE: telemetry::Service = telemetry::Service {
    name: "webhook-sender",
    version: env!("CARGO_PKG_VERSION"),
};

/// The sender, bound and connected, not yet running.
pub struct Application<R = DnsResolver> {
    sender: Arc<Sender<R>>,
    listener: TcpListener,
}

impl Application {
    /// The production sender: the system clock, and names looked up as `settings.dns` says.
    pub async fn build(settings: Settings) -> Result<Self, SenderError> {
        Self::build_with_clock(settings, Arc::new(SystemClock)).await
    }

    /// A sender with its own clock (wall-clock ms, for due times and pauses), so that tests can
    /// move time; names are looked up as `settings.dns` says.
    pub async fn build_with_clock(
        settings: Settings,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, SenderError> {
        let lookup_timeout = Duration::from_millis(settings.lookup_timeout_ms());
        let resolver =
            DnsResolver::new(&settings.dns, lookup_timeout).map_err(SenderError::Resolver)?;
        Self::build_with(settings, clock, resolver).await
    }
}

impl<R: Resolve + Send + Sync + 'static> Application<R> {
    /// A sender with its own clock and resolver (for the SSRF guard), so that tests can move time
    /// and choose what names resolve to.
    pub async fn build_with(
        settings: Settings,
        clock: Arc<dyn Clock>,
        resolver: R,
    ) -> Result<Self, SenderError> {
        settings.validate()?;
        let database = Database::open(&settings.database_url, settings.sqlite, |backend| {
            vec![outbox::migrations(backend)]
        })
        .await?;
        outbox::seal_plaintext_secrets(&database, &settings.secret_keys).await?;
        let ms = Duration::from_millis;
        let deliverer = Deliverer::new(
            settings.ssrf_policy()?,
            resolver,
            settings.dns.max_lookups_per_client,
            ms(settings.connect_timeout_ms),
            ms(settings.request_timeout_ms),
            clock.clone(),
        )
        .map_err(SenderError::Client)?;
        let to_i64 = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
        let sender = Sender {
            deliveries: Deliveries::new(database, settings.secret_keys.clone()),
            deliverer,
            schedule: settings.retry_schedule(),
            clock,
            metrics: SenderMetrics::new(),
            poll_interval: ms(settings.poll_interval_ms),
            lease_ms: to_i64(settings.lease_ms()),
            disable: DisableRule {
                after_ms: to_i64(settings.disable_after_ms),
                after_failures: settings.disable_after_failures.into(),
            },
            retry_after_min: ms(settings.retry_after_min_ms),
            retry_after_max: ms(settings.retry_after_max_ms),
            in_flight: FairShares::new(settings.max_in_flight),
            client_rate: RateLimiter::keyed(Quota::per_second(
                NonZeroU32::new(settings.client_rate_per_sec).unwrap_or(NonZeroU32::MIN),
            )),
            redelivery_batch: settings.redelivery_batch,
            retention: Retention {
                retention_ms: to_i64(settings.retention_ms),
                reap_interval: ms(settings.reap_interval_ms),
                reap_batch: settings.reap_batch,
            },
            tasks: TaskTracker::new(),
        };
        let listener = rpc::bind(settings.listen).await?;
        Ok(Self {
            sender: Arc::new(sender),
            listener,
        })
    }

    /// Where `grpc.health.v1`, its reflection, `/metrics`, `/livez` and `/readyz` are served:
    /// the sender answers no requests, so its one port is an operations port.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    /// Delivers until `shutdown` is cancelled, then lets the attempts in flight finish and be
    /// recorded (each is bounded by the request timeout).
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> Result<(), SenderError> {
        let (_health, health_service) = tonic_health::server::health_reporter();
        let health_descriptors = prost::Message::decode(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .map_err(rpc::ServerError::from)?;
        let (reflection_v1, reflection_v1alpha) = rpc::reflection(&health_descriptors)?;
        let routes = tonic::service::Routes::new(health_service)
            .add_service(reflection_v1)
            .add_service(reflection_v1alpha)
            .prepare()
            .into_axum_router()
            .merge(rpc::ops::router(
                Drain::new(shutdown.clone(), Duration::ZERO),
                Guards::new(SERVICE.name),
            ));
        let serving = rpc::serve_http(self.listener, routes, shutdown.clone().cancelled_owned());
        let tasks = self.sender.tasks.clone();
        // Waited for with the deliveries, at shutdown.
        self.sender
            .tasks
            .spawn(self.sender.clone().redeliver_ranges(shutdown.clone()));
        self.sender
            .tasks
            .spawn(self.sender.clone().reap_outbox(shutdown.clone()));
        let delivering = async {
            self.sender.dispatch(shutdown).await;
            tasks.close();
            tasks.wait().await;
        };
        let (served, ()) = tokio::join!(serving, delivering);
        served?;
        Ok(())
    }
}
