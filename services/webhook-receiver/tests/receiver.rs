use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use test_support::eventually;

use webhook_receiver::{Delivery, PATH, Receiver};
use webhooks::signature::{
    Secret, Signer, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP,
};

/// A receiver on a loopback port, and what it processed.
async fn receiver(secret: &Secret) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(
        Verifier::new(secret.clone()),
        3_600,
        move |delivery| sink.lock().unwrap().push(delivery),
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    (url, processed)
}

async fn deliver(url: &str, signer: &Signer, id: &str, body: &'static str) -> reqwest::StatusCode {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    reqwest::Client::new()
        .post(url)
        .header(WEBHOOK_ID, id)
        .header(WEBHOOK_TIMESTAMP, now.to_string())
        .header(
            WEBHOOK_SIGNATURE,
            signer.signature_header(id, now, body.as_bytes()),
        )
        .body(body)
        .send()
        .await
        .unwrap()
        .status()
}

#[tokio::test]
async fn a_delivery_is_processed_once_and_a_repeat_is_acknowledged_without_processing() {
    let secret = Secret::generate();
    let (url, processed) = receiver(&secret).await;
    let signer = Signer::new(secret);
    assert_eq!(
        deliver(&url, &signer, "msg_1", r#"{"type":"order.paid"}"#).await,
        204
    );
    assert_eq!(
        deliver(&url, &signer, "msg_1", r#"{"type":"order.paid"}"#).await,
        200,
        "a repeat is acknowledged"
    );
    assert_eq!(
        deliver(&url, &signer, "msg_2", r#"{"type":"order.paid"}"#).await,
        204
    );
    let ids: Vec<String> = processed
        .lock()
        .unwrap()
        .iter()
        .map(|delivery| delivery.id.clone())
        .collect();
    assert_eq!(ids, ["msg_1", "msg_2"]);
}

#[tokio::test]
async fn a_delivery_signed_with_another_secret_is_refused_and_not_processed() {
    let (url, processed) = receiver(&Secret::generate()).await;
    assert_eq!(
        deliver(&url, &Signer::new(Secret::generate()), "msg_1", "{}").await,
        401
    );
    assert!(processed.lock().unwrap().is_empty());
}

// Two threads, so that a receiver that processed on its own request's thread would still answer
// the repeat (the test is of what it answers, not of whether it blocks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeat_during_processing_gets_409_and_is_processed_after_a_failure() {
    let secret = Secret::generate();
    // Processing says it has started, then waits for the test's word: `true` succeeds, `false`
    // fails (panics).
    let started = Arc::new(AtomicBool::new(false));
    let (release, outcomes) = std::sync::mpsc::channel::<bool>();
    let outcomes = Mutex::new(outcomes);
    let processed = Arc::new(Mutex::new(Vec::new()));
    let (sink, starting) = (processed.clone(), started.clone());
    let receiver = Arc::new(Receiver::new(
        Verifier::new(secret.clone()),
        3_600,
        move |delivery: Delivery| {
            starting.store(true, Ordering::SeqCst);
            let succeeds = outcomes
                .lock()
                .unwrap()
                .recv()
                .expect("the test says how processing ends");
            assert!(succeeds, "processing of {} failed", delivery.id);
            sink.lock().unwrap().push(delivery.id);
        },
    ));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    let signer = Signer::new(secret);

    let first = tokio::spawn({
        let (url, signer) = (url.clone(), signer.clone());
        async move { deliver(&url, &signer, "msg_1", "{}").await }
    });
    eventually(
        Duration::from_secs(5),
        "the first delivery is being processed",
        || async { started.load(Ordering::SeqCst) },
    )
    .await;
    assert_eq!(
        deliver(&url, &signer, "msg_1", "{}").await,
        409,
        "a repeat while the first is processed is not acknowledged"
    );
    release.send(false).unwrap();
    assert_eq!(first.await.unwrap(), 500, "the first failed");
    release.send(true).unwrap();
    assert_eq!(
        deliver(&url, &signer, "msg_1", "{}").await,
        204,
        "the sender's retry is processed"
    );
    assert_eq!(
        deliver(&url, &signer, "msg_1", "{}").await,
        200,
        "and then acknowledged"
    );
    assert_eq!(*processed.lock().unwrap(), ["msg_1"]);
}
