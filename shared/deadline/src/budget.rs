//! The arithmetic of one hop: what to accept from the caller and what to pass to a dependency.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::millis;

/// How a server admits requests: the deadline it grants, and how many it works on at once.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InboundPolicy {
    /// Budget for a request that names none.
    pub default_ms: u64,
    /// Longest budget accepted; a longer request is shortened to this.
    pub max_ms: u64,
    /// Requests in progress at most; the next is refused at once (never queued).
    pub max_in_flight: u32,
}

impl Default for InboundPolicy {
    fn default() -> Self {
        Self {
            default_ms: 2_000,
            max_ms: 2_000,
            max_in_flight: 1_000,
        }
    }
}

impl InboundPolicy {
    /// The budget granted to a request that asked for `requested` (or nothing).
    pub fn grant(&self, requested: Option<Duration>) -> Duration {
        let max = Duration::from_millis(self.max_ms);
        requested
            .unwrap_or(Duration::from_millis(self.default_ms))
            .min(max)
    }
}

/// How much of the remaining budget one hop passes to one dependency.
///
/// forwarded = min(remaining − reserve, cap), where the reserve is what this hop keeps to turn the
/// dependency's answer (or its failure) into its own reply. The reserve is `reserve_ms` at most and
/// never more than `reserve_max_share` of what is left, so a short client deadline still reaches the
/// bottom of the chain instead of being eaten by fixed reserves. A call that would get less than
/// `min_forward_ms` is not made at all.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ForwardPolicy {
    pub reserve_ms: u64,
    pub reserve_max_share: f64,
    /// Longest budget ever given to this dependency (`null`: no cap beyond the deadline).
    pub cap_ms: Option<u64>,
    pub min_forward_ms: u64,
}

impl Default for ForwardPolicy {
    fn default() -> Self {
        Self {
            reserve_ms: 0,
            reserve_max_share: 0.2,
            cap_ms: None,
            min_forward_ms: 20,
        }
    }
}

/// The slice a hop forwards to a dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Forward {
    pub reserved: Duration,
    pub forwarded: Duration,
}

/// The dependency would get less than its minimum: the call is not made.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{hop}: {remaining:.1} ms left, keeping {reserved:.1} ms leaves {available:.1} ms for {dependency}, \
     below its minimum of {minimum:.1} ms; not calling"
)]
pub struct TooLittleBudget {
    pub hop: String,
    pub dependency: String,
    pub remaining: f64,
    pub reserved: f64,
    pub available: f64,
    pub minimum: f64,
}

impl ForwardPolicy {
    fn reserve_for(&self, remaining: Duration) -> Duration {
        // A share that is not a number keeps nothing rather than failing every call.
        let share = if self.reserve_max_share.is_nan() {
            0.0
        } else {
            self.reserve_max_share.clamp(0.0, 1.0)
        };
        Duration::from_millis(self.reserve_ms).min(remaining.mul_f64(share))
    }

    /// Splits `remaining` into this hop's reserve and the dependency's budget.
    pub fn plan(&self, remaining: Duration) -> Result<Forward, (Duration, Duration)> {
        let reserved = self.reserve_for(remaining);
        let mut forwarded = remaining.saturating_sub(reserved);
        if let Some(cap) = self.cap_ms {
            forwarded = forwarded.min(Duration::from_millis(cap));
        }
        if forwarded < Duration::from_millis(self.min_forward_ms) || forwarded.is_zero() {
            return Err((reserved, forwarded));
        }
        Ok(Forward {
            reserved,
            forwarded,
        })
    }

    /// [`Self::plan`] with an error that names the hop, the dependency and the numbers.
    pub fn plan_for(
        &self,
        hop: &str,
        dependency: &str,
        remaining: Duration,
    ) -> Result<Forward, TooLittleBudget> {
        self.plan(remaining)
            .map_err(|(reserved, available)| TooLittleBudget {
                hop: hop.to_owned(),
                dependency: dependency.to_owned(),
                remaining: millis(remaining),
                reserved: millis(reserved),
                available: millis(available),
                minimum: self.min_forward_ms as f64,
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Deadline;
    use tokio::time::{Instant, advance};

    const MS: fn(u64) -> Duration = Duration::from_millis;

    fn orders_to_payment() -> ForwardPolicy {
        ForwardPolicy {
            reserve_ms: 200,
            reserve_max_share: 0.2,
            cap_ms: None,
            min_forward_ms: 50,
        }
    }

    fn payment_to_bank() -> ForwardPolicy {
        ForwardPolicy {
            reserve_ms: 300,
            reserve_max_share: 0.2,
            cap_ms: Some(1_500),
            min_forward_ms: 20,
        }
    }

    #[test]
    fn inbound_takes_the_shorter_of_request_and_maximum() {
        let inbound = InboundPolicy {
            default_ms: 1_000,
            max_ms: 2_000,
            ..InboundPolicy::default()
        };
        assert_eq!(inbound.grant(None), MS(1_000));
        assert_eq!(inbound.grant(Some(MS(500))), MS(500));
        assert_eq!(inbound.grant(Some(MS(30_000))), MS(2_000));
    }

    #[test]
    fn reserve_is_fixed_until_it_would_exceed_its_share() {
        let policy = orders_to_payment();
        assert_eq!(
            policy.plan(MS(2_000)).unwrap(),
            Forward {
                reserved: MS(200),
                forwarded: MS(1_800)
            }
        );
        // 20 % of 500 ms is 100 ms: the reserve shrinks so the call still gets most of a short budget.
        assert_eq!(
            policy.plan(MS(500)).unwrap(),
            Forward {
                reserved: MS(100),
                forwarded: MS(400)
            }
        );
    }

    #[test]
    fn a_share_that_is_not_a_number_reserves_nothing() {
        let policy = ForwardPolicy {
            reserve_max_share: f64::NAN,
            ..orders_to_payment()
        };
        assert_eq!(
            policy.plan(MS(1_000)).unwrap(),
            Forward {
                reserved: Duration::ZERO,
                forwarded: MS(1_000)
            }
        );
    }

    #[test]
    fn cap_limits_a_generous_budget() {
        let policy = payment_to_bank();
        assert_eq!(
            policy.plan(MS(10_000)).unwrap(),
            Forward {
                reserved: MS(300),
                forwarded: MS(1_500)
            }
        );
    }

    #[test]
    fn below_the_minimum_no_call_is_planned() {
        let policy = orders_to_payment();
        let error = policy.plan_for("orders", "payment", MS(60)).unwrap_err();
        assert_eq!(error.available, 48.0);
        assert_eq!(
            error.to_string(),
            "orders: 60.0 ms left, keeping 12.0 ms leaves 48.0 ms for payment, below its minimum of 50.0 ms; not calling"
        );
        assert!(policy.plan(Duration::ZERO).is_err());
    }

    /// The seed's worked example: the gateway gives the operation 2 s; orders keeps 200 ms for
    /// itself and passes 1.8 s on; payment, whose bank answers within a second, gives the bank
    /// 1.5 s and keeps 300 ms for its reply. Deeper is always shorter.
    #[tokio::test(start_paused = true)]
    async fn seed_worked_example() {
        let at_orders = Deadline::after(Instant::now(), MS(2_000));
        let to_payment = orders_to_payment().plan(at_orders.remaining()).unwrap();
        assert_eq!(
            to_payment,
            Forward {
                reserved: MS(200),
                forwarded: MS(1_800)
            }
        );

        let at_payment = Deadline::after(Instant::now(), to_payment.forwarded);
        let to_bank = payment_to_bank().plan(at_payment.remaining()).unwrap();
        assert_eq!(
            to_bank,
            Forward {
                reserved: MS(300),
                forwarded: MS(1_500)
            }
        );
        assert!(
            to_bank.forwarded < to_payment.forwarded && to_payment.forwarded < at_orders.budget()
        );

        // The bank hangs: payment's deadline for it passes with 300 ms still in hand for the reply,
        // and orders still has its 200 ms after that.
        advance(to_bank.forwarded).await;
        assert_eq!(at_payment.remaining(), MS(300));
        advance(MS(300)).await;
        assert_eq!(at_orders.remaining(), MS(200));
    }

    #[tokio::test(start_paused = true)]
    async fn remaining_shrinks_with_the_clock_and_stops_at_zero() {
        let deadline = Deadline::after(Instant::now(), MS(500));
        advance(MS(120)).await;
        assert_eq!(deadline.remaining(), MS(380));
        assert_eq!(deadline.elapsed_at(Instant::now()), MS(120));
        advance(MS(1_000)).await;
        assert_eq!(deadline.remaining(), Duration::ZERO);
        assert!(deadline.is_expired_at(Instant::now()));
        assert_eq!(deadline.budget(), MS(500));
    }
}
