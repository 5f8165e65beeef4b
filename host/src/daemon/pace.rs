//! The rate limit a pipeline's copies share (`snapshot.max_rows_per_second`):
//! a backfill may be told to go easy on the source and leave the machine to
//! the live stream.

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Spaces the chunks of a pipeline's copies so that together they read at
/// most `rows_per_second` on average. Each chunk about to be read reserves
/// the time its rows take at that rate, after the chunks reserved before it,
/// whichever table they belong to. Time nobody used is not saved up, so a
/// copy resumed after a quiet spell does not come as a burst.
#[derive(Debug)]
pub(crate) struct Pace {
    rows_per_second: Option<u64>,
    /// When the next chunk may start; `None` before the first.
    next: Mutex<Option<Instant>>,
}

impl Pace {
    /// At most `rows_per_second`; `None` for no limit.
    pub(crate) fn new(rows_per_second: Option<u64>) -> Pace {
        Pace {
            rows_per_second: rows_per_second.filter(|r| *r > 0),
            next: Mutex::new(None),
        }
    }

    /// When a chunk of up to `rows` rows asked for at `now` may be read; its
    /// share of time is reserved.
    fn reserve(&self, rows: usize, now: Instant) -> Instant {
        let Some(rate) = self.rows_per_second else {
            return now;
        };
        let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
        let start = next.map_or(now, |next| next.max(now));
        // At most a day a chunk, whatever the configuration says.
        let share = Duration::from_secs_f64((rows as f64 / rate as f64).min(86_400.0));
        *next = Some(start + share);
        start
    }

    /// Waits for the turn of a chunk of up to `rows` rows.
    pub(crate) async fn wait(&self, rows: usize) {
        let start = self.reserve(rows, Instant::now());
        tokio::time::sleep_until(start).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_limit_every_chunk_goes_at_once() {
        let pace = Pace::new(None);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(pace.reserve(10_000, now), now);
        }
        assert_eq!(Pace::new(Some(0)).reserve(10, now), now, "0 is no limit");
    }

    #[test]
    fn chunks_are_spaced_by_their_rows_at_the_rate_whoever_reads_them() {
        let pace = Pace::new(Some(1_000));
        let now = Instant::now();
        assert_eq!(pace.reserve(500, now), now);
        // Another table's chunk asked for at the same moment: after it.
        assert_eq!(pace.reserve(500, now), now + Duration::from_millis(500));
        assert_eq!(pace.reserve(2_000, now), now + Duration::from_secs(1));
        assert_eq!(pace.reserve(1, now), now + Duration::from_secs(3));
    }

    #[test]
    fn a_huge_chunk_at_a_tiny_rate_waits_a_day_not_forever() {
        let pace = Pace::new(Some(1));
        let now = Instant::now();
        assert_eq!(pace.reserve(usize::MAX, now), now);
        assert_eq!(pace.reserve(1, now), now + Duration::from_secs(86_400));
    }

    #[test]
    fn time_nobody_used_is_not_saved_up() {
        let pace = Pace::new(Some(1_000));
        let now = Instant::now();
        assert_eq!(pace.reserve(1_000, now), now);
        let later = now + Duration::from_secs(60);
        assert_eq!(pace.reserve(1_000, later), later);
        assert_eq!(pace.reserve(1_000, later), later + Duration::from_secs(1));
    }
}
