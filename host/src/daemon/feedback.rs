//! The feedback coordinator (`docs/architecture.md`, rule 2): which transactions are fully
//! acknowledged, what may be checkpointed, and what PostgreSQL may be told
//! is flushed.
//!
//! The source registers every batch (transaction or chunk) before sending it
//! downstream; the pipeline acknowledges each one once the sink has it
//! durably; the commit loop persists the watermark and reports it back.
//!
//! Invariants (kept by construction or refused with an
//! [`OrderError`](crate::source::OrderError),
//! never asserted; tried by the tests below):
//! * the *watermark* (offered to the checkpoint) is the end LSN of the longest
//!   prefix, in commit order, of transactions whose every chunk was
//!   acknowledged and whose last chunk was registered; acknowledgements may
//!   arrive in any order and more than once;
//! * the watermark never moves backwards;
//! * *flushed* (reported to PostgreSQL as `flush` and `apply`) is never greater
//!   than the last position committed to redb, nor than the watermark;
//! * the idle rule (`docs/architecture.md`, rule 4): when nothing is registered and
//!   unacknowledged and the source has no open transaction, a keepalive's WAL
//!   end may become the watermark, so a quiet publication does not pin WAL.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use datum_guest::Txn;
use tokio::sync::watch;

use crate::event::{Lsn, Offset};
use crate::source::{OrderError, Positions};

#[derive(Debug)]
struct Pending {
    commit_lsn: Lsn,
    xid: u32,
    commit_time: i64,
    /// Chunks registered so far (they arrive in order 0, 1, 2, ...).
    registered: u32,
    /// Set when the last chunk is registered: its end LSN.
    end_lsn: Option<Lsn>,
    /// Which registered chunks were acknowledged.
    acked: Vec<bool>,
    acked_count: u32,
}

impl Pending {
    fn complete(&self) -> bool {
        self.end_lsn.is_some() && self.acked_count == self.registered
    }

    /// Whether `txn` is a further chunk of this (unfinished) transaction.
    fn continued_by(&self, txn: &Txn) -> bool {
        self.end_lsn.is_none() && self.commit_lsn == Lsn(txn.commit_lsn) && self.xid == txn.xid
    }
}

#[derive(Debug)]
struct State {
    pending: VecDeque<Pending>,
    watermark: Offset,
    flushed: Lsn,
}

/// See the module documentation. Shared by the source, the pipeline and the
/// commit loop.
#[derive(Debug)]
pub struct Feedback {
    state: Mutex<State>,
    target: watch::Sender<Offset>,
    flushed: watch::Sender<Lsn>,
}

impl Feedback {
    /// A coordinator resuming from `checkpoint` (the default offset, `0/0`,
    /// when the pipeline never checkpointed).
    pub fn new(checkpoint: Offset) -> Arc<Feedback> {
        Arc::new(Feedback {
            state: Mutex::new(State {
                pending: VecDeque::new(),
                watermark: checkpoint,
                flushed: checkpoint.end_lsn,
            }),
            target: watch::channel(checkpoint).0,
            flushed: watch::channel(checkpoint.end_lsn).0,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the source is about to send this batch downstream.
    /// Batches are registered in the order the source emits them: commit
    /// order, where equal positions are legal (`docs/architecture.md`, pitfall 14: a
    /// non-transactional message ends where the next transaction's commit
    /// record starts, so both carry the same commit LSN). A batch that would
    /// go back in commit order, or a new transaction that does not start at
    /// its first chunk, is refused with the positions involved: the
    /// coordinator's state is left as it was.
    pub fn register(&self, txn: &Txn) -> Result<(), OrderError> {
        let mut state = self.lock();
        let commit_lsn = Lsn(txn.commit_lsn);
        let fresh = match state.pending.back() {
            Some(last) => !last.continued_by(txn),
            None => true,
        };
        if fresh {
            if let Some(last) = state.pending.back()
                && commit_lsn < last.commit_lsn
            {
                return Err(OrderError::Backwards {
                    xid: txn.xid,
                    commit_lsn,
                    previous_xid: last.xid,
                    previous_commit_lsn: last.commit_lsn,
                });
            }
            // A transaction resumed after a reconnect keeps its entry (its
            // first chunks were registered in the earlier session), so a new
            // entry always starts at chunk 0.
            if txn.chunk != 0 {
                return Err(OrderError::MidTransaction {
                    xid: txn.xid,
                    commit_lsn,
                    chunk: txn.chunk,
                });
            }
            state.pending.push_back(Pending {
                commit_lsn,
                xid: txn.xid,
                commit_time: txn.commit_time,
                registered: 0,
                end_lsn: None,
                acked: Vec::new(),
                acked_count: 0,
            });
        }
        let Some(entry) = state.pending.back_mut() else {
            return Ok(());
        };
        let index = txn.chunk as usize;
        if index >= entry.acked.len() {
            entry.acked.resize(index + 1, false);
            entry.registered = index as u32 + 1;
        }
        if txn.last {
            entry.end_lsn = Some(Lsn(txn.end_lsn));
        }
        Ok(())
    }

    /// Records that the sink durably accepted this batch. Duplicates and
    /// batches that were never registered are ignored.
    pub fn ack(&self, txn: &Txn) {
        let mut state = self.lock();
        let commit_lsn = Lsn(txn.commit_lsn);
        // A transaction is its commit LSN and xid: a non-transactional
        // message (xid 0) may share its commit LSN with the next
        // transaction.
        let Some(entry) = state.pending.iter_mut().find(|p| {
            p.commit_lsn == commit_lsn && p.xid == txn.xid && p.acked.len() > txn.chunk as usize
        }) else {
            return;
        };
        let slot = &mut entry.acked[txn.chunk as usize];
        if !*slot {
            *slot = true;
            entry.acked_count += 1;
        }
        Self::advance(&mut state, &self.target);
    }

    fn advance(state: &mut State, target: &watch::Sender<Offset>) {
        let mut moved = false;
        while state.pending.front().is_some_and(Pending::complete) {
            let Some(done) = state.pending.pop_front() else {
                break;
            };
            let end_lsn = done.end_lsn.unwrap_or(done.commit_lsn);
            if end_lsn > state.watermark.end_lsn {
                state.watermark = Offset {
                    end_lsn,
                    commit_lsn: done.commit_lsn,
                    xid: done.xid,
                    commit_time: done.commit_time,
                    written_at: 0,
                };
                moved = true;
            }
        }
        if moved {
            target.send_replace(state.watermark);
        }
    }

    /// Whether nothing is registered and unacknowledged.
    pub fn idle(&self) -> bool {
        self.lock().pending.is_empty()
    }

    /// The idle rule: with nothing pending, and (the caller guarantees) no
    /// transaction open in the source, everything before `wal_end` has been
    /// delivered and acknowledged, so it may be checkpointed.
    pub fn advance_idle(&self, wal_end: Lsn) {
        let mut state = self.lock();
        if !state.pending.is_empty() || wal_end <= state.watermark.end_lsn {
            return;
        }
        state.watermark = Offset {
            end_lsn: wal_end,
            commit_lsn: wal_end,
            xid: 0,
            commit_time: 0,
            written_at: 0,
        };
        self.target.send_replace(state.watermark);
    }

    /// The watermark, as it changes: what the commit loop persists.
    pub fn target(&self) -> watch::Receiver<Offset> {
        self.target.subscribe()
    }

    /// The current watermark.
    pub fn watermark(&self) -> Offset {
        self.lock().watermark
    }

    /// Called by the commit loop once `lsn` is durably in redb.
    pub fn persisted(&self, lsn: Lsn) {
        let mut state = self.lock();
        // Only an acknowledged position can have been committed.
        let lsn = lsn.min(state.watermark.end_lsn);
        if lsn > state.flushed {
            state.flushed = lsn;
            self.flushed.send_replace(lsn);
        }
    }

    /// What PostgreSQL may be told is flushed: the last committed checkpoint.
    pub fn flushed(&self) -> Lsn {
        self.lock().flushed
    }

    /// `flushed`, as it changes.
    pub fn flushed_watch(&self) -> watch::Receiver<Lsn> {
        self.flushed.subscribe()
    }
}

/// What the source calls: the coordinator as the source sees it.
impl Positions for Feedback {
    fn register(&self, txn: &Txn) -> Result<(), OrderError> {
        Feedback::register(self, txn)
    }

    fn idle(&self, wal_end: Lsn) {
        self.advance_idle(wal_end);
    }

    fn flushed(&self) -> Lsn {
        Feedback::flushed(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn chunk(commit: u64, chunk: u32, last: bool) -> Txn {
        Txn {
            xid: commit as u32,
            commit_lsn: commit,
            end_lsn: if last { commit + 1 } else { 0 },
            commit_time: 0,
            chunk,
            last,
        }
    }

    #[test]
    fn the_watermark_covers_only_complete_transactions() {
        let f = Feedback::new(Offset::default());
        let a0 = chunk(10, 0, false);
        let a1 = chunk(10, 1, true);
        let b = chunk(20, 0, true);
        for t in [&a0, &a1, &b] {
            f.register(t).expect("in order");
        }
        f.ack(&b);
        assert_eq!(f.watermark().end_lsn, Lsn::ZERO, "b waits for a");
        f.ack(&a1);
        assert_eq!(
            f.watermark().end_lsn,
            Lsn::ZERO,
            "a's first chunk is not acked"
        );
        f.ack(&a0);
        assert_eq!(f.watermark().end_lsn, Lsn(21));
        assert!(f.idle());
    }

    #[test]
    fn a_transaction_is_incomplete_until_its_last_chunk_is_registered() {
        let f = Feedback::new(Offset::default());
        let a0 = chunk(10, 0, false);
        f.register(&a0).expect("in order");
        f.ack(&a0);
        assert_eq!(f.watermark().end_lsn, Lsn::ZERO);
        assert!(!f.idle());
        let a1 = chunk(10, 1, true);
        f.register(&a1).expect("in order");
        f.ack(&a1);
        assert_eq!(f.watermark().end_lsn, Lsn(11));
    }

    #[test]
    fn flushed_follows_persisted_never_the_watermark_alone() {
        let f = Feedback::new(Offset::default());
        let a = chunk(10, 0, true);
        f.register(&a).expect("in order");
        f.ack(&a);
        assert_eq!(f.flushed(), Lsn::ZERO, "acknowledged is not yet committed");
        f.persisted(Lsn(11));
        assert_eq!(f.flushed(), Lsn(11));
    }

    #[test]
    fn idle_keepalives_advance_only_when_nothing_is_pending() {
        let f = Feedback::new(Offset::default());
        let a = chunk(10, 0, true);
        f.register(&a).expect("in order");
        f.advance_idle(Lsn(100));
        assert_eq!(f.watermark().end_lsn, Lsn::ZERO, "a is in flight");
        f.ack(&a);
        f.advance_idle(Lsn(100));
        assert_eq!(f.watermark().end_lsn, Lsn(100));
        f.advance_idle(Lsn(50));
        assert_eq!(f.watermark().end_lsn, Lsn(100), "never backwards");
    }

    #[test]
    fn a_transaction_resumed_mid_way_after_a_reconnect_completes() {
        let f = Feedback::new(Offset::default());
        let a0 = chunk(10, 0, false);
        f.register(&a0).expect("in order");
        f.ack(&a0);
        // The connection drops; the source resumes the transaction at
        // chunk 1 (chunk 0 was delivered) and finishes it.
        let a1 = chunk(10, 1, true);
        f.register(&a1).expect("in order");
        f.ack(&a1);
        assert_eq!(f.watermark().end_lsn, Lsn(11));
        assert!(f.idle());
    }

    #[test]
    fn a_message_at_the_next_commit_position_does_not_stall_or_panic() {
        // A non-transactional message ends where the next transaction's
        // commit record starts: both carry commit LSN 100.
        let f = Feedback::new(Offset::default());
        let message = Txn {
            xid: 0,
            commit_lsn: 100,
            end_lsn: 100,
            commit_time: 0,
            chunk: 0,
            last: true,
        };
        let b = Txn {
            xid: 7,
            commit_lsn: 100,
            end_lsn: 120,
            commit_time: 0,
            chunk: 0,
            last: true,
        };
        f.register(&message).expect("the message");
        f.register(&b).expect("an equal commit position is legal");
        f.ack(&message);
        assert_eq!(f.watermark().end_lsn, Lsn(100));
        f.ack(&b);
        assert_eq!(f.watermark().end_lsn, Lsn(120), "b's own entry was acked");
        assert!(f.idle());
    }

    #[test]
    fn an_out_of_order_registration_is_a_typed_error_naming_the_positions() {
        let f = Feedback::new(Offset::default());
        f.register(&chunk(200, 0, true)).expect("first");
        let err = f.register(&chunk(100, 0, true)).expect_err("backwards");
        let text = err.to_string();
        assert!(text.contains("0/C8") && text.contains("0/64"), "{text}");
        let err = f.register(&chunk(300, 2, true)).expect_err("mid-way");
        assert!(
            matches!(err, OrderError::MidTransaction { chunk: 2, .. }),
            "{err}"
        );
        // Nothing was recorded by the refused registrations.
        f.ack(&chunk(200, 0, true));
        assert_eq!(f.watermark().end_lsn, Lsn(201));
        assert!(f.idle());
    }

    /// One transaction: its commit LSN and number of chunks.
    fn transactions() -> impl Strategy<Value = Vec<u32>> {
        prop::collection::vec(1u32..4, 1..12)
    }

    proptest! {
        #[test]
        fn watermark_is_the_largest_complete_acknowledged_prefix(
            chunks in transactions(),
            order in prop::collection::vec(any::<prop::sample::Index>(), 0..80),
            registered_upto in any::<prop::sample::Index>(),
        ) {
            let f = Feedback::new(Offset::default());
            let all: Vec<Txn> = chunks
                .iter()
                .enumerate()
                .flat_map(|(i, &n)| {
                    let commit = (i as u64 + 1) * 100;
                    (0..n).map(move |c| chunk(commit, c, c + 1 == n))
                })
                .collect();
            // Register a prefix (the source may not have sent everything).
            let registered = registered_upto.index(all.len() + 1);
            for t in &all[..registered] {
                f.register(t).expect("in order");
            }
            let mut acked = vec![false; all.len()];
            let mut last = Lsn::ZERO;
            for pick in order {
                if registered == 0 {
                    break;
                }
                // Acknowledge any registered chunk, duplicates included.
                let i = pick.index(registered);
                acked[i] = true;
                f.ack(&all[i]);
                // The expected watermark: walk transactions in order.
                let mut expected = Lsn::ZERO;
                let mut pos = 0;
                for &n in &chunks {
                    let range = pos..pos + n as usize;
                    pos += n as usize;
                    let complete = range.end <= registered && range.clone().all(|j| acked[j]);
                    if !complete {
                        break;
                    }
                    expected = Lsn(all[range.end - 1].end_lsn);
                }
                let got = f.watermark().end_lsn;
                prop_assert_eq!(got, expected);
                prop_assert!(got >= last, "the watermark went backwards");
                last = got;
            }
        }
    }
}
