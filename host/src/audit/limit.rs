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
/// Callers tracked at once; past it, idle ones are forgotten, and if none
/// is, every caller shares one allowance.
const MAX_CALLERS: usize = 10_000;

/// Each caller's allowance of recorded refusals.
#[derive(Debug, Default)]
pub struct RefusalLimiter {
    callers: HashMap<String, Allowance>,
}

#[derive(Debug)]
struct Allowance {
    tokens: f64,
    at: Instant,
    suppressed: u64,
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
            let full = |a: &Allowance| refilled(a, now) >= BURST;
            self.callers.retain(|_, a| !full(a) || a.suppressed > 0);
        }
        let key = match self.callers.len() < MAX_CALLERS || self.callers.contains_key(caller) {
            true => caller,
            false => "",
        };
        let allowance = self.callers.entry(key.to_string()).or_insert(Allowance {
            tokens: BURST,
            at: now,
            suppressed: 0,
        });
        allowance.tokens = refilled(allowance, now);
        allowance.at = now;
        if allowance.tokens < 1.0 {
            allowance.suppressed += 1;
            return Verdict::Suppress;
        }
        allowance.tokens -= 1.0;
        Verdict::Record(std::mem::take(&mut allowance.suppressed))
    }
}

fn refilled(allowance: &Allowance, now: Instant) -> f64 {
    let gained = now.duration_since(allowance.at).as_secs_f64() / EVERY.as_secs_f64();
    (allowance.tokens + gained).min(BURST)
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
        assert!(limiter.callers.len() <= MAX_CALLERS + 1);
    }
}
