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
//! * `event` — the event model: batches, changes, typed values, LSNs,
//!   offsets, and their text and JSON forms.
//! * `channel`, `digest`, `retry`, `console` — small tools: byte-bounded
//!   channels between stages, module digests, one back-off, standard output
//!   that notices a reader going away.
//! * `pg` — PostgreSQL primitives: connection strings, TLS, SQL
//!   connections, quoting, what errors mean.
//! * `config` — the configuration file.
//! * `checkpoint` — the state file: offsets, module versions, dead
//!   letters. It stores; it decides nothing.
//! * `source` — the replication source: slot, pgoutput, batches.
//! * `transform` — the WebAssembly runtime: modules, sandbox, ABI.
//! * `sink` — where transformed batches go.
//! * `daemon` — where the parts join: pipelines, feedback, the commit
//!   loop, hot swap, supervision.
//! * `admin` — the admin API over a running host.
//! * `golden` — golden-file tests of modules.
//! * `commands` — one file per command of the binary.
//!
//! The rooms are private. What the binary, the integration tests, the
//! benchmarks and the fuzz targets use is re-exported below, room by room;
//! everything else is the crate's own business.

// `pub` inside a room means "re-exported below"; the rest is `pub(crate)`.
#![warn(unreachable_pub)]

mod admin;
mod channel;
mod checkpoint;
mod commands;
mod config;
mod console;
mod daemon;
mod digest;
mod event;
mod golden;
mod pg;
mod retry;
mod sink;
mod source;
mod transform;

// The event model.
pub use event::json::{ReadError, read as read_json};
pub use event::{Batch, Change, Column, Lsn, Offset, Relation, ReplicaIdentity};

// Small tools.
pub use channel::{Receiver, Sender, channel};
pub use console::{LogWriter, closed as stdout_closed};

// Storage and configuration.
pub use checkpoint::Store;
pub use config::{Config, DEFAULT_CHUNK_ROWS, OnError};

// The replication source.
pub use source::catchup::CatchUp;
pub use source::check::{Target as CheckTarget, check_source};
pub use source::pgoutput::{DecodeError, Message as PgoutputMessage, decode as decode_pgoutput};
pub use source::stream::{SourceStats, run as run_source};
pub use source::{
    Prepared as PreparedSource, SourceConfig, SourceError, prepare as prepare_source,
};

// The WebAssembly runtime.
pub use transform::chain::ChainError;
pub use transform::compiler::{
    SUBCOMMAND as COMPILE_SUBCOMMAND, child_main as compile_child_main, compile_in_child_processes,
};
pub use transform::encode::{ChangeRef, Item, encode_input, to_wire};
pub use transform::engine::EngineOptions;
pub use transform::{Chain, Engine, Limits, Module, TransformError, Transformed, encode_config};

// Sinks.
pub use sink::http::HttpSink;
pub use sink::postgres::PostgresSink;
pub use sink::{Sink, SinkError};

// Where the parts join.
pub use daemon::Feedback;
pub use daemon::pipeline::{Handles, PipelineConfig, PipelineError, run as run_pipeline};

// The admin API.
pub use admin::openapi::ROUTES as ADMIN_ROUTES;
pub use admin::{Host, serve as serve_admin};

// Golden-file tests of modules.
pub use golden::fixture::ReadBatch;
pub use golden::{
    Actual, CONFIG_SUFFIX, DIR_CONFIG, EXPECTED_SUFFIX, Expected, INPUT_SUFFIX,
    Options as GoldenOptions, Outcome, run_suite,
};

// The host's stages one at a time, for `host/benches/stages.rs`.
#[doc(hidden)]
pub mod stages {
    use crate::event::{Batch, BatchLimits, Lsn};
    use crate::source::SourceError;
    use crate::source::assembler::Assembler;
    use crate::transform::Transformed;

    /// pgoutput messages into batches, as the source does them (built-in
    /// column types only: nothing asks the catalog).
    #[derive(Debug)]
    pub struct Assembling(Assembler);

    impl Assembling {
        /// Batches of at most `max_rows` changes and `max_bytes` bytes.
        pub fn new(max_rows: usize, max_bytes: usize) -> Assembling {
            Assembling(Assembler::new(
                BatchLimits {
                    max_rows,
                    max_bytes,
                },
                Lsn(0),
            ))
        }

        /// Decodes one message and feeds it on: a batch when one is done.
        pub fn feed(&mut self, message: &[u8]) -> Result<Option<Batch>, SourceError> {
            self.0.push(crate::source::pgoutput::decode(message)?)
        }
    }

    /// A group of batches as the file and stdout sinks write it: one JSON
    /// line per change, the key's column names beside each.
    pub fn render_jsonl(batches: &[Transformed], out: &mut Vec<u8>) {
        crate::sink::jsonl::render_group(batches, crate::sink::json::Columns::Key, out);
    }
}

// The commands of the binary.
pub use commands::cli::{Cli, Command, LogFormat};
pub use commands::demo::default_module;
pub use commands::{Outcome as CommandOutcome, dispatch, say};
