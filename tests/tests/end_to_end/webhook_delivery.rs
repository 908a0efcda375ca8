//! Webhooks end to end, in the one-process chain with its sender: a paid or declined order reaches
//! the example receiver once, signed with the endpoint's secret, with the order as the API shows
//! it; a payment that failed announces nothing.

use bank_mock::Faults;
use e2e::{
    API_KEY, BACKGROUND, Storage, chain_with_receiver, events, eventually, fast_bank, order_body,
    subscribe,
};
use serde_json::Value;

const ENDPOINTS: &str = "/v1/webhooks/endpoints";

#[tokio::test]
async fn a_paid_and_a_declined_order_reach_the_receiver_once_each_and_a_failed_payment_nothing() {
    for backend in Storage::all() {
        paid_and_declined_orders_are_announced(&backend).await;
    }
}

async fn paid_and_declined_orders_are_announced(backend: &Storage) {
    let (test, listener) = chain_with_receiver(backend, |_| {}).await;
    let (endpoint_id, processed) = subscribe(&test, listener).await;

    let paid = test.post_order("paid", &order_body()).send().await.unwrap();
    assert_eq!(paid.status(), 201);
    let paid_body = paid.text().await.unwrap();
    let paid: Value = serde_json::from_str(&paid_body).unwrap();
    let [(id, event)] = events(&processed, 1).await.try_into().expect("one event");
    let delivered_body = String::from_utf8(processed.lock().unwrap()[0].body.to_vec()).unwrap();
    assert!(
        delivered_body.contains(&format!(r#""data":{{"order":{paid_body}}}"#)),
        "the order byte for byte as the API answered it: {delivered_body}"
    );
    assert_eq!(event["id"], id.as_str(), "the body carries the webhook-id");
    assert_eq!(
        (event["type"].as_str(), event["version"].as_i64()),
        (Some("order.paid"), Some(2))
    );
    assert!(
        event["timestamp"].as_str().unwrap().ends_with('Z'),
        "{event}"
    );
    assert_eq!(
        event["data"]["order"], paid,
        "the order as the API answered it"
    );

    test.set_faults(fast_bank(|faults: &mut Faults| faults.error_rate = 1.0));
    let failed = test
        .post_order("failed", &order_body())
        .send()
        .await
        .unwrap();
    assert!(failed.status().is_server_error(), "{}", failed.status());
    test.set_faults(fast_bank(|faults: &mut Faults| faults.decline_rate = 1.0));
    let declined = test
        .post_order("declined", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(declined.status(), 402);

    let events = events(&processed, 2).await;
    let types: Vec<&str> = events
        .iter()
        .map(|(_, event)| event["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        types,
        ["order.paid", "order.payment_declined"],
        "the failed payment announced nothing"
    );

    // The log shows both deliveries delivered at their first attempt, answered 204, once the
    // sender has recorded what the receiver answered.
    let path = format!("{ENDPOINTS}/{endpoint_id}/deliveries");
    let log = eventually(
        BACKGROUND,
        "both deliveries recorded as delivered",
        || async {
            let log: Value = test.get(&path).send().await.unwrap().json().await.unwrap();
            let deliveries = log["deliveries"].as_array().unwrap();
            (deliveries.len() == 2
                && deliveries
                    .iter()
                    .all(|delivery| delivery["state"] != "pending"))
            .then_some(log)
        },
    )
    .await;
    for delivery in log["deliveries"].as_array().unwrap() {
        assert_eq!(delivery["state"], "delivered", "{delivery}");
        assert_eq!(
            delivery["attempts"].as_array().unwrap().len(),
            1,
            "{delivery}"
        );
        assert_eq!(delivery["attempts"][0]["status_code"], 204, "{delivery}");
    }

    // A repeat of the paid order is replayed: no second event. An event is written in the
    // transaction that settles its order, so once the replay has answered, the outbox holds all
    // there will ever be for it.
    assert_eq!(
        test.post_order("paid", &order_body())
            .send()
            .await
            .unwrap()
            .headers()["idempotent-replayed"],
        "true"
    );
    assert_eq!(
        test.count_rows("webhook_events").await,
        2,
        "a replayed order is not announced again"
    );
}

#[tokio::test]
async fn a_ping_reaches_the_receiver_signed_with_a_secret_the_database_holds_sealed() {
    for backend in Storage::all() {
        let name = backend.name();
        let (test, listener) = chain_with_receiver(&backend, |_| {}).await;
        let (endpoint_id, processed) = subscribe(&test, listener).await;
        let pinged = test
            .http
            .post(test.url(&format!("{ENDPOINTS}/{endpoint_id}/ping")))
            .bearer_auth(API_KEY)
            .send()
            .await
            .unwrap();
        assert_eq!(pinged.status(), 202, "{name}");
        let event_id = pinged.json::<Value>().await.unwrap()["event_id"]
            .as_str()
            .unwrap()
            .to_owned();
        // The example receiver processes only deliveries whose signature verifies.
        let [(id, event)] = events(&processed, 1).await.try_into().expect("one event");
        assert_eq!(
            (id.as_str(), event["type"].as_str()),
            (event_id.as_str(), Some("endpoint.ping")),
            "{name}"
        );
        assert_eq!(event["data"]["endpoint_id"], endpoint_id.as_str(), "{name}");
        let path = format!("{ENDPOINTS}/{endpoint_id}/deliveries");
        eventually(BACKGROUND, "the ping recorded as delivered", || async {
            let log: Value = test.get(&path).send().await.unwrap().json().await.unwrap();
            (log["deliveries"][0]["state"] == "delivered").then_some(())
        })
        .await;

        let stored: Vec<String> = test
            .database(orders::HOP)
            .await
            .fetch_all("SELECT secret FROM webhook_secrets", &[])
            .await
            .unwrap();
        assert!(
            stored
                .iter()
                .all(|secret| secret.starts_with("sealed1:dev:") && !secret.contains("whsec_")),
            "{name}: {stored:?}"
        );
    }
}
