//! `datum run`: every pipeline of a configuration file, in one host.
//!
//! Owns turning the configuration into running pipelines — modules compiled
//! once on one engine, one state file, one sink each — and their lifetimes:
//! pipelines run independently (one failing stops only itself), shutdown
//! reaches all of them, and the host ends when the last one has.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;

use tokio::sync::watch;
use tracing::Instrument;

use crate::checkpoint::Store;
use crate::config::{Config, PipelineSpec, SinkSpec, StdoutFormat};
use crate::pipeline::{self, PipelineConfig, PipelineError};
use crate::sink::file::FileSink;
use crate::sink::http::HttpSink;
use crate::sink::postgres::PostgresSink;
use crate::sink::stdout::StdoutSink;
use crate::sink::{Sink, SinkError};
use crate::source::{ConnInfo, SourceConfig};
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
}

/// A pipeline ready to run.
#[derive(Debug)]
pub struct Prepared {
    /// Its settings.
    pub config: PipelineConfig,
    /// Its sink.
    pub sink: AnySink,
}

/// Compiles the modules and opens the sinks of every pipeline (a
/// `postgres` sink connects to its target); the sources connect when the
/// pipelines start.
pub async fn prepare(config: &Config) -> Result<Vec<Prepared>, StartError> {
    let fuel = config
        .pipeline
        .iter()
        .flat_map(|p| &p.transforms)
        .any(|t| t.limits.fuel.is_some());
    let engine = Engine::new(EngineOptions {
        fuel,
        ..EngineOptions::default()
    })?;
    let mut prepared = Vec::new();
    for spec in &config.pipeline {
        prepared.push(prepare_pipeline(spec, &engine).await?);
    }
    Ok(prepared)
}

async fn prepare_pipeline(spec: &PipelineSpec, engine: &Engine) -> Result<Prepared, StartError> {
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
    for (i, t) in spec.transforms.iter().enumerate() {
        let path = Path::new(&t.module.0);
        let module_name = t.name.as_ref().map_or_else(
            || {
                path.file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("module")
                    .to_owned()
            },
            |n| n.0.clone(),
        );
        let limits = t.limits.limits();
        let wasm = std::fs::read(path)
            .map_err(|e| fail(format!("transforms[{i}]: {}: {e}", path.display())))?;
        crate::transform::check_binary(&wasm)
            .map_err(|e| fail(format!("transforms[{i}] ({}): {e}", path.display())))?;
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
    config.on_error = spec.on_error;
    config.channel_capacity = spec.in_flight.0;
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

/// Runs every pipeline until `shutdown` completes (then each drains and
/// checkpoints) or each has stopped on its own.
pub async fn run(
    config: &Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<Report, StartError> {
    let prepared = prepare(config).await?;
    let store = Arc::new(Store::open(&config.state.0)?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut tasks = Vec::new();
    for Prepared { config, sink } in prepared {
        let name = config.name.clone();
        let mut stop = stop_rx.clone();
        let span = tracing::info_span!("pipeline", pipeline = %name);
        let task = tokio::spawn(
            pipeline::run(config, store.clone(), sink, None, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .instrument(span),
        );
        tasks.push((name, task));
    }
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
    Ok(report)
}
