//! Turning the configuration into pipelines ready to run: modules compiled
//! once on one engine and resolved against the module registry, the source's
//! settings, one sink each.

use std::path::Path;

use crate::checkpoint::Store;
use crate::config::{Config, PipelineSpec, SinkSpec};
use crate::pg::ConnInfo;
use crate::sink::AnySink;
use crate::source::SourceConfig;
use crate::transform::engine::EngineOptions;
use crate::transform::{Engine, Module, encode_config};

use super::hotswap::{ActiveChain, Configured};
use super::pipeline::PipelineConfig;

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

/// A pipeline ready to run.
#[derive(Debug)]
pub(crate) struct Prepared {
    /// Its settings.
    pub config: PipelineConfig,
    /// Its sink.
    pub sink: AnySink,
}

/// The engine every module of `config` runs on.
pub(crate) fn engine(config: &Config) -> Result<Engine, StartError> {
    let fuel = config
        .pipeline
        .iter()
        .flat_map(|p| &p.transforms)
        .any(|t| t.limits.fuel.is_some());
    let engine = Engine::new(EngineOptions {
        fuel,
        ..EngineOptions::default()
    })?;
    // Beside the state file: a restart (or a host taking over) loads what
    // this host compiled before instead of compiling it again.
    Ok(engine.with_disk_cache(&compiled_dir(Path::new(&config.state.0))))
}

/// Where compiled modules are kept: `STATE.compiled/` beside the state
/// file.
pub(crate) fn compiled_dir(state: &Path) -> std::path::PathBuf {
    let mut name = state.file_name().unwrap_or_default().to_os_string();
    name.push(".compiled");
    state.with_file_name(name)
}

/// Compiles the modules and opens the sinks of every pipeline (a
/// `postgres` sink connects to its target); the sources connect when the
/// pipelines start. With a state file, each pipeline's modules are
/// resolved against its module registry (`crate::daemon::hotswap`); without, they
/// are the configuration's, outside the registry.
pub(crate) async fn prepare(config: &Config) -> Result<Vec<Prepared>, StartError> {
    prepare_with(config, &engine(config)?, None).await
}

pub(crate) async fn prepare_with(
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
    source.capture_ddl = spec.source.capture_ddl;
    source.catch_up = spec
        .source
        .catch_up
        .0
        .map(crate::source::catchup::CatchUp::beyond);
    source.limits = spec.batch.limits();

    let mut modules = Vec::new();
    let mut configured = Vec::new();
    for (i, t) in spec.transforms.iter().enumerate() {
        let path = Path::new(&t.module.0);
        let module_name = t.name();
        let limits = t.limits.limits();
        let wasm = std::fs::read(path).map_err(|e| {
            fail(format!(
                "transforms[{i}]: cannot read {}: {e} (a relative `module` path is relative to \
                 the configuration file's directory)",
                path.display()
            ))
        })?;
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
            let slots =
                crate::daemon::hotswap::resolve(engine, store, &name, &configured, checkpoint)
                    .map_err(|e| fail(format!("transforms: {e}")))?;
            modules = slots.iter().map(|s| s.module.clone()).collect();
            Some(ActiveChain::new(slots, checkpoint))
        }
        None => None,
    };

    let sink = crate::sink::open(&spec.sink, &name)
        .await
        .map_err(|e| fail(format!("sink: {e}")))?;

    let mut config = PipelineConfig::new(&name, source);
    config.modules = modules;
    config.chain = chain;
    config.on_error = spec.on_error;
    config.channel_capacity = spec.in_flight.0;
    config.commit.group_delay = spec.group_commit.0;
    config.drain_timeout = spec.drain_timeout.0;
    config.adopt_slot = spec.source.adopt_slot;
    config.leader_lock = spec.source.leader_lock;
    config.snapshot = super::snapshot::SnapshotPolicy {
        mode: spec.snapshot.mode,
        chunk_rows: spec
            .snapshot
            .chunk_size
            .map_or(crate::config::DEFAULT_CHUNK_ROWS, |c| c.0),
        parallel_tables: spec
            .snapshot
            .parallel_tables
            .map_or(crate::config::DEFAULT_PARALLEL_TABLES, |c| c.0),
        max_rows_per_second: spec.snapshot.max_rows_per_second.map(|c| c.0 as u64),
        order: spec.snapshot.order,
    };
    match &spec.sink {
        SinkSpec::Http {
            retry_initial,
            retry_max,
            ..
        } => {
            config.sink_retry_initial = retry_initial.0;
            config.sink_retry_max = retry_max.0;
        }
        SinkSpec::Nats(nats) => {
            config.sink_retry_initial = nats.retry_initial.0;
            config.sink_retry_max = nats.retry_max.0;
        }
        _ => {}
    }
    Ok(Prepared { config, sink })
}
