//! Guards that learn from the dependency: fail fast on what it has been taking.

use std::time::Duration;

use bank_mock::Latency;
use e2e::{TestChain, fast_bank, order_body};

/// Latency estimates that probe once a minute, so that every refusal here is one.
fn estimates_without_probes(settings: &mut stack::ChainSettings) {
    for estimate in [
        &mut settings.gateway.orders.latency_estimate,
        &mut settings.orders.payment.latency_estimate,
        &mut settings.payment.bank.latency_estimate,
    ] {
        estimate.probe_interval_ms = 60_000;
    }
    settings.gateway.retry.max_attempts = 1;
}

#[tokio::test]
async fn a_call_with_less_time_than_the_dependency_has_been_taking_is_not_made() {
    let test = TestChain::start_with(estimates_without_probes).await;
    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 300.0,
            stddev: 0.0,
        }
    }));

    // A window's worth of creates with ample time: every hop learns that its call takes ~300 ms.
    let creates = (0..12).map(|n| test.post_order(&format!("learn-{n}"), &order_body()).send());
    for response in futures::future::join_all(creates).await {
        assert_eq!(response.unwrap().status(), 201);
    }
    // Until the window closes and becomes the estimate.
    tokio::time::sleep(Duration::from_millis(1_100)).await;

    // 250 ms is less than that at every hop. The first such call at each hop is its probe (made,
    // and out of time at the bank); the next is refused by the gateway, which calls nobody.
    let probe = test
        .post_order("short-probe", &order_body())
        .header("x-request-timeout-ms", "250")
        .send()
        .await
        .unwrap();
    assert_eq!(probe.status(), 504);
    let calls = test.chain.bank().stats().calls;
    assert_eq!(calls, 13, "the probe reached the bank");

    let refused = test
        .post_order("short-refused", &order_body())
        .header("x-request-timeout-ms", "250")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 504);
    let problem: serde_json::Value = refused.json().await.unwrap();
    let detail = problem["detail"].as_str().unwrap();
    for needle in [
        "gateway: orders has needed ",
        "p90 of its recent answers",
        "not calling",
    ] {
        assert!(detail.contains(needle), "{needle:?} in {detail}");
    }
    assert_eq!(
        test.chain.bank().stats().calls,
        calls,
        "the bank was not called"
    );

    // Ample time still gets the call made.
    let ample = test
        .post_order("ample", &order_body())
        .header("x-request-timeout-ms", "1500")
        .send()
        .await
        .unwrap();
    assert_eq!(ample.status(), 201);
}

/// Creates from `workers` clients, each sending its next when the last is answered, for `period`.
async fn steady_load(test: &TestChain, label: &str, workers: usize, period: Duration) {
    let until = tokio::time::Instant::now() + period;
    let clients = (0..workers).map(|worker| async move {
        let mut n = 0;
        while tokio::time::Instant::now() < until {
            // Whatever the answer: the load is what matters here, the limit is what is read.
            let _ = test
                .post_order(&format!("{label}-{worker}-{n}"), &order_body())
                .send()
                .await;
            n += 1;
        }
    });
    futures::future::join_all(clients).await;
}

#[tokio::test]
async fn the_adaptive_limit_shrinks_under_a_slow_bank_and_recovers() {
    let test = TestChain::start_with(|s| {
        s.payment.bank.max_concurrent = 16;
        s.payment.bank.adaptive_limit.enabled = true;
        // Only the limit is under test: nothing else refuses or fails fast.
        stack::scenario::without_breakers(s);
        for estimate in [
            &mut s.gateway.orders.latency_estimate,
            &mut s.orders.payment.latency_estimate,
            &mut s.payment.bank.latency_estimate,
        ] {
            estimate.fail_fast = false;
        }
        s.gateway.retry.max_attempts = 1;
    })
    .await;
    let limit = || test.chain.guard_stats().bank_bulkhead.limit;
    // The bank's usual latency is well above the chain's own jitter on a busy machine, which
    // Vegas would read as queueing.
    let usual = Latency {
        mean: 50.0,
        stddev: 0.0,
    };
    test.set_faults(fast_bank(|f| f.latency_ms = usual));
    steady_load(&test, "usual", 16, Duration::from_secs(2)).await;
    let at_ease = limit();

    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 800.0,
            stddev: 0.0,
        }
    }));
    steady_load(&test, "slow", 16, Duration::from_secs(5)).await;
    let shrunk = limit();
    assert!(
        shrunk <= 6 && shrunk < at_ease,
        "the limit shrank under a slow bank: {at_ease} → {shrunk}"
    );

    test.set_faults(fast_bank(|f| f.latency_ms = usual));
    steady_load(&test, "recovered", 16, Duration::from_secs(3)).await;
    let recovered = limit();
    assert!(
        recovered >= 8,
        "and grew back when the bank recovered: {recovered}"
    );
}

#[tokio::test]
async fn under_overload_the_edge_queue_sheds_by_waiting_time_and_what_it_admits_meets_its_deadline()
{
    let test = TestChain::start_with(|s| {
        s.gateway.queue = resilience::queue::QueueSettings {
            enabled: true,
            workers: 4,
            ..Default::default()
        };
        s.gateway.retry.max_attempts = 1;
    })
    .await;
    test.set_faults(fast_bank(|f| {
        f.latency_ms = Latency {
            mean: 100.0,
            stddev: 0.0,
        }
    }));

    // Four workers and a 100 ms bank serve about 40 creates a second; 80 arrive within 400 ms.
    let creates = (0..80).map(|n| {
        let test = &test;
        async move {
            tokio::time::sleep(Duration::from_millis(5 * n)).await;
            let sent = std::time::Instant::now();
            let response = test
                .post_order(&format!("overload-{n}"), &order_body())
                .header("x-request-timeout-ms", "1000")
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            let detail = if status == 503 {
                response.json::<serde_json::Value>().await.unwrap()["detail"].to_string()
            } else {
                String::new()
            };
            (status, sent.elapsed(), detail)
        }
    });
    let answers = futures::future::join_all(creates).await;
    let created = answers.iter().filter(|(status, ..)| *status == 201).count();
    let shed: Vec<_> = answers
        .iter()
        .filter(|(status, ..)| *status == 503)
        .collect();
    assert!(
        created >= 4,
        "the queue serves what its workers can: {answers:?}"
    );
    assert!(!shed.is_empty(), "a standing queue sheds: {answers:?}");
    for (_, _, detail) in &shed {
        assert!(
            detail.contains("standing queue") || detail.contains("already waiting"),
            "{detail}"
        );
    }
    assert_eq!(
        created + shed.len(),
        80,
        "nothing ran out of its deadline: {answers:?}"
    );
    assert_eq!(
        test.chain.bank().stats().calls as usize,
        created,
        "a shed create was never executed"
    );
}
