//! Webhooks end to end, in the one-process chain with its sender: a paid or declined order reaches
//! the example receiver once, signed with the endpoint's secret, with the order as the API shows
//! it; a payment that failed announces nothing.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use bank_mock::Faults;
use e2e::{API_KEY, Backend, TestChain, fast_bank, order_body};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use webhook_receiver::{Delivery, PATH, Receiver};
use webhooks::signature::{Secret, Verifier};

const ENDPOINTS: &str = "/v1/webhooks/endpoints";

/// The chain on `backend`, with its sender and orders allowing plain http to a receiver on
/// loopback.
async fn chain_with_receiver(backend: &Backend) -> (TestChain, TcpListener) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let receiver = listener.local_addr().unwrap().to_string();
    let test = TestChain::start_on(backend, |settings| {
        settings.orders.webhooks.test_hosts = vec![receiver.clone()];
        settings.webhook_sender.test_hosts = vec![receiver];
    })
    .await;
    (test, listener)
}

/// Creates an endpoint for `listener` and serves the example receiver there with its secret.
async fn subscribe(test: &TestChain, listener: TcpListener) -> (String, Arc<Mutex<Vec<Delivery>>>) {
    let url = format!("http://{}{PATH}", listener.local_addr().unwrap());
    let body = json!({"url": url, "event_types": ["order.paid", "order.payment_declined"]});
    let created = test.http.post(test.url(ENDPOINTS)).bearer_auth(API_KEY).header("idempotency-key", "endpoint").json(&body).send().await.unwrap();
    assert_eq!(created.status(), 201);
    let created: Value = created.json().await.unwrap();
    let secret: Secret = created["secret"].as_str().unwrap().parse().unwrap();
    let processed = Arc::new(Mutex::new(Vec::new()));
    let sink = processed.clone();
    let receiver = Arc::new(Receiver::new(Verifier::new(secret), 3_600, move |delivery| sink.lock().unwrap().push(delivery)));
    tokio::spawn(async move { axum::serve(listener, receiver.router()).await });
    (created["endpoint"]["endpoint_id"].as_str().unwrap().to_owned(), processed)
}

/// The events processed so far, once `count` have been or after 15 s.
async fn events(processed: &Mutex<Vec<Delivery>>, count: usize) -> Vec<(String, Value)> {
    let started = Instant::now();
    while processed.lock().unwrap().len() < count && started.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    processed.lock().unwrap().iter().map(|delivery| (delivery.id.clone(), serde_json::from_slice(&delivery.body).unwrap())).collect()
}

#[tokio::test]
async fn a_paid_and_a_declined_order_reach_the_receiver_once_each_and_a_failed_payment_nothing() {
    for backend in Backend::all() {
        paid_and_declined_orders_are_announced(&backend).await;
    }
}

async fn paid_and_declined_orders_are_announced(backend: &Backend) {
    let (test, listener) = chain_with_receiver(backend).await;
    let (endpoint_id, processed) = subscribe(&test, listener).await;

    let paid = test.post_order("paid", &order_body()).send().await.unwrap();
    assert_eq!(paid.status(), 201);
    let paid_body = paid.text().await.unwrap();
    let paid: Value = serde_json::from_str(&paid_body).unwrap();
    let [(id, event)] = events(&processed, 1).await.try_into().expect("one event");
    let delivered_body = String::from_utf8(processed.lock().unwrap()[0].body.to_vec()).unwrap();
    assert!(delivered_body.contains(&format!(r#""data":{{"order":{paid_body}}}"#)), "the order byte for byte as the API answered it: {delivered_body}");
    assert_eq!(event["id"], id.as_str(), "the body carries the webhook-id");
    assert_eq!((event["type"].as_str(), event["version"].as_i64()), (Some("order.paid"), Some(2)));
    assert!(event["timestamp"].as_str().unwrap().ends_with('Z'), "{event}");
    assert_eq!(event["data"]["order"], paid, "the order as the API answered it");

    test.set_faults(fast_bank(|faults: &mut Faults| faults.error_rate = 1.0));
    let failed = test.post_order("failed", &order_body()).send().await.unwrap();
    assert!(failed.status().is_server_error(), "{}", failed.status());
    test.set_faults(fast_bank(|faults: &mut Faults| faults.decline_rate = 1.0));
    let declined = test.post_order("declined", &order_body()).send().await.unwrap();
    assert_eq!(declined.status(), 402);

    let events = events(&processed, 2).await;
    let types: Vec<&str> = events.iter().map(|(_, event)| event["type"].as_str().unwrap()).collect();
    assert_eq!(types, ["order.paid", "order.payment_declined"], "the failed payment announced nothing");

    // The log shows each delivery delivered at its first attempt, answered 204, once the sender
    // has recorded what the receiver answered.
    let log = async {
        loop {
            let log: Value = test.http.get(test.url(&format!("{ENDPOINTS}/{endpoint_id}/deliveries"))).bearer_auth(API_KEY).send().await.unwrap().json().await.unwrap();
            if log["deliveries"].as_array().unwrap().iter().all(|delivery| delivery["state"] != "pending") {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let log = tokio::time::timeout(Duration::from_secs(10), log).await.expect("both attempts recorded");
    for delivery in log["deliveries"].as_array().unwrap() {
        assert_eq!(delivery["state"], "delivered", "{delivery}");
        assert_eq!(delivery["attempts"].as_array().unwrap().len(), 1, "{delivery}");
        assert_eq!(delivery["attempts"][0]["status_code"], 204, "{delivery}");
    }

    // A repeat of the paid order is replayed: no second event.
    assert_eq!(test.post_order("paid", &order_body()).send().await.unwrap().headers()["idempotent-replayed"], "true");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(processed.lock().unwrap().len(), 2, "a replayed order is not announced again");
}
