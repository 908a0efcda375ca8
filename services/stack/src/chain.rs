//! Starts the four services and the webhook sender in this process, wired to each other's real
//! addresses. [`HOPS`] has a row per service with everything the stack does for it: its
//! listeners and who calls them, its certificate, its database, its name in telemetry, and how
//! to build it; [`Chain::start`] walks the rows, builds each service after the ones it calls and
//! points every caller at what its callee bound.

use std::{
    collections::BTreeMap,
    fmt,
    future::Future,
    io,
    net::SocketAddr,
    path::{Path, PathBuf},
    pin::Pin,
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

/// Settings of the whole chain: one section per service, each exactly the service's own settings
/// (a new service adds its section here, for its row of [`HOPS`] to build it from).
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

    /// Keeps the SQLite database of each service that has one in `dir`, named after the service
    /// (`orders.db`, `payment.db`; PostgreSQL URLs stay as set), and the development key that
    /// seals endpoint secrets when the settings name none.
    pub fn with_data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_owned());
        for hop in HOPS {
            let Some(database) = hop.database else {
                continue;
            };
            let url = database(&mut self);
            if url.starts_with("sqlite:") {
                *url = format!(
                    "sqlite://{}",
                    dir.join(format!("{}.db", hop.service.name)).display()
                );
            }
        }
        self
    }
}

/// One service of the chain, as the stack runs it: everything the stack knows of it.
pub struct Hop {
    /// Its name (the hop's, in ledgers, certificates and [`Chain::stop_service`]) and version,
    /// exported under its own name when the process's telemetry hosts it ([`telemetry::init_hosting`]).
    pub service: telemetry::Service,
    /// Where it listens.
    pub listeners: &'static [Listener],
    /// Its mutual-TLS settings; `None` for a service that serves no gRPC to the others.
    tls: Option<fn(&mut ChainSettings) -> &mut TlsSettings>,
    /// Its database URL, for a service that keeps data of its own: with a data directory, a
    /// SQLite database is the file named after the service there.
    database: Option<fn(&mut ChainSettings) -> &mut String>,
    /// Builds it from its section of the settings (the endpoints of the services it calls
    /// already set to where they bound), and hands over what the chain reads of it.
    start: Start,
}

/// How a [`Hop`] builds its service.
type Start = fn(Starting) -> Pin<Box<dyn Future<Output = Result<Started, ServerError>>>>;

/// What a [`Hop`]'s `start` is given.
struct Starting {
    /// The chain's settings, the endpoints of the services this one calls set to where they bound.
    chain: ChainSettings,
    /// The outbound layers of the services that call others ([`NaiveSettings::outbound`]).
    outbound: rpc::Outbound,
    /// Stops this service, alone or with the chain.
    stop: CancellationToken,
}

/// A service its [`Hop`] has built: bound, not serving yet.
struct Started {
    /// Where each of the row's listeners is bound.
    bound: Vec<(&'static Listener, SocketAddr)>,
    /// Its deadline counters, by the listener whose requests they count.
    counters: Vec<(&'static Listener, Arc<HopStats>)>,
    /// Its circuit breakers, by the hop whose calls each guards.
    breakers: Vec<(&'static str, Arc<Breaker>)>,
    /// Serves until the row's stop token is cancelled.
    serving: Pin<Box<dyn Future<Output = Result<(), ServerError>> + Send>>,
    /// What the chain's users drive of it, for a service they know by name.
    handles: Handles,
}

/// What the chain's users drive or read of services they know by name, handed over by their
/// rows: the bank's faults, counters and admin token, the gateway's retry policy and quotas,
/// payment's bulkhead toward the bank.
#[derive(Default)]
struct Handles {
    bank: Option<(Arc<BankState>, String)>,
    gateway: Option<(RetryPolicy, Arc<gateway::ClientLimits>)>,
    bank_bulkhead: Option<Arc<Bulkhead>>,
}

impl Handles {
    /// These, and what `more` hands over besides.
    fn and(self, more: Handles) -> Handles {
        Handles {
            bank: self.bank.or(more.bank),
            gateway: self.gateway.or(more.gateway),
            bank_bulkhead: self.bank_bulkhead.or(more.bank_bulkhead),
        }
    }
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
    /// The endpoint settings through which other services call it, each set to where it bound
    /// before they start.
    callers: &'static [fn(&mut ChainSettings) -> &mut String],
}

impl Listener {
    /// The name of the hop it belongs to.
    pub fn hop(&self) -> &'static str {
        HOPS.iter()
            .find(|hop| {
                hop.listeners
                    .iter()
                    .any(|listener| listener.key == self.key)
            })
            .expect("every listener is in HOPS")
            .service
            .name
    }
}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key)
    }
}

pub const GATEWAY_HTTP: Listener = Listener {
    key: "gateway.http_listen",
    label: "gateway HTTP",
    shown: "http://{addr}",
    setting: |s| &mut s.gateway.http_listen,
    callers: &[],
};
pub const GATEWAY_GRPC: Listener = Listener {
    key: "gateway.grpc_listen",
    label: "gateway gRPC",
    shown: "{addr}",
    setting: |s| &mut s.gateway.grpc_listen,
    callers: &[],
};
/// The gateway's operations port. In one process every operations port shows every hop's series.
pub const GATEWAY_OPS: Listener = Listener {
    key: "gateway.ops.listen",
    label: "gateway ops",
    shown: "http://{addr}/guards  (/metrics: every hop's series)",
    setting: |s| &mut s.gateway.ops.listen,
    callers: &[],
};
pub const ORDERS_GRPC: Listener = Listener {
    key: "orders.listen",
    label: "orders gRPC",
    shown: "{addr}",
    setting: |s| &mut s.orders.listen,
    callers: &[
        |s| &mut s.gateway.orders.endpoint,
        |s| &mut s.gateway.recommendations.endpoint,
    ],
};
pub const ORDERS_OPS: Listener = Listener {
    key: "orders.ops.listen",
    label: "orders ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.orders.ops.listen,
    callers: &[],
};
pub const PAYMENT_GRPC: Listener = Listener {
    key: "payment.listen",
    label: "payment gRPC",
    shown: "{addr}",
    setting: |s| &mut s.payment.listen,
    callers: &[
        |s| &mut s.orders.payment.endpoint,
        |s| &mut s.gateway.payment.endpoint,
    ],
};
pub const PAYMENT_OPS: Listener = Listener {
    key: "payment.ops.listen",
    label: "payment ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.payment.ops.listen,
    callers: &[],
};
/// Payment's calls go to `external_bank` instead when it is set.
pub const BANK_GRPC: Listener = Listener {
    key: "bank.listen",
    label: "bank-mock gRPC",
    shown: "{addr}",
    setting: |s| &mut s.bank.listen,
    callers: &[
        |s| &mut s.payment.bank.endpoint,
        |s| &mut s.gateway.bank.endpoint,
    ],
};
pub const BANK_ADMIN: Listener = Listener {
    key: "bank.admin_listen",
    label: "bank-mock admin",
    shown: "http://{addr}  (X-Admin-Token: {admin_token})",
    setting: |s| &mut s.bank.admin_listen,
    callers: &[],
};
pub const BANK_OPS: Listener = Listener {
    key: "bank.ops.listen",
    label: "bank-mock ops",
    shown: OPS_SHOWN,
    setting: |s| &mut s.bank.ops.listen,
    callers: &[],
};
/// How an operations port other than the gateway's is shown.
const OPS_SHOWN: &str = "http://{addr}/guards  (and /metrics, /livez, /readyz)";
/// The webhook sender's health and metrics.
pub const WEBHOOK_SENDER_HEALTH: Listener = Listener {
    key: "webhook_sender.listen",
    label: "webhook sender",
    shown: "http://{addr}/metrics  (delivers orders' outbox)",
    setting: |s| &mut s.webhook_sender.listen,
    callers: &[],
};

/// The chain's services in the order a request goes through them, the webhook sender last.
/// [`Chain::start`] starts them from the last to the first, so that each is built after the
/// services it calls and its settings name where they bound (the webhook sender calls none: it
/// delivers orders' outbox from orders' database, whose tables either of them makes).
/// A service is added here: a row gives it its ports, its certificate, its telemetry name and
/// its place in [`Chain::start`], and its listeners' `callers` point the services that call it
/// at it.
pub const HOPS: &[Hop] = &[
    Hop {
        service: gateway::SERVICE,
        listeners: &[GATEWAY_HTTP, GATEWAY_GRPC, GATEWAY_OPS],
        tls: Some(|s| &mut s.gateway.tls),
        database: None,
        start: |s| {
            Box::pin(async move {
                let mut settings = s.chain.gateway;
                if s.chain.naive.enabled {
                    // The naive clients retry at every hop, the gateway's included.
                    settings.retry.max_attempts = 1;
                }
                let gateway = gateway::Application::build_with(settings, s.outbound).await?;
                Ok(Started {
                    bound: vec![
                        (&GATEWAY_HTTP, gateway.http_addr()),
                        (&GATEWAY_GRPC, gateway.grpc_addr()),
                        (&GATEWAY_OPS, gateway.ops_addr()),
                    ],
                    counters: vec![
                        (&GATEWAY_HTTP, gateway.http_stats()),
                        (&GATEWAY_GRPC, gateway.grpc_stats()),
                    ],
                    breakers: vec![(orders::HOP, gateway.orders_breaker())],
                    handles: Handles {
                        gateway: Some((gateway.retry_handle(), gateway.client_limits())),
                        ..Handles::default()
                    },
                    serving: Box::pin(gateway.run_until_stopped(s.stop)),
                })
            })
        },
    },
    Hop {
        service: orders::SERVICE,
        listeners: &[ORDERS_GRPC, ORDERS_OPS],
        tls: Some(|s| &mut s.orders.tls),
        database: Some(|s| &mut s.orders.database_url),
        start: |s| {
            Box::pin(async move {
                let mut settings = s.chain.orders;
                // The completer's window is checked against how long payment really keeps its keys.
                settings.completer.payment_key_ttl_ms = s.chain.payment.idempotency.ttl_ms;
                let orders = orders::Application::build_with(settings, s.outbound).await?;
                Ok(Started {
                    bound: vec![
                        (&ORDERS_GRPC, orders.grpc_addr()),
                        (&ORDERS_OPS, orders.ops_addr()),
                    ],
                    counters: vec![(&ORDERS_GRPC, orders.hop_stats())],
                    breakers: vec![(payment::HOP, orders.payment_breaker())],
                    handles: Handles::default(),
                    serving: Box::pin(orders.run_until_stopped(s.stop)),
                })
            })
        },
    },
    Hop {
        service: payment::SERVICE,
        listeners: &[PAYMENT_GRPC, PAYMENT_OPS],
        tls: Some(|s| &mut s.payment.tls),
        database: Some(|s| &mut s.payment.database_url),
        start: |s| {
            Box::pin(async move {
                let mut settings = s.chain.payment;
                if let Some(bank) = s.chain.external_bank {
                    settings.bank.endpoint = bank;
                }
                let payment = payment::Application::build_with(settings, s.outbound).await?;
                let (bank_breaker, bank_bulkhead) = payment.bank_guards();
                Ok(Started {
                    bound: vec![
                        (&PAYMENT_GRPC, payment.grpc_addr()),
                        (&PAYMENT_OPS, payment.ops_addr()),
                    ],
                    counters: vec![(&PAYMENT_GRPC, payment.hop_stats())],
                    breakers: vec![(bank_mock::HOP, bank_breaker)],
                    handles: Handles {
                        bank_bulkhead: Some(bank_bulkhead),
                        ..Handles::default()
                    },
                    serving: Box::pin(payment.run_until_stopped(s.stop)),
                })
            })
        },
    },
    Hop {
        service: bank_mock::SERVICE,
        listeners: &[BANK_GRPC, BANK_OPS, BANK_ADMIN],
        tls: Some(|s| &mut s.bank.tls),
        database: None,
        start: |s| {
            Box::pin(async move {
                let bank = bank_mock::Application::build(s.chain.bank).await?;
                Ok(Started {
                    bound: vec![
                        (&BANK_GRPC, bank.grpc_addr()),
                        (&BANK_OPS, bank.ops_addr()),
                        (&BANK_ADMIN, bank.admin_addr()),
                    ],
                    counters: vec![(&BANK_GRPC, bank.hop_stats())],
                    breakers: Vec::new(),
                    handles: Handles {
                        bank: Some((bank.state(), bank.admin_token().to_owned())),
                        ..Handles::default()
                    },
                    serving: Box::pin(bank.run_until_stopped(s.stop)),
                })
            })
        },
    },
    Hop {
        service: webhook_sender::SERVICE,
        listeners: &[WEBHOOK_SENDER_HEALTH],
        tls: None,
        database: None,
        start: |s| {
            Box::pin(async move {
                let mut settings = s.chain.webhook_sender;
                // The sender delivers orders' outbox, from orders' database.
                settings.database_url = s.chain.orders.database_url;
                settings.sqlite = s.chain.orders.sqlite;
                let failed = |error| ServerError::Settings(format!("webhook-sender: {error}"));
                let sender = webhook_sender::Application::build(settings)
                    .await
                    .map_err(failed)?;
                let bound = vec![(&WEBHOOK_SENDER_HEALTH, sender.local_addr())];
                let sending = sender.run_until_stopped(s.stop);
                Ok(Started {
                    bound,
                    counters: Vec::new(),
                    breakers: Vec::new(),
                    handles: Handles::default(),
                    serving: Box::pin(async move {
                        sending.await.map_err(|error| match error {
                            webhook_sender::SenderError::Server(error) => error,
                            other => failed(other),
                        })
                    }),
                })
            })
        },
    },
];

/// Every listener of the chain, service by service.
pub fn listeners() -> impl Iterator<Item = &'static Listener> {
    HOPS.iter().flat_map(|hop| hop.listeners)
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

/// Something of each of the chain's listeners that has one, in the order of [`HOPS`]: read by
/// indexing with the listener (`addresses[&GATEWAY_HTTP]`), written as a map by listener key.
#[derive(Debug, Clone)]
pub struct ByListener<T>(Vec<(&'static Listener, T)>);

/// Where each listener of a running chain is bound.
pub type Addresses = ByListener<SocketAddr>;

/// The deadline counters of every hop, by the listener whose requests they count (the gateway
/// has two, `GATEWAY_HTTP` and `GATEWAY_GRPC`): as they stand (`Counters` =
/// [`HopStatsSnapshot`]), or the live counters a chain reads them from.
pub type ChainHopStats<Counters = HopStatsSnapshot> = ByListener<Counters>;

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

/// The breakers and the bank's bulkhead, as they stand.
#[derive(Debug, Clone, Serialize)]
pub struct ChainGuardStats {
    /// The breaker of each call from one service to another, in the order of [`HOPS`] (written as
    /// a map by `caller → callee`).
    #[serde(serialize_with = "by_edge")]
    breakers: Vec<(Edge, BreakerStats)>,
    pub bank_bulkhead: BulkheadStats,
}

impl ChainGuardStats {
    /// The breaker on `caller`'s calls to `callee`, by their hop names (`payment::HOP`, …).
    ///
    /// # Panics
    /// When no breaker guards those calls.
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
    counters: ChainHopStats<Arc<HopStats>>,
    breakers: Vec<(Edge, Arc<Breaker>)>,
    bank_bulkhead: Arc<Bulkhead>,
    gateway_retry: RetryPolicy,
    client_limits: Arc<gateway::ClientLimits>,
    tokens: BTreeMap<&'static str, CancellationToken>,
    shutdown: CancellationToken,
    servers: JoinSet<Result<(), ServerError>>,
    dev_certs: Option<(DevCerts, TempDir)>,
    naive: bool,
}

impl Chain {
    /// Starts the services of [`HOPS`] from the last to the first, pointing the callers of each
    /// at where it bound, then serves them all.
    pub async fn start(mut settings: ChainSettings) -> Result<Self, ServerError> {
        let outbound = settings.naive.outbound();
        let dev_certs = secure(&mut settings)?;
        share_secret_keys(&mut settings)
            .map_err(|error| ServerError::Settings(format!("{SECRET_KEYS_FILE}: {error}")))?;
        let shutdown = CancellationToken::new();
        let mut handles = Handles::default();
        let mut tokens = BTreeMap::new();
        let mut started = Vec::with_capacity(HOPS.len());
        for hop in HOPS.iter().rev() {
            // Each service stops with the chain, or alone (to see the others cope).
            let stop = shutdown.child_token();
            tokens.insert(hop.service.name, stop.clone());
            let mut service = (hop.start)(Starting {
                chain: settings.clone(),
                outbound: outbound.clone(),
                stop,
            })
            .await?;
            for (listener, address) in &service.bound {
                for caller in listener.callers {
                    *caller(&mut settings) = endpoint(*address);
                }
            }
            handles = handles.and(std::mem::take(&mut service.handles));
            started.push((hop, service));
        }
        let (bank, admin_token) = handles.bank.expect("the bank's row hands over its state");
        let (gateway_retry, client_limits) = handles
            .gateway
            .expect("the gateway's row hands over its policy and quotas");
        let bank_bulkhead = handles
            .bank_bulkhead
            .expect("payment's row hands over its bulkhead");
        let databases = HOPS
            .iter()
            .filter_map(|hop| Some((hop.service.name, hop.database?(&mut settings).clone())))
            .collect();

        let (mut addresses, mut counters, mut breakers) = (Vec::new(), Vec::new(), Vec::new());
        let mut servers = JoinSet::new();
        for (hop, service) in started.into_iter().rev() {
            addresses.extend(service.bound);
            counters.extend(service.counters);
            breakers.extend(service.breakers.into_iter().map(|(callee, breaker)| {
                (
                    Edge {
                        caller: hop.service.name,
                        callee,
                    },
                    breaker,
                )
            }));
            servers.spawn(service.serving);
        }
        Ok(Self {
            addresses: ByListener(addresses),
            databases,
            admin_token,
            bank,
            counters: ByListener(counters),
            breakers,
            bank_bulkhead,
            gateway_retry,
            client_limits,
            tokens,
            shutdown,
            servers,
            dev_certs,
            naive: settings.naive.enabled,
        })
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

    /// The breakers and the bank's bulkhead.
    pub fn guard_stats(&self) -> ChainGuardStats {
        ChainGuardStats {
            breakers: self
                .breakers
                .iter()
                .map(|(edge, breaker)| (*edge, breaker.stats()))
                .collect(),
            bank_bulkhead: self.bank_bulkhead.stats(),
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

    /// The deadline counters of every hop, as they stand.
    pub fn hop_stats(&self) -> ChainHopStats {
        ByListener(
            self.counters
                .0
                .iter()
                .map(|(listener, counters)| (*listener, counters.snapshot()))
                .collect(),
        )
    }

    /// Stops one service (by its hop name, e.g. `"orders"`, or [`WEBHOOK_SENDER`]), leaving the
    /// others running.
    /// Returns whether a service has that name.
    pub fn stop_service(&self, hop: &str) -> bool {
        self.tokens
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
    let served: Vec<_> = HOPS
        .iter()
        .filter_map(|hop| Some((hop.service.name, hop.tls?)))
        .collect();
    if settings.plaintext {
        for (_, tls) in &served {
            *tls(settings) = TlsSettings {
                plaintext: true,
                ..TlsSettings::default()
            };
        }
        return Ok(None);
    }
    if served
        .iter()
        .any(|(_, tls)| *tls(settings) != TlsSettings::default())
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
        assert!(listeners().all(|listener| (listener.setting)(&mut ephemeral).port() == 0));
    }

    /// Each row binds every listener it lists, counts the requests of every listener that others
    /// call, and names the hops its breakers guard.
    #[tokio::test]
    async fn every_row_hands_over_what_it_lists() {
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
            listeners()
                .map(|listener| (listener.key, true))
                .collect::<Vec<_>>()
        );
        let counters = chain.hop_stats();
        for listener in listeners().filter(|listener| !listener.callers.is_empty()) {
            assert!(
                counters.get(listener).is_some(),
                "{} is counted",
                listener.key
            );
        }
        let hops: Vec<_> = HOPS.iter().map(|hop| hop.service.name).collect();
        for (edge, _) in chain.guard_stats().breakers() {
            assert!(
                hops.contains(&edge.caller) && hops.contains(&edge.callee),
                "{edge}"
            );
        }
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
