//! The host's one wasmtime engine: cranelift, the pooling allocator, epoch
//! interruption driven by a ticker thread, and fuel metering when asked for.
//!
//! Owns engine-wide settings: whether fuel is metered (it costs speed, so it
//! is on only for golden runs and when a pipeline configures fuel), the wasm
//! stack limit, and the epoch tick: how often running wasm stops to compare
//! the wall clock with its call's deadline (`module.rs`).

use std::sync::Arc;
use std::time::Duration;

use super::TransformError;

/// How often the epoch advances: the granularity of time limits (a call
/// running wasm is stopped at the first tick past its deadline).
pub(crate) const EPOCH_TICK: Duration = Duration::from_millis(5);

/// Engine-wide settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineOptions {
    /// Meter fuel, so that modules can be given fuel limits and fuel use
    /// can be reported.
    pub fuel: bool,
    /// Largest wasm stack, in bytes.
    pub max_stack: usize,
    /// Instances the pooling allocator keeps room for.
    pub max_instances: u32,
    /// Largest linear memory any module may be given.
    pub max_memory: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            fuel: false,
            max_stack: 512 << 10,
            max_instances: 128,
            max_memory: 1 << 30,
        }
    }
}

/// See the module documentation. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    pub(crate) inner: wasmtime::Engine,
    pub(crate) options: EngineOptions,
    _ticker: Arc<Ticker>,
    /// The last few compiled modules, by SHA-256 of their bytes: a hot swap
    /// that only changes the configuration, or a rollback, does not compile
    /// again.
    compiled: Arc<std::sync::Mutex<Vec<(String, wasmtime::Module)>>>,
}

/// Compiled modules an engine keeps for reuse.
const COMPILED_KEPT: usize = 8;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

/// Stops the epoch thread when the last engine handle goes.
struct Ticker {
    stop: std::sync::mpsc::Sender<()>,
}

impl Drop for Ticker {
    fn drop(&mut self) {
        let _ = self.stop.send(());
    }
}

impl Engine {
    /// Creates the engine and starts its epoch ticker.
    pub fn new(options: EngineOptions) -> Result<Engine, TransformError> {
        let mut pooling = wasmtime::PoolingAllocationConfig::new();
        pooling
            .total_core_instances(options.max_instances)
            .total_memories(options.max_instances)
            .total_tables(options.max_instances)
            .total_stacks(options.max_instances)
            .max_memory_size(options.max_memory);
        let mut config = wasmtime::Config::new();
        config
            .strategy(wasmtime::Strategy::Cranelift)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .epoch_interruption(true)
            .consume_fuel(options.fuel)
            .max_wasm_stack(options.max_stack)
            .wasm_backtrace_max_frames(std::num::NonZeroUsize::new(20))
            .allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling));
        let inner = wasmtime::Engine::new(&config)
            .map_err(|e| TransformError::Invalid(format!("creating the wasm engine: {e:#}")))?;

        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let weak = inner.weak();
        std::thread::Builder::new()
            .name("wasm-epoch".into())
            .spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(EPOCH_TICK)
                {
                    match weak.upgrade() {
                        Some(engine) => engine.increment_epoch(),
                        None => break,
                    }
                }
            })
            .map_err(|e| TransformError::Invalid(format!("starting the epoch thread: {e}")))?;
        Ok(Engine {
            inner,
            options,
            _ticker: Arc::new(Ticker { stop }),
            compiled: Arc::default(),
        })
    }

    /// The compiled form of the module whose bytes hash to `sha256`, if
    /// this engine compiled it recently.
    pub(crate) fn compiled(&self, sha256: &str) -> Option<wasmtime::Module> {
        let mut kept = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        let at = kept.iter().position(|(sha, _)| sha == sha256)?;
        let entry = kept.remove(at);
        let module = entry.1.clone();
        kept.push(entry);
        Some(module)
    }

    /// Keeps a compiled module for [`Engine::compiled`].
    pub(crate) fn keep_compiled(&self, sha256: &str, module: &wasmtime::Module) {
        let mut kept = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(sha, _)| sha != sha256);
        kept.push((sha256.to_owned(), module.clone()));
        if kept.len() > COMPILED_KEPT {
            kept.remove(0);
        }
    }

    /// Whether this engine meters fuel.
    pub fn meters_fuel(&self) -> bool {
        self.options.fuel
    }
}
