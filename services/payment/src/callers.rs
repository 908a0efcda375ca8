//! Who may call payment: orders, to pay for its orders, the gateway, to read a payment for an order
//! summary, and the operator, to describe it.

use rpc::authorize::Policy;

const GET_PAYMENT: &str = "/payment.v1.PaymentService/GetPayment";

pub(crate) fn policy() -> Policy {
    Policy::new()
        .allow("orders", &["/payment.v1.PaymentService/Pay"])
        .allow("gateway", &[GET_PAYMENT])
        .allow_operator()
}
