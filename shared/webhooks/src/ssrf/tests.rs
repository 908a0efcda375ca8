use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::*;

/// Answers every name with the same addresses (or fails), and counts the look-ups.
struct StubResolver {
    answer: Option<Vec<IpAddr>>,
    lookups: AtomicUsize,
}

impl StubResolver {
    fn answering(addrs: &[&str]) -> Self {
        let answer = addrs.iter().map(|addr| addr.parse().unwrap()).collect();
        Self {
            answer: Some(answer),
            lookups: AtomicUsize::new(0),
        }
    }

    fn failing() -> Self {
        Self {
            answer: None,
            lookups: AtomicUsize::new(0),
        }
    }

    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

impl Resolve for StubResolver {
    async fn resolve(&self, _host: &str) -> io::Result<Vec<IpAddr>> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        self.answer
            .clone()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
    }
}

fn addr(text: &str) -> SocketAddr {
    text.parse().unwrap()
}

#[test]
fn the_parser_turns_numeric_tricks_into_the_loopback_address() {
    for trick in [
        "https://0x7f.1/",
        "https://2130706433/",
        "https://017700000001/",
        "https://127.1/",
    ] {
        let url = Url::parse(trick).unwrap();
        assert_eq!(url.host(), Some(Host::Ipv4(Ipv4Addr::LOCALHOST)), "{trick}");
    }
}

#[test]
fn trick_urls_are_refused() {
    let policy = DestinationPolicy::default();
    for trick in [
        "http://0x7f.1/",
        "http://2130706433/",
        "http://[::ffff:127.0.0.1]/",
        "http://169.254.169.254/",
        "http://[fd00:ec2::254]/",
    ] {
        assert!(Target::parse(trick, &policy).is_err(), "{trick}");
        // Over https the scheme passes, and the address itself is what refuses them.
        let over_https = trick.replacen("http:", "https:", 1);
        assert!(
            matches!(
                Target::parse(&over_https, &policy),
                Err(SsrfError::Denied { .. })
            ),
            "{over_https}"
        );
    }
}

#[test]
fn a_denial_names_the_address_and_the_range() {
    let Err(SsrfError::Denied { host, addr, range }) =
        Target::parse("https://[::ffff:127.0.0.1]/", &DestinationPolicy::default())
    else {
        panic!("an IPv4-mapped loopback address must be denied");
    };
    assert_eq!(host, "[::ffff:7f00:1]");
    assert_eq!(addr, "::ffff:127.0.0.1".parse::<IpAddr>().unwrap());
    assert_eq!(range.net.to_string(), "127.0.0.0/8");
}

#[test]
fn plain_http_is_refused_by_default() {
    assert!(matches!(
        Target::parse("http://hooks.example.com/", &DestinationPolicy::default()),
        Err(SsrfError::PlainHttp { port: 80, .. })
    ));
}

#[test]
fn other_schemes_and_user_information_are_refused() {
    let policy = DestinationPolicy::default();
    for url in [
        "ftp://example.com/",
        "file:///etc/passwd",
        "gopher://example.com/",
    ] {
        assert!(
            matches!(
                Target::parse(url, &policy),
                Err(SsrfError::UnsupportedScheme(_))
            ),
            "{url}"
        );
    }
    for url in [
        "https://user@example.com/",
        "https://user:secret@example.com/",
        "https://:secret@example.com/",
    ] {
        assert!(
            matches!(Target::parse(url, &policy), Err(SsrfError::Userinfo)),
            "{url}"
        );
    }
    assert!(matches!(
        Target::parse("not a url", &policy),
        Err(SsrfError::InvalidUrl(_))
    ));
}

#[tokio::test]
async fn a_test_host_may_use_http_and_a_loopback_address() {
    let policy = DestinationPolicy::default()
        .allow_test_host("127.0.0.1:8080")
        .unwrap();
    let resolver = StubResolver::failing();
    let vetted = vet("http://127.0.0.1:8080/hooks", &policy, &resolver)
        .await
        .unwrap();
    assert_eq!(vetted.addrs(), [addr("127.0.0.1:8080")]);
    assert_eq!(vetted.host(), "127.0.0.1");
    assert_eq!(vetted.url().path(), "/hooks");
    assert_eq!(resolver.lookups(), 0, "an IP address is not resolved");

    // The exemption is for that host and port only.
    assert!(matches!(
        Target::parse("http://127.0.0.1:8081/", &policy),
        Err(SsrfError::PlainHttp { .. })
    ));
    assert!(matches!(
        Target::parse("https://127.0.0.2:8080/", &policy),
        Err(SsrfError::Denied { .. })
    ));
}

#[tokio::test]
async fn a_test_host_name_is_normalised_like_the_url_host() {
    let policy = DestinationPolicy::default()
        .allow_test_host("Receiver.LOCAL:9000")
        .unwrap();
    let resolver = StubResolver::answering(&["172.18.0.5"]);
    let vetted = vet("http://receiver.local:9000/", &policy, &resolver)
        .await
        .unwrap();
    assert_eq!(vetted.addrs(), [addr("172.18.0.5:9000")]);
    assert!(matches!(
        DestinationPolicy::default().allow_test_host("[not-ipv6]:1"),
        Err(InvalidTestHost::Host { .. })
    ));
    for without_port in ["127.0.0.1", "localhost:http", "[::1]"] {
        assert!(
            matches!(
                DestinationPolicy::default().allow_test_host(without_port),
                Err(InvalidTestHost::NotHostPort(_))
            ),
            "{without_port}"
        );
    }
}

#[tokio::test]
async fn a_public_name_is_resolved_once_and_dialled_at_its_addresses() {
    let resolver = StubResolver::answering(&["1.1.1.1", "2606:4700:4700::1111", "1.1.1.1"]);
    let vetted = vet(
        "https://hooks.example.com:8443/in",
        &DestinationPolicy::default(),
        &resolver,
    )
    .await
    .unwrap();
    assert_eq!(resolver.lookups(), 1);
    assert_eq!(vetted.host(), "hooks.example.com");
    assert_eq!(
        vetted.addrs(),
        [addr("1.1.1.1:8443"), addr("[2606:4700:4700::1111]:8443")]
    );
}

#[tokio::test]
async fn a_name_with_one_private_address_is_refused_whole() {
    for answer in [["8.8.8.8", "10.0.0.7"], ["10.0.0.7", "8.8.8.8"]] {
        let resolver = StubResolver::answering(&answer);
        let refused = vet(
            "https://rebind.example.com/",
            &DestinationPolicy::default(),
            &resolver,
        )
        .await;
        let Err(SsrfError::Denied { host, addr, .. }) = refused else {
            panic!("{answer:?} must be refused, got {refused:?}");
        };
        assert_eq!(
            (host.as_str(), addr),
            ("rebind.example.com", "10.0.0.7".parse().unwrap())
        );
        assert_eq!(resolver.lookups(), 1);
    }
}

#[tokio::test]
async fn an_ipv4_mapped_answer_is_dialled_as_ipv4_and_vetted_as_ipv4() {
    let public = StubResolver::answering(&["::ffff:1.1.1.1"]);
    let vetted = vet(
        "https://mapped.example.com/",
        &DestinationPolicy::default(),
        &public,
    )
    .await
    .unwrap();
    assert_eq!(vetted.addrs(), [addr("1.1.1.1:443")]);

    let loopback = StubResolver::answering(&["::ffff:127.0.0.1"]);
    assert!(matches!(
        vet(
            "https://mapped.example.com/",
            &DestinationPolicy::default(),
            &loopback
        )
        .await,
        Err(SsrfError::Denied { .. })
    ));
}

#[tokio::test]
async fn resolution_failures_and_empty_answers_are_refused() {
    let policy = DestinationPolicy::default();
    assert!(matches!(
        vet(
            "https://missing.example.com/",
            &policy,
            &StubResolver::failing()
        )
        .await,
        Err(SsrfError::Resolve { .. })
    ));
    assert!(matches!(
        vet(
            "https://empty.example.com/",
            &policy,
            &StubResolver::answering(&[])
        )
        .await,
        Err(SsrfError::NoAddresses { .. })
    ));
}

#[tokio::test]
async fn the_system_resolver_finds_localhost_on_loopback_and_it_is_refused() {
    let refused = vet(
        "https://localhost/",
        &DestinationPolicy::default(),
        &SystemResolver,
    )
    .await;
    assert!(
        matches!(refused, Err(SsrfError::Denied { .. })),
        "{refused:?}"
    );
}

#[tokio::test]
async fn a_range_the_policy_denies_is_refused_beside_the_deny_list() {
    let policy = DestinationPolicy::default().deny("93.184.0.0/16".parse().unwrap());
    let inside = StubResolver::answering(&["93.184.215.14"]);
    let Err(SsrfError::DeniedByPolicy { addr, net, .. }) =
        vet("https://hooks.example.com/", &policy, &inside).await
    else {
        panic!("an address in an extra denied range must be refused");
    };
    assert_eq!(
        (addr.to_string(), net.to_string()),
        ("93.184.215.14".to_owned(), "93.184.0.0/16".to_owned())
    );
    assert!(
        Target::parse("https://93.184.1.1/", &policy).is_err(),
        "an IP address in place of a name too"
    );
    let outside = StubResolver::answering(&["1.1.1.1"]);
    assert!(
        vet("https://hooks.example.com/", &policy, &outside)
            .await
            .is_ok()
    );
}

#[test]
fn urls_are_kept_in_the_form_the_parser_gives_them() {
    let policy = DestinationPolicy::default();
    for (sent, stored) in [
        ("https:///h", "https://h/"),
        (
            "https://example.com\\@127.0.0.1/h",
            "https://example.com/@127.0.0.1/h",
        ),
        (
            "  https://Example.COM:443/a/../b  ",
            "https://example.com/b",
        ),
        (
            "https://example.com:8443/ä",
            "https://example.com:8443/%C3%A4",
        ),
    ] {
        let target = Target::parse(sent, &policy).unwrap();
        assert_eq!(target.normalised(), stored, "{sent:?}");
    }
}

#[test]
fn urls_over_the_length_limit_are_refused_as_sent_and_as_normalised() {
    let policy = DestinationPolicy::default();
    let base = "https://example.com/";
    let longest = format!("{base}{}", "a".repeat(MAX_URL_LEN - base.len()));
    assert!(Target::parse(&longest, &policy).is_ok());
    assert!(matches!(
        Target::parse(&format!("{longest}a"), &policy),
        Err(SsrfError::TooLong)
    ));
    // 700 characters that percent-encoding makes 2,100.
    let swelling = format!("{base}{}", "ä".repeat(350));
    assert!(swelling.len() < MAX_URL_LEN);
    assert!(matches!(
        Target::parse(&swelling, &policy),
        Err(SsrfError::TooLong)
    ));
}

#[test]
fn ports_of_a_hosts_own_services_are_refused() {
    let policy = DestinationPolicy::default();
    for port in [0, 22, 25, 80, 1023] {
        let url = format!("https://example.com:{port}/h");
        assert!(
            matches!(Target::parse(&url, &policy), Err(SsrfError::Port(p)) if p == port),
            "{url}"
        );
    }
    for port in [443, 1024, 8443, 65535] {
        assert!(
            Target::parse(&format!("https://example.com:{port}/h"), &policy).is_ok(),
            "{port}"
        );
    }
    let tests = DestinationPolicy::default()
        .allow_test_host("127.0.0.1:80")
        .unwrap();
    assert!(
        Target::parse("http://127.0.0.1:80/h", &tests).is_ok(),
        "a test host keeps its port"
    );
}

/// What every URL that [`Target::parse`] accepts under the production policy keeps to.
fn keeps_the_rules(target: &Target) -> Result<(), proptest::test_runner::TestCaseError> {
    use proptest::prelude::*;
    let normalised = target.normalised();
    prop_assert!(normalised.len() <= MAX_URL_LEN);
    let url = Url::parse(normalised).expect("the normalised form parses");
    prop_assert_eq!(url.scheme(), "https");
    prop_assert!(url.username().is_empty() && url.password().is_none());
    let port = url.port_or_known_default().expect("https has a port");
    prop_assert!(port == 443 || port >= 1024, "{}", port);
    prop_assert!(
        !normalised
            .chars()
            .any(|c| c.is_whitespace() || c.is_control())
    );
    // Normalising is done once: the stored form reads back as itself.
    let again = Target::parse(normalised, &DestinationPolicy::default())
        .expect("the normalised form passes again");
    prop_assert_eq!(again.normalised(), normalised);
    Ok(())
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    #[test]
    fn any_text_is_refused_or_keeps_the_rules(text in "\\PC{0,80}") {
        if let Ok(target) = Target::parse(&text, &DestinationPolicy::default()) {
            keeps_the_rules(&target)?;
        }
    }

    #[test]
    fn url_shaped_text_is_refused_or_keeps_the_rules(
        scheme in "https?|HTTPS|ftp|",
        slashes in "[/\\\\]{0,3}",
        userinfo in "([a-z]{1,5}(:[a-z]{0,5})?@)?",
        host in "[a-zA-Z0-9.-]{1,20}|[0-9]{1,10}|0x[0-9a-f]{1,8}|\\[[0-9a-f:]{2,20}\\]",
        port in proptest::option::of(proptest::prelude::any::<u32>()),
        path in "[ -~]{0,40}",
        padding in "[ \\t\\n]{0,2}",
    ) {
        let port = port.map(|port| format!(":{port}")).unwrap_or_default();
        let text = format!("{padding}{scheme}:{slashes}{userinfo}{host}{port}/{path}{padding}");
        if let Ok(target) = Target::parse(&text, &DestinationPolicy::default()) {
            keeps_the_rules(&target)?;
        }
    }

    #[test]
    fn a_url_is_accepted_up_to_the_length_limit_and_not_beyond(length in 21usize..3_000) {
        let base = "https://example.com/";
        let text = format!("{base}{}", "a".repeat(length - base.len()));
        proptest::prop_assert_eq!(Target::parse(&text, &DestinationPolicy::default()).is_ok(), length <= MAX_URL_LEN);
    }
}
