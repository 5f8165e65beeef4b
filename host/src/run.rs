//! `datum run`: every pipeline of a configuration file, in one host.
//!
//! Owns turning the configuration into running pipelines — modules compiled
//! once on one engine and resolved against the module registry, one state
//! file, one sink each — and their lifetimes: pipelines run independently
//! (one failing stops only itself), each under a supervisor that pauses and
//! resumes it on request ([`PipelineControl`], what the admin API drives),
//! shutdown reaches all of them, and the host ends when the last one has.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, watch};
use tracing::Instrument;

use crate::checkpoint::Store;
use crate::config::{Config, PipelineSpec, SinkSpec, StdoutFormat};
use crate::hotswap::{ActiveChain, Configured};
use crate::pipeline::{self, Handles, PipelineConfig, PipelineError, PipelineStats};
use crate::sink::file::FileSink;
use crate::sink::http::HttpSink;
use crate::sink::postgres::PostgresSink;
use crate::sink::stdout::StdoutSink;
use crate::sink::{Sink, SinkError};
use crate::source::stream::SourceStats;
use crate::source::{ConnInfo, Lsn, SourceConfig};
use crate::transform::engine::EngineOptions;
use crate::transform::{Engine, Module, Transformed, encode_config};

/// Why the host could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// A pipeline's settings cannot be used.
    #[error("pipeline `{pipeline}`: {message}")]
    Pipeline {
        /// The pipeline.
        pipeline: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// The state file.
    #[error(transparent)]
    State(#[from] crate::checkpoint::CheckpointError),
    /// The engine.
    #[error(transparent)]
    Engine(#[from] crate::transform::TransformError),
    /// The admin API.
    #[error("admin API: {0}")]
    Admin(String),
}

/// Every sink the configuration can name.
#[derive(Debug)]
pub enum AnySink {
    /// `stdout`.
    Stdout(StdoutSink),
    /// `file`.
    File(FileSink),
    /// `http`.
    Http(Box<HttpSink>),
    /// `postgres`.
    Postgres(Box<PostgresSink>),
}

impl Sink for AnySink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        match self {
            AnySink::Stdout(sink) => sink.write(batch).await,
            AnySink::File(sink) => sink.write(batch).await,
            AnySink::Http(sink) => sink.write(batch).await,
            AnySink::Postgres(sink) => sink.write(batch).await,
        }
    }

    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        match self {
            AnySink::Stdout(sink) => sink.write_group(batches).await,
            AnySink::File(sink) => sink.write_group(batches).await,
            AnySink::Http(sink) => sink.write_group(batches).await,
            AnySink::Postgres(sink) => sink.write_group(batches).await,
        }
    }

    fn bytes_written(&self) -> u64 {
        match self {
            AnySink::Stdout(sink) => sink.bytes_written(),
            AnySink::File(sink) => sink.bytes_written(),
            AnySink::Http(sink) => sink.bytes_written(),
            AnySink::Postgres(sink) => sink.bytes_written(),
        }
    }
}

/// A pipeline ready to run.
#[derive(Debug)]
pub struct Prepared {
    /// Its settings.
    pub config: PipelineConfig,
    /// Its sink.
    pub sink: AnySink,
}

/// The engine every module of `config` runs on.
pub fn engine(config: &Config) -> Result<Engine, StartError> {
    let fuel = config
        .pipeline
        .iter()
        .flat_map(|p| &p.transforms)
        .any(|t| t.limits.fuel.is_some());
    Ok(Engine::new(EngineOptions {
        fuel,
        ..EngineOptions::default()
    })?)
}

/// Compiles the modules and opens the sinks of every pipeline (a
/// `postgres` sink connects to its target); the sources connect when the
/// pipelines start. With a state file, each pipeline's modules are
/// resolved against its module registry (`crate::hotswap`); without, they
/// are the configuration's, outside the registry.
pub async fn prepare(config: &Config) -> Result<Vec<Prepared>, StartError> {
    prepare_with(config, &engine(config)?, None).await
}

async fn prepare_with(
    config: &Config,
    engine: &Engine,
    store: Option<&Store>,
) -> Result<Vec<Prepared>, StartError> {
    let mut prepared = Vec::new();
    for spec in &config.pipeline {
        prepared.push(prepare_pipeline(spec, engine, store).await?);
    }
    Ok(prepared)
}

async fn prepare_pipeline(
    spec: &PipelineSpec,
    engine: &Engine,
    store: Option<&Store>,
) -> Result<Prepared, StartError> {
    let name = spec.name.0.clone();
    let fail = |message: String| StartError::Pipeline {
        pipeline: name.clone(),
        message,
    };
    let conninfo: ConnInfo = spec
        .source
        .url
        .0
        .parse()
        .map_err(|e| fail(format!("source.url: {e}")))?;
    let mut source = SourceConfig::new(conninfo, &spec.publication(), &spec.slot());
    source.tables = spec.source.tables.iter().map(|t| t.0.clone()).collect();
    source.publish_via_partition_root = spec.source.publish_via_partition_root;
    source.terminate_stale_holder = spec.source.terminate_stale_holder;
    source.recreate_slot = spec.source.recreate_slot;
    source.limits = spec.batch.limits();

    let mut modules = Vec::new();
    let mut configured = Vec::new();
    for (i, t) in spec.transforms.iter().enumerate() {
        let path = Path::new(&t.module.0);
        let module_name = t.name();
        let limits = t.limits.limits();
        let wasm = std::fs::read(path)
            .map_err(|e| fail(format!("transforms[{i}]: {}: {e}", path.display())))?;
        crate::transform::check_binary(&wasm)
            .map_err(|e| fail(format!("transforms[{i}] ({}): {e}", path.display())))?;
        if store.is_some() {
            configured.push(Configured {
                name: module_name,
                wasm,
                config: toml::to_string(&t.config).unwrap_or_default(),
                limits,
            });
            continue;
        }
        let module = Module::new(
            engine,
            &module_name,
            &wasm,
            limits,
            encode_config(&t.config),
        )
        .map_err(|e| fail(format!("transforms[{i}] ({}): {e}", path.display())))?;
        modules.push(module);
    }
    let chain = match store {
        Some(store) => {
            let checkpoint = store.offset(&name)?.map(|o| o.end_lsn).unwrap_or_default();
            let slots = crate::hotswap::resolve(engine, store, &name, &configured, checkpoint)
                .map_err(|e| fail(format!("transforms: {e}")))?;
            modules = slots.iter().map(|s| s.module.clone()).collect();
            Some(ActiveChain::new(slots, checkpoint))
        }
        None => None,
    };

    let sink = match &spec.sink {
        SinkSpec::Stdout {
            format: StdoutFormat::Json,
            ..
        } => AnySink::Stdout(StdoutSink::new()),
        SinkSpec::Stdout {
            format: StdoutFormat::Pretty,
            color,
        } => AnySink::Stdout(StdoutSink::pretty(*color)),
        SinkSpec::File { path, rotate_at } => AnySink::File(
            FileSink::open(Path::new(&path.0), rotate_at.map(|s| s.0 as u64))
                .map_err(|e| fail(format!("sink: {e}")))?,
        ),
        SinkSpec::Http {
            url,
            headers,
            timeout,
            ..
        } => AnySink::Http(
            HttpSink::new(
                &url.0,
                headers
                    .iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
                timeout.0,
            )
            .and_then(|sink| sink.with_key_prefix(&name))
            .map(Box::new)
            .map_err(|e| fail(format!("sink: {e}")))?,
        ),
        SinkSpec::Postgres {
            url,
            schema,
            tables,
        } => AnySink::Postgres(Box::new(
            PostgresSink::connect(
                &url.0,
                schema.as_ref().map(|s| s.0.clone()),
                tables
                    .iter()
                    .map(|(k, v)| (k.clone(), v.0.clone()))
                    .collect(),
            )
            .await
            .map_err(|e| fail(format!("sink: {e}")))?,
        )),
    };

    let mut config = PipelineConfig::new(&name, source);
    config.modules = modules;
    config.chain = chain;
    config.on_error = spec.on_error;
    config.channel_capacity = spec.in_flight.0;
    config.commit.group_delay = spec.group_commit.0;
    config.drain_timeout = spec.drain_timeout.0;
    config.adopt_slot = spec.source.adopt_slot;
    if let SinkSpec::Http {
        retry_initial,
        retry_max,
        ..
    } = &spec.sink
    {
        config.sink_retry_initial = retry_initial.0;
        config.sink_retry_max = retry_max.0;
    }
    Ok(Prepared { config, sink })
}

/// How each pipeline ended.
#[derive(Debug, Default)]
pub struct Report {
    /// `(pipeline, outcome)`, in configuration order.
    pub pipelines: Vec<(String, Result<(), PipelineError>)>,
}

impl Report {
    /// Whether every pipeline stopped cleanly.
    pub fn ok(&self) -> bool {
        self.pipelines.iter().all(|(_, r)| r.is_ok())
    }
}

/// Where a pipeline is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PipelineState {
    /// Connecting, preparing the slot.
    Starting,
    /// Streaming.
    Running,
    /// Paused on request: drained, checkpointed, disconnected.
    Paused,
    /// Stopped by an error (see the last error).
    Failed,
    /// Stopped by shutdown.
    Stopped,
}

impl PipelineState {
    /// The name the API and metrics use.
    pub fn as_str(self) -> &'static str {
        match self {
            PipelineState::Starting => "starting",
            PipelineState::Running => "running",
            PipelineState::Paused => "paused",
            PipelineState::Failed => "failed",
            PipelineState::Stopped => "stopped",
        }
    }
}

/// Rates over the last sampling interval, and since when nothing waited.
#[derive(Debug, Clone, Copy)]
struct Sample {
    at: Instant,
    batches: u64,
    changes: u64,
    batches_per_second: f64,
    changes_per_second: f64,
    caught_up_at: Instant,
}

/// A running pipeline, as the admin API sees and drives it.
#[derive(Debug)]
pub struct PipelineControl {
    /// The pipeline's name.
    pub name: String,
    /// The modules in force.
    pub chain: Arc<ActiveChain>,
    /// The source's counters, across pauses.
    pub source_stats: Arc<SourceStats>,
    /// The pipeline's counters, across pauses.
    pub stats: Arc<PipelineStats>,
    state: watch::Sender<PipelineState>,
    pause: watch::Sender<bool>,
    handles: Mutex<Option<Handles>>,
    sample: Mutex<Sample>,
}

impl PipelineControl {
    fn new(config: &PipelineConfig) -> Arc<PipelineControl> {
        let now = Instant::now();
        let chain = config
            .chain
            .clone()
            .unwrap_or_else(|| ActiveChain::new(Vec::new(), Lsn::ZERO));
        Arc::new(PipelineControl {
            name: config.name.clone(),
            chain,
            source_stats: config.source_stats.clone(),
            stats: config.stats.clone(),
            state: watch::channel(PipelineState::Starting).0,
            pause: watch::channel(false).0,
            handles: Mutex::new(None),
            sample: Mutex::new(Sample {
                at: now,
                batches: 0,
                changes: 0,
                batches_per_second: 0.0,
                changes_per_second: 0.0,
                caught_up_at: now,
            }),
        })
    }

    /// The state now.
    pub fn state(&self) -> PipelineState {
        *self.state.borrow()
    }

    /// The current run's handles (None while paused or stopped).
    pub fn handles(&self) -> Option<Handles> {
        self.handles
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Asks the pipeline to pause; returns once it has (or has ended).
    pub async fn pause(&self) -> PipelineState {
        self.pause.send_replace(true);
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| {
                matches!(
                    s,
                    PipelineState::Paused | PipelineState::Failed | PipelineState::Stopped
                )
            })
            .await;
        self.state()
    }

    /// Asks a paused pipeline to resume; returns once it streams again (or
    /// has ended). `Err` with the state if it cannot resume.
    pub async fn resume(&self) -> Result<PipelineState, PipelineState> {
        let now = self.state();
        if matches!(now, PipelineState::Failed | PipelineState::Stopped) {
            return Err(now);
        }
        self.pause.send_replace(false);
        let mut state = self.state.subscribe();
        let _ = state
            .wait_for(|s| {
                matches!(
                    s,
                    PipelineState::Running | PipelineState::Failed | PipelineState::Stopped
                )
            })
            .await;
        Ok(self.state())
    }

    /// Rates (batches/s, changes/s) and seconds changes have waited.
    pub fn rates(&self) -> (f64, f64, f64) {
        let sample = *self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let waiting = match self.handles() {
            Some(h) if !h.feedback.idle() => sample.caught_up_at.elapsed().as_secs_f64(),
            _ => 0.0,
        };
        (
            sample.batches_per_second,
            sample.changes_per_second,
            waiting,
        )
    }

    /// Samples the counters (called every second).
    fn tick(&self) {
        let now = Instant::now();
        let batches = self.stats.batches_written.load(Ordering::Relaxed);
        let changes = self.stats.changes_written.load(Ordering::Relaxed);
        let idle = self.handles().is_none_or(|h| h.feedback.idle());
        let mut sample = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let secs = now.duration_since(sample.at).as_secs_f64().max(1e-3);
        sample.batches_per_second = batches.saturating_sub(sample.batches) as f64 / secs;
        sample.changes_per_second = changes.saturating_sub(sample.changes) as f64 / secs;
        sample.batches = batches;
        sample.changes = changes;
        sample.at = now;
        if idle {
            sample.caught_up_at = now;
        }
    }

    fn set_state(&self, state: PipelineState) {
        self.state.send_replace(state);
    }
}

/// Runs one pipeline until `stop`, pausing and resuming it on request.
async fn supervise(
    control: Arc<PipelineControl>,
    config: PipelineConfig,
    store: Arc<Store>,
    mut sink: AnySink,
    mut stop: watch::Receiver<bool>,
) -> Result<(), PipelineError> {
    let mut pause = control.pause.subscribe();
    loop {
        if *pause.borrow() {
            control.set_state(PipelineState::Paused);
            tracing::info!("paused");
            tokio::select! {
                _ = stop.wait_for(|s| *s) => {
                    control.set_state(PipelineState::Stopped);
                    return Ok(());
                }
                _ = pause.wait_for(|p| !*p) => {}
            }
            tracing::info!("resuming");
        }
        if *stop.borrow() {
            control.set_state(PipelineState::Stopped);
            return Ok(());
        }
        control.set_state(PipelineState::Starting);
        let (started_tx, started_rx) = oneshot::channel();
        let (mut stop_rx, mut pause_rx) = (stop.clone(), pause.clone());
        let shutdown = async move {
            tokio::select! {
                _ = stop_rx.wait_for(|s| *s) => {}
                _ = pause_rx.wait_for(|p| *p) => {}
            }
        };
        let started = async {
            if let Ok(handles) = started_rx.await {
                *control.handles.lock().unwrap_or_else(|p| p.into_inner()) = Some(handles);
                control.set_state(PipelineState::Running);
            }
        };
        let run = pipeline::run(
            config.clone(),
            store.clone(),
            &mut sink,
            Some(started_tx),
            shutdown,
        );
        let (outcome, ()) = tokio::join!(run, started);
        *control.handles.lock().unwrap_or_else(|p| p.into_inner()) = None;
        if let Err(err) = outcome {
            control.stats.record_error(err.to_string());
            control.set_state(PipelineState::Failed);
            return Err(err);
        }
        if *stop.borrow() || !*pause.borrow() {
            // Stopped by shutdown, or ended by itself (its sink's reader
            // went away): not to be restarted.
            control.set_state(PipelineState::Stopped);
            return Ok(());
        }
    }
}

/// Raises the soft limit of open files to the hard limit, as a server
/// should: every admin API connection, replication connection and open file
/// takes a descriptor, and the soft limit a process inherits is often 1,024
/// (the admin API's own cap, `max_connections`, is then what refuses
/// clients, not the descriptor table). The limits before: (soft, hard).
pub fn raise_open_file_limit() -> Result<(u64, u64), String> {
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
pub async fn run(
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Report, StartError> {
    let engine = engine(config)?;
    let store = Arc::new(Store::open(&config.state.0)?);
    let prepared = prepare_with(config, &engine, Some(&store)).await?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut controls = Vec::new();
    for Prepared { config, sink } in prepared {
        let name = config.name.clone();
        let control = PipelineControl::new(&config);
        controls.push(control.clone());
        let span = tracing::info_span!("pipeline", pipeline = %name);
        let task = tokio::spawn(
            supervise(control, config, store.clone(), sink, stop_rx.clone()).instrument(span),
        );
        tasks.push((name, task));
    }
    let sampler = {
        let controls = controls.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                for control in &controls {
                    control.tick();
                }
            }
        })
    };
    let admin = match &config.admin {
        Some(spec) => Some(
            crate::admin::serve(
                spec,
                &config.state.0,
                crate::admin::Host {
                    pipelines: controls.clone(),
                    store: store.clone(),
                    engine: engine.clone(),
                },
                stop_rx.clone(),
            )
            .await
            .map_err(StartError::Admin)?,
        ),
        None => None,
    };
    let signal = tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut report = Report::default();
    for (name, task) in tasks {
        let outcome = match task.await {
            Ok(outcome) => outcome,
            Err(err) => Err(PipelineError::Source(crate::source::SourceError::Protocol(
                format!("the pipeline task failed: {err}"),
            ))),
        };
        match &outcome {
            Ok(()) => tracing::info!(pipeline = %name, "pipeline ended"),
            Err(err) => tracing::error!(pipeline = %name, error = %err, "pipeline failed"),
        }
        report.pipelines.push((name, outcome));
    }
    signal.abort();
    sampler.abort();
    if let Some(admin) = admin {
        admin.abort();
    }
    Ok(report)
}
