//! Datum streams PostgreSQL changes through sandboxed WebAssembly transforms.
//!
//! The library holds everything the `datum` binary does, so that tests drive
//! it in-process. `docs/architecture.md` walks a batch through these rooms
//! and says where each rule of the delivery contract is kept.
//!
//! # Layout
//!
//! From the ground up; a room imports only rooms listed before it.
//!
//! * [`event`] — the event model: batches, changes, typed values, LSNs,
//!   offsets, and their text and JSON forms.
//! * `channel`, `digest`, `retry`, [`console`] — small tools: byte-bounded
//!   channels between stages, module digests, one back-off, standard output
//!   that notices a reader going away.
//! * [`pg`] — PostgreSQL primitives: connection strings, TLS, SQL
//!   connections, quoting, what errors mean.
//! * [`config`] — the configuration file.
//! * [`checkpoint`] — the state file: offsets, module versions, dead
//!   letters. It stores; it decides nothing.
//! * [`source`] — the replication source: slot, pgoutput, batches.
//! * [`transform`] — the WebAssembly runtime: modules, sandbox, ABI.
//! * [`sink`] — where transformed batches go.
//! * [`daemon`] — where the parts join: pipelines, feedback, the commit
//!   loop, hot swap, supervision.
//! * [`admin`] — the admin API over a running host.
//! * [`golden`] — golden-file tests of modules.
//! * [`commands`] — one file per command of the binary.

pub mod admin;
mod channel;
pub mod checkpoint;
pub mod commands;
pub mod config;
pub mod console;
pub mod daemon;
mod digest;
pub mod event;
pub mod golden;
pub mod pg;
mod retry;
pub mod sink;
pub mod source;
pub mod transform;

/// The byte-bounded channel the source sends batches on (tests drive the
/// source directly).
pub use channel::{Receiver, Sender, channel};
