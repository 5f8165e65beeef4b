//! Hot swap (`docs/admin.md`): the module versions a pipeline runs, which one
//! is active, and replacing one while the stream runs.
//!
//! Owns the pipeline's [`ActiveChain`] — the modules in force, shared
//! between the admin API (which publishes a new version) and the transform
//! thread (which adopts it between transactions, so every batch is read by
//! exactly one version and a transaction's chunks never straddle two) —
//! and the rules that tie it to the registry in the state file:
//!
//! * at start, each transform's module comes from the registry's active
//!   version, unless the configuration file names a module or configuration
//!   other than the one it last deployed: then the file wins, as a new
//!   version (a deploy through the file is a deploy too);
//! * a swap compiles and checks the module off the hot path, instantiates it
//!   once (so `datum_init` vets the configuration), runs the golden
//!   fixtures sent with it, stores it as a new version, publishes it, and
//!   records the activation with the LSN after which it took effect;
//! * a rollback re-activates a stored version the same way.
//!
//! It does not own HTTP (the admin module) or the registry's storage
//! (`checkpoint`).

use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, oneshot};

use crate::checkpoint::{Activation, CheckpointError, ModuleVersion, Store};
use crate::event::Lsn;
use crate::transform::{Chain, Engine, Limits, Module, TransformError};

/// Versions kept per module for rollback (the active one is always kept).
pub(crate) const KEEP_VERSIONS: usize = 10;

/// One transform of a pipeline, as it runs now.
#[derive(Debug, Clone)]
pub struct Slot {
    /// The transform's name (unique within the pipeline).
    pub name: String,
    /// The registry key, `PIPELINE/NAME`.
    pub key: String,
    /// The module, compiled, with its configuration.
    pub module: Module,
    /// Its version in the registry.
    pub version: u64,
    /// Its configuration as TOML text.
    pub config: String,
    /// The limits from the configuration file (a new version keeps them).
    pub limits: Limits,
}

/// What a transform runs, for status pages.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SlotInfo {
    /// The transform's name.
    pub name: String,
    /// The version in force: the one the transform thread runs.
    pub version: u64,
    /// The module's SHA-256.
    pub sha256: String,
    /// A version published but not yet in force: the transform thread
    /// adopts it at the next transaction boundary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pending: Option<u64>,
}

/// The modules in force for one pipeline; see the module documentation.
#[derive(Debug)]
pub struct ActiveChain {
    state: Mutex<ChainState>,
    wake: Notify,
    /// One swap, rollback or promotion at a time. Each publishes, then
    /// records the activation in the state file; two at once could record
    /// in the other order than they published, and the state file (what a
    /// restart loads) would name another version than the one running.
    swaps: tokio::sync::Mutex<()>,
}

#[derive(Debug)]
struct ChainState {
    /// The transforms as last published.
    slots: Vec<Slot>,
    /// What the transform thread runs: `slots` as of generation `applied`.
    in_force: Vec<SlotInfo>,
    /// Bumped by every publication.
    generation: u64,
    /// The generation the transform thread runs.
    applied: u64,
    /// Whether a transform thread is attached.
    running: bool,
    /// The end LSN of the last transaction the applied chain's predecessor
    /// finished: where the applied chain took over.
    boundary: Lsn,
    /// Publications waiting for the transform thread: (generation, reply).
    waiters: Vec<(u64, oneshot::Sender<Lsn>)>,
}

impl ActiveChain {
    /// A chain of `slots`, in force after `boundary` (the checkpoint).
    pub fn new(slots: Vec<Slot>, boundary: Lsn) -> Arc<ActiveChain> {
        Arc::new(ActiveChain {
            state: Mutex::new(ChainState {
                in_force: in_force(&slots),
                slots,
                generation: 0,
                applied: 0,
                running: false,
                boundary,
                waiters: Vec::new(),
            }),
            wake: Notify::new(),
            swaps: tokio::sync::Mutex::new(()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ChainState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The transforms, in order.
    pub fn slots(&self) -> Vec<Slot> {
        self.lock().slots.clone()
    }

    /// What each transform runs, and what it will run once the transform
    /// thread adopts a version published meanwhile.
    pub fn info(&self) -> Vec<SlotInfo> {
        let state = self.lock();
        state
            .in_force
            .iter()
            .map(|running| {
                let published = state.slots.iter().find(|s| s.name == running.name);
                SlotInfo {
                    pending: published
                        .filter(|s| s.version != running.version)
                        .map(|s| s.version),
                    ..running.clone()
                }
            })
            .collect()
    }

    /// The version of transform `name` the transform thread runs (0 when
    /// no transform has that name).
    pub(crate) fn version_in_force(&self, name: &str) -> u64 {
        self.lock()
            .in_force
            .iter()
            .find(|s| s.name == name)
            .map_or(0, |s| s.version)
    }

    /// The modules in force, in order.
    pub fn modules(&self) -> Vec<Module> {
        self.lock().slots.iter().map(|s| s.module.clone()).collect()
    }

    /// Replaces the transform named `slot.name`; resolves, once the
    /// transform thread has adopted it at a transaction boundary (at once
    /// when no thread runs: paused or stopped), to the LSN after which it
    /// is in force. `None` if no transform has that name.
    pub async fn publish(&self, slot: Slot) -> Option<Lsn> {
        let reply = {
            let mut state = self.lock();
            let index = state.slots.iter().position(|s| s.name == slot.name)?;
            state.slots[index] = slot;
            state.generation += 1;
            if !state.running {
                state.apply();
                return Some(state.boundary);
            }
            let (tx, rx) = oneshot::channel();
            let generation = state.generation;
            state.waiters.push((generation, tx));
            rx
        };
        self.wake.notify_one();
        match reply.await {
            Ok(lsn) => Some(lsn),
            // The thread went away before adopting it: the next one starts
            // with it, after the checkpoint.
            Err(_) => Some(self.lock().boundary),
        }
    }

    /// For the transform thread: attach, and get the chain to run after
    /// `boundary` (the checkpoint it resumes from).
    pub(crate) fn attach(&self, boundary: Lsn) -> (Chain, bool) {
        let mut state = self.lock();
        state.running = true;
        state.apply();
        state.boundary = boundary;
        let modules: Vec<Module> = state.slots.iter().map(|s| s.module.clone()).collect();
        let empty = modules.is_empty();
        let generation = state.applied;
        answer(&mut state.waiters, generation, boundary);
        (Chain::new(&modules), empty)
    }

    /// For the transform thread: whether a publication awaits adoption.
    pub(crate) fn pending(&self) -> bool {
        let state = self.lock();
        state.generation != state.applied
    }

    /// For the transform thread, between transactions: adopt what was
    /// published, in force after `boundary`.
    pub(crate) fn adopt(&self, boundary: Lsn) -> Chain {
        let mut state = self.lock();
        state.apply();
        state.boundary = boundary;
        let modules: Vec<Module> = state.slots.iter().map(|s| s.module.clone()).collect();
        let generation = state.applied;
        answer(&mut state.waiters, generation, boundary);
        tracing::info!(after = %boundary, "new module version in force");
        Chain::new(&modules)
    }

    /// For the transform thread, on its way out, after `boundary`.
    pub(crate) fn detach(&self, boundary: Lsn) {
        let mut state = self.lock();
        state.boundary = boundary;
        Self::unattended(&mut state);
    }

    /// For a transform thread that panicked (it cannot say where it
    /// stopped): publications waiting for it are answered with the last
    /// boundary it adopted at, instead of waiting for ever, and later ones
    /// resolve at once.
    pub(crate) fn abandon(&self) {
        Self::unattended(&mut self.lock());
    }

    fn unattended(state: &mut ChainState) {
        state.running = false;
        state.apply();
        let (generation, boundary) = (state.applied, state.boundary);
        answer(&mut state.waiters, generation, boundary);
    }

    /// Completes when a publication may await adoption.
    pub(crate) async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl ChainState {
    /// The transform thread runs what was last published.
    fn apply(&mut self) {
        self.applied = self.generation;
        self.in_force = in_force(&self.slots);
    }
}

fn in_force(slots: &[Slot]) -> Vec<SlotInfo> {
    slots
        .iter()
        .map(|s| SlotInfo {
            name: s.name.clone(),
            version: s.version,
            sha256: s.module.sha256().to_owned(),
            pending: None,
        })
        .collect()
}

fn answer(waiters: &mut Vec<(u64, oneshot::Sender<Lsn>)>, applied: u64, lsn: Lsn) {
    let mut i = 0;
    while i < waiters.len() {
        if waiters[i].0 <= applied {
            let (_, tx) = waiters.swap_remove(i);
            let _ = tx.send(lsn);
        } else {
            i += 1;
        }
    }
}

/// A transform as the configuration file gives it.
#[derive(Debug, Clone)]
pub(crate) struct Configured {
    /// Its name in the pipeline.
    pub name: String,
    /// The module's bytes.
    pub wasm: Vec<u8>,
    /// Its configuration, as TOML text.
    pub config: String,
    /// Its limits.
    pub limits: Limits,
}

/// Why a version could not be made or activated.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SwapError {
    /// Not a usable module: not wasm, the wrong ABI, too large, or its
    /// `datum_init` refused the configuration.
    #[error("{0}")]
    Module(#[from] TransformError),
    /// The configuration is not TOML.
    #[error("the module configuration is not valid TOML: {0}")]
    Config(String),
    /// The golden fixtures sent with it failed.
    #[error("{failed} of {total} golden fixtures failed:\n{report}")]
    Fixtures {
        /// Cases that failed.
        failed: usize,
        /// Cases run.
        total: usize,
        /// The runner's report (diffs).
        report: String,
    },
    /// No such transform, or no such version.
    #[error("{0}")]
    NotFound(String),
    /// What was asked does not fit the state it found (a canary already
    /// running, or none to promote).
    #[error("{0}")]
    Conflict(String),
    /// The state file.
    #[error(transparent)]
    State(#[from] CheckpointError),
    /// A task the swap ran on died.
    #[error("{0}")]
    Internal(String),
}

/// Compiles `wasm` with `config` (TOML text) as transform `name`, and
/// instantiates it once so `datum_init` vets the configuration.
pub(crate) fn compile(
    engine: &Engine,
    name: &str,
    wasm: &[u8],
    config: &str,
    limits: Limits,
) -> Result<Module, SwapError> {
    crate::transform::check_binary(wasm)?;
    let table: toml::Table = config
        .parse()
        .map_err(|e: toml::de::Error| SwapError::Config(e.to_string()))?;
    let began = std::time::Instant::now();
    let module = Module::new(
        engine,
        name,
        wasm,
        limits,
        crate::transform::encode_config(&table),
    )?;
    let compiled = began.elapsed();
    module.instance().warm()?;
    crate::transform::engine::release_freed_memory();
    tracing::debug!(
        module = name,
        compiled_ms = compiled.as_millis() as u64,
        ready_ms = began.elapsed().as_millis() as u64,
        "swap: compiled"
    );
    Ok(module)
}

/// The registry key of transform `name` of `pipeline`.
pub(crate) fn key(pipeline: &str, name: &str) -> String {
    format!("{pipeline}/{name}")
}

/// Decides what each configured transform runs at start (see the module
/// documentation) and returns the slots, activating a new version where
/// the configuration file changed.
pub(crate) fn resolve(
    engine: &Engine,
    store: &Store,
    pipeline: &str,
    configured: &[Configured],
    checkpoint: Lsn,
) -> Result<Vec<Slot>, SwapError> {
    let mut slots = Vec::new();
    for c in configured {
        let key = key(pipeline, &c.name);
        let versions = store.module_versions(&key)?;
        let sha = crate::digest::sha256_hex(&c.wasm);
        let from_file = versions.iter().rev().find(|v| v.origin == "config");
        let file_unchanged = from_file.is_some_and(|v| v.sha256 == sha && v.config == c.config);
        let active = store.active_module_version(&key)?;
        let chosen: Option<&ModuleVersion> = match active {
            Some(active) if file_unchanged => versions.iter().find(|v| v.version == active),
            _ => None,
        };
        let slot = match chosen {
            Some(v) => Slot {
                name: c.name.clone(),
                key: key.clone(),
                module: compile(engine, &c.name, &v.wasm, &v.config, c.limits)?,
                version: v.version,
                config: v.config.clone(),
                limits: c.limits,
            },
            None => {
                let module = compile(engine, &c.name, &c.wasm, &c.config, c.limits)?;
                let stored = store.add_module_version(
                    &key,
                    &c.wasm,
                    &c.config,
                    "config",
                    0,
                    KEEP_VERSIONS,
                )?;
                store.activate_module_version(&key, stored.version, checkpoint)?;
                if active.is_some() {
                    tracing::info!(module = %key, version = stored.version, "the configuration file names another module or configuration: it is the new version");
                }
                Slot {
                    name: c.name.clone(),
                    key: key.clone(),
                    module,
                    version: stored.version,
                    config: c.config.clone(),
                    limits: c.limits,
                }
            }
        };
        slots.push(slot);
    }
    Ok(slots)
}

/// What a swap or rollback did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Swapped {
    /// The transform.
    pub module: String,
    /// The version now active.
    pub version: u64,
    /// Its SHA-256.
    pub sha256: String,
    /// Every transaction ending after this LSN goes through it.
    pub effective_after: String,
    /// Golden cases it passed first.
    pub fixtures: u64,
}

/// A new version, compiled and vetted, not stored yet.
#[derive(Debug, Clone)]
pub(crate) struct Candidate {
    /// The module's bytes.
    pub wasm: Vec<u8>,
    /// Its configuration, TOML text.
    pub config: String,
    /// Compiled (by [`compile`]).
    pub module: Module,
    /// Golden cases it passed.
    pub fixtures: u64,
}

/// Stores `candidate` as a new version of transform `name` and activates it.
pub(crate) async fn swap(
    store: &Arc<Store>,
    chain: &ActiveChain,
    pipeline: &str,
    name: &str,
    candidate: Candidate,
) -> Result<Swapped, SwapError> {
    let Candidate {
        wasm,
        config,
        module,
        fixtures,
    } = candidate;
    let slot = chain
        .slots()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| no_transform(pipeline, name))?;
    let began = std::time::Instant::now();
    let version = store_version(store, &slot.key, wasm, &config, "upload", fixtures).await?;
    tracing::debug!(module = %slot.key, version, stored_ms = began.elapsed().as_millis() as u64, "swap: version stored");
    activate(
        store, chain, pipeline, slot, module, version, config, fixtures,
    )
    .await
}

/// Stores a module as the next version of transform `key` (keeping the
/// last [`KEEP_VERSIONS`]), off the async workers; its version number.
/// `origin` says where it came from: `upload`, `canary`.
pub(crate) async fn store_version(
    store: &Arc<Store>,
    key: &str,
    wasm: Vec<u8>,
    config: &str,
    origin: &'static str,
    fixtures: u64,
) -> Result<u64, SwapError> {
    let (store, key, config) = (store.clone(), key.to_owned(), config.to_owned());
    let stored = tokio::task::spawn_blocking(move || {
        store.add_module_version(&key, &wasm, &config, origin, fixtures, KEEP_VERSIONS)
    })
    .await
    .map_err(|e| SwapError::Internal(format!("storing the module: {e}")))??;
    Ok(stored.version)
}

/// Re-activates a stored version (`None`: the one active before the
/// current). The state file's reads and the compilation run off the async
/// workers, as an upload's do.
pub(crate) async fn rollback(
    engine: &Engine,
    store: &Arc<Store>,
    chain: &ActiveChain,
    pipeline: &str,
    name: &str,
    to: Option<u64>,
) -> Result<Swapped, SwapError> {
    // The turn first: "the version before the current" is of the version
    // current once no other swap can land meanwhile.
    let _one_at_a_time = chain.swaps.lock().await;
    let slot = chain
        .slots()
        .into_iter()
        .find(|s| s.name == name)
        .ok_or_else(|| no_transform(pipeline, name))?;
    let (engine, blocking_store, key, blocking_name) = (
        engine.clone(),
        store.clone(),
        slot.key.clone(),
        name.to_owned(),
    );
    let (current, limits) = (slot.version, slot.limits);
    let (module, target, config, fixtures) = tokio::task::spawn_blocking(move || {
        let (store, name) = (blocking_store, blocking_name);
        let versions = store.module_versions(&key)?;
        let target = match to {
            Some(v) => v,
            None => {
                previous_version(&store.module_activations(&key)?, current).ok_or_else(|| {
                    SwapError::NotFound(format!(
                        "transform `{name}` has no earlier version to roll back to"
                    ))
                })?
            }
        };
        let kept: Vec<String> = versions.iter().map(|v| v.version.to_string()).collect();
        let version = versions
            .into_iter()
            .find(|v| v.version == target)
            .ok_or_else(|| {
                SwapError::NotFound(format!(
                    "transform `{name}` has no stored version {target} (stored: {})",
                    kept.join(", ")
                ))
            })?;
        let module = compile(&engine, &name, &version.wasm, &version.config, limits)?;
        Ok::<_, SwapError>((module, target, version.config, version.fixtures))
    })
    .await
    .map_err(|e| SwapError::Internal(format!("compiling the stored version: {e}")))??;
    publish_and_record(
        store, chain, pipeline, slot, module, target, config, fixtures,
    )
    .await
}

/// The version active before `current`: the latest activation of another
/// version.
fn previous_version(activations: &[Activation], current: u64) -> Option<u64> {
    activations
        .iter()
        .rev()
        .map(|a| a.version)
        .find(|v| *v != current)
}

/// Publishes `module` as `version` of `slot`'s transform and records the
/// activation, one swap of the chain at a time; a canary's promotion comes
/// this way too.
#[allow(clippy::too_many_arguments)]
pub(crate) async fn activate(
    store: &Arc<Store>,
    chain: &ActiveChain,
    pipeline: &str,
    slot: Slot,
    module: Module,
    version: u64,
    config: String,
    fixtures: u64,
) -> Result<Swapped, SwapError> {
    let _one_at_a_time = chain.swaps.lock().await;
    publish_and_record(
        store, chain, pipeline, slot, module, version, config, fixtures,
    )
    .await
}

/// [`activate`], for a caller that holds the chain's turn to swap.
#[allow(clippy::too_many_arguments)]
async fn publish_and_record(
    store: &Arc<Store>,
    chain: &ActiveChain,
    pipeline: &str,
    slot: Slot,
    module: Module,
    version: u64,
    config: String,
    fixtures: u64,
) -> Result<Swapped, SwapError> {
    let sha256 = module.sha256().to_owned();
    let key = slot.key.clone();
    let name = slot.name.clone();
    let lsn = chain
        .publish(Slot {
            module,
            version,
            config,
            ..slot
        })
        .await
        .ok_or_else(|| no_transform(pipeline, &name))?;
    tracing::debug!(module = %key, version, "swap: adopted by the transform thread");
    let store = store.clone();
    let record_key = key.clone();
    tokio::task::spawn_blocking(move || store.activate_module_version(&record_key, version, lsn))
        .await
        .map_err(|e| SwapError::Internal(format!("recording the activation: {e}")))??;
    tracing::info!(pipeline, module = %name, version, sha256 = %sha256, after = %lsn, "module version activated");
    Ok(Swapped {
        module: name,
        version,
        sha256,
        effective_after: lsn.to_string(),
        fixtures,
    })
}

fn no_transform(pipeline: &str, name: &str) -> SwapError {
    SwapError::NotFound(format!(
        "pipeline `{pipeline}` has no transform named `{name}`"
    ))
}

/// A transform `m` (key `p/m`) of `version` whose module, written in the
/// text format, answers `body` (an `i64`) to every batch, for tests.
#[cfg(test)]
pub(crate) fn test_slot(engine: &Engine, version: u64, body: &str) -> Slot {
    let wat = format!(
        r#"(module
  (memory (export "memory") 1)
  (func (export "datum_abi_v1"))
  (func (export "datum_alloc") (param i32) (result i32) (i32.const 4096))
  (func (export "datum_dealloc") (param i32 i32))
  (func (export "datum_transform") (param i32 i32) (result i64) {body}))"#
    );
    Slot {
        name: "m".into(),
        key: "p/m".into(),
        module: Module::new(engine, "m", wat.as_bytes(), Limits::default(), vec![])
            .expect("module"),
        version,
        config: String::new(),
        limits: Limits::default(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A published version was reported active (status, module pages,
    /// metrics, dead letters) while the transform thread still ran the old
    /// one: until the next transaction boundary, which a stream held up by
    /// its sink can put off for as long as the sink is down.
    #[test]
    fn a_version_published_but_not_adopted_is_reported_pending_not_active() {
        let engine =
            crate::transform::Engine::new(crate::transform::engine::EngineOptions::default())
                .expect("engine");
        let slot = test_slot(&engine, 1, "(i64.const 0)");
        let old_sha = slot.module.sha256().to_owned();
        let new = test_slot(&engine, 2, "(i64.const 1) (drop) (i64.const 0)");
        let new_sha = new.module.sha256().to_owned();
        let active = ActiveChain::new(vec![slot], Lsn(16));
        let _ = active.attach(Lsn(32));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let publish = active.publish(new);
            tokio::pin!(publish);
            let waiting = tokio::time::timeout(Duration::from_millis(50), &mut publish).await;
            assert!(waiting.is_err(), "the swap waits for the thread");
            let info = active.info();
            assert_eq!(
                (info[0].version, info[0].sha256.as_str(), info[0].pending),
                (1, old_sha.as_str(), Some(2)),
                "before adoption"
            );
            assert!(active.pending());
            let _ = active.adopt(Lsn(48));
            assert_eq!(publish.await, Some(Lsn(48)));
        });
        let info = active.info();
        assert_eq!(
            (info[0].version, info[0].sha256.as_str(), info[0].pending),
            (2, new_sha.as_str(), None),
            "after adoption"
        );
    }
}
