//! The rules a new order must satisfy, shared by every service that accepts one, so that the
//! gateway's HTTP and gRPC faces and the orders service reject the same input with the same words.

use crate::common::v1::CreateOrderRequest;

/// Currencies the bank settles (ISO 4217).
pub const CURRENCIES: &[&str] = &["CHF", "CZK", "DKK", "EUR", "GBP", "JPY", "NOK", "PLN", "SEK", "USD"];
/// Largest amount accepted in one order, in minor units.
pub const MAX_AMOUNT_MINOR: i64 = 100_000_000;
pub const MAX_ITEMS: usize = 100;
pub const MAX_QUANTITY: u32 = 1_000;
pub const MAX_ID_LEN: usize = 64;
/// Idempotency keys are 1 to 255 characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;

/// One field that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// JSON-pointer-like path of the field, e.g. `items[1].quantity`.
    pub field: String,
    pub reason: String,
}

fn reject(field: impl Into<String>, reason: impl Into<String>) -> Result<(), FieldError> {
    Err(FieldError { field: field.into(), reason: reason.into() })
}

fn check_id(field: &str, value: &str) -> Result<(), FieldError> {
    if value.trim().is_empty() {
        return reject(field, "must not be empty");
    }
    if value.chars().count() > MAX_ID_LEN {
        return reject(field, format!("must be at most {MAX_ID_LEN} characters"));
    }
    Ok(())
}

/// Checks a new order; the first broken rule is returned.
pub fn create_order(request: &CreateOrderRequest) -> Result<(), FieldError> {
    check_id("customer_id", &request.customer_id)?;
    if request.items.is_empty() {
        return reject("items", "must list at least one item");
    }
    if request.items.len() > MAX_ITEMS {
        return reject("items", format!("must list at most {MAX_ITEMS} items"));
    }
    for (index, item) in request.items.iter().enumerate() {
        check_id(&format!("items[{index}].sku"), &item.sku)?;
        if !(1..=MAX_QUANTITY).contains(&item.quantity) {
            return reject(format!("items[{index}].quantity"), format!("must be between 1 and {MAX_QUANTITY}"));
        }
    }
    if !(1..=MAX_AMOUNT_MINOR).contains(&request.amount_minor) {
        return reject("amount_minor", format!("must be between 1 and {MAX_AMOUNT_MINOR} minor units"));
    }
    if !CURRENCIES.contains(&request.currency.as_str()) {
        return reject("currency", format!("must be one of {}", CURRENCIES.join(", ")));
    }
    Ok(())
}

/// Checks an idempotency key: 1 to 255 visible ASCII characters.
pub fn idempotency_key(key: &str) -> Result<(), FieldError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return reject("Idempotency-Key", format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters"));
    }
    if !key.bytes().all(|b| b.is_ascii_graphic()) {
        return reject("Idempotency-Key", "must be visible ASCII characters");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::v1::LineItem;

    fn valid() -> CreateOrderRequest {
        CreateOrderRequest {
            customer_id: "c-1".into(),
            items: vec![LineItem { sku: "sku-1".into(), quantity: 2 }],
            amount_minor: 1299,
            currency: "EUR".into(),
        }
    }

    #[test]
    fn a_valid_order_passes() {
        assert_eq!(create_order(&valid()), Ok(()));
    }

    #[test]
    fn each_broken_rule_names_its_field() {
        type Breaking = fn(&mut CreateOrderRequest);
        let cases: Vec<(Breaking, &str)> = vec![
            (|r| r.customer_id.clear(), "customer_id"),
            (|r| r.items.clear(), "items"),
            (|r| r.items[0].quantity = 0, "items[0].quantity"),
            (|r| r.items[0].sku = "x".repeat(65), "items[0].sku"),
            (|r| r.amount_minor = -5, "amount_minor"),
            (|r| r.amount_minor = i64::MAX, "amount_minor"),
            (|r| r.currency = "QQQ".into(), "currency"),
        ];
        for (breaking, field) in cases {
            let mut request = valid();
            breaking(&mut request);
            assert_eq!(create_order(&request).unwrap_err().field, field);
        }
    }

    #[test]
    fn idempotency_keys_are_bounded() {
        assert!(idempotency_key("k-1").is_ok());
        assert!(idempotency_key(&"k".repeat(255)).is_ok());
        assert!(idempotency_key("").is_err());
        assert!(idempotency_key(&"k".repeat(256)).is_err());
        assert!(idempotency_key("has space").is_err());
    }
}
