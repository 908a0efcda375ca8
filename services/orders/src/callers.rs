//! Who may call orders: the gateway, on behalf of the clients it authenticated, and the operator
//! to describe it. Every other service of the chain is refused.

use rpc::authorize::Policy;

pub(crate) fn policy() -> Policy {
    Policy::new()
        .allow_for_clients("gateway", &["/orders.v1.Orders/*", "/orders.v1.Webhooks/*"])
        .allow_operator()
}
