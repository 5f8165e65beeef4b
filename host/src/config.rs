//! The host's configuration file (`docs/config.md`): one TOML file, several
//! pipelines.
//!
//! Owns the file's schema, its defaults, `${VAR}` interpolation from the
//! environment (for secrets: the file can be committed, the password stays
//! in the environment), and validation that names the key and the line of
//! what is wrong. It turns the file into the typed settings the source,
//! transforms and sinks take; it does not start anything.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Deserializer};

use crate::event::BatchLimits;
use crate::transform::Limits;

/// Why the configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file cannot be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        source: std::io::Error,
    },
    /// The file is not valid, with the line and key.
    #[error("{}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// toml's report (line, column, the line itself) and ours.
        message: String,
    },
}

/// The whole file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The state file (offsets, modules, dead letters). Relative paths are
    /// relative to the configuration file's directory.
    #[serde(default = "default_state")]
    pub state: Text,
    /// The pipelines, `[[pipeline]]` tables.
    #[serde(default)]
    pub pipeline: Vec<PipelineSpec>,
    /// `[admin]`: the admin API, off unless present (docs/admin.md).
    pub admin: Option<AdminSpec>,
}

fn default_state() -> Text {
    Text("datum-state.redb".into())
}

/// `[admin]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminSpec {
    /// Where to listen.
    #[serde(default = "default_listen")]
    pub listen: Listen,
    /// The bearer token (else `DATUM_ADMIN_TOKEN`, else a generated one).
    pub token: Option<Text>,
    /// Where a generated token is written; default: the state file's path
    /// with `.admin-token` appended.
    pub token_file: Option<Text>,
    /// The largest upload body.
    #[serde(default = "default_max_upload")]
    pub max_upload: Size,
    /// How long any request may take.
    #[serde(default = "default_request_timeout")]
    pub request_timeout: Span,
    /// How long a client may take to send a request's headers (an idle
    /// kept-alive connection is closed after as long).
    #[serde(default = "default_header_timeout")]
    pub header_timeout: Span,
    /// The most connections served at once; more are refused.
    #[serde(default = "default_max_connections")]
    pub max_connections: Count,
}

fn default_listen() -> Listen {
    Listen(std::net::SocketAddr::from(([127, 0, 0, 1], 7070)))
}

fn default_max_upload() -> Size {
    Size(10 << 20)
}

fn default_request_timeout() -> Span {
    Span(Duration::from_secs(30))
}

fn default_header_timeout() -> Span {
    Span(Duration::from_secs(10))
}

fn default_max_connections() -> Count {
    Count(256)
}

/// A socket address, `"127.0.0.1:7070"` or `"[::1]:7070"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Listen(pub std::net::SocketAddr);

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Listen, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map(Listen).map_err(|_| {
            de::Error::custom(format!(
                "`{text}` is not an address and port: write one like \"127.0.0.1:7070\""
            ))
        })
    }
}

impl AdminSpec {
    /// The token file: as configured, or beside the state file.
    pub fn token_file(&self, state: &str) -> std::path::PathBuf {
        self.token_file.as_ref().map_or_else(
            || std::path::PathBuf::from(format!("{state}.admin-token")),
            |t| std::path::PathBuf::from(&t.0),
        )
    }
}

/// One `[[pipeline]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// Its name: the key of its checkpoint, and a label in logs.
    pub name: Name,
    /// `[pipeline.source]`.
    pub source: SourceSpec,
    /// `[[pipeline.transforms]]`, run in order.
    #[serde(default)]
    pub transforms: Vec<TransformSpec>,
    /// `[pipeline.sink]`.
    pub sink: SinkSpec,
    /// `[pipeline.batch]`.
    #[serde(default)]
    pub batch: BatchSpec,
    /// `[pipeline.snapshot]`.
    #[serde(default)]
    pub snapshot: SnapshotSpec,
    /// What a module failure does.
    #[serde(default)]
    pub on_error: OnError,
    /// Batches in flight between stages (source → transforms → sink).
    #[serde(default = "default_in_flight")]
    pub in_flight: Count,
    /// How long the checkpoint commit waits for more acknowledgements
    /// before committing ("0ms": commit at once).
    #[serde(default)]
    pub group_commit: GroupCommit,
    /// On shutdown, how long the pipeline may take to deliver and
    /// checkpoint what is in flight; past it the host exits non-zero and the
    /// rest is delivered again on the next start.
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout: Span,
}

fn default_in_flight() -> Count {
    Count(4)
}

fn default_drain_timeout() -> Span {
    Span(Duration::from_secs(10))
}

/// `group_commit`: a duration, or `"off"` (commit as soon as a batch is
/// acknowledged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupCommit(pub Duration);

/// How long a checkpoint waits for more acknowledgements to share its
/// commit, unless `group_commit` says otherwise.
pub(crate) const DEFAULT_GROUP_COMMIT: Duration = Duration::from_millis(5);

impl Default for GroupCommit {
    fn default() -> Self {
        GroupCommit(DEFAULT_GROUP_COMMIT)
    }
}

impl<'de> Deserialize<'de> for GroupCommit {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<GroupCommit, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.trim() == "off" {
            return Ok(GroupCommit(Duration::ZERO));
        }
        text.parse::<Span>()
            .map(|span| GroupCommit(span.0))
            .map_err(|err| de::Error::custom(format!("{err}, or \"off\"")))
    }
}

/// `[pipeline.source]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SourceSpec {
    /// Connection string (`postgres://` URL or `key=value` pairs); use
    /// `${VAR}` for the password.
    pub url: Text,
    /// The publication; `datum_<pipeline>` by default.
    pub publication: Option<Name>,
    /// The replication slot; `datum_<pipeline>` by default.
    pub slot: Option<Name>,
    /// Tables to publish (`schema.table`, or `table` in `public`); with none,
    /// the publication must exist.
    #[serde(default)]
    pub tables: Vec<Text>,
    /// When Datum creates the publication: partitions under the root's name.
    #[serde(default)]
    pub publish_via_partition_root: bool,
    /// Terminate a walsender that still holds the slot after a crash.
    #[serde(default = "yes")]
    pub terminate_stale_holder: bool,
    /// Recreate a lost slot and start over (the target then needs a resync).
    #[serde(default)]
    pub recreate_slot: bool,
    /// Stream from an existing slot that the state file has no record of
    /// (a new state file for a slot made by hand or by another host).
    #[serde(default)]
    pub adopt_slot: bool,
    /// Stream only while this host holds the pipeline's leader lock on the
    /// source (several hosts with the same pipeline: one streams, the
    /// others stand by; `docs/scaling.md`).
    #[serde(default)]
    pub leader_lock: bool,
    /// Capture DDL statements into the stream, in commit order, with an
    /// event trigger that Datum installs when permitted (`docs/schema.md`).
    #[serde(default)]
    pub capture_ddl: bool,
    /// Drain the slot through the SQL interface while it is further behind
    /// the server than this (`docs/source.md`, "Catch-up"), or `"off"`.
    #[serde(default)]
    pub catch_up: CatchUpSpec,
}

/// `catch_up`: bytes of WAL (`"256MiB"`), or `"off"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CatchUpSpec(pub Option<u64>);

/// Off unless configured: on the machines measured, Datum's streaming
/// drained a backlog faster (`docs/benchmarks.md`, "Catch-up").
impl Default for CatchUpSpec {
    fn default() -> Self {
        CatchUpSpec(None)
    }
}

impl<'de> Deserialize<'de> for CatchUpSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<CatchUpSpec, D::Error> {
        let bad = |what: &str| {
            de::Error::custom(format!(
                "`{what}` is not a size of WAL: write bytes, or a number and a unit, like \
                 \"256MiB\", or \"off\""
            ))
        };
        match RawSize::deserialize(deserializer)? {
            RawSize::Int(n) => u64::try_from(n)
                .map(|n| CatchUpSpec(Some(n)))
                .map_err(|_| bad(&n.to_string())),
            RawSize::Text(text) if text.trim() == "off" => Ok(CatchUpSpec(None)),
            RawSize::Text(text) => parse_size(&text)
                .map(|n| CatchUpSpec(Some(n as u64)))
                .ok_or_else(|| bad(&text)),
        }
    }
}

fn yes() -> bool {
    true
}

/// `[[pipeline.transforms]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransformSpec {
    /// The `.wasm` file; relative to the configuration file's directory.
    pub module: Text,
    /// A name for logs and the admin API; the file's stem by default.
    pub name: Option<Name>,
    /// The table handed to the module's `datum_init`.
    #[serde(default)]
    pub config: toml::Table,
    /// `[pipeline.transforms.limits]`.
    #[serde(default)]
    pub limits: LimitsSpec,
}

/// A module's limits; each defaults to the runtime's.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsSpec {
    /// Time per batch, on the wall clock (`"1s"`, `"250ms"`).
    pub timeout: Option<Span>,
    /// Fuel per batch (turns on fuel metering for the host).
    pub fuel: Option<u64>,
    /// Linear memory (`"64MiB"`).
    pub memory: Option<Size>,
    /// Largest encoded batch.
    pub max_input: Option<Size>,
    /// Largest encoded output.
    pub max_output: Option<Size>,
    /// Largest module file.
    pub max_module: Option<Size>,
    /// Most functions in a module.
    pub max_functions: Option<Count>,
    /// Most locals in one function.
    pub max_locals: Option<Count>,
    /// Most locals in all of a module's functions.
    pub max_total_locals: Option<Count>,
    /// Largest code section (`"8MiB"`).
    pub max_code: Option<Size>,
    /// Longest compilation (`"30s"`).
    pub compile_timeout: Option<Span>,
}

impl LimitsSpec {
    /// The runtime limits these settings give.
    pub fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            timeout: self.timeout.map_or(d.timeout, |s| s.0),
            fuel: self.fuel,
            memory: self.memory.map_or(d.memory, |s| s.0),
            max_input: self.max_input.map_or(d.max_input, |s| s.0),
            max_output: self.max_output.map_or(d.max_output, |s| s.0),
            max_module: self.max_module.map_or(d.max_module, |s| s.0),
            max_log: d.max_log,
            max_functions: self
                .max_functions
                .map_or(d.max_functions, |c| u32::try_from(c.0).unwrap_or(u32::MAX)),
            max_locals: self
                .max_locals
                .map_or(d.max_locals, |c| u32::try_from(c.0).unwrap_or(u32::MAX)),
            max_total_locals: self
                .max_total_locals
                .map_or(d.max_total_locals, |c| c.0 as u64),
            max_code: self.max_code.map_or(d.max_code, |s| s.0),
            compile_timeout: self.compile_timeout.map_or(d.compile_timeout, |s| s.0),
        }
    }
}

/// `[pipeline.batch]`: when a large transaction is cut into chunks.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSpec {
    /// Most changes per batch.
    pub max_rows: Option<Count>,
    /// Most bytes of row data per batch (`"8MiB"`).
    pub max_bytes: Option<Size>,
}

impl BatchSpec {
    /// The source's batch limits.
    pub fn limits(&self) -> BatchLimits {
        let d = BatchLimits::default();
        BatchLimits {
            max_rows: self.max_rows.map_or(d.max_rows, |c| c.0),
            max_bytes: self.max_bytes.map_or(d.max_bytes, |s| s.0),
        }
    }
}

/// `[pipeline.snapshot]`: copying the tables' existing rows
/// (`docs/snapshots.md`).
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotSpec {
    /// `initial` (the default): a pipeline whose slot Datum creates starts
    /// with its tables' existing rows; `never`: changes only.
    #[serde(default)]
    pub mode: SnapshotMode,
    /// Rows per chunk.
    pub chunk_size: Option<Count>,
    /// Tables copied at once.
    pub parallel_tables: Option<Count>,
    /// Rows the pipeline's copies read per second at most, together; no
    /// limit when absent.
    pub max_rows_per_second: Option<Count>,
    /// `table` (the default): live changes of other tables pass a copy's
    /// rows; `commit`: everything in commit order.
    #[serde(default)]
    pub order: SnapshotOrder,
}

/// Rows per snapshot chunk unless `chunk_size` says otherwise.
pub const DEFAULT_CHUNK_ROWS: usize = 10_000;
/// Tables copied at once unless `parallel_tables` says otherwise.
pub(crate) const DEFAULT_PARALLEL_TABLES: usize = 2;

/// Whether a new pipeline starts with existing rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotMode {
    /// Copy every table of the publication when the slot is created.
    #[default]
    Initial,
    /// Changes only; tables are copied only when a backfill asks.
    Never,
}

/// The order a copy's rows and live changes reach modules and the sink
/// (`docs/snapshots.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotOrder {
    /// Each table's changes and copied rows in commit order; live changes
    /// of tables not being copied pass the rows of a copy.
    #[default]
    Table,
    /// Everything in commit order across tables: live changes wait behind
    /// the rows of a copy placed before them.
    Commit,
}

/// What a module failure does (`docs/architecture.md`, rule 6).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnError {
    /// Stop the pipeline, keep the offset, report the error.
    #[default]
    Fail,
    /// Log, count, and go on without the batch.
    Skip,
    /// Store the input batch and the error in the state file, go on.
    DeadLetter,
}

/// What the postgres sink does when a source table's shape changes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaChanges {
    /// A change the target table does not already reflect is a definite
    /// error that names the statement to run on the target.
    #[default]
    Fail,
    /// Added columns and widened types are applied to the target, in the
    /// batch's transaction; anything else fails as under `fail`.
    Apply,
    /// The target is left alone.
    Ignore,
}

/// `[pipeline.sink]`, by `type`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum SinkSpec {
    /// JSON lines on standard output, or a readable view.
    Stdout {
        /// `json` (JSON lines, the default) or `pretty` (each change as it
        /// came in and as it went out, for people).
        #[serde(default)]
        format: StdoutFormat,
        /// Colour in the `pretty` format; default: when standard output is
        /// a terminal and `NO_COLOR` is unset.
        color: Option<bool>,
        /// Each change also carries `columns`: every column's name,
        /// PostgreSQL type and whether it is part of the key (default: only
        /// the key's names, as `key`).
        #[serde(default)]
        column_types: bool,
    },
    /// JSON lines in a file, fsynced before each acknowledgement.
    File {
        /// The file; relative to the configuration file's directory.
        path: Text,
        /// Start a new file once this one reaches this size (`"100MiB"`).
        rotate_at: Option<Size>,
        /// Each change also carries `columns`: every column's name,
        /// PostgreSQL type and whether it is part of the key (default: only
        /// the key's names, as `key`).
        #[serde(default)]
        column_types: bool,
    },
    /// Changes applied to a PostgreSQL database.
    Postgres {
        /// Connection string of the target.
        url: Text,
        /// Target schema for every table (else the source's schema).
        schema: Option<Name>,
        /// `source table → target table`, both `schema.table`.
        #[serde(default)]
        tables: BTreeMap<String, Text>,
        /// What a `schema` change does to the target table
        /// (`docs/schema.md`).
        #[serde(default)]
        schema_changes: SchemaChanges,
        /// Record in the target, in each write's transaction, the position
        /// of the last transaction applied from each source table
        /// (`datum_applied`), and skip what was applied already when the
        /// tail after the checkpoint comes again: `true` requires it,
        /// `false` never does it, unset does it when the sink's user may.
        #[serde(default)]
        track_applied: Option<bool>,
    },
    /// Each batch POSTed as JSON.
    Http {
        /// Where to POST.
        url: Text,
        /// Extra headers (`Authorization = "Bearer ${TOKEN}"`).
        #[serde(default)]
        headers: BTreeMap<String, Text>,
        /// Per-request timeout.
        #[serde(default = "default_http_timeout")]
        timeout: Span,
        /// First retry delay; doubles, with jitter, up to `retry_max`.
        #[serde(default = "default_retry_initial")]
        retry_initial: Span,
        /// Longest delay between retries.
        #[serde(default = "default_retry_max")]
        retry_max: Span,
        /// Each change also carries `columns`: every column's name,
        /// PostgreSQL type and whether it is part of the key (default: only
        /// the key's names, as `key`).
        #[serde(default)]
        column_types: bool,
    },
    /// Each change published to a NATS JetStream stream.
    Nats(Box<NatsSpec>),
}

/// `[pipeline.sink]` with `type = "nats"`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsSpec {
    /// `nats://host:4222` (`tls://` for TLS); several servers separated
    /// by commas.
    pub url: Text,
    /// Each change's subject: text and `{pipeline}`, `{schema}`,
    /// `{table}`, `{op}`, `{route}`.
    #[serde(default = "default_nats_subject")]
    pub subject: String,
    /// The JetStream stream the subjects belong to.
    pub stream: StreamName,
    /// Create the stream when it is missing, with these settings.
    pub create_stream: Option<NatsStreamSpec>,
    /// `json` (the file sink's lines) or `msgpack` (the same map).
    #[serde(default)]
    pub format: NatsFormat,
    /// A token the server expects.
    pub token: Option<Text>,
    /// A user (with `password`).
    pub user: Option<Text>,
    /// The user's password.
    pub password: Option<Text>,
    /// A user NKey seed (`SU…`).
    pub nkey_seed: Option<Text>,
    /// A `.creds` file (a user JWT and its seed); relative to the
    /// configuration file's directory.
    pub credentials: Option<Text>,
    /// TLS towards the server.
    #[serde(default)]
    pub tls: NatsTlsSpec,
    /// How long a message's acknowledgement may take.
    #[serde(default = "default_nats_timeout")]
    pub timeout: Span,
    /// Messages awaiting JetStream's acknowledgement at most.
    #[serde(default = "default_nats_max_pending")]
    pub max_pending: Count,
    /// First retry delay; doubles, with jitter, up to `retry_max`.
    #[serde(default = "default_retry_initial")]
    pub retry_initial: Span,
    /// Longest delay between retries.
    #[serde(default = "default_retry_max")]
    pub retry_max: Span,
    /// Each change also carries `columns`: every column's name,
    /// PostgreSQL type and whether it is part of the key.
    #[serde(default)]
    pub column_types: bool,
}

/// The body of a `nats` sink's message.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatsFormat {
    /// The change as the `file` sink writes it (one JSON object).
    #[default]
    Json,
    /// The same map in MessagePack.
    Msgpack,
}

/// `tls` of a `nats` sink.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsTlsSpec {
    /// Refuse to talk to the server without TLS.
    #[serde(default)]
    pub required: bool,
    /// CA certificates (PEM) to trust besides the system's.
    pub ca: Option<Text>,
    /// A client certificate (PEM), for a server that verifies clients.
    pub cert: Option<Text>,
    /// The client certificate's key (PEM).
    pub key: Option<Text>,
}

/// `create_stream` of a `nats` sink: the stream Datum creates when it is
/// missing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NatsStreamSpec {
    /// The subjects the stream stores (wildcards allowed).
    pub subjects: Vec<String>,
    /// `limits`, `interest` or `workqueue`.
    #[serde(default)]
    pub retention: NatsRetention,
    /// `file` or `memory`.
    #[serde(default)]
    pub storage: NatsStorage,
    /// How long JetStream remembers message ids to drop duplicates.
    #[serde(default = "default_duplicate_window")]
    pub duplicate_window: Span,
    /// How long messages are kept (none: until the limits).
    pub max_age: Option<Span>,
    /// Copies in a cluster.
    #[serde(default = "default_replicas")]
    pub replicas: Count,
}

/// A stream's retention policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatsRetention {
    /// Kept until the stream's limits.
    #[default]
    Limits,
    /// Kept while a consumer is interested.
    Interest,
    /// Removed once acknowledged.
    Workqueue,
}

/// Where a stream keeps its messages.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NatsStorage {
    /// On disk.
    #[default]
    File,
    /// In memory.
    Memory,
}

/// A JetStream stream's name: no spaces, `.`, `*`, `>`, path separators.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamName(pub String);

impl<'de> Deserialize<'de> for StreamName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<StreamName, D::Error> {
        let name = String::deserialize(deserializer)?;
        if name.is_empty()
            || name.len() > 255
            || name
                .chars()
                .any(|c| c.is_whitespace() || c.is_control() || ".*>/\\".contains(c))
        {
            return Err(de::Error::custom(format!(
                "{name:?} is not a JetStream stream name: use letters, digits, `-` and `_` \
                 (no spaces, `.`, `*`, `>` or slashes)"
            )));
        }
        Ok(StreamName(name))
    }
}

fn default_nats_subject() -> String {
    "datum.{pipeline}.{schema}.{table}".to_owned()
}

fn default_nats_timeout() -> Span {
    Span(Duration::from_secs(5))
}

fn default_nats_max_pending() -> Count {
    Count(1024)
}

fn default_duplicate_window() -> Span {
    Span(Duration::from_secs(120))
}

fn default_replicas() -> Count {
    Count(1)
}

/// What the `stdout` sink writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StdoutFormat {
    /// JSON lines, one change per line.
    #[default]
    Json,
    /// The readable view of `sink::pretty`.
    Pretty,
}

fn default_http_timeout() -> Span {
    Span(Duration::from_secs(10))
}

fn default_retry_initial() -> Span {
    Span(Duration::from_millis(200))
}

fn default_retry_max() -> Span {
    Span(Duration::from_secs(30))
}

// ---------------------------------------------------------------------------
// Value types: each checks itself where it is read, so toml reports the line.

/// A string with `${VAR}` replaced by the environment variable's value
/// (`$${` writes a literal `${`). An unset variable is an error.
#[derive(Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl fmt::Debug for Text {
    // Interpolated values may be secrets: never print them.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Text(..)")
    }
}

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        let raw = String::deserialize(deserializer)?;
        interpolate(&raw, &|name| std::env::var(name).ok())
            .map(Text)
            .map_err(de::Error::custom)
    }
}

/// Replaces `${NAME}` by `env(NAME)`.
pub(crate) fn interpolate(
    raw: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at..];
        if let Some(after) = rest.strip_prefix("$${") {
            out.push_str("${");
            rest = after;
        } else if let Some(after) = rest.strip_prefix("${") {
            let end = after
                .find('}')
                .ok_or_else(|| "`${` without a closing `}`".to_owned())?;
            let name = &after[..end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!(
                    "`${{{name}}}`: a variable name has letters, digits and `_` only"
                ));
            }
            let value = env(name).ok_or_else(|| {
                format!(
                    "environment variable `{name}` is not set (it is used here as `${{{name}}}`)"
                )
            })?;
            out.push_str(&value);
            rest = &after[end + 1..];
        } else {
            out.push('$');
            rest = &rest[1..];
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A name for a pipeline, slot, publication, module or schema: letters,
/// digits and `_`, starting with a letter or `_`, at most 63 bytes (what
/// PostgreSQL allows for slot names, the strictest of them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Name(pub String);

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Name, D::Error> {
        let name = String::deserialize(deserializer)?;
        let valid = !name.is_empty()
            && name.len() <= 63
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
            && !name.starts_with(|c: char| c.is_ascii_digit());
        if valid {
            Ok(Name(name))
        } else {
            Err(de::Error::custom(format!(
                "`{name}` is not a valid name: use lowercase letters, digits and `_`, \
                 not starting with a digit, at most 63 characters"
            )))
        }
    }
}

/// A positive count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Count(pub usize);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Count, D::Error> {
        let n = i64::deserialize(deserializer)?;
        match usize::try_from(n) {
            Ok(n) if n > 0 => Ok(Count(n)),
            _ => Err(de::Error::custom(format!("{n} is not a positive number"))),
        }
    }
}

/// A duration: `"500ms"`, `"5s"`, `"2m"`, `"1h"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span(pub Duration);

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Span, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(de::Error::custom)
    }
}

impl std::str::FromStr for Span {
    type Err = String;
    fn from_str(text: &str) -> Result<Span, String> {
        parse_span(text).map(Span).ok_or_else(|| {
            format!("`{text}` is not a duration: write a number and a unit, like \"500ms\", \"5s\", \"2m\"")
        })
    }
}

fn parse_span(text: &str) -> Option<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().ok()?;
    let millis = match unit.trim() {
        "ms" => n,
        "s" => n.checked_mul(1000)?,
        "m" | "min" => n.checked_mul(60_000)?,
        "h" => n.checked_mul(3_600_000)?,
        _ => return None,
    };
    (millis > 0).then(|| Duration::from_millis(millis))
}

/// A size in bytes: an integer, or `"64KiB"`, `"8MiB"`, `"1GiB"` (also `KB`,
/// `MB`, `GB` as powers of 1000).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub usize);

/// A size as written in the file: bytes, or text with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawSize {
    Int(i64),
    Text(String),
}

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Size, D::Error> {
        let bad = |what: &str| {
            de::Error::custom(format!(
                "`{what}` is not a size: write bytes, or a number and a unit, like \"64MiB\""
            ))
        };
        match RawSize::deserialize(deserializer)? {
            RawSize::Int(n) => usize::try_from(n)
                .ok()
                .filter(|n| *n > 0)
                .map(Size)
                .ok_or_else(|| bad(&n.to_string())),
            RawSize::Text(text) => parse_size(&text).map(Size).ok_or_else(|| bad(&text)),
        }
    }
}

fn parse_size(text: &str) -> Option<usize> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: usize = number.parse().ok()?;
    let scale: usize = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" | "kB" => 1000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => return None,
    };
    n.checked_mul(scale).filter(|n| *n > 0)
}

// ---------------------------------------------------------------------------
// Loading.

impl Config {
    /// Reads and checks the file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        let invalid = |message: String| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        };
        let mut config = Config::parse(&text).map_err(invalid)?;
        config.resolve_paths(&config_dir(path));
        Ok(config)
    }

    /// Parses and checks a configuration's text (paths unresolved).
    pub fn parse(text: &str) -> Result<Config, String> {
        let mut config: Config = toml::from_str(text).map_err(|e| toml_error(text, &e))?;
        config.check()?;
        for pipeline in &mut config.pipeline {
            for transform in &mut pipeline.transforms {
                interpolate_table(&mut transform.config, &|n| std::env::var(n).ok()).map_err(
                    |e| {
                        format!(
                            "pipeline `{}`, transform `{}`: config: {e}",
                            pipeline.name.0, transform.module.0
                        )
                    },
                )?;
            }
        }
        Ok(config)
    }

    /// Checks what spans several keys.
    fn check(&self) -> Result<(), String> {
        if self.pipeline.is_empty() {
            return Err(
                "no pipeline: add a [[pipeline]] table (docs/config.md has a complete example)"
                    .into(),
            );
        }
        let mut names = std::collections::HashSet::new();
        let mut slots = std::collections::HashMap::new();
        for p in &self.pipeline {
            if !names.insert(&p.name.0) {
                return Err(format!("two pipelines are named `{}`", p.name.0));
            }
            let mut transforms = std::collections::HashSet::new();
            for t in &p.transforms {
                let name = t.name();
                if !transforms.insert(name.clone()) {
                    return Err(format!(
                        "pipeline `{}` has two transforms named `{name}`: give one a `name` \
                         (the admin API and the module registry tell them apart by it)",
                        p.name.0
                    ));
                }
            }
            if let SinkSpec::Stdout {
                format: StdoutFormat::Pretty,
                column_types: true,
                ..
            } = p.sink
            {
                return Err(format!(
                    "pipeline `{}`: `column_types` adds columns to JSON lines; the `pretty` \
                     format shows no types: drop one of the two",
                    p.name.0
                ));
            }
            let slot = p.slot();
            if let Some(other) = slots.insert(slot.clone(), &p.name.0) {
                return Err(format!(
                    "pipelines `{other}` and `{}` both use slot `{slot}`: each pipeline needs \
                     its own slot",
                    p.name.0
                ));
            }
        }
        Ok(())
    }

    fn resolve_paths(&mut self, base: &Path) {
        let resolve = |text: &mut Text| resolve_relative(text, base);
        resolve(&mut self.state);
        for p in &mut self.pipeline {
            for t in &mut p.transforms {
                resolve(&mut t.module);
            }
            match &mut p.sink {
                SinkSpec::File { path, .. } => resolve(path),
                SinkSpec::Nats(nats) => {
                    let NatsSpec {
                        credentials, tls, ..
                    } = &mut **nats;
                    for path in [credentials, &mut tls.ca, &mut tls.cert, &mut tls.key]
                        .into_iter()
                        .flatten()
                    {
                        resolve(path);
                    }
                }
                _ => {}
            }
        }
        if let Some(admin) = &mut self.admin
            && let Some(file) = &mut admin.token_file
        {
            resolve(file);
        }
    }
}

/// The directory relative paths in the configuration at `path` are
/// relative to, made absolute (so that errors name the file they looked
/// for, wherever `datum` was started).
fn config_dir(path: &Path) -> std::path::PathBuf {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    std::path::absolute(parent).unwrap_or_else(|_| parent.to_owned())
}

/// `text` as a path: joined to `base` when relative.
fn resolve_relative(text: &mut Text, base: &Path) {
    let path = Path::new(&text.0);
    if path.is_relative() {
        text.0 = base.join(path).to_string_lossy().into_owned();
    }
}

/// What `datum admin --config` reads of a host's configuration: the state
/// file's path and `[admin]`. The pipelines are not read, so their `${VAR}`s
/// (the sources' passwords) need not be set where the admin client runs.
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct AdminConfig {
    #[serde(default = "default_state")]
    pub state: Text,
    pub admin: Option<AdminSpec>,
}

impl AdminConfig {
    /// Reads the file at `path`; relative paths are resolved as `datum run`
    /// resolves them.
    pub(crate) fn load(path: &Path) -> Result<AdminConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        let mut config = AdminConfig::parse(&text).map_err(|message| ConfigError::Invalid {
            path: path.to_owned(),
            message,
        })?;
        let base = config_dir(path);
        let resolve = |text: &mut Text| resolve_relative(text, &base);
        resolve(&mut config.state);
        if let Some(file) = config.admin.as_mut().and_then(|a| a.token_file.as_mut()) {
            resolve(file);
        }
        Ok(config)
    }

    /// Parses a configuration's text for its state path and `[admin]`.
    pub(crate) fn parse(text: &str) -> Result<AdminConfig, String> {
        toml::from_str(text).map_err(|e| toml_error(text, &e))
    }
}

// ---------------------------------------------------------------------------
// Parse errors, without the secrets of the line they quote.

/// What replaces a secret in an error.
const MASK: &str = "********";

/// toml's report (line, column, the offending line with a caret, the
/// message), with secrets on the quoted line masked: the file may hold a
/// literal password or token, and errors end up in logs and terminals.
fn toml_error(text: &str, err: &toml::de::Error) -> String {
    let message = mask_line(err.message().trim_end()).0;
    let Some(span) = err.span() else {
        return message;
    };
    let start = span.start.min(text.len());
    let (Some(before), Some(after)) = (text.get(..start), text.get(start..)) else {
        return message;
    };
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line_end = after.find('\n').map_or(text.len(), |i| start + i);
    let line = text
        .get(line_start..line_end)
        .unwrap_or_default()
        .trim_end_matches('\r');
    let number = before.matches('\n').count() + 1;
    let column = before.get(line_start..).unwrap_or_default().chars().count() + 1;
    let (masked, ranges) = mask_line(line);
    // The caret's place and width in the masked line: a span that touches
    // a masked value points at the mask.
    let to_masked = |offset: usize| {
        let mut shift: isize = 0;
        for r in &ranges {
            if offset >= r.end {
                shift += MASK.len() as isize - r.len() as isize;
            } else if offset >= r.start {
                return (r.start as isize + shift) as usize;
            }
        }
        (offset as isize + shift).max(0) as usize
    };
    let from = to_masked(start - line_start);
    let to = to_masked(span.end.clamp(start, line_start + line.len()) - line_start);
    let prefix = masked.get(..from).unwrap_or(&masked).chars().count();
    let width = masked.get(from..to).map_or(1, |s| s.chars().count()).max(1);
    let gutter = " ".repeat(number.to_string().len());
    format!(
        "TOML parse error at line {number}, column {column}\n{gutter} |\n{number} | {masked}\n\
         {gutter} | {}{}\n{message}",
        " ".repeat(prefix),
        "^".repeat(width),
    )
}

/// Does a key's name say its value is a secret?
fn secret_key(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    [
        "password",
        "passwd",
        "secret",
        "token",
        "key",
        "credential",
        "auth",
        "cookie",
    ]
    .iter()
    .any(|word| key.contains(word))
}

/// Where the string starting at `at` (a quote) ends: past its closing
/// quote, or at the end of the line when it is unterminated.
fn string_end(line: &[u8], at: usize) -> usize {
    let quote = line[at];
    let triple = line.get(at..at + 3) == Some(&[quote; 3][..]);
    let mut i = at + if triple { 3 } else { 1 };
    while i < line.len() {
        if quote == b'"' && line[i] == b'\\' {
            i += 2;
            continue;
        }
        if line[i] == quote {
            if !triple {
                return i + 1;
            }
            if line.get(i..i + 3) == Some(&[quote; 3][..]) {
                return i + 3;
            }
        }
        i += 1;
    }
    line.len()
}

/// `line` with secrets replaced by [`MASK`], and the byte ranges of `line`
/// replaced (sorted, disjoint): values of keys named like secrets
/// (`password`, `token`, `api_key`, `Authorization`, ... also inside inline
/// tables), URL passwords (`scheme://user:PASSWORD@`) and conninfo
/// `password=...`.
fn mask_line(line: &str) -> (String, Vec<std::ops::Range<usize>>) {
    let b = line.as_bytes();
    let mut ranges = Vec::new();
    // Values of secret keys.
    let mut key_start = 0;
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' => i = string_end(b, i),
            b'#' => break,
            b'{' | b'[' | b',' => {
                i += 1;
                key_start = i;
            }
            b'=' => {
                let key = line.get(key_start..i).unwrap_or_default().trim();
                let name = key
                    .rsplit('.')
                    .next()
                    .unwrap_or_default()
                    .trim()
                    .trim_matches(|c| c == '"' || c == '\'');
                let mut start = i + 1;
                while start < b.len() && b[start].is_ascii_whitespace() {
                    start += 1;
                }
                let end = match b.get(start) {
                    None => start,
                    Some(b'"' | b'\'') => string_end(b, start),
                    // A table or an array: all of it when the key is a
                    // secret, else its own keys are looked at in turn.
                    Some(b'{' | b'[') if secret_key(name) => b.len(),
                    Some(b'{' | b'[') => start,
                    Some(_) => {
                        let mut end = start;
                        while end < b.len() && !matches!(b[end], b',' | b'}' | b']' | b'#') {
                            end += 1;
                        }
                        while end > start && b[end - 1].is_ascii_whitespace() {
                            end -= 1;
                        }
                        end
                    }
                };
                if secret_key(name) && end > start {
                    ranges.push(start..end);
                }
                i = end.max(i + 1);
                key_start = i;
            }
            _ => i += 1,
        }
    }
    // URL passwords: `://user:PASSWORD@host`.
    let mut from = 0;
    while let Some(at) = line.get(from..).and_then(|s| s.find("://")) {
        let authority = from + at + 3;
        let end = b[authority..]
            .iter()
            .position(|c| matches!(c, b'/' | b'"' | b'\'' | b'?' | b'#') || c.is_ascii_whitespace())
            .map_or(b.len(), |p| authority + p);
        if let Some(userinfo) = line.get(authority..end).and_then(|a| a.rfind('@'))
            && let Some(colon) = line[authority..authority + userinfo].find(':')
            && colon + 1 < userinfo
        {
            ranges.push(authority + colon + 1..authority + userinfo);
        }
        from = end.max(authority);
    }
    // conninfo: `password=VALUE` or `password='VALUE'`.
    let lower = line.to_ascii_lowercase();
    let mut from = 0;
    while let Some(at) = lower.get(from..).and_then(|s| s.find("password")) {
        let mut i = from + at + "password".len();
        from = i;
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        if b.get(i) != Some(&b'=') {
            continue;
        }
        i += 1;
        while i < b.len() && b[i] == b' ' {
            i += 1;
        }
        let end = if b.get(i) == Some(&b'\'') {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'\'' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            (j + 1).min(b.len())
        } else {
            let mut j = i;
            while j < b.len() && !b[j].is_ascii_whitespace() && !matches!(b[j], b'"' | b'&') {
                j += 1;
            }
            j
        };
        if end > i {
            ranges.push(i..end);
        }
        from = end.max(from);
    }
    // Sorted and merged, so each secret is masked once.
    ranges.sort_by_key(|r| r.start);
    let mut merged: Vec<std::ops::Range<usize>> = Vec::new();
    for r in ranges {
        match merged.last_mut() {
            Some(last) if r.start <= last.end => last.end = last.end.max(r.end),
            _ => merged.push(r),
        }
    }
    let mut out = String::with_capacity(line.len());
    let mut at = 0;
    for r in &merged {
        out.push_str(line.get(at..r.start).unwrap_or_default());
        out.push_str(MASK);
        at = r.end;
    }
    out.push_str(line.get(at..).unwrap_or_default());
    (out, merged)
}

impl TransformSpec {
    /// Its name: as configured, or the module file's stem.
    pub fn name(&self) -> String {
        self.name.as_ref().map_or_else(
            || {
                Path::new(&self.module.0)
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .unwrap_or("module")
                    .to_owned()
            },
            |n| n.0.clone(),
        )
    }
}

impl PipelineSpec {
    /// The slot: as configured, or `datum_<name>`.
    pub fn slot(&self) -> String {
        self.source
            .slot
            .as_ref()
            .map_or_else(|| format!("datum_{}", self.name.0), |s| s.0.clone())
    }

    /// The publication: as configured, or `datum_<name>`.
    pub fn publication(&self) -> String {
        self.source
            .publication
            .as_ref()
            .map_or_else(|| format!("datum_{}", self.name.0), |s| s.0.clone())
    }
}

/// Interpolates every string inside a module's configuration table.
fn interpolate_table(
    table: &mut toml::Table,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), String> {
    fn walk(
        value: &mut toml::Value,
        path: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(), String> {
        match value {
            toml::Value::String(s) => {
                *s = interpolate(s, env).map_err(|e| format!("`{path}`: {e}"))?;
            }
            toml::Value::Array(items) => {
                for (i, item) in items.iter_mut().enumerate() {
                    walk(item, &format!("{path}[{i}]"), env)?;
                }
            }
            toml::Value::Table(t) => {
                for (k, v) in t.iter_mut() {
                    walk(v, &format!("{path}.{k}"), env)?;
                }
            }
            _ => {}
        }
        Ok(())
    }
    for (k, v) in table.iter_mut() {
        walk(v, k, env)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
[[pipeline]]
name = "orders"
source.url = "postgres://localhost/app"
sink.type = "stdout"
"#;

    #[test]
    fn a_minimal_file_gets_the_documented_defaults() {
        let config = Config::parse(MINIMAL).expect("parses");
        assert_eq!(config.state.0, "datum-state.redb");
        let p = &config.pipeline[0];
        assert_eq!(p.slot(), "datum_orders");
        assert_eq!(p.publication(), "datum_orders");
        assert_eq!(p.on_error, OnError::Fail);
        assert_eq!(p.in_flight, Count(4));
        assert_eq!(p.group_commit, GroupCommit(Duration::from_millis(5)));
        assert!(p.transforms.is_empty());
        assert!(p.source.terminate_stale_holder);
        assert_eq!(p.source.catch_up, CatchUpSpec(None), "catch-up is off");
        assert_eq!(p.batch.limits(), BatchLimits::default());
        assert_eq!(p.snapshot.mode, SnapshotMode::Initial);
        assert_eq!(p.snapshot.order, SnapshotOrder::Table);
        assert!(matches!(
            p.sink,
            SinkSpec::Stdout {
                format: StdoutFormat::Json,
                color: None,
                column_types: false,
            }
        ));
    }

    #[test]
    fn catch_up_reads_a_size_or_off_and_names_what_is_wrong() {
        let with = |value: &str| {
            Config::parse(&MINIMAL.replace(
                "source.url = \"postgres://localhost/app\"",
                &format!("source.url = \"postgres://localhost/app\"\nsource.catch_up = {value}"),
            ))
        };
        let read = |value: &str| with(value).expect("parses").pipeline[0].source.catch_up;
        assert_eq!(read("\"256MiB\""), CatchUpSpec(Some(256 << 20)));
        assert_eq!(read("\"off\""), CatchUpSpec(None));
        assert_eq!(read("0"), CatchUpSpec(Some(0)));
        for bad in ["\"lots\"", "-1"] {
            let err = with(bad).expect_err(bad).to_string();
            assert!(err.contains("is not a size of WAL"), "{bad}: {err}");
            assert!(err.contains("catch_up"), "{bad}: {err}");
        }
    }

    #[test]
    fn every_key_reads() {
        let text = r#"
state = "/var/lib/datum/state.redb"

[[pipeline]]
name = "orders"
on_error = "dead_letter"
in_flight = 8
group_commit = "off"
source = { url = "host=db dbname=app", publication = "p", slot = "s", tables = ["public.orders"], publish_via_partition_root = true, terminate_stale_holder = false, recreate_slot = true }
batch = { max_rows = 500, max_bytes = "1MiB" }

[[pipeline.transforms]]
module = "mask_pii.wasm"
name = "mask"
config = { columns = ["email"], salt = "s" }
limits = { timeout = "250ms", fuel = 1000000, memory = "16MiB", max_input = 1048576, max_output = "2MB", max_module = "5MiB", max_functions = 20000, max_locals = 1000, max_total_locals = 100000, max_code = "4MiB", compile_timeout = "10s" }

[pipeline.sink]
type = "http"
url = "https://example.com/hook"
headers = { Authorization = "Bearer t" }
timeout = "2s"
retry_initial = "100ms"
retry_max = "1m"
"#;
        let config = Config::parse(text).expect("parses");
        let p = &config.pipeline[0];
        assert_eq!(p.on_error, OnError::DeadLetter);
        assert_eq!(p.group_commit, GroupCommit(Duration::ZERO));
        assert_eq!(p.batch.limits().max_bytes, 1 << 20);
        let limits = p.transforms[0].limits.limits();
        assert_eq!(limits.timeout, Duration::from_millis(250));
        assert_eq!(limits.memory, 16 << 20);
        assert_eq!(limits.max_output, 2_000_000);
        assert_eq!(limits.fuel, Some(1_000_000));
        assert_eq!(limits.max_functions, 20_000);
        assert_eq!(limits.max_locals, 1_000);
        assert_eq!(limits.max_total_locals, 100_000);
        assert_eq!(limits.max_code, 4 << 20);
        assert_eq!(limits.compile_timeout, Duration::from_secs(10));
        match &p.sink {
            SinkSpec::Http {
                headers, retry_max, ..
            } => {
                assert_eq!(headers["Authorization"].0, "Bearer t");
                assert_eq!(retry_max.0, Duration::from_secs(60));
            }
            other => panic!("{other:?}"),
        }
    }

    fn error(text: &str) -> String {
        Config::parse(text).expect_err(text)
    }

    #[test]
    fn mistakes_name_the_key_and_the_line() {
        let e = error(&MINIMAL.replace("sink.type", "sink.typo = 1\nsink.type"));
        assert!(e.contains("typo") && e.contains("line 5"), "{e}");
        let e = error(&format!("{MINIMAL}on_error = \"retry\"\n"));
        assert!(e.contains("retry") && e.contains("fail"), "{e}");
        let e = error(&format!("{MINIMAL}group_commit = \"soon\"\n"));
        assert!(e.contains("soon") && e.contains("\"off\""), "{e}");
        let e = error(&format!("{MINIMAL}batch.max_bytes = \"8 parsecs\"\n"));
        assert!(e.contains("not a size") && e.contains("line 6"), "{e}");
        let e = error(&MINIMAL.replace("\"orders\"", "\"Orders!\""));
        assert!(
            e.contains("not a valid name") && e.contains("line 3"),
            "{e}"
        );
        let e = error(&MINIMAL.replace("\"stdout\"", "\"kafka\""));
        assert!(e.contains("kafka"), "{e}");
        let e = error(&format!("{MINIMAL}{MINIMAL}"));
        assert!(e.contains("two pipelines are named `orders`"), "{e}");
        let e = error("state = \"x\"\n");
        assert!(e.contains("no pipeline"), "{e}");
        let e = error(&MINIMAL.replace("source.url", "source.urll"));
        assert!(e.contains("urll"), "{e}");
        let e = error(&format!("{MINIMAL}snapshot.order = \"fifo\"\n"));
        assert!(e.contains("fifo") && e.contains("commit"), "{e}");
        let config =
            Config::parse(&format!("{MINIMAL}snapshot.order = \"commit\"\n")).expect("parses");
        assert_eq!(config.pipeline[0].snapshot.order, SnapshotOrder::Commit);
    }

    #[test]
    fn variables_come_from_the_environment() {
        let env = |name: &str| (name == "PW").then(|| "s3cret".to_owned());
        assert_eq!(
            interpolate("postgres://u:${PW}@h/db", &env).unwrap(),
            "postgres://u:s3cret@h/db"
        );
        assert_eq!(
            interpolate("cost: $5, $${PW}", &env).unwrap(),
            "cost: $5, ${PW}"
        );
        let e = interpolate("${NOPE}", &env).unwrap_err();
        assert!(e.contains("`NOPE` is not set"), "{e}");
        assert!(interpolate("${PW", &env).is_err());
        assert!(interpolate("${A-B}", &env).is_err());
        // Through the file: the error has the line, and secrets never show in Debug.
        // SAFETY: no other test reads this variable.
        unsafe { std::env::set_var("DATUM_CONFIG_TEST_PW", "hunter2") };
        let config = Config::parse(
            &MINIMAL.replace("localhost/app", "u:${DATUM_CONFIG_TEST_PW}@localhost/app"),
        )
        .expect("parses");
        assert!(config.pipeline[0].source.url.0.contains("hunter2"));
        assert!(!format!("{config:?}").contains("hunter2"));
        let e = error(&MINIMAL.replace("localhost/app", "${DATUM_CONFIG_TEST_UNSET}"));
        assert!(
            e.contains("DATUM_CONFIG_TEST_UNSET") && e.contains("line 4"),
            "{e}"
        );
    }

    #[test]
    fn a_toml_syntax_error_does_not_echo_a_secret_on_its_line() {
        for (line, secret) in [
            (
                "source.url = \"postgres://u:hunter2@localhost/app",
                "hunter2",
            ),
            (
                "source.url = \"host=db password=hunter2 dbname=app",
                "hunter2",
            ),
            (
                "source.url = \"host=db password='hunter 2' dbname=app",
                "hunter 2",
            ),
            ("source.password = \"hunter2\" trailing", "hunter2"),
            ("source.token = hunter2", "hunter2"),
            ("api_key = \"hunter2", "hunter2"),
            (
                "sink.headers = { Authorization = \"Bearer hunter2\" x }",
                "hunter2",
            ),
            ("client_secret = 'hunter2' !", "hunter2"),
        ] {
            let text = MINIMAL.replace("source.url = \"postgres://localhost/app\"", line);
            let e = error(&text);
            assert!(!e.contains(secret), "{line}:\n{e}");
            assert!(
                e.contains("line 4"),
                "the line is still named: {line}:\n{e}"
            );
            assert!(e.contains("********"), "the mask shows: {line}:\n{e}");
        }
        // Lines without secrets are quoted as they are.
        let e = error(&MINIMAL.replace("\"stdout\"", "\"stdout"));
        assert!(e.contains("sink.type = \"stdout"), "{e}");
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("64KiB"), Some(65_536));
        assert_eq!(parse_size("10"), Some(10));
        assert_eq!(parse_size("0MiB"), None);
        assert_eq!(parse_size("1 TB"), None);
        assert_eq!(parse_span("250ms"), Some(Duration::from_millis(250)));
        assert_eq!(parse_span("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_span("5"), None);
        assert_eq!(parse_span("0s"), None);
    }
}
