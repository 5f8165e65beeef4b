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

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::TransformError;
use super::engine::{Engine, EngineOptions};

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
/// MAX_MEMORY`, the module on standard input, its compiled form on standard
/// output; an error on standard error and exit code 1.
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
    let engine = Engine::build(options, true).map_err(|e| e.to_string())?;
    let compiled = engine
        .inner
        .precompile_module(&wasm)
        .map_err(|e| format!("{e:#}"))?;
    let mut out = std::io::stdout().lock();
    out.write_all(&compiled)
        .and_then(|()| out.flush())
        .map_err(|e| format!("writing the compiled module: {e}"))
}

/// Compiles `wasm` in a child process, waiting at most `timeout`; `None`
/// when this process does not compile in children.
pub(crate) fn compile(
    engine: &Engine,
    wasm: &[u8],
    timeout: Duration,
) -> Option<Result<wasmtime::Module, TransformError>> {
    let executable = EXECUTABLE.get()?;
    Some(run_child(executable, engine, wasm, timeout))
}

fn run_child(
    executable: &PathBuf,
    engine: &Engine,
    wasm: &[u8],
    timeout: Duration,
) -> Result<wasmtime::Module, TransformError> {
    let options = engine.options;
    let began = std::time::Instant::now();
    let start =
        |e: std::io::Error| TransformError::Invalid(format!("starting the compiler process: {e}"));
    let mut child = Command::new(executable)
        .arg(SUBCOMMAND)
        .arg(u8::from(options.fuel).to_string())
        .arg(options.max_stack.to_string())
        .arg(options.max_instances.to_string())
        .arg(options.max_memory.to_string())
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
        "compiled a module in a child process"
    );
    // SAFETY: the bytes are what this same executable's
    // `Engine::precompile_module` wrote a moment ago, for an engine of
    // these same options; wasmtime also checks that they were compiled for
    // this engine's settings and version.
    unsafe { wasmtime::Module::deserialize(&engine.inner, &compiled) }
        .map_err(|e| TransformError::Invalid(format!("loading the compiled module: {e:#}")))
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
            let child = Engine::build(options, true).expect("child engine");
            let host = Engine::build(options, false).expect("host engine");
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
}
