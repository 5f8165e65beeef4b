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
//! A table whose shape changed (a column added, dropped or retyped) sends a
//! `schema` change ([`Op::Schema`], [`Change::schema_change`]) before the
//! first row of its new shape. `#[filter]`, `#[map]` and `#[flat_map]`
//! functions do not see these: they pass through unchanged. To see them,
//! write the attribute as `#[filter(schema_changes)]` (or `#[map(...)]`,
//! `#[flat_map(...)]`); a `#[transform]` function sees every change.
//!
//! `Result` is [`Result`] (any error type that converts into [`Error`] works
//! too). A `#[filter]`, `#[map]` or `#[flat_map]` error blames the change it
//! was given; a panic traps the module, and the host reports
//! `panicked at src/lib.rs:12:5: boom (change 3)`.
//!
//! Build the module with `cargo build --release --target wasm32-wasip1` and
//! `crate-type = ["cdylib", "rlib"]`; test its logic natively, and the whole
//! path from batch to envelope with [`testing`] (which also shows a module
//! tested with its configuration: [`testing::run_init`], then
//! [`testing::run_map`]).
//!
//! # Memory
//!
//! Built for `wasm32`, the SDK installs the module's global allocator (the
//! default `arena` feature): the allocations of each call from the host
//! come from one region of 1 MiB, in order, and the region starts over when
//! the call ends with all of them freed, which is what decoding a batch,
//! building the output and dropping both leaves. That is cheaper than a
//! general allocator: the host's CPU per change through `mask_pii` fell by
//! about a tenth with it (docs/benchmarks.md, "Real modules, read directly
//! and allocated per call"). Memory a module keeps beyond a call (a cache in a
//! `static`) is never handed out again: while anything carved from the
//! region is held it only moves forward, and once full every allocation
//! goes to the general allocator, as it would without it. To bring your
//! own `#[global_allocator]`, depend on `datum-guest` with
//! `default-features = false`.
//!
//! # Values
//!
//! A change's rows (`change.new`, `change.old`, or [`Change::row`]) hold a
//! [`Value`] per column. Typed getters answer `None` for a missing column,
//! NULL or another type: [`Row::get_str`], [`Row::get_i64`],
//! [`Row::get_f64`], [`Row::get_bool`], [`Row::get_json`]..., or
//! [`Row::get`] and the `Value::as_*` methods ([`Value::as_numeric`],
//! [`Value::as_timestamp`]...). [`Change::set_column`] and [`Row::set`]
//! write anything that converts into a [`Value`].
//!
//! Reading costs what a module reads. A row from the host keeps each value
//! as the bytes it came in and decodes it the first time it is read (the
//! SDK checked, when it read the batch, that every value decodes, so a bad
//! one is still an error that names its change). A value the module never
//! changed, a column name it never renamed and a `columns` list it never
//! changed are written back as the bytes they came in; the changes of one
//! table share one `columns` list ([`Columns`]) until one of them changes
//! it. [`Row::fields`] and [`Row::get`] decode what they hand out;
//! [`Row::get_mut`], [`Row::set`] and [`Row::values_mut`] mark what they
//! hand out as changed.
//!
//! A `numeric` arrives as its exact decimal text (`"12.50"`, also `"NaN"`,
//! `"Infinity"` and `"-Infinity"`), never as a float. To compute with it,
//! turn on the `decimal` feature (`features = ["decimal"]` on the
//! `datum-guest` dependency): `numeric` values then read as `rust_decimal`'s
//! `Decimal` (re-exported as `datum_guest::Decimal`) with
//! `row.get_decimal("price")` or `value.to_decimal()`, exactly or with an
//! error (for `NaN`, the infinities and numbers beyond a `Decimal`'s 28 or
//! 29 digits), never rounded; and a `Decimal` converts back into a
//! `numeric` value, its scale kept:
//!
//! ```
//! # #[cfg(feature = "decimal")]
//! # fn main() -> datum_guest::Result<()> {
//! use datum_guest::{Change, Context, Result, Value, map, row};
//!
//! /// Adds `total = price × quantity + shipping` to each order.
//! #[map]
//! fn add_total(mut change: Change) -> Result<Change> {
//!     let Some(order) = change.new.as_ref() else {
//!         return Ok(change); // a delete
//!     };
//!     let price = order.get_decimal("price")?.context("no price")?;
//!     let quantity = order.get_decimal("quantity")?.context("no quantity")?; // an int4
//!     let shipping = order.get_decimal("shipping")?.unwrap_or_default(); // NULL: 0
//!     // `checked_*`: an overflow is an error, not a panic.
//!     let total = price
//!         .checked_mul(quantity)
//!         .and_then(|subtotal| subtotal.checked_add(shipping))
//!         .context("the total overflows")?;
//!     change.set_column("total", "numeric", total);
//!     Ok(change)
//! }
//!
//! let order = Change::insert("public", "orders")
//!     .column("price", "numeric", false)
//!     .column("quantity", "int4", false)
//!     .column("shipping", "numeric", false)
//!     .new_row(row! {
//!         "price" => Value::Numeric("0.70".into()),
//!         "quantity" => 3,
//!         "shipping" => Value::Numeric("0.10".into()),
//!     });
//! let order = add_total(order)?;
//! // 2.20 exactly (with `f64`: 2.1999999999999997).
//! let total = order.new.as_ref().and_then(|row| row.get("total"));
//! assert_eq!(total, Some(&Value::Numeric("2.20".into())));
//! # Ok(()) }
//! # #[cfg(not(feature = "decimal"))]
//! # fn main() {}
//! ```

pub mod abi;
#[cfg_attr(not(all(target_arch = "wasm32", feature = "arena")), allow(dead_code))]
mod arena;
mod change;
mod columns;
mod config;
#[cfg(feature = "decimal")]
mod decimal;
mod error;
#[cfg(target_arch = "wasm32")]
mod exports;
mod lazy;
mod msgpack;
mod read;
mod row;
pub mod testing;
mod value;
pub mod wire;
mod write;

pub use config::Config;
pub use datum_guest_macros::{filter, flat_map, init, map, transform};
pub use error::{Context, Error, Result};
pub use lazy::LazyBatch;
/// `rust_decimal`, the crate of [`Decimal`], for the rest of its API
/// (`RoundingStrategy`, `prelude::ToPrimitive`...) at the version the SDK
/// converts with. With the `decimal` feature.
#[cfg(feature = "decimal")]
pub use rust_decimal;
/// An exact decimal number: what a `numeric` value reads as with
/// [`Value::to_decimal`] and [`Row::get_decimal`], and converts back from.
/// With the `decimal` feature.
#[cfg(feature = "decimal")]
pub use rust_decimal::Decimal;
pub use wire::{
    Batch, Change, Column, Columns, Date, Envelope, Fields, GuestError, Interval, LogicalMessage,
    Op, Output, Row, SchemaChange, ShapeColumn, TableName, TableShape, Timestamp, Truncate, Txn,
    Value,
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
