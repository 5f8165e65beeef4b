//! The host's one wasmtime engine: cranelift (none where modules compile in
//! child processes, `compiler.rs`), the pooling allocator, epoch
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

/// The stack of a thread that calls modules. Wasm runs on the caller's
/// stack, up to [`EngineOptions::max_stack`] of it, beside the host's own
/// frames; a thread whose stack ran out first would abort the process, so
/// the threads that call modules are given this much, and the wasm stack
/// limit may be at most half of it.
pub(crate) const CALLER_STACK: usize = 4 << 20;

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
    /// Compiled modules on disk (`with_disk_cache`): a restart, or a host
    /// taking over, loads them instead of compiling.
    disk: Option<Arc<DiskCache>>,
}

/// Whether an engine compiles.
pub(crate) enum Compiler {
    /// It only loads modules compiled elsewhere (a child process).
    None,
    /// It compiles with cranelift, reusing the compiled functions in the
    /// store when given one.
    Cranelift(Option<Arc<dyn wasmtime::CacheStore>>),
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
    /// Creates the engine and starts its epoch ticker. Where modules
    /// compile in child processes (the `datum` binary, `compiler.rs`) the
    /// engine has no compiler of its own: it only loads what a child
    /// compiled, and the compiler's code is never paged into the host.
    pub fn new(options: EngineOptions) -> Result<Engine, TransformError> {
        let compiler = if super::compiler::compiles_in_children() {
            Compiler::None
        } else {
            Compiler::Cranelift(None)
        };
        Engine::build(options, compiler)
    }

    /// [`Engine::new`], with the compiler given.
    pub(crate) fn build(
        options: EngineOptions,
        compiler: Compiler,
    ) -> Result<Engine, TransformError> {
        if options.max_stack > CALLER_STACK / 2 {
            return Err(TransformError::Invalid(format!(
                "a wasm stack of {} bytes is over the {} the host allows: modules run on \
                 threads of {CALLER_STACK}-byte stacks",
                options.max_stack,
                CALLER_STACK / 2
            )));
        }
        let mut pooling = wasmtime::PoolingAllocationConfig::new();
        pooling
            .total_core_instances(options.max_instances)
            .total_memories(options.max_instances)
            .total_tables(options.max_instances)
            .max_memory_size(options.max_memory);
        let mut config = wasmtime::Config::new();
        config
            .strategy(wasmtime::Strategy::Cranelift)
            .cranelift_opt_level(wasmtime::OptLevel::Speed)
            .epoch_interruption(true)
            .consume_fuel(options.fuel)
            .max_wasm_stack(options.max_stack)
            .wasm_backtrace_max_frames(std::num::NonZeroUsize::new(20))
            .allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pooling))
            // Last: the compiler's settings above cannot be set without one.
            .enable_compiler(!matches!(compiler, Compiler::None));
        if let Compiler::Cranelift(Some(functions)) = compiler {
            config
                .enable_incremental_compilation(functions)
                .map_err(|e| {
                    TransformError::Invalid(format!("reusing compiled functions: {e:#}"))
                })?;
        }
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
            disk: None,
        })
    }

    /// Keeps compiled modules in `dir` too (created private to this user
    /// when missing), by the SHA-256 of their bytes and this engine's
    /// settings. Best effort: a directory that cannot be made only means
    /// compiling again, logged.
    pub fn with_disk_cache(mut self, dir: &std::path::Path) -> Engine {
        match DiskCache::open(dir, &self.inner) {
            Ok(cache) => self.disk = Some(Arc::new(cache)),
            Err(err) => {
                tracing::warn!(dir = %dir.display(), error = %err, "cannot keep compiled modules on disk; modules are compiled at every start");
            }
        }
        self
    }

    /// The compiled form of the module whose bytes hash to `sha256`, if
    /// this engine compiled it recently.
    pub(crate) fn compiled(&self, sha256: &str) -> Option<wasmtime::Module> {
        {
            let mut kept = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(at) = kept.iter().position(|(sha, _)| sha == sha256) {
                let entry = kept.remove(at);
                let module = entry.1.clone();
                kept.push(entry);
                return Some(module);
            }
        }
        let module = self.disk.as_ref()?.load(&self.inner, sha256)?;
        self.remember(sha256, &module);
        Some(module)
    }

    /// Keeps a compiled module for [`Engine::compiled`].
    pub(crate) fn keep_compiled(&self, sha256: &str, module: &wasmtime::Module) {
        self.remember(sha256, module);
        if let Some(disk) = &self.disk {
            disk.store(sha256, module);
        }
    }

    fn remember(&self, sha256: &str, module: &wasmtime::Module) {
        let mut kept = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        kept.retain(|(sha, _)| sha != sha256);
        kept.push((sha256.to_owned(), module.clone()));
        if kept.len() > COMPILED_KEPT {
            kept.remove(0);
        }
    }

    /// The file keeping the compiled functions of the last compilation of
    /// modules named `name` (beside the compiled modules; `None` without
    /// them): a new build of a module compiles only the functions that
    /// changed (`compiler.rs`).
    pub(crate) fn functions_file(&self, name: &str) -> Option<std::path::PathBuf> {
        let disk = self.disk.as_ref()?;
        let name = crate::digest::sha256_hex(name.as_bytes());
        Some(disk.dir.join(format!(
            "functions-{}-{}.bin",
            name.get(..16).unwrap_or(&name),
            disk.settings
        )))
    }

    /// Whether this engine meters fuel.
    pub fn meters_fuel(&self) -> bool {
        self.options.fuel
    }
}

/// Compiled modules kept in a directory: `SHA256-SETTINGS.cwasm`, where
/// SETTINGS is a hash of what the engine's compiled code depends on
/// (wasmtime's version and configuration), so another build or other
/// settings never load it.
///
/// The files are native code the host runs, so only files this host could
/// have written are loaded: in a directory private to this user (0700),
/// owned by this user and writable by no one else. Writes go to a new
/// private file renamed into place, so a reader never sees half a file.
#[derive(Debug)]
struct DiskCache {
    dir: std::path::PathBuf,
    settings: String,
}

impl DiskCache {
    fn open(dir: &std::path::Path, engine: &wasmtime::Engine) -> std::io::Result<DiskCache> {
        use std::hash::{Hash, Hasher};
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
        match std::fs::DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        let meta = std::fs::metadata(dir)?;
        if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
            return Err(std::io::Error::other("not a directory owned by this user"));
        }
        if meta.permissions().mode() & 0o077 != 0 {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Ok(DiskCache {
            dir: dir.to_owned(),
            settings: format!("{:016x}", hasher.finish()),
        })
    }

    fn path(&self, sha256: &str) -> std::path::PathBuf {
        self.dir.join(format!("{sha256}-{}.cwasm", self.settings))
    }

    /// The module compiled from bytes hashing to `sha256`, if a usable file
    /// holds it.
    fn load(&self, engine: &wasmtime::Engine, sha256: &str) -> Option<wasmtime::Module> {
        if !sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let path = self.path(sha256);
        let meta = std::fs::symlink_metadata(&path).ok()?;
        if !written_by_this_user(&meta) {
            tracing::warn!(file = %path.display(), "ignoring a compiled module this host did not write (owner or permissions); compiling again");
            // The directory is this user's: replace it with one of ours.
            let _ = std::fs::remove_file(&path);
            return None;
        }
        // SAFETY: the file was written by `store` (owner and permissions
        // checked above; the directory is private), from a module this
        // engine compiled; wasmtime checks that it was compiled for this
        // version and these settings.
        match unsafe { wasmtime::Module::deserialize_file(engine, &path) } {
            Ok(module) => {
                tracing::info!(file = %path.display(), "loaded a compiled module kept on disk (not compiled again)");
                Some(module)
            }
            Err(err) => {
                tracing::warn!(file = %path.display(), error = %format!("{err:#}"), "ignoring an unusable compiled module; compiling again");
                let _ = std::fs::remove_file(&path);
                None
            }
        }
    }

    /// Writes the compiled form of the module hashing to `sha256`.
    fn store(&self, sha256: &str, module: &wasmtime::Module) {
        let path = self.path(sha256);
        if path.exists() {
            return;
        }
        let bytes = match module.serialize() {
            Ok(bytes) => bytes,
            Err(err) => {
                tracing::debug!(error = %format!("{err:#}"), "cannot serialize a compiled module");
                return;
            }
        };
        let temp = self.dir.join(format!(
            ".{sha256}-{}.{}.tmp",
            self.settings,
            std::process::id()
        ));
        if let Err(err) = write_private(&path, &temp, &bytes, true) {
            tracing::debug!(file = %path.display(), error = %err, "cannot keep a compiled module on disk");
        }
    }
}

/// Whether a file of native code may be used: a regular file (not a link)
/// this user owns and no one else may write.
pub(crate) fn written_by_this_user(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    meta.is_file()
        && meta.uid() == nix::unistd::geteuid().as_raw()
        && meta.permissions().mode() & 0o022 == 0
}

/// Writes `bytes` to `path` through `temp`, a new file private to this user
/// renamed into place, so a reader never sees half a file; synced first
/// when `sync`. The temporary file is removed when anything fails.
pub(crate) fn write_private(
    path: &std::path::Path,
    temp: &std::path::Path,
    bytes: &[u8],
    sync: bool,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(temp)
        .and_then(|mut f| {
            f.write_all(bytes)?;
            if sync { f.sync_all() } else { Ok(()) }
        })
        .and_then(|()| std::fs::rename(temp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(temp);
    }
    written
}

/// Returns the allocator's free memory to the system (glibc keeps what a
/// compilation freed in its arenas; elsewhere this does nothing).
pub(crate) fn release_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        nix::libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wasm_stack_over_half_a_callers_stack_is_refused() {
        let options = |max_stack| EngineOptions {
            max_stack,
            ..EngineOptions::default()
        };
        let err = Engine::new(options(CALLER_STACK / 2 + 1)).expect_err("refused");
        assert!(err.to_string().contains("wasm stack"), "{err}");
        assert!(Engine::new(options(CALLER_STACK / 2)).is_ok());
    }
}
