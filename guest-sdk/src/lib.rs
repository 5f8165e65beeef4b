//! `datum-guest`: write Datum transforms in Rust.
//!
//! A transform is an ordinary Rust function with an attribute; the attribute
//! adds the WebAssembly exports of ABI v1 (`docs/abi.md`) when the crate is
//! built for `wasm32`, and nothing else, so the function stays plain Rust
//! that unit-tests natively with `cargo test`.
//!
//! ```
//! use datum_guest::{Change, Result, filter};
//!
//! /// Keeps the changes of every table but `public.audit`.
//! #[filter]
//! fn skip_audit(change: &Change) -> Result<bool> {
//!     Ok(change.qualified_table() != "public.audit")
//! }
//!
//! assert!(!skip_audit(&Change::insert("public", "audit")).unwrap());
//! ```
//!
//! A module has exactly one of:
//!
//! | attribute | signature | answers the host with |
//! | --- | --- | --- |
//! | [`#[filter]`](filter) | `fn(&Change) -> Result<bool>` | the kept changes' indexes |
//! | [`#[map]`](map) | `fn(Change) -> Result<Change>` or `Result<Option<Change>>` | each change (its index when unchanged); `None` drops it |
//! | [`#[flat_map]`](flat_map) | `fn(Change) -> Result<Vec<Change>>` | the changes (an index for each one equal to its input) |
//! | [`#[transform]`](transform) | `fn(Batch or LazyBatch) -> Result<Vec<Output>>` or `Result<Vec<Change>>` | the output as returned |
//!
//! and at most one [`#[init]`](init) `fn(Config) -> Result<()>`, which the
//! host calls once per instance with the module's configuration before any
//! batch. Keep what it reads in a `static` (`std::sync::OnceLock`), and the
//! logic in functions that take it as an argument, so tests can try several
//! configurations.
//!
//! `Result` is [`Result`] (any error type that converts into [`Error`] works
//! too). A `#[filter]`, `#[map]` or `#[flat_map]` error blames the change it
//! was given; a panic traps the module, and the host reports
//! `panicked at src/lib.rs:12:5: boom (change 3)`.
//!
//! Build the module with `cargo build --release --target wasm32-wasip1` and
//! `crate-type = ["cdylib", "rlib"]`; test its logic natively, and the whole
//! path from batch to envelope with [`testing`].

pub mod abi;
mod change;
mod config;
mod error;
#[cfg(target_arch = "wasm32")]
mod exports;
mod lazy;
mod msgpack;
pub mod testing;
mod value;
pub mod wire;

pub use config::Config;
pub use datum_guest_macros::{filter, flat_map, init, map, transform};
pub use error::{Context, Error, Result};
pub use lazy::LazyBatch;
pub use wire::{
    Batch, Change, Column, Date, Envelope, GuestError, Interval, LogicalMessage, Op, Output, Row,
    TableName, Timestamp, Truncate, Txn, Value,
};

/// The version of the host–guest ABI this SDK speaks (`datum_abi_v1`).
pub const ABI_VERSION: u32 = 1;

/// What the macros' generated code refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    pub use crate::abi::{
        FilterResult, FlatMapResult, InitResult, MapResult, TransformInput, TransformResult,
        filter, flat_map, init, map, transform,
    };
    #[cfg(target_arch = "wasm32")]
    pub use crate::exports::{init_entry, transform_entry};

    /// What a `#[filter]` function may take.
    #[diagnostic::on_unimplemented(
        message = "a `#[filter]` function takes `&Change`, not `{Self}`",
        label = "expected `&Change`"
    )]
    pub trait FilterArgument {}

    impl FilterArgument for &crate::Change {}

    /// What a `#[map]` or `#[flat_map]` function may take.
    #[diagnostic::on_unimplemented(
        message = "a `#[map]` or `#[flat_map]` function takes `Change`, not `{Self}`",
        label = "expected `Change`"
    )]
    pub trait ChangeArgument {}

    impl ChangeArgument for crate::Change {}

    /// What an `#[init]` function may take.
    #[diagnostic::on_unimplemented(
        message = "an `#[init]` function takes `Config`, not `{Self}`",
        label = "expected `Config`"
    )]
    pub trait InitArgument {}

    impl InitArgument for crate::Config {}
}
