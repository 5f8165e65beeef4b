//! A direct reader of a change's MessagePack, for the shapes hosts and the
//! SDK write.
//!
//! Owns decoding a [`Change`] (and the plain result envelope
//! `{"changes": [...]}`) without serde's per-field dispatch: every key and
//! value goes straight from the bytes into the wire types, strings borrowed
//! until they are stored. It is a fast path and nothing more. Anything it
//! does not recognise — a key it does not know, a key twice, a value in a
//! valid but unusual encoding, a missing `op`, malformed input — makes it
//! answer `None`, and the caller decodes the same bytes with `rmp-serde`,
//! whose results and error messages stay the reference. Whatever this
//! reader returns, `rmp-serde` returns too: the tests below hold the two
//! equal on every change kind and on mutated and truncated encodings.
//!
//! The rare parts of a change (`truncate`, `message`, `schema_change`) are
//! handed to `rmp-serde` on their own bytes.

use std::ops::Range;

use crate::columns::Columns;
use crate::msgpack::Reader;
use crate::row::Shared;
use crate::wire::{
    Change, Column, Date, Interval, Op, Output, Row, Timestamp, Txn, Value, from_msgpack,
};

/// How deep arrays may nest before a value is left to `rmp-serde`.
const MAX_DEPTH: usize = 32;

/// The columns of the last change read, by their bytes: the changes of a
/// batch mostly share one table's columns, and a change whose columns are
/// byte for byte the last ones shares them instead of a second reading.
#[derive(Debug, Default)]
pub(crate) struct Shapes {
    last: Option<Columns>,
    /// Reads only one change: remembering would cost a copy for nothing.
    single: bool,
}

impl Shapes {
    /// For one change alone.
    pub(crate) fn single() -> Shapes {
        Shapes {
            last: None,
            single: true,
        }
    }
}

/// One change, the whole of `range` in `shared`; its rows keep `shared`.
pub(crate) fn change(shared: &Shared, range: Range<usize>, shapes: &mut Shapes) -> Option<Change> {
    let whole = shared.get(..range.end)?;
    let mut r = Reader::at(whole, range.start);
    let change = read_change(&mut r, whole, shared, shapes)?;
    r.at_end().then_some(change)
}

/// The change `r` is at, `r` reading `shared` from its start; `r` ends
/// past it. `None` leaves `r` anywhere within it.
pub(crate) fn change_from(
    r: &mut Reader<'_>,
    shared: &Shared,
    shapes: &mut Shapes,
) -> Option<Change> {
    read_change(r, shared.as_slice(), shared, shapes)
}

/// A value, the whole of `bytes`.
pub(crate) fn value_of(bytes: &[u8]) -> Option<Value> {
    let mut r = Reader::new(bytes);
    let value = value(&mut r, 0)?;
    r.at_end().then_some(value)
}

/// A result envelope with `changes` as its only key, each element a kept
/// index (as an unsigned integer of at most 32 bits) or a change; at most
/// `most` of them.
pub(crate) fn changes_envelope(shared: &Shared, most: usize) -> Option<Vec<Output>> {
    let bytes = shared.as_slice();
    let mut r = Reader::new(bytes);
    if r.map_len().ok()? != 1 || str(&mut r)? != "changes" {
        return None;
    }
    let len = r.array_len().ok()?;
    if len > most {
        return None;
    }
    let mut outputs = Vec::with_capacity(len.min(bytes.len()));
    let mut shapes = Shapes::default();
    for _ in 0..len {
        let output = match r.peek()? {
            0x00..=0x7f | 0xcc | 0xcd | 0xce => Output::Keep(u32::try_from(int(&mut r)?).ok()?),
            _ => Output::Change(Box::new(read_change(&mut r, bytes, shared, &mut shapes)?)),
        };
        outputs.push(output);
    }
    r.at_end().then_some(outputs)
}

/// A transaction, the whole of `bytes`: a map of its six fields, each
/// once, with values of their types. `None` for anything else, which
/// `rmp-serde` decides (it also takes other forms, or refuses them).
pub(crate) fn txn(bytes: &[u8]) -> Option<Txn> {
    let mut r = Reader::new(bytes);
    if r.map_len().ok()? != 6 {
        return None;
    }
    let mut txn = Txn::default();
    let mut seen = 0u8;
    for _ in 0..6 {
        let bit = match str(&mut r)? {
            "xid" => {
                txn.xid = u32::try_from(int(&mut r)?).ok()?;
                1
            }
            "commit_lsn" => {
                txn.commit_lsn = u64::try_from(int(&mut r)?).ok()?;
                2
            }
            "end_lsn" => {
                txn.end_lsn = u64::try_from(int(&mut r)?).ok()?;
                4
            }
            "commit_time" => {
                txn.commit_time = int(&mut r)?;
                8
            }
            "chunk" => {
                txn.chunk = u32::try_from(int(&mut r)?).ok()?;
                16
            }
            "last" => {
                txn.last = boolean(&mut r)?;
                32
            }
            _ => return None,
        };
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
    }
    r.at_end().then_some(txn)
}

/// The fields of a change, one bit each, to refuse a key seen twice.
fn field_bit(key: &str) -> Option<u16> {
    let n = match key {
        "op" => 0,
        "schema" => 1,
        "table" => 2,
        "columns" => 3,
        "new" => 4,
        "old" => 5,
        "route" => 6,
        "truncate" => 7,
        "message" => 8,
        "schema_change" => 9,
        _ => return None,
    };
    Some(1 << n)
}

/// A change map; `whole` is the buffer `r` reads (the start of `shared`),
/// for the parts handed to `rmp-serde` and the rows' values.
fn read_change(
    r: &mut Reader<'_>,
    whole: &[u8],
    shared: &Shared,
    shapes: &mut Shapes,
) -> Option<Change> {
    let entries = r.map_len().ok()?;
    let mut op = None;
    let mut change = Change::new(Op::Insert, String::new(), String::new());
    let mut seen = 0u16;
    for _ in 0..entries {
        let key = str(r)?;
        let bit = field_bit(key)?;
        if seen & bit != 0 {
            return None;
        }
        seen |= bit;
        match key {
            "op" => op = Some(read_op(r)?),
            "schema" => change.schema = string(r)?,
            "table" => change.table = string(r)?,
            "columns" => change.columns = shapes.columns(r, whole)?,
            "new" => change.new = optional(r, |r| row(r, shared))?,
            "old" => change.old = optional(r, |r| row(r, shared))?,
            "route" => change.route = optional(r, string)?,
            "truncate" => change.truncate = optional(r, |r| by_serde(r, whole))?,
            "message" => change.message = optional(r, |r| by_serde(r, whole))?,
            _ => change.schema_change = optional(r, |r| by_serde(r, whole))?,
        }
    }
    change.op = op?;
    Some(change)
}

/// The next value decoded by `rmp-serde` on its own bytes.
fn by_serde<T: serde::de::DeserializeOwned>(r: &mut Reader<'_>, whole: &[u8]) -> Option<T> {
    let range = r.skip().ok()?;
    from_msgpack(whole.get(range)?).ok()
}

/// `nil` as `None`, anything else as `read` says.
fn optional<'a, T>(
    r: &mut Reader<'a>,
    read: impl FnOnce(&mut Reader<'a>) -> Option<T>,
) -> Option<Option<T>> {
    if r.peek()? == 0xc0 {
        r.byte().ok()?;
        return Some(None);
    }
    read(r).map(Some)
}

fn read_op(r: &mut Reader<'_>) -> Option<Op> {
    Some(match str(r)? {
        "insert" => Op::Insert,
        "update" => Op::Update,
        "delete" => Op::Delete,
        "truncate" => Op::Truncate,
        "snapshot" => Op::Snapshot,
        "message" => Op::Message,
        "schema" => Op::Schema,
        _ => return None,
    })
}

impl Shapes {
    /// The columns array `r` is at, read or copied from the last one.
    fn columns(&mut self, r: &mut Reader<'_>, whole: &[u8]) -> Option<Columns> {
        let start = r.position();
        if let Some(last) = &self.last
            && let Some(bytes) = last.raw()
            && start
                .checked_add(bytes.len())
                .and_then(|end| whole.get(start..end))
                .is_some_and(|here| crate::msgpack::same_bytes(here, bytes))
        {
            // The same bytes from the start of an array: the same array.
            r.take(bytes.len()).ok()?;
            return Some(last.clone());
        }
        let list = columns(r)?;
        let columns = Columns::read(list, whole.get(start..r.position())?.to_vec());
        if !self.single {
            self.last = Some(columns.clone());
        }
        Some(columns)
    }
}

fn columns(r: &mut Reader<'_>) -> Option<Vec<Column>> {
    let len = r.array_len().ok()?;
    let mut columns = Vec::with_capacity(len.min(4096));
    for _ in 0..len {
        let entries = r.map_len().ok()?;
        let (mut name, mut type_name, mut key) = (None, None, None);
        for _ in 0..entries {
            let slot = match str(r)? {
                "name" if name.is_none() => &mut name,
                "type" if type_name.is_none() => &mut type_name,
                "key" if key.is_none() => {
                    key = Some(boolean(r)?);
                    continue;
                }
                _ => return None,
            };
            *slot = Some(string(r)?);
        }
        columns.push(Column {
            name: name?,
            type_name: type_name?,
            key: key.unwrap_or(false),
        });
    }
    Some(columns)
}

/// A row: each name read, each value checked to decode (`checked_value`)
/// and left as its bytes in `shared` until the module reads it.
fn row(r: &mut Reader<'_>, shared: &Shared) -> Option<Row> {
    let entries = r.map_len().ok()?;
    let mut cells = Vec::with_capacity(entries.min(4096));
    for _ in 0..entries {
        let token = r.position();
        let name = str(r)?;
        let text = r.position() - name.len();
        let start = r.position();
        checked_value(r)?;
        cells.push([token..start, text..start, start..r.position()]);
    }
    Some(Row::from_raw(shared.clone(), cells))
}

/// Whether the value `r` is at decodes (`value` answers `Some`), without
/// making it where that needs no allocation: what `value` would read, in the
/// same order, with the same checks.
fn checked_value(r: &mut Reader<'_>) -> Option<()> {
    match r.peek()? {
        0xc0 | 0xc2 | 0xc3 => {
            r.byte().ok()?;
        }
        0x00..=0x7f | 0xcc..=0xcf | 0xd0..=0xd3 | 0xe0..=0xff => {
            int(r)?;
        }
        0xca => {
            r.byte().ok()?;
            r.take(4).ok()?;
        }
        0xcb => {
            r.byte().ok()?;
            r.take(8).ok()?;
        }
        0xa0..=0xbf | 0xd9..=0xdb => {
            str(r)?;
        }
        0xc4..=0xc6 => {
            bin(r)?;
        }
        _ => {
            value(r, 0)?;
        }
    }
    Some(())
}

fn value(r: &mut Reader<'_>, depth: usize) -> Option<Value> {
    Some(match r.peek()? {
        0xc0 => {
            r.byte().ok()?;
            Value::Null
        }
        0xc2 | 0xc3 => Value::Bool(boolean(r)?),
        0x00..=0x7f | 0xcc..=0xcf | 0xd0..=0xd3 | 0xe0..=0xff => Value::Int(int(r)?),
        0xca => {
            r.byte().ok()?;
            let bits = u32::from_be_bytes(r.take(4).ok()?.try_into().ok()?);
            Value::Float(f64::from(f32::from_bits(bits)))
        }
        0xcb => {
            r.byte().ok()?;
            let bits = u64::from_be_bytes(r.take(8).ok()?.try_into().ok()?);
            Value::Float(f64::from_bits(bits))
        }
        0xa0..=0xbf | 0xd9..=0xdb => Value::Text(string(r)?),
        0xc4..=0xc6 => Value::Bytes(bin(r)?.to_vec()),
        0x90..=0x9f | 0xdc | 0xdd if depth < MAX_DEPTH => {
            let len = r.array_len().ok()?;
            let mut items = Vec::with_capacity(len.min(4096));
            for _ in 0..len {
                items.push(value(r, depth + 1)?);
            }
            Value::Array(items)
        }
        0x80..=0x8f | 0xde | 0xdf => tagged(r)?,
        _ => return None,
    })
}

/// `{"tag": body}`.
fn tagged(r: &mut Reader<'_>) -> Option<Value> {
    if r.map_len().ok()? != 1 {
        return None;
    }
    Some(match str(r)? {
        "numeric" => Value::Numeric(string(r)?),
        "json" => Value::Json(string(r)?),
        "timestamp" => Value::Timestamp(point(r)?),
        "timestamptz" => Value::TimestampTz(point(r)?),
        "date" => Value::Date(match point(r)? {
            Timestamp::NegInfinity => Date::NegInfinity,
            Timestamp::Infinity => Date::Infinity,
            Timestamp::Micros(days) => Date::Days(i32::try_from(days).ok()?),
        }),
        "time" => Value::Time(int(r)?),
        "uuid" => Value::Uuid(bin(r)?.try_into().ok()?),
        "interval" => Value::Interval(interval(r)?),
        "unchanged" if r.peek()? == 0xc3 => {
            r.byte().ok()?;
            Value::Unchanged
        }
        "other" => {
            if r.map_len().ok()? != 2 {
                return None;
            }
            let (mut type_name, mut text) = (None, None);
            for _ in 0..2 {
                let slot = match str(r)? {
                    "type" if type_name.is_none() => &mut type_name,
                    "text" if text.is_none() => &mut text,
                    _ => return None,
                };
                *slot = Some(string(r)?);
            }
            Value::Other {
                type_name: type_name?,
                text: text?,
            }
        }
        _ => return None,
    })
}

/// An integer, or `"infinity"` / `"-infinity"`.
fn point(r: &mut Reader<'_>) -> Option<Timestamp> {
    match r.peek()? {
        0xa0..=0xbf | 0xd9..=0xdb => match str(r)? {
            "infinity" => Some(Timestamp::Infinity),
            "-infinity" => Some(Timestamp::NegInfinity),
            _ => None,
        },
        _ => int(r).map(Timestamp::Micros),
    }
}

fn interval(r: &mut Reader<'_>) -> Option<Interval> {
    if r.map_len().ok()? != 3 {
        return None;
    }
    let (mut months, mut days, mut micros) = (None, None, None);
    for _ in 0..3 {
        match str(r)? {
            "months" if months.is_none() => months = Some(i32::try_from(int(r)?).ok()?),
            "days" if days.is_none() => days = Some(i32::try_from(int(r)?).ok()?),
            "micros" if micros.is_none() => micros = Some(int(r)?),
            _ => return None,
        }
    }
    Some(Interval {
        months: months?,
        days: days?,
        micros: micros?,
    })
}

fn boolean(r: &mut Reader<'_>) -> Option<bool> {
    match r.byte().ok()? {
        0xc2 => Some(false),
        0xc3 => Some(true),
        _ => None,
    }
}

/// Any integer marker whose value fits an `i64`.
fn int(r: &mut Reader<'_>) -> Option<i64> {
    let marker = r.byte().ok()?;
    let mut be = |n: usize| -> Option<u64> {
        let bytes = r.take(n).ok()?;
        Some(bytes.iter().fold(0u64, |v, b| (v << 8) | u64::from(*b)))
    };
    Some(match marker {
        0x00..=0x7f => i64::from(marker),
        0xe0..=0xff => i64::from(marker as i8),
        0xcc => be(1)? as i64,
        0xcd => be(2)? as i64,
        0xce => be(4)? as i64,
        0xcf => i64::try_from(be(8)?).ok()?,
        0xd0 => i64::from(be(1)? as u8 as i8),
        0xd1 => i64::from(be(2)? as u16 as i16),
        0xd2 => i64::from(be(4)? as u32 as i32),
        0xd3 => be(8)? as i64,
        _ => return None,
    })
}

fn str<'a>(r: &mut Reader<'a>) -> Option<&'a str> {
    let len = match r.byte().ok()? {
        m @ 0xa0..=0xbf => usize::from(m & 0x1f),
        0xd9 => r.uint(1).ok()?,
        0xda => r.uint(2).ok()?,
        0xdb => r.uint(4).ok()?,
        _ => return None,
    };
    std::str::from_utf8(r.take(len).ok()?).ok()
}

fn string(r: &mut Reader<'_>) -> Option<String> {
    str(r).map(str::to_owned)
}

fn bin<'a>(r: &mut Reader<'a>) -> Option<&'a [u8]> {
    let len = match r.byte().ok()? {
        0xc4 => r.uint(1).ok()?,
        0xc5 => r.uint(2).ok()?,
        0xc6 => r.uint(4).ok()?,
        _ => return None,
    };
    r.take(len).ok()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::{
        Envelope, LogicalMessage, SchemaChange, ShapeColumn, TableName, TableShape, Truncate,
        to_msgpack,
    };

    /// [`super::change`] on a buffer of its own.
    fn change(bytes: &[u8], shapes: &mut Shapes) -> Option<Change> {
        super::change(&Shared::new(bytes.to_vec()), 0..bytes.len(), shapes)
    }

    /// [`super::changes_envelope`] on a buffer of its own.
    fn changes_envelope(bytes: &[u8]) -> Option<Vec<Output>> {
        super::changes_envelope(&Shared::new(bytes.to_vec()), usize::MAX)
    }

    /// Every kind of value; `big` adds the ones with 32-bit lengths.
    pub(crate) fn every_value(big: bool) -> Vec<(String, Value)> {
        let mut values = vec![
            Value::Null,
            Value::Bool(false),
            Value::Bool(true),
            Value::Int(0),
            Value::Int(-1),
            Value::Int(-33),
            Value::Int(200),
            Value::Int(-200),
            Value::Int(70_000),
            Value::Int(-70_000),
            Value::Int(i64::MIN),
            Value::Int(i64::MAX),
            Value::Float(1.5),
            Value::Float(f64::NAN),
            Value::Float(f64::NEG_INFINITY),
            Value::Numeric("-12.500".into()),
            Value::Text(String::new()),
            Value::Text("grüße".into()),
            Value::Text("x".repeat(40)),
            Value::Text("y".repeat(300)),
            Value::Bytes((0..=255).collect()),
            Value::Json("{\"a\":[1]}".into()),
            Value::Timestamp(Timestamp::Micros(-1)),
            Value::Timestamp(Timestamp::Infinity),
            Value::TimestampTz(Timestamp::NegInfinity),
            Value::TimestampTz(Timestamp::Micros(1_700_000_000_000_000)),
            Value::Date(Date::Days(-735_160)),
            Value::Date(Date::Infinity),
            Value::Date(Date::NegInfinity),
            Value::Time(86_400_000_000),
            Value::Uuid([7; 16]),
            Value::Interval(Interval {
                months: -1,
                days: 2,
                micros: -3,
            }),
            Value::Array(vec![Value::Array(vec![Value::Int(1)]), Value::Null]),
            Value::Array(vec![Value::Text("a".into()); 20]),
            Value::Array(vec![]),
            Value::Unchanged,
            Value::Other {
                type_name: "point".into(),
                text: "(1,2)".into(),
            },
        ];
        if big {
            values.push(Value::Text("z".repeat(70_000)));
            values.push(Value::Bytes(vec![9; 70_000]));
        }
        values
            .into_iter()
            .enumerate()
            .map(|(i, v)| (format!("c{i}"), v))
            .collect()
    }

    fn shape(table: &str) -> TableShape {
        TableShape {
            schema: "public".into(),
            table: table.into(),
            columns: vec![ShapeColumn {
                name: "id".into(),
                type_name: "int4".into(),
                sql_type: "integer".into(),
                key: true,
            }],
            replica_identity: "default".into(),
        }
    }

    pub(crate) fn corpus(big: bool) -> Vec<Change> {
        let values = every_value(big);
        let columns: Vec<Column> = values
            .iter()
            .enumerate()
            .map(|(i, (name, _))| Column {
                name: name.clone(),
                type_name: "text".into(),
                key: i == 0,
            })
            .collect();
        let mut insert = Change::new(Op::Insert, "public", "every");
        insert.columns = columns.into();
        insert.new = Some(Row::from_fields(values.clone()));
        let mut update = insert.clone();
        update.op = Op::Update;
        update.old = Some(Row::from_fields(values[..3].to_vec()));
        update.route = Some("elsewhere".into());
        let mut delete = Change::new(Op::Delete, "s", "t");
        delete.old = Some(Row::from_fields(vec![("id".into(), Value::Int(1))]));
        let mut snapshot = Change::new(Op::Snapshot, "public", "customers");
        snapshot.new = Some(Row::from_fields(vec![
            ("id".into(), Value::Int(7)),
            ("email".into(), Value::Text("c7@example.com".into())),
        ]));
        let mut truncate = Change::new(Op::Truncate, "", "");
        truncate.truncate = Some(Truncate {
            tables: vec![TableName {
                schema: "public".into(),
                table: "a".into(),
            }],
            cascade: true,
            restart_identity: false,
        });
        let mut message = Change::new(Op::Message, "", "");
        message.message = Some(LogicalMessage {
            prefix: "p".into(),
            content: b"payload".to_vec(),
            transactional: true,
        });
        let mut schema = Change::new(Op::Schema, "public", "t");
        schema.schema_change = Some(SchemaChange {
            before: shape("t"),
            after: shape("t2"),
            ddl: vec!["ALTER TABLE t RENAME TO t2".into()],
        });
        vec![
            insert,
            update,
            delete,
            snapshot,
            truncate,
            message,
            schema,
            Change::new(Op::Insert, "", ""),
        ]
    }

    /// Compared by their encoding, so that a NaN equals itself.
    fn same(a: &Change, b: &Change) -> bool {
        to_msgpack(a).expect("encode") == to_msgpack(b).expect("encode")
    }

    #[test]
    fn every_change_kind_reads_as_rmp_serde_reads_it() {
        for original in corpus(true) {
            let bytes = to_msgpack(&original).expect("encode");
            let fast = change(&bytes, &mut Shapes::default())
                .expect("the common shapes take the fast path");
            let serde: Change = from_msgpack(&bytes).expect("decode");
            assert!(same(&fast, &serde), "{fast:?}\n{serde:?}");
            assert!(same(&fast, &original));
        }
    }

    /// Whatever the fast reader accepts from a corrupted or cut encoding,
    /// `rmp-serde` accepts too, with the same change.
    #[test]
    fn mutated_and_truncated_encodings_never_read_differently_than_rmp_serde() {
        const REPLACEMENTS: [u8; 12] = [
            0x00, 0x01, 0x7f, 0x80, 0x90, 0xa0, 0xc0, 0xc3, 0xca, 0xcf, 0xd3, 0xff,
        ];
        let mut fast_answers = 0;
        for original in corpus(false) {
            let bytes = to_msgpack(&original).expect("encode");
            // Columns remembered from the intact change meet the variants.
            let mut shapes = Shapes::default();
            change(&bytes, &mut shapes).expect("the intact change");
            let end = bytes.len();
            let mut variants: Vec<Vec<u8>> = (0..end).map(|cut| bytes[..cut].to_vec()).collect();
            for at in 0..end {
                for replacement in REPLACEMENTS.into_iter().chain([bytes[at] ^ 1]) {
                    let mut mutated = bytes.clone();
                    mutated[at] = replacement;
                    variants.push(mutated);
                }
            }
            for variant in variants {
                if let Some(fast) = change(&variant, &mut shapes) {
                    fast_answers += 1;
                    let serde: Change = from_msgpack(&variant).unwrap_or_else(|e| {
                        panic!("the fast reader accepted what rmp-serde refuses ({e}): {variant:?}")
                    });
                    assert!(same(&fast, &serde), "{variant:?}");
                }
            }
        }
        assert!(fast_answers > 1_000, "only {fast_answers} variants read");
    }

    #[test]
    fn a_transaction_reads_as_rmp_serde_reads_it_or_is_left_to_it() {
        let txns = [
            Txn::default(),
            Txn::committed(7, 100),
            Txn {
                xid: u32::MAX,
                commit_lsn: i64::MAX as u64,
                end_lsn: 1 << 40,
                commit_time: i64::MIN,
                chunk: u32::MAX,
                last: false,
            },
            Txn {
                commit_time: -1,
                chunk: 3,
                ..Txn::committed(1, 2)
            },
        ];
        const REPLACEMENTS: [u8; 13] = [
            0x00, 0x01, 0x7f, 0x80, 0x86, 0xa0, 0xa3, 0xc0, 0xc2, 0xc3, 0xcf, 0xd3, 0xff,
        ];
        let mut fast_answers = 0;
        for original in txns {
            let bytes = to_msgpack(&original).expect("encode");
            assert_eq!(txn(&bytes), Some(original));
            let mut variants: Vec<Vec<u8>> =
                (0..bytes.len()).map(|cut| bytes[..cut].to_vec()).collect();
            for at in 0..bytes.len() {
                for replacement in REPLACEMENTS.into_iter().chain([bytes[at] ^ 1]) {
                    let mut mutated = bytes.clone();
                    mutated[at] = replacement;
                    variants.push(mutated);
                }
            }
            for variant in variants {
                if let Some(fast) = txn(&variant) {
                    fast_answers += 1;
                    let serde: Txn = from_msgpack(&variant).unwrap_or_else(|e| {
                        panic!("the fast reader accepted what rmp-serde refuses ({e}): {variant:?}")
                    });
                    assert_eq!(fast, serde, "{variant:?}");
                }
            }
        }
        assert!(fast_answers > 50, "only {fast_answers} variants read");
        // Left to rmp-serde: an LSN past i64::MAX (which it reads), seven
        // entries (`xid` again) and six with `xid` twice and no `last`
        // (which it refuses).
        let far = Txn {
            end_lsn: u64::MAX,
            ..Txn::default()
        };
        assert_eq!(txn(&to_msgpack(&far).expect("encode")), None);
        let xid = [0xa3, b'x', b'i', b'd', 0x05];
        let mut seven = to_msgpack(&Txn::default()).expect("encode");
        seven[0] = 0x87;
        seven.extend_from_slice(&xid);
        assert_eq!(txn(&seven), None);
        assert!(from_msgpack::<Txn>(&seven).is_err());
        // Six entries, `xid` twice and no `last`.
        let mut twice = to_msgpack(&Txn::default()).expect("encode");
        let last = [0xa4, b'l', b'a', b's', b't', 0xc2];
        assert!(twice.ends_with(&last));
        twice.truncate(twice.len() - last.len());
        twice.extend_from_slice(&xid);
        assert_eq!(txn(&twice), None);
        assert!(from_msgpack::<Txn>(&twice).is_err());
    }

    /// Changes of two tables, alternating, each with the columns of its
    /// own: one reader remembering columns reads each as `rmp-serde` does.
    #[test]
    fn remembered_columns_serve_only_changes_with_the_same_columns() {
        let mut shapes = Shapes::default();
        let mut other = corpus(false)[0].clone();
        other.columns.truncate(2);
        other.columns[1].key = true;
        for original in [
            &corpus(false)[0],
            &corpus(false)[0],
            &other,
            &corpus(false)[1],
            &other,
        ] {
            let bytes = to_msgpack(original).expect("encode");
            let fast = change(&bytes, &mut shapes).expect("read");
            assert!(same(&fast, original), "{fast:?}");
        }
    }

    #[test]
    fn shapes_it_does_not_know_are_left_to_rmp_serde() {
        let mut unknown_key = std::collections::BTreeMap::new();
        unknown_key.insert("op", "insert");
        unknown_key.insert("later", "x");
        let bytes = to_msgpack(&unknown_key).expect("encode");
        assert!(change(&bytes, &mut Shapes::default()).is_none());
        assert!(from_msgpack::<Change>(&bytes).is_ok(), "serde ignores it");
        // No `op`.
        let bytes =
            to_msgpack(&std::collections::BTreeMap::from([("schema", "s")])).expect("encode");
        assert!(change(&bytes, &mut Shapes::default()).is_none());
        // Bytes after the change.
        let mut bytes = to_msgpack(&corpus(false)[2]).expect("encode");
        bytes.push(0xc0);
        assert!(change(&bytes, &mut Shapes::default()).is_none());
        // Arrays nested deeper than the reader goes.
        let mut deep = Value::Int(1);
        for _ in 0..=MAX_DEPTH {
            deep = Value::Array(vec![deep]);
        }
        let mut nested = Change::new(Op::Insert, "s", "t");
        nested.new = Some(Row::from_fields(vec![("a".into(), deep)]));
        let bytes = to_msgpack(&nested).expect("encode");
        assert!(change(&bytes, &mut Shapes::default()).is_none());
        assert!(same(&from_msgpack(&bytes).expect("decode"), &nested));
    }

    #[test]
    fn a_plain_changes_envelope_reads_as_rmp_serde_reads_it() {
        let mut outputs = vec![Output::Keep(0), Output::Keep(300), Output::Keep(70_000)];
        outputs.extend(
            corpus(true)
                .into_iter()
                .map(|c| Output::Change(Box::new(c))),
        );
        let bytes = to_msgpack(&Envelope::Changes {
            changes: outputs.clone(),
        })
        .expect("encode");
        let fast = changes_envelope(&bytes).expect("the fast path");
        let Envelope::Changes { changes: serde } = from_msgpack(&bytes).expect("decode") else {
            panic!("not a changes envelope");
        };
        assert_eq!(fast.len(), serde.len());
        for (a, b) in fast.iter().zip(&serde) {
            assert_eq!(to_msgpack(a).expect("a"), to_msgpack(b).expect("b"));
        }
        // An error envelope, a second key, a negative index: not this path.
        for other in [
            to_msgpack(&Envelope::Error {
                error: crate::wire::GuestError {
                    message: "no".into(),
                    index: None,
                },
            }),
            to_msgpack(&std::collections::BTreeMap::from([
                ("changes", vec![0]),
                ("extra", vec![1]),
            ])),
            to_msgpack(&std::collections::BTreeMap::from([("changes", vec![-1])])),
        ] {
            assert!(changes_envelope(&other.expect("encode")).is_none());
        }
    }
}
