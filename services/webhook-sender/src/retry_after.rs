//! `Retry-After` of a 429 or 503: the recipient says when it can take the next delivery.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The wait a `Retry-After` header asks for at `now`: delay-seconds or an HTTP-date (a date in
/// the past asks for no wait). `None` when absent or unreadable.
pub(crate) fn requested_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if !value.is_empty() && value.bytes().all(|byte| byte.is_ascii_digit()) {
        // Too many digits for u64 is still a (very long) wait, which the caller clamps.
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().expect("header value"));
        headers
    }

    #[test]
    fn seconds_and_dates_are_both_read() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(
            requested_wait(&headers("2"), now),
            Some(Duration::from_secs(2))
        );
        let in_a_minute = httpdate::fmt_http_date(now + Duration::from_secs(60));
        assert_eq!(
            requested_wait(&headers(&in_a_minute), now),
            Some(Duration::from_secs(60))
        );
        let past = httpdate::fmt_http_date(now - Duration::from_secs(60));
        assert_eq!(requested_wait(&headers(&past), now), Some(Duration::ZERO));
    }

    #[test]
    fn nonsense_is_no_request() {
        let now = SystemTime::UNIX_EPOCH;
        for value in ["-1", "soon", "1.5", ""] {
            assert_eq!(requested_wait(&headers(value), now), None, "{value:?}");
        }
        assert_eq!(requested_wait(&HeaderMap::new(), now), None);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn delay_seconds_are_the_wait(seconds in any::<u64>(), before in " {0,2}", after in " {0,2}") {
            let value = format!("{before}{seconds}{after}");
            prop_assert_eq!(requested_wait(&headers(&value), SystemTime::UNIX_EPOCH), Some(Duration::from_secs(seconds)));
        }

        #[test]
        fn more_digits_than_u64_holds_are_the_longest_wait(digits in "[1-9][0-9]{20,40}") {
            prop_assert_eq!(requested_wait(&headers(&digits), SystemTime::UNIX_EPOCH), Some(Duration::from_secs(u64::MAX)));
        }

        #[test]
        fn a_date_asks_for_the_time_until_it_and_a_past_one_for_none(now_secs in 0u64..4_000_000_000, offset in -1_000_000_000i64..1_000_000_000) {
            let now = SystemTime::UNIX_EPOCH + Duration::from_secs(now_secs);
            let Some(date) = now_secs.checked_add_signed(offset) else { return Ok(()) };
            let value = httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(date));
            let expected = Duration::from_secs(date.saturating_sub(now_secs));
            prop_assert_eq!(requested_wait(&headers(&value), now), Some(expected), "{}", value);
        }

        #[test]
        fn other_text_asks_for_nothing(text in "[ -~]{0,40}") {
            let digits = text.trim();
            let readable = (!digits.is_empty() && digits.bytes().all(|byte| byte.is_ascii_digit())) || httpdate::parse_http_date(digits).is_ok();
            prop_assert_eq!(requested_wait(&headers(&text), SystemTime::UNIX_EPOCH).is_some(), readable, "{:?}", text);
        }
    }
}
