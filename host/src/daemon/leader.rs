//! High availability: of several hosts with the same pipeline, the one that
//! holds the pipeline's leader lock streams its slot; the others stand by
//! (`docs/scaling.md`).
//!
//! The lock is a PostgreSQL session advisory lock on the source, keyed by
//! the slot's name, held by a connection of its own. When the holder dies
//! (its process, its machine or its connection), PostgreSQL ends the
//! session and releases the lock, and a standby takes it. A holder that
//! loses its lock connection stops streaming (drains what is in flight,
//! checkpoints) and stands by again: it can no longer know that it is the
//! only one. The slot itself admits one walsender at a time, so even in the
//! moment two hosts both believe they lead, only one streams.
//!
//! Who writes is the sink's to decide (its fence, `Sink::take_over`): a
//! lease carries what keys the fence (the source's system identifier, for
//! a sink that is fenced) and can ask its session, on demand, whether the
//! lock is still held.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::pg::ConnInfo;
use crate::retry::Backoff;

/// How often the holder checks that its lock connection is alive.
const PROBE_EVERY: Duration = Duration::from_secs(1);
/// How long a probe may take before the lock counts as lost.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How often a standby tries to take the lock.
const TRY_EVERY: Duration = Duration::from_secs(1);

/// The lock, held while this lives (dropping it closes the session, which
/// releases the lock).
#[derive(Debug)]
pub(crate) struct Lease {
    lost: watch::Receiver<bool>,
    probe: tokio::task::JoinHandle<()>,
    /// Asks the probe to probe now; it answers whether the lock is held.
    now: tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<bool>>,
    /// The source's system identifier (the same on every host, and on a
    /// standby promoted in the source's place).
    source: String,
}

impl Lease {
    /// What names this pipeline's slot on every host, and on no other
    /// source: the source's system identifier and the slot's name,
    /// `SYSTEMID/SLOT` (the key of the sink's fence).
    pub(crate) fn holder_key(&self, slot: &str) -> String {
        format!("{}/{slot}", self.source)
    }

    /// Completes when the lock connection failed: another host may lead.
    pub(crate) async fn lost(&mut self) {
        let _ = self.lost.wait_for(|lost| *lost).await;
    }

    /// Whether the lock connection failed.
    pub(crate) fn is_lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Whether the lock is still held, asked of the server now rather than
    /// as of the last probe.
    pub(crate) async fn confirm(&self) -> bool {
        if self.is_lost() {
            return false;
        }
        let (answer, answered) = tokio::sync::oneshot::channel();
        if self.now.send(answer).await.is_err() {
            return false;
        }
        answered.await.unwrap_or(false)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.probe.abort();
    }
}

/// How long the server keeps the lock session of a holder that stopped
/// using it (its process frozen, its machine gone without closing the
/// connection) before it ends the session and so releases the lock. A
/// living holder probes every `PROBE_EVERY`, so its session is never idle
/// that long. Without it the server keeps the session until its TCP
/// keepalive gives up, two hours by default.
const ABANDONED_AFTER: Duration = Duration::from_secs(10);

/// Settings of the lock session that end it on the server once its holder
/// is gone: `idle_session_timeout` (PostgreSQL 14 and later), and TCP
/// keepalives that find a vanished peer in about 11 s over TCP.
async fn bound_session(client: &tokio_postgres::Client) -> Result<(), String> {
    let version: i32 = client
        .query_one("SELECT current_setting('server_version_num')::int4", &[])
        .await
        .and_then(|row| row.try_get(0))
        .map_err(|e| crate::pg::error_chain(&e))?;
    let mut sql = String::from(
        "SET tcp_keepalives_idle = 5; SET tcp_keepalives_interval = 2; \
         SET tcp_keepalives_count = 3;",
    );
    if version >= 140_000 {
        sql.push_str(&format!(
            " SET idle_session_timeout = {};",
            ABANDONED_AFTER.as_millis()
        ));
    }
    client
        .batch_execute(&sql)
        .await
        .map_err(|e| crate::pg::error_chain(&e))
}

/// How long the query that tries to take the lock may go unanswered.
const LOCK_QUERY_TIMEOUT: Duration = Duration::from_secs(10);

/// The SQL that tries to take the lock of `slot` (the key is the server's
/// hash of the slot's name, the same for every host).
const TRY_LOCK: &str = "SELECT pg_try_advisory_lock(hashtextextended('datum leader ' || $1, 0))";

/// The source's system identifier, read on each lock connection before
/// the lock is tried. Two sources can have slots of the same name (a
/// pipeline configured alike for two shards); their fences in a shared
/// target must not be one.
async fn system_identifier(client: &tokio_postgres::Client) -> Result<String, String> {
    crate::source::catalog::system_identifier(client)
        .await
        .map_err(|e| {
            let mut err = crate::pg::error_chain(&e);
            if e.as_db_error().map(|d| d.code().code()) == Some("42501") {
                err.push_str(
                    "; the leader lock reads the source's system identifier: GRANT EXECUTE ON \
                     FUNCTION pg_control_system() TO the source's user (PostgreSQL grants it \
                     to everyone unless it was revoked)",
                );
            }
            format!("reading the source's system identifier: {err}")
        })
}

/// Waits until this host holds the leader lock of `slot`, retrying a
/// source it cannot reach with back-off; `on_unreachable` is told why
/// each attempt to reach it failed. `identify`: the pipeline's sink is
/// fenced, so the lease needs the source's system identifier
/// ([`Lease::holder_key`]). `None`: `cancel` completed first.
pub(crate) async fn acquire(
    info: &ConnInfo,
    slot: &str,
    pipeline: &str,
    identify: bool,
    mut on_unreachable: impl FnMut(String),
    cancel: impl Future<Output = ()>,
) -> Option<Lease> {
    let mut cancel = std::pin::pin!(cancel);
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10));
    let mut announced = false;
    loop {
        let client = tokio::select! {
            biased;
            _ = cancel.as_mut() => return None,
            client = crate::pg::connect(info) => client,
        };
        let client = match client {
            Ok(client) => client,
            Err(err) => {
                let wait = backoff.next_wait();
                tracing::warn!(pipeline = %pipeline, error = %err, retry_in = ?wait, "cannot reach the source to take the leader lock; retrying");
                on_unreachable(format!(
                    "cannot reach the source for the leader lock: {err}"
                ));
                tokio::select! {
                    biased;
                    _ = cancel.as_mut() => return None,
                    _ = tokio::time::sleep(wait) => continue,
                }
            }
        };
        // Read before the lock is first tried: a failure never holds it.
        let mut source = None;
        loop {
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&slot];
            let attempt = async {
                let source = match &source {
                    Some(source) => source,
                    None => {
                        bound_session(&client)
                            .await
                            .map_err(|e| format!("setting the lock session's timeouts: {e}"))?;
                        source.insert(if identify {
                            system_identifier(&client).await?
                        } else {
                            String::new()
                        })
                    }
                };
                let taken = client
                    .query_one(TRY_LOCK, &params)
                    .await
                    .and_then(|r| r.try_get::<_, bool>(0))
                    .map_err(|e| crate::pg::error_chain(&e))?;
                Ok::<_, String>(taken.then(|| source.clone()))
            };
            let taken = tokio::select! {
                biased;
                _ = cancel.as_mut() => return None,
                taken = tokio::time::timeout(LOCK_QUERY_TIMEOUT, attempt) => {
                    taken.unwrap_or_else(|_| Err(format!("no answer within {LOCK_QUERY_TIMEOUT:?}")))
                }
            };
            if taken.is_ok() {
                backoff.reset();
            }
            match taken {
                Ok(Some(source)) => {
                    tracing::info!(pipeline = %pipeline, slot = %slot, "took the leader lock: this host streams the slot");
                    return Some(hold(client, pipeline, source));
                }
                Ok(None) => {
                    if !announced {
                        tracing::info!(pipeline = %pipeline, slot = %slot, "standing by: another host holds the leader lock");
                        announced = true;
                    }
                    tokio::select! {
                        biased;
                        _ = cancel.as_mut() => return None,
                        _ = tokio::time::sleep(TRY_EVERY) => {}
                    }
                }
                Err(err) => {
                    // Waited out like an unreachable source: a query that
                    // fails on a working connection (the function's
                    // EXECUTE revoked) must not become a reconnect loop.
                    let wait = backoff.next_wait();
                    tracing::warn!(pipeline = %pipeline, error = %err, retry_in = ?wait, "the leader lock's query failed; reconnecting");
                    on_unreachable(format!("the leader lock's query failed: {err}"));
                    tokio::select! {
                        biased;
                        _ = cancel.as_mut() => return None,
                        _ = tokio::time::sleep(wait) => break,
                    }
                }
            }
        }
    }
}

/// Keeps the session (and so the lock) alive, probing it; says when it is
/// lost.
fn hold(client: tokio_postgres::Client, pipeline: &str, source: String) -> Lease {
    let (lost_tx, lost) = watch::channel(false);
    let (now, mut asked) = tokio::sync::mpsc::channel::<tokio::sync::oneshot::Sender<bool>>(1);
    let pipeline = pipeline.to_owned();
    let probe = tokio::spawn(async move {
        loop {
            let answer = tokio::select! {
                _ = tokio::time::sleep(PROBE_EVERY) => None,
                Some(answer) = asked.recv() => Some(answer),
            };
            // A session lock lasts as long as its session: the session
            // answering is the lock held.
            let alive = !client.is_closed()
                && matches!(
                    tokio::time::timeout(PROBE_TIMEOUT, client.simple_query("SELECT 1")).await,
                    Ok(Ok(_))
                );
            if let Some(answer) = answer {
                let _ = answer.send(alive);
            }
            if !alive {
                tracing::warn!(pipeline = %pipeline, "lost the leader lock's connection: stopping to stand by");
                let _ = lost_tx.send(true);
                // Keep the client until the lease is dropped.
                while let Some(answer) = asked.recv().await {
                    let _ = answer.send(false);
                }
                std::future::pending::<()>().await;
            }
        }
    });
    Lease {
        lost,
        probe,
        now,
        source,
    }
}
