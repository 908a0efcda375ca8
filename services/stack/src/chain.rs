//! Starts the four services and the webhook sender in this process, wired to each other's real
//! addresses. [`HOPS`] lists them with what the stack does alike for each (its listeners, its
//! certificate, its name in telemetry, stopping it); [`Chain::start`] builds them, each after the
//! ones it calls, and points every caller at what its callee bound.

use std::{
    collections::BTreeMap,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use bank_mock::BankState;
use deadline::{HopStats, HopStatsSnapshot};
use outbox::SecretKeys;
use resilience::{
    breaker::{Breaker, BreakerStats},
    bulkhead::{Bulkhead, BulkheadStats},
    retry::{RetryPolicy, RetryStatsSnapshot},
};
use rpc::{
    ServerError,
    dev_certs::{DevCerts, OPERATOR},
    tls::TlsSettings,
};
use tempfile::TempDir;

use crate::naive::NaiveSettings;
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// Settings of the whole chain: one section per service, each exactly the service's own settings.
/// The endpoints each service calls are filled in from the addresses actually bound, and the
/// webhook sender's database, and how durably it commits, are orders' (it delivers orders' outbox).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ChainSettings {
    /// The naive chain instead of the design, to be measured against: see [`crate::naive`].
    pub naive: NaiveSettings,
    pub gateway: gateway::Settings,
    pub orders: orders::Settings,
    pub payment: payment::Settings,
    pub bank: bank_mock::Settings,
    pub webhook_sender: webhook_sender::Settings,
    /// The bank payment charges at, when not the chain's own (which still quotes the gateway's
    /// exchange rates): a bank that outlives the chain, as the crash test needs to count the
    /// charges made before and after a kill.
    pub external_bank: Option<String>,
    /// Every hop in plain-text gRPC, with no certificates and so no checks of who calls: for
    /// experiments only (`up` warns). Otherwise, when no service names certificate files of its
    /// own, a development CA is made at start (see [`Chain::dev_certs`]).
    pub plaintext: bool,
    /// Where the chain keeps its data ([`ChainSettings::with_data_dir`]): the development key
    /// that seals endpoint secrets is kept there too.
    #[serde(skip)]
    pub data_dir: Option<PathBuf>,
}

/// The file of a data directory that keeps the development key sealing endpoint secrets, when
/// the settings name none.
pub const SECRET_KEYS_FILE: &str = "webhook-secret-keys";

/// Where the example receiver listens by default (`cargo run -p webhook-receiver`): the local
/// stack lets webhooks go there over plain http, which production settings refuse.
pub const DEMO_RECEIVER: &str = "127.0.0.1:9000";

impl Default for ChainSettings {
    fn default() -> Self {
        let mut settings = Self {
            naive: NaiveSettings::default(),
            gateway: gateway::Settings::default(),
            orders: orders::Settings::default(),
            payment: payment::Settings::default(),
            bank: bank_mock::Settings::default(),
            webhook_sender: webhook_sender::Settings::default(),
            external_bank: None,
            plaintext: false,
            data_dir: None,
        };
        settings.orders.webhooks.test_hosts = vec![DEMO_RECEIVER.to_owned()];
        settings.webhook_sender.test_hosts = vec![DEMO_RECEIVER.to_owned()];
        settings
    }
}

impl ChainSettings {
    /// Every listener on 127.0.0.1 port 0, so several chains (tests, scenarios) never collide.
    pub fn ephemeral(mut self) -> Self {
        for listener in listeners() {
            *(listener.setting)(&mut self) = SocketAddr::from(([127, 0, 0, 1], 0));
        }
        self
    }

    /// Keeps the SQLite databases of orders and payment in `dir` (PostgreSQL URLs stay as set),
    /// and the development key that seals endpoint secrets when the settings name none.
    pub fn with_data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_owned());
        for (url, file) in [(&mut self.orders.database_url, "orders.db"), (&mut self.payment.database_url, "payment.db")] {
            if url.starts_with("sqlite:") {
                *url = format!("sqlite://{}", dir.join(file).display());
            }
        }
        self
    }
}

/// One service of the chain, as the stack runs it.
pub struct Hop {
    /// Its name (the hop's, in ledgers, certificates and [`Chain::stop_service`]) and version,
    /// exported under its own name when the process's telemetry hosts it ([`telemetry::init_hosting`]).
    pub service: telemetry::Service,
    /// Where it listens.
    pub listeners: &'static [Listener],
    /// Its mutual-TLS settings; `None` for a service that serves no gRPC to the others.
    tls: Option<fn(&mut ChainSettings) -> &mut TlsSettings>,
}

/// One port of a service.
pub struct Listener {
    /// Its settings key, as `--set` and a settings file name it.
    pub key: &'static str,
    /// Its line in `stack up`'s list of addresses: a label, then `shown` with the bound address at
    /// `{addr}` (and the bank's admin token at `{admin_token}`).
    pub label: &'static str,
    pub shown: &'static str,
    setting: fn(&mut ChainSettings) -> &mut SocketAddr,
    bound: fn(&Addresses) -> SocketAddr,
}

impl Listener {
    /// Where this listener is bound in `chain`.
    pub fn address(&self, chain: &Chain) -> SocketAddr {
        (self.bound)(&chain.addresses)
    }
}

/// The chain's services in the order a request goes through them, the webhook sender last.
/// A service added here gets its ports, its certificate and its telemetry name like the others;
/// [`Chain::start`] builds it and wires it to its neighbours.
pub const HOPS: [Hop; 5] = [
    Hop {
        service: gateway::SERVICE,
        tls: Some(|s| &mut s.gateway.tls),
        listeners: &[
            Listener {
                key: "gateway.http_listen",
                label: "gateway HTTP",
                shown: "http://{addr}",
                setting: |s| &mut s.gateway.http_listen,
                bound: |a| a.gateway_http,
            },
            Listener {
                key: "gateway.grpc_listen",
                label: "gateway gRPC",
                shown: "{addr}",
                setting: |s| &mut s.gateway.grpc_listen,
                bound: |a| a.gateway_grpc,
            },
            Listener {
                key: "gateway.metrics_listen",
                label: "metrics",
                shown: "http://{addr}/metrics  (every hop's series)",
                setting: |s| &mut s.gateway.metrics_listen,
                bound: |a| a.gateway_metrics,
            },
        ],
    },
    Hop {
        service: orders::SERVICE,
        tls: Some(|s| &mut s.orders.tls),
        listeners: &[Listener {
            key: "orders.listen",
            label: "orders gRPC",
            shown: "{addr}",
            setting: |s| &mut s.orders.listen,
            bound: |a| a.orders,
        }],
    },
    Hop {
        service: payment::SERVICE,
        tls: Some(|s| &mut s.payment.tls),
        listeners: &[Listener {
            key: "payment.listen",
            label: "payment gRPC",
            shown: "{addr}",
            setting: |s| &mut s.payment.listen,
            bound: |a| a.payment,
        }],
    },
    Hop {
        service: bank_mock::SERVICE,
        tls: Some(|s| &mut s.bank.tls),
        listeners: &[
            Listener { key: "bank.listen", label: "bank-mock gRPC", shown: "{addr}", setting: |s| &mut s.bank.listen, bound: |a| a.bank },
            Listener {
                key: "bank.admin_listen",
                label: "bank-mock admin",
                shown: "http://{addr}  (X-Admin-Token: {admin_token})",
                setting: |s| &mut s.bank.admin_listen,
                bound: |a| a.bank_admin,
            },
        ],
    },
    Hop {
        service: webhook_sender::SERVICE,
        tls: None,
        listeners: &[Listener {
            key: "webhook_sender.listen",
            label: "webhook sender",
            shown: "http://{addr}/metrics  (delivers orders' outbox)",
            setting: |s| &mut s.webhook_sender.listen,
            bound: |a| a.webhook_sender,
        }],
    },
];

/// Every listener of the chain, service by service.
pub fn listeners() -> impl Iterator<Item = &'static Listener> {
    HOPS.into_iter().flat_map(|hop| hop.listeners)
}

/// The webhook sender's name among the services, for [`Chain::stop_service`].
pub const WEBHOOK_SENDER: &str = webhook_sender::SERVICE.name;

/// The services a chain runs, each exported under its own name when the process's telemetry
/// hosts them ([`telemetry::init_hosting`]).
pub const SERVICES: [telemetry::Service; HOPS.len()] = {
    let mut services = [crate::SERVICE; HOPS.len()];
    let mut i = 0;
    while i < HOPS.len() {
        services[i] = HOPS[i].service;
        i += 1;
    }
    services
};

/// Where each part of a running chain listens.
#[derive(Debug, Clone, Serialize)]
pub struct Addresses {
    pub gateway_http: SocketAddr,
    pub gateway_grpc: SocketAddr,
    pub gateway_metrics: SocketAddr,
    pub orders: SocketAddr,
    pub payment: SocketAddr,
    pub bank: SocketAddr,
    pub bank_admin: SocketAddr,
    /// The webhook sender's health and metrics.
    pub webhook_sender: SocketAddr,
}

/// Deadline counters of every hop: as they stand (`Counters` = [`HopStatsSnapshot`]), or the
/// live counters a chain reads them from.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChainHopStats<Counters = HopStatsSnapshot> {
    pub gateway_http: Counters,
    pub gateway_grpc: Counters,
    pub orders: Counters,
    pub payment: Counters,
    pub bank: Counters,
}

/// The breakers and the bank's bulkhead, as they stand.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct ChainGuardStats {
    pub gateway_orders: BreakerStats,
    pub orders_payment: BreakerStats,
    pub payment_bank: BreakerStats,
    pub bank_bulkhead: BulkheadStats,
}

struct Guards {
    gateway_orders: Arc<Breaker>,
    orders_payment: Arc<Breaker>,
    payment_bank: Arc<Breaker>,
    bank_bulkhead: Arc<Bulkhead>,
}

/// A running chain. Dropping it without [`Chain::stop`] leaves the servers to the runtime's end.
pub struct Chain {
    pub addresses: Addresses,
    /// Where orders and payment keep their data.
    pub database_urls: (String, String),
    pub admin_token: String,
    bank: Arc<BankState>,
    hops: ChainHopStats<Arc<HopStats>>,
    guards: Guards,
    gateway_retry: RetryPolicy,
    client_limits: Arc<gateway::ClientLimits>,
    tokens: BTreeMap<&'static str, CancellationToken>,
    shutdown: CancellationToken,
    servers: JoinSet<Result<(), ServerError>>,
    dev_certs: Option<(DevCerts, TempDir)>,
    naive: bool,
}

impl Chain {
    /// Binds bank-mock, payment, orders and gateway in that order, pointing each at the one below.
    pub async fn start(mut settings: ChainSettings) -> Result<Self, ServerError> {
        let outbound = settings.naive.outbound();
        let naive = settings.naive.enabled;
        if settings.naive.enabled {
            // The naive clients retry at every hop, the gateway's included.
            settings.gateway.retry.max_attempts = 1;
        }
        let dev_certs = secure(&mut settings)?;
        share_secret_keys(&mut settings).map_err(|error| ServerError::Settings(format!("{SECRET_KEYS_FILE}: {error}")))?;
        let shutdown = CancellationToken::new();
        let mut servers = JoinSet::new();

        let database_urls = (settings.orders.database_url.clone(), settings.payment.database_url.clone());
        // The completer's window is checked against how long payment really keeps its keys.
        settings.orders.completer.payment_key_ttl_ms = settings.payment.idempotency.ttl_ms;
        // The sender delivers orders' outbox, from orders' database.
        settings.webhook_sender.database_url = database_urls.0.clone();
        settings.webhook_sender.sqlite = settings.orders.sqlite;

        // Each service is built after the ones it calls, so that its settings name the addresses
        // they really bound.
        let bank = bank_mock::Application::build(settings.bank).await?;

        settings.payment.bank.endpoint = settings.external_bank.clone().unwrap_or_else(|| endpoint(bank.grpc_addr()));
        let payment = payment::Application::build_with(settings.payment, outbound.clone()).await?;

        settings.orders.payment.endpoint = endpoint(payment.grpc_addr());
        let orders = orders::Application::build_with(settings.orders, outbound.clone()).await?;

        settings.gateway.orders.endpoint = endpoint(orders.grpc_addr());
        settings.gateway.recommendations.endpoint = endpoint(orders.grpc_addr());
        settings.gateway.payment.endpoint = endpoint(payment.grpc_addr());
        settings.gateway.bank.endpoint = endpoint(bank.grpc_addr());
        let gateway = gateway::Application::build_with(settings.gateway, outbound).await?;

        let sender = webhook_sender::Application::build(settings.webhook_sender)
            .await
            .map_err(|error| ServerError::Settings(format!("webhook-sender: {error}")))?;

        let addresses = Addresses {
            gateway_http: gateway.http_addr(),
            gateway_grpc: gateway.grpc_addr(),
            gateway_metrics: gateway.metrics_addr(),
            orders: orders.grpc_addr(),
            payment: payment.grpc_addr(),
            bank: bank.grpc_addr(),
            bank_admin: bank.admin_addr(),
            webhook_sender: sender.local_addr(),
        };
        let hops = ChainHopStats {
            gateway_http: gateway.http_stats(),
            gateway_grpc: gateway.grpc_stats(),
            orders: orders.hop_stats(),
            payment: payment.hop_stats(),
            bank: bank.hop_stats(),
        };
        let admin_token = bank.admin_token().to_owned();
        let gateway_retry = gateway.retry_handle();
        let client_limits = gateway.client_limits();
        let (payment_bank, bank_bulkhead) = payment.bank_guards();
        let guards = Guards { gateway_orders: gateway.orders_breaker(), orders_payment: orders.payment_breaker(), payment_bank, bank_bulkhead };
        let bank_state = bank.state();

        // Each service stops with the chain, or alone (to see the others cope).
        let tokens: BTreeMap<&'static str, CancellationToken> = HOPS.iter().map(|hop| (hop.service.name, shutdown.child_token())).collect();
        servers.spawn(bank.run_until_stopped(tokens[bank_mock::HOP].clone()));
        servers.spawn(payment.run_until_stopped(tokens[payment::HOP].clone()));
        servers.spawn(orders.run_until_stopped(tokens[orders::HOP].clone()));
        servers.spawn(gateway.run_until_stopped(tokens[gateway::HOP].clone()));
        let sending = sender.run_until_stopped(tokens[WEBHOOK_SENDER].clone());
        servers.spawn(async move {
            sending.await.map_err(|error| match error {
                webhook_sender::SenderError::Server(error) => error,
                other => ServerError::Settings(format!("webhook-sender: {other}")),
            })
        });
        Ok(Self {
            addresses,
            database_urls,
            admin_token,
            bank: bank_state,
            hops,
            guards,
            gateway_retry,
            client_limits,
            tokens,
            shutdown,
            servers,
            dev_certs,
            naive,
        })
    }

    /// The development CA made at start, with a certificate for each service and one for the
    /// operator ([`OPERATOR`]); `None` in plain text or when the settings name files of their own.
    pub fn dev_certs(&self) -> Option<&DevCerts> {
        self.dev_certs.as_ref().map(|(certs, _)| certs)
    }

    /// Whether this is the naive chain ([`ChainSettings::naive`]).
    pub fn naive(&self) -> bool {
        self.naive
    }

    /// The bank's faults and counters, for in-process control.
    pub fn bank(&self) -> &BankState {
        &self.bank
    }

    /// The bank's state, shared, for tasks that change faults while a scenario runs.
    pub fn bank_state(&self) -> Arc<BankState> {
        self.bank.clone()
    }

    /// The breakers and the bank's bulkhead.
    pub fn guard_stats(&self) -> ChainGuardStats {
        ChainGuardStats {
            gateway_orders: self.guards.gateway_orders.stats(),
            orders_payment: self.guards.orders_payment.stats(),
            payment_bank: self.guards.payment_bank.stats(),
            bank_bulkhead: self.guards.bank_bulkhead.stats(),
        }
    }

    /// Requests the gateway refused for being over their client's quota.
    pub fn rate_limited(&self) -> u64 {
        self.client_limits.rejected()
    }

    /// Counters of the gateway's retry policy.
    pub fn retry_stats(&self) -> RetryStatsSnapshot {
        self.gateway_retry.stats()
    }

    pub fn hop_stats(&self) -> ChainHopStats {
        ChainHopStats {
            gateway_http: self.hops.gateway_http.snapshot(),
            gateway_grpc: self.hops.gateway_grpc.snapshot(),
            orders: self.hops.orders.snapshot(),
            payment: self.hops.payment.snapshot(),
            bank: self.hops.bank.snapshot(),
        }
    }

    /// Stops one service (by its hop name, e.g. `"orders"`, or [`WEBHOOK_SENDER`]), leaving the
    /// others running.
    /// Returns whether a service has that name.
    pub fn stop_service(&self, hop: &str) -> bool {
        self.tokens.get(hop).inspect(|token| token.cancel()).is_some()
    }

    /// A token that stops the chain when cancelled (e.g. on Ctrl-C).
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }

    /// Waits until a server stops: after the shutdown token is cancelled, or on a server's failure.
    pub async fn wait(&mut self) -> Result<(), ServerError> {
        while let Some(result) = self.servers.join_next().await {
            if let Ok(Err(error)) = result {
                self.shutdown.cancel();
                return Err(error);
            }
        }
        Ok(())
    }

    /// Stops every server gracefully.
    pub async fn stop(mut self) -> Result<(), ServerError> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// The endpoint a client is given to call a service at `address`.
fn endpoint(address: SocketAddr) -> String {
    format!("http://{address}")
}

/// Gives orders and the sender the same keys to seal endpoint secrets with: the sender gets
/// orders' unless it names its own, and when orders names none, both get the development key
/// kept in the data directory (made there on first use, so that a restart on the same data
/// still opens the secrets it sealed), or a fresh one for a chain without a data directory.
fn share_secret_keys(settings: &mut ChainSettings) -> io::Result<()> {
    if settings.orders.webhooks.secret_keys.is_empty() {
        settings.orders.webhooks.secret_keys = match &settings.data_dir {
            Some(dir) => kept_dev_key(&dir.join(SECRET_KEYS_FILE))?,
            None => SecretKeys::generate("dev"),
        };
    }
    if settings.webhook_sender.secret_keys.is_empty() {
        settings.webhook_sender.secret_keys = settings.orders.webhooks.secret_keys.clone();
    }
    Ok(())
}

/// The key kept in `path` (one `<id>:<base64>` per line), or a new one written there, readable
/// by its owner only.
fn kept_dev_key(path: &Path) -> io::Result<SecretKeys> {
    match std::fs::read_to_string(path) {
        Ok(text) => SecretKeys::parse(&text.lines().filter(|line| !line.trim().is_empty()).collect::<Vec<_>>())
            .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            use std::{io::Write, os::unix::fs::OpenOptionsExt};
            let keys = SecretKeys::generate("dev");
            let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
            writeln!(file, "{}", keys.to_written().join("\n"))?;
            Ok(keys)
        }
        Err(error) => Err(error),
    }
}

/// Makes every service plain text (`plaintext`), or gives each a certificate of a fresh
/// development CA when none names files of its own.
fn secure(settings: &mut ChainSettings) -> Result<Option<(DevCerts, TempDir)>, ServerError> {
    let served: Vec<_> = HOPS.iter().filter_map(|hop| Some((hop.service.name, hop.tls?))).collect();
    if settings.plaintext {
        for (_, tls) in &served {
            *tls(settings) = TlsSettings { plaintext: true, ..TlsSettings::default() };
        }
        return Ok(None);
    }
    if served.iter().any(|(_, tls)| *tls(settings) != TlsSettings::default()) {
        return Ok(None);
    }
    let names: Vec<&str> = served.iter().map(|(name, _)| *name).chain([OPERATOR]).collect();
    let dir = tempfile::Builder::new().prefix("chain-certs-").tempdir().map_err(|error| ServerError::Settings(format!("certificates: {error}")))?;
    let certs = DevCerts::generate(dir.path(), &names).map_err(|error| ServerError::Settings(format!("certificates: {error}")))?;
    for (name, tls) in served {
        *tls(settings) = certs.settings(name);
    }
    Ok(Some((certs, dir)))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    /// Each listener's key names the setting it changes, as `--set` would.
    #[test]
    fn every_listener_key_names_its_setting() {
        for (port, listener) in (1..).zip(listeners()) {
            let mut document = serde_json::to_value(ChainSettings::default()).unwrap();
            let (section, field) = listener.key.split_once('.').unwrap();
            document[section][field] = format!("127.0.0.1:{port}").into();
            let mut settings: ChainSettings = serde_json::from_value(document).unwrap();
            assert_eq!((listener.setting)(&mut settings).port(), port, "{}", listener.key);
        }
        let mut ephemeral = ChainSettings::default().ephemeral();
        assert!(listeners().all(|listener| (listener.setting)(&mut ephemeral).port() == 0));
    }

    #[test]
    fn the_development_key_is_kept_in_the_data_directory_and_shared_with_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = ChainSettings::default().with_data_dir(dir.path());
        share_secret_keys(&mut first).unwrap();
        assert!(!first.orders.webhooks.secret_keys.is_empty());
        assert_eq!(first.webhook_sender.secret_keys, first.orders.webhooks.secret_keys, "the sender opens what orders sealed");
        let file = dir.path().join(SECRET_KEYS_FILE);
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600, "readable by its owner only");

        let mut restarted = ChainSettings::default().with_data_dir(dir.path());
        share_secret_keys(&mut restarted).unwrap();
        assert_eq!(restarted.orders.webhooks.secret_keys, first.orders.webhooks.secret_keys, "a restart opens what was sealed before");

        let mut configured = ChainSettings::default().with_data_dir(dir.path());
        configured.orders.webhooks.secret_keys = SecretKeys::generate("mine");
        share_secret_keys(&mut configured).unwrap();
        assert_eq!(configured.webhook_sender.secret_keys, configured.orders.webhooks.secret_keys, "keys that are set win");
        assert_ne!(configured.orders.webhooks.secret_keys, first.orders.webhooks.secret_keys);
    }
}
