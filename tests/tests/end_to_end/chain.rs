//! The chain end to end: a paid order with its four-hop ledger, and the services' common surface.

use deadline::ledger;
use e2e::{TestChain, order_body};
use stack::chain::{BANK_ADMIN, BANK_GRPC, GATEWAY_GRPC, ORDERS_GRPC, PAYMENT_GRPC};
use tonic_health::pb::{
    HealthCheckRequest, health_check_response::ServingStatus, health_client::HealthClient,
};
use tonic_reflection::pb::v1::{
    ServerReflectionRequest, server_reflection_client::ServerReflectionClient,
    server_reflection_request::MessageRequest, server_reflection_response::MessageResponse,
};

#[tokio::test]
async fn a_healthy_post_is_paid_and_carries_a_four_hop_ledger() {
    let test = TestChain::start().await;
    let response = test
        .post_order("chain-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);

    let ledger_text = response.headers()[wire::DEADLINE_LEDGER]
        .to_str()
        .unwrap()
        .to_owned();
    let entries = ledger::parse(&ledger_text).unwrap();
    let hops: Vec<&str> = entries.iter().map(|e| e.hop.as_str()).collect();
    assert_eq!(
        hops,
        ["gateway", "orders", "payment", "bank-mock"],
        "{ledger_text}"
    );
    for pair in entries.windows(2) {
        assert!(
            pair[0].forwarded > pair[1].forwarded,
            "forwarded budgets strictly decrease: {ledger_text}"
        );
        assert!(
            pair[1].received <= pair[0].forwarded,
            "a hop never receives more than was forwarded: {ledger_text}"
        );
    }
    assert!(entries[0].received <= std::time::Duration::from_millis(2_000));
    let timing = response.headers()["server-timing"]
        .to_str()
        .unwrap()
        .to_owned();
    for hop in hops {
        assert!(
            timing.contains(&format!("{hop};dur=")),
            "Server-Timing names {hop}: {timing}"
        );
    }

    let order: serde_json::Value = response.json().await.unwrap();
    assert_eq!(order["status"], "paid");
    assert_eq!(order["payment"]["status"], "approved");
    assert_eq!(order["amount_minor"], 1299);

    let id = order["order_id"].as_str().unwrap();
    let fetched = test
        .http
        .get(test.url(&format!("/v1/orders/{id}")))
        .bearer_auth(e2e::API_KEY)
        .send()
        .await
        .unwrap();
    assert_eq!(fetched.status(), 200);
    assert!(fetched.headers().contains_key(wire::DEADLINE_LEDGER));
    assert_eq!(fetched.json::<serde_json::Value>().await.unwrap(), order);

    let stranger = test
        .http
        .get(test.url(&format!("/v1/orders/{id}")))
        .bearer_auth("demo-key-2")
        .send()
        .await
        .unwrap();
    assert_eq!(
        stranger.status(),
        404,
        "orders are scoped to the client that made them"
    );
    assert_eq!(test.chain.bank().stats().charges, 1);
}

#[tokio::test]
async fn the_same_key_and_body_do_not_charge_twice() {
    let test = TestChain::start().await;
    let first: serde_json::Value = test
        .post_order("repeat-1", &order_body())
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let second = test
        .post_order("repeat-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(second.status(), 201);
    let second: serde_json::Value = second.json().await.unwrap();
    assert_eq!(first["order_id"], second["order_id"]);
    assert_eq!(test.chain.bank().stats().charges, 1);

    let mut other = order_body();
    other["amount_minor"] = 5.into();
    let reused = test.post_order("repeat-1", &other).send().await.unwrap();
    assert_eq!(reused.status(), 422);
    assert_eq!(test.chain.bank().stats().charges, 1);
}

#[tokio::test]
async fn a_declined_payment_is_402_with_the_order_id() {
    let test = TestChain::start().await;
    test.chain
        .bank()
        .update_faults(|faults| faults.decline_rate = 1.0);
    let response = test
        .post_order("declined-1", &order_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 402);
    let problem: serde_json::Value = response.json().await.unwrap();
    assert!(
        problem["order_id"].as_str().unwrap().starts_with("ord_"),
        "{problem}"
    );
}

/// The services that reflection lists on `channel`, asked in both versions of the protocol.
async fn reflected_services(channel: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1alpha as alpha;

    let list = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = ServerReflectionClient::new(channel.clone())
        .server_reflection_info(tokio_stream::once(list))
        .await
        .unwrap()
        .into_inner();
    let answer = answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap();
    let MessageResponse::ListServicesResponse(listed) = answer else {
        panic!("unexpected {answer:?}")
    };
    let names: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();

    let list = alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    };
    let mut answers = alpha::server_reflection_client::ServerReflectionClient::new(channel)
        .server_reflection_info(tokio_stream::once(list))
        .await
        .unwrap()
        .into_inner();
    let answer = answers
        .message()
        .await
        .unwrap()
        .unwrap()
        .message_response
        .unwrap();
    let alpha::server_reflection_response::MessageResponse::ListServicesResponse(listed) = answer
    else {
        panic!("unexpected {answer:?}")
    };
    let alpha_names: Vec<String> = listed.service.into_iter().map(|s| s.name).collect();
    assert_eq!(names, alpha_names, "v1 and v1alpha list the same services");
    names
}

#[tokio::test]
async fn every_service_answers_health_checks_and_reflection() {
    let test = TestChain::start().await;
    let a = test.chain.addresses();
    for (name, addr, service) in [
        ("gateway", a[&GATEWAY_GRPC], "gateway.v1.Gateway"),
        ("orders", a[&ORDERS_GRPC], "orders.v1.Orders"),
        ("orders", a[&ORDERS_GRPC], "orders.v1.Webhooks"),
        ("payment", a[&PAYMENT_GRPC], "payment.v1.PaymentService"),
        ("bank-mock", a[&BANK_GRPC], "bank.v1.Bank"),
    ] {
        // The public port is plain, the inner ones answer the operator's certificate.
        let channel = match name {
            "gateway" => tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await
                .unwrap(),
            inner => test.channel_as(rpc::dev_certs::OPERATOR, inner, addr).await,
        };
        let mut health = HealthClient::new(channel.clone());
        for probe in ["", service] {
            let status = health
                .check(HealthCheckRequest {
                    service: probe.into(),
                })
                .await
                .unwrap()
                .into_inner()
                .status();
            assert_eq!(status, ServingStatus::Serving, "{name} {probe:?}");
        }
        let listed = reflected_services(channel).await;
        assert!(
            listed.iter().any(|s| s == service),
            "{name} lists {service}: {listed:?}"
        );
    }
}

#[tokio::test]
async fn the_public_port_reflects_the_public_services_only() {
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse::{
        ErrorResponse, FileDescriptorResponse,
    };

    let test = TestChain::start().await;
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "http://{}",
        test.chain.address(&GATEWAY_GRPC)
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    let mut listed = reflected_services(channel.clone()).await;
    listed.sort();
    assert_eq!(
        listed,
        [
            "gateway.v1.Gateway",
            "grpc.reflection.v1.ServerReflection",
            "grpc.reflection.v1alpha.ServerReflection"
        ]
    );
    // Nor are the inner services' descriptors there to be asked for by name.
    for (symbol, public) in [
        ("gateway.v1.Gateway", true),
        ("common.v1.Order", true),
        ("orders.v1.Orders", false),
        ("bank.v1.Bank", false),
    ] {
        let ask = ServerReflectionRequest {
            host: String::new(),
            message_request: Some(MessageRequest::FileContainingSymbol(symbol.into())),
        };
        let answer = match ServerReflectionClient::new(channel.clone())
            .server_reflection_info(tokio_stream::once(ask))
            .await
        {
            Ok(answers) => answers
                .into_inner()
                .message()
                .await
                .map(|answer| answer.and_then(|a| a.message_response)),
            Err(status) => Err(status),
        };
        match answer {
            Ok(Some(FileDescriptorResponse(_))) => {
                assert!(public, "{symbol} is described on the public port")
            }
            Ok(Some(ErrorResponse(_))) => {
                assert!(!public, "{symbol} is not described on the public port")
            }
            Err(status) if status.code() == tonic::Code::NotFound => {
                assert!(!public, "{symbol} is not described on the public port")
            }
            other => panic!("{symbol}: unexpected {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_bank_admin_api_needs_its_token() {
    let test = TestChain::start().await;
    let url = format!("http://{}/admin/stats", test.chain.address(&BANK_ADMIN));
    assert_eq!(test.http.get(&url).send().await.unwrap().status(), 401);
    assert_eq!(
        test.http
            .get(&url)
            .header("x-admin-token", "wrong")
            .send()
            .await
            .unwrap()
            .status(),
        401
    );
    let stats = test
        .http
        .get(&url)
        .header("x-admin-token", &test.chain.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(stats.status(), 200);
    let stats: serde_json::Value = stats.json().await.unwrap();
    assert_eq!(stats["calls"], 0);

    let faults_url = format!("http://{}/admin/faults", test.chain.address(&BANK_ADMIN));
    let bad = test
        .http
        .put(&faults_url)
        .header("x-admin-token", &test.chain.admin_token)
        .body(r#"{"error_rate": 2}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let good = test
        .http
        .put(&faults_url)
        .header("x-admin-token", &test.chain.admin_token)
        .body(r#"{"hang": true}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(good.status(), 200);
    assert!(test.chain.bank().faults().hang);
}
