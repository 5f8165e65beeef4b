//! A compiled, checked, pre-linked module, and the instance that runs it.
//!
//! Owns loading (size limit, the limits on what compiling costs, checked
//! before compiling, compilation on a thread of its own under a time limit,
//! ABI v1 exports, linking WASI preview 1 and nothing else), instantiation
//! (reactor initialiser, `datum_init` with the module's configuration), and
//! one call: copying the input in through `datum_alloc`, calling
//! `datum_transform` under a deadline, copying the result out through
//! bounds-checked reads, and classifying any failure. An instance is reused
//! across calls and discarded after any trap or limit breach.
//!
//! A call's time limit is a wall-clock deadline. Wasm code is stopped at the
//! first epoch tick past it (the epoch callback reads the wall clock, so a
//! late ticker does not stretch the limit). The functions a module may
//! import (`wasi.rs`) never wait and bound the work they do, so a call
//! cannot spend long outside wasm either: calls are plain synchronous calls
//! on the caller's thread, with no fiber to switch to and back per call
//! (docs/benchmarks.md, "Module calls without fibers").

use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{
    ExternType, InstancePre, Linker, Memory, Store, StoreLimits, StoreLimitsBuilder, TypedFunc,
    UpdateDeadline, ValType,
};

use super::engine::{EPOCH_TICK, Engine};
use super::sandbox::{CallEnv, Capture, escape_for_log};
use super::wasi::{Wasi, WasiView};
use super::{Limits, TransformError};

pub(crate) struct Ctx {
    wasi: Wasi,
    limits: StoreLimits,
    /// When the running call must have returned, on the wall clock.
    deadline: Instant,
}

impl WasiView for Ctx {
    fn wasi(&mut self) -> &mut Wasi {
        &mut self.wasi
    }

    fn deadline(&self) -> Instant {
        self.deadline
    }
}

/// A loaded module. Cheap to clone.
#[derive(Clone)]
pub struct Module {
    inner: Arc<ModuleInner>,
}

struct ModuleInner {
    name: String,
    engine: Engine,
    pre: InstancePre<Ctx>,
    limits: Limits,
    config: Vec<u8>,
    sha256: String,
    has_init: bool,
    has_panic_message: bool,
    has_initialize: bool,
    /// Exports `datum_schema_changes`: it is sent `schema` changes.
    schema_changes: bool,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("name", &self.inner.name)
            .field("sha256", &self.inner.sha256)
            .finish_non_exhaustive()
    }
}

/// What a call needs to know about its batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallMeta {
    /// The batch's commit time, µs since the Unix epoch: the realtime and
    /// monotonic clocks read it.
    pub commit_time: i64,
    /// The batch's commit LSN: seeds randomness, tags log lines.
    pub commit_lsn: u64,
    /// The chunk number: seeds randomness too.
    pub chunk: u32,
}

/// What a call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CallStats {
    /// Fuel consumed, when the engine meters it.
    pub fuel: Option<u64>,
}

fn signature(ty: &wasmtime::FuncType) -> (Vec<ValType>, Vec<ValType>) {
    (ty.params().collect(), ty.results().collect())
}

fn same(a: &[ValType], b: &[ValType]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| ValType::eq(x, y))
}

impl Module {
    /// Compiles and checks `wasm` (binary, or text in tests). `config` is the
    /// MessagePack map handed to `datum_init`.
    pub fn new(
        engine: &Engine,
        name: &str,
        wasm: &[u8],
        limits: Limits,
        config: Vec<u8>,
    ) -> Result<Module, TransformError> {
        if wasm.len() > limits.max_module {
            return Err(TransformError::ModuleTooLarge {
                size: wasm.len(),
                limit: limits.max_module,
            });
        }
        // The text format (tests) becomes the binary one, so that the same
        // counts apply to it.
        let binary = wat::parse_bytes(wasm).map_err(|e| TransformError::Invalid(e.to_string()))?;
        // Before the cache too: a module compiled under other limits must
        // still meet these.
        check_compile_cost(&binary, &limits)?;
        let sha256 = crate::digest::sha256_hex(wasm);
        let module = match engine.compiled(&sha256) {
            Some(module) => module,
            None => {
                let module = compile(engine, name, &binary, limits.compile_timeout)?;
                engine.keep_compiled(&sha256, &module);
                module
            }
        };
        let exports = check_exports(&module)?;

        let mut linker: Linker<Ctx> = Linker::new(&engine.inner);
        super::wasi::add_to_linker(&mut linker)
            .map_err(|e| TransformError::Invalid(format!("linking WASI: {e:#}")))?;
        let pre = linker.instantiate_pre(&module).map_err(|e| {
            TransformError::Invalid(format!(
                "{e:#} (a module may import only WASI preview 1 functions)"
            ))
        })?;
        Ok(Module {
            inner: Arc::new(ModuleInner {
                name: name.to_owned(),
                engine: engine.clone(),
                pre,
                limits,
                config,
                sha256,
                has_init: exports.init,
                has_panic_message: exports.panic_message,
                has_initialize: exports.initialize,
                schema_changes: exports.schema_changes,
            }),
        })
    }

    /// The same compiled module with another configuration (no
    /// recompilation): instances made from it pass `config` to `datum_init`.
    pub fn with_config(&self, config: Vec<u8>) -> Module {
        let inner = &self.inner;
        Module {
            inner: Arc::new(ModuleInner {
                name: inner.name.clone(),
                engine: inner.engine.clone(),
                pre: inner.pre.clone(),
                limits: inner.limits,
                config,
                sha256: inner.sha256.clone(),
                has_init: inner.has_init,
                has_panic_message: inner.has_panic_message,
                has_initialize: inner.has_initialize,
                schema_changes: inner.schema_changes,
            }),
        }
    }

    /// The module's name, as logs and errors show it.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The SHA-256 of the module's bytes, in hex.
    pub fn sha256(&self) -> &str {
        &self.inner.sha256
    }

    /// Whether the module understands `schema` changes (it exports
    /// `datum_schema_changes`); one that does not never receives them
    /// (`docs/abi.md`).
    pub fn sees_schema_changes(&self) -> bool {
        self.inner.schema_changes
    }

    /// The module's limits.
    pub fn limits(&self) -> Limits {
        self.inner.limits
    }

    /// An instance slot; the instance itself is created on first use.
    pub fn instance(&self) -> Instance {
        Instance {
            module: self.clone(),
            live: None,
        }
    }
}

/// Refuses a module (binary) whose compilation would cost more than its
/// limits allow, from what it declares: the number of functions, the locals
/// of each function and of all of them, and the size of its code. Reading
/// this is linear in the module's size and compiles nothing; compiling is
/// not (per function, per local), which is why a small module could
/// otherwise take minutes and gigabytes to compile.
fn check_compile_cost(wasm: &[u8], limits: &Limits) -> Result<(), TransformError> {
    use wasmparser::{Parser, Payload, TypeRef};
    let invalid = |e: wasmparser::BinaryReaderError| TransformError::Invalid(e.to_string());
    let too_many_functions = |functions: u64| {
        TransformError::TooComplex(format!(
            "{functions} functions, over the {}-function limit (raise max_functions)",
            limits.max_functions
        ))
    };
    let mut functions: u64 = 0;
    let mut imported: u64 = 0;
    let mut bodies: u64 = 0;
    let mut total_locals: u64 = 0;
    for payload in Parser::new(0).parse_all(wasm) {
        match payload.map_err(invalid)? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if matches!(
                        import.map_err(invalid)?.ty,
                        TypeRef::Func(_) | TypeRef::FuncExact(_)
                    ) {
                        functions += 1;
                        imported += 1;
                    }
                }
                if functions > u64::from(limits.max_functions) {
                    return Err(too_many_functions(functions));
                }
            }
            Payload::FunctionSection(reader) => {
                functions += u64::from(reader.count());
                if functions > u64::from(limits.max_functions) {
                    return Err(too_many_functions(functions));
                }
            }
            Payload::CodeSectionStart { count, size, .. } => {
                if imported + u64::from(count) > u64::from(limits.max_functions) {
                    return Err(too_many_functions(imported + u64::from(count)));
                }
                if size as usize > limits.max_code {
                    return Err(TransformError::TooComplex(format!(
                        "a {size}-byte code section, over the {}-byte limit (raise max_code)",
                        limits.max_code
                    )));
                }
            }
            Payload::CodeSectionEntry(body) => {
                let index = imported + bodies;
                bodies += 1;
                let reader = body.get_locals_reader().map_err(invalid)?;
                let declarations = reader.get_count();
                let mut locals: u64 = 0;
                for (n, declaration) in reader.into_iter().enumerate() {
                    locals += u64::from(declaration.map_err(invalid)?.0);
                    if locals > u64::from(limits.max_locals) {
                        let exact = if n + 1 == declarations as usize {
                            ""
                        } else {
                            "at least "
                        };
                        return Err(TransformError::TooComplex(format!(
                            "function {index} declares {exact}{locals} locals, over the {}-local \
                             limit (raise max_locals)",
                            limits.max_locals
                        )));
                    }
                }
                total_locals += locals;
                if total_locals > limits.max_total_locals {
                    return Err(TransformError::TooComplex(format!(
                        "its functions declare {total_locals} locals or more, over the {}-local \
                         limit for a module (raise max_total_locals)",
                        limits.max_total_locals
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// Compiles `wasm` on a thread of its own and waits at most `timeout`. A
/// compilation past its time is abandoned: it cannot be interrupted, so it
/// ends in the background and its result is dropped (the counts checked
/// before bound how long that takes).
fn compile(
    engine: &Engine,
    name: &str,
    wasm: &[u8],
    timeout: Duration,
) -> Result<wasmtime::Module, TransformError> {
    let functions = engine.functions_file(name);
    if let Some(compiled) = super::compiler::compile(engine, wasm, timeout, functions.as_deref()) {
        return compiled;
    }
    let (done, compiled) = std::sync::mpsc::sync_channel(1);
    let inner = engine.inner.clone();
    let wasm = wasm.to_vec();
    std::thread::Builder::new()
        .name("wasm-compile".into())
        .spawn(move || {
            let _ = done.send(wasmtime::Module::new(&inner, &wasm));
        })
        .map_err(|e| TransformError::Invalid(format!("starting the compiler thread: {e}")))?;
    match compiled.recv_timeout(timeout) {
        Ok(module) => module.map_err(|e| TransformError::Invalid(format!("{e:#}"))),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(TransformError::TooComplex(
            format!("compiling took longer than {timeout:?} (raise compile_timeout)"),
        )),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(TransformError::Invalid(
            "the compiler stopped without an answer".into(),
        )),
    }
}

#[derive(Default)]
struct Exports {
    init: bool,
    panic_message: bool,
    initialize: bool,
    schema_changes: bool,
}

fn check_exports(module: &wasmtime::Module) -> Result<Exports, TransformError> {
    use ValType::{I32, I64};
    let required: [(&str, &[ValType], &[ValType]); 4] = [
        ("datum_abi_v1", &[], &[]),
        ("datum_alloc", &[I32], &[I32]),
        ("datum_dealloc", &[I32, I32], &[]),
        ("datum_transform", &[I32, I32], &[I64]),
    ];
    let optional: [(&str, &[ValType], &[ValType]); 4] = [
        ("datum_init", &[I32, I32], &[I64]),
        ("datum_panic_message", &[], &[I64]),
        ("_initialize", &[], &[]),
        ("datum_schema_changes", &[], &[]),
    ];
    let mut found = Exports::default();
    let mut has_memory = false;
    let mut seen = std::collections::HashMap::new();
    let mut other_versions = Vec::new();
    for export in module.exports() {
        match export.ty() {
            ExternType::Func(ty) => {
                seen.insert(export.name().to_owned(), signature(&ty));
            }
            ExternType::Memory(_) if export.name() == "memory" => has_memory = true,
            _ => {}
        }
        if let Some(version) = export.name().strip_prefix("datum_abi_v")
            && version != "1"
        {
            other_versions.push(format!("v{version}"));
        }
    }
    if !seen.contains_key("datum_abi_v1") && !other_versions.is_empty() {
        return Err(TransformError::AbiMismatch(format!(
            "the module speaks ABI {}, this host loads v1: rebuild it with a matching SDK",
            other_versions.join(", ")
        )));
    }
    for (name, params, results) in required {
        match seen.get(name) {
            None => {
                return Err(TransformError::AbiMismatch(format!(
                    "missing export `{name}` (see docs/abi.md; with the Rust SDK, annotate one \
                     function with #[filter], #[map], #[flat_map] or #[transform])"
                )));
            }
            Some((p, r)) if !same(p, params) || !same(r, results) => {
                return Err(TransformError::AbiMismatch(format!(
                    "export `{name}` has signature {p:?} -> {r:?}, expected {params:?} -> {results:?}"
                )));
            }
            Some(_) => {}
        }
    }
    if !has_memory {
        return Err(TransformError::AbiMismatch(
            "missing exported memory `memory`".into(),
        ));
    }
    for (name, params, results) in optional {
        if let Some((p, r)) = seen.get(name) {
            if !same(p, params) || !same(r, results) {
                return Err(TransformError::AbiMismatch(format!(
                    "export `{name}` has signature {p:?} -> {r:?}, expected {params:?} -> {results:?}"
                )));
            }
            match name {
                "datum_init" => found.init = true,
                "datum_panic_message" => found.panic_message = true,
                "datum_schema_changes" => found.schema_changes = true,
                _ => found.initialize = true,
            }
        }
    }
    Ok(found)
}

struct Live {
    store: Store<Ctx>,
    memory: Memory,
    alloc: TypedFunc<i32, i32>,
    dealloc: TypedFunc<(i32, i32), ()>,
    transform: TypedFunc<(i32, i32), i64>,
    panic_message: Option<TypedFunc<(), i64>>,
    env: Arc<CallEnv>,
    stdout: Capture,
    stderr: Capture,
}

/// A module's instance slot: created on first use, reused across calls,
/// discarded after a trap or a limit breach.
pub struct Instance {
    module: Module,
    live: Option<Live>,
}

impl std::fmt::Debug for Instance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instance")
            .field("module", &self.module.inner.name)
            .field("live", &self.live.is_some())
            .finish()
    }
}

impl Instance {
    /// The module this instance runs.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// Whether a live instance exists (false after a failure, until the
    /// next call creates one).
    pub fn is_live(&self) -> bool {
        self.live.is_some()
    }

    /// Creates the live instance now, running `datum_init`, so that a
    /// configuration the module rejects shows before the first batch.
    pub fn warm(&mut self) -> Result<(), TransformError> {
        if self.live.is_none() {
            self.live = Some(self.instantiate()?);
        }
        Ok(())
    }

    /// Transforms one encoded batch; returns the encoded result envelope.
    pub fn call(
        &mut self,
        input: &[u8],
        meta: CallMeta,
    ) -> Result<(Vec<u8>, CallStats), TransformError> {
        let limits = self.module.inner.limits;
        if input.len() > limits.max_input {
            return Err(TransformError::InputTooLarge {
                size: input.len(),
                limit: limits.max_input,
            });
        }
        if self.live.is_none() {
            self.live = Some(self.instantiate()?);
        }
        let result = self.call_live(input, meta);
        self.forward_logs(meta);
        match result {
            Ok(output) => Ok(output),
            Err(err) => {
                // Whatever state the instance is in, it is not trusted again.
                self.live = None;
                Err(err)
            }
        }
    }

    fn instantiate(&self) -> Result<Live, TransformError> {
        let inner = &self.module.inner;
        let env = Arc::new(CallEnv::default());
        let stdout = Capture::new(inner.limits.max_log);
        let stderr = Capture::new(inner.limits.max_log);
        let ctx = Ctx {
            wasi: Wasi::new(&env, &stdout, &stderr),
            limits: StoreLimitsBuilder::new()
                .memory_size(inner.limits.memory)
                .instances(1)
                .memories(1)
                .tables(4)
                .trap_on_grow_failure(true)
                .build(),
            deadline: Instant::now(),
        };
        let mut store = Store::new(&inner.engine.inner, ctx);
        store.limiter(|ctx| &mut ctx.limits);
        // Called at every epoch tick while wasm runs: the deadline is on the
        // wall clock, whatever the ticker's pace.
        store.epoch_deadline_callback(|ctx| {
            Ok(if Instant::now() >= ctx.data().deadline {
                UpdateDeadline::Interrupt
            } else {
                UpdateDeadline::Continue(1)
            })
        });
        arm(&mut store, &inner.engine, inner.limits);
        let instance = inner
            .pre
            .instantiate(&mut store)
            .map_err(|e| classify(e, inner.limits, None))?;
        let func_err = |e: wasmtime::Error| TransformError::AbiMismatch(format!("{e:#}"));
        let memory = instance
            .get_memory(&mut store, "memory")
            .ok_or_else(|| TransformError::AbiMismatch("missing exported memory".into()))?;
        let alloc = instance
            .get_typed_func::<i32, i32>(&mut store, "datum_alloc")
            .map_err(func_err)?;
        let dealloc = instance
            .get_typed_func::<(i32, i32), ()>(&mut store, "datum_dealloc")
            .map_err(func_err)?;
        let transform = instance
            .get_typed_func::<(i32, i32), i64>(&mut store, "datum_transform")
            .map_err(func_err)?;
        let panic_message = if inner.has_panic_message {
            Some(
                instance
                    .get_typed_func::<(), i64>(&mut store, "datum_panic_message")
                    .map_err(func_err)?,
            )
        } else {
            None
        };
        let mut live = Live {
            store,
            memory,
            alloc,
            dealloc,
            transform,
            panic_message,
            env,
            stdout,
            stderr,
        };
        if inner.has_initialize {
            let init = instance
                .get_typed_func::<(), ()>(&mut live.store, "_initialize")
                .map_err(func_err)?;
            init.call(&mut live.store, ())
                .map_err(|e| classify(e, inner.limits, None))?;
        }
        if inner.has_init {
            let init = instance
                .get_typed_func::<(i32, i32), i64>(&mut live.store, "datum_init")
                .map_err(func_err)?;
            arm(&mut live.store, &inner.engine, inner.limits);
            let (ptr, len) = write_input(&mut live, &inner.config, inner.limits)?;
            let packed = init
                .call(&mut live.store, (ptr, len))
                .map_err(|e| failed_call(&mut live, e, inner.limits))?;
            if packed != 0 {
                let bytes = read_output(&mut live, packed, inner.limits)?;
                match super::encode::decode_envelope(bytes, super::encode::MIN_MOST_CHANGES) {
                    Ok(super::encode::Answer::Error(error)) => {
                        return Err(TransformError::Init(super::sandbox::guest_text(
                            &error.message,
                        )));
                    }
                    Ok(super::encode::Answer::Neither) => {}
                    Ok(super::encode::Answer::Changes(_)) => {
                        return Err(TransformError::InvalidOutput(
                            "datum_init answered with `changes`: it answers `{}` or an error"
                                .into(),
                        ));
                    }
                    Err(e) => {
                        return Err(TransformError::InvalidOutput(format!(
                            "datum_init returned an unreadable envelope: {e}"
                        )));
                    }
                }
            }
        }
        Ok(live)
    }

    fn call_live(
        &mut self,
        input: &[u8],
        meta: CallMeta,
    ) -> Result<(Vec<u8>, CallStats), TransformError> {
        let inner = &self.module.inner;
        let limits = inner.limits;
        let Some(live) = self.live.as_mut() else {
            return Err(TransformError::Invalid("no instance".into()));
        };
        live.env.prepare(meta.commit_time, seed(&inner.name, meta));
        arm(&mut live.store, &inner.engine, limits);
        // Asked only where fuel is metered: elsewhere the answer is an
        // error, made (and allocated) anew each time.
        let fuel_before = inner
            .engine
            .meters_fuel()
            .then(|| live.store.get_fuel().ok())
            .flatten();
        let (ptr, len) = write_input(live, input, limits)?;
        let packed = match live.transform.call(&mut live.store, (ptr, len)) {
            Ok(packed) => packed,
            Err(e) => return Err(failed_call(live, e, limits)),
        };
        let output = read_output(live, packed, limits)?;
        let fuel = fuel_before.and_then(|before| {
            let after = live.store.get_fuel().ok()?;
            Some(before.saturating_sub(after))
        });
        Ok((output, CallStats { fuel }))
    }

    fn forward_logs(&self, meta: CallMeta) {
        let Some(live) = self.live.as_ref() else {
            return;
        };
        let name = &self.module.inner.name;
        let lsn = crate::event::Lsn(meta.commit_lsn);
        for (stream, capture) in [("stdout", &live.stdout), ("stderr", &live.stderr)] {
            let captured = capture.drain();
            if captured.bytes.is_empty() && captured.dropped == 0 {
                continue;
            }
            for line in String::from_utf8_lossy(&captured.bytes).lines() {
                let line = escape_for_log(line);
                tracing::info!(module = %name, %lsn, stream, "{line}");
            }
            if captured.dropped > 0 {
                tracing::warn!(module = %name, %lsn, stream, dropped = captured.dropped, "module output over the cap was dropped");
            }
        }
    }
}

/// Sets the call's deadline and fuel.
fn arm(store: &mut Store<Ctx>, engine: &Engine, limits: Limits) {
    set_deadline(store, limits.timeout);
    if engine.meters_fuel() {
        let _ = store.set_fuel(limits.fuel.unwrap_or(u64::MAX));
    }
}

/// The call ends `timeout` from now, on the wall clock; the epoch callback
/// looks at the clock from the next tick on.
fn set_deadline(store: &mut Store<Ctx>, timeout: Duration) {
    // A year stands for "no limit", and keeps the sum representable.
    let timeout = timeout.min(Duration::from_secs(365 * 24 * 3600));
    store.data_mut().deadline = Instant::now() + timeout;
    store.set_epoch_deadline(1);
}

/// Deterministic per batch and module.
fn seed(name: &str, meta: CallMeta) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    h ^ meta.commit_lsn.rotate_left(17) ^ u64::from(meta.chunk).rotate_left(49)
}

fn write_input(
    live: &mut Live,
    input: &[u8],
    limits: Limits,
) -> Result<(i32, i32), TransformError> {
    let len = i32::try_from(input.len()).map_err(|_| TransformError::InputTooLarge {
        size: input.len(),
        limit: i32::MAX as usize,
    })?;
    let ptr = live
        .alloc
        .call(&mut live.store, len)
        .map_err(|e| classify(e, limits, None))?;
    if ptr == 0 && len > 0 {
        return Err(TransformError::InvalidOutput(
            "datum_alloc returned a null pointer".into(),
        ));
    }
    let start = ptr as u32 as usize;
    live.memory
        .write(&mut live.store, start, input)
        .map_err(|_| {
            TransformError::InvalidOutput(format!(
                "datum_alloc returned {start}, and {} bytes from there lie outside the module's \
                 memory",
                input.len()
            ))
        })?;
    Ok((ptr, len))
}

fn read_output(live: &mut Live, packed: i64, limits: Limits) -> Result<Vec<u8>, TransformError> {
    let packed = packed as u64;
    let ptr = (packed >> 32) as usize;
    let len = (packed & 0xffff_ffff) as usize;
    if len > limits.max_output {
        return Err(TransformError::OutputTooLarge {
            size: len,
            limit: limits.max_output,
        });
    }
    let data = live.memory.data(&live.store);
    let Some(bytes) = ptr.checked_add(len).and_then(|end| data.get(ptr..end)) else {
        return Err(TransformError::InvalidOutput(format!(
            "the result ({len} bytes at {ptr}) lies outside the module's {}-byte memory",
            data.len()
        )));
    };
    let output = bytes.to_vec();
    live.dealloc
        .call(&mut live.store, (ptr as i32, len as i32))
        .map_err(|e| classify(e, limits, None))?;
    Ok(output)
}

/// What a failed call of `datum_init` or `datum_transform` becomes: the
/// trap, with the module's panic message when it has one.
fn failed_call(live: &mut Live, e: wasmtime::Error, limits: Limits) -> TransformError {
    // A call stopped at its deadline: its time is up, and the module is
    // asked nothing more.
    let interrupted = matches!(
        e.downcast_ref::<wasmtime::Trap>(),
        Some(wasmtime::Trap::Interrupt)
    );
    let panic = live
        .panic_message
        .clone()
        .filter(|_| !interrupted)
        .and_then(|f| panic_message(&mut live.store, live.memory, f));
    classify(e, limits, panic)
}

/// Asks a trapped instance for its panic message, carefully: it may trap
/// again, or return garbage.
fn panic_message(store: &mut Store<Ctx>, memory: Memory, f: TypedFunc<(), i64>) -> Option<String> {
    set_deadline(store, 2 * EPOCH_TICK);
    let packed = f.call(&mut *store, ()).ok()? as u64;
    if packed == 0 {
        return None;
    }
    let (ptr, len) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
    let bytes = memory
        .data(&*store)
        .get(ptr..ptr.checked_add(len.min(4096))?)?;
    Some(String::from_utf8_lossy(bytes).into_owned())
}

fn classify(err: wasmtime::Error, limits: Limits, panic: Option<String>) -> TransformError {
    if let Some(trap) = err.downcast_ref::<wasmtime::Trap>() {
        match trap {
            wasmtime::Trap::Interrupt => return TransformError::Timeout(limits.timeout),
            wasmtime::Trap::OutOfFuel => {
                return TransformError::OutOfFuel(limits.fuel.unwrap_or(0));
            }
            _ => {}
        }
    }
    let text = format!("{err:#}");
    if text.contains("forcing trap when growing memory")
        || text.contains("forcing a memory growth failure")
    {
        return TransformError::OutOfMemory(limits.memory);
    }
    let backtrace = err
        .downcast_ref::<wasmtime::WasmBacktrace>()
        .map(|b| b.to_string());
    let trap = err
        .downcast_ref::<wasmtime::Trap>()
        .map(|t| t.to_string())
        .unwrap_or_else(|| err.root_cause().to_string());
    let message = match panic {
        Some(panic) => format!("{} ({trap})", super::sandbox::guest_text(&panic)),
        None => trap,
    };
    TransformError::Trap { message, backtrace }
}
