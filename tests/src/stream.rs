//! Running a replication source inside a test and reading what it emits.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use datum::{Batch, Change, Feedback, Lsn, Offset, SourceConfig, SourceError, SourceStats};
use datum_guest::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Cluster;

/// A source streaming in a background task.
#[allow(missing_debug_implementations)]
pub struct Running {
    /// Batches as the source emits them.
    pub rx: datum::Receiver<Batch>,
    /// The feedback coordinator the source registers batches with.
    pub feedback: Arc<Feedback>,
    /// The source's counters.
    pub stats: Arc<SourceStats>,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), SourceError>>>,
}

/// A source configuration for `slot` and `publication` on the cluster's
/// `postgres` database, over TCP.
pub fn config(pg: &Cluster, publication: &str, slot: &str, tables: &[&str]) -> SourceConfig {
    let conninfo = pg
        .conninfo("postgres")
        .parse()
        .expect("the harness's conninfo parses");
    let mut config = SourceConfig::new(conninfo, publication, slot);
    config.tables = tables.iter().map(|t| t.to_string()).collect();
    config
}

impl Running {
    /// Prepares the publication and slot, then starts streaming after
    /// `resume_after`, with a downstream channel of `capacity` batches.
    pub async fn start(config: SourceConfig, resume_after: Lsn, capacity: usize) -> Running {
        datum::prepare_source(
            &config,
            (resume_after != Lsn::ZERO).then_some(resume_after),
            || Ok(()),
        )
        .await
        .unwrap_or_else(|err| panic!("preparing the source: {err}"));
        Running::start_prepared(config, resume_after, capacity)
    }

    /// Starts streaming without preparing.
    pub fn start_prepared(config: SourceConfig, resume_after: Lsn, capacity: usize) -> Running {
        let (tx, rx) = datum::channel(capacity, usize::MAX);
        let feedback = Feedback::new(Offset {
            end_lsn: resume_after,
            ..Offset::default()
        });
        let (stop, stop_rx) = oneshot::channel::<()>();
        let stats = Arc::new(SourceStats::default());
        let handle = tokio::spawn(datum::run_source(
            config,
            resume_after,
            tx,
            feedback.clone(),
            stats.clone(),
            async move {
                let _ = stop_rx.await;
            },
            std::future::ready(()),
        ));
        Running {
            rx,
            feedback,
            stats,
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Acknowledges a batch and declares everything acknowledged durably
    /// checkpointed, as a sink and the commit loop would.
    pub fn checkpoint(&self, batch: &Batch) {
        self.feedback.ack(&batch.txn);
        self.feedback.persisted(self.feedback.watermark().end_lsn);
    }

    /// The next batch, or a panic after `secs` seconds.
    pub async fn next(&mut self, secs: u64) -> Batch {
        match tokio::time::timeout(Duration::from_secs(secs), self.rx.recv()).await {
            Ok(Some(batch)) => batch,
            Ok(None) => {
                let result = self.handle.take().expect("running").await;
                panic!("the source stopped: {result:?}")
            }
            Err(_) => panic!("no batch within {secs}s"),
        }
    }

    /// Batches until one with `last` for which `done` holds.
    pub async fn until(&mut self, secs: u64, mut done: impl FnMut(&Batch) -> bool) -> Vec<Batch> {
        let mut batches = Vec::new();
        loop {
            let batch = self.next(secs).await;
            let stop = batch.txn.last && done(&batch);
            batches.push(batch);
            if stop {
                return batches;
            }
        }
    }

    /// Stops the source and returns how it ended.
    pub async fn stop(mut self) -> Result<(), SourceError> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        self.handle
            .take()
            .expect("running")
            .await
            .expect("the source task panicked")
    }

    /// Waits for the source to end by itself (a definite error).
    pub async fn ended(mut self, secs: u64) -> Result<(), SourceError> {
        tokio::time::timeout(
            Duration::from_secs(secs),
            self.handle.take().expect("running"),
        )
        .await
        .expect("the source keeps running")
        .expect("the source task panicked")
    }
}

/// One line per change, compact and stable, for assertions.
pub fn render(batch: &Batch) -> Vec<String> {
    batch.changes.iter().map(render_change).collect()
}

/// A change as one line: `I public.t id=1 name='x'`.
pub fn render_change(change: &Change) -> String {
    let mut out = String::new();
    match change {
        Change::Insert { relation, new } => {
            write!(out, "I {}.{}", relation.schema, relation.table).ok();
            row(
                &mut out,
                relation.columns.iter().map(|c| c.name.as_str()),
                new,
            );
        }
        Change::Snapshot { relation, new } => {
            write!(out, "S {}.{}", relation.schema, relation.table).ok();
            row(
                &mut out,
                relation.columns.iter().map(|c| c.name.as_str()),
                new,
            );
        }
        Change::Update { relation, old, new } => {
            write!(out, "U {}.{}", relation.schema, relation.table).ok();
            if let Some(old) = old {
                out.push_str(if old.key_only { " key:" } else { " old:" });
                let names = relation.columns.iter().filter(|c| !old.key_only || c.key);
                let values: Vec<Value> = relation
                    .columns
                    .iter()
                    .zip(&old.values)
                    .filter(|(c, _)| !old.key_only || c.key)
                    .map(|(_, v)| v.clone())
                    .collect();
                row(&mut out, names.map(|c| c.name.as_str()), &values);
                out.push_str(" new:");
            }
            row(
                &mut out,
                relation.columns.iter().map(|c| c.name.as_str()),
                new,
            );
        }
        Change::Delete { relation, old } => {
            write!(out, "D {}.{}", relation.schema, relation.table).ok();
            out.push_str(if old.key_only { " key:" } else { " old:" });
            let values: Vec<Value> = relation
                .columns
                .iter()
                .zip(&old.values)
                .filter(|(c, _)| !old.key_only || c.key)
                .map(|(_, v)| v.clone())
                .collect();
            let names = relation.columns.iter().filter(|c| !old.key_only || c.key);
            row(&mut out, names.map(|c| c.name.as_str()), &values);
        }
        Change::Truncate {
            relations,
            cascade,
            restart_identity,
        } => {
            let names: Vec<String> = relations
                .iter()
                .map(|r| format!("{}.{}", r.schema, r.table))
                .collect();
            write!(
                out,
                "T {} cascade={cascade} restart_identity={restart_identity}",
                names.join(",")
            )
            .ok();
        }
        Change::Schema {
            relation, before, ..
        } => {
            let columns = |r: &datum::Relation| {
                r.columns
                    .iter()
                    .map(|c| format!("{}:{}", c.name, c.sql_type()))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            write!(
                out,
                "A {}.{} {} -> {}",
                relation.schema,
                relation.table,
                columns(before),
                columns(relation)
            )
            .ok();
        }
        Change::Message {
            transactional,
            prefix,
            content,
            ..
        } => {
            write!(
                out,
                "M {prefix} transactional={transactional} {:?}",
                String::from_utf8_lossy(content)
            )
            .ok();
        }
    }
    out
}

fn row<'a>(out: &mut String, names: impl Iterator<Item = &'a str>, values: &[Value]) {
    for (name, value) in names.zip(values) {
        write!(out, " {name}={}", render_value(value)).ok();
    }
}

/// A value in a compact form: `'text'`, `42`, `null`, `unchanged`, ...
pub fn render_value(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Unchanged => "unchanged".into(),
        Value::Bool(b) => b.to_string(),
        Value::Int(i) => i.to_string(),
        Value::Float(f) => format!("{f:?}"),
        Value::Text(t) => format!("'{t}'"),
        other => format!("{other:?}"),
    }
}
