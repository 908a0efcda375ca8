//! The rules input must satisfy, shared by every service that accepts it, so that the gateway's
//! HTTP and gRPC faces and the orders service reject the same input with the same words.

use crate::{
    common::v1::CreateOrderRequest,
    orders::v1::{
        CreateEndpointRequest, ListDeliveriesRequest, RedeliverRangeRequest, RedeliverRequest,
        UpdateEndpointRequest,
    },
};

/// Currencies the bank settles (ISO 4217).
pub const CURRENCIES: &[&str] = &[
    "CHF", "CZK", "DKK", "EUR", "GBP", "JPY", "NOK", "PLN", "SEK", "USD",
];
/// Largest amount accepted in one order, in minor units.
pub const MAX_AMOUNT_MINOR: i64 = 100_000_000;
pub const MAX_ITEMS: usize = 100;
pub const MAX_QUANTITY: u32 = 1_000;
pub const MAX_ID_LEN: usize = 64;
/// Idempotency keys are 1 to 255 characters.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 255;
/// Longest webhook endpoint URL, in characters.
pub const MAX_URL_LEN: usize = 2_048;
/// Most event types one endpoint subscribes to.
pub const MAX_EVENT_TYPES: usize = 16;
/// Longest of the other text fields (a page cursor, a time), in characters.
pub const MAX_TEXT_LEN: usize = 256;

/// One field that breaks a rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct FieldError {
    /// JSON-pointer-like path of the field, e.g. `items[1].quantity`.
    pub field: String,
    pub reason: String,
}

fn reject(field: impl Into<String>, reason: impl Into<String>) -> Result<(), FieldError> {
    Err(FieldError {
        field: field.into(),
        reason: reason.into(),
    })
}

/// Checks one text field of any request: it must show something, and nothing in it may be
/// hidden or change how the rest reads.
///
/// Why: a value that looks blank (spaces, a lone zero-width space) or differs from what it looks
/// like (a control character, a bidirectional override that reverses what follows) is
/// indistinguishable from another value in logs, dashboards and support tickets; no identifier,
/// code or URL of this API needs one.
pub fn text(field: &str, value: &str) -> Result<(), FieldError> {
    if let Some(hidden) = value
        .chars()
        .find(|&c| c.is_control() || is_bidi_control(c))
    {
        return reject(
            field,
            format!(
                "must not contain control or bidirectional-override characters (found U+{:04X})",
                u32::from(hidden)
            ),
        );
    }
    if value.chars().all(|c| c.is_whitespace() || is_invisible(c)) {
        return reject(field, "must not be empty or blank");
    }
    Ok(())
}

/// The explicit embeddings, overrides and isolates (U+202A–U+202E, U+2066–U+2069).
fn is_bidi_control(c: char) -> bool {
    matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// Characters that print as nothing although they are not whitespace: zero-width space, joiners,
/// word joiner, byte order mark, soft hyphen, Mongolian vowel separator.
fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{200B}'..='\u{200D}' | '\u{2060}' | '\u{FEFF}' | '\u{00AD}' | '\u{180E}'
    )
}

/// Checks an identifier (a customer, a SKU, an order, an endpoint): [`text`] of at most
/// [`MAX_ID_LEN`] characters.
pub fn id(field: &str, value: &str) -> Result<(), FieldError> {
    text(field, value)?;
    if value.chars().count() > MAX_ID_LEN {
        return reject(field, format!("must be at most {MAX_ID_LEN} characters"));
    }
    Ok(())
}

/// Checks [`text`] of at most `max` characters.
///
/// Why every text field has a bound: a hop's error names what it refused, and an unbounded value
/// makes an unbounded error, which the caller's HTTP/2 client may refuse as a protocol error
/// and its breaker count against the hop: one client's long field would cut the hop off for all.
pub fn bounded(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    text(field, value)?;
    if value.chars().count() > max {
        return reject(field, format!("must be at most {max} characters"));
    }
    Ok(())
}

/// Checks an optional text field: empty, or [`bounded`].
fn optional(field: &str, value: &str, max: usize) -> Result<(), FieldError> {
    if value.is_empty() {
        Ok(())
    } else {
        bounded(field, value, max)
    }
}

/// Checks an event type list: at most [`MAX_EVENT_TYPES`] names, each an [`id`].
fn event_types(names: &[String]) -> Result<(), FieldError> {
    if names.len() > MAX_EVENT_TYPES {
        return reject(
            "event_types",
            format!("must list at most {MAX_EVENT_TYPES} event types"),
        );
    }
    for (index, name) in names.iter().enumerate() {
        id(&format!("event_types[{index}]"), name)?;
    }
    Ok(())
}

/// Checks a new order; the first broken rule is returned.
pub fn create_order(request: &CreateOrderRequest) -> Result<(), FieldError> {
    id("customer_id", &request.customer_id)?;
    if request.items.is_empty() {
        return reject("items", "must list at least one item");
    }
    if request.items.len() > MAX_ITEMS {
        return reject("items", format!("must list at most {MAX_ITEMS} items"));
    }
    for (index, item) in request.items.iter().enumerate() {
        id(&format!("items[{index}].sku"), &item.sku)?;
        if !(1..=MAX_QUANTITY).contains(&item.quantity) {
            return reject(
                format!("items[{index}].quantity"),
                format!("must be between 1 and {MAX_QUANTITY}"),
            );
        }
    }
    if !(1..=MAX_AMOUNT_MINOR).contains(&request.amount_minor) {
        return reject(
            "amount_minor",
            format!("must be between 1 and {MAX_AMOUNT_MINOR} minor units"),
        );
    }
    if !CURRENCIES.contains(&request.currency.as_str()) {
        return reject(
            "currency",
            format!("must be one of {}", CURRENCIES.join(", ")),
        );
    }
    Ok(())
}

/// Checks the text of a new webhook endpoint; what the URL may name and which event types exist
/// are the outbox's rules.
pub fn create_endpoint(request: &CreateEndpointRequest) -> Result<(), FieldError> {
    bounded("url", &request.url, MAX_URL_LEN)?;
    event_types(&request.event_types)
}

/// Checks the text of an endpoint update, as [`create_endpoint`] does that of a new one.
pub fn update_endpoint(request: &UpdateEndpointRequest) -> Result<(), FieldError> {
    id("endpoint_id", &request.endpoint_id)?;
    if let Some(url) = &request.url {
        bounded("url", url, MAX_URL_LEN)?;
    }
    request
        .event_types
        .as_ref()
        .map_or(Ok(()), |list| event_types(&list.names))
}

/// Checks a page of deliveries asked for: the endpoint, and the filters that are set.
pub fn list_deliveries(request: &ListDeliveriesRequest) -> Result<(), FieldError> {
    id("endpoint_id", &request.endpoint_id)?;
    optional("cursor", &request.cursor, MAX_TEXT_LEN)?;
    optional("state", &request.state, MAX_ID_LEN)?;
    optional("event_type", &request.event_type, MAX_ID_LEN)
}

/// Checks a redelivery of one event.
pub fn redeliver(request: &RedeliverRequest) -> Result<(), FieldError> {
    id("endpoint_id", &request.endpoint_id)?;
    id("event_id", &request.event_id)
}

/// Checks a redelivery of a time range; that the bounds are times is the outbox's rule.
pub fn redeliver_range(request: &RedeliverRangeRequest) -> Result<(), FieldError> {
    id("endpoint_id", &request.endpoint_id)?;
    optional("from", &request.from, MAX_TEXT_LEN)?;
    optional("until", &request.until, MAX_TEXT_LEN)
}

/// Checks an idempotency key: 1 to 255 visible ASCII characters.
pub fn idempotency_key(key: &str) -> Result<(), FieldError> {
    if key.is_empty() || key.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return reject(
            "Idempotency-Key",
            format!("must be 1 to {MAX_IDEMPOTENCY_KEY_LEN} characters"),
        );
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
    use proptest::prelude::*;

    fn valid() -> CreateOrderRequest {
        CreateOrderRequest {
            customer_id: "c-1".into(),
            items: vec![LineItem {
                sku: "sku-1".into(),
                quantity: 2,
            }],
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
    fn hidden_and_blank_looking_text_is_refused() {
        for bad in [
            "",
            "   ",
            "\u{200B}",
            " \u{FEFF}\t",
            "a\u{0000}b",
            "abc\u{202E}",
            "\u{2066}x",
            "line\nbreak",
            "del\u{7F}",
            "c1\u{85}",
        ] {
            assert_eq!(text("f", bad).unwrap_err().field, "f", "{bad:?}");
        }
        for good in ["c-1", "Zoë", "顧客-7", "a b", "sku\u{200B}x"] {
            assert_eq!(text("f", good), Ok(()), "{good:?}");
        }
        assert!(
            id("f", &"é".repeat(MAX_ID_LEN)).is_ok(),
            "characters are counted, not bytes"
        );
        assert!(id("f", &"x".repeat(MAX_ID_LEN + 1)).is_err());
    }

    #[test]
    fn idempotency_keys_are_bounded() {
        assert!(idempotency_key("k-1").is_ok());
        assert!(idempotency_key(&"k".repeat(255)).is_ok());
        assert!(idempotency_key("").is_err());
        assert!(idempotency_key(&"k".repeat(256)).is_err());
        assert!(idempotency_key("has space").is_err());
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn an_idempotency_key_is_accepted_exactly_when_it_is_1_to_255_visible_ascii(key in "\\PC{0,300}|[!-~]{0,300}") {
            let visible_ascii = key.bytes().all(|byte| byte.is_ascii_graphic());
            let expected = (1..=MAX_IDEMPOTENCY_KEY_LEN).contains(&key.len()) && visible_ascii;
            prop_assert_eq!(idempotency_key(&key).is_ok(), expected, "{:?}", key);
        }

        #[test]
        fn text_with_a_hidden_character_is_refused_wherever_it_hides(before in "\\PC{0,10}", after in "\\PC{0,10}", hidden in "[\\x00-\\x1F\\x7F-\\u{9F}\\u{202A}-\\u{202E}\\u{2066}-\\u{2069}]") {
            let value = format!("{before}{hidden}{after}");
            prop_assert!(text("f", &value).is_err());
        }

        #[test]
        fn text_that_shows_a_letter_and_hides_nothing_passes(before in "[ a-z\\u{200B}]{0,10}", letter in "\\p{L}", after in "[ a-z\\u{200B}]{0,10}") {
            let value = format!("{before}{letter}{after}");
            prop_assert_eq!(text("f", &value), Ok(()));
        }

        #[test]
        fn blank_looking_text_is_refused(blank in "[ \\u{A0}\\u{2003}\\u{3000}\\u{200B}-\\u{200D}\\u{2060}\\u{FEFF}]{0,12}") {
            prop_assert!(text("f", &blank).is_err());
        }
    }
}
