//! `orders.v1.Webhooks`: the client's webhook endpoints, their secrets and their delivery logs,
//! kept in orders' database beside the outbox that the order events go to.
//!
//! Creating an endpoint and rotating a secret show a secret once, so a client that lost the
//! answer must be able to ask again and get the same secret rather than a second endpoint or a
//! second rotation: both run under the client's idempotency key, in one phase that writes and
//! stores the answer together. The stored answer holds the secret sealed, as the webhook tables
//! do, and a replay opens it.

use std::time::{Duration, UNIX_EPOCH};

use deadline::Hop;
use idempotency::{Begin, Clock, KeyStore, Progress, Stored, SystemClock};
use outbox::{
    AttemptLog, DeliveryLog, DeliveryQuery, DeliveryState, EndpointLimits, EndpointUpdate,
    LogCursor, NewEndpoint, OutboxError, RedeliveryLimits, RedeliveryRange, SecretKeys,
    Subscriptions,
};
use prost::Message;
use proto::orders::v1::{
    Attempt, CreateEndpointRequest, DeleteEndpointResponse, Delivery, Endpoint, EndpointRef,
    EndpointWithSecret, EventType, ListDeliveriesRequest, ListDeliveriesResponse,
    ListEndpointsRequest, ListEndpointsResponse, ListEventTypesRequest, ListEventTypesResponse,
    PingResponse, RedeliverRangeRequest, RedeliverRequest, RedeliverResponse, RotateSecretRequest,
    UpdateEndpointRequest, webhooks_server::Webhooks,
};
use storage::Tx;
use tonic::{Code, Request, Response, Status};
use webhooks::ssrf;
use wire::{CLIENT_ID, IDEMPOTENCY_KEY, IDEMPOTENT_REPLAYED};

use crate::{error::OrdersError, required, settings::WebhookSettings};

/// Methods named in the fingerprints of their idempotency keys.
const CREATE_ENDPOINT: &str = "/orders.v1.Webhooks/CreateEndpoint";
const ROTATE_SECRET: &str = "/orders.v1.Webhooks/RotateSecret";

/// Deliveries listed when the request names no limit, and the most it may name.
const DEFAULT_DELIVERIES: u32 = 50;
const MAX_DELIVERIES: u32 = 500;

/// The longest rotation overlap a client may ask for.
const MAX_OVERLAP_MS: u64 = 30 * 24 * 60 * 60 * 1000;

#[derive(Debug, Clone)]
pub(crate) struct WebhookService {
    keys: KeyStore,
    subscriptions: Subscriptions,
    /// What endpoint URLs may name.
    policy: ssrf::DestinationPolicy,
    rotation_overlap_ms: u64,
    default_limits: EndpointLimits,
    redelivery_limits: RedeliveryLimits,
}

impl WebhookService {
    pub(crate) fn new(keys: KeyStore, settings: &WebhookSettings) -> Result<Self, String> {
        let policy = policy(&settings.test_hosts)?;
        let default_limits = EndpointLimits {
            max_in_flight: settings.default_max_in_flight,
            rate_per_sec: settings.default_rate_per_sec,
        };
        let max = EndpointLimits::MAX;
        if !(1..=max.max_in_flight).contains(&default_limits.max_in_flight)
            || !(1..=max.rate_per_sec).contains(&default_limits.rate_per_sec)
        {
            return Err(format!(
                "webhooks.default_max_in_flight must be 1..={} and webhooks.default_rate_per_sec 1..={}",
                max.max_in_flight, max.rate_per_sec
            ));
        }
        let redelivery_limits = RedeliveryLimits {
            max_days: settings.redelivery_max_days,
            max_events: settings.redelivery_max_events,
        };
        if redelivery_limits.max_days == 0 || redelivery_limits.max_events == 0 {
            return Err("webhooks.redelivery_max_days and webhooks.redelivery_max_events must be at least 1".into());
        }
        Ok(Self {
            subscriptions: Subscriptions::new(
                keys.database().clone(),
                settings.secret_keys.clone(),
            ),
            keys,
            policy,
            rotation_overlap_ms: settings.rotation_overlap_ms,
            default_limits,
            redelivery_limits,
        })
    }

    /// Runs `write` once under the client's idempotency key, in one phase that also stores its
    /// answer; a repeat gets that answer back byte for byte (the same secret). A failed write
    /// releases the key, so that a corrected repeat is not refused as in flight. `write` owns
    /// what it uses (a clone of the subscriptions, its inputs): see [`KeyStore::atomic_phase`].
    async fn keyed(
        &self,
        request: &Request<impl Message>,
        method: &str,
        write: impl AsyncFnOnce(&mut Tx<'_>, &str) -> Result<EndpointWithSecret, OrdersError>
        + Send
        + 'static,
    ) -> Result<Response<EndpointWithSecret>, OrdersError> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let key = required(request.metadata(), IDEMPOTENCY_KEY)?;
        proto::validate::idempotency_key(key)
            .map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        // The method is part of the fingerprint: a key already used for an order (or the other
        // method) is refused as reused instead of being answered with that other answer.
        let fingerprint = idempotency::fingerprint(
            &[method.as_bytes(), b"\n", &request.get_ref().encode_to_vec()].concat(),
        );
        let lease = Hop::of(request)?.deadline().remaining();
        let mut lease = match self.keys.begin(client_id, key, &fingerprint, lease).await? {
            Begin::Replay(stored) => {
                let mut answer = EndpointWithSecret::decode(stored.body.as_slice())?;
                answer.secret = self
                    .subscriptions
                    .keys()
                    .open(endpoint_id(&answer), &answer.secret)?
                    .to_string();
                let mut response = Response::new(answer);
                response
                    .metadata_mut()
                    .insert(IDEMPOTENT_REPLAYED, "true".parse().expect("ascii"));
                return Ok(response);
            }
            Begin::Execute(lease) => lease,
        };
        let (secret_keys, client) = (self.subscriptions.keys().clone(), client_id.to_owned());
        let written = self
            .keys
            .atomic_phase(&mut lease, async move |tx| {
                let answer = write(tx, &client).await?;
                let stored = Stored {
                    code: Code::Ok as i32,
                    body: sealed(&secret_keys, &answer)?.encode_to_vec(),
                };
                Ok::<_, OrdersError>((answer, Progress::Completed(stored)))
            })
            .await;
        // A failed write or completion committed nothing, so a corrected repeat may start afresh.
        if written.is_err() {
            self.keys.release(&mut lease).await?;
        }
        written.map(Response::new)
    }

    async fn set_enabled(
        &self,
        request: Request<EndpointRef>,
        enabled: bool,
    ) -> Result<Response<Endpoint>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let endpoint = self
            .subscriptions
            .set_enabled(client_id, &request.get_ref().endpoint_id, enabled)
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(endpoint_message(endpoint)))
    }
}

#[tonic::async_trait]
impl Webhooks for WebhookService {
    async fn create_endpoint(
        &self,
        request: Request<CreateEndpointRequest>,
    ) -> Result<Response<EndpointWithSecret>, Status> {
        let message = request.get_ref();
        proto::validate::create_endpoint(message)
            .map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        let or_default = |asked: u32, default: u32| if asked == 0 { default } else { asked };
        let mut new = NewEndpoint {
            url: message.url.clone(),
            event_types: message.event_types.clone(),
            limits: EndpointLimits {
                max_in_flight: or_default(message.max_in_flight, self.default_limits.max_in_flight),
                rate_per_sec: or_default(message.rate_per_sec, self.default_limits.rate_per_sec),
            },
        };
        // Checked before the key is claimed: a refused request does not use up its key.
        new.validate(&self.policy).map_err(OrdersError::from)?;
        let subscriptions = self.subscriptions.clone();
        let created = self.keyed(&request, CREATE_ENDPOINT, async move |tx, client_id| {
            let (endpoint, secret) = subscriptions
                .create_endpoint(tx, client_id, &new, SystemClock.now_ms())
                .await?;
            Ok(EndpointWithSecret {
                endpoint: Some(endpoint_message(endpoint)),
                secret: secret.to_string(),
                previous_secrets_expire_at: String::new(),
            })
        });
        Ok(created.await?)
    }

    async fn list_endpoints(
        &self,
        request: Request<ListEndpointsRequest>,
    ) -> Result<Response<ListEndpointsResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let endpoints = self
            .subscriptions
            .endpoints(client_id)
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(ListEndpointsResponse {
            endpoints: endpoints.into_iter().map(endpoint_message).collect(),
        }))
    }

    async fn get_endpoint(
        &self,
        request: Request<EndpointRef>,
    ) -> Result<Response<Endpoint>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let endpoint = self
            .subscriptions
            .endpoint(client_id, &request.get_ref().endpoint_id)
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(endpoint_message(endpoint)))
    }

    async fn rotate_secret(
        &self,
        request: Request<RotateSecretRequest>,
    ) -> Result<Response<EndpointWithSecret>, Status> {
        let message = request.get_ref();
        if message.overlap_ms > MAX_OVERLAP_MS {
            return Err(OrdersError::InvalidRequest(format!(
                "overlap_ms: at most {MAX_OVERLAP_MS} (30 days)"
            ))
            .into());
        }
        let overlap_ms = i64::try_from(if message.overlap_ms == 0 {
            self.rotation_overlap_ms
        } else {
            message.overlap_ms
        })
        .unwrap_or(i64::MAX);
        // Read before the phase, on a reader, so that the phase on the writer is only the write:
        // the rotation changes the endpoint's secrets, not what it shows. An unknown endpoint
        // does not use up the key.
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let endpoint = self
            .subscriptions
            .endpoint(client_id, &message.endpoint_id)
            .await
            .map_err(OrdersError::from)?;
        let subscriptions = self.subscriptions.clone();
        let rotated = self.keyed(&request, ROTATE_SECRET, async move |tx, client_id| {
            let now = SystemClock.now_ms();
            let secret = subscriptions
                .rotate_secret(tx, client_id, &endpoint.endpoint_id, overlap_ms, now)
                .await?;
            Ok(EndpointWithSecret {
                endpoint: Some(endpoint_message(endpoint)),
                secret: secret.to_string(),
                previous_secrets_expire_at: rfc3339(now.saturating_add(overlap_ms)),
            })
        });
        Ok(rotated.await?)
    }

    async fn update_endpoint(
        &self,
        request: Request<UpdateEndpointRequest>,
    ) -> Result<Response<Endpoint>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let message = request.get_ref();
        proto::validate::update_endpoint(message)
            .map_err(|error| OrdersError::InvalidRequest(error.to_string()))?;
        let mut update = EndpointUpdate {
            url: message.url.clone(),
            event_types: message.event_types.as_ref().map(|list| list.names.clone()),
            max_in_flight: message.max_in_flight,
            rate_per_sec: message.rate_per_sec,
        };
        update.validate(&self.policy).map_err(OrdersError::from)?;
        let endpoint = self
            .subscriptions
            .update_endpoint(
                client_id,
                &message.endpoint_id,
                &update,
                SystemClock.now_ms(),
            )
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(endpoint_message(endpoint)))
    }

    async fn ping_endpoint(
        &self,
        request: Request<EndpointRef>,
    ) -> Result<Response<PingResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let event_id = self
            .subscriptions
            .ping(
                client_id,
                &request.get_ref().endpoint_id,
                SystemClock.now_ms(),
            )
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(PingResponse { event_id }))
    }

    async fn list_event_types(
        &self,
        _request: Request<ListEventTypesRequest>,
    ) -> Result<Response<ListEventTypesResponse>, Status> {
        let event_types = outbox::EVENT_TYPES
            .iter()
            .map(|event_type| EventType {
                name: event_type.name.into(),
                description: event_type.description.into(),
                schema_version: event_type.schema_version,
                subscribable: event_type.subscribable,
            })
            .collect();
        Ok(Response::new(ListEventTypesResponse { event_types }))
    }

    async fn disable_endpoint(
        &self,
        request: Request<EndpointRef>,
    ) -> Result<Response<Endpoint>, Status> {
        self.set_enabled(request, false).await
    }

    async fn enable_endpoint(
        &self,
        request: Request<EndpointRef>,
    ) -> Result<Response<Endpoint>, Status> {
        self.set_enabled(request, true).await
    }

    async fn delete_endpoint(
        &self,
        request: Request<EndpointRef>,
    ) -> Result<Response<DeleteEndpointResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        self.subscriptions
            .delete_endpoint(client_id, &request.get_ref().endpoint_id)
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(DeleteEndpointResponse {}))
    }

    async fn list_deliveries(
        &self,
        request: Request<ListDeliveriesRequest>,
    ) -> Result<Response<ListDeliveriesResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let message = request.get_ref();
        let limit = match message.limit {
            0 => DEFAULT_DELIVERIES,
            limit if limit > MAX_DELIVERIES => {
                return Err(OrdersError::InvalidRequest(format!(
                    "limit: at most {MAX_DELIVERIES}"
                ))
                .into());
            }
            limit => limit,
        };
        let nonempty = |text: &str| (!text.is_empty()).then(|| text.to_owned());
        let state = match message.state.as_str() {
            "" => None,
            name => Some(DeliveryState::from_name(name).ok_or_else(|| {
                OrdersError::InvalidRequest("state: one of pending, delivered, undelivered".into())
            })?),
        };
        let query = DeliveryQuery {
            limit,
            state,
            event_type: nonempty(&message.event_type),
            after: nonempty(&message.cursor)
                .map(|cursor| cursor.parse::<LogCursor>())
                .transpose()
                .map_err(OrdersError::from)?,
        };
        let page = self
            .subscriptions
            .deliveries(client_id, &message.endpoint_id, &query)
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(ListDeliveriesResponse {
            deliveries: page.deliveries.into_iter().map(delivery_message).collect(),
            next_cursor: page
                .next
                .map(|cursor| cursor.to_string())
                .unwrap_or_default(),
        }))
    }

    async fn redeliver(
        &self,
        request: Request<RedeliverRequest>,
    ) -> Result<Response<RedeliverResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let message = request.get_ref();
        self.subscriptions
            .redeliver(
                client_id,
                &message.endpoint_id,
                &message.event_id,
                SystemClock.now_ms(),
            )
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(RedeliverResponse { queued: 1 }))
    }

    async fn redeliver_range(
        &self,
        request: Request<RedeliverRangeRequest>,
    ) -> Result<Response<RedeliverResponse>, Status> {
        let client_id = required(request.metadata(), CLIENT_ID)?;
        let message = request.get_ref();
        let range = RedeliveryRange {
            from_ms: parse_rfc3339("from", &message.from)?,
            until_ms: parse_rfc3339("until", &message.until)?,
            include_delivered: message.include_delivered,
        };
        let queued = self
            .subscriptions
            .redeliver_range(
                client_id,
                &message.endpoint_id,
                range,
                self.redelivery_limits,
                SystemClock.now_ms(),
            )
            .await
            .map_err(OrdersError::from)?;
        Ok(Response::new(RedeliverResponse { queued }))
    }
}

/// `answer` as the key store keeps it: its secret sealed for its endpoint under `keys`.
fn sealed(
    keys: &SecretKeys,
    answer: &EndpointWithSecret,
) -> Result<EndpointWithSecret, OrdersError> {
    let secret = answer
        .secret
        .parse()
        .map_err(|_| OutboxError::Sealing("the answer's secret is not a secret".into()))?;
    Ok(EndpointWithSecret {
        secret: keys.seal(endpoint_id(answer), &secret)?,
        ..answer.clone()
    })
}

/// The id of the endpoint an answer shows its secret for.
fn endpoint_id(answer: &EndpointWithSecret) -> &str {
    answer
        .endpoint
        .as_ref()
        .map_or("", |endpoint| endpoint.endpoint_id.as_str())
}

/// The production policy, with the `host:port` pairs of `test_hosts` exempted.
fn policy(test_hosts: &[String]) -> Result<ssrf::DestinationPolicy, String> {
    test_hosts
        .iter()
        .try_fold(ssrf::DestinationPolicy::default(), |policy, host_port| {
            policy.allow_test_host(host_port)
        })
        .map_err(|error| format!("webhooks.test_hosts: {error}"))
}

fn endpoint_message(endpoint: outbox::Endpoint) -> Endpoint {
    Endpoint {
        endpoint_id: endpoint.endpoint_id,
        url: endpoint.url,
        event_types: endpoint.event_types,
        enabled: endpoint.enabled,
        disabled_reason: endpoint.disabled_reason.unwrap_or_default(),
        failing_since: endpoint.failing_since_ms.map(rfc3339).unwrap_or_default(),
        max_in_flight: endpoint.limits.max_in_flight,
        rate_per_sec: endpoint.limits.rate_per_sec,
        created_at: rfc3339(endpoint.created_at_ms),
        updated_at: rfc3339(endpoint.updated_at_ms),
    }
}

fn delivery_message(delivery: DeliveryLog) -> Delivery {
    Delivery {
        event_id: delivery.event_id,
        event_type: delivery.event_type,
        state: delivery.state.as_str().into(),
        next_attempt_at: delivery.next_attempt_at_ms.map(rfc3339).unwrap_or_default(),
        created_at: rfc3339(delivery.created_at_ms),
        attempts: delivery.attempts.into_iter().map(attempt_message).collect(),
    }
}

fn attempt_message(attempt: AttemptLog) -> Attempt {
    Attempt {
        attempt: u32::try_from(attempt.attempt).unwrap_or(u32::MAX),
        started_at: rfc3339(attempt.started_at_ms),
        duration_ms: u64::try_from(attempt.duration_ms).unwrap_or_default(),
        status_code: attempt
            .status_code
            .and_then(|code| u32::try_from(code).ok())
            .unwrap_or_default(),
        outcome: attempt.outcome,
        error: attempt.error.unwrap_or_default(),
    }
}

/// Milliseconds since the epoch as RFC 3339, UTC.
fn rfc3339(ms: i64) -> String {
    humantime::format_rfc3339_millis(
        UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or_default()),
    )
    .to_string()
}

fn parse_rfc3339(field: &str, text: &str) -> Result<i64, OrdersError> {
    let time = humantime::parse_rfc3339(text).map_err(|error| {
        OrdersError::InvalidRequest(format!(
            "{field}: {error} (want RFC 3339 in UTC, e.g. 2026-12-01T10:00:00Z)"
        ))
    })?;
    let since = time
        .duration_since(UNIX_EPOCH)
        .map_err(|_| OrdersError::InvalidRequest(format!("{field}: before 1970")))?;
    Ok(i64::try_from(since.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(url: &str) -> NewEndpoint {
        NewEndpoint {
            url: url.into(),
            event_types: vec![outbox::ORDER_PAID.into()],
            limits: EndpointLimits::default(),
        }
    }

    #[test]
    fn test_hosts_exempt_exactly_their_host_and_port() {
        let policy = policy(&["127.0.0.1:9000".into(), "[::1]:9001".into()]).unwrap();
        assert!(
            endpoint("http://127.0.0.1:9000/hooks")
                .validate(&policy)
                .is_ok()
        );
        assert!(
            endpoint("http://0x7f.1:9000/hooks")
                .validate(&policy)
                .is_ok(),
            "the same address written otherwise"
        );
        assert!(endpoint("http://[::1]:9001/").validate(&policy).is_ok());
        assert!(
            endpoint("http://127.0.0.1:9001/")
                .validate(&policy)
                .is_err(),
            "another port"
        );
        assert!(
            endpoint("http://127.0.0.1:9000/")
                .validate(&ssrf::DestinationPolicy::default())
                .is_err(),
            "none by default"
        );
    }

    #[test]
    fn a_test_host_without_a_port_is_refused() {
        for bad in ["127.0.0.1", "localhost:http", "exa mple.com:80"] {
            assert!(
                policy(&[bad.into()])
                    .unwrap_err()
                    .contains("webhooks.test_hosts"),
                "{bad}"
            );
        }
    }
}
