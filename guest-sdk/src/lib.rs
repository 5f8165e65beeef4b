//! `datum-guest`: write Datum transforms in Rust.
//!
//! Holds the wire types shared with the host ([`wire`]); the ABI glue (only
//! on `wasm32`), the macros and the test helpers arrive with the WebAssembly
//! runtime.

pub mod wire;

pub use wire::{
    Batch, Change, Column, Date, Envelope, GuestError, Interval, LogicalMessage, Op, Output, Row,
    TableName, Timestamp, Truncate, Txn, Value,
};

/// The version of the host–guest ABI this SDK speaks (`datum_abi_v1`).
pub const ABI_VERSION: u32 = 1;
