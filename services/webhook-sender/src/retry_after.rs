//! `Retry-After` of a 429 or 503: the recipient says when it can take the next delivery.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// The wait a `Retry-After` header asks for at `now`: delay-seconds or an HTTP-date (a date in
/// the past asks for no wait). `None` when absent or unreadable.
pub fn requested_wait(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
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

    fn headers(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(RETRY_AFTER, value.parse().expect("header value"));
        headers
    }

    #[test]
    fn seconds_and_dates_are_both_read() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(requested_wait(&headers("2"), now), Some(Duration::from_secs(2)));
        let in_a_minute = httpdate::fmt_http_date(now + Duration::from_secs(60));
        assert_eq!(requested_wait(&headers(&in_a_minute), now), Some(Duration::from_secs(60)));
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
}
