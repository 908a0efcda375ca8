//! The whole harness with the smoke profile: every comparison runs end to end and lands in the
//! JSON and the Markdown, so the harness cannot rot between full runs.

use bench::{Options, Profile};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_smoke_profile_makes_every_comparison_and_writes_them() {
    let options = Options {
        profile: Profile::smoke(),
        postgres_url: std::env::var("TEST_POSTGRES_URL").ok(),
        command: "cargo test -p bench --test smoke".into(),
        bench_executable: env!("CARGO_BIN_EXE_bench").into(),
    };
    let report = bench::run(&options).await.expect("the smoke run finishes");
    let dir = tempfile::tempdir().unwrap();
    let written = bench::write(&report, dir.path()).unwrap();

    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&written.json).unwrap()).unwrap();
    for section in [
        "machine",
        "profile",
        "overhead",
        "deadline_precision",
        "amplification",
        "fail_fast",
        "memory",
        "idempotency",
        "tracing",
        "statements",
    ] {
        assert!(
            json.get(section).is_some_and(|value| !value.is_null()),
            "the JSON has no {section}"
        );
    }
    assert_eq!(json["profile"]["name"], "smoke");
    let chains: Vec<&str> = json["overhead"]["chains"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["chain"].as_str().unwrap())
        .collect();
    assert_eq!(
        chains,
        [
            "every layer",
            "guards idle",
            "every layer, plain text",
            "every layer, adaptive guards",
            "bare tonic",
            "minimal writes"
        ]
    );
    assert_eq!(
        json["overhead"]["ratios"].as_array().unwrap().len(),
        10,
        "each layered chain against each baseline, mutual TLS against plain text, adaptive guards against fixed"
    );
    let tracing = &json["tracing"]["measured"];
    assert!(
        tracing["spans_received"]
            .as_u64()
            .is_some_and(|spans| spans > 0),
        "the traced rounds exported: {tracing}"
    );
    assert!(tracing["p50_ratio"].as_f64().is_some(), "{tracing}");
    assert_eq!(
        json["deadline_precision"]["faces"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
    assert_eq!(json["amplification"]["runs"].as_array().unwrap().len(), 4);
    assert_eq!(json["fail_fast"]["guards"].as_array().unwrap().len(), 2);
    let memory = &json["memory"]["runs"];
    assert!(
        memory["measured"]
            .as_array()
            .is_some_and(|runs| runs.len() == 2)
            || memory["not_measured"]["reason"].is_string(),
        "{memory}"
    );
    for sqlite in ["sqlite", "sqlite_normal"] {
        assert!(
            json["idempotency"][sqlite]["first"]["due"]
                .as_u64()
                .is_some_and(|due| due > 0),
            "{sqlite}"
        );
    }
    let postgres = &json["idempotency"]["postgres"];
    match options.postgres_url {
        Some(_) => assert!(postgres["measured"]["throughput"].is_object(), "{postgres}"),
        None => assert!(
            postgres["not_measured"]["reason"]
                .as_str()
                .unwrap()
                .contains("no PostgreSQL"),
            "{postgres}"
        ),
    }

    let sqlite = &json["statements"]["sqlite"];
    for backend in std::iter::once(sqlite).chain(
        options
            .postgres_url
            .as_ref()
            .map(|_| &json["statements"]["postgres"]["measured"]),
    ) {
        let rounds = backend["rounds"]
            .as_array()
            .unwrap_or_else(|| panic!("{backend}"));
        assert_eq!(rounds.len(), 3, "{backend}");
        let trips = |round: &serde_json::Value| {
            round["trips_per_request"]
                .as_f64()
                .unwrap_or_else(|| panic!("{round}"))
        };
        for round in rounds {
            assert!(
                round["successes"].as_u64().is_some_and(|n| n > 0),
                "{round}"
            );
            assert!(
                round["total_per_request"].as_f64().is_some_and(|n| n > 0.0),
                "{round}"
            );
            // A replay on SQLite reads on the caller's thread: no trip to the writer, but for the
            // chain's background polls that may fall in its round.
            let replay_on_sqlite = std::ptr::eq(backend, sqlite)
                && round["label"]
                    .as_str()
                    .is_some_and(|label| label.starts_with("replays"));
            if !replay_on_sqlite {
                assert!(trips(round) > 0.0, "{round}");
            }
        }
        let (creates, replays) = (&rounds[0], &rounds[1]);
        assert!(
            trips(replays) < trips(creates),
            "a replay writes nothing: {replays} against {creates}"
        );
    }

    let markdown = std::fs::read_to_string(&written.markdown).unwrap();
    for heading in [
        "# Benchmarks",
        "## 1. Overhead",
        "## 2. Deadline precision",
        "## 3. Amplification",
        "## 4. Fail-fast",
        "## 5. Memory",
        "## 6. Idempotency",
        "## 7. Tracing",
        "## 8. Queries and statements",
    ] {
        assert!(
            markdown.contains(heading),
            "BENCHMARKS.md has no {heading:?}:\n{markdown}"
        );
    }
    assert_eq!(markdown, report.to_string());
}
