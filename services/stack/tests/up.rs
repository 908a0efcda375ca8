//! `stack up` as a user runs it: the binary starts the chain, prints where it listens, serves the
//! README's request with one SQLite writer per database file, and stops on SIGTERM.

mod common;

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    time::Duration,
};

#[tokio::test]
async fn up_serves_the_readme_request_and_stops_on_sigterm() {
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_stack"))
        .arg("up")
        .arg("--data-dir")
        .arg(data.path())
        .args(
            common::every_listener_on_a_free_port()
                .into_iter()
                .flat_map(|value| ["--set".to_owned(), value]),
        )
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("stack binary starts");

    // The banner, after whatever the ports logged while they started (logs go to stdout too).
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let before_banner: Vec<String> = lines
        .by_ref()
        .take(50)
        .map_while(Result::ok)
        .take_while(|line| !line.starts_with("gateway → orders → payment → bank-mock"))
        .collect();
    assert!(
        before_banner.len() < 50 && before_banner.iter().all(|line| line.contains(" INFO ")),
        "only start-up logs before the banner: {before_banner:?}"
    );
    let gateway = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            line.trim()
                .strip_prefix("gateway HTTP")
                .map(|rest| rest.trim().to_owned())
        })
        .expect("the gateway address is printed");

    let client = reqwest::Client::new();
    let response = client
        .post(format!("{gateway}/v1/orders"))
        .bearer_auth("demo-key-1")
        .header("idempotency-key", "order-1")
        .json(&serde_json::json!({"customer_id": "c-1", "items": [{"sku": "sku-1", "quantity": 2}], "amount_minor": 1299, "currency": "EUR"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    assert_eq!(
        response.headers()["x-deadline-ledger"]
            .to_str()
            .unwrap()
            .split(", ")
            .count(),
        4
    );
    let order: serde_json::Value = response.json().await.unwrap();
    let fetched = client
        .get(format!(
            "{gateway}/v1/orders/{}",
            order["order_id"].as_str().unwrap()
        ))
        .bearer_auth("demo-key-1")
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 200);

    // One writer per SQLite file: orders and the webhook sender share orders.db's, payment has
    // payment.db's. Each is a thread of the process named by `storage`.
    let writers = std::fs::read_dir(format!("/proc/{}/task", child.id()))
        .unwrap()
        .filter(|task| {
            std::fs::read_to_string(task.as_ref().unwrap().path().join("comm"))
                .is_ok_and(|name| name.trim() == "sqlite-writer")
        })
        .count();
    assert_eq!(
        writers, 2,
        "one SQLite writer for orders.db and one for payment.db"
    );

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = test_support::eventually(
        Duration::from_secs(10),
        "the stack stops within 10 s of SIGTERM",
        || std::future::ready(child.try_wait().unwrap()),
    )
    .await;
    assert!(status.success(), "{status}");
}

/// `up --help` shows `--set` examples that work, and a bad `--set` ends the process with one
/// clear line instead of a debug dump.
#[test]
fn up_help_examples_work_and_a_bad_setting_is_one_line() {
    let stack = || Command::new(env!("CARGO_BIN_EXE_stack"));
    let help = String::from_utf8(stack().args(["up", "--help"]).output().unwrap().stdout).unwrap();
    let examples: Vec<&str> = help
        .split('`')
        .filter_map(|quoted| quoted.strip_prefix("--set "))
        .collect();
    assert!(!examples.is_empty(), "{help}");
    for example in examples {
        // `--data-dir` on a file that is not a directory stops `up` after the settings are read.
        let not_a_dir = tempfile::NamedTempFile::new().unwrap();
        let output = stack()
            .args(["up", "--set", example, "--data-dir"])
            .arg(not_a_dir.path())
            .output()
            .unwrap();
        let stderr = String::from_utf8(output.stderr).unwrap();
        assert!(
            !output.status.success() && !stderr.contains("invalid settings"),
            "--set {example}: {stderr}"
        );
    }

    let output = stack()
        .args(["up", "--set", "listen=0.0.0.0:8080"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: invalid settings") && stderr.contains("listen"),
        "{stderr}"
    );
}
