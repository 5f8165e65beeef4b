//! One back-off for everything that retries: source reconnects, a source
//! that cannot be prepared yet, sink retries and checkpoint commits. Capped
//! exponential, with ±25 % jitter so that many pipelines don't retry in
//! lockstep.

use std::time::Duration;

/// The waits between attempts: `initial`, doubling up to `max`, each
/// jittered.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// Waits from `initial` doubling up to `max`.
    pub(crate) fn new(initial: Duration, max: Duration) -> Backoff {
        Backoff {
            initial,
            max: max.max(initial),
            next: initial,
        }
    }

    /// The wait before the next attempt; the one after is twice as long
    /// (up to the cap).
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = jitter(self.next);
        self.next = (self.next * 2).min(self.max);
        wait
    }

    /// Back to the initial wait (after an attempt succeeded).
    pub(crate) fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// `delay` ±25 %.
fn jitter(delay: Duration) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let factor = 0.75 + f64::from(nanos % 1000) / 2000.0;
    delay.mul_f64(factor)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_up_to_the_cap_within_the_jitter_and_reset() {
        let ms = Duration::from_millis;
        let mut backoff = Backoff::new(ms(100), ms(350));
        for nominal in [100u64, 200, 350, 350] {
            let wait = backoff.next_wait();
            // Bounds as exact as the jitter's: 350 ms × 5/4 is 437.5 ms,
            // not the 437 ms of integer division.
            assert!(
                wait >= ms(nominal).mul_f64(0.75) && wait <= ms(nominal).mul_f64(1.25),
                "{wait:?} for {nominal} ms"
            );
        }
        backoff.reset();
        assert!(backoff.next_wait() <= ms(125));
    }
}
