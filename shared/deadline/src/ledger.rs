//! The deadline ledger: each hop's slice of the budget, carried back with the response.
//!
//! Wire format (metadata `x-deadline-ledger`, HTTP `X-Deadline-Ledger`): one entry per hop, outermost
//! first, separated by `", "`; each entry is the hop name followed by `;key=value` pairs, values in
//! milliseconds with up to three decimals:
//!
//! ```text
//! gateway;received=2000;spent=0.4;reserved=20;forwarded=1979.6;left=1975.1, orders;received=1979.5;…
//! ```
//!
//! - `received`: the budget the hop was given;
//! - `spent`: time spent at the hop before it forwarded (for a leaf: all of its time);
//! - `reserved`: what it kept for its own reply;
//! - `forwarded`: the budget it gave the next hop (0 for a leaf);
//! - `left`: what was left of its budget when it answered.
//!
//! The same shape as `Server-Timing`, so one parser serves both and the header stays readable.

use std::{fmt, time::Duration};

use crate::millis;

/// One hop's slice.
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub hop: String,
    pub received: Duration,
    pub spent: Duration,
    pub reserved: Duration,
    pub forwarded: Duration,
    pub left: Duration,
}

impl Entry {
    /// Time between the hop receiving the request and answering it.
    pub fn duration(&self) -> Duration {
        self.received.saturating_sub(self.left)
    }
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{};received={};spent={};reserved={};forwarded={};left={}",
            self.hop,
            millis(self.received),
            millis(self.spent),
            millis(self.reserved),
            millis(self.forwarded),
            millis(self.left),
        )
    }
}

/// In JSON, the durations as milliseconds: `{"hop": "orders", "received_ms": 1979.5, …}`.
impl serde::Serialize for Entry {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut entry = serializer.serialize_struct("Entry", 6)?;
        entry.serialize_field("hop", &self.hop)?;
        entry.serialize_field("received_ms", &millis(self.received))?;
        entry.serialize_field("spent_ms", &millis(self.spent))?;
        entry.serialize_field("reserved_ms", &millis(self.reserved))?;
        entry.serialize_field("forwarded_ms", &millis(self.forwarded))?;
        entry.serialize_field("left_ms", &millis(self.left))?;
        entry.end()
    }
}

/// A ledger entry that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed deadline ledger entry {0:?}")]
pub struct ParseError(pub String);

/// Parses a whole ledger, outermost hop first.
pub fn parse(ledger: &str) -> Result<Vec<Entry>, ParseError> {
    ledger
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(parse_entry)
        .collect()
}

fn parse_entry(text: &str) -> Result<Entry, ParseError> {
    let error = || ParseError(text.to_owned());
    let mut parts = text.split(';');
    let hop = parts.next().filter(|h| !h.is_empty()).ok_or_else(error)?;
    let mut entry = Entry {
        hop: hop.to_owned(),
        received: Duration::ZERO,
        spent: Duration::ZERO,
        reserved: Duration::ZERO,
        forwarded: Duration::ZERO,
        left: Duration::ZERO,
    };
    for part in parts {
        let (key, value) = part.split_once('=').ok_or_else(error)?;
        let ms: f64 = value.parse().map_err(|_| error())?;
        let value = Duration::try_from_secs_f64(ms / 1_000.0).map_err(|_| error())?;
        match key {
            "received" => entry.received = value,
            "spent" => entry.spent = value,
            "reserved" => entry.reserved = value,
            "forwarded" => entry.forwarded = value,
            "left" => entry.left = value,
            // Unknown keys are skipped so that later versions can add fields.
            _ => {}
        }
    }
    Ok(entry)
}

/// The ledger as a `Server-Timing` header value: one metric per hop, its duration and its slice.
pub fn server_timing(entries: &[Entry]) -> String {
    entries
        .iter()
        .map(|e| {
            format!(
                "{};dur={};desc=\"budget {} ms, forwarded {} ms\"",
                e.hop,
                millis(e.duration()),
                millis(e.received),
                millis(e.forwarded)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hop: &str, received: u64, forwarded: u64, left: u64) -> Entry {
        Entry {
            hop: hop.into(),
            received: Duration::from_millis(received),
            spent: Duration::from_micros(1_250),
            reserved: Duration::from_millis(received - forwarded),
            forwarded: Duration::from_millis(forwarded),
            left: Duration::from_millis(left),
        }
    }

    #[test]
    fn entries_round_trip() {
        let entries = vec![
            entry("gateway", 2000, 1980, 1990),
            entry("orders", 1979, 1779, 1970),
        ];
        let text = entries
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        assert_eq!(
            text,
            "gateway;received=2000;spent=1.25;reserved=20;forwarded=1980;left=1990, \
             orders;received=1979;spent=1.25;reserved=200;forwarded=1779;left=1970"
        );
        assert_eq!(parse(&text).unwrap(), entries);
    }

    #[test]
    fn malformed_entries_are_rejected() {
        assert!(parse("gateway;received=abc").is_err());
        assert!(parse(";received=1").is_err());
        assert!(parse("gateway;received").is_err());
        assert!(parse("gateway;received=-1").is_err());
    }

    #[test]
    fn server_timing_has_one_metric_per_hop() {
        let timing = server_timing(&[
            entry("gateway", 2000, 1980, 1990),
            entry("bank-mock", 1500, 0, 1480),
        ]);
        assert_eq!(
            timing,
            "gateway;dur=10;desc=\"budget 2000 ms, forwarded 1980 ms\", \
             bank-mock;dur=20;desc=\"budget 1500 ms, forwarded 0 ms\""
        );
    }
}
