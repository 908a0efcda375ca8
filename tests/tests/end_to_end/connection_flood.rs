//! Connections that cannot be held: 20,000 idle connections that answer pings, from one address,
//! against the public HTTP port of a chain limited to 1,024 descriptors, leave a new client from
//! the same address served and every other port answering; and a caller without a certificate
//! keeps a place on an inner port only for its handshake's time.

use std::{
    collections::HashMap,
    io::{BufRead, BufReader},
    net::SocketAddr,
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use e2e::{TestChain, order_body};
use rpc::{dev_certs::DevCerts, tls::ServiceTls};
use rustls::pki_types::{CertificateDer, pem::PemObject};
use stack::chain::{
    BANK_ADMIN, BANK_GRPC, GATEWAY_GRPC, GATEWAY_HTTP, GATEWAY_OPS, Listener, ORDERS_GRPC,
    PAYMENT_GRPC, WEBHOOK_SENDER_HEALTH,
};
use tokio::{io::AsyncReadExt, net::TcpStream, sync::mpsc};

/// What many container runtimes give a process.
const DESCRIPTORS: u64 = 1_024;
const FLOOD: usize = 20_000;
/// Two processes: one may not hold more descriptors than its hard limit (20,000 where this was
/// written), and each raises its own soft limit or stops the test saying why.
const FLOODERS: usize = 2;
/// How long the flood may take to make its connections.
const OPENING_WITHIN: Duration = Duration::from_secs(60);
/// How long the flood holds its connections once made.
const HOLD: Duration = Duration::from_secs(60);
/// A new client's order is placed within this, flood or not.
const ORDER_WITHIN: Duration = Duration::from_secs(2);
/// Every other port answers within this.
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

/// What the limited chain's line saying that it serves begins with.
const READY: &str = "serving ";

/// The chain in a process of its own, `stack up` with its descriptors limited.
struct LimitedChain {
    child: Child,
    addresses: HashMap<String, SocketAddr>,
    certs: DevCerts,
    admin_token: String,
}

impl LimitedChain {
    async fn start(descriptors: u64) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_limited-chain"))
            .arg(descriptors.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the limited chain starts");
        // Its logs go to the test's output; its line saying it serves, here.
        let (send, mut ready) = mpsc::unbounded_channel();
        let output = BufReader::new(child.stdout.take().unwrap());
        std::thread::spawn(move || {
            for line in output.lines().map_while(Result::ok) {
                match line.strip_prefix(READY) {
                    Some(ready) => drop(send.send(ready.to_owned())),
                    None => eprintln!("{line}"),
                }
            }
        });
        let line = tokio::time::timeout(Duration::from_secs(30), ready.recv())
            .await
            .expect("the limited chain serves in time")
            .expect("it serves: its error is above");
        let ready: serde_json::Value =
            serde_json::from_str(&line).unwrap_or_else(|error| panic!("{error}: {line}"));
        let addresses = serde_json::from_value(ready["addresses"].clone()).unwrap();
        let certs =
            DevCerts::generate_once(&PathBuf::from(ready["certs"].as_str().unwrap())).unwrap();
        Self {
            child,
            addresses,
            certs,
            admin_token: ready["admin_token"].as_str().unwrap().to_owned(),
        }
    }

    fn address(&self, listener: &Listener) -> SocketAddr {
        self.addresses[listener.key]
    }

    /// The descriptors the chain's process has open.
    fn descriptors(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.child.id())).map_or(0, Iterator::count)
    }

    /// The chain's resident memory, in KiB.
    fn resident_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix("VmRSS:"))
            .and_then(|kib| kib.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    /// A new client (a connection of its own, from 127.0.0.1) places an order; how long it took.
    async fn order(&self, key: &str) -> Duration {
        let started = Instant::now();
        let client = reqwest::Client::builder()
            .timeout(ORDER_WITHIN * 5)
            .build()
            .unwrap();
        let response = client
            .post(format!("http://{}/v1/orders", self.address(&GATEWAY_HTTP)))
            .bearer_auth(e2e::API_KEY)
            .header("idempotency-key", key)
            .json(&order_body())
            .send()
            .await
            .unwrap_or_else(|error| panic!("order {key}: {error}"));
        assert_eq!(
            response.status(),
            201,
            "order {key}: {}",
            response.text().await.unwrap_or_default()
        );
        started.elapsed()
    }

    /// Every port but the public HTTP one answers (its health service, `/metrics`, the bank's
    /// admin API); the longest it took.
    async fn every_other_port_answers(&self) -> Duration {
        let started = Instant::now();
        rpc::health::check(self.address(&GATEWAY_GRPC), ANSWER_WITHIN)
            .await
            .unwrap();
        for (service, listener) in [
            ("orders", ORDERS_GRPC),
            ("payment", PAYMENT_GRPC),
            ("bank-mock", BANK_GRPC),
        ] {
            let tls = ServiceTls::load(service, &self.certs.settings(service)).unwrap();
            rpc::health::check_as(self.address(&listener), service, &tls, ANSWER_WITHIN)
                .await
                .unwrap_or_else(|error| panic!("{service}: {error}"));
        }
        let http = reqwest::Client::builder()
            .timeout(ANSWER_WITHIN)
            .build()
            .unwrap();
        for listener in [GATEWAY_OPS, WEBHOOK_SENDER_HEALTH] {
            let response = http
                .get(format!("http://{}/metrics", self.address(&listener)))
                .send()
                .await;
            assert_eq!(
                response
                    .unwrap_or_else(|error| panic!("{}: {error}", listener.label))
                    .status(),
                200,
                "{}",
                listener.label
            );
        }
        let stats = http
            .get(format!("http://{}/admin/stats", self.address(&BANK_ADMIN)))
            .header("x-admin-token", &self.admin_token)
            .send()
            .await;
        assert_eq!(stats.expect("the bank's admin API answers").status(), 200);
        started.elapsed()
    }
}

impl Drop for LimitedChain {
    fn drop(&mut self) {
        // Its standard input closed, it stops; killed if it has not within the bound.
        drop(self.child.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One flood helper process, and the lines it reports.
struct Flooder {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
}

impl Flooder {
    fn start(to: SocketAddr, count: usize) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idle-flood"))
            .args([to.to_string(), count.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the flood helper starts");
        let (stdin, output) = (
            child.stdin.take(),
            BufReader::new(child.stdout.take().unwrap()),
        );
        let (send, lines) = mpsc::unbounded_channel();
        // Bounded by the helper: its output ends with it.
        std::thread::spawn(move || {
            output
                .lines()
                .map_while(Result::ok)
                .try_for_each(|line| send.send(line))
        });
        Self {
            child,
            stdin,
            lines,
        }
    }

    /// The two numbers of a `<word> <n> <word> <m>` line.
    fn numbers(line: &str) -> (usize, usize) {
        let numbers: Vec<usize> = line
            .split_whitespace()
            .skip(1)
            .step_by(2)
            .map(|n| n.parse().unwrap())
            .collect();
        let [first, second] = numbers[..] else {
            panic!("a flood helper's report: {line:?}")
        };
        (first, second)
    }

    /// Connections opened and failed, once the helper has tried them all.
    fn opened(&mut self) -> Option<(usize, usize)> {
        self.lines.try_recv().ok().map(|line| Self::numbers(&line))
    }

    /// Lets the connections go: how many the server had closed, and the pings answered.
    async fn end(&mut self) -> (usize, usize) {
        drop(self.stdin.take());
        let line = tokio::time::timeout(Duration::from_secs(10), self.lines.recv())
            .await
            .expect("the helper's last report in time");
        Self::numbers(&line.expect("the helper reports before it ends: its error is above"))
    }
}

impl Drop for Flooder {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What rounds of checks measured: each a new client's order, then every other port.
#[derive(Default)]
struct Rounds {
    orders: Vec<Duration>,
    slowest_answer: Duration,
}

impl Rounds {
    /// One round; how long its order took.
    async fn round(&mut self, chain: &LimitedChain, name: &str) -> Duration {
        let took = chain.order(&format!("{name}-{}", self.orders.len())).await;
        self.orders.push(took);
        self.slowest_answer = self
            .slowest_answer
            .max(chain.every_other_port_answers().await);
        took
    }

    fn summary(&mut self) -> String {
        self.orders.sort();
        let (median, slowest) = (
            self.orders[self.orders.len() / 2],
            self.orders[self.orders.len() - 1],
        );
        format!(
            "{} orders (median {median:?}, slowest {slowest:?}), other ports within {:?}",
            self.orders.len(),
            self.slowest_answer
        )
    }
}

/// Connections the kernel has queued on the listener at 127.0.0.1:`port` that its server has not
/// accepted yet (`None`: no such listener).
fn accept_queue(port: u16) -> Option<usize> {
    let table = std::fs::read_to_string("/proc/net/tcp").ok()?;
    let local = format!("0100007F:{port:04X}");
    table.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let listening = fields.get(1) == Some(&local.as_str()) && fields.get(3) == Some(&"0A");
        listening
            .then(|| usize::from_str_radix(fields.get(4)?.split(':').nth(1)?, 16).ok())
            .flatten()
    })
}

#[tokio::test]
async fn twenty_thousand_idle_connections_that_answer_pings_leave_a_limited_process_serving() {
    let chain = Arc::new(LimitedChain::start(DESCRIPTORS).await);
    let public = chain.address(&GATEWAY_HTTP);
    // Once before, so that the chain's pools and channels are as they will be.
    Rounds::default().round(&chain, "before-the-flood").await;
    let (descriptors_before, rss_before) = (chain.descriptors(), chain.resident_kib());

    let started = Instant::now();
    let mut flooders: Vec<Flooder> = (0..FLOODERS)
        .map(|_| Flooder::start(public, FLOOD / FLOODERS))
        .collect();
    // The chain's descriptors, sampled all along.
    let most_descriptors = Arc::new(AtomicUsize::new(descriptors_before));
    let sampling = {
        let (chain, most) = (chain.clone(), most_descriptors.clone());
        tokio::spawn(async move {
            // Bounded: stopped at the end of the test, and in time.
            while started.elapsed() < OPENING_WITHIN + HOLD * 2 {
                most.fetch_max(chain.descriptors(), Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };

    // While the flood's connections are made, orders are placed, however long the kernel's queue
    // of the flood's connections they wait in (a connection-rate contest, not this test's).
    let (mut opening, mut made, mut reported) = (Rounds::default(), 0, 0);
    // Bounded: every connection is tried within OPENING_WITHIN.
    while reported < FLOODERS {
        assert!(
            started.elapsed() < OPENING_WITHIN,
            "the flood's connections were tried within {OPENING_WITHIN:?}"
        );
        opening.round(&chain, "while-the-flood-opens").await;
        for (opened, failed) in flooders.iter_mut().filter_map(Flooder::opened) {
            assert_eq!(failed, 0, "every connection of the flood was made");
            (made, reported) = (made + opened, reported + 1);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let opened_after = started.elapsed();
    assert_eq!(made, FLOOD);
    // Bounded: 150 looks. Each reads the kernel's table of 20,000 connections: not every 10 ms.
    for _ in 0..150 {
        if accept_queue(public.port()) == Some(0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(
        accept_queue(public.port()),
        Some(0),
        "the chain accepted every connection the kernel had queued"
    );

    // The flood holds its connections: a new client from its address gets its order in time.
    let (mut holding, held_from) = (Rounds::default(), Instant::now());
    // Bounded by the hold.
    while held_from.elapsed() < HOLD {
        let took = holding.round(&chain, "while-the-flood-holds").await;
        assert!(
            took < ORDER_WITHIN,
            "{:?} into the hold: the order took {took:?}",
            held_from.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let rss_flooded = chain.resident_kib();

    let (mut closed, mut pings) = (0, 0);
    for flooder in &mut flooders {
        let (closed_by_server, answered) = flooder.end().await;
        closed += closed_by_server;
        pings += answered;
    }
    sampling.abort();
    let most_descriptors = most_descriptors.load(Ordering::SeqCst);
    eprintln!(
        "flood of {FLOOD} from 127.0.0.1: all made {opened_after:?} after its start, meanwhile {}; then held {HOLD:?}: {}; \
         {closed} of its connections closed by the chain, {pings} pings answered by them; the chain's descriptors {descriptors_before} before, \
         at most {most_descriptors} (limit {DESCRIPTORS}); its resident memory {rss_before} KiB before, {rss_flooded} KiB after",
        opening.summary(),
        holding.summary(),
    );
    assert!(pings > 0, "the kept connections were pinged and answered");
    assert_eq!(
        closed, FLOOD,
        "the chain closed every connection of the flood (those it kept after the idle timeout)"
    );
}

/// A TLS client without a certificate to `service` at `address`, its handshake done.
async fn uncertified(
    certs: &DevCerts,
    service: &str,
    address: SocketAddr,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    let ca = std::fs::read(certs.ca()).unwrap();
    for cert in CertificateDer::pem_slice_iter(&ca) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from(rpc::tls::dns_name(service)).unwrap();
    let tcp = TcpStream::connect(address).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the handshake completes without a certificate")
}

#[tokio::test]
async fn a_caller_without_a_certificate_holds_an_inner_port_only_for_its_handshake_time() {
    /// The inner servers' handshake time limit.
    const HANDSHAKE: Duration = Duration::from_secs(5);
    let test = TestChain::start_with(|s| s.orders.connections.max_open = 4).await;
    let orders = test.chain.address(&ORDERS_GRPC);
    let started = Instant::now();
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(uncertified(test.certs(), "orders", orders).await);
    }
    // The port is full of them; the gateway's connection to orders takes the place of one.
    assert_eq!(
        test.post_order("past-the-uncertified", &order_body())
            .send()
            .await
            .unwrap()
            .status(),
        201
    );
    for mut stream in held {
        let mut buffer = [0u8; 64];
        let end = tokio::time::timeout(HANDSHAKE * 2, stream.read(&mut buffer)).await;
        assert!(
            matches!(end, Ok(Ok(0) | Err(_))),
            "closed, not kept until the idle timeout: {end:?}"
        );
    }
    let took = started.elapsed();
    assert!(
        took < HANDSHAKE + Duration::from_secs(2),
        "every one closed by the end of its handshake's time: {took:?}"
    );
}
