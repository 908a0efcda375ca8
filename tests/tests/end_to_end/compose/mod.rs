//! The users' docker-compose stack, `deploy/compose.yaml`, built and run for real with nothing
//! pulled: the service images built offline (static binaries in `FROM scratch` images), PostgreSQL
//! from an image built offline from Debian's packages (`tests/compose/postgres`, named through
//! `POSTGRES_IMAGE`), and, since Jaeger cannot be had here, the test kit's OTLP receiver in its
//! place (`tests/compose/compose.yaml`). The services healthy, an order through the published
//! gateway port and its trace, its webhook delivered to the example receiver by a sender that
//! cannot reach the chain's services, the fault drills of `deploy/drills.sh` (PostgreSQL's restart
//! among them), and the stack's containers, networks and volumes removed at the end, whatever
//! happened (the images are kept for the next run). Without a Docker engine with Compose it fails
//! in CI, and elsewhere says so loudly and does nothing.
//!
//! [`replicas`] runs the same stack, from the same images, with two replicas of every service
//! but the bank and PostgreSQL.

mod replicas;

use std::{
    io::Write,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use e2e::eventually;

/// The chain's hops: each answers in the ledger and exports spans.
const HOPS: [&str; 4] = ["gateway", "orders", "payment", "bank-mock"];
/// Every service with a health check.
const SERVICES: [&str; 6] = [
    "postgres",
    "gateway",
    "orders",
    "payment",
    "bank-mock",
    "webhook-sender",
];
/// Every image of the chain.
const IMAGES: [&str; 6] = [
    "gateway",
    "orders",
    "payment",
    "bank-mock",
    "webhook-sender",
    "webhook-receiver",
];
const IMAGE_PREFIX: &str = "chain";
const IMAGE_TAG: &str = "compose-test";
const ADMIN_TOKEN: &str = "compose-test-token";
/// PostgreSQL built offline by `tests/compose/postgres/build-image.sh`, kept between runs.
const POSTGRES_IMAGE: &str = "chain-test/postgres:bookworm";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned()
}

/// Written past the test harness's capture, so that it shows when tests pass.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// How Compose is called here: `docker compose` (v2) or `docker-compose` (v1); `None` without a
/// Docker engine that answers or without Compose.
fn compose_program() -> Option<&'static [&'static str]> {
    if !succeeds("docker", &["info"]) {
        return None;
    }
    [&["docker", "compose"][..], &["docker-compose"][..]]
        .into_iter()
        .find(|program| succeeds(program[0], &[&program[1..], &["version"][..]].concat()))
}

fn compose_command(program: &[&str]) -> Command {
    let mut command = Command::new(program[0]);
    command.args(&program[1..]);
    command
}

/// `deploy/compose.yaml` with the test's one change (the OTLP receiver for Jaeger), then
/// `overlays` (paths from the workspace root), as one argument list for Compose.
fn compose_files(overlays: &[&str]) -> Vec<PathBuf> {
    ["deploy/compose.yaml", "tests/compose/compose.yaml"]
        .iter()
        .chain(overlays)
        .map(|file| root().join(file))
        .collect()
}

/// The images of the stack, built offline: the first run builds them, later runs (and the other
/// compose test) find them built.
fn build_images() {
    build(
        "the service images",
        &root().join("deploy/build-images.sh"),
        &["--from-host", "--with-test-receiver", "--tag", IMAGE_TAG],
    );
    build(
        "the PostgreSQL image",
        &root().join("tests/compose/postgres/build-image.sh"),
        &[POSTGRES_IMAGE],
    );
}

/// Runs `program` with `args`, saying how long it took.
fn build(what: &str, program: &Path, args: &[&str]) {
    let started = Instant::now();
    let status = Command::new("bash")
        .arg(program)
        .args(args)
        .env("IMAGE_PREFIX", IMAGE_PREFIX)
        .status()
        .unwrap_or_else(|error| panic!("{program:?}: {error}"));
    assert!(status.success(), "{what} builds offline");
    say(&format!(
        "compose stack: {what} ready in {:.1} s",
        started.elapsed().as_secs_f64()
    ));
}

/// The test stack, taken down with its volumes and networks when dropped (also on failure).
struct Stack {
    program: &'static [&'static str],
    project: String,
    files: Vec<PathBuf>,
    /// The host ports Docker chose for the gateway's HTTP face and the bank's admin API, once up.
    gateway_port: u16,
    admin_port: u16,
}

impl Stack {
    /// The stack of `files` (see [`compose_files`]), not started yet: ports are asked once it is.
    fn new(program: &'static [&'static str], files: Vec<PathBuf>) -> Self {
        Self {
            program,
            project: format!("chain-test-{}", std::process::id()),
            files,
            gateway_port: 0,
            admin_port: 0,
        }
    }

    fn compose(&self) -> Command {
        let mut command = compose_command(self.program);
        command.arg("-p").arg(&self.project);
        for file in &self.files {
            command.arg("-f").arg(file);
        }
        // Run in deploy/, whose .env the users' file reads (the settings below win over it);
        // port 0: Docker chooses free ports (the test asks which).
        command
            .current_dir(root().join("deploy"))
            .env("BANK_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("IMAGE_PREFIX", IMAGE_PREFIX)
            .env("IMAGE_TAG", IMAGE_TAG)
            .env("POSTGRES_IMAGE", POSTGRES_IMAGE)
            .envs(
                [
                    "GATEWAY_HTTP_PORT",
                    "GATEWAY_GRPC_PORT",
                    "BANK_ADMIN_PORT",
                    "JAEGER_UI_PORT",
                ]
                .map(|port| (port, "0")),
            );
        command
    }

    /// The host port Docker published `service`'s `port` on (chosen by Docker: see `compose`), on
    /// its replica `index` (from 1).
    fn published_port(&self, service: &str, port: u16, index: usize) -> u16 {
        let output = String::from_utf8(
            run(self.compose().args([
                "port",
                &format!("--index={index}"),
                service,
                &port.to_string(),
            ]))
            .stdout,
        )
        .expect("utf-8");
        let (_, port) = output
            .trim()
            .rsplit_once(':')
            .unwrap_or_else(|| panic!("{service}:{port} is published: {output:?}"));
        port.parse()
            .unwrap_or_else(|_| panic!("a port number: {output:?}"))
    }

    fn container(&self, service: &str) -> String {
        let containers = self.containers(service);
        assert_eq!(containers.len(), 1, "one container of {service}");
        containers.into_iter().next().expect("one container")
    }

    /// The ids of `service`'s containers, in the order of their replica numbers.
    fn containers(&self, service: &str) -> Vec<String> {
        let ids =
            String::from_utf8(run(self.compose().args(["ps", "--all", "-q", service])).stdout)
                .expect("utf-8");
        let mut numbered: Vec<(u32, String)> = ids
            .split_whitespace()
            .map(|id| {
                let number = docker_inspect(
                    id,
                    r#"{{index .Config.Labels "com.docker.compose.container-number"}}"#,
                );
                (
                    number
                        .parse()
                        .unwrap_or_else(|_| panic!("a replica number: {number:?}")),
                    id.to_owned(),
                )
            })
            .collect();
        numbered.sort();
        numbered.into_iter().map(|(_, id)| id).collect()
    }

    /// Whether every container of `service` is healthy (and there is one).
    fn healthy(&self, service: &str) -> bool {
        let containers = self.containers(service);
        !containers.is_empty()
            && containers
                .iter()
                .all(|id| docker_inspect(id, "{{.State.Health.Status}}") == "healthy")
    }

    /// Whether the webhook sender's own health check passes when pointed at `addr`.
    fn sender_reaches(&self, addr: &str) -> bool {
        Command::new("docker")
            .args([
                "exec",
                "-e",
                &format!("WEBHOOK_SENDER_LISTEN={addr}"),
                &self.container("webhook-sender"),
                "/service",
                "healthcheck",
                "--timeout-ms",
                "2000",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("docker exec")
            .success()
    }
}

/// `docker inspect -f format id`, trimmed; empty when it fails (a container gone).
fn docker_inspect(id: &str, format: &str) -> String {
    let output = Command::new("docker")
        .args(["inspect", "-f", format, id])
        .output()
        .expect("docker inspect");
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self
            .compose()
            .args(["down", "--volumes", "--remove-orphans", "--timeout", "5"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_stack_builds_offline_serves_and_survives_the_drills() {
    let Some(program) = compose_program() else {
        e2e::missing(
            "a Docker engine with Compose",
            "the compose stack was not built or tested",
        );
        return;
    };
    build_images();

    let mut stack = Stack::new(program, compose_files(&[]));
    let started = Instant::now();
    run(stack.compose().args(["up", "--detach", "--no-build"]));
    (stack.gateway_port, stack.admin_port) = (
        stack.published_port("gateway", 8080, 1),
        stack.published_port("bank-mock", 8099, 1),
    );
    eventually(
        Duration::from_secs(120),
        "every service healthy",
        || async { SERVICES.iter().all(|service| stack.healthy(service)) },
    )
    .await;
    say(&format!(
        "compose stack: up to all healthy in {:.1} s",
        started.elapsed().as_secs_f64()
    ));

    // One order through the published port: paid, with each hop's slice of the deadline.
    let http = reqwest::Client::new();
    let response = http
        .post(format!("http://127.0.0.1:{}/v1/orders", stack.gateway_port))
        .bearer_auth("demo-key-1")
        .header("idempotency-key", "compose-1")
        .json(&serde_json::json!({"customer_id": "c-1", "items": [{"sku": "sku-1", "quantity": 2}], "amount_minor": 1299, "currency": "EUR"}))
        .send()
        .await
        .expect("the gateway answers on its published port");
    assert_eq!(response.status(), 201);
    let ledger = response.headers()["x-deadline-ledger"]
        .to_str()
        .unwrap()
        .to_owned();
    for hop in HOPS {
        assert!(
            ledger.contains(&format!("{hop};received=")),
            "{hop} in {ledger}"
        );
    }
    // Its trace reached the stack's collector: the OTLP receiver in Jaeger's place.
    let trace_id = response.headers()["traceparent"]
        .to_str()
        .unwrap()
        .split('-')
        .nth(1)
        .expect("a trace id")
        .to_owned();
    eventually(
        Duration::from_secs(30),
        "every service exported its spans of the trace",
        || async {
            let logs = String::from_utf8_lossy(
                &run(stack.compose().args(["logs", "--no-color", "jaeger"])).stdout,
            )
            .into_owned();
            HOPS.iter()
                .all(|service| logs.contains(&format!("trace_id={trace_id} service={service} ")))
        },
    )
    .await;

    webhooks_leave_the_stack_only_through_the_sender(&stack, &http).await;

    // The fault drills, as a user runs them (PostgreSQL's restart among them).
    let files = stack
        .files
        .iter()
        .map(|file| format!("-f {}", file.display()))
        .collect::<Vec<_>>()
        .join(" ");
    let compose = format!("{} -p {} {files}", program.join(" "), stack.project);
    let drills = Command::new("bash")
        .arg(root().join("deploy/drills.sh"))
        .arg("all")
        .env("COMPOSE", compose)
        .env("GATEWAY_HTTP_PORT", stack.gateway_port.to_string())
        .env("BANK_ADMIN_PORT", stack.admin_port.to_string())
        .env("BANK_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("IMAGE_PREFIX", IMAGE_PREFIX)
        .env("IMAGE_TAG", IMAGE_TAG)
        .env("POSTGRES_IMAGE", POSTGRES_IMAGE)
        .output()
        .expect("drills.sh runs");
    let report = String::from_utf8_lossy(&drills.stdout);
    say(&report);
    assert!(
        drills.status.success(),
        "every drill passes:\n{report}{}",
        String::from_utf8_lossy(&drills.stderr)
    );

    for image in IMAGES
        .map(|service| format!("{IMAGE_PREFIX}/{service}:{IMAGE_TAG}"))
        .into_iter()
        .chain([POSTGRES_IMAGE.to_owned()])
    {
        let size =
            run(Command::new("docker").args(["image", "inspect", "-f", "{{.Size}}", &image]))
                .stdout;
        say(&format!(
            "image {image}: {} bytes",
            String::from_utf8_lossy(&size).trim()
        ));
    }
}

/// An endpoint for the example receiver, a paid order, and its event printed by the receiver;
/// the sender's networks have no route to the chain's services.
async fn webhooks_leave_the_stack_only_through_the_sender(stack: &Stack, http: &reqwest::Client) {
    let gateway = format!("http://127.0.0.1:{}", stack.gateway_port);
    let endpoint = serde_json::json!({"url": "http://webhook-receiver:9000/webhooks", "event_types": ["order.paid"]});
    let created = http
        .post(format!("{gateway}/v1/webhooks/endpoints"))
        .bearer_auth("demo-key-1")
        .header("idempotency-key", "compose-endpoint")
        .json(&endpoint)
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201, "the endpoint is created");
    let created: serde_json::Value = created.json().await.unwrap();
    let secret = created["secret"].as_str().expect("a secret").to_owned();
    run(stack.compose().env("WEBHOOK_SECRET", &secret).args([
        "--profile",
        "webhooks",
        "up",
        "--detach",
        "--no-build",
        "webhook-receiver",
    ]));

    let order = http
        .post(format!("{gateway}/v1/orders"))
        .bearer_auth("demo-key-1")
        .header("idempotency-key", "compose-webhook")
        .json(&serde_json::json!({"customer_id": "c-2", "items": [{"sku": "sku-2", "quantity": 1}], "amount_minor": 500, "currency": "EUR"}))
        .send()
        .await
        .unwrap();
    assert_eq!(order.status(), 201);
    let order_id = order.json::<serde_json::Value>().await.unwrap()["order_id"]
        .as_str()
        .expect("an order id")
        .to_owned();
    let started = Instant::now();
    eventually(
        Duration::from_secs(30),
        "the receiver printed the order.paid event of the order",
        || async {
            let logs = String::from_utf8_lossy(
                &run(stack
                    .compose()
                    .args(["logs", "--no-color", "webhook-receiver"]))
                .stdout,
            )
            .into_owned();
            logs.lines()
                .any(|line| line.contains("\"order.paid\"") && line.contains(&order_id))
        },
    )
    .await;
    say(&format!(
        "compose stack: order.paid of {order_id} printed by the receiver {:.1} s after the order",
        started.elapsed().as_secs_f64()
    ));

    // The health check reaches the sender itself, and nothing of the chain: its networks have no
    // route to the chain's network. The probe is the gateway's gRPC port, which answers a plain
    // health check from anyone (the inner ports would refuse the sender for want of a
    // certificate, route or not).
    assert!(
        stack.sender_reaches("127.0.0.1:50055"),
        "the sender's own health check passes"
    );
    let gateway_ip = run(Command::new("docker").args([
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        &stack.container("gateway"),
    ]))
    .stdout;
    let gateway_ip = String::from_utf8_lossy(&gateway_ip)
        .split_whitespace()
        .next()
        .expect("the gateway has an address")
        .to_owned();
    assert!(
        !stack.sender_reaches(&format!("{gateway_ip}:50051")),
        "the sender reaches the gateway at {gateway_ip}:50051"
    );
    say(&format!(
        "compose stack: the webhook sender has no route to the chain's network (gateway at {gateway_ip}:50051)"
    ));
}
