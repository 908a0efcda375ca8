//! The faults bank-mock can inject, each a named knob that tells what it simulates.

use std::time::Duration;

use rand::Rng;
use rand_distr::{Distribution, Normal};
use serde::{Deserialize, Serialize};

/// Latency of one call, drawn from a normal distribution and cut at zero: real services are
/// never exactly as fast twice.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Latency {
    pub mean: f64,
    pub stddev: f64,
}

/// The longest pushback the bank can be set to ask for: an hour, longer than any deadline.
pub const MAX_PUSHBACK_MS: i64 = 60 * 60 * 1000;

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
    /// The wait the bank asks for in `grpc-retry-pushback-ms`, up to [`MAX_PUSHBACK_MS`]; -1
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
        latency_ms: Latency { mean: 20.0, stddev: 5.0 },
        error_rate: 0.0,
        hang: false,
        resource_exhausted_rate: 0.0,
        pushback_ms: 0,
        drop_reply_rate: 0.0,
        decline_rate: 0.0,
        ignores_deadlines: false,
    };
}

impl Default for Faults {
    fn default() -> Self {
        Self::HEALTHY
    }
}

/// A partial update of [`Faults`]: absent fields keep their value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultsPatch {
    latency_ms: Option<Latency>,
    error_rate: Option<f64>,
    hang: Option<bool>,
    resource_exhausted_rate: Option<f64>,
    pushback_ms: Option<i64>,
    drop_reply_rate: Option<f64>,
    decline_rate: Option<f64>,
    ignores_deadlines: Option<bool>,
}

/// A fault setting outside its range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidFault {
    pub field: &'static str,
    pub reason: &'static str,
}

/// What one call should do, decided before it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Hang,
    Unavailable,
    ResourceExhausted { pushback_ms: i64 },
    Charge { decline: bool, drop_reply: bool },
}

impl Faults {
    /// Applies `patch`, validating the result; on error nothing changes.
    pub fn apply(&mut self, patch: FaultsPatch) -> Result<(), InvalidFault> {
        let mut next = self.clone();
        if let Some(latency) = patch.latency_ms {
            next.latency_ms = latency;
        }
        macro_rules! set {
            ($($field:ident),*) => { $(if let Some(value) = patch.$field { next.$field = value; })* };
        }
        set!(error_rate, hang, resource_exhausted_rate, pushback_ms, drop_reply_rate, decline_rate, ignores_deadlines);
        next.validate()?;
        *self = next;
        Ok(())
    }

    pub fn validate(&self) -> Result<(), InvalidFault> {
        let rates = [
            ("error_rate", self.error_rate),
            ("resource_exhausted_rate", self.resource_exhausted_rate),
            ("drop_reply_rate", self.drop_reply_rate),
            ("decline_rate", self.decline_rate),
        ];
        for (field, rate) in rates {
            if !(0.0..=1.0).contains(&rate) {
                return Err(InvalidFault { field, reason: "must be a number from 0 to 1" });
            }
        }
        if !(-1..=MAX_PUSHBACK_MS).contains(&self.pushback_ms) {
            return Err(InvalidFault { field: "pushback_ms", reason: "must be from -1 (\"do not retry\") to 3600000 (an hour)" });
        }
        let latency = self.latency_ms;
        if !(latency.mean.is_finite() && (0.0..=60_000.0).contains(&latency.mean)) {
            return Err(InvalidFault { field: "latency_ms.mean", reason: "must be from 0 to 60000" });
        }
        if !(latency.stddev.is_finite() && (0.0..=60_000.0).contains(&latency.stddev)) {
            return Err(InvalidFault { field: "latency_ms.stddev", reason: "must be from 0 to 60000" });
        }
        Ok(())
    }

    /// Draws this call's latency.
    pub fn latency(&self, rng: &mut impl Rng) -> Duration {
        let Latency { mean, stddev } = self.latency_ms;
        let millis = Normal::new(mean, stddev).map_or(mean, |normal| normal.sample(rng));
        Duration::from_secs_f64(millis.max(0.0) / 1_000.0)
    }

    /// Decides what this call does; faults are checked in the order a real failure would show.
    pub fn plan(&self, rng: &mut impl Rng) -> Plan {
        if self.hang {
            return Plan::Hang;
        }
        if rng.random_bool(self.resource_exhausted_rate) {
            return Plan::ResourceExhausted { pushback_ms: self.pushback_ms };
        }
        if rng.random_bool(self.error_rate) {
            return Plan::Unavailable;
        }
        Plan::Charge { decline: rng.random_bool(self.decline_rate), drop_reply: rng.random_bool(self.drop_reply_rate) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{SeedableRng, rngs::StdRng};

    #[test]
    fn patches_change_only_what_they_name_and_reject_nonsense_whole() {
        let mut faults = Faults::default();
        let patch: FaultsPatch = serde_json::from_str(r#"{"error_rate": 0.5, "hang": true}"#).unwrap();
        faults.apply(patch).unwrap();
        assert_eq!((faults.error_rate, faults.hang, faults.latency_ms.mean), (0.5, true, 20.0));

        let bad: FaultsPatch = serde_json::from_str(r#"{"hang": false, "decline_rate": 1.5}"#).unwrap();
        assert_eq!(faults.apply(bad).unwrap_err().field, "decline_rate");
        assert!(faults.hang, "a rejected patch changes nothing");
        assert!(serde_json::from_str::<FaultsPatch>(r#"{"eror_rate": 1}"#).is_err());

        for (patch, field) in [
            (r#"{"pushback_ms": 9223372036854775807}"#, "pushback_ms"),
            (r#"{"pushback_ms": -9223372036854775808}"#, "pushback_ms"),
            (r#"{"latency_ms": {"mean": 1e300, "stddev": 1}}"#, "latency_ms.mean"),
            (r#"{"latency_ms": {"mean": 1, "stddev": -1}}"#, "latency_ms.stddev"),
            (r#"{"error_rate": -0.1}"#, "error_rate"),
        ] {
            let patch: FaultsPatch = serde_json::from_str(patch).unwrap();
            assert_eq!(faults.apply(patch).unwrap_err().field, field);
        }
        let longest: FaultsPatch = serde_json::from_str(r#"{"pushback_ms": 3600000}"#).unwrap();
        assert!(faults.apply(longest).is_ok());
    }

    #[test]
    fn latency_follows_the_distribution_and_is_never_negative() {
        let mut rng = StdRng::seed_from_u64(7);
        let faults = Faults { latency_ms: Latency { mean: 20.0, stddev: 5.0 }, ..Faults::default() };
        let draws: Vec<f64> = (0..10_000).map(|_| faults.latency(&mut rng).as_secs_f64() * 1e3).collect();
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((19.5..20.5).contains(&mean), "mean {mean}");
        assert!(draws.iter().any(|d| *d < 15.0) && draws.iter().any(|d| *d > 25.0));
        let wide = Faults { latency_ms: Latency { mean: 1.0, stddev: 50.0 }, ..Faults::default() };
        assert!((0..1_000).all(|_| wide.latency(&mut rng) >= Duration::ZERO));
    }

    #[test]
    fn rates_are_honoured() {
        let mut rng = StdRng::seed_from_u64(11);
        let faults = Faults { error_rate: 0.3, ..Faults::default() };
        let failures = (0..10_000).filter(|_| faults.plan(&mut rng) == Plan::Unavailable).count();
        assert!((2_700..3_300).contains(&failures), "{failures}");
        let hanging = Faults { hang: true, error_rate: 1.0, ..Faults::default() };
        assert_eq!(hanging.plan(&mut rng), Plan::Hang);
    }
}
