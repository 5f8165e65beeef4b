//! `/metrics`: every pipeline's figures in the Prometheus text format
//! (version 0.0.4), written by hand — a few dozen lines are less than a
//! dependency. docs/admin.md lists the metrics.

use crate::checkpoint::TableState;
use crate::daemon::snapshot;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use crate::checkpoint::Store;
use crate::daemon::pipeline::TRANSFORM_BUCKETS;
use crate::daemon::{PipelineControl, PipelineState};

/// A label value, escaped as the format wants.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

struct Family<'a> {
    out: &'a mut String,
}

impl Family<'_> {
    fn header(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.out.push_str(name);
        if !labels.is_empty() {
            self.out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.out.push(',');
                }
                let _ = write!(self.out, "{k}=\"{}\"", label(v));
            }
            self.out.push('}');
        }
        let _ = writeln!(self.out, " {value}");
    }
}

/// The metrics page.
pub(crate) fn render(pipelines: &[Arc<PipelineControl>], store: &Store) -> String {
    let mut out = String::new();
    let mut f = Family { out: &mut out };

    type Getter = fn(&PipelineControl, &Store) -> f64;
    let gauges: [(&str, &str, Getter); 7] = [
        (
            "datum_received_lsn",
            "Furthest WAL position read.",
            |p, _| p.source_stats.received_lsn.load(Relaxed) as f64,
        ),
        (
            "datum_checkpointed_lsn",
            "Position in the state file.",
            |p, s| checkpointed(p, s) as f64,
        ),
        (
            "datum_confirmed_lsn",
            "Flush position last reported to PostgreSQL.",
            |p, _| p.source_stats.confirmed_lsn.load(Relaxed) as f64,
        ),
        (
            "datum_lag_bytes",
            "The server's WAL position minus the checkpointed one, bytes (paused or not).",
            |p, s| {
                p.source_stats
                    .server_lsn
                    .load(Relaxed)
                    .max(p.source_stats.received_lsn.load(Relaxed))
                    .saturating_sub(checkpointed(p, s)) as f64
            },
        ),
        (
            "datum_lag_seconds",
            "Commit time of the newest transaction received minus that of the checkpointed one.",
            |p, s| super::commit_lag(p, s, crate::event::Lsn(checkpointed(p, s))),
        ),
        (
            "datum_waiting_seconds",
            "How long received changes have been waiting for the checkpoint.",
            |p, _| p.rates().2,
        ),
        (
            "datum_slot_retained_bytes",
            "WAL the pipeline's slot holds back on the server, bytes (as last polled).",
            |p, _| p.source_stats.slot_retained_bytes.load(Relaxed) as f64,
        ),
    ];
    for (name, help, get) in gauges {
        f.header(name, "gauge", help);
        for p in pipelines {
            f.sample(name, &[("pipeline", &p.name)], get(p, store));
        }
    }

    f.header(
        "datum_source_mode",
        "gauge",
        "1 for how the source reads the slot now: streaming, or catch_up (through SQL).",
    );
    for p in pipelines {
        let catching_up = p.source_stats.catching_up.load(Relaxed);
        for (mode, on) in [("streaming", !catching_up), ("catch_up", catching_up)] {
            f.sample(
                "datum_source_mode",
                &[("pipeline", &p.name), ("mode", mode)],
                if on { 1.0 } else { 0.0 },
            );
        }
    }

    f.header(
        "datum_up",
        "gauge",
        "1 while the pipeline streams, with its state.",
    );
    for p in pipelines {
        let state = p.state();
        f.sample(
            "datum_up",
            &[("pipeline", &p.name), ("state", state.as_str())],
            if state == PipelineState::Running {
                1.0
            } else {
                0.0
            },
        );
    }

    let snapshots: Vec<(&str, Vec<snapshot::TableRows>)> = pipelines
        .iter()
        .map(|p| {
            let live = p.handles().map(|h| h.snapshots);
            (
                p.name.as_str(),
                snapshot::tables(&p.name, live.as_deref(), store),
            )
        })
        .collect();
    f.header(
        "datum_snapshot_rows",
        "gauge",
        "Rows of a table copied by its snapshot or backfill.",
    );
    for (pipeline, tables) in &snapshots {
        for t in tables {
            f.sample(
                "datum_snapshot_rows",
                &[("pipeline", pipeline), ("table", &t.table)],
                t.rows as f64,
            );
        }
    }
    f.header(
        "datum_snapshot_tables",
        "gauge",
        "Tables by snapshot state (pending, copying, done, failed).",
    );
    for (pipeline, tables) in &snapshots {
        for state in [
            TableState::Pending,
            TableState::Copying,
            TableState::Done,
            TableState::Failed,
        ] {
            let n = tables.iter().filter(|t| t.state == state).count();
            f.sample(
                "datum_snapshot_tables",
                &[("pipeline", pipeline), ("state", state.name())],
                n as f64,
            );
        }
    }

    f.header(
        "datum_canary_batches",
        "gauge",
        "Batches of the pipeline's last canary by result (equal, different, failed, not_compared).",
    );
    for p in pipelines {
        if let Some(canary) = p.canary.batches() {
            let (module, version) = (canary.module, canary.version.to_string());
            for (result, n) in canary.results {
                f.sample(
                    "datum_canary_batches",
                    &[
                        ("pipeline", &p.name),
                        ("module", &module),
                        ("version", &version),
                        ("result", result),
                    ],
                    n as f64,
                );
            }
        }
    }

    f.header(
        "datum_checkpoint_commits_total",
        "counter",
        "Durable commits of the state file's offsets (all pipelines).",
    );
    f.sample(
        "datum_checkpoint_commits_total",
        &[],
        store.commits() as f64,
    );

    let health = store.health();
    f.header(
        "datum_state_file_io_errors_total",
        "counter",
        "Reads and writes of the state file that failed with an I/O error (a full disk).",
    );
    f.sample(
        "datum_state_file_io_errors_total",
        &[],
        health.io_errors as f64,
    );
    f.header(
        "datum_state_file_reopens_total",
        "counter",
        "Times the state file was reopened after an I/O error.",
    );
    f.sample("datum_state_file_reopens_total", &[], health.reopens as f64);
    f.header(
        "datum_state_file_failing",
        "gauge",
        "1 while the last use of the state file failed.",
    );
    f.sample(
        "datum_state_file_failing",
        &[],
        if health.failing { 1.0 } else { 0.0 },
    );

    type Counter = fn(&PipelineControl) -> u64;
    let counters: [(&str, &str, Counter); 13] = [
        ("datum_batches_in_total", "Batches from the source.", |p| {
            p.source_stats.batches.load(Relaxed)
        }),
        ("datum_changes_in_total", "Changes from the source.", |p| {
            p.source_stats.changes.load(Relaxed)
        }),
        (
            "datum_bytes_in_total",
            "pgoutput bytes from the source.",
            |p| p.source_stats.bytes.load(Relaxed),
        ),
        (
            "datum_batches_out_total",
            "Batches the sink acknowledged.",
            |p| p.stats.batches_written.load(Relaxed),
        ),
        (
            "datum_changes_out_total",
            "Changes the sink acknowledged.",
            |p| p.stats.changes_written.load(Relaxed),
        ),
        (
            "datum_bytes_out_total",
            "Bytes the sink wrote (stdout, file and http sinks).",
            |p| p.stats.bytes_written.load(Relaxed),
        ),
        ("datum_sink_retries_total", "Sink writes retried.", |p| {
            p.stats.sink_retries.load(Relaxed)
        }),
        (
            "datum_dead_letters_total",
            "Batches stored as dead letters.",
            |p| p.stats.dead_letters.load(Relaxed),
        ),
        (
            "datum_schema_changes_total",
            "Schema changes put in the stream: a table's shape changed.",
            |p| p.stats.schema_changes.load(Relaxed),
        ),
        (
            "datum_skipped_total",
            "Batches skipped under on_error = skip.",
            |p| p.stats.skipped.load(Relaxed),
        ),
        (
            "datum_reconnects_total",
            "Source sessions retried after a transient error.",
            |p| p.source_stats.reconnects.load(Relaxed),
        ),
        (
            "datum_catch_ups_total",
            "Times the source began to drain a slot far behind through SQL.",
            |p| p.source_stats.catch_ups.load(Relaxed),
        ),
        (
            "datum_catch_up_changes_total",
            "Changes read through SQL while catching up.",
            |p| p.source_stats.catch_up_changes.load(Relaxed),
        ),
    ];
    for (name, help, get) in counters {
        f.header(name, "counter", help);
        for p in pipelines {
            f.sample(name, &[("pipeline", &p.name)], get(p) as f64);
        }
    }

    f.header(
        "datum_module_failures_total",
        "counter",
        "Batches a module failed on, by kind.",
    );
    for p in pipelines {
        let kinds = p
            .stats
            .failures_by_kind
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        for (kind, n) in kinds {
            f.sample(
                "datum_module_failures_total",
                &[("pipeline", &p.name), ("kind", kind)],
                n as f64,
            );
        }
    }

    f.header(
        "datum_transform_seconds",
        "histogram",
        "Time in the modules per batch.",
    );
    for p in pipelines {
        let mut cumulative = 0u64;
        for (i, bound) in TRANSFORM_BUCKETS.iter().enumerate() {
            cumulative += p.stats.transform_hist[i].load(Relaxed);
            let le = format!("{}", *bound as f64 / 1e6);
            f.sample(
                "datum_transform_seconds_bucket",
                &[("pipeline", &p.name), ("le", &le)],
                cumulative as f64,
            );
        }
        cumulative += p.stats.transform_hist[TRANSFORM_BUCKETS.len()].load(Relaxed);
        f.sample(
            "datum_transform_seconds_bucket",
            &[("pipeline", &p.name), ("le", "+Inf")],
            cumulative as f64,
        );
        f.sample(
            "datum_transform_seconds_sum",
            &[("pipeline", &p.name)],
            p.stats.transform_micros.load(Relaxed) as f64 / 1e6,
        );
        f.sample(
            "datum_transform_seconds_count",
            &[("pipeline", &p.name)],
            cumulative as f64,
        );
    }

    f.header(
        "datum_module_version",
        "gauge",
        "The active version of each transform.",
    );
    for p in pipelines {
        for slot in p.chain.info() {
            f.sample(
                "datum_module_version",
                &[
                    ("pipeline", &p.name),
                    ("module", &slot.name),
                    ("sha256", &slot.sha256),
                ],
                slot.version as f64,
            );
        }
    }
    out
}

fn checkpointed(p: &PipelineControl, store: &Store) -> u64 {
    match p.handles() {
        Some(h) => h.feedback.flushed().0,
        None => store
            .offset(&p.name)
            .ok()
            .flatten()
            .map_or(0, |o| o.end_lsn.0),
    }
}
