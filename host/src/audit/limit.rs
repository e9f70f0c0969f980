//! Refusals are recorded, but not without end: a caller refused again and
//! again (a token with no grants, say, which any job of a public CI issuer
//! can get) would otherwise rotate the real history out of a bounded trail.
//! Each caller's refusals are recorded at a bounded rate; past it they are
//! counted, and the next one recorded says how many were not.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Refusals one caller may have recorded in a burst.
const BURST: f64 = 20.0;
/// Then one every this long.
const EVERY: Duration = Duration::from_secs(3);
/// Callers tracked at once; past it, the least recently refused is
/// forgotten.
const MAX_CALLERS: usize = 10_000;

/// Each caller's allowance of recorded refusals, and all callers'.
#[derive(Debug)]
pub struct RefusalLimiter {
    callers: HashMap<String, Allowance>,
    /// All callers together: many identities (a CI issuer hands out a new
    /// subject per branch) do not multiply the rate.
    all: Allowance,
}

impl Default for RefusalLimiter {
    fn default() -> Self {
        RefusalLimiter {
            callers: HashMap::new(),
            all: Allowance::full(ALL_BURST, Instant::now()),
        }
    }
}

/// Refusals of all callers recorded in a burst, then one per
/// [`ALL_EVERY`]: ten a second, so a flood rotates a 64 MiB trail out in
/// hours, not seconds.
const ALL_BURST: f64 = 200.0;
const ALL_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug)]
struct Allowance {
    tokens: f64,
    at: Instant,
    suppressed: u64,
}

impl Allowance {
    fn full(tokens: f64, now: Instant) -> Allowance {
        Allowance {
            tokens,
            at: now,
            suppressed: 0,
        }
    }

    /// Take one token if there is one (refilled up to `burst`, one per
    /// `every`).
    fn take(&mut self, now: Instant, burst: f64, every: Duration) -> bool {
        let gained = now.duration_since(self.at).as_secs_f64() / every.as_secs_f64();
        self.tokens = (self.tokens + gained).min(burst);
        self.at = now;
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// Whether a refusal is recorded.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Record it; so many of this caller's refusals before it were not.
    Record(u64),
    /// Count it only.
    Suppress,
}

impl RefusalLimiter {
    /// Judge a refusal of `caller` at `now`.
    pub fn judge(&mut self, caller: &str, now: Instant) -> Verdict {
        if !self.callers.contains_key(caller) && self.callers.len() >= MAX_CALLERS {
            self.forget_the_least_recent();
        }
        let allowance = self
            .callers
            .entry(caller.to_string())
            .or_insert_with(|| Allowance::full(BURST, now));
        if !allowance.take(now, BURST, EVERY) || !self.all.take(now, ALL_BURST, ALL_EVERY) {
            allowance.suppressed += 1;
            return Verdict::Suppress;
        }
        Verdict::Record(std::mem::take(&mut allowance.suppressed))
    }

    fn forget_the_least_recent(&mut self) {
        let oldest = self
            .callers
            .iter()
            .min_by_key(|(_, a)| a.at)
            .map(|(caller, _)| caller.clone());
        if let Some(caller) = oldest
            && let Some(gone) = self.callers.remove(&caller)
            && gone.suppressed > 0
        {
            tracing::warn!(
                caller = %caller,
                refusals = gone.suppressed,
                "audit: refusals not recorded (too many), and no longer counted"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_is_recorded_at_a_bounded_rate_and_counted() {
        let mut limiter = RefusalLimiter::default();
        let start = Instant::now();
        let recorded = (0..1000)
            .filter(|_| limiter.judge("no-grants", start) != Verdict::Suppress)
            .count();
        assert_eq!(recorded, BURST as usize);
        // Another caller has its own allowance.
        assert_eq!(limiter.judge("alice", start), Verdict::Record(0));
        // Later, one is recorded again, saying how many were not.
        let later = start + EVERY;
        assert_eq!(limiter.judge("no-grants", later), Verdict::Record(980));
        assert_eq!(limiter.judge("no-grants", later), Verdict::Suppress);
    }

    #[test]
    fn the_callers_tracked_are_bounded() {
        let mut limiter = RefusalLimiter::default();
        let now = Instant::now();
        for i in 0..MAX_CALLERS + 500 {
            for _ in 0..BURST as usize + 1 {
                limiter.judge(&format!("caller-{i}"), now);
            }
        }
        assert!(limiter.callers.len() <= MAX_CALLERS);
    }

    #[test]
    fn many_callers_do_not_multiply_the_rate() {
        let mut limiter = RefusalLimiter::default();
        let now = Instant::now();
        let recorded = (0..10_000)
            .filter(|i| limiter.judge(&format!("sub-{i}"), now) != Verdict::Suppress)
            .count();
        assert_eq!(recorded, ALL_BURST as usize);
    }
}
