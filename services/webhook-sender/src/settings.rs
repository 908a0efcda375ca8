use std::{fmt, net::SocketAddr, time::Duration};

use outbox::SecretKeys;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use storage::SqliteSettings;
use webhooks::ssrf::DestinationPolicy;

use crate::schedule::RetrySchedule;

/// What a lease must hold beyond the attempt: waiting for the database pool to record it (its
/// acquire timeout is 5 s).
const RECORDING_MARGIN_MS: u64 = 5_000;

/// The shortest retention of events.
const RETENTION_MIN_MS: u64 = 86_400_000;

/// Every knob of the sender; see the README for the table and the environment names.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// URL of the orders database, whose outbox is delivered: `sqlite://…` or `postgres://…`.
    pub database_url: String,
    /// How SQLite is written: when a commit is on disk (`synchronous`: `normal` survives a crash
    /// of the process, `full` a power loss too, at the cost of a sync per commit) and how the one
    /// writer batches commits (`max_batch`, `batch_wait_us`). Unused on PostgreSQL.
    pub sqlite: SqliteSettings,
    /// Where `grpc.health.v1`, `GET /metrics`, `/livez` and `/readyz` are served.
    pub listen: SocketAddr,
    /// How often the outbox is asked which endpoints have deliveries due.
    pub poll_interval_ms: u64,
    /// The whole of one delivery: resolving, connecting, sending and the answer's head.
    pub request_timeout_ms: u64,
    /// Connecting to the recipient, a part of the request timeout.
    pub connect_timeout_ms: u64,
    /// How long a claimed delivery is this sender's; another sender takes it over after that.
    /// Default: the request timeout plus 10 s, so that a live sender always records in time.
    pub lease_ms: Option<u64>,
    /// The delays before each attempt of a round, the first one included (humantime strings
    /// such as "5m", or milliseconds); the delivery is undelivered when they are spent.
    pub schedule: Vec<Delay>,
    /// Each delay is multiplied by a random factor in [1 − jitter, 1 + jitter], so that
    /// deliveries failed together do not all come back together.
    pub jitter: f64,
    /// An endpoint that has failed every attempt for this long, and at least
    /// `disable_after_failures` times, is disabled and its owner told.
    pub disable_after_ms: u64,
    pub disable_after_failures: u32,
    /// A 429/503 `Retry-After` is honoured within these bounds.
    pub retry_after_min_ms: u64,
    pub retry_after_max_ms: u64,
    /// FOR TESTS AND LOCAL DEMOS ONLY: `host:port` recipients allowed over plain http and exempt
    /// from the SSRF deny list.
    pub test_hosts: Vec<String>,
    /// Address ranges (CIDR) that deliveries never dial, beside the built-in deny list: the
    /// deployment's own public ranges, for one.
    pub extra_denied_ranges: Vec<String>,
    /// Deliveries in flight at once in this sender, all endpoints together; shared fairly
    /// between clients (one alone holds at most half).
    pub max_in_flight: usize,
    /// Deliveries started per second for one client, all its endpoints together.
    pub client_rate_per_sec: u32,
    /// Deliveries a range redelivery queues per batch, each batch a short transaction of its own.
    pub redelivery_batch: u32,
    /// How long an event is kept after it was created (listed and redeliverable until then);
    /// longer while a delivery of it is still being delivered.
    pub retention_ms: u64,
    /// How often events past retention are reaped, and how many per transaction.
    pub reap_interval_ms: u64,
    pub reap_batch: u32,
    /// How recipients' names are looked up.
    pub dns: DnsSettings,
    /// The keys that open the endpoint secrets sealed at rest: orders' `webhooks.secret_keys`.
    pub secret_keys: SecretKeys,
}

/// The sender's resolver: where it asks, how long it waits, what it remembers, and how many
/// lookups one client may have in flight.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsSettings {
    /// The name servers asked (`ip:port`); empty: the system's, from `/etc/resolv.conf`.
    pub name_servers: Vec<SocketAddr>,
    /// One lookup in all, shorter than the request timeout so that a lookup that gets no answer
    /// still leaves its attempt the time to say so. Default: 2 s, at most half the request
    /// timeout.
    pub lookup_timeout_ms: Option<u64>,
    /// Answers kept at most, by name and record type.
    pub cache_entries: u64,
    /// The longest an answer is kept, whatever its TTL.
    pub max_ttl_ms: u64,
    /// How long an answer that a name does not exist, or has no address, is kept.
    pub negative_ttl_ms: u64,
    /// Lookups one client's endpoints may have in flight at once; an attempt over it fails at
    /// once, to be retried on the schedule.
    pub max_lookups_per_client: usize,
}

impl Default for DnsSettings {
    fn default() -> Self {
        Self {
            name_servers: Vec::new(),
            lookup_timeout_ms: None,
            cache_entries: 4_096,
            max_ttl_ms: 300_000,
            negative_ttl_ms: 30_000,
            max_lookups_per_client: 4,
        }
    }
}

impl Default for Settings {
    fn default() -> Self {
        const MINUTE: u64 = 60;
        const HOUR: u64 = 60 * MINUTE;
        let delays = [
            0,
            5,
            5 * MINUTE,
            30 * MINUTE,
            2 * HOUR,
            5 * HOUR,
            10 * HOUR,
            10 * HOUR,
        ];
        Self {
            database_url: "sqlite://orders.db".into(),
            sqlite: SqliteSettings::default(),
            listen: SocketAddr::from(([127, 0, 0, 1], 50055)),
            poll_interval_ms: 100,
            request_timeout_ms: 5_000,
            connect_timeout_ms: 2_000,
            lease_ms: None,
            schedule: delays
                .into_iter()
                .map(|secs| Delay(Duration::from_secs(secs)))
                .collect(),
            jitter: 0.1,
            disable_after_ms: 5 * 24 * HOUR * 1_000,
            disable_after_failures: 10,
            retry_after_min_ms: 1_000,
            retry_after_max_ms: HOUR * 1_000,
            test_hosts: Vec::new(),
            extra_denied_ranges: Vec::new(),
            max_in_flight: 256,
            client_rate_per_sec: 200,
            redelivery_batch: 500,
            retention_ms: 30 * 24 * HOUR * 1_000,
            reap_interval_ms: 60_000,
            reap_batch: 500,
            dns: DnsSettings::default(),
            secret_keys: SecretKeys::default(),
        }
    }
}

/// A setting that makes no sense, named.
#[derive(Debug, thiserror::Error)]
#[error("invalid setting {name}: {reason}")]
pub struct InvalidSetting {
    pub name: &'static str,
    pub reason: String,
}

fn invalid(name: &'static str, reason: impl Into<String>) -> InvalidSetting {
    InvalidSetting {
        name,
        reason: reason.into(),
    }
}

impl Settings {
    /// Checks every knob, alone and against the others.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        if self.poll_interval_ms == 0 {
            return Err(invalid("poll_interval_ms", "must be at least 1"));
        }
        if self.request_timeout_ms == 0 {
            return Err(invalid("request_timeout_ms", "must be at least 1"));
        }
        if !(1..=self.request_timeout_ms).contains(&self.connect_timeout_ms) {
            return Err(invalid(
                "connect_timeout_ms",
                "must be 1..=request_timeout_ms",
            ));
        }
        if self.lease_ms() < self.request_timeout_ms.saturating_add(RECORDING_MARGIN_MS) {
            return Err(invalid(
                "lease_ms",
                "must be at least request_timeout_ms + 5000 (the attempt, then waiting for the database to record it), or a live sender loses deliveries it is still sending",
            ));
        }
        if self.schedule.is_empty() {
            return Err(invalid(
                "schedule",
                "needs at least one delay (the first attempt's)",
            ));
        }
        if !(0.0..1.0).contains(&self.jitter) {
            return Err(invalid("jitter", "must be in [0, 1)"));
        }
        if self.disable_after_ms == 0 {
            return Err(invalid("disable_after_ms", "must be at least 1"));
        }
        if self.disable_after_failures == 0 {
            return Err(invalid("disable_after_failures", "must be at least 1"));
        }
        if self.retry_after_min_ms > self.retry_after_max_ms {
            return Err(invalid(
                "retry_after_min_ms",
                "must not exceed retry_after_max_ms",
            ));
        }
        for (name, value) in [
            ("max_in_flight", self.max_in_flight as u64),
            ("client_rate_per_sec", u64::from(self.client_rate_per_sec)),
            ("redelivery_batch", u64::from(self.redelivery_batch)),
            ("reap_interval_ms", self.reap_interval_ms),
            ("reap_batch", u64::from(self.reap_batch)),
        ] {
            if value == 0 {
                return Err(invalid(name, "must be at least 1"));
            }
        }
        if self.retention_ms < RETENTION_MIN_MS {
            return Err(invalid(
                "retention_ms",
                "must be at least a day: events are listed and redelivered for that long",
            ));
        }
        if !(1..self.request_timeout_ms).contains(&self.lookup_timeout_ms()) {
            return Err(invalid(
                "dns.lookup_timeout_ms",
                "must be 1..request_timeout_ms: a lookup is part of its attempt",
            ));
        }
        if self.dns.max_lookups_per_client == 0 {
            return Err(invalid("dns.max_lookups_per_client", "must be at least 1"));
        }
        if self.secret_keys.is_empty() {
            return Err(invalid("secret_keys", SecretKeys::REQUIRED));
        }
        self.ssrf_policy()?;
        Ok(())
    }

    pub fn lease_ms(&self) -> u64 {
        self.lease_ms
            .unwrap_or(self.request_timeout_ms.saturating_add(10_000))
    }

    pub fn lookup_timeout_ms(&self) -> u64 {
        self.dns
            .lookup_timeout_ms
            .unwrap_or((self.request_timeout_ms / 2).min(2_000))
    }

    pub fn retry_schedule(&self) -> RetrySchedule {
        RetrySchedule::new(
            self.schedule.iter().map(|delay| delay.0).collect(),
            self.jitter,
        )
    }

    /// The production SSRF policy, with the extra denied ranges and the test hosts exempted.
    pub fn ssrf_policy(&self) -> Result<DestinationPolicy, InvalidSetting> {
        let policy = self.extra_denied_ranges.iter().try_fold(
            DestinationPolicy::default(),
            |policy, range| {
                let net = range.parse().map_err(|error| {
                    invalid("extra_denied_ranges", format!("{range:?}: {error}"))
                })?;
                Ok(policy.deny(net))
            },
        )?;
        self.test_hosts
            .iter()
            .try_fold(policy, |policy, host_port| {
                policy.allow_test_host(host_port)
            })
            .map_err(|error| invalid("test_hosts", error.to_string()))
    }
}

/// A delay of the retry schedule: a humantime string ("5m", "2h 30m") or milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay(pub Duration);

impl Serialize for Delay {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&humantime::format_duration(self.0))
    }
}

impl<'de> Deserialize<'de> for Delay {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Millis(u64),
            Text(String),
        }
        match Written::deserialize(deserializer)? {
            Written::Millis(ms) => Ok(Self(Duration::from_millis(ms))),
            Written::Text(text) => humantime::parse_duration(&text)
                .map(Self)
                .map_err(serde::de::Error::custom),
        }
    }
}

impl fmt::Display for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        humantime::format_duration(self.0).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(overrides: &[&str]) -> Result<Settings, String> {
        // A key, as the sender requires one, unless the case is about the keys.
        let key = format!("secret_keys={:?}", SecretKeys::generate("k1").to_written());
        let keyed = overrides.iter().any(|set| set.starts_with("secret_keys="));
        let overrides = if keyed {
            overrides.to_vec()
        } else {
            [&[key.as_str()][..], overrides].concat()
        };
        let args = settings::SettingsArgs {
            config: None,
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
        };
        let settings: Settings =
            settings::load("WEBHOOK_SENDER_UNIT_TEST", &args).map_err(|error| error.to_string())?;
        settings.validate().map_err(|error| error.to_string())?;
        Ok(settings)
    }

    #[test]
    fn the_defaults_are_the_svix_like_schedule_and_valid() {
        let settings = load(&[]).expect("defaults");
        let delays: Vec<String> = settings.schedule.iter().map(Delay::to_string).collect();
        assert_eq!(delays, ["0s", "5s", "5m", "30m", "2h", "5h", "10h", "10h"]);
        assert_eq!(settings.lease_ms(), 15_000);
    }

    #[test]
    fn delays_are_read_as_humantime_or_milliseconds() {
        let settings = load(&["schedule=[\"0s\", 1500, \"1m 30s\"]"]).expect("schedule");
        assert_eq!(
            settings.schedule,
            [
                Delay(Duration::ZERO),
                Delay(Duration::from_millis(1_500)),
                Delay(Duration::from_secs(90))
            ]
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_setting_named() {
        for (overrides, named) in [
            (&["lease_ms=5000"][..], "lease_ms"),
            (&["schedule=[]"], "schedule"),
            (&["jitter=1.5"], "jitter"),
            (&["connect_timeout_ms=9000"], "connect_timeout_ms"),
            (
                &["retry_after_min_ms=10", "retry_after_max_ms=5"],
                "retry_after_min_ms",
            ),
            (&["test_hosts=[\"localhost\"]"], "test_hosts"),
            (
                &["extra_denied_ranges=[\"10.0.0.0/33\"]"],
                "extra_denied_ranges",
            ),
            (&["dns.lookup_timeout_ms=5000"], "dns.lookup_timeout_ms"),
            (&["max_in_flight=0"], "max_in_flight"),
            (&["client_rate_per_sec=0"], "client_rate_per_sec"),
            (&["retention_ms=1000"], "retention_ms"),
            (
                &["dns.max_lookups_per_client=0"],
                "dns.max_lookups_per_client",
            ),
        ] {
            let error = load(overrides).expect_err("refused");
            assert!(error.contains(named), "{overrides:?}: {error}");
        }
        assert!(load(&["schedule=[\"5 parsecs\"]"]).is_err());
        assert!(
            load(&["no_such_knob=1"]).is_err(),
            "unknown keys are errors"
        );
        let none = load(&["secret_keys=[]"]).expect_err("no key");
        assert!(
            none.contains("invalid setting secret_keys: at least one key is required"),
            "{none}"
        );
        let short = load(&["secret_keys=[\"k1:c2hvcnQ=\"]"]).expect_err("a short key");
        assert!(short.contains("32 bytes"), "{short}");
    }

    #[test]
    fn test_hosts_exempt_their_port_only() {
        let settings =
            load(&["test_hosts=[\"127.0.0.1:8080\", \"[::1]:9000\"]"]).expect("test hosts");
        let policy = settings.ssrf_policy().expect("policy");
        assert!(webhooks::ssrf::Target::parse("http://127.0.0.1:8080/hook", &policy).is_ok());
        assert!(webhooks::ssrf::Target::parse("http://[::1]:9000/hook", &policy).is_ok());
        assert!(webhooks::ssrf::Target::parse("http://127.0.0.1:8081/hook", &policy).is_err());
    }

    #[test]
    fn extra_denied_ranges_are_refused_beside_the_deny_list() {
        let settings =
            load(&["extra_denied_ranges=[\"93.184.0.0/16\", \"2606:4700::/32\"]"]).expect("ranges");
        let policy = settings.ssrf_policy().expect("policy");
        assert!(webhooks::ssrf::Target::parse("https://93.184.215.14/hook", &policy).is_err());
        assert!(webhooks::ssrf::Target::parse("https://[2606:4700::1111]/hook", &policy).is_err());
        assert!(webhooks::ssrf::Target::parse("https://1.1.1.1/hook", &policy).is_ok());
    }
}
