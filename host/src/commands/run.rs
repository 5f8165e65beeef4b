//! `datum run`: every pipeline of a configuration file, in one host, and the
//! admin API beside them when the configuration asks for it.

use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;

use crate::checkpoint::Store;
use crate::config::Config;
use crate::daemon::{self, Report, StartError};

use super::{CommandError, Outcome, block_on, signalled};

/// `datum run CONFIG`: until SIGINT or SIGTERM, or until every pipeline
/// has stopped; failed when a pipeline did.
pub(crate) fn command(path: &std::path::Path) -> Result<Outcome, CommandError> {
    let config = Config::load(path)?;
    match raise_open_file_limit() {
        Ok((soft, hard)) if soft < hard => {
            tracing::info!(from = soft, to = hard, "open file limit raised")
        }
        Ok(_) => {}
        Err(err) => tracing::warn!(error = %err, "open file limit unchanged"),
    }
    let report = block_on(async { run(&config, signalled()).await })??;
    Ok(Outcome::from_ok(report.ok()))
}

/// Raises the soft limit of open files to the hard limit, as a server
/// should: every admin API connection, replication connection and open file
/// takes a descriptor, and the soft limit a process inherits is often 1,024
/// (the admin API's own cap, `max_connections`, is then what refuses
/// clients, not the descriptor table). The limits before: (soft, hard).
pub(crate) fn raise_open_file_limit() -> Result<(u64, u64), String> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)
        .map_err(|e| format!("reading the open file limit: {e}"))?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)
            .map_err(|e| format!("raising the open file limit from {soft} to {hard}: {e}"))?;
    }
    Ok((soft, hard))
}

/// Runs every pipeline until `shutdown` completes (then each drains and
/// checkpoints) or each has stopped on its own; serves the admin API when
/// the configuration has an `[admin]` table.
pub(crate) async fn run(
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Report, CommandError> {
    let engine = daemon::engine(config)?;
    let store = Arc::new(Store::open(&config.state.0).map_err(StartError::from)?);
    let prepared = daemon::prepare_with(config, &engine, Some(&store)).await?;
    // Compiling modules leaves megabytes of freed memory in the allocator's
    // arenas: give it back before the host settles into streaming.
    crate::transform::engine::release_freed_memory();
    let (stop_tx, stop_rx) = watch::channel(false);
    let pipelines = daemon::Supervisors::start(prepared, &store, &stop_rx);
    let admin = match &config.admin {
        Some(spec) => Some(
            crate::admin::serve(
                spec,
                &config.state.0,
                crate::admin::Host {
                    pipelines: pipelines.controls(),
                    store: store.clone(),
                    engine: engine.clone(),
                },
                stop_rx.clone(),
            )
            .await?,
        ),
        None => None,
    };
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    // Table copies as progress bars for a person at a terminal; the log
    // says the same every 10 seconds otherwise.
    let progress = std::io::IsTerminal::is_terminal(&std::io::stderr())
        .then(|| tokio::spawn(crate::daemon::snapshot::draw_progress(pipelines.controls())));
    let report = pipelines.wait().await;
    if let Some(progress) = progress {
        progress.abort();
    }
    signal.abort();
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(report)
}
