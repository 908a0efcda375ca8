//! What a failed create left behind, said on the failure itself: a client told "failed" must
//! know whether it can be charged later.
//!
//! A create that did not end (paid, or declined) ends in one of three ways, named by the
//! `reason` of a `google.rpc.ErrorInfo` in the status details (the HTTP face turns it into the
//! problem's `outcome`):
//! - [`FailedCreate::Refused`]: refused before anything could be charged. No order is left, and
//!   nothing is charged later; a repeat, with this key or another, starts afresh.
//! - [`FailedCreate::Pending`]: the order exists and its payment's outcome is not known yet (the
//!   bank may have charged and the answer been lost). It will be settled: by a repeat with the
//!   same key, or by orders itself if nobody repeats. Its order id says where to look; a new key
//!   would make a second order.
//! - [`FailedCreate::Unknown`]: the gateway lost track of the create (orders did not answer in
//!   time, or an earlier attempt did not): only a repeat with the same key can tell.

use std::collections::HashMap;

use tonic::{Status, metadata::MetadataMap};
use tonic_types::StatusExt;

/// The `ErrorInfo` reason of [`FailedCreate::Refused`].
pub const REFUSED: &str = "CREATE_REFUSED";
/// The `ErrorInfo` reason of [`FailedCreate::Pending`].
pub const PENDING: &str = "CREATE_OUTCOME_PENDING";
/// The `ErrorInfo` reason of [`FailedCreate::Unknown`].
pub const UNKNOWN: &str = "CREATE_OUTCOME_UNKNOWN";
/// The `ErrorInfo` metadata entry naming a pending create's order.
pub const ORDER_ID: &str = "order_id";

/// How a create that failed stands; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailedCreate {
    Refused,
    Pending { order_id: String },
    Unknown,
}

impl FailedCreate {
    /// The `ErrorInfo` reason naming this outcome.
    pub fn reason(&self) -> &'static str {
        match self {
            FailedCreate::Refused => REFUSED,
            FailedCreate::Pending { .. } => PENDING,
            FailedCreate::Unknown => UNKNOWN,
        }
    }

    /// What a failure says of its create, if it says anything.
    pub fn of(status: &Status) -> Option<Self> {
        let info = status.get_details_error_info()?;
        match info.reason.as_str() {
            REFUSED => Some(FailedCreate::Refused),
            PENDING => Some(FailedCreate::Pending {
                order_id: info.metadata.get(ORDER_ID)?.clone(),
            }),
            UNKNOWN => Some(FailedCreate::Unknown),
            _ => None,
        }
    }

    /// `status` saying this outcome, from `domain` (the service that decided it), its code,
    /// message, metadata and other details kept.
    pub fn on(&self, status: Status, domain: &str) -> Status {
        let mut details = status.get_error_details();
        let metadata = match self {
            FailedCreate::Pending { order_id } => {
                HashMap::from([(ORDER_ID.to_owned(), order_id.clone())])
            }
            FailedCreate::Refused | FailedCreate::Unknown => HashMap::new(),
        };
        details.set_error_info(self.reason(), domain, metadata);
        let metadata = MetadataMap::from_headers(status.metadata().clone().into_headers());
        Status::with_error_details_and_metadata(status.code(), status.message(), details, metadata)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;
    use tonic_types::ErrorDetails;

    #[test]
    fn an_outcome_reads_back_from_its_status_with_the_rest_kept() {
        let mut below = Status::with_error_details(
            Code::Unavailable,
            "payment: down",
            ErrorDetails::with_retry_info(None),
        );
        below
            .metadata_mut()
            .insert("x-relayed", "true".parse().unwrap());
        for outcome in [
            FailedCreate::Refused,
            FailedCreate::Pending {
                order_id: "ord_1".into(),
            },
            FailedCreate::Unknown,
        ] {
            let status = outcome.on(below.clone(), "orders");
            assert_eq!(FailedCreate::of(&status), Some(outcome.clone()));
            assert_eq!(
                (status.code(), status.message()),
                (Code::Unavailable, "payment: down")
            );
            assert_eq!(status.metadata().get("x-relayed").unwrap(), "true");
            assert!(
                status.get_details_retry_info().is_some(),
                "other details kept"
            );
            assert_eq!(status.get_details_error_info().unwrap().domain, "orders");
        }
        assert_eq!(
            FailedCreate::of(&below),
            None,
            "a failure that says nothing"
        );
    }
}
