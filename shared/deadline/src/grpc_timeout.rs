//! The `grpc-timeout` header, exactly as the gRPC over HTTP/2 spec defines it:
//! `TimeoutValue TimeoutUnit`, where the value is a positive integer of at most 8 ASCII digits and
//! the unit one of `H` (hours), `M` (minutes), `S`, `m`, `u`, `n` (seconds, milli-, micro-, nanoseconds).
//!
//! Formatting picks the finest unit whose value fits in 8 digits and rounds *down*: a forwarded
//! budget may lose a few nanoseconds but never grows, so deeper hops always get less.

use std::time::Duration;

const MAX_DIGITS: usize = 8;
const MAX_VALUE: u64 = 99_999_999;

/// Units from finest to coarsest, with their length in nanoseconds.
const UNITS: [(char, u64); 6] = [
    ('n', 1),
    ('u', 1_000),
    ('m', 1_000_000),
    ('S', 1_000_000_000),
    ('M', 60 * 1_000_000_000),
    ('H', 3_600 * 1_000_000_000),
];

/// Why a `grpc-timeout` value was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("grpc-timeout is empty")]
    Empty,
    #[error("grpc-timeout {0:?} has no unit: expected one of H, M, S, m, u, n after the digits")]
    MissingUnit(String),
    #[error("grpc-timeout {0:?} has an unknown unit: expected one of H, M, S, m, u, n")]
    UnknownUnit(String),
    #[error("grpc-timeout {0:?} must have 1 to 8 ASCII digits before its unit")]
    BadDigits(String),
}

/// Parses a `grpc-timeout` value such as `1500m` or `2S`.
pub fn parse(value: &str) -> Result<Duration, ParseError> {
    let Some(unit) = value.chars().last() else {
        return Err(ParseError::Empty);
    };
    if unit.is_ascii_digit() {
        return Err(ParseError::MissingUnit(value.to_owned()));
    }
    let Some(&(_, unit_nanos)) = UNITS.iter().find(|(symbol, _)| *symbol == unit) else {
        return Err(ParseError::UnknownUnit(value.to_owned()));
    };
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > MAX_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(ParseError::BadDigits(value.to_owned()));
    }
    // At most 8 digits: the amount fits in u64 and the product in u128, with whole seconds in u64.
    let amount: u64 = digits
        .parse()
        .map_err(|_| ParseError::BadDigits(value.to_owned()))?;
    let nanos = u128::from(amount) * u128::from(unit_nanos);
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    Ok(Duration::new(
        (nanos / NANOS_PER_SEC) as u64,
        (nanos % NANOS_PER_SEC) as u32,
    ))
}

/// Formats a duration as a `grpc-timeout` value with the finest unit that fits in 8 digits,
/// rounding down. Durations beyond 99,999,999 hours are clamped to that maximum.
pub fn format(timeout: Duration) -> String {
    let nanos = timeout.as_nanos();
    for (symbol, unit_nanos) in UNITS {
        let amount = nanos / u128::from(unit_nanos);
        if amount <= u128::from(MAX_VALUE) {
            return format!("{amount}{symbol}");
        }
    }
    format!("{MAX_VALUE}H")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_every_unit() {
        assert_eq!(parse("7n"), Ok(Duration::from_nanos(7)));
        assert_eq!(parse("7u"), Ok(Duration::from_micros(7)));
        assert_eq!(parse("1500m"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse("2S"), Ok(Duration::from_secs(2)));
        assert_eq!(parse("3M"), Ok(Duration::from_secs(180)));
        assert_eq!(parse("1H"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse("0m"), Ok(Duration::ZERO));
    }

    #[test]
    fn accepts_eight_digits_and_rejects_nine() {
        assert_eq!(
            parse("99999999H"),
            Ok(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(
            parse("123456789m"),
            Err(ParseError::BadDigits("123456789m".into()))
        );
    }

    #[test]
    fn rejects_malformed_values_with_a_reason() {
        assert_eq!(parse(""), Err(ParseError::Empty));
        assert_eq!(parse("100"), Err(ParseError::MissingUnit("100".into())));
        assert_eq!(parse("100s"), Err(ParseError::UnknownUnit("100s".into())));
        assert_eq!(parse("m"), Err(ParseError::BadDigits("m".into())));
        assert_eq!(parse("-5m"), Err(ParseError::BadDigits("-5m".into())));
        assert_eq!(parse("+5m"), Err(ParseError::BadDigits("+5m".into())));
        assert_eq!(parse(" 5m"), Err(ParseError::BadDigits(" 5m".into())));
        assert_eq!(parse("1.5S"), Err(ParseError::BadDigits("1.5S".into())));
        assert_eq!(parse("5mé"), Err(ParseError::UnknownUnit("5mé".into())));
        assert!(parse("5mS").is_err());
    }

    #[test]
    fn formats_with_the_finest_unit_that_fits() {
        assert_eq!(format(Duration::from_nanos(99_999_999)), "99999999n");
        assert_eq!(format(Duration::from_millis(100)), "100000u");
        assert_eq!(format(Duration::from_millis(1800)), "1800000u");
        assert_eq!(format(Duration::from_secs(100)), "100000m");
        assert_eq!(format(Duration::from_secs(200_000)), "200000S");
        assert_eq!(format(Duration::from_secs(200_000_000)), "3333333M");
        assert_eq!(format(Duration::from_secs(u64::MAX)), "99999999H");
    }

    #[test]
    fn formatting_rounds_down() {
        // 100 ms + 1 ns does not fit in nanoseconds; microseconds drop the extra nanosecond.
        assert_eq!(format(Duration::from_nanos(100_000_001)), "100000u");
    }

    proptest! {
        #[test]
        fn round_trip_never_grows_and_loses_less_than_one_unit(nanos in 0u64..=u64::MAX / 2) {
            let original = Duration::from_nanos(nanos);
            let text = format(original);
            prop_assert!(text.len() <= MAX_DIGITS + 1);
            let back = parse(&text).unwrap();
            prop_assert!(back <= original);
            let unit = UNITS.iter().find(|(s, _)| text.ends_with(*s)).unwrap().1;
            prop_assert!(original - back < Duration::from_nanos(unit));
        }

        #[test]
        fn exact_values_round_trip(amount in 0u64..=MAX_VALUE, unit in 0usize..6) {
            let (symbol, unit_nanos) = UNITS[unit];
            let text = format!("{amount}{symbol}");
            let parsed = parse(&text).unwrap();
            prop_assert_eq!(u128::from(amount) * u128::from(unit_nanos), parsed.as_nanos());
            prop_assert_eq!(parse(&format(parsed)).unwrap(), parsed);
        }

        #[test]
        fn exactly_the_spec_grammar_is_accepted(text in "\\PC{0,12}|[+-]?[0-9]{0,10}[HMSmunsh ]?") {
            let mut chars = text.chars();
            let unit = chars.next_back();
            let digits = chars.as_str();
            let grammar = (1..=MAX_DIGITS).contains(&digits.len())
                && digits.bytes().all(|byte| byte.is_ascii_digit())
                && UNITS.iter().any(|(symbol, _)| unit == Some(*symbol));
            prop_assert_eq!(parse(&text).is_ok(), grammar, "{:?}", text);
        }
    }
}
