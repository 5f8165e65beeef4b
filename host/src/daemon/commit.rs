//! The commit loop: the feedback coordinator's watermark into the state
//! file, and back to the coordinator as flushed once it is durable.

use std::sync::Arc;
use std::time::Duration;

use crate::checkpoint::{CheckpointError, Store};
use crate::retry::Backoff;

use super::feedback::Feedback;
use super::snapshot::Snapshots;
use crate::source::shapes::Shapes;

/// How checkpoints are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommitPolicy {
    /// How long to wait after an acknowledgement for more before committing:
    /// the added latency that buys one fsync for many transactions. Zero
    /// commits at once (transactions acknowledged during a commit still
    /// share the next one).
    pub group_delay: Duration,
}

impl Default for CommitPolicy {
    fn default() -> Self {
        CommitPolicy {
            group_delay: crate::config::DEFAULT_GROUP_COMMIT,
        }
    }
}

/// What a checkpoint carries besides the position, consistent with it:
/// snapshot progress (`daemon/snapshot.rs`) and the table shapes the stream
/// described (`source/shapes.rs`).
pub(crate) struct Consistent {
    /// Per-table snapshot progress.
    pub(crate) snapshots: Arc<Snapshots>,
    /// Table shapes.
    pub(crate) shapes: Arc<Shapes>,
}

/// Commits `pipeline`'s acknowledged watermark until `shutdown`, then commits
/// what is left. Only after a commit returns does the feedback coordinator
/// learn the position as flushed, and PostgreSQL with it.
///
/// A failing commit is retried with back-off (the position simply does not
/// advance meanwhile); the error is logged and handed to `failed` each time.
/// On shutdown the loop keeps trying to commit what is left: the caller
/// bounds how long it waits for that.
pub(crate) async fn commit_loop(
    store: Arc<Store>,
    pipeline: String,
    feedback: Arc<Feedback>,
    consistent: Consistent,
    policy: CommitPolicy,
    failed: impl Fn(&CheckpointError),
    shutdown: impl std::future::Future<Output = ()>,
) {
    let Consistent { snapshots, shapes } = consistent;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut targets = feedback.target();
    // Whatever was acknowledged before this loop subscribed counts too.
    targets.mark_changed();
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    loop {
        let stopping = tokio::select! {
            biased;
            _ = shutdown.as_mut() => true,
            changed = targets.changed() => changed.is_err(),
        };
        // Wait for more acknowledgements to share the commit, but not past
        // a shutdown: the final commit happens at once.
        let stopping = stopping
            || (!policy.group_delay.is_zero()
                && tokio::select! {
                    biased;
                    _ = shutdown.as_mut() => true,
                    _ = tokio::time::sleep(policy.group_delay) => false,
                });
        loop {
            let target = *targets.borrow_and_update();
            if target.end_lsn <= feedback.flushed() {
                break;
            }
            let (store, name) = (store.clone(), pipeline.clone());
            // Snapshot progress consistent with this position goes in the
            // same commit (`daemon/snapshot.rs`).
            let progress = snapshots.progress_upto(target.end_lsn);
            // So do the table shapes the stream described up to it
            // (`source/shapes.rs`).
            let described = shapes.upto(target.end_lsn);
            let result = tokio::task::spawn_blocking(move || {
                store.commit_checkpoint(&name, target, &progress, &described)
            })
            .await;
            match result {
                Ok(Ok(())) => {
                    snapshots.committed(target.end_lsn);
                    shapes.committed(target.end_lsn);
                    feedback.persisted(target.end_lsn);
                    backoff.reset();
                    break;
                }
                Ok(Err(err)) => {
                    let wait = backoff.next_wait();
                    tracing::error!(pipeline = %pipeline, error = %err, retry_in = ?wait, "checkpoint commit failed; retrying");
                    failed(&err);
                    tokio::time::sleep(wait).await;
                }
                Err(err) => {
                    let wait = backoff.next_wait();
                    tracing::error!(pipeline = %pipeline, error = %err, retry_in = ?wait, "checkpoint task failed; retrying");
                    tokio::time::sleep(wait).await;
                }
            }
        }
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Lsn, Offset};

    fn tempdir() -> std::path::PathBuf {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "datum-commit-test-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("mkdir");
        dir
    }

    #[tokio::test]
    async fn group_commit_shares_one_commit_among_many_acknowledgements() {
        use datum_guest::Txn;
        let dir = tempdir();
        let store = Arc::new(Store::open(dir.join("state.redb")).expect("create"));
        let feedback = Feedback::new(Offset::default());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let policy = CommitPolicy {
            group_delay: Duration::from_millis(200),
        };
        let committer = tokio::spawn(commit_loop(
            store.clone(),
            "p".into(),
            feedback.clone(),
            Consistent {
                snapshots: Snapshots::new("p"),
                shapes: Shapes::new(Vec::new()),
            },
            policy,
            |_| {},
            async move {
                let _ = stopped.await;
            },
        ));
        let mut flushed = feedback.flushed_watch();
        for i in 1..=100u64 {
            let txn = Txn {
                xid: i as u32,
                commit_lsn: i * 10,
                end_lsn: i * 10 + 1,
                commit_time: 0,
                chunk: 0,
                last: true,
            };
            feedback.register(&txn).expect("in order");
            feedback.ack(&txn);
        }
        flushed
            .wait_for(|lsn| *lsn == Lsn(1001))
            .await
            .expect("flushed");
        assert_eq!(
            store.commits(),
            1,
            "100 acknowledgements within the window, one commit"
        );
        assert_eq!(
            store.offset("p").expect("read").map(|o| o.end_lsn),
            Some(Lsn(1001))
        );
        let _ = stop.send(());
        committer.await.expect("committer");
        std::fs::remove_dir_all(dir).ok();
    }
}
