//! Who may call orders: the gateway, on behalf of the clients it authenticated, and the operator
//! for reads. Every other service of the chain is refused.

use rpc::authorize::Policy;

pub fn policy() -> Policy {
    Policy::new().allow_for_clients("gateway", &["/orders.v1.Orders/*", "/orders.v1.Webhooks/*"]).allow_operator(&[
        "/orders.v1.Orders/GetOrder",
        "/orders.v1.Orders/Recommend",
        "/orders.v1.Webhooks/ListEndpoints",
        "/orders.v1.Webhooks/GetEndpoint",
        "/orders.v1.Webhooks/ListDeliveries",
    ])
}
