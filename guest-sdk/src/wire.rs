//! The event model shared by the host and the guests (`docs/abi.md`), and
//! its MessagePack form (`docs/abi.md`).
//!
//! Owns the Rust shape of a value, a change, a batch and the result envelope,
//! and how each is (de)serialized: structs as maps with named fields, values
//! as plain MessagePack where it has the type and single-key tagged maps
//! otherwise. It does not own how the host decodes PostgreSQL's stream.

use std::fmt;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in time with microsecond precision, or one of PostgreSQL's
/// infinities. `Micros` counts from 1970-01-01 00:00:00 (UTC for
/// `timestamptz`, wall-clock for `timestamp`).
///
/// PostgreSQL's range reaches 294276 AD, past what an `i64` of microseconds
/// since 1970 holds (294247 AD): such a value arrives as [`Value::Other`] with
/// its text, never wrapped or clamped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Timestamp {
    /// `-infinity`.
    NegInfinity,
    /// Microseconds since 1970-01-01 00:00:00.
    Micros(i64),
    /// `infinity`.
    Infinity,
}

/// A calendar date, or one of PostgreSQL's infinities. `Days` counts from
/// 1970-01-01 (negative before it, BC dates included: 1 BC is year 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Date {
    /// `-infinity`.
    NegInfinity,
    /// Days since 1970-01-01.
    Days(i32),
    /// `infinity`.
    Infinity,
}

/// PostgreSQL's `interval`: months, days and microseconds are independent
/// (a month is not a fixed number of days), each may be negative.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Interval {
    /// Months (years count as 12).
    pub months: i32,
    /// Days.
    pub days: i32,
    /// Microseconds (hours, minutes, seconds).
    pub micros: i64,
}

/// One column value. Every value PostgreSQL can hold survives: a type without
/// a variant of its own arrives as [`Value::Other`], its text form with its
/// type name.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// SQL NULL.
    Null,
    /// `bool`.
    Bool(bool),
    /// `int2`, `int4`, `int8`, `oid`.
    Int(i64),
    /// `float4`, `float8`, NaN and ±infinity included.
    Float(f64),
    /// `numeric`, as exact decimal text (`NaN`, `Infinity` and `-Infinity`
    /// included).
    Numeric(String),
    /// `text`, `varchar`, `bpchar`, `name`, `char`, and enum labels.
    Text(String),
    /// `bytea`.
    Bytes(Vec<u8>),
    /// `json` and `jsonb`, as raw JSON text.
    Json(String),
    /// `timestamp` (without time zone).
    Timestamp(Timestamp),
    /// `timestamptz`.
    TimestampTz(Timestamp),
    /// `date`.
    Date(Date),
    /// `time` (without time zone): microseconds since midnight,
    /// 0 to 86,400,000,000 (`24:00:00` is valid).
    Time(i64),
    /// `uuid`.
    Uuid([u8; 16]),
    /// `interval`.
    Interval(Interval),
    /// A one-dimensional array, or nested arrays for several dimensions.
    /// Lower bounds other than 1 are not representable here: such an array
    /// arrives as [`Value::Other`].
    Array(Vec<Value>),
    /// An unchanged TOAST value in an update: PostgreSQL did not send it.
    /// It is not NULL.
    Unchanged,
    /// Any other type, as PostgreSQL's text form with the type's name.
    Other {
        /// The type's name, schema-qualified unless in `pg_catalog`.
        type_name: String,
        /// The value's text form.
        text: String,
    },
}

/// The transaction a batch belongs to.
///
/// A transaction larger than the host's batch limits arrives as several
/// batches (chunks) with the same `xid` and `commit_lsn`, numbered from 0 by
/// `chunk`; only the one with `last` set carries `end_lsn`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Txn {
    /// The transaction id (0 for a non-transactional logical message).
    pub xid: u32,
    /// The LSN of the commit record (of the message, for a non-transactional
    /// logical message).
    pub commit_lsn: u64,
    /// The LSN just past the commit record: the position to resume after
    /// this transaction. 0 on every chunk but the last.
    pub end_lsn: u64,
    /// The commit time, in microseconds since the Unix epoch (0 for a
    /// non-transactional logical message, which has none).
    pub commit_time: i64,
    /// The chunk's number within the transaction, from 0.
    pub chunk: u32,
    /// Whether this is the transaction's last chunk.
    pub last: bool,
}

// ---------------------------------------------------------------------------
// Changes and batches.

/// What happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A row was inserted.
    Insert,
    /// A row was updated.
    Update,
    /// A row was deleted.
    Delete,
    /// Tables were truncated (see [`Change::truncate`]).
    Truncate,
    /// A row read by a backfill.
    Snapshot,
    /// A `pg_logical_emit_message` payload (see [`Change::message`]).
    Message,
    /// The table's shape changed (see [`Change::schema_change`]): it comes
    /// before the first row of the new shape.
    Schema,
}

impl Op {
    /// The name the wire form and the sinks use: `insert`, `update`...
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Insert => "insert",
            Op::Update => "update",
            Op::Delete => "delete",
            Op::Truncate => "truncate",
            Op::Snapshot => "snapshot",
            Op::Message => "message",
            Op::Schema => "schema",
        }
    }
}

/// A column of the changed table.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Column {
    /// Column name.
    pub name: String,
    /// PostgreSQL type name (`int4`, `text[]`, `myschema.mytype`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// Part of the replica identity.
    #[serde(default)]
    pub key: bool,
}

pub use crate::columns::Columns;
pub use crate::row::{Fields, Row};

/// A table named in a truncate.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableName {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
}

/// What a `truncate` change truncated, in one statement.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Truncate {
    /// Every table, in the statement's order.
    pub tables: Vec<TableName>,
    /// `TRUNCATE ... CASCADE`.
    #[serde(default)]
    pub cascade: bool,
    /// `TRUNCATE ... RESTART IDENTITY`.
    #[serde(default)]
    pub restart_identity: bool,
}

/// A `pg_logical_emit_message` payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LogicalMessage {
    /// The prefix it was emitted with.
    pub prefix: String,
    /// The payload.
    #[serde(with = "bytes_field")]
    pub content: Vec<u8>,
    /// Emitted inside a transaction.
    #[serde(default)]
    pub transactional: bool,
}

/// A column as a `schema` change describes it: with its full SQL type.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ShapeColumn {
    /// Column name.
    pub name: String,
    /// PostgreSQL type name, as in [`Column::type_name`] (`varchar`).
    #[serde(rename = "type")]
    pub type_name: String,
    /// The type with its modifier, as DDL writes it (`varchar(10)`,
    /// `numeric(12,2)`); the same as `type_name` when there is none.
    #[serde(default)]
    pub sql_type: String,
    /// Part of the replica identity.
    #[serde(default)]
    pub key: bool,
}

/// A table's shape at one moment: its name, columns and replica identity.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableShape {
    /// Schema.
    pub schema: String,
    /// Table.
    pub table: String,
    /// Columns, in order.
    #[serde(default)]
    pub columns: Vec<ShapeColumn>,
    /// `default`, `nothing`, `full` or `index`.
    #[serde(default)]
    pub replica_identity: String,
}

/// What a `schema` change says: the table's shape before and after, and the
/// DDL statements that changed it when they were captured.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SchemaChange {
    /// The shape the rows before this change had.
    pub before: TableShape,
    /// The shape the rows after this change have.
    pub after: TableShape,
    /// The statements that caused it (`source.capture_ddl`), oldest first;
    /// empty when not captured.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ddl: Vec<String>,
}

/// One change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    /// What happened.
    pub op: Op,
    /// The table's schema (empty for messages).
    #[serde(default)]
    pub schema: String,
    /// The table (empty for messages).
    #[serde(default)]
    pub table: String,
    /// The table's columns, in order (a `Vec<Column>` to read and change).
    #[serde(default, skip_serializing_if = "Columns::is_empty")]
    pub columns: Columns,
    /// The new row (insert, update, snapshot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub new: Option<Row>,
    /// The old row: its key, or every column under `REPLICA IDENTITY FULL`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old: Option<Row>,
    /// A destination chosen by a module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route: Option<String>,
    /// For `truncate`: what was truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncate: Option<Truncate>,
    /// For `message`: the payload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<LogicalMessage>,
    /// For `schema`: the shapes before and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema_change: Option<SchemaChange>,
}

impl Change {
    /// A change of `op` on `schema.table` with nothing else set.
    pub fn new(op: Op, schema: impl Into<String>, table: impl Into<String>) -> Change {
        Change {
            op,
            schema: schema.into(),
            table: table.into(),
            columns: Columns::new(),
            new: None,
            old: None,
            route: None,
            truncate: None,
            message: None,
            schema_change: None,
        }
    }
}

/// A batch: one transaction, or one chunk of a large one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Batch {
    /// The transaction.
    pub txn: Txn,
    /// Its changes, in WAL order.
    pub changes: Vec<Change>,
}

/// One element of a module's output: an input change kept as it was, or a
/// change of the module's making.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Input change number `i`, unchanged.
    Keep(u32),
    /// A new or modified change.
    Change(Box<Change>),
}

impl Serialize for Output {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Output::Keep(index) => serializer.serialize_u32(*index),
            Output::Change(change) => change.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Output {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Output, D::Error> {
        struct OutputVisitor;
        impl<'de> Visitor<'de> for OutputVisitor {
            type Value = Output;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an input change index or a change map")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Output, E> {
                u32::try_from(v)
                    .map(Output::Keep)
                    .map_err(|_| E::custom("change index out of range"))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Output, E> {
                u32::try_from(v)
                    .map(Output::Keep)
                    .map_err(|_| E::custom("a change index must not be negative"))
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Output, A::Error> {
                Change::deserialize(de::value::MapAccessDeserializer::new(map))
                    .map(|c| Output::Change(Box::new(c)))
            }
        }
        deserializer.deserialize_any(OutputVisitor)
    }
}

/// A module's error: a message and, where known, the input change at fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GuestError {
    /// What went wrong.
    pub message: String,
    /// The index of the input change at fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u32>,
}

/// The result envelope of `datum_transform` and `datum_init`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Envelope {
    /// The module failed.
    Error {
        /// The failure.
        error: GuestError,
    },
    /// The module's output.
    Changes {
        /// Kept indexes and new changes, in output order.
        changes: Vec<Output>,
    },
    /// `datum_init` succeeded (an empty map).
    Ok {},
}

/// Encodes any wire type as MessagePack with named fields.
pub fn to_msgpack<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, rmp_serde::encode::Error> {
    rmp_serde::to_vec_named(value)
}

/// Decodes any wire type from MessagePack.
pub fn from_msgpack<'a, T: Deserialize<'a>>(
    bytes: &'a [u8],
) -> Result<T, rmp_serde::decode::Error> {
    rmp_serde::from_slice(bytes)
}

/// Decodes one change: the same answer as `from_msgpack::<Change>`, found
/// faster for the shapes hosts and the SDK write (each key and value read
/// straight from the bytes, a row's values when first read); anything else
/// is decoded by `rmp-serde`.
pub fn decode_change(bytes: &[u8]) -> Result<Change, rmp_serde::decode::Error> {
    let len = bytes.len();
    decode_change_at(
        &std::sync::Arc::new(bytes.to_vec()),
        0..len,
        &mut crate::read::Shapes::single(),
    )
}

/// [`decode_change`] for the change at `range` of a batch, with the columns
/// `shapes` remembers from the ones before.
pub(crate) fn decode_change_at(
    shared: &crate::row::Shared,
    range: std::ops::Range<usize>,
    shapes: &mut crate::read::Shapes,
) -> Result<Change, rmp_serde::decode::Error> {
    match crate::read::change(shared, range.clone(), shapes) {
        Some(change) => Ok(change),
        None => from_msgpack(shared.get(range).unwrap_or_default()),
    }
}

/// Appends a change's MessagePack to `out`: the bytes [`to_msgpack`]
/// writes, with the parts of a decoded change that nobody changed (its
/// column list, a row's names and values) copied as they were read.
pub fn encode_change_into(
    out: &mut Vec<u8>,
    change: &Change,
) -> Result<(), rmp_serde::encode::Error> {
    crate::write::change(out, change)
}

/// Reads a result envelope of the plain shape `{"changes": [...]}`, its
/// elements kept indexes (unsigned, 32 bits at most) and changes, quickly.
/// `None` for any other envelope, valid or not: decode that with
/// [`from_msgpack`] (or a stricter reader), which gives the reasons: the
/// bytes come back for that. The changes' rows keep `bytes` and decode
/// their values when first read.
pub fn decode_changes_envelope(bytes: Vec<u8>) -> Result<Vec<Output>, Vec<u8>> {
    decode_changes_envelope_at_most(bytes, usize::MAX)
}

/// [`decode_changes_envelope`], but `None` too, before anything is decoded,
/// for an envelope of more than `most` elements (a host bounds what a
/// module's answer may cost it this way).
pub fn decode_changes_envelope_at_most(
    bytes: Vec<u8>,
    most: usize,
) -> Result<Vec<Output>, Vec<u8>> {
    let shared = std::sync::Arc::new(bytes);
    match crate::read::changes_envelope(&shared, most) {
        Some(outputs) => Ok(outputs),
        // The rows read before the reader gave up are gone: the buffer is
        // no longer shared, and comes back without a copy.
        None => Err(std::sync::Arc::try_unwrap(shared).unwrap_or_else(|s| s.as_ref().clone())),
    }
}

// ---------------------------------------------------------------------------
// Values.

mod bytes_field {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(bytes)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<u8>, D::Error> {
        super::ByteBuf::deserialize(deserializer).map(|b| b.0)
    }
}

/// Bytes that also accept an array of integers (how some MessagePack
/// writers, and JSON, spell binary).
struct ByteBuf(Vec<u8>);

impl<'de> Deserialize<'de> for ByteBuf {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ByteBuf, D::Error> {
        struct BytesVisitor;
        impl<'de> Visitor<'de> for BytesVisitor {
            type Value = ByteBuf;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<ByteBuf, E> {
                Ok(ByteBuf(v.to_vec()))
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<ByteBuf, E> {
                Ok(ByteBuf(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<ByteBuf, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(b) = seq.next_element::<u8>()? {
                    out.push(b);
                }
                Ok(ByteBuf(out))
            }
        }
        deserializer.deserialize_bytes(BytesVisitor)
    }
}

struct Bin<'a>(&'a [u8]);

impl Serialize for Bin<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(self.0)
    }
}

/// `{"tag": value}`.
fn tagged<S: Serializer, T: Serialize + ?Sized>(
    serializer: S,
    tag: &str,
    value: &T,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(1))?;
    map.serialize_entry(tag, value)?;
    map.end()
}

/// An infinity-capable point as the wire spells it: an integer, or
/// `"infinity"` / `"-infinity"`.
enum Point {
    Finite(i64),
    Infinity,
    NegInfinity,
}

impl Serialize for Point {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Point::Finite(v) => serializer.serialize_i64(*v),
            Point::Infinity => serializer.serialize_str("infinity"),
            Point::NegInfinity => serializer.serialize_str("-infinity"),
        }
    }
}

impl<'de> Deserialize<'de> for Point {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Point, D::Error> {
        struct PointVisitor;
        impl<'de> Visitor<'de> for PointVisitor {
            type Value = Point;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer, \"infinity\" or \"-infinity\"")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Point, E> {
                Ok(Point::Finite(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Point, E> {
                i64::try_from(v)
                    .map(Point::Finite)
                    .map_err(|_| E::custom("out of range"))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Point, E> {
                match v {
                    "infinity" => Ok(Point::Infinity),
                    "-infinity" => Ok(Point::NegInfinity),
                    other => Err(E::custom(format!(
                        "`{other}`: expected \"infinity\" or \"-infinity\""
                    ))),
                }
            }
        }
        deserializer.deserialize_any(PointVisitor)
    }
}

impl From<Timestamp> for Point {
    fn from(t: Timestamp) -> Point {
        match t {
            Timestamp::NegInfinity => Point::NegInfinity,
            Timestamp::Micros(v) => Point::Finite(v),
            Timestamp::Infinity => Point::Infinity,
        }
    }
}

impl From<Point> for Timestamp {
    fn from(p: Point) -> Timestamp {
        match p {
            Point::NegInfinity => Timestamp::NegInfinity,
            Point::Finite(v) => Timestamp::Micros(v),
            Point::Infinity => Timestamp::Infinity,
        }
    }
}

#[derive(Serialize, Deserialize)]
struct OtherBody {
    #[serde(rename = "type")]
    type_name: String,
    text: String,
}

#[derive(Serialize)]
struct OtherRef<'a> {
    #[serde(rename = "type")]
    type_name: &'a str,
    text: &'a str,
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Text(t) => serializer.serialize_str(t),
            Value::Bytes(b) => serializer.serialize_bytes(b),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Value::Numeric(n) => tagged(serializer, "numeric", n),
            Value::Json(j) => tagged(serializer, "json", j),
            Value::Timestamp(t) => tagged(serializer, "timestamp", &Point::from(*t)),
            Value::TimestampTz(t) => tagged(serializer, "timestamptz", &Point::from(*t)),
            Value::Date(d) => {
                let point = match d {
                    Date::NegInfinity => Point::NegInfinity,
                    Date::Days(v) => Point::Finite(i64::from(*v)),
                    Date::Infinity => Point::Infinity,
                };
                tagged(serializer, "date", &point)
            }
            Value::Time(t) => tagged(serializer, "time", t),
            Value::Uuid(u) => tagged(serializer, "uuid", &Bin(u)),
            Value::Interval(i) => tagged(serializer, "interval", i),
            Value::Unchanged => tagged(serializer, "unchanged", &true),
            Value::Other { type_name, text } => {
                tagged(serializer, "other", &OtherRef { type_name, text })
            }
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(ValueVisitor)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Datum value (docs/abi.md, \"Values\")")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v)
            .map(Value::Int)
            .map_err(|_| E::custom(format!("integer {v} does not fit in i64")))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        Ok(Value::Float(v))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::Text(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Value, E> {
        Ok(Value::Text(v))
    }

    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Value, E> {
        Ok(Value::Bytes(v.to_vec()))
    }

    fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Value, E> {
        Ok(Value::Bytes(v))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(item) = seq.next_element::<Value>()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(tag) = map.next_key::<String>()? else {
            return Err(de::Error::custom("an empty map is not a value"));
        };
        let value = match tag.as_str() {
            "numeric" => Value::Numeric(map.next_value()?),
            "json" => Value::Json(map.next_value()?),
            "timestamp" => Value::Timestamp(map.next_value::<Point>()?.into()),
            "timestamptz" => Value::TimestampTz(map.next_value::<Point>()?.into()),
            "date" => Value::Date(match map.next_value::<Point>()? {
                Point::NegInfinity => Date::NegInfinity,
                Point::Infinity => Date::Infinity,
                Point::Finite(v) => Date::Days(
                    i32::try_from(v).map_err(|_| de::Error::custom("date out of range"))?,
                ),
            }),
            "time" => Value::Time(map.next_value()?),
            "uuid" => {
                let bytes = map.next_value::<ByteBuf>()?.0;
                let uuid: [u8; 16] = bytes
                    .try_into()
                    .map_err(|_| de::Error::custom("a uuid is 16 bytes"))?;
                Value::Uuid(uuid)
            }
            "interval" => Value::Interval(map.next_value()?),
            "unchanged" => {
                let _: de::IgnoredAny = map.next_value()?;
                Value::Unchanged
            }
            "other" => {
                let body: OtherBody = map.next_value()?;
                Value::Other {
                    type_name: body.type_name,
                    text: body.text,
                }
            }
            other => {
                return Err(de::Error::custom(format!(
                    "unknown value tag `{other}` (docs/abi.md lists the tags)"
                )));
            }
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom("a tagged value has exactly one key"));
        }
        Ok(value)
    }
}

// Conversions that make building rows pleasant.

impl From<bool> for Value {
    fn from(v: bool) -> Value {
        Value::Bool(v)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Value {
        Value::Int(v)
    }
}

impl From<i32> for Value {
    fn from(v: i32) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Value {
        Value::Float(v)
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Value {
        Value::Text(v.to_owned())
    }
}

impl From<String> for Value {
    fn from(v: String) -> Value {
        Value::Text(v)
    }
}

impl From<Vec<u8>> for Value {
    fn from(v: Vec<u8>) -> Value {
        Value::Bytes(v)
    }
}

impl<T: Into<Value>> From<Option<T>> for Value {
    fn from(v: Option<T>) -> Value {
        v.map(Into::into).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(value: Value) {
        let bytes = to_msgpack(&value).expect("encode");
        let back: Value = from_msgpack(&bytes).expect("decode");
        match (&value, &back) {
            (Value::Float(a), Value::Float(b)) if a.is_nan() => assert!(b.is_nan()),
            _ => assert_eq!(back, value),
        }
    }

    #[test]
    fn every_value_round_trips() {
        for (_, value) in crate::read::tests::every_value(true) {
            round_trip(value);
        }
    }

    #[test]
    fn structs_are_maps_with_named_fields() {
        let mut row = Row::new();
        row.set("id", 1);
        let mut change = Change::new(Op::Insert, "public", "t");
        change.new = Some(row);
        let bytes = to_msgpack(&change).expect("encode");
        // fixmap, then the key "op" as a fixstr.
        assert_eq!(bytes[0] & 0xf0, 0x80, "a map");
        assert_eq!(&bytes[1..4], b"\xa2op");
        let back: Change = from_msgpack(&bytes).expect("decode");
        assert_eq!(back, change);
    }

    #[test]
    fn envelopes_decode_by_shape() {
        let ok: Envelope = from_msgpack(
            &to_msgpack(&Envelope::Changes {
                changes: vec![
                    Output::Keep(2),
                    Output::Change(Box::new(Change::new(Op::Delete, "s", "t"))),
                ],
            })
            .expect("encode"),
        )
        .expect("decode");
        assert!(matches!(ok, Envelope::Changes { ref changes } if changes.len() == 2));
        let err: Envelope = from_msgpack(
            &to_msgpack(&Envelope::Error {
                error: GuestError {
                    message: "bad".into(),
                    index: Some(3),
                },
            })
            .expect("encode"),
        )
        .expect("decode");
        assert!(matches!(err, Envelope::Error { error } if error.index == Some(3)));
        let init: Envelope = from_msgpack(&[0x80]).expect("empty map");
        assert_eq!(init, Envelope::Ok {});
    }

    #[test]
    fn unknown_tags_and_extra_keys_are_errors() {
        let unknown =
            to_msgpack(&std::collections::BTreeMap::from([("decimal", "1")])).expect("encode");
        assert!(from_msgpack::<Value>(&unknown).is_err());
        let two = to_msgpack(&std::collections::BTreeMap::from([
            ("json", "1"),
            ("numeric", "1"),
        ]))
        .expect("encode");
        assert!(from_msgpack::<Value>(&two).is_err());
    }

    #[test]
    fn row_accessors() {
        let mut row = Row::from_fields(vec![("a".into(), Value::Int(1))]);
        assert_eq!(row.set("b", "x"), None);
        assert_eq!(row.set("a", 2), Some(Value::Int(1)));
        assert_eq!(row.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(row.remove("a"), Some(Value::Int(2)));
        assert!(!row.contains("a") && row.len() == 1);
    }
}
// WIRE-READY
