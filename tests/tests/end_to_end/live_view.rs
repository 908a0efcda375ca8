//! The live view of the guards (`/guards` and `/guards.json` on every operations port), opened in
//! headless Chromium: every value the document holds is on the page, as the document says it.
//! Needs Debian's `chromium` (`.ci/run` installs it).

use std::{net::SocketAddr, process::Command, time::Duration};

use e2e::{TestChain, fast_bank, missing, order_body};
use serde_json::Value;
use stack::chain::{GATEWAY_OPS, PAYMENT_OPS};

/// Values that move with the clock alone: when the document was taken, and an open breaker's
/// wait. Every other value holds still while the chain is quiet.
const MOVING: [&str; 2] = ["at_unix_ms", "probes_in_ms"];

fn chromium_runs() -> bool {
    Command::new("chromium")
        .arg("--version")
        .output()
        .is_ok_and(|output| output.status.success())
}

/// The page at `url` as headless Chromium has drawn it after a few seconds (of its virtual
/// clock: the page's timers run, each fetch is waited for).
async fn drawn_page(url: String) -> String {
    let profile = tempfile::tempdir().unwrap();
    let mut chromium = Command::new("chromium");
    chromium
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--virtual-time-budget=3000",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(url);
    // Off the runtime's thread: the chain goes on serving while the browser reads it.
    let drawing = tokio::task::spawn_blocking(move || chromium.output());
    let output = tokio::time::timeout(Duration::from_secs(60), drawing)
        .await
        .expect("chromium finishes in 60 s")
        .unwrap()
        .expect("chromium runs");
    assert!(
        output.status.success(),
        "chromium failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// Every element naming a field (`data-field="…"`), with its text (the script, which names
/// fields too, follows what it drew).
fn shown_fields(page: &str) -> Vec<(String, String)> {
    let unescape = |text: &str| {
        text.replace("&lt;", "<")
            .replace("&gt;", ">")
            .replace("&quot;", "\"")
            .replace("&amp;", "&")
    };
    let drawn = page.split("<script").next().unwrap_or_default();
    drawn
        .split("data-field=\"")
        .skip(1)
        .map(|rest| {
            let (path, rest) = rest.split_once('"').expect("a closed attribute");
            let text = rest
                .split_once('>')
                .expect("a closed tag")
                .1
                .split('<')
                .next()
                .unwrap_or_default();
            (unescape(path), unescape(text))
        })
        .collect()
}

/// The document's values by the paths the page names them with: objects by key, the faces and
/// dependencies by name, other arrays by position.
fn leaves(value: &Value, path: &str, into: &mut Vec<(String, Value)>) {
    let join = |key: &str| {
        if path.is_empty() {
            key.to_owned()
        } else {
            format!("{path}.{key}")
        }
    };
    match value {
        Value::Object(object) => object
            .iter()
            .filter(|(key, _)| key.as_str() != "name")
            .for_each(|(key, inner)| leaves(inner, &join(key), into)),
        Value::Array(items) => {
            for (n, item) in items.iter().enumerate() {
                let key = item
                    .get("name")
                    .and_then(Value::as_str)
                    .map_or(n.to_string(), str::to_owned);
                leaves(item, &join(&key), into);
            }
        }
        leaf => into.push((path.to_owned(), leaf.clone())),
    }
}

/// Whether `text` is how the page writes `value` of field `path`.
fn shows(path: &str, text: &str, value: &Value) -> bool {
    let key = path.rsplit('.').next().unwrap_or_default();
    match value {
        Value::Null => text == "–",
        Value::Bool(flag) => text == if *flag { "yes" } else { "no" },
        Value::String(string) => text == string,
        Value::Number(number) if key == "at_unix_ms" => {
            humantime::parse_rfc3339(text).is_ok_and(|at| {
                at.duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_millis() as u64
                    == number.as_u64().unwrap()
            })
        }
        Value::Number(number) => {
            let number = number.as_f64().unwrap();
            let near = |shown: &str, expected: f64| {
                shown
                    .parse::<f64>()
                    .is_ok_and(|shown| (shown - expected).abs() <= 0.051)
            };
            match (text.strip_suffix(" %"), text.strip_suffix(" ms")) {
                (Some(percent), _) => near(percent, number * 100.0),
                (_, Some(millis)) => near(millis, number),
                _ => text.parse::<f64>().is_ok_and(|shown| shown == number),
            }
        }
        _ => false,
    }
}

async fn document(ops: SocketAddr) -> Value {
    reqwest::get(format!("http://{ops}/guards.json"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// What the page at `ops` shows that the document does not hold: empty when the page shows the
/// document as it was before or after the page was drawn.
async fn mismatches(ops: SocketAddr) -> Vec<String> {
    let before = document(ops).await;
    let page = drawn_page(format!("http://{ops}/guards")).await;
    let after = document(ops).await;
    let shown = shown_fields(&page);
    assert!(!shown.is_empty(), "the page drew nothing:\n{page}");
    let (mut earlier, mut later) = (Vec::new(), Vec::new());
    leaves(&before, "", &mut earlier);
    leaves(&after, "", &mut later);
    let mut wrong = Vec::new();
    for (path, value) in &later {
        let moving = MOVING.iter().any(|key| path.ends_with(key)) && !path.contains(".recent.");
        let on_page = shown
            .iter()
            .find(|(field, _)| field == path)
            .map(|(_, text)| text.as_str());
        let held_before = earlier
            .iter()
            .find(|(field, _)| field == path)
            .map(|(_, value)| value);
        match on_page {
            None if held_before.is_some() => {
                wrong.push(format!("{path} = {value} is not on the page"))
            }
            Some(text)
                if !moving
                    && !shows(path, text, value)
                    && !held_before.is_some_and(|before| shows(path, text, before)) =>
            {
                wrong.push(format!(
                    "{path}: the page shows {text:?}, the document {value}"
                ))
            }
            _ => {}
        }
    }
    for (field, text) in &shown {
        if !later.iter().any(|(path, _)| path == field)
            && !earlier.iter().any(|(path, _)| path == field)
        {
            wrong.push(format!(
                "the page shows {field} = {text:?}, which the document does not hold"
            ));
        }
    }
    wrong
}

#[tokio::test]
async fn the_page_shows_every_guard_as_the_document_has_it() {
    if !chromium_runs() {
        return missing(
            "chromium (Debian's package)",
            "the live view was not checked in a browser",
        );
    }
    let test = TestChain::start_with(|s| {
        e2e::touchy_bank_guards(s);
        s.payment.bank.max_concurrent = 8;
        s.payment.bank.adaptive_limit.enabled = true;
        s.gateway.queue.enabled = true;
    })
    .await;
    // A bank that fails everything: payment's breaker opens and stays open, the gateway
    // retries, and each face has answers and ledgers to show.
    test.set_faults(fast_bank(|f| f.error_rate = 1.0));
    for n in 0..8 {
        let response = test
            .post_order(&format!("failing-{n}"), &order_body())
            .send()
            .await
            .unwrap();
        assert!(response.status().is_server_error(), "{}", response.status());
    }
    let ops = test.chain.addresses();
    let payment = document(ops[&PAYMENT_OPS]).await;
    let bank = &payment["dependencies"][0];
    assert_eq!(
        (bank["name"].as_str(), bank["breaker"]["position"].as_str()),
        (Some("bank-mock"), Some("open")),
        "{payment:#}"
    );
    assert_eq!(bank["bulkhead"]["adaptive"], true);
    // Quiet until the latency estimates' windows have emptied and the retry floor has refilled.
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    for (service, address) in [
        ("gateway", ops[&GATEWAY_OPS]),
        ("payment", ops[&PAYMENT_OPS]),
    ] {
        let mut attempts = 0;
        loop {
            // Background work (orders finishing what the bank left unknown) may move a value
            // twice while the page is drawn: then the page is drawn again.
            let wrong = mismatches(address).await;
            attempts += 1;
            if wrong.is_empty() {
                break;
            }
            assert!(
                attempts < 3,
                "{service}'s page differs from its document:\n{}",
                wrong.join("\n")
            );
        }
    }
}
