//! The SSRF guard in the sender: a refused address is never dialled.

use std::{collections::HashMap, net::IpAddr, sync::Arc};

use idempotency::SystemClock;
use outbox::EndpointLimits;

use webhook_sender::Settings;

use crate::harness::{
    Answer, FixedResolver, Forbidden, Outbox, Receiver, settings, start_sender_resolving, wall_ms,
};

#[tokio::test]
async fn refused_addresses_are_never_dialled_and_redirects_are_not_followed() {
    let outbox = Outbox::new().await;
    // Three places on loopback that no delivery may reach.
    let private = Forbidden::listen([127, 0, 0, 9]).await;
    let mixed_private = Forbidden::listen([127, 0, 0, 10]).await;
    let redirected_to = Forbidden::listen([127, 0, 0, 11]).await;
    let resolver = FixedResolver(HashMap::from([
        ("internal.example.com".to_owned(), vec![private.addr.ip()]),
        (
            "mixed.example.com".to_owned(),
            vec![IpAddr::from([93, 184, 215, 14]), mixed_private.addr.ip()],
        ),
    ]));
    // Long: the error repeats only the start of it.
    let location = format!("http://{}/hook/{}", redirected_to.addr, "x".repeat(100_000));
    let redirecting =
        Receiver::start(move |_| Answer::Status(302, vec![("location", location.clone())])).await;

    let limits = EndpointLimits::default();
    let now = wall_ms();
    let (denied, _) = outbox
        .endpoint(
            &format!("https://internal.example.com:{}/hook", private.addr.port()),
            &[outbox::ORDER_PAID],
            limits,
            now,
        )
        .await;
    let (mixed, _) = outbox
        .endpoint(
            &format!(
                "https://mixed.example.com:{}/hook",
                mixed_private.addr.port()
            ),
            &[outbox::ORDER_PAID],
            limits,
            now,
        )
        .await;
    let (redirect, _) = outbox
        .endpoint(&redirecting.url(), &[outbox::ORDER_PAID], limits, now)
        .await;
    let _sender = start_sender_resolving(
        settings(&outbox, &[&redirecting]),
        Arc::new(SystemClock),
        resolver,
    )
    .await;
    let event_id = outbox.paid(wall_ms()).await;

    for (endpoint_id, listener) in [(&denied, &private), (&mixed, &mixed_private)] {
        let delivery = outbox.attempts(endpoint_id, &event_id, 1).await;
        let attempt = &delivery.attempts[0];
        let error = attempt.error.as_deref().expect("a refusal");
        assert_eq!(attempt.status_code, None, "nothing answered");
        assert_eq!(
            error, "destination not allowed",
            "no address, range or name is told to the endpoint's owner"
        );
        assert_eq!(listener.connections(), 0, "{} was dialled", listener.addr);
    }

    let delivery = outbox.attempts(&redirect, &event_id, 1).await;
    let attempt = &delivery.attempts[0];
    assert_eq!(attempt.status_code, Some(302));
    let error = attempt.error.as_deref().expect("a failure");
    assert!(
        error.contains("not followed") && error.contains(&redirected_to.addr.to_string()),
        "{error}"
    );
    assert!(
        error.len() < 300,
        "the Location is cut: {} bytes",
        error.len()
    );
    assert_eq!(redirected_to.connections(), 0, "the redirect was followed");
}

#[tokio::test]
async fn a_name_that_does_not_resolve_reads_as_a_denied_one_and_no_error_repeats_the_url() {
    let outbox = Outbox::new().await;
    // A port nobody listens on: the connection is refused.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("address");
    let limits = EndpointLimits::default();
    let now = wall_ms();
    let (unknown, _) = outbox
        .endpoint(
            "https://no-such-name.example.com/hook",
            &[outbox::ORDER_PAID],
            limits,
            now,
        )
        .await;
    let secret_path = "/hook/T0001/B0001/s3cr3t-t0k3n";
    let (refused, _) = outbox
        .endpoint(
            &format!("http://{closed}{secret_path}"),
            &[outbox::ORDER_PAID],
            limits,
            now,
        )
        .await;
    let settings = Settings {
        test_hosts: vec![closed.to_string()],
        ..settings(&outbox, &[])
    };
    let _sender =
        start_sender_resolving(settings, Arc::new(SystemClock), FixedResolver::default()).await;
    let event_id = outbox.paid(wall_ms()).await;

    let delivery = outbox.attempts(&unknown, &event_id, 1).await;
    assert_eq!(
        delivery.attempts[0].error.as_deref(),
        Some("destination not allowed"),
        "whether the name exists is not told"
    );
    let delivery = outbox.attempts(&refused, &event_id, 1).await;
    let error = delivery.attempts[0].error.as_deref().expect("a failure");
    assert!(
        !error.contains("s3cr3t") && !error.contains(&closed.to_string()),
        "the URL is not repeated: {error}"
    );
}
