//! One attempt of one delivery: vet the URL, sign, POST, and say what the answer means.
//!
//! Only 2xx is success. Redirects are not followed (a public URL could point the sender at a
//! private one), 410 means the recipient is gone for good, and a 429 or 503 with `Retry-After`
//! says when to come back. Everything else (other statuses, timeouts, refused connections, a
//! URL the SSRF guard refuses) is a failure that the retry schedule takes over.
//!
//! The error of an attempt is shown to the endpoint's owner in the delivery log, so it says no
//! more than the owner may know: an SSRF refusal is only "destination not allowed" (which
//! address, which range, or whether the name exists at all, would map our network for them; the
//! details go to the sender's log), no error repeats the URL (its path may hold a secret), and a
//! redirect's `Location` is cut to [`MAX_LOCATION_BYTES`].

use std::{
    sync::Arc,
    time::{Duration, UNIX_EPOCH},
};

use idempotency::Clock;
use outbox::{Attempt, Claim, truncated};
use reqwest::{StatusCode, header};
use resilience::shares::Shares;
use tokio::time::Instant;
use webhooks::{
    signature::Signer,
    ssrf::{self, DestinationPolicy, Resolve},
};

use crate::vetted_dns::VettedDns;

/// What an attempt's error tells of an SSRF refusal.
const DESTINATION_NOT_ALLOWED: &str = "destination not allowed";

/// The most of a redirect's `Location` an attempt's error repeats, in bytes.
const MAX_LOCATION_BYTES: usize = 256;

/// The `user-agent` of every delivery.
pub const USER_AGENT: &str = concat!("webhook-sender/", env!("CARGO_PKG_VERSION"));

/// What an answer (or its absence) means for the delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    Delivered,
    /// 410: the recipient does not want deliveries any more.
    Gone,
    /// 429 or 503 with `Retry-After`: try again after this long (unclamped).
    RetryAfter(Duration),
    /// Anything else; the schedule says when to try again.
    Failed,
}

/// An attempt as recorded, and what it means.
#[derive(Debug, Clone)]
pub(crate) struct Report {
    pub attempt: Attempt,
    pub verdict: Verdict,
}

/// Makes delivery attempts through one shared HTTP client.
#[derive(Debug)]
pub(crate) struct Deliverer<R> {
    client: reqwest::Client,
    dns: VettedDns,
    policy: DestinationPolicy,
    resolver: R,
    /// Lookups in flight per client.
    lookups: Shares<String>,
    request_timeout: Duration,
    clock: Arc<dyn Clock>,
}

impl<R: Resolve> Deliverer<R> {
    /// A deliverer whose client connects within `connect_timeout`, gives each attempt
    /// `request_timeout` in all, and dials only what `policy` and `resolver` vetted; each client
    /// has at most `lookups_per_client` lookups in flight.
    pub(crate) fn new(
        policy: DestinationPolicy,
        resolver: R,
        lookups_per_client: usize,
        connect_timeout: Duration,
        request_timeout: Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Self, reqwest::Error> {
        let dns = VettedDns::default();
        let client = reqwest::Client::builder()
            .user_agent(USER_AGENT)
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would do its own resolution, past the guard.
            .no_proxy()
            .dns_resolver(Arc::new(dns.clone()))
            .connect_timeout(connect_timeout)
            .build()?;
        Ok(Self {
            client,
            dns,
            policy,
            resolver,
            lookups: Shares::new(lookups_per_client),
            request_timeout,
            clock,
        })
    }

    /// Attempts `claim` once at its endpoint's URL, an endpoint of `client_id`.
    pub(crate) async fn deliver(&self, client_id: &str, claim: &Claim) -> Report {
        let url = claim.url.as_str();
        let started_at_ms = self.clock.now_ms();
        let started = Instant::now();
        let deadline = started + self.request_timeout;
        // The look-up is part of the attempt's time, so the timeout covers it too.
        let (status_code, verdict, error) = match tokio::time::timeout_at(
            deadline,
            self.send(url, client_id, claim, started_at_ms),
        )
        .await
        {
            Ok(Ok(response)) => {
                let now = UNIX_EPOCH
                    + Duration::from_millis(u64::try_from(self.clock.now_ms()).unwrap_or(0));
                let (verdict, error) = classify(response.status(), response.headers(), now);
                let status = response.status().as_u16();
                // The answer counts from its status; its body only decides whether the
                // connection can carry the next delivery.
                let _ = tokio::time::timeout_at(deadline, drain(response)).await;
                (Some(status), verdict, error)
            }
            Ok(Err(error)) => (None, Verdict::Failed, Some(error)),
            Err(_) => (
                None,
                Verdict::Failed,
                Some(format!(
                    "no answer within {} ms",
                    self.request_timeout.as_millis()
                )),
            ),
        };
        let duration_ms = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        Report {
            attempt: Attempt {
                started_at_ms,
                duration_ms,
                status_code,
                error,
            },
            verdict,
        }
    }

    /// Vets the URL, then sends the signed delivery to a vetted address.
    async fn send(
        &self,
        url: &str,
        client_id: &str,
        claim: &Claim,
        now_ms: i64,
    ) -> Result<reqwest::Response, String> {
        let refused = |error: ssrf::SsrfError| {
            tracing::warn!(%error, "refused by the SSRF guard");
            DESTINATION_NOT_ALLOWED.to_owned()
        };
        let target = ssrf::Target::parse(url, &self.policy).map_err(refused)?;
        let target = {
            // Held while the name is looked up: a client whose name servers never answer holds
            // its own places, and its other attempts fail here at once instead of waiting.
            let _lookup = if target.needs_lookup() {
                let share = self.lookups.take(&client_id.to_owned());
                Some(share.ok_or_else(|| {
                    format!(
                        "{} name lookups of this client's endpoints are already in flight",
                        self.lookups.limit()
                    )
                })?)
            } else {
                None
            };
            target.resolve(&self.resolver).await.map_err(refused)?
        };
        self.dns.pin(target.host(), target.addrs());
        let (first, others) = claim
            .secrets
            .split_first()
            .ok_or("the endpoint has no active secret")?;
        let signer = others
            .iter()
            .cloned()
            .fold(Signer::new(first.clone()), Signer::with_secret);
        let timestamp_secs = u64::try_from(now_ms / 1_000).unwrap_or(0);
        let mut request = self
            .client
            .post(target.url().clone())
            .header(header::CONTENT_TYPE, "application/json");
        for (name, value) in
            signer.headers(&claim.event_id, timestamp_secs, claim.payload.as_bytes())
        {
            request = request.header(name, value);
        }
        request
            .body(claim.payload.clone())
            .send()
            .await
            .map_err(|error| describe(&error.without_url()))
    }
}

/// The most of an answer's body read so that its connection can be reused; a longer one closes it.
const DRAIN_LIMIT: usize = 64 * 1024;

async fn drain(mut response: reqwest::Response) {
    let mut left = DRAIN_LIMIT;
    while left > 0 {
        match response.chunk().await {
            Ok(Some(chunk)) => left = left.saturating_sub(chunk.len()),
            Ok(None) | Err(_) => return,
        }
    }
}

/// What the answer's status (and headers) mean, and the error to record when it is no success.
fn classify(
    status: StatusCode,
    headers: &header::HeaderMap,
    now: std::time::SystemTime,
) -> (Verdict, Option<String>) {
    if status.is_success() {
        return (Verdict::Delivered, None);
    }
    if status.is_redirection() {
        let location = headers
            .get(header::LOCATION)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("(no Location)");
        return (
            Verdict::Failed,
            Some(format!(
                "redirect to {} not followed",
                truncated(location, MAX_LOCATION_BYTES)
            )),
        );
    }
    let error = Some(format!("answered {status}"));
    match status {
        StatusCode::GONE => (Verdict::Gone, error),
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => {
            match crate::retry_after::requested_wait(headers, now) {
                Some(wait) => (Verdict::RetryAfter(wait), error),
                None => (Verdict::Failed, error),
            }
        }
        _ => (Verdict::Failed, error),
    }
}

/// A transport error (without its URL) with its causes, which reqwest keeps out of its own
/// message.
fn describe(error: &reqwest::Error) -> String {
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(name: header::HeaderName, value: &str) -> header::HeaderMap {
        let mut headers = header::HeaderMap::new();
        headers.insert(name, value.parse().expect("header value"));
        headers
    }

    #[test]
    fn only_2xx_delivers() {
        let now = UNIX_EPOCH;
        let none = header::HeaderMap::new();
        assert_eq!(
            classify(StatusCode::NO_CONTENT, &none, now),
            (Verdict::Delivered, None)
        );
        assert_eq!(classify(StatusCode::GONE, &none, now).0, Verdict::Gone);
        assert_eq!(
            classify(
                StatusCode::TOO_MANY_REQUESTS,
                &with(header::RETRY_AFTER, "2"),
                now
            )
            .0,
            Verdict::RetryAfter(Duration::from_secs(2))
        );
        assert_eq!(
            classify(StatusCode::SERVICE_UNAVAILABLE, &none, now).0,
            Verdict::Failed,
            "no Retry-After: the schedule decides"
        );
        assert_eq!(
            classify(
                StatusCode::INTERNAL_SERVER_ERROR,
                &with(header::RETRY_AFTER, "2"),
                now
            )
            .0,
            Verdict::Failed
        );
        let (verdict, error) = classify(
            StatusCode::FOUND,
            &with(header::LOCATION, "http://10.0.0.1/"),
            now,
        );
        assert_eq!(
            (verdict, error.as_deref()),
            (
                Verdict::Failed,
                Some("redirect to http://10.0.0.1/ not followed")
            )
        );
    }

    #[test]
    fn a_long_location_is_cut() {
        let location = format!("https://example.com/{}", "a".repeat(400_000));
        let (_, error) = classify(
            StatusCode::FOUND,
            &with(header::LOCATION, &location),
            UNIX_EPOCH,
        );
        let error = error.expect("a failure");
        assert!(
            error.len() <= MAX_LOCATION_BYTES + "redirect to  not followed".len(),
            "{} bytes",
            error.len()
        );
        assert!(
            error.starts_with("redirect to https://example.com/aaa")
                && error.ends_with("… not followed"),
            "{error}"
        );
    }
}
