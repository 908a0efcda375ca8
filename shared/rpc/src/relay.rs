use sha2::{Digest, Sha256};
use tonic::{
    Status,
    metadata::{MetadataMap, MetadataValue},
};

use resilience::retry::{Pushback, pushback};

/// The most of a failure's message a hop passes up, in bytes.
pub(crate) const MAX_RELAYED_MESSAGE: usize = 1_024;
/// The most of a failure's details a hop passes up, in bytes; larger details are dropped.
pub(crate) const MAX_RELAYED_DETAILS: usize = 2_048;

/// Passes a dependency's failure up unchanged: same code, same message (every hop names itself in
/// the messages it makes, so the message already says which hop failed), marked as relayed (so
/// that breakers above do not blame this hop), and what the hops above need to decide on a retry
/// and on what the failure left behind: the pushback, the fail-fast, open-circuit, full-bulkhead
/// and not-executed marks, the status details, and the edge's own mark that it stopped retrying
/// for its limits. Other metadata (including the dependency's ledger, which the deadline layers
/// carry separately) is not copied.
///
/// The message and details are bounded ([`MAX_RELAYED_MESSAGE`], [`MAX_RELAYED_DETAILS`]): they
/// travel in HTTP/2 trailers, and a caller whose header limits they exceed sees a protocol error
/// instead of the failure, which its breaker would count against the hop that relayed it.
pub fn relay(status: &Status) -> Status {
    let mut metadata = MetadataMap::new();
    for key in [
        wire::DEADLINE_FAILED_FAST,
        wire::CIRCUIT_OPEN,
        wire::BULKHEAD_FULL,
        wire::NOT_EXECUTED,
        wire::RETRIES_SPENT,
    ] {
        if let Some(value) = status.metadata().get(key) {
            metadata.insert(key, value.clone());
        }
    }
    // The pushback as read, not as written: at most MAX_PUSHBACK, and anything negative or
    // unreadable as -1 ("do not retry"), so that no hop passes on a wait nobody could keep.
    if status.metadata().contains_key(wire::RETRY_PUSHBACK_MS) {
        let value = match pushback(status) {
            Pushback::Wait(wait) => {
                MetadataValue::from(u64::try_from(wait.as_millis()).unwrap_or(u64::MAX))
            }
            Pushback::None | Pushback::DoNotRetry => MetadataValue::from_static("-1"),
        };
        metadata.insert(wire::RETRY_PUSHBACK_MS, value);
    }
    metadata.insert(wire::RELAYED, MetadataValue::from_static("true"));
    // The details (e.g. a google.rpc.RetryInfo) travel too, unless they are oversized.
    let details = if status.details().len() <= MAX_RELAYED_DETAILS {
        status.details().to_vec()
    } else {
        Vec::new()
    };
    Status::with_details_and_metadata(
        status.code(),
        bounded(status.message()),
        details.into(),
        metadata,
    )
}

/// `message` cut to at most [`MAX_RELAYED_MESSAGE`] bytes, on a character boundary, marked with
/// `…` where it was cut.
fn bounded(message: &str) -> String {
    if message.len() <= MAX_RELAYED_MESSAGE {
        return message.to_owned();
    }
    let mut end = MAX_RELAYED_MESSAGE - '…'.len_utf8();
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &message[..end])
}

/// Whether a failure says that the call was not executed: a guard refused to send it on, or an
/// intake refused it, at the hop that answered or below it (the mark is relayed). Nothing
/// happened below that point, so a call whose every effect lies there had none.
pub fn not_executed(status: &Status) -> bool {
    status.metadata().contains_key(wire::NOT_EXECUTED)
}

/// The idempotency key a hop sends downstream for `purpose`, derived from the key it received:
/// every repeat of one operation reaches the next hop with the same key, and keys of different
/// purposes or clients never collide. 64 hex characters, within every hop's key limit.
pub fn derive_key(purpose: &str, scope: &str, key: &str) -> String {
    let mut hasher = Sha256::new();
    for part in [purpose, scope, key] {
        hasher.update(part.len().to_be_bytes());
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn relay_keeps_code_message_and_the_marks_the_edge_needs() {
        let mut status = Status::resource_exhausted("bank-mock: slow down");
        status
            .metadata_mut()
            .insert(wire::RETRY_PUSHBACK_MS, "300".parse().unwrap());
        status
            .metadata_mut()
            .insert("x-deadline-ledger", "bank-mock;received=1".parse().unwrap());
        status
            .metadata_mut()
            .insert(wire::DEADLINE_FAILED_FAST, "payment".parse().unwrap());
        status
            .metadata_mut()
            .insert(wire::CIRCUIT_OPEN, "bank-mock".parse().unwrap());
        status
            .metadata_mut()
            .insert(wire::BULKHEAD_FULL, "bank-mock".parse().unwrap());
        status
            .metadata_mut()
            .insert(wire::RETRIES_SPENT, "budget".parse().unwrap());
        status
            .metadata_mut()
            .insert(wire::NOT_EXECUTED, "bank-mock".parse().unwrap());
        let relayed = relay(&status);
        assert_eq!(relayed.code(), Code::ResourceExhausted);
        assert_eq!(relayed.message(), "bank-mock: slow down");
        assert_eq!(
            relayed.metadata().get(wire::RETRY_PUSHBACK_MS).unwrap(),
            "300"
        );
        assert_eq!(
            relayed.metadata().get(wire::DEADLINE_FAILED_FAST).unwrap(),
            "payment"
        );
        assert_eq!(
            relayed.metadata().get(wire::CIRCUIT_OPEN).unwrap(),
            "bank-mock"
        );
        assert_eq!(
            relayed.metadata().get(wire::BULKHEAD_FULL).unwrap(),
            "bank-mock"
        );
        assert_eq!(
            relayed.metadata().get(wire::RETRIES_SPENT).unwrap(),
            "budget"
        );
        assert!(
            not_executed(&relayed),
            "callers above know that nothing happened below"
        );
        assert_eq!(
            relayed.metadata().get(wire::RELAYED).unwrap(),
            "true",
            "breakers above do not blame the relaying hop"
        );
        assert!(relayed.metadata().get("x-deadline-ledger").is_none());
    }

    #[test]
    fn a_relayed_message_and_details_are_bounded() {
        let long = "é".repeat(MAX_RELAYED_MESSAGE);
        let status = Status::with_details(
            Code::InvalidArgument,
            format!("orders: unknown {long}"),
            vec![0; MAX_RELAYED_DETAILS + 1].into(),
        );
        let relayed = relay(&status);
        assert!(
            relayed.message().len() <= MAX_RELAYED_MESSAGE && relayed.message().ends_with('…'),
            "{}",
            relayed.message().len()
        );
        assert!(relayed.message().starts_with("orders: unknown é"));
        assert!(
            relayed.details().is_empty(),
            "oversized details are dropped"
        );
        let short = Status::with_details(Code::Unavailable, "payment: down", vec![1, 2, 3].into());
        assert_eq!(
            (relay(&short).message(), relay(&short).details()),
            ("payment: down", &[1u8, 2, 3][..])
        );
    }

    #[test]
    fn a_relayed_pushback_is_bounded() {
        for (sent, relayed) in [
            ("300", "300"),
            (i64::MAX.to_string().as_str(), "3600000"),
            ("-5", "-1"),
            ("soon", "-1"),
        ] {
            let mut status = Status::resource_exhausted("bank-mock: slow down");
            status
                .metadata_mut()
                .insert(wire::RETRY_PUSHBACK_MS, sent.parse().unwrap());
            assert_eq!(
                relay(&status)
                    .metadata()
                    .get(wire::RETRY_PUSHBACK_MS)
                    .unwrap(),
                relayed,
                "{sent}"
            );
        }
    }

    #[test]
    fn derived_keys_are_stable_and_separated() {
        let key = derive_key("payment", "client-1", "k-1");
        assert_eq!(key, derive_key("payment", "client-1", "k-1"));
        assert_eq!(key.len(), 64);
        assert_ne!(key, derive_key("payment", "client-2", "k-1"));
        assert_ne!(key, derive_key("bank", "client-1", "k-1"));
        // Length prefixes keep ("ab", "c") and ("a", "bc") apart.
        assert_ne!(derive_key("p", "ab", "c"), derive_key("p", "a", "bc"));
    }
}
