//! Every named scenario runs to its end and reports what it is meant to show.

use stack::{Chain, ChainSettings, scenario};

async fn run(name: &str) -> scenario::Report {
    let data = tempfile::tempdir().unwrap();
    let chain = Chain::start(ChainSettings::default().ephemeral().with_data_dir(data.path())).await.unwrap();
    let report = scenario::run(&chain, &scenario::find(name).unwrap()).await;
    chain.stop().await.unwrap();
    assert!(report.to_string().contains(&format!("Scenario {name}")));
    report
}

#[tokio::test]
async fn healthy_pays_every_order_with_one_bank_call_each() {
    let report = run("healthy").await;
    assert_eq!(report.outcomes.get(&201), Some(&report.requests));
    assert_eq!(report.bank_calls_per_request, 1.0);
    assert_eq!(report.bank.charges as usize, report.requests);
    assert_eq!(report.sample_ledger.unwrap().split(", ").count(), 4);
}

#[tokio::test]
async fn bank_hang_ends_every_request_in_504_with_no_work_after_the_deadline() {
    let report = run("bank-hang").await;
    assert_eq!(report.outcomes.get(&504), Some(&report.requests));
    assert_eq!((report.bank.charges, report.bank.late_completions), (0, 0));
    for hop in [report.hops.gateway_http, report.hops.orders, report.hops.payment, report.hops.bank] {
        assert_eq!(hop.finished_late, 0);
    }
    assert!(report.latency_ms.max < 500.0 + 750.0, "{:?}", report.latency_ms);
}

#[tokio::test]
async fn bank_slow_mixes_paid_orders_and_timeouts_without_extra_bank_calls() {
    let report = run("bank-slow").await;
    assert_eq!(report.outcomes.keys().copied().filter(|s| *s != 201 && *s != 504).count(), 0, "{:?}", report.outcomes);
    assert!(report.outcomes.contains_key(&201), "some orders are paid: {:?}", report.outcomes);
    assert_eq!(report.bank_calls_per_request, 1.0);
}

#[test]
fn the_catalogue_names_are_unique() {
    let names: Vec<_> = scenario::catalogue().iter().map(|s| s.name).collect();
    let unique: std::collections::BTreeSet<_> = names.iter().collect();
    assert_eq!(names.len(), unique.len(), "{names:?}");
}
