//! Golden-file tests of transforms: run a module on hand-written or recorded
//! batches and compare what it answers with what a file says it should
//! (`docs/fixtures.md`). Behind `datum test`, and public so a module's own
//! `cargo test` can call it:
//!
//! ```no_run
//! let summary = datum::run_suite(
//!     "target/wasm32-wasip1/release/my_filter.wasm".as_ref(),
//!     "fixtures".as_ref(),
//!     &datum::GoldenOptions::default(),
//!     &mut std::io::stdout(),
//! )
//! .expect("the module and the fixtures load");
//! assert_eq!(summary.failed, 0, "{summary}");
//! ```
//!
//! Owns the fixture directory's layout (`NAME.input.json`,
//! `NAME.expected.json`, optional `config.toml` and `NAME.config.toml`),
//! running each case through the production runtime — the same engine,
//! limits, sandbox and encoding a pipeline uses, plus fuel metering to report
//! what each case cost — the comparison, the readable diff, and blessing.
//!
//! Each case gets a fresh instance, so cases do not depend on their order.

pub(crate) mod fixture;

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use datum_guest::wire::{Batch as WireBatch, Change as WireChange, Column as WireColumn, Op};
use datum_guest::{Txn, Value};
use serde::{Deserialize, Serialize};

use crate::event::Lsn;
use crate::event::json::{self, ChangeJson, ColumnsForm, ReadError};
use crate::event::{Batch, Change, Column, OldRow, Relation, ReplicaIdentity};
use crate::transform::encode::{Item, to_wire};
use crate::transform::engine::EngineOptions;
use crate::transform::{Chain, Engine, Limits, Module, TransformError, Transformed};
use fixture::{ReadBatch, ReadChange};

/// Suffix of a case's input batch.
pub const INPUT_SUFFIX: &str = ".input.json";
/// Suffix of a case's expected output.
pub const EXPECTED_SUFFIX: &str = ".expected.json";
/// Suffix of a case's own module configuration.
pub const CONFIG_SUFFIX: &str = ".config.toml";
/// The configuration every case of a directory gets unless it has its own.
pub const DIR_CONFIG: &str = "config.toml";

/// Why a golden run could not be done (as opposed to a case that failed).
#[derive(Debug, thiserror::Error)]
pub enum GoldenError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// What happened.
        source: std::io::Error,
    },
    /// A fixture is not valid.
    #[error("{}: {error}", path.display())]
    Fixture {
        /// The fixture.
        path: PathBuf,
        /// Where and what.
        error: ReadError,
    },
    /// A configuration file is not valid TOML.
    #[error("{}: {message}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// toml's message, with the line.
        message: String,
    },
    /// The module could not be loaded.
    #[error("{}: {error}", path.display())]
    Module {
        /// The module file.
        path: PathBuf,
        /// Why.
        error: TransformError,
    },
    /// The directory holds no case.
    #[error(
        "{}: no cases (a case is a NAME{INPUT_SUFFIX} file, with NAME{EXPECTED_SUFFIX} beside it){}",
        dir.display(),
        filter.as_deref().map(|f| format!(" matching `{f}`")).unwrap_or_default()
    )]
    NoCases {
        /// The directory.
        dir: PathBuf,
        /// The filter given.
        filter: Option<String>,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> GoldenError + '_ {
    move |source| GoldenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What a case expects.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// These output changes, in order.
    Changes(Vec<ReadChange>),
    /// This failure.
    Error(ExpectedError),
}

/// An expected failure: the kind exactly (`TransformError::kind`), the
/// message as a substring of the actual one (so backtraces, offsets and
/// paths need not be spelled out), and the change index when given.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedError {
    /// `guest_error`, `trap`, `timeout`, `init_failed`, ...
    pub kind: String,
    /// A substring of the message.
    #[serde(default)]
    pub message: String,
    /// The input change at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

impl<'de> Deserialize<'de> for Expected {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Expected, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Doc {
            changes: Option<Vec<ReadChange>>,
            error: Option<ExpectedError>,
        }
        match Doc::deserialize(deserializer)? {
            Doc {
                changes: Some(changes),
                error: None,
            } => Ok(Expected::Changes(changes)),
            Doc {
                changes: None,
                error: Some(error),
            } => Ok(Expected::Error(error)),
            _ => Err(serde::de::Error::custom(
                "an expected file has `changes` (a list, maybe empty) or `error`, exactly one",
            )),
        }
    }
}

/// One case of a fixture directory.
#[derive(Debug, Clone)]
pub(crate) struct Case {
    /// The name: the input file's name without `.input.json`.
    pub name: String,
    /// The expected file (which may not exist yet).
    pub expected_path: PathBuf,
    /// The case's own configuration file, if it has one.
    pub config_path: Option<PathBuf>,
    /// The input batch.
    pub input: ReadBatch,
    /// The expected output, None when the file does not exist.
    pub expected: Option<Expected>,
}

fn read_text(path: &Path) -> Result<String, GoldenError> {
    std::fs::read_to_string(path).map_err(io(path))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, GoldenError> {
    json::read(&read_text(path)?).map_err(|error| GoldenError::Fixture {
        path: path.to_owned(),
        error,
    })
}

/// Reads a TOML configuration file into the table `datum_init` receives.
pub(crate) fn read_config(path: &Path) -> Result<toml::Table, GoldenError> {
    read_text(path)?
        .parse::<toml::Table>()
        .map_err(|e| GoldenError::Config {
            path: path.to_owned(),
            message: e.to_string().trim_end().to_owned(),
        })
}

impl Case {
    /// Loads case `name` of `dir`.
    pub(crate) fn load(dir: &Path, name: &str) -> Result<Case, GoldenError> {
        let input_path = dir.join(format!("{name}{INPUT_SUFFIX}"));
        let expected_path = dir.join(format!("{name}{EXPECTED_SUFFIX}"));
        let config_path = dir.join(format!("{name}{CONFIG_SUFFIX}"));
        let input = read_json(&input_path)?;
        let expected = if expected_path.exists() {
            Some(read_json(&expected_path)?)
        } else {
            None
        };
        Ok(Case {
            name: name.to_owned(),
            expected_path,
            config_path: config_path.exists().then_some(config_path),
            input,
            expected,
        })
    }
}

/// The case names of a directory, sorted, those containing `filter` only
/// when given.
pub(crate) fn case_names(dir: &Path, filter: Option<&str>) -> Result<Vec<String>, GoldenError> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let file = entry.file_name();
        let Some(name) = file.to_str().and_then(|f| f.strip_suffix(INPUT_SUFFIX)) else {
            continue;
        };
        if filter.is_none_or(|f| name.contains(f)) {
            names.push(name.to_owned());
        }
    }
    names.sort();
    if names.is_empty() {
        return Err(GoldenError::NoCases {
            dir: dir.to_owned(),
            filter: filter.map(str::to_owned),
        });
    }
    Ok(names)
}

/// What the module did with a case's batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Actual {
    /// It answered these changes.
    Changes(Vec<WireChange>),
    /// It failed.
    Error {
        /// [`TransformError::kind`].
        kind: String,
        /// The message (for traps, without the backtrace).
        message: String,
        /// The input change at fault, when the module said.
        index: Option<u32>,
    },
}

impl Actual {
    fn from_error(error: &TransformError) -> Actual {
        let (message, index) = match error {
            TransformError::Guest { message, index } => (message.clone(), *index),
            TransformError::Trap { message, .. } => (message.clone(), None),
            other => (other.to_string(), None),
        };
        Actual::Error {
            kind: error.kind().to_owned(),
            message,
            index,
        }
    }

    /// The expected file that says exactly this.
    pub fn to_expected_json(&self) -> String {
        match self {
            Actual::Changes(changes) => {
                #[derive(Serialize)]
                struct Doc<'a> {
                    changes: json::Changes<'a>,
                }
                crate::event::ordered::to_pretty(&Doc {
                    changes: json::Changes(changes, ColumnsForm::Auto),
                })
            }
            Actual::Error {
                kind,
                message,
                index,
            } => {
                #[derive(Serialize)]
                struct Doc<'a> {
                    error: &'a ExpectedError,
                }
                crate::event::ordered::to_pretty(&Doc {
                    error: &ExpectedError {
                        kind: kind.clone(),
                        message: message.clone(),
                        index: *index,
                    },
                })
            }
        }
    }
}

/// How a case ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The output matched.
    Passed,
    /// It did not: a unified diff from expected to actual.
    Failed(String),
    /// There is no expected file (and blessing was not asked for).
    MissingExpected,
    /// The expected file was written from the actual output.
    Blessed {
        /// The expected file written.
        path: PathBuf,
        /// It did not exist before (else it was rewritten).
        created: bool,
    },
}

/// A case's result.
#[derive(Debug, Clone)]
pub struct CaseResult {
    /// The case's name.
    pub name: String,
    /// How it ended.
    pub outcome: Outcome,
    /// What the module answered.
    pub actual: Actual,
    /// Fuel the call used (roughly, wasm instructions).
    pub fuel: Option<u64>,
    /// Wall time of the call, instantiation included.
    pub elapsed: Duration,
}

/// A module loaded for golden runs: the production engine with fuel
/// metering, and the production limits.
#[derive(Debug, Clone)]
pub(crate) struct Runner {
    module: Module,
    path: PathBuf,
}

impl Runner {
    /// Loads the module at `path`; `config` is the configuration cases get
    /// unless their directory or they have their own.
    pub(crate) fn load(
        path: &Path,
        config: Option<&toml::Table>,
        limits: Limits,
    ) -> Result<Runner, GoldenError> {
        let wasm = std::fs::read(path).map_err(io(path))?;
        crate::transform::check_binary(&wasm).map_err(|error| GoldenError::Module {
            path: path.to_owned(),
            error,
        })?;
        let name = path
            .file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("module");
        Runner::from_bytes(name, &wasm, config, limits).map_err(|error| GoldenError::Module {
            path: path.to_owned(),
            error,
        })
    }

    /// Loads a module from its bytes.
    pub(crate) fn from_bytes(
        name: &str,
        wasm: &[u8],
        config: Option<&toml::Table>,
        limits: Limits,
    ) -> Result<Runner, TransformError> {
        let engine = fuel_engine()?;
        let config = config
            .map(crate::transform::encode_config)
            .unwrap_or_else(empty_config);
        let module = Module::new(&engine, name, wasm, limits, config)?;
        Ok(Runner {
            module,
            path: PathBuf::from(name),
        })
    }

    /// Runs one batch with `config` (or the runner's), on a fresh instance.
    pub(crate) fn run_batch(
        &self,
        batch: &WireBatch,
        config: Option<&toml::Table>,
    ) -> (Actual, Option<u64>, Duration) {
        let module = match config {
            Some(table) => self
                .module
                .with_config(crate::transform::encode_config(table)),
            None => self.module.clone(),
        };
        let mut chain = Chain::new(&[module]);
        let started = Instant::now();
        let result = chain.run_items(source_items(batch));
        let elapsed = started.elapsed();
        let fuel = chain.last_fuel().first().copied().flatten();
        let actual = match result {
            Ok(transformed) => {
                Actual::Changes(transformed.changes().map(|c| c.to_wire()).collect())
            }
            Err(err) => Actual::from_error(&err.error),
        };
        (actual, fuel, elapsed)
    }

    /// Runs a case and compares; with `bless`, writes the expected file
    /// from the output instead of failing.
    pub(crate) fn run(
        &self,
        case: &Case,
        dir_config: Option<&toml::Table>,
        bless: bool,
    ) -> Result<CaseResult, GoldenError> {
        let own_config = case.config_path.as_deref().map(read_config).transpose()?;
        let config = own_config.as_ref().or(dir_config);
        let (actual, fuel, elapsed) = self.run_batch(&case.input.batch(), config);
        let mismatch = match &case.expected {
            None => Some(None),
            Some(expected) => compare(expected, &actual).map(Some),
        };
        let outcome = match mismatch {
            None => Outcome::Passed,
            Some(_) if bless => {
                std::fs::write(&case.expected_path, actual.to_expected_json())
                    .map_err(io(&case.expected_path))?;
                Outcome::Blessed {
                    path: case.expected_path.clone(),
                    created: case.expected.is_none(),
                }
            }
            Some(None) => Outcome::MissingExpected,
            Some(Some(diff)) => Outcome::Failed(diff),
        };
        Ok(CaseResult {
            name: case.name.clone(),
            outcome,
            actual,
            fuel,
            elapsed,
        })
    }
}

/// The engine golden runs use: the production one with fuel metering, one
/// per process, so a module run many times (an admin upload's fixtures, a
/// test suite) is compiled once.
fn fuel_engine() -> Result<Engine, TransformError> {
    static ENGINE: std::sync::OnceLock<Engine> = std::sync::OnceLock::new();
    if let Some(engine) = ENGINE.get() {
        return Ok(engine.clone());
    }
    let engine = Engine::new(EngineOptions {
        fuel: true,
        ..EngineOptions::default()
    })?;
    Ok(ENGINE.get_or_init(|| engine).clone())
}

fn empty_config() -> Vec<u8> {
    crate::transform::encode_config(&toml::Table::new())
}

/// Compares; None when the actual output is what is expected, else a diff.
pub(crate) fn compare(expected: &Expected, actual: &Actual) -> Option<String> {
    let matches = match (expected, actual) {
        (Expected::Changes(want), Actual::Changes(got)) => {
            want.len() == got.len()
                && want.iter().zip(got).all(|(w, g)| {
                    let form = if w.columns_given {
                        ColumnsForm::Full
                    } else {
                        ColumnsForm::Omit
                    };
                    comparable(&w.change, form) == comparable(g, form)
                })
        }
        (
            Expected::Error(want),
            Actual::Error {
                kind,
                message,
                index,
            },
        ) => {
            want.kind == *kind
                && message.contains(&want.message)
                && (want.index.is_none() || want.index == *index)
        }
        _ => false,
    };
    if matches {
        return None;
    }
    let expected_text = render_expected(expected);
    let actual_text = render_actual_like(actual, expected);
    Some(
        similar::TextDiff::from_lines(&expected_text, &actual_text)
            .unified_diff()
            .context_radius(4)
            .header("expected", "actual")
            .to_string(),
    )
}

/// Whether two output changes are the same, compared as a golden case
/// compares them (every column; JSON values as JSON).
pub(crate) fn same_change(a: &WireChange, b: &WireChange) -> bool {
    comparable(a, ColumnsForm::Full) == comparable(b, ColumnsForm::Full)
}

/// A unified diff from one output to another, in the form `datum test`
/// prints; each side is `(label, changes)`.
pub(crate) fn diff_outputs(from: (&str, &[WireChange]), to: (&str, &[WireChange])) -> String {
    let render = |changes: &[WireChange]| {
        crate::event::ordered::to_pretty(&ChangesDoc {
            changes: changes
                .iter()
                .map(|change| ChangeJson {
                    change,
                    columns: ColumnsForm::Auto,
                })
                .collect(),
        })
    };
    let (left, right) = (render(from.1), render(to.1));
    similar::TextDiff::from_lines(&left, &right)
        .unified_diff()
        .context_radius(4)
        .header(from.0, to.0)
        .to_string()
}

/// A change as compared: its JSON form, with JSON values compared as JSON
/// (whitespace and key order do not matter, as in jsonb).
fn comparable(change: &WireChange, columns: ColumnsForm) -> serde_json::Value {
    fn semantic_json(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                if map.len() == 1
                    && let Some(serde_json::Value::String(text)) = map.get("json_text")
                    && let Ok(parsed) = serde_json::from_str::<serde_json::Value>(text)
                {
                    map.clear();
                    map.insert("json".into(), parsed);
                    return;
                }
                map.values_mut().for_each(semantic_json);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(semantic_json),
            _ => {}
        }
    }
    let mut value =
        serde_json::to_value(ChangeJson { change, columns }).unwrap_or(serde_json::Value::Null);
    semantic_json(&mut value);
    value
}

#[derive(Serialize)]
struct ChangesDoc<'a> {
    changes: Vec<ChangeJson<'a>>,
}

fn render_expected(expected: &Expected) -> String {
    match expected {
        Expected::Changes(changes) => crate::event::ordered::to_pretty(&ChangesDoc {
            changes: changes
                .iter()
                .map(|c| ChangeJson {
                    change: &c.change,
                    columns: if c.columns_given {
                        ColumnsForm::Auto
                    } else {
                        ColumnsForm::Omit
                    },
                })
                .collect(),
        }),
        Expected::Error(error) => Actual::Error {
            kind: error.kind.clone(),
            message: error.message.clone(),
            index: error.index,
        }
        .to_expected_json(),
    }
}

/// The actual output rendered the way the expected file is written, so the
/// diff shows only real differences.
fn render_actual_like(actual: &Actual, expected: &Expected) -> String {
    match (actual, expected) {
        (Actual::Changes(got), Expected::Changes(want)) => {
            crate::event::ordered::to_pretty(&ChangesDoc {
                changes: got
                    .iter()
                    .enumerate()
                    .map(|(i, change)| ChangeJson {
                        change,
                        columns: match want.get(i) {
                            Some(w) if !w.columns_given => ColumnsForm::Omit,
                            _ => ColumnsForm::Auto,
                        },
                    })
                    .collect(),
            })
        }
        _ => actual.to_expected_json(),
    }
}

/// The host batch a fixture's batch stands for: each change in the host's
/// representation when it holds it exactly (as the source would have produced
/// it), else as given (a snapshot row, a route, a row lacking columns).
pub(crate) fn source_items(batch: &WireBatch) -> Transformed {
    let mut source = Batch {
        txn: batch.txn,
        changes: Vec::new(),
        bytes: 0,
    };
    let mut items = Vec::with_capacity(batch.changes.len());
    for change in &batch.changes {
        match host_change(change, &batch.txn).filter(|host| to_wire(host) == *change) {
            Some(host) => {
                items.push(Item::Source(source.changes.len()));
                source.changes.push(host);
            }
            None => items.push(Item::Wire(Box::new(change.clone()))),
        }
    }
    Transformed { source, items }
}

fn host_change(change: &WireChange, txn: &Txn) -> Option<Change> {
    let relation = || {
        Arc::new(Relation {
            oid: 0,
            schema: change.schema.clone(),
            table: change.table.clone(),
            replica_identity: ReplicaIdentity::Default,
            columns: change
                .columns
                .iter()
                .map(|c| Column::new(&c.name, &c.type_name, c.key))
                .collect(),
        })
    };
    let aligned = |row: &datum_guest::Row, columns: &[WireColumn]| -> Vec<Value> {
        columns
            .iter()
            .map(|c| row.get(&c.name).cloned().unwrap_or(Value::Null))
            .collect()
    };
    let old_row = |row: &datum_guest::Row| OldRow {
        key_only: row.len() < change.columns.len(),
        values: aligned(row, &change.columns),
    };
    if change.route.is_some() {
        return None;
    }
    Some(match change.op {
        Op::Insert => Change::Insert {
            relation: relation(),
            new: aligned(change.new.as_ref()?, &change.columns),
        },
        Op::Update => Change::Update {
            relation: relation(),
            old: change.old.as_ref().map(old_row),
            new: aligned(change.new.as_ref()?, &change.columns),
        },
        Op::Delete => Change::Delete {
            relation: relation(),
            old: old_row(change.old.as_ref()?),
        },
        Op::Truncate => {
            let truncate = change.truncate.as_ref()?;
            Change::Truncate {
                relations: truncate
                    .tables
                    .iter()
                    .map(|t| {
                        Arc::new(Relation {
                            oid: 0,
                            schema: t.schema.clone(),
                            table: t.table.clone(),
                            replica_identity: ReplicaIdentity::Default,
                            columns: Vec::new(),
                        })
                    })
                    .collect(),
                cascade: truncate.cascade,
                restart_identity: truncate.restart_identity,
            }
        }
        Op::Message => {
            let message = change.message.as_ref()?;
            Change::Message {
                transactional: message.transactional,
                lsn: Lsn(txn.commit_lsn),
                prefix: message.prefix.clone(),
                content: message.content.clone(),
            }
        }
        Op::Snapshot => Change::Snapshot {
            relation: relation(),
            new: aligned(change.new.as_ref()?, &change.columns),
        },
        // Kept as the fixture gives it: the host's form would lose the
        // `sql_type`s it cannot rebuild.
        Op::Schema => return None,
    })
}

/// What `run_suite` does besides running.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Module configuration for every case (over the directory's
    /// `config.toml`; a case's own `NAME.config.toml` wins over both).
    pub config: Option<PathBuf>,
    /// Write expected files from the actual output.
    pub bless: bool,
    /// Only the cases whose name contains this.
    pub filter: Option<String>,
    /// The module's limits (default: [`Limits::default`]); an upload's
    /// fixtures run under its transform's own, as its batches will.
    pub limits: Option<Limits>,
}

/// A run's tally.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    /// Cases whose output matched.
    pub passed: usize,
    /// Cases that failed: a mismatch, a missing expected file, or a fixture
    /// that does not load.
    pub failed: usize,
    /// Expected files written.
    pub blessed: usize,
    /// Every case's result, in name order (cases that did not load have
    /// none).
    pub results: Vec<CaseResult>,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} passed, {} failed", self.passed, self.failed)?;
        if self.blessed > 0 {
            write!(f, " ({} blessed)", self.blessed)?;
        }
        Ok(())
    }
}

fn group(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Runs every case of `dir` against the module at `wasm`, writing a line per
/// case (and a diff per failure) to `out`, then the tally line.
///
/// An error is returned only when nothing can run: the module or a
/// configuration does not load, the directory is unreadable or has no case.
/// A fixture that does not parse fails its case and the run goes on.
pub fn run_suite(
    wasm: &Path,
    dir: &Path,
    options: &Options,
    out: &mut dyn Write,
) -> Result<Summary, GoldenError> {
    let dir_config_path = options
        .config
        .clone()
        .or_else(|| Some(dir.join(DIR_CONFIG)).filter(|p| p.exists()));
    let dir_config = dir_config_path.as_deref().map(read_config).transpose()?;
    let names = case_names(dir, options.filter.as_deref())?;
    let runner = Runner::load(
        wasm,
        dir_config.as_ref(),
        options.limits.unwrap_or_default(),
    )?;
    let out_err = |e| GoldenError::Io {
        path: PathBuf::from("<output>"),
        source: e,
    };
    writeln!(
        out,
        "running {} case{} from {} with {} (sha256 {})",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        dir.display(),
        runner.path.display(),
        &runner.module.sha256()[..12],
    )
    .map_err(out_err)?;
    // The shared configuration is vetted once, up front: a module that
    // refuses it would fail every case that uses it with the same diff.
    let refused = runner
        .module
        .instance()
        .warm()
        .err()
        .map(|error| Actual::from_error(&error));
    if let Some(Actual::Error { kind, message, .. }) = &refused {
        let source = match &dir_config_path {
            Some(path) => path.display().to_string(),
            None => "(none: an empty table)".to_owned(),
        };
        writeln!(
            out,
            "the module refused the configuration {source} ({kind}): {message}\n  \
             every case without its own {CONFIG_SUFFIX} fails unless it expects exactly \
             this; fix the configuration (or pass another with --config)"
        )
        .map_err(out_err)?;
    }
    let mut summary = Summary::default();
    for name in names {
        let case = Case::load(dir, &name);
        if let (Some(refusal), Ok(case)) = (&refused, &case)
            && case.config_path.is_none()
            && case
                .expected
                .as_ref()
                .is_none_or(|expected| compare(expected, refusal).is_some())
        {
            summary.failed += 1;
            writeln!(
                out,
                "test {name} ... FAILED: the module refused the configuration (above)"
            )
            .map_err(out_err)?;
            continue;
        }
        let result = case.and_then(|case| runner.run(&case, dir_config.as_ref(), options.bless));
        let result = match result {
            Ok(result) => result,
            Err(err @ (GoldenError::Fixture { .. } | GoldenError::Config { .. })) => {
                summary.failed += 1;
                writeln!(out, "test {name} ... FAILED\n  {err}").map_err(out_err)?;
                continue;
            }
            Err(err) => return Err(err),
        };
        let cost = match result.fuel {
            Some(fuel) => format!("fuel {}, {:.1?}", group(fuel), result.elapsed),
            None => format!("{:.1?}", result.elapsed),
        };
        match &result.outcome {
            Outcome::Passed => {
                summary.passed += 1;
                writeln!(out, "test {name} ... ok ({cost})")
            }
            Outcome::Blessed { path, created } => {
                summary.blessed += 1;
                summary.passed += 1;
                writeln!(
                    out,
                    "test {name} ... blessed: {} {} ({cost})",
                    if *created { "wrote" } else { "rewrote" },
                    path.display()
                )
            }
            Outcome::MissingExpected => {
                summary.failed += 1;
                writeln!(
                    out,
                    "test {name} ... FAILED\n  {} does not exist; run with --bless to write it \
                     from this output:\n{}",
                    dir.join(format!("{name}{EXPECTED_SUFFIX}")).display(),
                    indent(&result.actual.to_expected_json())
                )
            }
            Outcome::Failed(diff) => {
                summary.failed += 1;
                writeln!(out, "test {name} ... FAILED\n{}", indent(diff.trim_end()))
            }
        }
        .map_err(out_err)?;
        summary.results.push(result);
    }
    writeln!(out, "{summary}").map_err(out_err)?;
    Ok(summary)
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("    {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(json: &str) -> WireBatch {
        json::read::<ReadBatch>(json).expect(json).batch()
    }

    fn expected(json: &str) -> Expected {
        json::read(json).expect(json)
    }

    #[test]
    fn changes_the_source_could_produce_become_host_changes() {
        let b = batch(
            r#"{"changes": [
                {"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "v": "a"}},
                {"op": "update", "table": "t", "key": ["id"], "old": {"id": 1},
                 "new": {"id": 2, "v": {"unchanged": true}}},
                {"op": "delete", "table": "t", "old": {"id": 2, "v": "a"}},
                {"op": "truncate", "truncate": {"tables": [{"schema": "s", "table": "u"}]}},
                {"op": "message", "message": {"prefix": "p", "content": "hi"}},
                {"op": "snapshot", "table": "t", "new": {"id": 3}},
                {"op": "insert", "table": "t", "new": {"id": 4}, "route": "r"}
            ]}"#,
        );
        let items = source_items(&b);
        assert_eq!(items.source.changes.len(), 6);
        assert!(matches!(
            items.items.as_slice(),
            [
                Item::Source(0),
                Item::Source(1),
                Item::Source(2),
                Item::Source(3),
                Item::Source(4),
                Item::Source(5),
                Item::Wire(_)
            ]
        ));
        assert!(matches!(&items.source.changes[5], Change::Snapshot { .. }));
        // Whatever path each took, the module sees the fixture's changes.
        let seen: Vec<WireChange> = items.changes().map(|c| c.to_wire()).collect();
        assert_eq!(seen, b.changes);
        match &items.source.changes[1] {
            Change::Update { old: Some(old), .. } => assert!(old.key_only),
            other => panic!("{other:?}"),
        }
        match &items.source.changes[2] {
            Change::Delete { old, .. } => assert!(!old.key_only),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn only_what_the_expected_file_states_is_compared() {
        let int4 = Actual::Changes(
            batch(
                r#"{"changes": [{"op": "insert", "table": "t",
                    "columns": [{"name": "id", "type": "int4", "key": true}], "new": {"id": 1}}]}"#,
            )
            .changes,
        );
        let loose = expected(r#"{"changes": [{"op": "insert", "table": "t", "new": {"id": 1}}]}"#);
        assert_eq!(compare(&loose, &int4), None, "columns not stated");
        let typed = expected(
            r#"{"changes": [{"op": "insert", "table": "t",
                "columns": [{"name": "id", "type": "int8", "key": true}], "new": {"id": 1}}]}"#,
        );
        let diff = compare(&typed, &int4).expect("int8 is not int4");
        assert!(diff.contains("-") && diff.contains("int4"), "{diff}");
        let other_value =
            expected(r#"{"changes": [{"op": "insert", "table": "t", "new": {"id": 1.0}}]}"#);
        assert!(
            compare(&other_value, &int4).is_some(),
            "1.0 is a float, not 1"
        );
        assert!(compare(&expected(r#"{"changes": []}"#), &int4).is_some());
    }

    #[test]
    fn an_expected_error_matches_on_kind_substring_and_index() {
        let actual = Actual::Error {
            kind: "guest_error".into(),
            message: "amount must be positive (got -3)".into(),
            index: Some(2),
        };
        let want = |json: &str| compare(&expected(json), &actual);
        assert_eq!(
            want(r#"{"error": {"kind": "guest_error", "message": "must be positive"}}"#),
            None
        );
        assert_eq!(
            want(r#"{"error": {"kind": "guest_error", "message": "", "index": 2}}"#),
            None
        );
        assert!(want(r#"{"error": {"kind": "trap"}}"#).is_some());
        assert!(want(r#"{"error": {"kind": "guest_error", "index": 1}}"#).is_some());
        assert!(want(r#"{"error": {"kind": "guest_error", "message": "negative"}}"#).is_some());
        assert!(want(r#"{"changes": []}"#).is_some());
        let err = json::read::<Expected>(r#"{"changes": [], "error": {"kind": "trap"}}"#)
            .expect_err("both");
        assert!(err.message.contains("exactly one"), "{err}");
    }
}
