//! Who may call the bank: payment, to charge, the gateway, to read exchange rates, and the
//! operator, to describe it.

use rpc::authorize::Policy;

const GET_EXCHANGE_RATE: &str = "/bank.v1.Bank/GetExchangeRate";

pub(crate) fn policy() -> Policy {
    Policy::new()
        .allow("payment", &["/bank.v1.Bank/Charge"])
        .allow("gateway", &[GET_EXCHANGE_RATE])
        .allow_operator()
}
