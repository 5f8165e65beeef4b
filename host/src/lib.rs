//! Datum streams PostgreSQL changes through sandboxed WebAssembly transforms.
//!
//! The library holds everything the `datum` binary does, so that tests drive
//! it in-process. See `DESIGN.md` for the architecture and the delivery
//! contract.

pub mod admin;
pub mod admin_client;
pub mod batch;
pub mod budget;
pub mod checkpoint;
pub mod config;
pub mod console;
pub mod demo;
pub mod feedback;
pub mod golden;
pub mod hotswap;
pub mod json;
pub mod pipeline;
pub mod record;
pub mod run;
pub mod scaffold;
pub mod sink;
pub mod source;
pub mod throwaway;
pub mod transform;
