//! The HTTP face against its OpenAPI document (`services/gateway/openapi.json`): served at
//! `GET /openapi.json` without an API key, the same as the committed file, valid OpenAPI 3.1 by
//! openapi-spec-validator, and schemathesis over every operation of the live chain finds no
//! internal error (`500`, `502`) and no answer the document does not describe. Needs python3 with
//! openapi-spec-validator and schemathesis (`.ci/run` installs them).

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use e2e::{
    API_KEY, Storage, TestChain, chain_with_receiver, events, missing, order_body, subscribe,
};
use serde_json::{Value, json};
use stack::chain::GATEWAY_HTTP;
use webhook_receiver::PATH;

fn committed_document() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../services/gateway/openapi.json")
}

fn python_has(module: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|output| output.status.success())
}

/// Runs `python3 args…` in `dir` (schemathesis keeps a cache in its working directory) off the
/// runtime's thread (the chain goes on serving meanwhile), and fails with its output unless it
/// succeeds.
async fn python(dir: &Path, args: Vec<String>) -> String {
    let dir = dir.to_owned();
    let output = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(&args)
            .current_dir(dir)
            .output()
    })
    .await
    .unwrap()
    .expect("python3 runs");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "{text}");
    text
}

#[tokio::test]
async fn the_served_document_is_the_committed_one_and_valid_openapi_3_1() {
    if !python_has("openapi_spec_validator") {
        return missing(
            "python3 with openapi-spec-validator",
            "the OpenAPI document was not validated",
        );
    }
    let test = TestChain::start().await;
    let response = test
        .http
        .get(test.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200, "served without an API key");
    assert_eq!(response.headers()["content-type"], "application/json");
    let served = response.text().await.unwrap();
    let committed = std::fs::read_to_string(committed_document()).expect("the committed document");
    assert!(
        served == committed,
        "the served document differs from the committed one: `UPDATE_OPENAPI=1 cargo test -p gateway openapi` rewrites it"
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("openapi.json");
    std::fs::write(&file, served).unwrap();
    let args = ["-m", "openapi_spec_validator", "--schema", "3.1"].map(String::from);
    python(
        dir.path(),
        args.into_iter()
            .chain([file.display().to_string()])
            .collect(),
    )
    .await;
}

/// Test cases per operation, and the run's time budget (fuzzing repeats until it is spent).
const EXAMPLES_PER_OPERATION: u32 = 30;
const TIME_BUDGET: Duration = Duration::from_secs(45);

/// What is checked, and the data that lets generated requests reach past `404`: the identifiers
/// of an order, a webhook endpoint and one of its events, and a receiver URL an endpoint may
/// name, each used in half of the requests that take one. Deletes get an endpoint of their own,
/// so that the others still find theirs.
///
/// `503` and `504` are answers the document describes, not server errors: a request may ask for
/// a deadline of 1 ms (`X-Request-Timeout-Ms`), and the honest answer to that is `504` at once.
/// `500` and `502` stay failures.
fn config(
    order_id: &str,
    endpoint_id: &str,
    deletable_id: &str,
    event_id: &str,
    receiver_url: &str,
) -> String {
    format!(
        r#"[checks]
not_a_server_error.expected-statuses = ["2xx", "3xx", "4xx", "503", "504"]

[dictionaries]
orders = {{ values = ["{order_id}"] }}
endpoints = {{ values = ["{endpoint_id}"] }}
deletable = {{ values = ["{deletable_id}"] }}
events = {{ values = ["{event_id}"] }}
receivers = {{ values = ["{receiver_url}"] }}

[parameters]
"path.order_id" = {{ dictionary = "orders", probability = 0.5 }}
"path.endpoint_id" = {{ dictionary = "endpoints", probability = 0.5 }}
"path.event_id" = {{ dictionary = "events", probability = 0.5 }}
"body.url" = {{ dictionary = "receivers", probability = 0.5 }}

[[operations]]
include-method = "DELETE"
parameters = {{ "path.endpoint_id" = {{ dictionary = "deletable", probability = 0.5 }} }}
"#
    )
}

#[tokio::test]
async fn schemathesis_finds_no_internal_error_and_no_answer_the_document_does_not_describe() {
    if !python_has("schemathesis") {
        return missing(
            "python3 with schemathesis",
            "the HTTP face was not fuzzed against its document",
        );
    }
    let (test, listener) = chain_with_receiver(&Storage::Sqlite, |_| {}).await;
    let receiver_url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    let (endpoint_id, processed) = subscribe(&test, listener).await;
    let created = test
        .post_order("openapi-seed", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), 201);
    let order_id = created.json::<Value>().await.unwrap()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let (event_id, _) = events(&processed, 1).await.remove(0);
    let deletable = test.post_as(
        API_KEY,
        "/v1/webhooks/endpoints",
        "openapi-deletable",
        &json!({"url": receiver_url, "event_types": ["order.paid"]}),
    );
    let deletable = deletable.send().await.unwrap();
    assert_eq!(deletable.status(), 201);
    let deletable_id = deletable.json::<Value>().await.unwrap()["endpoint"]["endpoint_id"]
        .as_str()
        .unwrap()
        .to_owned();

    let dir = tempfile::tempdir().unwrap();
    let config_file = dir.path().join("schemathesis.toml");
    std::fs::write(
        &config_file,
        config(
            &order_id,
            &endpoint_id,
            &deletable_id,
            &event_id,
            &receiver_url,
        ),
    )
    .unwrap();
    let checks = [
        "not_a_server_error",
        "status_code_conformance",
        "content_type_conformance",
        "response_schema_conformance",
        "response_headers_conformance",
    ];
    let args = [
        "-m".to_owned(),
        "schemathesis.cli".to_owned(),
        format!("--config-file={}", config_file.display()),
        "--no-color".to_owned(),
        "run".to_owned(),
        committed_document().display().to_string(),
        format!("--url=http://{}", test.chain.address(&GATEWAY_HTTP)),
        format!("--header=Authorization: Bearer {API_KEY}"),
        format!("--checks={}", checks.join(",")),
        format!("--max-examples={EXAMPLES_PER_OPERATION}"),
        format!("--max-time={}", TIME_BUDGET.as_secs()),
        // No stateful phase: the document has no links to follow.
        "--phases=examples,coverage,fuzzing".to_owned(),
        "--request-timeout=5".to_owned(),
        // Reproducible: a finding is found again by the next run.
        "--seed=1".to_owned(),
        // One worker: with two, hypothesis describes filters by parsing their source with `ast`
        // from two threads at once, which CPython 3.11.7 does not always survive ("AST
        // constructor recursion depth mismatch": a tool error that fails the run with every case
        // passed).
        "--workers=1".to_owned(),
        "--generation-database=none".to_owned(),
    ];
    let report = python(dir.path(), args.into()).await;
    println!("{report}");
}
