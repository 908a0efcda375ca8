//! Which failures a retry can fix, and what the server asked us to wait.

use std::time::Duration;

use tonic::{Code, Status};
use tonic_types::StatusExt;

/// Transient failures: another attempt may succeed. Everything else (INVALID_ARGUMENT, NOT_FOUND,
/// ALREADY_EXISTS, FAILED_PRECONDITION, PERMISSION_DENIED, UNAUTHENTICATED, …) would fail the same
/// way again. RESOURCE_EXHAUSTED is retried only when the server says how long to wait.
pub fn is_transient(code: Code) -> bool {
    matches!(code, Code::Unavailable | Code::DeadlineExceeded)
}

/// What a failure says about waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushback {
    /// No instruction: use the backoff.
    None,
    /// Wait exactly this long before the next attempt.
    Wait(Duration),
    /// Negative or unreadable: the server says do not retry.
    DoNotRetry,
}

/// The longest wait a pushback can ask for; a longer one is read as this. No deadline is that
/// long, so it means "not within this operation", and it keeps a `Retry-After` made from it sane.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(60 * 60);

/// Reads `grpc-retry-pushback-ms`, or failing that a `google.rpc.RetryInfo` detail; a wait is at
/// most [`MAX_PUSHBACK`].
pub fn pushback(status: &Status) -> Pushback {
    if let Some(value) = status.metadata().get(wire::RETRY_PUSHBACK_MS) {
        return match value
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse::<i64>().ok())
        {
            Some(millis) if millis >= 0 => {
                Pushback::Wait(Duration::from_millis(millis.unsigned_abs()).min(MAX_PUSHBACK))
            }
            _ => Pushback::DoNotRetry,
        };
    }
    // A RetryInfo without a delay names no wait, so the backoff decides (it does not say "stop").
    match status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
    {
        Some(delay) => Pushback::Wait(delay.min(MAX_PUSHBACK)),
        None => Pushback::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    fn with_pushback(value: &str) -> Status {
        let mut status = Status::resource_exhausted("slow down");
        status
            .metadata_mut()
            .insert(wire::RETRY_PUSHBACK_MS, value.parse().unwrap());
        status
    }

    #[test]
    fn pushback_header_values() {
        assert_eq!(
            pushback(&with_pushback("300")),
            Pushback::Wait(Duration::from_millis(300))
        );
        assert_eq!(
            pushback(&with_pushback("0")),
            Pushback::Wait(Duration::ZERO)
        );
        assert_eq!(pushback(&with_pushback("-1")), Pushback::DoNotRetry);
        assert_eq!(pushback(&with_pushback("soon")), Pushback::DoNotRetry);
        assert_eq!(
            pushback(&with_pushback(&i64::MAX.to_string())),
            Pushback::Wait(MAX_PUSHBACK)
        );
        assert_eq!(
            pushback(&with_pushback(&i64::MIN.to_string())),
            Pushback::DoNotRetry
        );
        assert_eq!(pushback(&Status::unavailable("down")), Pushback::None);
    }

    #[test]
    fn retry_info_detail_is_read_when_there_is_no_header() {
        let details = ErrorDetails::with_retry_info(Some(Duration::from_millis(750)));
        let status = Status::with_error_details(Code::ResourceExhausted, "slow down", details);
        assert_eq!(
            pushback(&status),
            Pushback::Wait(Duration::from_millis(750))
        );
    }

    #[test]
    fn a_retry_info_without_a_delay_leaves_the_wait_to_the_backoff() {
        let status = Status::with_error_details(
            Code::Unavailable,
            "down",
            ErrorDetails::with_retry_info(None),
        );
        assert_eq!(pushback(&status), Pushback::None);
    }

    #[test]
    fn only_transient_codes_are_retryable() {
        for code in [Code::Unavailable, Code::DeadlineExceeded] {
            assert!(is_transient(code), "{code:?}");
        }
        for code in [
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::FailedPrecondition,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::ResourceExhausted,
            Code::Internal,
            Code::Cancelled,
            Code::Aborted,
            Code::Unimplemented,
        ] {
            assert!(!is_transient(code), "{code:?}");
        }
    }
}
