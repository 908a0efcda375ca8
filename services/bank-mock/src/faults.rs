//! The faults bank-mock can inject, as one table: [`Faults`] names each knob and what it
//! simulates, [`Faults::HEALTHY`] gives its value in a healthy bank, [`Faults::validate`] its
//! bounds, and [`Faults::plan`] the order in which a call's fate is drawn. A new fault is a line in
//! each of those, and where it acts in `bank.rs`; the admin API and the settings follow the table.

use std::time::Duration;

use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Latency of one call, drawn from a normal distribution and cut at zero: real services are
/// never exactly as fast twice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub mean: f64,
    pub stddev: f64,
}

/// The longest pushback the bank can be set to ask for: an hour, longer than any deadline.
pub(crate) const MAX_PUSHBACK_MS: i64 = 60 * 60 * 1000;

/// The longest mean or standard deviation of the latency: a minute.
const MAX_LATENCY_MS: f64 = 60_000.0;

/// What the bank does wrong, switchable at runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Faults {
    /// Time each call takes, in ms.
    pub latency_ms: Latency,
    /// Share of calls answered UNAVAILABLE before anything is charged.
    pub error_rate: f64,
    /// Every call hangs until its caller gives up.
    pub hang: bool,
    /// Share of calls answered RESOURCE_EXHAUSTED ("slow down"), with `pushback_ms`.
    pub resource_exhausted_rate: f64,
    /// The wait the bank asks for in `grpc-retry-pushback-ms`, up to `MAX_PUSHBACK_MS`; -1
    /// asks the caller not to retry at all.
    pub pushback_ms: i64,
    /// Share of calls that charge and then lose the reply (the caller sees UNAVAILABLE). A repeat
    /// of a charged key commits nothing, so it gets its reply.
    pub drop_reply_rate: f64,
    /// Share of charges declined (a business answer, not a failure).
    pub decline_rate: f64,
    /// Charges run to their end after their caller's deadline, as at a bank that knows nothing of
    /// deadlines: one may commit after the caller gave up (a late completion), while the caller's
    /// retry is already on its way. A hanging call still ends with its caller.
    pub ignores_deadlines: bool,
}

impl Faults {
    /// A healthy bank: 20 ± 5 ms per call and nothing else.
    pub const HEALTHY: Faults = Faults {
        latency_ms: Latency {
            mean: 20.0,
            stddev: 5.0,
        },
        error_rate: 0.0,
        hang: false,
        resource_exhausted_rate: 0.0,
        pushback_ms: 0,
        drop_reply_rate: 0.0,
        decline_rate: 0.0,
        ignores_deadlines: false,
    };

    /// The bounds of each knob that has any, checked at start and on every change: the first
    /// knob out of its bounds is named.
    pub fn validate(&self) -> Result<(), InvalidFault> {
        const RATE: &str = "must be a number from 0 to 1";
        const LATENCY: &str = "must be from 0 to 60000";
        let rate = |value: f64| (0.0..=1.0).contains(&value);
        let latency = |value: f64| (0.0..=MAX_LATENCY_MS).contains(&value);
        let bounds = [
            ("latency_ms.mean", latency(self.latency_ms.mean), LATENCY),
            (
                "latency_ms.stddev",
                latency(self.latency_ms.stddev),
                LATENCY,
            ),
            ("error_rate", rate(self.error_rate), RATE),
            (
                "resource_exhausted_rate",
                rate(self.resource_exhausted_rate),
                RATE,
            ),
            (
                "pushback_ms",
                (-1..=MAX_PUSHBACK_MS).contains(&self.pushback_ms),
                "must be from -1 (\"do not retry\") to 3600000 (an hour)",
            ),
            ("drop_reply_rate", rate(self.drop_reply_rate), RATE),
            ("decline_rate", rate(self.decline_rate), RATE),
        ];
        match bounds.into_iter().find(|(_, within, _)| !within) {
            Some((field, _, reason)) => Err(InvalidFault { field, reason }),
            None => Ok(()),
        }
    }

    /// Decides what this call does; faults are checked in the order a real failure would show.
    pub fn plan(&self, rng: &mut impl Rng) -> Plan {
        if self.hang {
            return Plan::Hang;
        }
        if rng.random_bool(self.resource_exhausted_rate) {
            return Plan::ResourceExhausted {
                pushback_ms: self.pushback_ms,
            };
        }
        if rng.random_bool(self.error_rate) {
            return Plan::Unavailable;
        }
        Plan::Charge {
            decline: rng.random_bool(self.decline_rate),
            drop_reply: rng.random_bool(self.drop_reply_rate),
        }
    }

    /// Draws this call's latency.
    pub fn latency(&self, rng: &mut impl Rng) -> Duration {
        let Latency { mean, stddev } = self.latency_ms;
        let millis = Normal::new(mean, stddev).map_or(mean, |normal| normal.sample(rng));
        Duration::from_secs_f64(millis.max(0.0) / 1_000.0)
    }

    /// These faults changed by `patch`, a partial faults document in JSON: each field it names
    /// replaces the current one (the whole of `latency_ms` included), a field left out or `null`
    /// keeps its value, and the result is checked as a whole.
    pub fn patched(&self, patch: &[u8]) -> Result<Faults, PatchError> {
        let patch: Map<String, Value> =
            from_json(&mut serde_json::Deserializer::from_slice(patch))?;
        let mut merged = serde_json::to_value(self).expect("faults serialize to JSON");
        let fields = merged
            .as_object_mut()
            .expect("faults serialize to a JSON object");
        fields.extend(patch.into_iter().filter(|(_, value)| !value.is_null()));
        let next: Faults = from_json(merged)?;
        next.validate()?;
        Ok(next)
    }
}

impl Default for Faults {
    fn default() -> Self {
        Self::HEALTHY
    }
}

/// Deserializes, naming the value at fault by its path when there is one.
fn from_json<'de, T: Deserialize<'de>>(
    json: impl serde::Deserializer<'de, Error = serde_json::Error>,
) -> Result<T, PatchError> {
    serde_path_to_error::deserialize(json).map_err(|error| {
        let field = Some(error.path().to_string()).filter(|path| path != ".");
        PatchError::Malformed {
            field,
            reason: error.into_inner().to_string(),
        }
    })
}

/// A fault setting outside its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidFault {
    pub field: &'static str,
    pub reason: &'static str,
}

/// Why a change of faults was refused; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatchError {
    /// Not a faults document: not JSON, an unknown field, or a value not even of its type.
    #[error("malformed faults document: {reason}")]
    Malformed {
        field: Option<String>,
        reason: String,
    },
    #[error(transparent)]
    Invalid(#[from] InvalidFault),
}

/// What one call should do, decided before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Hang,
    Unavailable,
    ResourceExhausted { pushback_ms: i64 },
    Charge { decline: bool, drop_reply: bool },
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    fn field(error: PatchError) -> Option<String> {
        match error {
            PatchError::Malformed { field, .. } => field,
            PatchError::Invalid(invalid) => Some(invalid.field.to_owned()),
        }
    }

    #[test]
    fn patches_change_only_what_they_name_and_reject_nonsense_whole() {
        let faults = Faults::default()
            .patched(br#"{"error_rate": 0.5, "hang": true, "decline_rate": null}"#)
            .unwrap();
        assert_eq!(
            (
                faults.error_rate,
                faults.hang,
                faults.latency_ms.mean,
                faults.decline_rate
            ),
            (0.5, true, 20.0, 0.0)
        );

        let bad = faults
            .patched(br#"{"hang": false, "decline_rate": 1.5}"#)
            .unwrap_err();
        assert_eq!(
            bad.to_string(),
            "decline_rate: must be a number from 0 to 1"
        );
        for (patch, named) in [
            (&br#"{"eror_rate": 1}"#[..], Some("eror_rate")),
            (br#"{"hang": "yes"}"#, Some("hang")),
            (br#"{"latency_ms": {"mean": 1}}"#, Some("latency_ms")),
            (br#"[0.5]"#, None),
            (
                br#"{"pushback_ms": 9223372036854775807}"#,
                Some("pushback_ms"),
            ),
            (
                br#"{"pushback_ms": -9223372036854775808}"#,
                Some("pushback_ms"),
            ),
            (br#"{"pushback_ms": 1e30}"#, Some("pushback_ms")),
            (
                br#"{"latency_ms": {"mean": 1e300, "stddev": 1}}"#,
                Some("latency_ms.mean"),
            ),
            (
                br#"{"latency_ms": {"mean": 1, "stddev": -1}}"#,
                Some("latency_ms.stddev"),
            ),
            (br#"{"error_rate": -0.1}"#, Some("error_rate")),
        ] {
            let error = faults.patched(patch).unwrap_err();
            assert_eq!(
                field(error.clone()).as_deref(),
                named,
                "{}: {error}",
                String::from_utf8_lossy(patch)
            );
        }
        assert_eq!(
            faults
                .patched(br#"{"pushback_ms": 3600000}"#)
                .unwrap()
                .pushback_ms,
            MAX_PUSHBACK_MS
        );
    }

    #[test]
    fn latency_follows_the_distribution_and_is_never_negative() {
        let mut rng = StdRng::seed_from_u64(7);
        let faults = Faults {
            latency_ms: Latency {
                mean: 20.0,
                stddev: 5.0,
            },
            ..Faults::default()
        };
        let draws: Vec<f64> = (0..10_000)
            .map(|_| faults.latency(&mut rng).as_secs_f64() * 1e3)
            .collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((19.5..20.5).contains(&mean), "mean {mean}");
        assert!(draws.iter().any(|d| *d < 15.0) && draws.iter().any(|d| *d > 25.0));
        let wide = Faults {
            latency_ms: Latency {
                mean: 1.0,
                stddev: 50.0,
            },
            ..Faults::default()
        };
        assert!((0..1_000).all(|_| wide.latency(&mut rng) >= Duration::ZERO));
    }

    #[test]
    fn rates_are_honoured() {
        let mut rng = StdRng::seed_from_u64(11);
        let faults = Faults {
            error_rate: 0.3,
            ..Faults::default()
        };
        let failures = (0..10_000)
            .filter(|_| faults.plan(&mut rng) == Plan::Unavailable)
            .count();
        assert!((2_700..3_300).contains(&failures), "{failures}");
        let hanging = Faults {
            hang: true,
            error_rate: 1.0,
            ..Faults::default()
        };
        assert_eq!(hanging.plan(&mut rng), Plan::Hang);
    }
}
