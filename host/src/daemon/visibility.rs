//! The transactions the stream has delivered that a chunk's read may not
//! have seen (`docs/snapshots.md`, "Commit order and visibility").
//!
//! PostgreSQL writes a transaction's commit record before the transaction
//! becomes visible to new snapshots: in between, the committing backend
//! flushes the WAL, marks the commit in the commit log, waits for
//! synchronous standbys and only then leaves the list of running
//! transactions. The stream delivers a transaction from its commit record.
//! So a chunk read just after its low watermark committed may not see a
//! transaction whose commit came before the watermark in the stream: its
//! rows would hold the state from before that transaction and, placed after
//! it, undo it in the sink.
//!
//! [`Delivered`] keeps the id of each transaction the stream delivers,
//! numbered in stream order. Each chunk's read reports the snapshot it was
//! read under; at the chunk's high watermark, a transaction that snapshot
//! did not see but the stream delivered before the low watermark makes the
//! chunk too early, and it is read again once the server sees that
//! transaction. An id is forgotten once a snapshot sees it that every
//! pending and later read is at least as new as, and in any case once
//! [`KEPT`] later transactions have been delivered.

use std::collections::HashMap;

use crate::source::snapshot::ReadSnapshot;

/// The delivered transactions kept at least: past twice as many, the
/// older half is forgotten. A transaction still not visible that long
/// after its commit (a synchronous standby that has not answered since)
/// goes unnoticed, as does one the stream delivered before the pipeline
/// started.
pub(crate) const KEPT: u64 = 65_536;

#[derive(Debug, Default)]
pub(crate) struct Delivered {
    /// The number of the latest batch noted.
    seq: u64,
    /// Transaction id, as the stream gives it (32 bits), to the number of
    /// its latest batch.
    ids: HashMap<u32, u64>,
    /// Snapshots to forget ids by, each once the chunks that may have read
    /// under an older one are gone.
    forget: Vec<Forget>,
}

#[derive(Debug)]
struct Forget {
    /// The chunk read under `snapshot`.
    chunk: u64,
    /// Chunks registered from this id on were registered after the read
    /// ended, so their snapshots are newer.
    registered_from: u64,
    snapshot: ReadSnapshot,
}

impl Delivered {
    /// A batch of transaction `xid` passes in the stream (0: a message
    /// outside any transaction).
    pub(crate) fn note(&mut self, xid: u32) {
        if xid == 0 {
            return;
        }
        self.seq += 1;
        self.ids.insert(xid, self.seq);
        if self.ids.len() as u64 >= 2 * KEPT {
            let floor = self.seq.saturating_sub(KEPT);
            self.ids.retain(|_, seq| *seq > floor);
        }
    }

    /// The number of the latest batch noted: a chunk whose low watermark
    /// rides in it compares against it.
    pub(crate) fn now(&self) -> u64 {
        self.seq
    }

    /// The transactions `snapshot` did not see that the stream delivered
    /// before batch `low`, as full ids, in order. Not only those it lists
    /// as running: a transaction whose id is at or past its `xmax` (no
    /// transaction that new had ended when it was taken) is not listed,
    /// and not seen either.
    pub(crate) fn unseen_before(&self, snapshot: &ReadSnapshot, low: u64) -> Vec<u64> {
        let mut unseen: Vec<u64> = self
            .ids
            .iter()
            .filter(|(xid, seq)| **seq < low && !snapshot.sees(**xid))
            .filter_map(|(xid, _)| snapshot.full(*xid))
            .collect();
        unseen.sort_unstable();
        unseen
    }

    /// Chunk `chunk` was read under `snapshot`; chunks from
    /// `registered_from` on did not exist yet when the read ended.
    pub(crate) fn read(&mut self, chunk: u64, registered_from: u64, snapshot: ReadSnapshot) {
        self.forget.push(Forget {
            chunk,
            registered_from,
            snapshot,
        });
    }

    /// Forgets the ids every snapshot still to be checked sees, by each
    /// snapshot no pending chunk (`pending`, their ids) may be older than.
    pub(crate) fn forget_seen(&mut self, pending: impl Iterator<Item = u64> + Clone) {
        let mut i = 0;
        while i < self.forget.len() {
            let f = &self.forget[i];
            let older_pending = pending
                .clone()
                .any(|id| id < f.registered_from && id != f.chunk);
            if older_pending {
                i += 1;
                continue;
            }
            let f = self.forget.swap_remove(i);
            self.ids.retain(|xid, _| !f.snapshot.sees(*xid));
        }
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.ids.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snapshot(text: &str) -> ReadSnapshot {
        ReadSnapshot::parse(text).expect("a snapshot")
    }

    #[test]
    fn snapshots_parse_and_see_by_the_stream_s_32_bit_ids() {
        let s = snapshot("100:110:103,105");
        assert_eq!(s.xip, [103, 105]);
        assert!(s.sees(99) && s.sees(104) && s.sees(109));
        assert!(!s.sees(103) && !s.sees(105) && !s.sees(110) && !s.sees(200));
        let empty = snapshot("7:7:");
        assert!(empty.sees(6) && !empty.sees(7));
        // Past the first epoch: the stream's ids are the low 32 bits.
        let later = snapshot("4294967396:4294967406:4294967400");
        assert!(later.sees(100) && !later.sees(104) && later.sees(105));
        assert!(!later.sees(110));
        for bad in ["", "1", "1:2", "3:2:", "1:2:x", "a:b:"] {
            assert_eq!(ReadSnapshot::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_transaction_delivered_before_the_low_watermark_and_unseen_makes_the_chunk_early() {
        let mut d = Delivered::default();
        d.note(103);
        d.note(104);
        let low = {
            d.note(106); // the low watermark's own transaction
            d.now()
        };
        d.note(105); // between the watermarks: the chunk drops its keys
        let read = snapshot("100:107:103,105");
        assert_eq!(d.unseen_before(&read, low), [103]);
        assert_eq!(
            d.unseen_before(&snapshot("100:107:105"), low),
            [] as [u64; 0]
        );
    }

    /// Regression: a transaction whose id is at or past the snapshot's
    /// `xmax` is not in its list of running ones, and was taken as seen: a
    /// delete that got its id after the low watermark's but committed
    /// before it, then waited for a synchronous standby, came back.
    #[test]
    fn a_transaction_at_or_past_the_snapshot_s_xmax_is_unseen() {
        let mut d = Delivered::default();
        d.note(110); // committed first, not visible yet
        d.note(108); // the low watermark: its id is older, and it ended
        let low = d.now();
        // Taken when 108 was the newest to have ended.
        assert_eq!(d.unseen_before(&snapshot("109:109:"), low), [110]);
        assert_eq!(d.unseen_before(&snapshot("109:111:110"), low), [110]);
        assert_eq!(d.unseen_before(&snapshot("111:111:"), low), [] as [u64; 0]);
        // Past the first epoch, as a full id.
        let mut d = Delivered::default();
        d.note(102);
        d.note(99);
        let low = d.now();
        let read = snapshot("4294967396:4294967396:");
        assert_eq!(d.unseen_before(&read, low), [4294967398]);
    }

    #[test]
    fn ids_are_forgotten_only_by_a_snapshot_no_pending_read_is_older_than() {
        let mut d = Delivered::default();
        for xid in [103, 104, 105] {
            d.note(xid);
        }
        // Chunk 1 read under a snapshot that sees 104 only, while chunk 0
        // (registered before the read ended) is pending.
        d.read(1, 2, snapshot("103:106:103,105"));
        d.forget_seen([0, 1].into_iter());
        assert_eq!(d.kept(), 3, "chunk 0 may have read under an older one");
        d.forget_seen([1, 2].into_iter());
        assert_eq!(d.kept(), 2, "104 forgotten");
    }

    #[test]
    fn at_most_twice_the_kept_transactions_are_remembered_and_the_latest_always() {
        let mut d = Delivered::default();
        for xid in 1..=(3 * KEPT as u32) {
            d.note(xid);
            assert!(d.kept() < 2 * KEPT as usize);
        }
        let low = d.now() + 1;
        let latest = ReadSnapshot {
            xmin: 1,
            xmax: 3 * KEPT + 1,
            xip: vec![3 * KEPT - KEPT + 1, 3 * KEPT],
        };
        assert_eq!(d.unseen_before(&latest, low), latest.xip);
    }
}
