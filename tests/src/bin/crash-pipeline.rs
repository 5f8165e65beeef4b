//! A pipeline process for crash tests: streams `pub`/`slot` (table `t`) into
//! a log file, one line per batch, fsynced before the batch is acknowledged,
//! then checkpoints in `STATE`. The tests kill it with SIGKILL at random
//! moments and compare the log with the source.
//!
//! `crash-pipeline CONNINFO STATE LOG ACK_DELAY_MS [CATCH_UP_WINDOW]`
//!
//! With `CATCH_UP_WINDOW`, the slot is drained through SQL while it is
//! behind at all (`source.catch_up` of 0 bytes), in peeks of that many rows.
//!
//! Line format: `COMMIT_LSN END_LSN CHUNK LAST id,id,...`.

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use datum::{Change, PipelineConfig, Sink, SinkError, SourceConfig, Store, Transformed};
use datum_guest::Value;

struct LogSink {
    file: std::fs::File,
    delay: Duration,
}

impl Sink for LogSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        let batch = &batch.source;
        let ids: Vec<String> = batch
            .changes
            .iter()
            .filter_map(|c| match c {
                Change::Insert { new, .. } => match new.first() {
                    Some(Value::Int(id)) => Some(id.to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        let line = format!(
            "{} {} {} {} {}\n",
            batch.txn.commit_lsn,
            batch.txn.end_lsn,
            batch.txn.chunk,
            batch.txn.last,
            ids.join(",")
        );
        self.file
            .write_all(line.as_bytes())
            .and_then(|()| self.file.sync_data())
            .map_err(|e| SinkError::transient(e.to_string()))?;
        tokio::time::sleep(self.delay).await;
        Ok(())
    }
}

#[tokio::main]
async fn main() {
    // Installed first, not when the pipeline first polls it: a SIGINT during
    // start-up must stop the pipeline cleanly too. "ready" tells the test.
    let mut sigint = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .expect("SIGINT handler");
    // Log lines on stderr: the tests look for the catch-up's.
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(tracing_subscriber::EnvFilter::new("datum=info"))
        .init();
    println!("ready");
    let args: Vec<String> = std::env::args().collect();
    let (conninfo, state, log, delay, window) = match &args[..] {
        [_, conninfo, state, log, delay] => (conninfo, state, log, delay, None),
        [_, conninfo, state, log, delay, window] => (conninfo, state, log, delay, Some(window)),
        _ => {
            eprintln!("usage: crash-pipeline CONNINFO STATE LOG ACK_DELAY_MS [CATCH_UP_WINDOW]");
            std::process::exit(2);
        }
    };
    let mut source = SourceConfig::new(conninfo.parse().expect("conninfo"), "pub", "slot");
    source.tables = vec!["t".into()];
    source.limits.max_rows = 3;
    source.reconnect_initial = Duration::from_millis(50);
    // The previous incarnation's walsender may linger briefly.
    source.terminate_stale_holder = true;
    source.catch_up = window.map(|w| datum::CatchUp {
        threshold: 0,
        window: w.parse().expect("catch-up window"),
        ..datum::CatchUp::beyond(0)
    });
    let store = Arc::new(Store::open(state).expect("state file"));
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    let sink = LogSink {
        file,
        delay: Duration::from_millis(delay.parse().expect("delay")),
    };
    let mut config = PipelineConfig::new("p", source);
    // The test prepares the slot before the first incarnation's state file
    // exists.
    config.adopt_slot = true;
    let result = datum::run_pipeline(config, store, sink, None, async move {
        sigint.recv().await;
    })
    .await;
    if let Err(err) = result {
        eprintln!("crash-pipeline: {err}");
        std::process::exit(1);
    }
}
