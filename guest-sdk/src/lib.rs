//! `datum-guest`: write Datum transforms in Rust.
//!
//! This crate will hold the wire types shared with the host, the ABI glue
//! (only on `wasm32`) and test helpers. For now it only fixes the ABI version
//! that the host and the guests agree on.

/// The version of the host–guest ABI this SDK speaks (`datum_abi_v1`).
pub const ABI_VERSION: u32 = 1;
