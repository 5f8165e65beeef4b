//! The command line: parsing only. What each command does lives in the
//! library; `main` maps the outcome to an exit code.

use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// Stream PostgreSQL changes through WebAssembly transforms.
#[derive(Debug, Parser)]
#[command(name = "datum", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    /// How log lines are written (to standard error).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

/// Log line formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// For people.
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the pipelines of a configuration file until SIGINT or SIGTERM,
    /// then drain what is in flight, checkpoint and exit. Exits 1 if a
    /// pipeline failed.
    Run {
        /// The configuration file (docs/config.md).
        config: PathBuf,
    },
    /// The demo: a throwaway PostgreSQL, a writer making inserts, updates
    /// and deletes on customers and orders, and a pipeline through the
    /// mask_pii module into the stdout sink's readable view. Ctrl-C stops it
    /// and removes everything it made.
    Demo {
        /// Stop after this long (`10s`, `2m`); default: at Ctrl-C.
        #[arg(long)]
        duration: Option<crate::config::Span>,
        /// No ANSI colours (also: NO_COLOR, or output that is not a terminal).
        #[arg(long)]
        no_color: bool,
        /// Writer transactions per second.
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=1000))]
        rate: u32,
        /// The mask_pii module (default: the one built in this source tree,
        /// target/wasm32-wasip1/release/mask_pii.wasm).
        #[arg(long)]
        module: Option<PathBuf>,
    },
    /// Check that a source database can feed a pipeline: server version,
    /// wal_level, replication privilege, encoding, tables and their replica
    /// identity, publication coverage, slot state. Exits 1 if a requirement
    /// fails.
    Check {
        /// Connection string: a postgres:// URL or libpq key=value pairs.
        /// A password is better given in PGPASSWORD than on the command line.
        url: String,
        /// The publication the pipeline reads.
        #[arg(long)]
        publication: Option<String>,
        /// The replication slot the pipeline reads.
        #[arg(long)]
        slot: Option<String>,
        /// Tables the pipeline needs, `schema.table` or `table` (in public).
        #[arg(long, value_delimiter = ',', num_args = 1..)]
        tables: Vec<String>,
        /// The pipeline captures DDL (source.capture_ddl): fail if this role
        /// cannot install the event trigger.
        #[arg(long)]
        capture_ddl: bool,
        /// The pipeline may catch up through SQL (source.catch_up): warn
        /// unless a replication slot is left for its temporary copy.
        #[arg(long)]
        catch_up: bool,
    },
    /// Run a transform module on golden fixtures: each NAME.input.json
    /// batch in FIXTURES, compared with NAME.expected.json. Prints a diff per
    /// mismatch and `N passed, M failed`; exits 1 if any case failed.
    Test {
        /// The module (`.wasm`, built for wasm32-wasip1).
        module: PathBuf,
        /// The fixtures directory.
        fixtures: PathBuf,
        /// Module configuration (TOML) for every case, instead of
        /// FIXTURES/config.toml.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write the expected files from the actual output.
        #[arg(long)]
        bless: bool,
        /// Only the cases whose name contains this.
        #[arg(long)]
        filter: Option<String>,
    },
    /// Capture real batches as golden-test inputs: from a replication slot
    /// without consuming it, from tables' existing rows as a snapshot hands
    /// them over, or from a pipeline's dead letters. The files hold real
    /// data: review them before committing them.
    Record {
        /// Where to write NAME.input.json files.
        out: PathBuf,
        /// Read from this database's slot (connection string).
        #[arg(long, conflicts_with = "state", required_unless_present = "state")]
        url: Option<String>,
        /// The slot to peek (with --url). It must not be in use.
        #[arg(long, requires = "url")]
        slot: Option<String>,
        /// The publication to decode the slot with (with --url).
        #[arg(long, requires = "url")]
        publication: Option<String>,
        /// Record this table's first rows as snapshot rows instead of a
        /// slot's changes (with --url; repeat for more tables: one file each).
        #[arg(long = "table", requires = "url", conflicts_with_all = ["slot", "publication"])]
        tables: Vec<String>,
        /// Rows per table (with --table), in key order.
        #[arg(long, default_value_t = 100, requires = "tables")]
        rows: usize,
        /// Read dead letters from this state file instead.
        #[arg(long)]
        state: Option<PathBuf>,
        /// The pipeline whose dead letters to read (with --state).
        #[arg(long, requires = "state")]
        pipeline: Option<String>,
        /// Most batches to write.
        #[arg(long, default_value_t = 20)]
        limit: usize,
        /// File name prefix: PREFIX-001.input.json, ...
        #[arg(long, default_value = "recorded")]
        prefix: String,
        /// Replace existing files.
        #[arg(long)]
        force: bool,
    },
    /// Scaffold a transform crate: Cargo.toml, src/lib.rs with a unit test,
    /// a fixtures directory with one case, and a README.
    New {
        /// The crate's name (and directory, unless --path is given).
        name: String,
        /// What the transform is.
        #[arg(long, value_enum, default_value_t = Kind::Filter)]
        kind: Kind,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        path: Option<PathBuf>,
        /// The datum-guest SDK to depend on, as a path (default: the SDK of
        /// the source tree this datum was built from, when it exists).
        #[arg(long, conflicts_with = "sdk_git")]
        sdk: Option<PathBuf>,
        /// Depend on the SDK in this git repository (a Datum repository's
        /// URL) instead of a path, so the crate builds outside the checkout.
        #[arg(long, value_name = "URL")]
        sdk_git: Option<String>,
        /// The commit, tag or branch of --sdk-git (default: its default
        /// branch).
        #[arg(long, value_name = "REV", requires = "sdk_git")]
        sdk_rev: Option<String>,
    },
    /// Manage a running host over its admin API (docs/admin.md): status,
    /// pause and resume, module versions (hot swap, rollback), dead
    /// letters. Exits 1 when the API refused (its error is printed), 2 when
    /// the host could not be reached.
    Admin {
        /// Read the API's address and token from the host's configuration
        /// file (its `[admin]` table; the token from `token`,
        /// DATUM_ADMIN_TOKEN or the token file the host writes).
        #[arg(long, global = true, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The API's base URL [default: http://127.0.0.1:7070, or the
        /// configuration's `listen`].
        #[arg(long, global = true)]
        url: Option<String>,
        /// The bearer token [default: DATUM_ADMIN_TOKEN]. Prefer the
        /// variable: other users can see command lines.
        #[arg(long, global = true)]
        token: Option<super::admin::Token>,
        /// Print the API's JSON answer instead of a summary.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        command: AdminCommand,
    },
}

/// `datum admin` commands.
#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Every pipeline's state, WAL positions, lag, rates and modules; or
    /// one pipeline's.
    Status {
        /// The pipeline (default: every pipeline).
        pipeline: Option<String>,
    },
    /// Pause a pipeline: drain and checkpoint the batches in flight, close
    /// the replication connection (the slot stays at the checkpoint).
    Pause {
        /// The pipeline.
        pipeline: String,
    },
    /// Resume a paused pipeline from its checkpoint.
    Resume {
        /// The pipeline.
        pipeline: String,
    },
    /// Copy tables' existing rows on the running pipeline: a table not yet
    /// streamed (added to the publication when Datum created it), or one
    /// copied again. Follow it with `datum admin status PIPELINE`.
    Backfill {
        /// The pipeline.
        pipeline: String,
        /// The tables (`schema.table`, or a table in `public`).
        #[arg(required = true)]
        tables: Vec<String>,
        /// Copy only rows after this key (one value per key column, in the
        /// key's order); one table only.
        #[arg(long, num_args = 1..)]
        from: Option<Vec<String>>,
    },
    /// A transform's stored versions (`*` marks the active one) and its
    /// activations; every transform's without MODULE.
    Versions {
        /// The pipeline.
        pipeline: String,
        /// The transform's name (its module file's stem unless configured).
        module: Option<String>,
    },
    /// Hot-swap a transform: upload a new module version, which the host
    /// checks, stores and activates between two transactions. A refused
    /// module leaves the active one in place.
    Swap {
        /// The pipeline.
        pipeline: String,
        /// The transform's name.
        module: String,
        /// The new module (`.wasm`).
        file: PathBuf,
        /// The module's configuration (TOML) [default: the active
        /// version's].
        #[arg(long, value_name = "CFG.toml")]
        config_file: Option<PathBuf>,
        /// Golden fixtures (NAME.input.json, NAME.expected.json, ...) the
        /// module must pass before it is accepted (docs/fixtures.md).
        #[arg(long, value_name = "DIR")]
        fixtures: Option<PathBuf>,
        /// Check the module (and fixtures) only: store and activate nothing.
        #[arg(long)]
        dry_run: bool,
        /// Run it as a canary beside the active version, on every live
        /// batch, its output compared and discarded; follow it with `datum
        /// admin canary PIPELINE`, then promote or abort it.
        #[arg(long, conflicts_with = "dry_run")]
        canary: bool,
        /// With --canary: promote it after N batches compared with no
        /// difference and no failure.
        #[arg(long, value_name = "N", requires = "canary")]
        promote_after: Option<u64>,
        /// With --canary: stop it at the first difference.
        #[arg(long, requires = "canary")]
        stop_on_difference: bool,
        /// With --canary: stop it at the first failure of any kind (a trap,
        /// a timeout or running out of memory always stops it; other
        /// failures are counted).
        #[arg(long, requires = "canary")]
        abort_on_failure: bool,
        /// With --canary: how many differences to keep with their diff and
        /// fixture [default: 10, at most 100].
        #[arg(long, value_name = "N", requires = "canary")]
        keep: Option<u64>,
    },
    /// A pipeline's canary: `show` its report (batches compared, equal and
    /// different, failures, CPU time, the first differences as diffs), or
    /// `promote` it (it becomes the active version at the next transaction
    /// boundary), or `abort` it.
    Canary {
        /// The pipeline.
        pipeline: String,
        /// What to do.
        #[arg(value_enum, default_value_t = CanaryVerb::Show)]
        action: CanaryVerb,
        /// With show: also write each kept difference into DIR as a fixture
        /// (the input, and the canary's output as NAME.expected.json) for
        /// `datum test`.
        #[arg(long, value_name = "DIR")]
        record: Option<PathBuf>,
    },
    /// Re-activate an earlier version of a transform.
    Rollback {
        /// The pipeline.
        pipeline: String,
        /// The transform's name.
        module: String,
        /// The version [default: the one active before the current one].
        #[arg(long, value_name = "N")]
        to: Option<u64>,
    },
    /// A pipeline's dead letters: `list` them (the default), `show ID`
    /// (print its input batch), `replay ID` (run it through the modules and
    /// sink again) or `discard ID`.
    DeadLetters {
        /// The pipeline.
        pipeline: String,
        /// What to do.
        #[arg(value_enum, default_value_t = DeadLetterVerb::List)]
        action: DeadLetterVerb,
        /// The dead letter's id (with show, replay and discard).
        #[arg(required_if_eq_any = [("action", "show"), ("action", "replay"), ("action", "discard")])]
        id: Option<u64>,
    },
}

/// What `datum admin canary` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CanaryVerb {
    /// Print the canary's report.
    Show,
    /// Make the canary the transform's active version.
    Promote,
    /// Stop the canary; the active version stays.
    Abort,
}

/// What `datum admin dead-letters` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DeadLetterVerb {
    /// One line per dead letter: id, time, transaction, module version,
    /// error.
    List,
    /// Print a dead letter's input batch (the JSON of a fixture's
    /// NAME.input.json).
    Show,
    /// Run a dead letter through the modules in force and write the output
    /// to the sink, then remove it (kept if it fails again).
    Replay,
    /// Delete a dead letter.
    Discard,
}

impl AdminCommand {
    /// The library's request; an error for arguments clap cannot rule out.
    pub fn into_request(self) -> Result<super::admin::Request, String> {
        use super::admin::{CanaryAction, DeadLetterAction, Request};
        use super::canary::CanaryStart;
        Ok(match self {
            AdminCommand::Status { pipeline } => Request::Status { pipeline },
            AdminCommand::Pause { pipeline } => Request::Pause { pipeline },
            AdminCommand::Resume { pipeline } => Request::Resume { pipeline },
            AdminCommand::Backfill {
                pipeline,
                tables,
                from,
            } => Request::Backfill {
                pipeline,
                tables,
                from,
            },
            AdminCommand::Versions { pipeline, module } => Request::Versions { pipeline, module },
            AdminCommand::Swap {
                pipeline,
                module,
                file,
                config_file,
                fixtures,
                dry_run,
                canary,
                promote_after,
                stop_on_difference,
                abort_on_failure,
                keep,
            } => Request::Swap {
                pipeline,
                module,
                file,
                config_file,
                fixtures,
                dry_run,
                canary: canary.then_some(CanaryStart {
                    promote_after,
                    stop_on_difference,
                    abort_on_failure,
                    keep,
                }),
            },
            AdminCommand::Canary {
                pipeline,
                action,
                record,
            } => Request::Canary {
                pipeline,
                action: match (action, record) {
                    (CanaryVerb::Show, record) => CanaryAction::Show(record),
                    (CanaryVerb::Promote, None) => CanaryAction::Promote,
                    (CanaryVerb::Abort, None) => CanaryAction::Abort,
                    (_, Some(_)) => {
                        return Err("--record goes with show: `datum admin canary PIPELINE                                     --record DIR`"
                            .into());
                    }
                },
            },
            AdminCommand::Rollback {
                pipeline,
                module,
                to,
            } => Request::Rollback {
                pipeline,
                module,
                to,
            },
            AdminCommand::DeadLetters {
                pipeline,
                action,
                id,
            } => Request::DeadLetters {
                pipeline,
                action: match (action, id) {
                    (DeadLetterVerb::List, None) => DeadLetterAction::List,
                    (DeadLetterVerb::List, Some(_)) => {
                        return Err("list takes no ID: use `show ID` to see one".into());
                    }
                    (DeadLetterVerb::Show, Some(id)) => DeadLetterAction::Show(id),
                    (DeadLetterVerb::Replay, Some(id)) => DeadLetterAction::Replay(id),
                    (DeadLetterVerb::Discard, Some(id)) => DeadLetterAction::Discard(id),
                    // clap requires the id of these; kept for completeness.
                    (_, None) => {
                        return Err("show, replay and discard need the dead letter's ID".into());
                    }
                },
            },
        })
    }
}

/// The kinds of transform `datum new` scaffolds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Kind {
    /// Keep or drop each change.
    Filter,
    /// Change each change (or drop it).
    Map,
    /// Turn each change into any number of changes.
    FlatMap,
    /// See the whole batch at once.
    Transform,
}
