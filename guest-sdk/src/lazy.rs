//! A batch whose changes are decoded only when asked for.
//!
//! Owns walking a batch's MessagePack frame: reading its changes in one
//! pass for a filter or a map (`each_change`: each change's index and byte
//! range come with it, so one that fails to decode is blamed by its index,
//! and one returned unchanged is answered by its index), and splitting it
//! into its transaction and one byte range per change for [`LazyBatch`],
//! which a `#[transform]` function may take instead of a [`Batch`] to pay
//! only for the changes it reads: `identity` reads none.

use std::ops::Range;

use crate::error::{Error, Result};
use crate::msgpack::Reader;
use crate::read::Shapes;
use crate::row::Shared;
use crate::wire::{Batch, Change, Output, Txn, from_msgpack, to_msgpack};

/// Where the parts of an encoded batch are.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) txn: Range<usize>,
    pub(crate) changes: Vec<Range<usize>>,
}

fn malformed(e: crate::msgpack::Malformed) -> Error {
    Error::new(format!("malformed batch: {e}"))
}

/// Walks an encoded batch's frame: `each` reads change `index` where the
/// reader is and leaves it past the change. Unknown keys are skipped;
/// `txn` and `changes` must be there, once each. Returns where `txn` is.
fn walk<'a>(
    bytes: &'a [u8],
    mut each: impl FnMut(&mut Reader<'a>, u32) -> Result<()>,
) -> Result<Range<usize>> {
    let mut reader = Reader::new(bytes);
    let (mut txn, mut changes) = (None, false);
    for _ in 0..reader.map_len().map_err(malformed)? {
        match reader.str_or_skip().map_err(malformed)? {
            Some("txn") if txn.is_none() => txn = Some(reader.skip().map_err(malformed)?),
            Some("changes") if !changes => {
                let len = reader.array_len().map_err(malformed)?;
                let len = u32::try_from(len)
                    .map_err(|_| Error::new("malformed batch: too many changes"))?;
                for index in 0..len {
                    each(&mut reader, index)?;
                }
                changes = true;
            }
            Some(key @ ("txn" | "changes")) => {
                return Err(Error::new(format!("malformed batch: `{key}` twice")));
            }
            _ => {
                reader.skip().map_err(malformed)?;
            }
        }
    }
    if !reader.at_end() {
        return Err(Error::new(format!(
            "malformed batch: {} bytes after the batch",
            bytes.len() - reader.position()
        )));
    }
    match (txn, changes) {
        (None, _) => Err(Error::new("malformed batch: no `txn`")),
        (_, false) => Err(Error::new("malformed batch: no `changes`")),
        (Some(txn), true) => Ok(txn),
    }
}

impl Layout {
    /// Splits an encoded batch (see `walk`), comparing its first change
    /// with the head the last batch split on this thread ended with.
    pub(crate) fn of(bytes: &[u8]) -> Result<Layout> {
        Layout::of_counted(bytes).map(|(layout, _)| layout)
    }

    /// [`Layout::of`], with how many changes were walked value by value.
    fn of_counted(bytes: &[u8]) -> Result<(Layout, u32)> {
        let taken = |last: &std::cell::RefCell<Vec<u8>>| std::mem::take(&mut *last.borrow_mut());
        let mut head = Head {
            here: None,
            // None while the thread's locals are being destroyed.
            earlier: LAST_HEAD.try_with(taken).unwrap_or_default(),
            walked: 0,
        };
        let layout = Layout::of_with(bytes, &mut head);
        let walked = head.walked;
        let kept = head.keep(bytes);
        let _ = LAST_HEAD.try_with(|last| *last.borrow_mut() = kept);
        Ok((layout?, walked))
    }

    fn of_with(bytes: &[u8], head: &mut Head) -> Result<Layout> {
        let mut changes = Vec::new();
        let txn = walk(bytes, |reader, _| {
            changes.push(skip_change(reader, bytes, head).map_err(malformed)?);
            Ok(())
        })?;
        Ok(Layout { txn, changes })
    }
}

/// Most bytes of a head kept from one batch to the next.
const HEAD_KEPT: usize = 4096;

thread_local! {
    /// The head the last batch split on this thread ended with: a module's
    /// instance splits batch after batch, and a stream of 1-row
    /// transactions of one table has one change per batch, each with the
    /// same head.
    static LAST_HEAD: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// What a change is compared with before it is walked (see
/// [`skip_change`]).
struct Head {
    /// The last head met in this batch, as a range of its bytes.
    here: Option<Range<usize>>,
    /// The head an earlier batch ended with (empty for none), until this
    /// batch has one.
    earlier: Vec<u8>,
    /// How many changes were walked value by value.
    walked: u32,
}

impl Head {
    /// The bytes to compare the next batch's first change with: this
    /// batch's last head, or none when it is over `HEAD_KEPT` bytes; the
    /// earlier one when this batch had no head.
    fn keep(self, bytes: &[u8]) -> Vec<u8> {
        match self.here.and_then(|range| bytes.get(range)) {
            Some(here) if here.len() <= HEAD_KEPT => {
                let mut kept = self.earlier;
                kept.clear();
                kept.extend_from_slice(here);
                kept
            }
            Some(_) => Vec::new(),
            None => self.earlier,
        }
    }
}

/// Skips the change `reader` (over `bytes`) is at; returns its range.
///
/// A change is a map, and the changes of a batch mostly differ only in
/// their last entry (the row of an insert or a snapshot row): `op`,
/// `schema`, `table` and `columns` (most of a change's values) are byte for
/// byte the last change's. So `head` remembers a change's bytes up to its
/// last value (the last one of this batch, or before this batch has one the
/// one an earlier batch ended with), and a change that starts with the same
/// bytes is read up to there by comparing them: the same bytes parse the
/// same way (the map's size, every entry before the last and the last key),
/// and only the last value is walked. Any other map is walked value by
/// value and becomes the `head`; anything else is skipped as any value is.
fn skip_change(
    reader: &mut Reader<'_>,
    bytes: &[u8],
    head: &mut Head,
) -> std::result::Result<Range<usize>, crate::msgpack::Malformed> {
    let start = reader.position();
    let seen = match &head.here {
        Some(range) => bytes.get(range.clone()),
        None => Some(head.earlier.as_slice()).filter(|earlier| !earlier.is_empty()),
    };
    if let Some(seen) = seen
        && let Some(end) = start.checked_add(seen.len())
        && bytes
            .get(start..end)
            .is_some_and(|here| crate::msgpack::same_bytes(here, seen))
    {
        if head.here.is_none() {
            head.here = Some(start..end);
        }
        reader.take(end - start)?;
        reader.skip()?;
        return Ok(start..reader.position());
    }
    if !matches!(reader.peek(), Some(0x80..=0x8f | 0xde | 0xdf)) {
        return reader.skip();
    }
    head.walked += 1;
    let entries = reader.map_len()?;
    for entry in 1..=entries {
        reader.skip()?;
        if entry == entries {
            head.here = Some(start..reader.position());
        }
        reader.skip()?;
    }
    Ok(start..reader.position())
}

/// Reads a batch's changes in one pass, calling `f` with each one's index,
/// its bytes' range and the change, in order: what a filter or a map needs,
/// without splitting the batch first. The frame is checked as
/// [`Layout::of`] checks it (once every change has been read).
pub(crate) fn each_change(
    batch: &Shared,
    mut f: impl FnMut(u32, Range<usize>, Change) -> Result<()>,
) -> Result<()> {
    let bytes = batch.as_slice();
    let mut shapes = Shapes::default();
    walk(bytes, |reader, index| {
        let start = reader.position();
        let change = match crate::read::change_from(reader, batch, &mut shapes) {
            Some(change) => change,
            None => {
                // Not a shape the fast reader knows: `rmp-serde` decides, on
                // the change's own bytes.
                *reader = Reader::at(bytes, start);
                let range = reader.skip().map_err(malformed)?;
                decode_change(batch, range, index as usize, &mut shapes)?
            }
        };
        f(index, start..reader.position(), change)
    })?;
    Ok(())
}

/// Decodes change `index` from its bytes (`range` of the batch); an error
/// blames it.
pub(crate) fn decode_change(
    batch: &Shared,
    range: Range<usize>,
    index: usize,
    shapes: &mut Shapes,
) -> Result<Change> {
    crate::wire::decode_change_at(batch, range, shapes)
        .map_err(|e| Error::new(format!("cannot decode change {index}: {e}")).at(index))
}

/// A batch whose changes are decoded on demand.
///
/// Take it instead of a [`Batch`] in a `#[transform]` function that does not
/// need every change decoded: `identity` answers [`LazyBatch::keep_all`]
/// without decoding any. In tests, build one with [`LazyBatch::from_batch`].
#[derive(Clone)]
pub struct LazyBatch {
    bytes: Shared,
    txn: Txn,
    changes: Vec<Range<usize>>,
}

impl LazyBatch {
    /// Reads a batch's MessagePack form, decoding only its transaction.
    pub fn from_msgpack(bytes: Vec<u8>) -> Result<LazyBatch> {
        let layout = Layout::of(&bytes)?;
        let txn = &bytes[layout.txn.clone()];
        let txn = match crate::read::txn(txn) {
            Some(txn) => txn,
            None => from_msgpack(txn)
                .map_err(|e| Error::new(format!("malformed batch: cannot decode `txn`: {e}")))?,
        };
        Ok(LazyBatch {
            bytes: Shared::new(bytes),
            txn,
            changes: layout.changes,
        })
    }

    /// Encodes a batch and reads it back lazily: for tests.
    pub fn from_batch(batch: &Batch) -> Result<LazyBatch> {
        let bytes = to_msgpack(batch).map_err(|e| Error::new(format!("cannot encode: {e}")))?;
        LazyBatch::from_msgpack(bytes)
    }

    /// The transaction.
    pub fn txn(&self) -> &Txn {
        &self.txn
    }

    /// The number of changes.
    pub fn len(&self) -> usize {
        self.changes.len()
    }

    /// Whether the batch has no change.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// Decodes change `index`; `None` past the end.
    pub fn change(&self, index: usize) -> Option<Result<Change>> {
        let range = self.changes.get(index)?.clone();
        Some(decode_change(
            &self.bytes,
            range,
            index,
            &mut Shapes::single(),
        ))
    }

    /// Decodes every change, in order.
    pub fn changes(&self) -> impl Iterator<Item = Result<Change>> + '_ {
        let mut shapes = Shapes::default();
        self.changes
            .iter()
            .enumerate()
            .map(move |(i, range)| decode_change(&self.bytes, range.clone(), i, &mut shapes))
    }

    /// The MessagePack bytes of change `index`, undecoded.
    pub fn raw_change(&self, index: usize) -> Option<&[u8]> {
        self.changes
            .get(index)
            .and_then(|r| self.bytes.get(r.clone()))
    }

    /// Keeps change `index` unchanged.
    pub fn keep(&self, index: usize) -> Output {
        Output::Keep(index as u32)
    }

    /// Keeps every change unchanged: `[0, 1, ..., n-1]`.
    pub fn keep_all(&self) -> Vec<Output> {
        (0..self.changes.len() as u32).map(Output::Keep).collect()
    }

    /// Decodes the whole batch.
    pub fn decode(&self) -> Result<Batch> {
        Ok(Batch {
            txn: self.txn,
            changes: self.changes().collect::<Result<_>>()?,
        })
    }
}

impl std::fmt::Debug for LazyBatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LazyBatch")
            .field("txn", &self.txn)
            .field("changes", &self.changes.len())
            .field("bytes", &self.bytes.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::row;

    fn batch() -> Batch {
        Batch::new(
            Txn::committed(7, 100),
            vec![
                Change::insert("s", "a").new_row(row! { "id" => 1 }),
                Change::delete("s", "b").old_row(row! { "id" => 2 }),
            ],
        )
    }

    #[test]
    fn decodes_on_demand() {
        let lazy = LazyBatch::from_batch(&batch()).expect("lazy");
        assert_eq!(lazy.txn().xid, 7);
        assert_eq!(lazy.len(), 2);
        assert_eq!(
            lazy.change(1).map(|c| c.map(|c| c.table)),
            Some(Ok("b".into()))
        );
        assert!(lazy.change(2).is_none());
        assert_eq!(lazy.keep_all(), vec![Output::Keep(0), Output::Keep(1)]);
        assert_eq!(lazy.decode(), Ok(batch()));
    }

    #[test]
    fn unknown_keys_are_skipped_and_missing_ones_named() {
        #[derive(serde::Serialize)]
        struct Extended<'a> {
            future: Vec<u8>,
            changes: &'a [Change],
            txn: Txn,
            later: &'a str,
        }
        let b = batch();
        let bytes = to_msgpack(&Extended {
            future: vec![1, 2],
            changes: &b.changes,
            txn: b.txn,
            later: "x",
        })
        .expect("encode");
        assert_eq!(
            LazyBatch::from_msgpack(bytes).and_then(|l| l.decode()),
            Ok(b)
        );
        let no_txn =
            to_msgpack(&std::collections::BTreeMap::from([("changes", [0u8; 0])])).expect("encode");
        let err = LazyBatch::from_msgpack(no_txn).unwrap_err();
        assert_eq!(err.message(), "malformed batch: no `txn`");
        assert!(LazyBatch::from_msgpack(vec![0x92]).is_err());
        // A key twice is refused, not decided by its last value.
        let mut twice = vec![0x83];
        twice.extend_from_slice(&to_msgpack("txn").expect("encode"));
        twice.extend_from_slice(&to_msgpack(&Txn::default()).expect("encode"));
        for _ in 0..2 {
            twice.extend_from_slice(&to_msgpack("changes").expect("encode"));
            twice.push(0x90);
        }
        let err = LazyBatch::from_msgpack(twice.clone()).unwrap_err();
        assert_eq!(err.message(), "malformed batch: `changes` twice");
        let err = each_change(&Shared::new(twice), |_, _, _| Ok(())).unwrap_err();
        assert_eq!(err.message(), "malformed batch: `changes` twice");
    }

    /// What `Layout::of` answered before it compared columns: every change
    /// skipped value by value.
    fn walked(bytes: &[u8]) -> Result<Layout> {
        let mut changes = Vec::new();
        let txn = walk(bytes, |reader, _| {
            changes.push(reader.skip().map_err(malformed)?);
            Ok(())
        })?;
        Ok(Layout { txn, changes })
    }

    /// Changes of every kind and of two tables, no two neighbours with the
    /// same head, then the batch cut short and corrupted byte by byte: the
    /// ranges (or the refusal) are always those of walking every value.
    #[test]
    fn changes_of_every_kind_split_as_walking_them_does() {
        let mut corpus = crate::read::tests::corpus(false);
        let mut other = corpus[0].clone();
        other.columns.truncate(2);
        corpus.insert(1, other.clone());
        corpus.push(other);
        corpus.push(corpus[0].clone());
        let bytes = to_msgpack(&Batch::new(Txn::committed(3, 30), corpus)).expect("encode");
        let layout = Layout::of(&bytes).expect("layout");
        let expected = walked(&bytes).expect("walked");
        assert_eq!(layout.changes, expected.changes);
        assert_eq!(layout.txn, expected.txn);
        variants_split_as_walking(&bytes, 0..bytes.len(), |byte| {
            vec![0x00, 0x80, 0x91, 0xa7, 0xc0, 0xdc, byte ^ 1]
        });
    }

    /// Every cut of `bytes`, and `bytes` with each byte in `at` set to each
    /// of `replacements` of it, split as walking every value does (or are
    /// refused as walking refuses them).
    fn variants_split_as_walking(
        bytes: &[u8],
        at: Range<usize>,
        replacements: impl Fn(u8) -> Vec<u8>,
    ) {
        let mut variants: Vec<Vec<u8>> =
            (0..bytes.len()).map(|cut| bytes[..cut].to_vec()).collect();
        for at in at {
            for replacement in replacements(bytes[at]) {
                let mut mutated = bytes.to_vec();
                mutated[at] = replacement;
                variants.push(mutated);
            }
        }
        // Each also after a batch that ended with the head of `bytes`'s
        // first change: its first change is compared with that one.
        let mut head = fresh();
        let mut first = None;
        walk(bytes, |reader, index| {
            skip_change(reader, bytes, &mut head).map_err(malformed)?;
            if index == 0 {
                first = head.here.clone();
            }
            Ok(())
        })
        .expect("the batch splits");
        let earlier = first.map(|range| bytes[range].to_vec()).expect("a head");
        for variant in variants {
            let walked = walked(&variant).map(|l| (l.txn, l.changes));
            for earlier in [Vec::new(), earlier.clone()] {
                let mut head = Head {
                    here: None,
                    earlier,
                    walked: 0,
                };
                let compared = Layout::of_with(&variant, &mut head).map(|l| (l.txn, l.changes));
                assert_eq!(compared.is_ok(), walked.is_ok(), "{variant:?}");
                if let (Ok(compared), Ok(walked)) = (&compared, &walked) {
                    assert_eq!(compared, walked, "{variant:?}");
                }
            }
        }
    }

    fn fresh() -> Head {
        Head {
            here: None,
            earlier: Vec::new(),
            walked: 0,
        }
    }

    /// A stream of 1-row batches of one table: each batch's change is
    /// compared with the head the batch before ended with, not walked; a
    /// batch of another table is walked and becomes the head compared with.
    #[test]
    fn a_batch_s_first_change_is_compared_with_the_last_batch_s_head() {
        let first = crate::read::tests::corpus(false)[0].clone();
        let mut second = first.clone();
        second.new = Some(row! { "id" => 2, "note" => "other" });
        let mut other = first.clone();
        other.columns.truncate(1);
        let one = |change: &Change| {
            to_msgpack(&Batch::new(Txn::committed(3, 30), vec![change.clone()])).expect("encode")
        };
        let mut earlier = Vec::new();
        let mut walks = Vec::new();
        for change in [&first, &second, &first, &other, &other, &second] {
            let bytes = one(change);
            let mut head = Head {
                here: None,
                earlier,
                walked: 0,
            };
            let layout = Layout::of_with(&bytes, &mut head).expect("splits");
            assert_eq!(layout.changes, walked(&bytes).expect("walked").changes);
            walks.push(head.walked);
            earlier = head.keep(&bytes);
        }
        assert_eq!(walks, [1, 0, 0, 1, 0, 1]);
        // The same through `Layout::of`, which keeps the head on this
        // thread (a test's own).
        let mut walks = Vec::new();
        for change in [&first, &second, &first, &other, &other, &second] {
            let bytes = one(change);
            let (layout, walked_now) = Layout::of_counted(&bytes).expect("splits");
            assert_eq!(layout.changes, walked(&bytes).expect("walked").changes);
            walks.push(walked_now);
        }
        assert_eq!(walks, [1, 0, 0, 1, 0, 1]);
        // A batch that does not split keeps nothing of its own.
        assert!(Layout::of_counted(&[0x92]).is_err());
        let (_, walked_now) = Layout::of_counted(&one(&first)).expect("splits");
        assert_eq!(walked_now, 0, "still the head of `second` (and `first`)");
    }

    /// Inserts of one table, each with a row of its own, then another
    /// table's: the second and third inserts are read up to their rows by
    /// comparing bytes (`head` still names the first insert's), and every
    /// cut and corruption of them splits as walking does.
    #[test]
    fn a_change_with_the_last_change_s_head_is_compared_not_walked() {
        let first = crate::read::tests::corpus(false)[0].clone();
        assert_eq!(first.op, crate::wire::Op::Insert);
        let mut second = first.clone();
        second.new = Some(row! { "id" => 2, "note" => "other" });
        let mut third = first.clone();
        third.new = Some(row! { "id" => 3 });
        let mut other = first.clone();
        other.columns.truncate(1);
        let changes = vec![first, second, third, other.clone(), other];
        let bytes = to_msgpack(&Batch::new(Txn::committed(3, 30), changes)).expect("encode");
        let mut heads = Vec::new();
        let mut head = fresh();
        walk(&bytes, |reader, _| {
            let range = skip_change(reader, &bytes, &mut head).map_err(malformed)?;
            heads.push((range, head.here.clone()));
            Ok(())
        })
        .expect("walk");
        assert_eq!(head.walked, 2, "the first of each table walked");
        let first_head = heads[0].1.clone().expect("the first insert's head");
        assert_eq!(first_head.start, heads[0].0.start);
        assert_eq!(heads[1].1, Some(first_head.clone()), "second compared");
        assert_eq!(heads[2].1, Some(first_head), "third compared");
        assert_eq!(heads[3].1.as_ref().map(|h| h.start), Some(heads[3].0.start));
        assert_eq!(heads[4].1, heads[3].1, "the other table's second compared");
        assert_eq!(
            heads
                .iter()
                .map(|(range, _)| range.clone())
                .collect::<Vec<_>>(),
            walked(&bytes).expect("walked").changes
        );
        // Every cut, and every byte of the compared changes corrupted.
        variants_split_as_walking(&bytes, heads[1].0.start..heads[2].0.end, |_| {
            (0..=255).collect()
        });
    }

    #[test]
    fn a_bad_change_is_blamed_by_index() {
        let mut b = to_msgpack(&Batch::new(Txn::default(), vec![])).expect("encode");
        // Replace the empty array by [1, {"op": "nope"}].
        assert_eq!(b.pop(), Some(0x90));
        b.extend_from_slice(b"\x92\x01\x81\xa2op\xa4nope");
        let lazy = LazyBatch::from_msgpack(b).expect("layout is fine");
        let errors: Vec<_> = lazy.changes().map(|c| c.unwrap_err()).collect();
        assert_eq!(errors[0].index(), Some(0));
        assert_eq!(errors[1].index(), Some(1));
        assert!(errors[1].message().starts_with("cannot decode change 1: "));
    }
}
