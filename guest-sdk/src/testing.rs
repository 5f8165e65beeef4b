//! Running a transform natively, through the same drivers the wasm glue
//! uses: the batch is encoded, processed and the envelope decoded exactly as
//! in the host, minus the wasm boundary and the panic hook.
//!
//! ```
//! use datum_guest::{Change, Batch, Result, Txn, row, testing};
//!
//! fn keep_even(c: &Change) -> Result<bool> {
//!     Ok(c.row().and_then(|r| r.get_i64("id")).is_some_and(|id| id % 2 == 0))
//! }
//!
//! let batch = Batch::new(Txn::committed(1, 10), (1..=4)
//!     .map(|id| Change::insert("s", "t").new_row(row! { "id" => id }))
//!     .collect());
//! let answer = testing::run_filter(keep_even, &batch).unwrap();
//! assert_eq!(answer.kept(), [1, 3]);
//! ```
//!
//! A module whose behaviour depends on its configuration is tested the way
//! the host runs it: [`run_init`] first, with a [`Config`] as the pipeline's
//! TOML table gives it ([`Config::from_toml`]), then [`run_map`] (or any
//! other `run_*`) on a batch. An `#[init]` keeps its settings in a `static`,
//! which is set once per process; to try other configurations, test the
//! logic with the settings passed in.
//!
//! ```
//! use std::sync::OnceLock;
//!
//! use datum_guest::{Batch, Change, Config, Context, Error, Result, Txn, init, map, row, testing};
//!
//! /// Replaces a column's value with a mask.
//! struct Settings {
//!     column: String,
//!     mask: String,
//! }
//!
//! impl Settings {
//!     fn from_config(config: &Config) -> Result<Settings> {
//!         config.reject_unknown(&["column", "mask"])?;
//!         Ok(Settings {
//!             column: config.require("column")?,
//!             mask: config.get("mask")?.unwrap_or_else(|| "***".to_owned()),
//!         })
//!     }
//!
//!     fn apply(&self, mut change: Change) -> Result<Change> {
//!         for row in change.rows_mut() {
//!             if row.get(&self.column).is_some_and(|v| !v.is_null()) {
//!                 row.set(self.column.as_str(), self.mask.as_str());
//!             }
//!         }
//!         Ok(change)
//!     }
//! }
//!
//! static SETTINGS: OnceLock<Settings> = OnceLock::new();
//!
//! #[init]
//! fn configure(config: Config) -> Result<()> {
//!     let settings = Settings::from_config(&config)?;
//!     SETTINGS.set(settings).map_err(|_| Error::new("configured twice"))
//! }
//!
//! #[map]
//! fn mask(change: Change) -> Result<Change> {
//!     SETTINGS.get().context("not configured")?.apply(change)
//! }
//!
//! let batch = Batch::new(Txn::committed(1, 10), vec![
//!     Change::insert("public", "users").new_row(row! { "id" => 1, "email" => "ada@example.com" }),
//! ]);
//! let email = |answer: &testing::Answer| {
//!     answer.changes()[0].new.as_ref().and_then(|r| r.get_str("email")).map(str::to_owned)
//! };
//!
//! // Configured, then fed a batch, as in a pipeline.
//! testing::run_init(configure, &Config::from_toml(r#"column = "email""#)).unwrap();
//! let answer = testing::run_map(mask, &batch).unwrap();
//! assert_eq!(email(&answer).as_deref(), Some("***"));
//!
//! // A configuration the module refuses: the error the host would report.
//! let typo = Config::from_toml(r#"colum = "email""#);
//! let error = testing::run_init(|c| Settings::from_config(&c).map(drop), &typo).unwrap_err();
//! assert_eq!(error.message(), "unknown configuration key `colum` (expected one of: column, mask)");
//!
//! // Another configuration, its settings passed to the same logic.
//! let other = Settings::from_config(&Config::from_toml(r#"
//!     column = "email"
//!     mask = "redacted"
//! "#)).unwrap();
//! let answer = testing::run_map(|c| other.apply(c), &batch).unwrap();
//! assert_eq!(email(&answer).as_deref(), Some("redacted"));
//! ```

use crate::Config;
use crate::abi::{
    self, FilterResult, FlatMapResult, InitResult, MapResult, TransformInput, TransformResult,
};
use crate::error::{Error, Result};
use crate::wire::{Batch, Change, Envelope, Output, from_msgpack, to_msgpack};

/// What a module answered for a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    /// The output as the host receives it: kept input indexes and changes.
    pub outputs: Vec<Output>,
    input: Vec<Change>,
}

impl Answer {
    /// The indexes of the input changes kept unchanged, in output order.
    pub fn kept(&self) -> Vec<u32> {
        self.outputs
            .iter()
            .filter_map(|o| match o {
                Output::Keep(i) => Some(*i),
                Output::Change(_) => None,
            })
            .collect()
    }

    /// The output changes, each kept index replaced by its input change, as
    /// the host sees them.
    pub fn changes(&self) -> Vec<Change> {
        self.outputs
            .iter()
            .map(|o| match o {
                Output::Keep(i) => self.input[*i as usize].clone(),
                Output::Change(c) => (**c).clone(),
            })
            .collect()
    }
}

fn run(batch: &Batch, driver: impl FnOnce(Vec<u8>) -> Vec<u8>) -> Result<Answer> {
    let input =
        to_msgpack(batch).map_err(|e| Error::new(format!("cannot encode the batch: {e}")))?;
    let envelope = driver(input);
    match from_msgpack::<Envelope>(&envelope) {
        Ok(Envelope::Changes { changes }) => {
            for output in &changes {
                if let Output::Keep(i) = output {
                    assert!(
                        (*i as usize) < batch.changes.len(),
                        "the envelope keeps change {i} of {}",
                        batch.changes.len()
                    );
                }
            }
            Ok(Answer {
                outputs: changes,
                input: batch.changes.clone(),
            })
        }
        Ok(Envelope::Error { error }) => {
            let e = Error::new(error.message);
            Err(match error.index {
                Some(i) => e.at(i as usize),
                None => e,
            })
        }
        Ok(Envelope::Ok {}) => panic!("a transform answered an init's envelope"),
        Err(e) => panic!("the envelope does not decode: {e}"),
    }
}

/// Runs a `#[filter]` function on a batch (`schema` changes pass it by,
/// as for `#[filter]` without `schema_changes`).
pub fn run_filter<F, R>(f: F, batch: &Batch) -> Result<Answer>
where
    F: FnMut(&Change) -> R,
    R: FilterResult,
{
    run(batch, |input| abi::filter(input, f, false))
}

/// Runs a `#[map]` function on a batch.
pub fn run_map<F, R>(f: F, batch: &Batch) -> Result<Answer>
where
    F: FnMut(Change) -> R,
    R: MapResult,
{
    run(batch, |input| abi::map(input, f, false))
}

/// Runs a `#[flat_map]` function on a batch.
pub fn run_flat_map<F, R>(f: F, batch: &Batch) -> Result<Answer>
where
    F: FnMut(Change) -> R,
    R: FlatMapResult,
{
    run(batch, |input| abi::flat_map(input, f, false))
}

/// Runs a `#[transform]` function on a batch.
pub fn run_transform<I, F, R>(f: F, batch: &Batch) -> Result<Answer>
where
    I: TransformInput,
    F: FnOnce(I) -> R,
    R: TransformResult,
{
    run(batch, |input| abi::transform(input, f))
}

/// Runs an `#[init]` function on a configuration, through its MessagePack
/// form.
pub fn run_init<F, R>(f: F, config: &Config) -> Result<()>
where
    F: FnOnce(Config) -> R,
    R: InitResult,
{
    match abi::init(config.as_msgpack().to_vec(), f) {
        None => Ok(()),
        Some(envelope) => match from_msgpack::<Envelope>(&envelope) {
            Ok(Envelope::Error { error }) => Err(Error::new(error.message)),
            other => panic!("an init answered {other:?}"),
        },
    }
}
