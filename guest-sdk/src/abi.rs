//! What each kind of transform does with a batch, from the input's bytes to
//! the result envelope's (`docs/abi.md`), on every target.
//!
//! Owns the drivers the macros' glue calls — [`filter`], [`map`],
//! [`flat_map`], [`transform`], [`init`] — and the traits that say which
//! function signatures each accepts. The drivers never panic on bad input: a
//! batch or a change that does not decode becomes an error envelope (with the
//! change's index). Moving bytes across the wasm boundary, the exports and
//! the panic hook belong to `exports` (wasm32 only); native tests run these
//! same drivers through [`testing`](crate::testing).
//!
//! Output economy: a filter answers with the indexes it keeps; a map or
//! flat-map encodes each change it returns and, when those bytes equal the
//! input change's, answers with the index instead (a memcmp, cheaper for the
//! host than decoding the change again); a transform's [`Output::Keep`]
//! costs one integer.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::Config;
use crate::error::{Error, Result};
use crate::lazy::{LazyBatch, each_change};
use crate::msgpack::{CHANGES_PREFIX, MAX_ARRAY_HEADER, write_array_len, write_uint};
use crate::row::Shared;
use crate::wire::{Batch, Change, Envelope, Op, Output, to_msgpack};

/// The input change being processed, or -1: the panic hook reads it.
static CURRENT: AtomicI64 = AtomicI64::new(-1);

fn set_current(index: Option<u32>) {
    CURRENT.store(index.map_or(-1, i64::from), Ordering::Relaxed);
}

/// The index of the input change being processed, if any: read by the panic
/// hook so that a panic message names the change.
pub fn current_change() -> Option<u32> {
    u32::try_from(CURRENT.load(Ordering::Relaxed)).ok()
}

/// What a `#[filter]` function may return: `Result<bool, E>` where `E`
/// converts into [`Error`].
#[diagnostic::on_unimplemented(
    message = "a `#[filter]` function returns `datum_guest::Result<bool>`, not `{Self}`",
    label = "expected `Result<bool>`"
)]
pub trait FilterResult {
    /// Whether to keep the change.
    fn into_keep(self) -> Result<bool>;
}

impl<E: Into<Error>> FilterResult for std::result::Result<bool, E> {
    fn into_keep(self) -> Result<bool> {
        self.map_err(Into::into)
    }
}

/// What a `#[map]` function may return: `Result<Change, E>`, or
/// `Result<Option<Change>, E>` to drop some changes.
#[diagnostic::on_unimplemented(
    message = "a `#[map]` function returns `datum_guest::Result<Change>` or `Result<Option<Change>>`, not `{Self}`",
    label = "expected `Result<Change>`"
)]
pub trait MapResult {
    /// The change to emit, if any.
    fn into_change(self) -> Result<Option<Change>>;
}

impl<E: Into<Error>> MapResult for std::result::Result<Change, E> {
    fn into_change(self) -> Result<Option<Change>> {
        self.map(Some).map_err(Into::into)
    }
}

impl<E: Into<Error>> MapResult for std::result::Result<Option<Change>, E> {
    fn into_change(self) -> Result<Option<Change>> {
        self.map_err(Into::into)
    }
}

/// What a `#[flat_map]` function may return: `Result<Vec<Change>, E>`.
#[diagnostic::on_unimplemented(
    message = "a `#[flat_map]` function returns `datum_guest::Result<Vec<Change>>`, not `{Self}`",
    label = "expected `Result<Vec<Change>>`"
)]
pub trait FlatMapResult {
    /// The changes to emit, in order.
    fn into_changes(self) -> Result<Vec<Change>>;
}

impl<E: Into<Error>> FlatMapResult for std::result::Result<Vec<Change>, E> {
    fn into_changes(self) -> Result<Vec<Change>> {
        self.map_err(Into::into)
    }
}

/// What a `#[transform]` function may return: `Result<Vec<Change>, E>`
/// (every change encoded) or `Result<Vec<Output>, E>` (kept input changes by
/// index, new ones in full).
#[diagnostic::on_unimplemented(
    message = "a `#[transform]` function returns `datum_guest::Result<Vec<Output>>` or `Result<Vec<Change>>`, not `{Self}`",
    label = "expected `Result<Vec<Output>>` or `Result<Vec<Change>>`"
)]
pub trait TransformResult {
    /// The output, in order.
    fn into_outputs(self) -> Result<Vec<Output>>;
}

impl<E: Into<Error>> TransformResult for std::result::Result<Vec<Output>, E> {
    fn into_outputs(self) -> Result<Vec<Output>> {
        self.map_err(Into::into)
    }
}

impl<E: Into<Error>> TransformResult for std::result::Result<Vec<Change>, E> {
    fn into_outputs(self) -> Result<Vec<Output>> {
        self.map(|changes| {
            changes
                .into_iter()
                .map(|c| Output::Change(Box::new(c)))
                .collect()
        })
        .map_err(Into::into)
    }
}

/// What a `#[transform]` function may take: a [`Batch`] (every change
/// decoded) or a [`LazyBatch`] (changes decoded on demand).
#[diagnostic::on_unimplemented(
    message = "a `#[transform]` function takes a `Batch` or a `LazyBatch`, not `{Self}`",
    label = "expected `Batch` or `LazyBatch`"
)]
pub trait TransformInput: Sized {
    /// Reads the input from its MessagePack form.
    fn from_msgpack(bytes: Vec<u8>) -> Result<Self>;

    /// The number of input changes.
    fn change_count(&self) -> usize;
}

impl TransformInput for Batch {
    fn from_msgpack(bytes: Vec<u8>) -> Result<Batch> {
        LazyBatch::from_msgpack(bytes)?.decode()
    }

    fn change_count(&self) -> usize {
        self.changes.len()
    }
}

impl TransformInput for LazyBatch {
    fn from_msgpack(bytes: Vec<u8>) -> Result<LazyBatch> {
        LazyBatch::from_msgpack(bytes)
    }

    fn change_count(&self) -> usize {
        self.len()
    }
}

/// What an `#[init]` function may return: `Result<(), E>`.
#[diagnostic::on_unimplemented(
    message = "an `#[init]` function returns `datum_guest::Result<()>`, not `{Self}`",
    label = "expected `Result<()>`"
)]
pub trait InitResult {
    /// Whether the configuration was accepted.
    fn into_result(self) -> Result<()>;
}

impl<E: Into<Error>> InitResult for std::result::Result<(), E> {
    fn into_result(self) -> Result<()> {
        self.map_err(Into::into)
    }
}

/// The envelope of an error.
pub fn error_envelope(error: Error) -> Vec<u8> {
    // Encoding a string and an integer cannot fail; an empty buffer would be
    // reported by the host as an invalid output.
    to_msgpack(&Envelope::Error {
        error: error.into_guest_error(),
    })
    .unwrap_or_default()
}

/// `{"changes": [...]}` around `count` elements already encoded in `body`,
/// in a buffer of exactly the right size.
fn changes_envelope(count: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(CHANGES_PREFIX.len() + MAX_ARRAY_HEADER + body.len());
    out.extend_from_slice(CHANGES_PREFIX);
    write_array_len(&mut out, count);
    out.extend_from_slice(body);
    out
}

fn encode_change(body: &mut Vec<u8>, change: &Change) -> Result<()> {
    crate::write::change(body, change)
        .map_err(|e| Error::new(format!("cannot encode a change: {e}")))
}

/// Appends `change` to `body`, or input change `index` when the change is
/// byte for byte the input one.
fn emit(body: &mut Vec<u8>, change: &Change, input: &[u8], index: u32) -> Result<()> {
    let start = body.len();
    encode_change(body, change)?;
    if body[start..] == *input {
        body.truncate(start);
        write_uint(body, index);
    }
    Ok(())
}

fn count(n: usize) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::new("more than 2^32 output changes"))
}

/// Runs `per_change` on each input change; it appends its output to the body
/// and returns how many elements it appended.
///
/// A `schema` change passes through by index without reaching
/// `per_change`, unless `schema_changes` says the function asked for them.
fn per_change(
    input: Vec<u8>,
    schema_changes: bool,
    mut per_change: impl FnMut(&mut Vec<u8>, Change, &[u8], u32) -> Result<usize>,
) -> Vec<u8> {
    let outcome = (|| {
        let input = Shared::new(input);
        let mut body = Vec::new();
        let mut elements = 0usize;
        each_change(&input, |index, range, change| {
            set_current(Some(index));
            if change.op == Op::Schema && !schema_changes {
                write_uint(&mut body, index);
                elements += 1;
                return Ok(());
            }
            let bytes = input.get(range).unwrap_or_default();
            elements += per_change(&mut body, change, bytes, index).map_err(|e| e.or_at(index))?;
            Ok(())
        })?;
        set_current(None);
        Ok(changes_envelope(count(elements)?, &body))
    })();
    set_current(None);
    outcome.unwrap_or_else(error_envelope)
}

/// A filter: keeps the changes for which `keep` answers `true`, by index
/// (and every `schema` change, unless `schema_changes`).
pub fn filter<F, R>(input: Vec<u8>, mut keep: F, schema_changes: bool) -> Vec<u8>
where
    F: FnMut(&Change) -> R,
    R: FilterResult,
{
    per_change(input, schema_changes, |body, change, _, index| {
        if keep(&change).into_keep()? {
            write_uint(body, index);
            Ok(1)
        } else {
            Ok(0)
        }
    })
}

/// A map: replaces each change by what `f` returns (or drops it on `None`);
/// a `schema` change passes through unless `schema_changes`.
pub fn map<F, R>(input: Vec<u8>, mut f: F, schema_changes: bool) -> Vec<u8>
where
    F: FnMut(Change) -> R,
    R: MapResult,
{
    per_change(
        input,
        schema_changes,
        |body, change, bytes, index| match f(change).into_change()? {
            Some(out) => {
                emit(body, &out, bytes, index)?;
                Ok(1)
            }
            None => Ok(0),
        },
    )
}

/// A flat map: replaces each change by the changes `f` returns; a `schema`
/// change passes through unless `schema_changes`.
pub fn flat_map<F, R>(input: Vec<u8>, mut f: F, schema_changes: bool) -> Vec<u8>
where
    F: FnMut(Change) -> R,
    R: FlatMapResult,
{
    per_change(input, schema_changes, |body, change, bytes, index| {
        let outs = f(change).into_changes()?;
        for out in &outs {
            emit(body, out, bytes, index)?;
        }
        Ok(outs.len())
    })
}

/// A transform: `f` sees the whole batch and returns the whole output.
/// A kept index past the input's end is an error here rather than an
/// invalid output at the host.
pub fn transform<I, F, R>(input: Vec<u8>, f: F) -> Vec<u8>
where
    I: TransformInput,
    F: FnOnce(I) -> R,
    R: TransformResult,
{
    set_current(None);
    let outcome = (|| {
        let batch = I::from_msgpack(input)?;
        let n = batch.change_count();
        let outputs = f(batch).into_outputs()?;
        let mut body = Vec::new();
        for output in &outputs {
            match output {
                Output::Keep(index) if (*index as usize) < n => write_uint(&mut body, *index),
                Output::Keep(index) => {
                    return Err(Error::new(format!(
                        "the output keeps change {index}, but the batch has {n}"
                    )));
                }
                Output::Change(change) => encode_change(&mut body, change)?,
            }
        }
        Ok(changes_envelope(count(outputs.len())?, &body))
    })();
    outcome.unwrap_or_else(error_envelope)
}

/// An init: `f` reads the configuration. `None` is success (the export
/// answers 0); otherwise the error envelope.
pub fn init<F, R>(input: Vec<u8>, f: F) -> Option<Vec<u8>>
where
    F: FnOnce(Config) -> R,
    R: InitResult,
{
    set_current(None);
    Config::from_msgpack(input)
        .and_then(|config| f(config).into_result())
        .err()
        .map(error_envelope)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{run_filter, run_flat_map, run_init, run_map, run_transform};
    use crate::wire::{GuestError, Txn, from_msgpack};
    use crate::{Context, LazyBatch, bail, row};

    fn batch(n: i64) -> Batch {
        Batch::new(
            Txn::committed(9, 1000),
            (0..n)
                .map(|id| {
                    Change::insert("public", "users")
                        .column("id", "int4", true)
                        .column("email", "text", false)
                        .new_row(row! { "id" => id, "email" => format!("u{id}@x") })
                })
                .collect(),
        )
    }

    fn envelope(bytes: &[u8]) -> Envelope {
        from_msgpack(bytes).expect("an envelope")
    }

    #[test]
    fn schema_changes_pass_a_per_change_function_by_unless_it_asks_for_them() {
        let mut input = batch(2);
        input
            .changes
            .insert(1, Change::new(Op::Schema, "public", "users"));
        let bytes = to_msgpack(&input).expect("encodes");
        let drop_all = |_: &Change| -> Result<bool> { Ok(false) };
        let kept = |answer: Vec<u8>| match envelope(&answer) {
            Envelope::Changes { changes } => changes,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            kept(filter(bytes.clone(), drop_all, false)),
            vec![Output::Keep(1)],
            "a schema change passes a filter that did not ask for it"
        );
        assert!(kept(filter(bytes.clone(), drop_all, true)).is_empty());
        let mut seen = Vec::new();
        let answer = map(
            bytes.clone(),
            |c: Change| -> Result<Option<Change>> {
                seen.push(c.op);
                Ok(None)
            },
            false,
        );
        assert_eq!(kept(answer), vec![Output::Keep(1)]);
        assert_eq!(seen, [Op::Insert, Op::Insert]);
        let answer = flat_map(
            bytes,
            |_: Change| -> Result<Vec<Change>> { Ok(vec![]) },
            true,
        );
        assert!(kept(answer).is_empty());
    }

    #[test]
    fn a_filter_answers_with_indexes() {
        let even = |c: &Change| -> Result<bool> {
            Ok(c.row().and_then(|r| r.get_i64("id")).context("no id")? % 2 == 0)
        };
        let answer = run_filter(even, &batch(5)).expect("ok");
        assert_eq!(answer.kept(), [0, 2, 4]);
        assert_eq!(answer.outputs.len(), 3);
        let all = run_filter(|_: &Change| Ok::<_, Error>(true), &batch(300)).expect("ok");
        assert_eq!(all.kept(), (0..300).collect::<Vec<_>>());
        let none = run_filter(|_: &Change| Ok::<_, Error>(false), &batch(3)).expect("ok");
        assert!(none.outputs.is_empty());
    }

    #[test]
    fn an_error_blames_the_change_unless_it_names_one() {
        let picky = |c: &Change| -> Result<bool> {
            match c.row().and_then(|r| r.get_i64("id")) {
                Some(3) => bail!("id 3 is not welcome"),
                Some(4) => Err(Error::new("blames 0").at(0)),
                _ => Ok(true),
            }
        };
        let err = run_filter(picky, &batch(4)).unwrap_err();
        assert_eq!(
            (err.message(), err.index()),
            ("id 3 is not welcome", Some(3))
        );
        let err = run_filter(picky, &batch(5)).map(|_| ()).unwrap_err();
        assert_eq!(err.index(), Some(3), "the first failure wins");
        let err = run_map(
            |c: Change| -> Result<Change> {
                if c.row().and_then(|r| r.get_i64("id")) == Some(4) {
                    return Err(Error::new("blames 0").at(0));
                }
                Ok(c)
            },
            &batch(5),
        )
        .unwrap_err();
        assert_eq!(err.index(), Some(0));
    }

    #[test]
    fn a_map_answers_an_unchanged_change_by_index() {
        let upper_odd = |mut c: Change| -> Result<Change> {
            let id = c.row().and_then(|r| r.get_i64("id")).context("no id")?;
            if id % 2 == 1
                && let Some(row) = c.new_mut()
            {
                row.set("email", "HIDDEN");
            }
            Ok(c)
        };
        let answer = run_map(upper_odd, &batch(3)).expect("ok");
        assert!(matches!(answer.outputs[0], Output::Keep(0)));
        assert!(matches!(answer.outputs[1], Output::Change(_)));
        assert!(matches!(answer.outputs[2], Output::Keep(2)));
        assert_eq!(
            answer.changes()[1]
                .new
                .as_ref()
                .and_then(|r| r.get_str("email")),
            Some("HIDDEN")
        );
        let drop_all = run_map(|_: Change| Ok::<Option<Change>, Error>(None), &batch(3));
        assert_eq!(drop_all.map(|a| a.outputs.len()), Ok(0));
    }

    #[test]
    fn a_flat_map_keeps_what_it_does_not_change() {
        let split = |c: Change| -> Result<Vec<Change>> {
            let audit = Change::insert("public", "audit").new_row(row! { "of" => c.table.clone() });
            Ok(vec![c, audit])
        };
        let answer = run_flat_map(split, &batch(2)).expect("ok");
        assert_eq!(answer.kept(), [0, 1]);
        assert_eq!(answer.outputs.len(), 4);
        assert_eq!(answer.changes()[1].table, "audit");
    }

    #[test]
    fn a_transform_returns_outputs_or_changes() {
        let reverse = |b: Batch| -> Result<Vec<Output>> {
            Ok((0..b.changes.len() as u32)
                .rev()
                .map(Output::Keep)
                .collect())
        };
        assert_eq!(
            run_transform(reverse, &batch(3)).map(|a| a.kept()),
            Ok(vec![2, 1, 0])
        );
        let count = |b: Batch| -> Result<Vec<Change>> {
            Ok(vec![
                Change::insert("s", "counts").new_row(row! { "n" => b.changes.len() as i64 }),
            ])
        };
        let answer = run_transform(count, &batch(3)).expect("ok");
        assert_eq!(
            answer.changes()[0]
                .new
                .as_ref()
                .and_then(|r| r.get_i64("n")),
            Some(3)
        );
        let identity = |b: LazyBatch| -> Result<Vec<Output>> { Ok(b.keep_all()) };
        assert_eq!(
            run_transform(identity, &batch(4)).map(|a| a.kept()),
            Ok(vec![0, 1, 2, 3])
        );
        let past_the_end = |_: LazyBatch| -> Result<Vec<Output>> { Ok(vec![Output::Keep(3)]) };
        let err = run_transform(past_the_end, &batch(3)).unwrap_err();
        assert_eq!(
            err.message(),
            "the output keeps change 3, but the batch has 3"
        );
    }

    #[test]
    fn bad_input_is_an_error_envelope_never_a_panic() {
        let keep = |_: &Change| Ok::<_, Error>(true);
        for input in [
            vec![],
            vec![0xc1],
            vec![0x81, 0xa3],
            b"\x82\xa3txn\x80\xa7changes\x91\x01".to_vec(),
        ] {
            match envelope(&filter(input.clone(), keep, false)) {
                Envelope::Error { error } => assert!(!error.message.is_empty()),
                other => panic!("{input:?} gave {other:?}"),
            }
        }
        // The last input's change is the integer 1: blamed by index.
        let bad_change = b"\x82\xa3txn\x80\xa7changes\x91\x01".to_vec();
        match envelope(&map(bad_change, Ok::<Change, Error>, false)) {
            Envelope::Error {
                error: GuestError { index, message },
            } => {
                assert_eq!(index, Some(0));
                assert!(message.starts_with("cannot decode change 0"), "{message}");
            }
            other => panic!("{other:?}"),
        }
        // The transaction may be empty for a filter; a transform needs it.
        let empty_txn = b"\x82\xa3txn\x80\xa7changes\x90".to_vec();
        assert!(matches!(
            envelope(&filter(empty_txn.clone(), keep, false)),
            Envelope::Changes { .. }
        ));
        let transform_err = transform(empty_txn, |b: Batch| Ok::<Vec<Change>, Error>(b.changes));
        assert!(matches!(envelope(&transform_err), Envelope::Error { .. }));
    }

    #[test]
    fn init_answers_nothing_on_success() {
        let cfg = Config::from_json(serde_json::json!({"column": "email"}));
        let needs_limit = |c: Config| -> Result<()> { c.require::<i64>("limit").map(|_| ()) };
        assert_eq!(
            run_init(needs_limit, &cfg).unwrap_err().message(),
            "configuration key `limit` is required"
        );
        assert_eq!(
            run_init(|c: Config| c.reject_unknown(&["column"]), &cfg),
            Ok(())
        );
        assert!(
            init(vec![], |c: Config| {
                assert!(c.is_empty());
                Ok::<(), Error>(())
            })
            .is_none()
        );
        assert!(init(vec![0x91], |_: Config| Ok::<(), Error>(())).is_some());
    }

    #[test]
    fn an_envelope_is_the_documented_shape() {
        let bytes = filter(
            crate::wire::to_msgpack(&batch(2)).expect("encode"),
            |_: &Change| Ok::<_, Error>(true),
            false,
        );
        assert_eq!(bytes, b"\x81\xa7changes\x92\x00\x01");
    }
}
