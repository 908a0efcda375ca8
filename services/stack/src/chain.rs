//! Starts the four services and the webhook sender in this process, wired to each other's real
//! addresses: [`Chain::start`] builds each service after the ones it calls, and points it at
//! where they bound.

use std::{
    collections::BTreeMap,
    fmt, io,
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::Arc,
};

use bank_mock::BankState;
use deadline::HopStatsSnapshot;
use outbox::SecretKeys;
use resilience::{breaker::BreakerStats, bulkhead::BulkheadStats, retry::RetryStatsSnapshot};
use rpc::{
    ServerError,
    dev_certs::{DevCerts, OPERATOR},
    guards::{Guards, GuardsView},
    tls::TlsSettings,
};
use serde::{Deserialize, Serialize};
use tempfile::TempDir;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::naive::{self, NaiveSettings};

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
        for listener in LISTENERS {
            *(listener.setting)(&mut self) = SocketAddr::from(([127, 0, 0, 1], 0));
        }
        self
    }

    /// Keeps the SQLite database of each service that has one in `dir`, named after the service
    /// (`orders.db`, `payment.db`; PostgreSQL URLs stay as set), and the development key that
    /// seals endpoint secrets when the settings name none.
    pub fn with_data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_owned());
        for (hop, url) in [
            (orders::HOP, &mut self.orders.database_url),
            (payment::HOP, &mut self.payment.database_url),
        ] {
            if url.starts_with("sqlite:") {
                *url = format!("sqlite://{}", dir.join(format!("{hop}.db")).display());
            }
        }
        self
    }
}

/// One port of a service.
pub struct Listener {
    /// Its settings key, as `--set` and a settings file name it.
    pub key: &'static str,
    /// The service it belongs to, by its hop name.
    pub hop: &'static str,
    /// Its line in `stack up`'s list of addresses: a label, then `shown` with the bound address at
    /// `{addr}` (and the bank's admin token at `{admin_token}`).
    pub label: &'static str,
    pub shown: &'static str,
    setting: fn(&mut ChainSettings) -> &mut SocketAddr,
    /// The face of the service's live view whose deadline counters are this port's requests.
    face: Option<&'static str>,
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key)
    }
}

pub const GATEWAY_HTTP: Listener = Listener {
    key: "gateway.http_listen",
    hop: gateway::HOP,
    label: "gateway HTTP",
    shown: "http://{addr}",
    setting: |s| &mut s.gateway.http_listen,
    face: Some("http"),
};
pub const GATEWAY_GRPC: Listener = Listener {
    key: "gateway.grpc_listen",
    hop: gateway::HOP,
    label: "gateway gRPC",
    shown: "{addr}",
    setting: |s| &mut s.gateway.grpc_listen,
    face: Some("grpc"),
};
/// The gateway's operations port. In one process every operations port shows every hop's series.
pub const GATEWAY_OPS: Listener = Listener {
    key: "gateway.ops.listen",
    hop: gateway::HOP,
    label: "gateway ops",
    shown: "http://{addr}/guards  (/metrics: every hop's series)",
    setting: |s| &mut s.gateway.ops.listen,
    face: None,
};
pub const ORDERS_GRPC: Listener = Listener {
    key: "orders.listen",
    hop: orders::HOP,
    label: "orders gRPC",
    shown: "{addr}",
    setting: |s| &mut s.orders.listen,
    face: Some("grpc"),
};
pub const ORDERS_OPS: Listener = Listener {
    key: "orders.ops.listen",
    hop: orders::HOP,
    label: "orders ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.orders.ops.listen,
    face: None,
};
pub const PAYMENT_GRPC: Listener = Listener {
    key: "payment.listen",
    hop: payment::HOP,
    label: "payment gRPC",
    shown: "{addr}",
    setting: |s| &mut s.payment.listen,
    face: Some("grpc"),
};
pub const PAYMENT_OPS: Listener = Listener {
    key: "payment.ops.listen",
    hop: payment::HOP,
    label: "payment ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.payment.ops.listen,
    face: None,
};
/// Payment's calls go to `external_bank` instead when it is set.
pub const BANK_GRPC: Listener = Listener {
    key: "bank.listen",
    hop: bank_mock::HOP,
    label: "bank-mock gRPC",
    shown: "{addr}",
    setting: |s| &mut s.bank.listen,
    face: Some("grpc"),
};
pub const BANK_ADMIN: Listener = Listener {
    key: "bank.admin_listen",
    hop: bank_mock::HOP,
    label: "bank-mock admin",
    shown: "http://{addr}  (X-Admin-Token: {admin_token})",
    setting: |s| &mut s.bank.admin_listen,
    face: None,
};
pub const BANK_OPS: Listener = Listener {
    key: "bank.ops.listen",
    hop: bank_mock::HOP,
    label: "bank-mock ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.bank.ops.listen,
    face: None,
};
/// How an operations port other than the gateway's is shown.
const OPS_SHOWN: &str = "http://{addr}/guards  (and /metrics, /livez, /readyz)";
/// The webhook sender's health and metrics.
pub const WEBHOOK_SENDER_HEALTH: Listener = Listener {
    key: "webhook_sender.listen",
    hop: WEBHOOK_SENDER,
    label: "webhook sender",
    shown: "http://{addr}/metrics  (delivers orders' outbox)",
    setting: |s| &mut s.webhook_sender.listen,
    face: None,
};

/// Every listener of the chain, service by service in the order a request goes through them,
/// the webhook sender last.
pub const LISTENERS: [&Listener; 11] = [
    &GATEWAY_HTTP,
    &GATEWAY_GRPC,
    &GATEWAY_OPS,
    &ORDERS_GRPC,
    &ORDERS_OPS,
    &PAYMENT_GRPC,
    &PAYMENT_OPS,
    &BANK_GRPC,
    &BANK_OPS,
    &BANK_ADMIN,
    &WEBHOOK_SENDER_HEALTH,
];

/// The webhook sender's name among the services, for [`Chain::stop_service`].
pub const WEBHOOK_SENDER: &str = webhook_sender::SERVICE.name;

/// The services a chain runs, each exported under its own name when the process's telemetry
/// hosts them ([`telemetry::init_hosting`]).
pub const SERVICES: [telemetry::Service; 5] = [
    gateway::SERVICE,
    orders::SERVICE,
    payment::SERVICE,
    bank_mock::SERVICE,
    webhook_sender::SERVICE,
];

/// The calls an order makes, outermost first: the breakers [`ChainGuardStats`] reports.
pub const EDGES: [Edge; 3] = [
    Edge {
        caller: gateway::HOP,
        callee: orders::HOP,
    },
    Edge {
        caller: orders::HOP,
        callee: payment::HOP,
    },
    Edge {
        caller: payment::HOP,
        callee: bank_mock::HOP,
    },
];

/// Something of each of the chain's listeners that has one, in the order of [`LISTENERS`]: read
/// by indexing with the listener (`addresses[&GATEWAY_HTTP]`), written as a map by listener key.
#[derive(Debug, Clone)]
pub struct ByListener<T>(Vec<(&'static Listener, T)>);

/// Where each listener of a running chain is bound.
pub type Addresses = ByListener<SocketAddr>;

/// The deadline counters of every hop, by the listener whose requests they count (the gateway
/// has two, `GATEWAY_HTTP` and `GATEWAY_GRPC`).
pub type ChainHopStats = ByListener<HopStatsSnapshot>;

impl<T> ByListener<T> {
    /// The value of `listener`, if it has one.
    pub fn get(&self, listener: &Listener) -> Option<&T> {
        self.0
            .iter()
            .find(|(own, _)| own.key == listener.key)
            .map(|(_, value)| value)
    }

    /// Every listener that has a value, with it.
    pub fn iter(&self) -> impl Iterator<Item = (&'static Listener, &T)> {
        self.0.iter().map(|(listener, value)| (*listener, value))
    }
}

impl<T> std::ops::Index<&Listener> for ByListener<T> {
    type Output = T;

    fn index(&self, listener: &Listener) -> &T {
        self.get(listener)
            .unwrap_or_else(|| panic!("nothing is kept for {}", listener.key))
    }
}

impl<T: Serialize> Serialize for ByListener<T> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|(listener, value)| (listener.key, value)))
    }
}

/// A service's calls to another, by their hop names; written `caller → callee`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Edge {
    pub caller: &'static str,
    pub callee: &'static str,
}

impl fmt::Display for Edge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} → {}", self.caller, self.callee)
    }
}

/// The breakers of an order's calls and payment's bulkhead toward the bank, as they stand.
#[derive(Debug, Clone, Serialize)]
pub struct ChainGuardStats {
    /// The breaker of each of [`EDGES`] (written as a map by `caller → callee`).
    #[serde(serialize_with = "by_edge")]
    breakers: Vec<(Edge, BreakerStats)>,
    pub bank_bulkhead: BulkheadStats,
}

impl ChainGuardStats {
    /// The breaker on `caller`'s calls to `callee`, by their hop names (`payment::HOP`, …).
    ///
    /// # Panics
    /// When it is not one of [`EDGES`].
    pub fn breaker(&self, caller: &str, callee: &str) -> BreakerStats {
        self.breakers
            .iter()
            .find(|(edge, _)| edge.caller == caller && edge.callee == callee)
            .unwrap_or_else(|| panic!("no breaker guards {caller} → {callee}"))
            .1
    }

    /// Every breaker, with the calls it guards.
    pub fn breakers(&self) -> impl Iterator<Item = (Edge, BreakerStats)> + '_ {
        self.breakers.iter().copied()
    }
}

fn by_edge<S: serde::Serializer>(
    breakers: &[(Edge, BreakerStats)],
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.collect_map(
        breakers
            .iter()
            .map(|(edge, stats)| (edge.to_string(), stats)),
    )
}

/// A running chain. Dropping it without [`Chain::stop`] leaves the servers to the runtime's end.
pub struct Chain {
    addresses: Addresses,
    /// The database URL of each service that keeps data, by hop name.
    databases: Vec<(&'static str, String)>,
    pub admin_token: String,
    bank: Arc<BankState>,
    /// Each service's guards, as its operations port shows them.
    guards: Vec<Guards>,
    stops: BTreeMap<&'static str, CancellationToken>,
    shutdown: CancellationToken,
    servers: JoinSet<Result<(), ServerError>>,
    dev_certs: Option<(DevCerts, TempDir)>,
    naive: bool,
}

impl Chain {
    /// Starts the bank, payment, orders, the gateway and the webhook sender, in that order: each
    /// after the services it calls, pointed at where they bound.
    pub async fn start(mut settings: ChainSettings) -> Result<Self, ServerError> {
        let naive = settings.naive;
        if naive.enabled {
            // The naive design's retrying proxies hold no certificates, and its calls no guards.
            settings.plaintext = true;
            settings.gateway.retry.max_attempts = 1;
            for dependency in [
                &mut settings.gateway.orders,
                &mut settings.orders.payment,
                &mut settings.payment.bank,
            ] {
                naive::unguarded(dependency);
            }
        }
        let dev_certs = secure(&mut settings)?;
        share_secret_keys(&mut settings)
            .map_err(|error| ServerError::Settings(format!("{SECRET_KEYS_FILE}: {error}")))?;
        let bank = bank_mock::Application::build(settings.bank.clone()).await?;
        let mut chain = Self {
            addresses: ByListener(Vec::new()),
            databases: vec![
                (orders::HOP, settings.orders.database_url.clone()),
                (payment::HOP, settings.payment.database_url.clone()),
            ],
            admin_token: bank.admin_token().to_owned(),
            bank: bank.state(),
            guards: Vec::new(),
            stops: BTreeMap::new(),
            shutdown: CancellationToken::new(),
            servers: JoinSet::new(),
            dev_certs,
            naive: naive.enabled,
        };
        chain.bound(&[
            (&BANK_GRPC, bank.grpc_addr()),
            (&BANK_OPS, bank.ops_addr()),
            (&BANK_ADMIN, bank.admin_addr()),
        ]);
        chain.guards.push(bank.guards());
        chain.run(bank_mock::HOP, |stop| bank.run_until_stopped(stop));
        let bank = endpoint(chain.address(&BANK_GRPC));

        // The bank payment charges at; the gateway reads exchange rates from the chain's own.
        let charged = settings.external_bank.clone().unwrap_or(bank.clone());
        settings.payment.bank.endpoint = chain.through_naive_retries(&charged, naive).await?;
        settings.gateway.bank.endpoint = bank;
        let payment = payment::Application::build(settings.payment.clone()).await?;
        chain.bound(&[
            (&PAYMENT_GRPC, payment.grpc_addr()),
            (&PAYMENT_OPS, payment.ops_addr()),
        ]);
        chain.guards.push(payment.guards());
        chain.run(payment::HOP, |stop| payment.run_until_stopped(stop));
        let payment = endpoint(chain.address(&PAYMENT_GRPC));

        settings.orders.payment.endpoint = chain.through_naive_retries(&payment, naive).await?;
        // The completer's window is checked against how long payment really keeps its keys.
        settings.orders.completer.payment_key_ttl_ms = settings.payment.idempotency.ttl_ms;
        let orders = orders::Application::build(settings.orders.clone()).await?;
        chain.bound(&[
            (&ORDERS_GRPC, orders.grpc_addr()),
            (&ORDERS_OPS, orders.ops_addr()),
        ]);
        chain.guards.push(orders.guards());
        chain.run(orders::HOP, |stop| orders.run_until_stopped(stop));
        let orders = endpoint(chain.address(&ORDERS_GRPC));

        settings.gateway.orders.endpoint = chain.through_naive_retries(&orders, naive).await?;
        settings.gateway.recommendations.endpoint = orders;
        settings.gateway.payment.endpoint = payment;
        let gateway = gateway::Application::build(settings.gateway.clone()).await?;
        chain.bound(&[
            (&GATEWAY_HTTP, gateway.http_addr()),
            (&GATEWAY_GRPC, gateway.grpc_addr()),
            (&GATEWAY_OPS, gateway.ops_addr()),
        ]);
        chain.guards.push(gateway.guards());
        chain.run(gateway::HOP, |stop| gateway.run_until_stopped(stop));

        // The sender delivers orders' outbox, from orders' database.
        let mut sender_settings = settings.webhook_sender.clone();
        sender_settings.database_url = settings.orders.database_url.clone();
        sender_settings.sqlite = settings.orders.sqlite;
        let failed = |error| ServerError::Settings(format!("webhook-sender: {error}"));
        let sender = webhook_sender::Application::build(sender_settings)
            .await
            .map_err(failed)?;
        chain.bound(&[(&WEBHOOK_SENDER_HEALTH, sender.local_addr())]);
        chain.run(WEBHOOK_SENDER, |stop| async move {
            sender
                .run_until_stopped(stop)
                .await
                .map_err(|error| match error {
                    webhook_sender::SenderError::Server(error) => error,
                    other => failed(other),
                })
        });

        chain.addresses.0.sort_by_key(|(listener, _)| {
            LISTENERS
                .iter()
                .position(|listed| listed.key == listener.key)
        });
        Ok(chain)
    }

    /// Records where a service's listeners are bound.
    fn bound(&mut self, listeners: &[(&'static Listener, SocketAddr)]) {
        self.addresses.0.extend_from_slice(listeners);
    }

    /// Runs the service named `hop` until it is stopped, alone or with the chain.
    fn run<F>(&mut self, hop: &'static str, serve: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = Result<(), ServerError>> + Send + 'static,
    {
        let stop = self.shutdown.child_token();
        self.stops.insert(hop, stop.clone());
        self.servers.spawn(serve(stop));
    }

    /// Where a caller reaches `endpoint`: there, or in the naive chain at a proxy in front of it
    /// that retries every call ([`naive::RetryingProxy`]).
    async fn through_naive_retries(
        &mut self,
        endpoint: &str,
        naive: NaiveSettings,
    ) -> Result<String, ServerError> {
        if !naive.enabled {
            return Ok(endpoint.to_owned());
        }
        let proxy = naive::RetryingProxy::bind(endpoint, naive).await?;
        let address = proxy.local_addr();
        self.servers.spawn(proxy.serve(self.shutdown.clone()));
        Ok(self::endpoint(address))
    }

    /// Where each listener is bound.
    pub fn addresses(&self) -> &Addresses {
        &self.addresses
    }

    /// Where `listener` is bound.
    pub fn address(&self, listener: &Listener) -> SocketAddr {
        self.addresses[listener]
    }

    /// The database URL of each service that keeps data (orders, then payment), by hop name.
    pub fn databases(&self) -> &[(&'static str, String)] {
        &self.databases
    }

    /// The database URL of the service named `hop`, if it keeps data.
    pub fn database_url(&self, hop: &str) -> Option<&str> {
        self.databases
            .iter()
            .find(|(name, _)| *name == hop)
            .map(|(_, url)| url.as_str())
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

    /// How every guard of the service named `hop` stands: its `/guards.json` document.
    ///
    /// # Panics
    /// When no service of the chain has that name and guards.
    pub fn guards(&self, hop: &str) -> GuardsView {
        self.guards
            .iter()
            .find(|guards| guards.service() == hop)
            .map(Guards::view)
            .unwrap_or_else(|| panic!("{hop} is no service with guards"))
    }

    /// The breakers of [`EDGES`] and payment's bulkhead toward the bank.
    pub fn guard_stats(&self) -> ChainGuardStats {
        let views: Vec<GuardsView> = self.guards.iter().map(Guards::view).collect();
        let dependency = |edge: Edge| {
            views
                .iter()
                .filter(|view| view.service == edge.caller)
                .flat_map(|view| &view.dependencies)
                .find(|dependency| dependency.name == edge.callee)
                .unwrap_or_else(|| panic!("{edge} is guarded"))
        };
        ChainGuardStats {
            breakers: EDGES
                .into_iter()
                .map(|edge| (edge, dependency(edge).breaker))
                .collect(),
            bank_bulkhead: dependency(EDGES[2]).bulkhead,
        }
    }

    /// Requests the gateway refused for being over their client's quota.
    pub fn rate_limited(&self) -> u64 {
        self.guards(gateway::HOP)
            .caller_quotas
            .iter()
            .map(|quota| quota.refused)
            .sum()
    }

    /// Counters of the gateway's retries of its calls to orders.
    pub fn retry_stats(&self) -> RetryStatsSnapshot {
        self.guards(gateway::HOP)
            .dependencies
            .into_iter()
            .find_map(|dependency| dependency.retry.filter(|_| dependency.name == orders::HOP))
            .expect("the gateway retries its calls to orders")
            .counts
    }

    /// The deadline counters of every hop, as they stand.
    pub fn hop_stats(&self) -> ChainHopStats {
        let views: Vec<GuardsView> = self.guards.iter().map(Guards::view).collect();
        ByListener(
            LISTENERS
                .into_iter()
                .filter_map(|listener| {
                    let face = listener.face?;
                    let view = views.iter().find(|view| view.service == listener.hop)?;
                    let counted = view.faces.iter().find(|counted| counted.name == face)?;
                    Some((listener, counted.deadlines))
                })
                .collect(),
        )
    }

    /// Stops one service (by its hop name, e.g. `"orders"`, or [`WEBHOOK_SENDER`]), leaving the
    /// others running.
    /// Returns whether a service has that name.
    pub fn stop_service(&self, hop: &str) -> bool {
        self.stops
            .get(hop)
            .inspect(|token| token.cancel())
            .is_some()
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
        Ok(text) => SecretKeys::parse(
            &text
                .lines()
                .filter(|line| !line.trim().is_empty())
                .collect::<Vec<_>>(),
        )
        .map_err(|error| io::Error::new(io::ErrorKind::InvalidData, error)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => {
            use std::{io::Write, os::unix::fs::OpenOptionsExt};
            let keys = SecretKeys::generate("dev");
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            writeln!(file, "{}", keys.to_written().join("\n"))?;
            Ok(keys)
        }
        Err(error) => Err(error),
    }
}

/// Makes every service plain text (`plaintext`), or gives each a certificate of a fresh
/// development CA when none names files of its own.
fn secure(settings: &mut ChainSettings) -> Result<Option<(DevCerts, TempDir)>, ServerError> {
    let plaintext = settings.plaintext;
    let served = [
        (gateway::HOP, &mut settings.gateway.tls),
        (orders::HOP, &mut settings.orders.tls),
        (payment::HOP, &mut settings.payment.tls),
        (bank_mock::HOP, &mut settings.bank.tls),
    ];
    if plaintext {
        for (_, tls) in served {
            *tls = TlsSettings {
                plaintext: true,
                ..TlsSettings::default()
            };
        }
        return Ok(None);
    }
    if served
        .iter()
        .any(|(_, tls)| **tls != TlsSettings::default())
    {
        return Ok(None);
    }
    let names: Vec<&str> = served
        .iter()
        .map(|(name, _)| *name)
        .chain([OPERATOR])
        .collect();
    let dir = tempfile::Builder::new()
        .prefix("chain-certs-")
        .tempdir()
        .map_err(|error| ServerError::Settings(format!("certificates: {error}")))?;
    let certs = DevCerts::generate(dir.path(), &names)
        .map_err(|error| ServerError::Settings(format!("certificates: {error}")))?;
    for (name, tls) in served {
        *tls = certs.settings(name);
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
        for (port, listener) in (1..).zip(LISTENERS) {
            let mut document = serde_json::to_value(ChainSettings::default()).unwrap();
            let setting = listener
                .key
                .split('.')
                .fold(&mut document, |section, field| &mut section[field]);
            *setting = format!("127.0.0.1:{port}").into();
            let mut settings: ChainSettings = serde_json::from_value(document).unwrap();
            assert_eq!(
                (listener.setting)(&mut settings).port(),
                port,
                "{}",
                listener.key
            );
        }
        let mut ephemeral = ChainSettings::default().ephemeral();
        assert!(
            LISTENERS
                .iter()
                .all(|listener| (listener.setting)(&mut ephemeral).port() == 0)
        );
    }

    /// Every listener is bound and every port that serves requests counted; the databases are
    /// their owner's only.
    #[tokio::test]
    async fn every_listener_is_bound_and_every_served_port_counted() {
        let dir = tempfile::tempdir().unwrap();
        let chain = Chain::start(
            ChainSettings::default()
                .ephemeral()
                .with_data_dir(dir.path()),
        )
        .await
        .unwrap();
        let bound: Vec<_> = chain
            .addresses()
            .iter()
            .map(|(listener, address)| (listener.key, address.port() != 0))
            .collect();
        assert_eq!(
            bound,
            LISTENERS.map(|listener| (listener.key, true)).to_vec()
        );
        let counters = chain.hop_stats();
        for listener in LISTENERS.iter().filter(|listener| listener.face.is_some()) {
            assert!(
                counters.get(listener).is_some(),
                "{} is counted",
                listener.key
            );
        }
        assert_eq!(chain.guard_stats().breakers().count(), EDGES.len());
        // The databases (and their WAL files, while open) are their owner's only.
        let files: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|entry| entry.unwrap())
            .collect();
        let names: Vec<_> = files
            .iter()
            .map(|file| file.file_name().into_string().unwrap())
            .collect();
        assert!(
            ["orders.db", "payment.db"]
                .iter()
                .all(|db| names.iter().any(|name| name == db)),
            "{names:?}"
        );
        for file in files {
            let mode = file.metadata().unwrap().permissions().mode();
            assert_eq!(
                mode & 0o077,
                0,
                "{:?} is its owner's only: {mode:o}",
                file.file_name()
            );
        }
        chain.stop().await.unwrap();
    }

    #[test]
    fn the_development_key_is_kept_in_the_data_directory_and_shared_with_the_sender() {
        let dir = tempfile::tempdir().unwrap();
        let mut first = ChainSettings::default().with_data_dir(dir.path());
        share_secret_keys(&mut first).unwrap();
        assert!(!first.orders.webhooks.secret_keys.is_empty());
        assert_eq!(
            first.webhook_sender.secret_keys, first.orders.webhooks.secret_keys,
            "the sender opens what orders sealed"
        );
        let file = dir.path().join(SECRET_KEYS_FILE);
        assert_eq!(
            std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
            0o600,
            "readable by its owner only"
        );

        let mut restarted = ChainSettings::default().with_data_dir(dir.path());
        share_secret_keys(&mut restarted).unwrap();
        assert_eq!(
            restarted.orders.webhooks.secret_keys, first.orders.webhooks.secret_keys,
            "a restart opens what was sealed before"
        );

        let mut configured = ChainSettings::default().with_data_dir(dir.path());
        configured.orders.webhooks.secret_keys = SecretKeys::generate("mine");
        share_secret_keys(&mut configured).unwrap();
        assert_eq!(
            configured.webhook_sender.secret_keys, configured.orders.webhooks.secret_keys,
            "keys that are set win"
        );
        assert_ne!(
            configured.orders.webhooks.secret_keys,
            first.orders.webhooks.secret_keys
        );
    }
}
