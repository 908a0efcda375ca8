//! The docker-compose stack, built and run for real: images built offline (static binaries in
//! `FROM scratch` images, nothing pulled), the four services healthy, an order through the
//! published gateway port, the fault drills of `deploy/drills.sh`, and the stack's containers,
//! network and volumes removed at the end, whatever happened (the images are kept for the next run). Without a Docker engine it says so loudly and does nothing.

use std::{
    io::Write,
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

const SERVICES: [&str; 4] = ["gateway", "orders", "payment", "bank-mock"];
const IMAGE_PREFIX: &str = "chain";
const IMAGE_TAG: &str = "compose-test";
const ADMIN_TOKEN: &str = "compose-test-token";

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned()
}

/// Written past the test harness's capture, so that it shows when tests pass.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

fn run(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|error| panic!("{command:?}: {error}"));
    assert!(output.status.success(), "{command:?} failed:\n{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    output
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program).args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|status| status.success())
}

/// How Compose is called here: `docker compose` (v2) or `docker-compose` (v1); `None` without a
/// Docker engine that answers or without Compose.
fn compose_program() -> Option<&'static [&'static str]> {
    if !succeeds("docker", &["info"]) {
        return None;
    }
    [&["docker", "compose"][..], &["docker-compose"][..]].into_iter().find(|program| succeeds(program[0], &[&program[1..], &["version"][..]].concat()))
}

fn compose_command(program: &[&str]) -> Command {
    let mut command = Command::new(program[0]);
    command.args(&program[1..]);
    command
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("bound").port()
}

/// The test stack, taken down with its volumes and network when dropped (also on failure).
struct Stack {
    program: &'static [&'static str],
    project: String,
    gateway_port: u16,
    admin_port: u16,
}

impl Stack {
    fn compose(&self) -> Command {
        let mut command = compose_command(self.program);
        command
            .arg("-p")
            .arg(&self.project)
            .arg("-f")
            .arg(root().join("tests/compose/compose.yaml"))
            .env("GATEWAY_HTTP_PORT", self.gateway_port.to_string())
            .env("BANK_ADMIN_PORT", self.admin_port.to_string())
            .env("BANK_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("IMAGE_PREFIX", IMAGE_PREFIX)
            .env("IMAGE_TAG", IMAGE_TAG);
        command
    }

    fn health(&self, service: &str) -> String {
        let id = String::from_utf8(run(self.compose().args(["ps", "--all", "-q", service])).stdout).expect("utf-8");
        let output = Command::new("docker").args(["inspect", "-f", "{{.State.Health.Status}}", id.trim()]).output().expect("docker inspect");
        String::from_utf8_lossy(&output.stdout).trim().to_owned()
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        let _ = self.compose().args(["down", "--volumes", "--remove-orphans", "--timeout", "5"]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_compose_stack_builds_offline_serves_and_survives_the_drills() {
    let Some(program) = compose_program() else {
        say("SKIPPED: no Docker engine with Compose answers here; the compose stack was not built or tested");
        return;
    };
    // The users' stack file is valid (its PostgreSQL and Jaeger images cannot be had here).
    run(compose_command(program).current_dir(root().join("deploy")).args(["config", "--quiet"]));

    let build = Command::new("bash")
        .arg(root().join("deploy/build-images.sh"))
        .args(["--from-host", "--with-test-receiver", "--tag", IMAGE_TAG])
        .env("IMAGE_PREFIX", IMAGE_PREFIX)
        .status()
        .expect("build-images.sh runs");
    assert!(build.success(), "the images build offline");

    let stack = Stack { program, project: format!("chain-test-{}", std::process::id()), gateway_port: free_port(), admin_port: free_port() };
    let started = Instant::now();
    run(stack.compose().args(["up", "--detach", "--no-build"]));
    while SERVICES.iter().any(|service| stack.health(service) != "healthy") {
        assert!(started.elapsed() < Duration::from_secs(120), "healthy within 2 minutes: {:?}", SERVICES.map(|s| (s, stack.health(s))));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    say(&format!("compose stack: up to all healthy in {:.1} s", started.elapsed().as_secs_f64()));

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
    let ledger = response.headers()["x-deadline-ledger"].to_str().unwrap().to_owned();
    for hop in SERVICES {
        assert!(ledger.contains(&format!("{hop};received=")), "{hop} in {ledger}");
    }
    // Its trace reached the collector of the stack.
    let trace_id = response.headers()["traceparent"].to_str().unwrap().split('-').nth(1).expect("a trace id").to_owned();
    let exported = async {
        loop {
            let logs = String::from_utf8_lossy(&run(stack.compose().args(["logs", "--no-color", "otlp-receiver"])).stdout).into_owned();
            if SERVICES.iter().all(|service| logs.contains(&format!("trace_id={trace_id} service={service} "))) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), exported).await.expect("every service exported its spans of the trace");

    // The fault drills, as a user runs them.
    let compose = format!("{} -p {} -f {}", program.join(" "), stack.project, root().join("tests/compose/compose.yaml").display());
    let drills = Command::new("bash")
        .arg(root().join("deploy/drills.sh"))
        .arg("all")
        .env("COMPOSE", compose)
        .env("GATEWAY_HTTP_PORT", stack.gateway_port.to_string())
        .env("BANK_ADMIN_PORT", stack.admin_port.to_string())
        .env("BANK_ADMIN_TOKEN", ADMIN_TOKEN)
        .env("IMAGE_TAG", IMAGE_TAG)
        .output()
        .expect("drills.sh runs");
    let report = String::from_utf8_lossy(&drills.stdout);
    say(&report);
    assert!(drills.status.success(), "every drill passes:\n{report}{}", String::from_utf8_lossy(&drills.stderr));

    for service in SERVICES {
        let size = run(Command::new("docker").args(["image", "inspect", "-f", "{{.Size}}", &format!("{IMAGE_PREFIX}/{service}:{IMAGE_TAG}")])).stdout;
        say(&format!("image {IMAGE_PREFIX}/{service}:{IMAGE_TAG}: {} bytes", String::from_utf8_lossy(&size).trim()));
    }
}
