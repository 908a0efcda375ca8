//! Who may call the bank: payment, to charge, and the gateway and the operator, to read exchange
//! rates.

use rpc::authorize::Policy;

const GET_EXCHANGE_RATE: &str = "/bank.v1.Bank/GetExchangeRate";

pub fn policy() -> Policy {
    Policy::new().allow("payment", &["/bank.v1.Bank/Charge"]).allow("gateway", &[GET_EXCHANGE_RATE]).allow_operator(&[GET_EXCHANGE_RATE])
}
