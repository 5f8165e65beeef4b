//! The WebAssembly transform runtime: modules written against ABI v1
//! (`docs/abi.md`), run sandboxed, one call per batch.
//!
//! Owns one wasmtime engine per host (cranelift, pooling allocator, epoch
//! interruption, optional fuel), compiling and pre-linking modules
//! ([`engine`], `module`; in a child process of the `datum` binary:
//! `compiler`), the sandbox they run in (`sandbox`, and WASI preview 1 as it
//! grants nothing: `wasi`), the
//! encoding of batches and decoding of results ([`encode`]), and chains of
//! modules ([`chain`]).
//!
//! Every call is bounded — time by a wall-clock deadline (checked at each
//! epoch tick while wasm runs; no function a module imports waits),
//! optionally fuel, memory by a store limiter, input and output sizes,
//! the wasm stack — and so is compiling a module (functions, locals, code
//! size, checked before compiling; compile time), and every breach is a
//! [`TransformError`] of its own kind. An instance that
//! trapped or breached a limit is discarded and the next call gets a fresh
//! one. The host never trusts a pointer or length a module returns, and never
//! panics, hangs or grows without bound because of a module.
//!
//! It does not own what happens after a failure (the pipeline's `on_error`),
//! nor where modules come from (configuration, hot swap).

pub(crate) mod chain;
pub(crate) mod compiler;
pub(crate) mod encode;
pub(crate) mod engine;
pub(crate) mod module;
mod sandbox;
mod wasi;

use std::time::Duration;

pub use chain::{Chain, Transformed};
pub use engine::Engine;
pub use module::Module;

/// Per-module limits, with safe defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Time per call, on the wall clock.
    pub timeout: Duration,
    /// Fuel per call (instructions, roughly), when the engine meters fuel.
    pub fuel: Option<u64>,
    /// Linear memory, in bytes.
    pub memory: usize,
    /// Largest input envelope, in bytes.
    pub max_input: usize,
    /// Largest output envelope, in bytes.
    pub max_output: usize,
    /// Largest module file, in bytes.
    pub max_module: usize,
    /// Bytes of stdout and of stderr kept per call.
    pub max_log: usize,
    /// Most functions (imported and defined) a module may have. Compiling
    /// costs time and memory per function, whatever its size.
    pub max_functions: u32,
    /// Most locals one function may declare.
    pub max_locals: u32,
    /// Most locals all of a module's functions may declare together.
    pub max_total_locals: u64,
    /// Largest code section (all function bodies), in bytes.
    pub max_code: usize,
    /// Longest a module may take to compile.
    pub compile_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            timeout: Duration::from_secs(1),
            fuel: None,
            memory: 64 << 20,
            max_input: 64 << 20,
            max_output: 64 << 20,
            max_module: 10 << 20,
            max_log: 64 << 10,
            max_functions: 100_000,
            max_locals: 50_000,
            max_total_locals: 1_000_000,
            max_code: 8 << 20,
            compile_timeout: Duration::from_secs(30),
        }
    }
}

/// A module's configuration table (TOML, from the pipeline's config) as the
/// MessagePack map `datum_init` receives (`docs/abi.md`, "Configuration"):
/// datetimes become their RFC 3339 text.
pub fn encode_config(table: &toml::Table) -> Vec<u8> {
    fn convert(value: &toml::Value) -> rmpv::Value {
        match value {
            toml::Value::String(s) => rmpv::Value::from(s.as_str()),
            toml::Value::Integer(i) => rmpv::Value::from(*i),
            toml::Value::Float(f) => rmpv::Value::from(*f),
            toml::Value::Boolean(b) => rmpv::Value::from(*b),
            toml::Value::Datetime(d) => rmpv::Value::from(d.to_string()),
            toml::Value::Array(items) => rmpv::Value::Array(items.iter().map(convert).collect()),
            toml::Value::Table(table) => table_value(table),
        }
    }
    fn table_value(table: &toml::Table) -> rmpv::Value {
        rmpv::Value::Map(
            table
                .iter()
                .map(|(k, v)| (rmpv::Value::from(k.as_str()), convert(v)))
                .collect(),
        )
    }
    let mut bytes = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut bytes, &table_value(table));
    bytes
}

/// Checks that a module file is WebAssembly's binary format (the runtime
/// also reads the text format, for tests), so that a wrong file gets a
/// plain answer instead of a parse error.
pub(crate) fn check_binary(bytes: &[u8]) -> Result<(), TransformError> {
    if bytes.starts_with(b"\0asm") {
        Ok(())
    } else {
        Err(TransformError::Invalid(
            "not a WebAssembly module (the file does not start with `\\0asm`); build one \
             with `cargo build --release --target wasm32-wasip1`"
                .into(),
        ))
    }
}

/// Why a module could not be loaded or did not transform a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransformError {
    /// The file is larger than `max_module`.
    #[error("module is {size} bytes, over the {limit}-byte limit (raise max_module_bytes)")]
    ModuleTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Over a limit on what compiling costs (functions, locals, code size),
    /// found before compiling, or compiling took longer than allowed.
    #[error("module is too costly to compile: {0}")]
    TooComplex(String),
    /// Not valid WebAssembly, or it imports what the host does not provide.
    #[error("module does not load: {0}")]
    Invalid(String),
    /// Exports do not follow ABI v1.
    #[error("module does not follow ABI v1: {0}")]
    AbiMismatch(String),
    /// `datum_init` refused the configuration.
    #[error("module initialisation failed: {0}")]
    Init(String),
    /// The call ran past its time limit.
    #[error("module ran past its {0:?} time limit")]
    Timeout(Duration),
    /// The call ran out of fuel.
    #[error("module ran out of fuel ({0} units)")]
    OutOfFuel(u64),
    /// The module tried to grow its memory past the limit.
    #[error("module tried to use more than {0} bytes of memory")]
    OutOfMemory(usize),
    /// The module trapped (a panic, `unreachable`, a stack overflow, ...).
    #[error("module trapped: {message}{}", backtrace.as_deref().map(|b| format!("\n{b}")).unwrap_or_default())]
    Trap {
        /// The trap, with the guest's panic message when it recorded one.
        message: String,
        /// The wasm backtrace, when available.
        backtrace: Option<String>,
    },
    /// The module answered with something that is not a valid envelope, or a
    /// pointer outside its memory.
    #[error("module returned invalid output: {0}")]
    InvalidOutput(String),
    /// The batch's envelope is larger than `max_input`.
    #[error("batch is {size} bytes encoded, over the {limit}-byte input limit")]
    InputTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The module's output is larger than `max_output`.
    #[error("module output is {size} bytes, over the {limit}-byte output limit")]
    OutputTooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// The module reported an error for the batch.
    #[error("module error{}: {message}", index.map(|i| format!(" at change {i}")).unwrap_or_default())]
    Guest {
        /// Its message.
        message: String,
        /// The input change at fault, if known.
        index: Option<u32>,
    },
}

impl TransformError {
    /// A short, stable name for the kind of failure (metrics, golden files).
    pub fn kind(&self) -> &'static str {
        match self {
            TransformError::ModuleTooLarge { .. } => "module_too_large",
            TransformError::TooComplex(_) => "module_too_complex",
            TransformError::Invalid(_) => "invalid_module",
            TransformError::AbiMismatch(_) => "abi_mismatch",
            TransformError::Init(_) => "init_failed",
            TransformError::Timeout(_) => "timeout",
            TransformError::OutOfFuel(_) => "out_of_fuel",
            TransformError::OutOfMemory(_) => "out_of_memory",
            TransformError::Trap { .. } => "trap",
            TransformError::InvalidOutput(_) => "invalid_output",
            TransformError::InputTooLarge { .. } => "input_too_large",
            TransformError::OutputTooLarge { .. } => "output_too_large",
            TransformError::Guest { .. } => "guest_error",
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn toml_configuration_becomes_a_msgpack_map() {
        let table: toml::Table = toml::from_str(
            "columns = [\"email\"]\nsalt = \"s\"\n[nested]\nn = 3\nat = 1979-05-27T07:32:00Z",
        )
        .expect("toml");
        let bytes = super::encode_config(&table);
        let value: serde_json::Value = rmp_serde::from_slice(&bytes).expect("msgpack");
        assert_eq!(
            value,
            serde_json::json!({
                "columns": ["email"],
                "salt": "s",
                "nested": {"n": 3, "at": "1979-05-27T07:32:00Z"}
            })
        );
    }
}
