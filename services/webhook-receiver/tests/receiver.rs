use std::{
    sync::{Arc, Mutex},
    time::{SystemTime, UNIX_EPOCH},
};

use webhook_receiver::{Delivery, PATH, Receiver};
use webhooks::signature::{Secret, Signer, Verifier, WEBHOOK_ID, WEBHOOK_SIGNATURE, WEBHOOK_TIMESTAMP};

/// A receiver on a loopback port, and what it processed.
async fn receiver(secret: &Secret) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(Verifier::new(secret.clone()), 3_600, move |delivery| sink.lock().unwrap().push(delivery)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    (url, processed)
}

async fn deliver(url: &str, signer: &Signer, id: &str, body: &'static str) -> reqwest::StatusCode {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    reqwest::Client::new()
        .post(url)
        .header(WEBHOOK_ID, id)
        .header(WEBHOOK_TIMESTAMP, now.to_string())
        .header(WEBHOOK_SIGNATURE, signer.signature_header(id, now, body.as_bytes()))
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
    assert_eq!(deliver(&url, &signer, "msg_1", r#"{"type":"order.paid"}"#).await, 204);
    assert_eq!(deliver(&url, &signer, "msg_1", r#"{"type":"order.paid"}"#).await, 200, "a repeat is acknowledged");
    assert_eq!(deliver(&url, &signer, "msg_2", r#"{"type":"order.paid"}"#).await, 204);
    let ids: Vec<String> = processed.lock().unwrap().iter().map(|delivery| delivery.id.clone()).collect();
    assert_eq!(ids, ["msg_1", "msg_2"]);
}

#[tokio::test]
async fn a_delivery_signed_with_another_secret_is_refused_and_not_processed() {
    let (url, processed) = receiver(&Secret::generate()).await;
    assert_eq!(deliver(&url, &Signer::new(Secret::generate()), "msg_1", "{}").await, 401);
    assert!(processed.lock().unwrap().is_empty());
}
