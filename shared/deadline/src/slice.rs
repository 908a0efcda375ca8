//! The slice a call was given, named on its DEADLINE_EXCEEDED, so that the caller's guards judge
//! the expiry by it.
//!
//! Why? An expiry says as much about the slice as about the dependency: the client chooses the
//! budget, so a client that sends 100 ms deadlines makes every call below it expire without the
//! dependency being slow. A breaker that counted those would open for every client; an edge that
//! retried them would send the same too-short call again. With the slice named, a breaker blames
//! the dependency only for a slice it could have used, and the edge retries only a slice that was
//! capped below what was left (a retry can have the same slice again).

use std::time::Duration;

use http::{HeaderMap, HeaderValue};

const CAPPED: &str = "; capped";

/// The slice a call was given, as [`wire::DEADLINE_SLICE`] carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// The slice, whole milliseconds rounded up.
    pub given: Duration,
    /// Less than what the hop had left after its reserve.
    pub capped: bool,
}

impl Slice {
    pub fn new(given: Duration, capped: bool) -> Self {
        Self {
            given: Duration::from_millis(given.as_nanos().div_ceil(1_000_000) as u64),
            capped,
        }
    }

    /// The slice named in `headers` (a status's metadata, or a response's headers), if any.
    pub fn from_headers(headers: &HeaderMap) -> Option<Self> {
        let text = headers.get(wire::DEADLINE_SLICE)?.to_str().ok()?;
        let (millis, capped) = match text.strip_suffix(CAPPED) {
            Some(millis) => (millis, true),
            None => (text, false),
        };
        Some(Self {
            given: Duration::from_millis(millis.trim().parse().ok()?),
            capped,
        })
    }

    pub fn header_value(&self) -> HeaderValue {
        let millis = self.given.as_millis();
        let text = if self.capped {
            format!("{millis}{CAPPED}")
        } else {
            millis.to_string()
        };
        HeaderValue::try_from(text).expect("digits are a header value")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_round_trips_rounded_up_to_the_millisecond() {
        for slice in [
            Slice::new(Duration::from_micros(1_477_001), false),
            Slice::new(Duration::from_millis(1_500), true),
        ] {
            let mut headers = HeaderMap::new();
            headers.insert(wire::DEADLINE_SLICE, slice.header_value());
            assert_eq!(Slice::from_headers(&headers), Some(slice));
        }
        assert_eq!(
            Slice::new(Duration::from_micros(1_477_001), false).given,
            Duration::from_millis(1_478)
        );
        assert_eq!(Slice::from_headers(&HeaderMap::new()), None);
        let mut garbled = HeaderMap::new();
        garbled.insert(wire::DEADLINE_SLICE, HeaderValue::from_static("soon"));
        assert_eq!(Slice::from_headers(&garbled), None);
    }
}
