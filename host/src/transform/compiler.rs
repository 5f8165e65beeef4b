//! Compiling a module in a child process of the `datum` binary.
//!
//! Owns the child's side (`datum __compile-module`, read the module on
//! standard input, write its compiled form on standard output) and the
//! parent's (start the child, bound it by the compile timeout, kill it past
//! that, load what it wrote). The compiler's code and working memory then
//! never enter the long-running host: its resident memory after a first
//! start is what a restart that loads compiled modules from disk has, and a
//! compilation past its time is killed rather than left to finish in the
//! background. Only the `datum` binary turns it on
//! ([`compile_in_child_processes`]); a library user compiles in process.
//!
//! A child also reuses compiled functions: given a file of the functions
//! compiled for the last build of the same module (by name, beside the
//! compiled modules), it compiles only the functions whose code is new and
//! writes the file again with this build's functions. A hot swap of a
//! module whose author changed a few functions, the SDK and libraries
//! unchanged, compiles those few.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use super::TransformError;
use super::engine::{Compiler, Engine, EngineOptions, write_private, written_by_this_user};
use crate::digest::sha256;

/// The hidden subcommand the child runs as.
pub const SUBCOMMAND: &str = "__compile-module";

/// The largest compiled module a child may answer with.
const MAX_COMPILED: u64 = 1 << 30;

static EXECUTABLE: OnceLock<PathBuf> = OnceLock::new();

/// Makes this process compile modules by running `executable`
/// (the `datum` binary itself) as a child per module.
pub fn compile_in_child_processes(executable: PathBuf) {
    let _ = EXECUTABLE.set(executable);
}

/// Whether this process compiles modules in child processes.
pub(crate) fn compiles_in_children() -> bool {
    EXECUTABLE.get().is_some()
}

/// The child: `datum __compile-module FUEL MAX_STACK MAX_INSTANCES
/// MAX_MEMORY [FUNCTIONS]`, the module on standard input, its compiled form
/// on standard output; an error on standard error and exit code 1.
/// FUNCTIONS is the file of compiled functions to reuse and rewrite.
pub fn child_main(args: &[String]) -> std::process::ExitCode {
    match child(args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{err}");
            std::process::ExitCode::from(1)
        }
    }
}

fn child(args: &[String]) -> Result<(), String> {
    let number = |i: usize| -> Result<u64, String> {
        args.get(i)
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| format!("{SUBCOMMAND}: argument {} missing or not a number", i + 1))
    };
    let options = EngineOptions {
        fuel: number(0)? != 0,
        max_stack: usize::try_from(number(1)?).map_err(|e| e.to_string())?,
        max_instances: u32::try_from(number(2)?).map_err(|e| e.to_string())?,
        max_memory: usize::try_from(number(3)?).map_err(|e| e.to_string())?,
    };
    let mut wasm = Vec::new();
    std::io::stdin()
        .read_to_end(&mut wasm)
        .map_err(|e| format!("reading the module: {e}"))?;
    let functions = args.get(4).map(|path| {
        let path = PathBuf::from(path);
        (
            Arc::new(FunctionCache::load(&path).unwrap_or_default()),
            path,
        )
    });
    let store = functions
        .as_ref()
        .map(|(cache, _)| Arc::clone(cache) as Arc<dyn wasmtime::CacheStore>);
    let engine = Engine::build(options, Compiler::Cranelift(store)).map_err(|e| e.to_string())?;
    let compiled = engine
        .inner
        .precompile_module(&wasm)
        .map_err(|e| format!("{e:#}"))?;
    if let Some((cache, path)) = functions {
        // Best effort: without the file the next build compiles everything.
        let _ = cache.save(&path);
        // What the parent logs.
        let (reused, made) = cache.counts();
        eprintln!("{reused} functions reused, {made} compiled");
    }
    let mut out = std::io::stdout().lock();
    out.write_all(&compiled)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the compiled module: {e}"))
}

/// Compiles `wasm` in a child process, waiting at most `timeout`, reusing
/// the compiled functions in `functions` (and rewriting it); `None` when
/// this process does not compile in children.
pub(crate) fn compile(
    engine: &Engine,
    wasm: &[u8],
    timeout: Duration,
    functions: Option<&Path>,
) -> Option<Result<wasmtime::Module, TransformError>> {
    let executable = EXECUTABLE.get()?;
    Some(run_child(executable, engine, wasm, timeout, functions))
}

fn run_child(
    executable: &PathBuf,
    engine: &Engine,
    wasm: &[u8],
    timeout: Duration,
    functions: Option<&Path>,
) -> Result<wasmtime::Module, TransformError> {
    let options = engine.options;
    let began = std::time::Instant::now();
    let start =
        |e: std::io::Error| TransformError::Invalid(format!("starting the compiler process: {e}"));
    let mut command = Command::new(executable);
    command
        .arg(SUBCOMMAND)
        .arg(u8::from(options.fuel).to_string())
        .arg(options.max_stack.to_string())
        .arg(options.max_instances.to_string())
        .arg(options.max_memory.to_string());
    // The child reads its arguments as UTF-8: a path that is not is left
    // out (every function is then compiled).
    if let Some(functions) = functions.and_then(Path::to_str) {
        command.arg(functions);
    }
    let mut child = command
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(start)?;
    let (Some(mut stdin), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        let _ = child.kill();
        let _ = child.wait();
        return Err(TransformError::Invalid(
            "the compiler process has no pipes".into(),
        ));
    };
    // Writing, reading and waiting on threads of their own: the parent
    // only waits for the answer, up to the timeout.
    let wasm_len = wasm.len();
    let wasm = wasm.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&wasm));
    let (done, answer) = std::sync::mpsc::sync_channel(1);
    let reader = std::thread::spawn(move || {
        let mut compiled = Vec::new();
        let mut message = String::new();
        let read = stdout.take(MAX_COMPILED).read_to_end(&mut compiled);
        let _ = stderr.take(64 << 10).read_to_string(&mut message);
        let _ = done.send((read.map(|_| compiled), message));
    });
    let outcome = answer.recv_timeout(timeout);
    if outcome.is_err() {
        let _ = child.kill();
    }
    let status = child.wait();
    let _ = writer.join();
    let _ = reader.join();
    let (compiled, message) = match outcome {
        Ok(answer) => answer,
        Err(_) => {
            return Err(TransformError::TooComplex(format!(
                "compiling took longer than {timeout:?} (raise compile_timeout)"
            )));
        }
    };
    let compiled = compiled
        .map_err(|e| TransformError::Invalid(format!("reading the compiled module: {e}")))?;
    match status {
        Ok(status) if status.success() => {}
        Ok(_) if !message.trim().is_empty() => {
            return Err(TransformError::Invalid(message.trim().to_owned()));
        }
        Ok(status) => {
            return Err(TransformError::Invalid(format!(
                "the compiler process ended with {status}"
            )));
        }
        Err(e) => {
            return Err(TransformError::Invalid(format!(
                "waiting for the compiler process: {e}"
            )));
        }
    }
    tracing::info!(
        module_bytes = wasm_len,
        compiled_bytes = compiled.len(),
        ms = began.elapsed().as_millis() as u64,
        functions = message.trim(),
        "compiled a module in a child process"
    );
    // SAFETY: the bytes are what this same executable's
    // `Engine::precompile_module` wrote a moment ago, for an engine of
    // these same options; wasmtime also checks that they were compiled for
    // this engine's settings and version.
    unsafe { wasmtime::Module::deserialize(&engine.inner, &compiled) }
        .map_err(|e| TransformError::Invalid(format!("loading the compiled module: {e:#}")))
}

/// The compiled functions a child may reuse, and those its compilation
/// used or made: a [`wasmtime::CacheStore`] over one file, read whole
/// before compiling and written whole after.
///
/// The file holds native code the host will run, so it is read only when
/// this user owns it and no one else may write it (the directory is the
/// private one of the compiled modules), and written as a new private file
/// renamed into place. Its SHA-256 leads it, checked before anything in it
/// is used, so a file a crash left half written is never read as code; it
/// is not synced to disk, which would hold up the hot swap. A file that
/// cannot be read or checked only means compiling every function.
#[derive(Debug, Default)]
struct FunctionCache {
    known: HashMap<Vec<u8>, Vec<u8>>,
    reused: Mutex<HashSet<Vec<u8>>>,
    made: Mutex<HashMap<Vec<u8>, Vec<u8>>>,
}

/// The first bytes of a functions file (its format's version).
const FUNCTIONS_MAGIC: &[u8; 8] = b"datumfn1";

/// The largest functions file read.
const MAX_FUNCTIONS_FILE: u64 = 256 << 20;

impl FunctionCache {
    fn load(path: &Path) -> Option<FunctionCache> {
        let file = std::fs::File::open(path).ok()?;
        let meta = file.metadata().ok()?;
        if !written_by_this_user(&meta) || meta.len() > MAX_FUNCTIONS_FILE {
            return None;
        }
        let mut bytes = Vec::new();
        file.take(MAX_FUNCTIONS_FILE).read_to_end(&mut bytes).ok()?;
        let (digest, mut rest) = bytes
            .strip_prefix(FUNCTIONS_MAGIC.as_slice())?
            .split_first_chunk::<32>()?;
        if sha256(rest) != *digest {
            return None;
        }
        let mut known = HashMap::new();
        let field = |rest: &mut &[u8]| -> Option<Vec<u8>> {
            let (len, tail) = rest.split_first_chunk::<4>()?;
            let len = usize::try_from(u32::from_le_bytes(*len)).ok()?;
            let (value, tail) = (tail.get(..len)?, tail.get(len..)?);
            *rest = tail;
            Some(value.to_vec())
        };
        while !rest.is_empty() {
            let key = field(&mut rest)?;
            let value = field(&mut rest)?;
            known.insert(key, value);
        }
        Some(FunctionCache {
            known,
            ..FunctionCache::default()
        })
    }

    /// How many functions this compilation reused, and how many it
    /// compiled (and kept).
    fn counts(&self) -> (usize, usize) {
        let reused = self.reused.lock().unwrap_or_else(|p| p.into_inner());
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        (
            reused.iter().filter(|k| !made.contains_key(*k)).count(),
            made.len(),
        )
    }

    /// Writes the functions this compilation reused or made, and only
    /// those: the file holds one build's functions, whatever came before.
    fn save(&self, path: &Path) -> std::io::Result<()> {
        let reused = self.reused.lock().unwrap_or_else(|p| p.into_inner());
        let made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        let mut body = Vec::new();
        let kept = reused
            .iter()
            .filter(|key| !made.contains_key(*key))
            .filter_map(|key| Some((key, self.known.get(key)?)))
            .chain(made.iter());
        for (key, value) in kept {
            for field in [key, value] {
                let len = u32::try_from(field.len()).map_err(std::io::Error::other)?;
                body.extend_from_slice(&len.to_le_bytes());
                body.extend_from_slice(field);
            }
        }
        let mut out = FUNCTIONS_MAGIC.to_vec();
        out.extend_from_slice(&sha256(&body));
        out.extend_from_slice(&body);
        let temp = path.with_extension(format!("{}.tmp", std::process::id()));
        write_private(path, &temp, &out, false)
    }
}

impl wasmtime::CacheStore for FunctionCache {
    fn get(&self, key: &[u8]) -> Option<Cow<'_, [u8]>> {
        let value = self.known.get(key)?;
        self.reused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_vec());
        Some(Cow::Borrowed(value))
    }

    fn insert(&self, key: &[u8], value: Vec<u8>) -> bool {
        self.made
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.to_vec(), value);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The host's engine has no compiler when children compile: what a
    /// child's engine (same options, with a compiler) wrote must load into
    /// it and run, with fuel metered or not.
    #[test]
    fn an_engine_without_a_compiler_runs_what_a_child_engine_compiled() {
        let wasm = wat::parse_str(r#"(module (func (export "seven") (result i32) i32.const 7))"#)
            .expect("test module");
        for fuel in [false, true] {
            let options = EngineOptions {
                fuel,
                ..EngineOptions::default()
            };
            let child = Engine::build(options, Compiler::Cranelift(None)).expect("child engine");
            let host = Engine::build(options, Compiler::None).expect("host engine");
            assert!(
                host.inner.precompile_module(&wasm).is_err(),
                "the host's engine must not compile"
            );
            let compiled = child.inner.precompile_module(&wasm).expect("compiled");
            // SAFETY: compiled just above by an engine of the same options.
            let module = unsafe { wasmtime::Module::deserialize(&host.inner, &compiled) }
                .expect("loads into the engine without a compiler");
            let mut store = wasmtime::Store::new(&host.inner, ());
            store.set_epoch_deadline(1_000);
            if fuel {
                store.set_fuel(1_000).expect("fuel");
            }
            let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
            let seven = instance
                .get_typed_func::<(), i32>(&mut store, "seven")
                .expect("export");
            assert_eq!(seven.call(&mut store, ()).expect("runs"), 7);
        }
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("datum-functions-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        dir
    }

    fn three(second: i32) -> Vec<u8> {
        wat::parse_str(format!(
            r#"(module
                 (func (export "one") (result i32) i32.const 1)
                 (func (export "two") (result i32) i32.const {second})
                 (func (export "three") (result i32) i32.const 3 i32.const 0 i32.add))"#
        ))
        .expect("test module")
    }

    /// Compiles `wasm` as a child does with the functions file `path`, then
    /// runs export `name` in an engine without a compiler.
    fn compile_reusing(path: &Path, wasm: &[u8], name: &str) -> ((usize, usize), i32) {
        let cache = Arc::new(FunctionCache::load(path).unwrap_or_default());
        let options = EngineOptions::default();
        let child =
            Engine::build(options, Compiler::Cranelift(Some(cache.clone()))).expect("child engine");
        let compiled = child.inner.precompile_module(wasm).expect("compiled");
        cache.save(path).expect("saved");
        let host = Engine::build(options, Compiler::None).expect("host engine");
        // SAFETY: compiled just above by an engine of the same options.
        let module =
            unsafe { wasmtime::Module::deserialize(&host.inner, &compiled) }.expect("loads");
        let mut store = wasmtime::Store::new(&host.inner, ());
        store.set_epoch_deadline(1_000);
        let instance = wasmtime::Instance::new(&mut store, &module, &[]).expect("instantiates");
        let f = instance
            .get_typed_func::<(), i32>(&mut store, name)
            .expect("export");
        (cache.counts(), f.call(&mut store, ()).expect("runs"))
    }

    /// A new build compiles only the functions whose code changed, and
    /// what it reuses runs as compiled.
    #[test]
    fn a_new_build_compiles_only_the_functions_that_changed() {
        let dir = scratch("reuse");
        let path = dir.join("functions.bin");
        let ((reused, made), one) = compile_reusing(&path, &three(2), "one");
        assert_eq!((reused, one), (0, 1), "nothing to reuse the first time");
        assert!(made >= 3, "{made} functions compiled");
        let ((reused, made_again), two) = compile_reusing(&path, &three(20), "two");
        assert_eq!(two, 20, "the changed function is the new one");
        assert!(reused >= 2, "{reused} reused");
        assert!(made_again < made, "{made_again} compiled again of {made}");
        let ((_, _), three_) = compile_reusing(&path, &three(20), "three");
        assert_eq!(three_, 3);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The file keeps one build's functions: those of an older build that
    /// the last one did not use are dropped.
    #[test]
    fn a_functions_file_holds_only_the_last_builds_functions() {
        let dir = scratch("last");
        let path = dir.join("functions.bin");
        let mut known = HashMap::new();
        known.insert(b"used".to_vec(), b"1".to_vec());
        known.insert(b"stale".to_vec(), b"2".to_vec());
        let cache = FunctionCache {
            known,
            ..FunctionCache::default()
        };
        use wasmtime::CacheStore;
        assert_eq!(cache.get(b"used").as_deref(), Some(b"1".as_slice()));
        assert!(cache.get(b"absent").is_none());
        assert!(cache.insert(b"new", b"3".to_vec()));
        assert_eq!(cache.counts(), (1, 1));
        cache.save(&path).expect("saved");
        let loaded = FunctionCache::load(&path).expect("loads");
        let mut keys: Vec<_> = loaded.known.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, [b"new".to_vec(), b"used".to_vec()]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A functions file is native code to be: one that others may write,
    /// one cut short, one with a byte changed and one of another format are
    /// not used.
    #[test]
    fn a_functions_file_others_may_write_or_that_is_damaged_is_not_used() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("untrusted");
        let path = dir.join("functions.bin");
        let cache = FunctionCache::default();
        use wasmtime::CacheStore;
        cache.insert(b"key", vec![7; 100]);
        cache.save(&path).expect("saved");
        assert!(FunctionCache::load(&path).is_some());
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        assert!(FunctionCache::load(&path).is_none(), "writable by others");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..bytes.len() - 10]).expect("cut");
        assert!(FunctionCache::load(&path).is_none(), "cut short");
        let mut flipped = bytes.clone();
        if let Some(last) = flipped.last_mut() {
            *last ^= 1;
        }
        std::fs::write(&path, &flipped).expect("flip");
        assert!(FunctionCache::load(&path).is_none(), "a byte changed");
        std::fs::write(&path, &bytes).expect("restore");
        assert!(FunctionCache::load(&path).is_some(), "restored");
        std::fs::write(&path, b"datumfn0").expect("other format");
        assert!(FunctionCache::load(&path).is_none(), "another format");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
