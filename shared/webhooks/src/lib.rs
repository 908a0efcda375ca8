//! Outgoing webhooks: Standard Webhooks v1 signatures and the guard that vets where a delivery
//! may go.
//!
//! Why one crate for both? They are the two halves of trusting a webhook: the receiver must be
//! able to trust that a delivery came from us ([`signature`]), and we must be able to trust that
//! a recipient's URL does not point the sender back into our own network ([`ssrf`]). The sender
//! uses both; a receiver needs [`signature::Verifier`] and, to process each delivery once,
//! [`dedupe::SeenIds`] (see the example receiver, `services/webhook-receiver`).

pub mod dedupe;
pub mod signature;
pub mod ssrf;
