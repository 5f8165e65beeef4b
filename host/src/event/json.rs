//! The JSON form of the event model: batches, changes and values as a person
//! reads and writes them (`docs/fixtures.md`).
//!
//! Owns both directions. Reading takes hand-written JSON — plain JSON values
//! where JSON has the type, one-key tagged objects (`{"timestamptz": "2026-12-02
//! 10:00:00+00"}`) otherwise, PostgreSQL's text forms inside the tags — and
//! reports what is wrong with the field's path. Writing produces the same
//! form, with keys in a stable, readable order, so that what it writes reads
//! back to the same batch.
//!
//! It does not own files (the golden runner does) nor MessagePack (the
//! wire format, `datum_guest::wire`).

use std::fmt;

use datum_guest::wire::{Batch, Change, Column, Row, Timestamp, Txn, Value};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

use super::lsn::Lsn;
use super::ordered::Ordered;
use super::text::{
    format_date, format_interval, format_time, format_timestamp, format_uuid, hex,
    normalize_timestamp, unhex,
};
use super::values::{TypeKind, parse_typed};

// ---------------------------------------------------------------------------
// Values.

/// A value in its JSON form; serializes and deserializes as
/// `docs/fixtures.md` describes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsonValue(pub Value);

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ValueJson(&self.0).serialize(serializer)
    }
}

/// A borrowed value in its JSON form (what [`JsonValue`] writes, without
/// owning the value).
pub(crate) struct ValueJson<'a>(pub(crate) &'a Value);

impl Serialize for ValueJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        fn tagged<S: Serializer, T: Serialize + ?Sized>(
            serializer: S,
            tag: &str,
            value: &T,
        ) -> Result<S::Ok, S::Error> {
            let mut map = serializer.serialize_map(Some(1))?;
            map.serialize_entry(tag, value)?;
            map.end()
        }
        match self.0 {
            Value::Null => serializer.serialize_unit(),
            Value::Bool(b) => serializer.serialize_bool(*b),
            Value::Int(i) => serializer.serialize_i64(*i),
            Value::Float(f) if f.is_nan() => tagged(serializer, "float", "NaN"),
            Value::Float(f) if f.is_infinite() && *f > 0.0 => {
                tagged(serializer, "float", "Infinity")
            }
            Value::Float(f) if f.is_infinite() => tagged(serializer, "float", "-Infinity"),
            Value::Float(f) => serializer.serialize_f64(*f),
            Value::Numeric(n) => tagged(serializer, "numeric", n),
            Value::Text(t) => serializer.serialize_str(t),
            Value::Bytes(b) => tagged(serializer, "bytes", &hex(b)),
            // As a JSON value when that reads back to the same text (jsonb's
            // output always does), else as text, so no byte changes.
            Value::Json(text) => match serde_json::from_str::<Ordered>(text) {
                Ok(node) if node.compact_string() == *text => tagged(serializer, "json", &node),
                _ => tagged(serializer, "json_text", text),
            },
            Value::Timestamp(t) => tagged(serializer, "timestamp", &format_timestamp(*t, false)),
            Value::TimestampTz(t) => tagged(serializer, "timestamptz", &format_timestamp(*t, true)),
            Value::Date(d) => tagged(serializer, "date", &format_date(*d)),
            Value::Time(t) => tagged(serializer, "time", &format_time(*t)),
            Value::Uuid(u) => tagged(serializer, "uuid", &format_uuid(u)),
            Value::Interval(i) => tagged(serializer, "interval", &format_interval(*i)),
            Value::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(&ValueJson(item))?;
                }
                seq.end()
            }
            Value::Unchanged => tagged(serializer, "unchanged", &true),
            Value::Other { type_name, text } => {
                #[derive(Serialize)]
                struct OtherRef<'a> {
                    #[serde(rename = "type")]
                    type_name: &'a str,
                    text: &'a str,
                }
                tagged(serializer, "other", &OtherRef { type_name, text })
            }
        }
    }
}

/// The tags a value may have, for error messages.
const TAGS: &str = "float, numeric, bytes, json, json_text, timestamp, timestamptz, date, time, \
                    uuid, interval, unchanged, other";

impl<'de> Deserialize<'de> for JsonValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<JsonValue, D::Error> {
        deserializer.deserialize_any(ValueVisitor).map(JsonValue)
    }
}

struct ValueVisitor;

impl<'de> Visitor<'de> for ValueVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value: null, a boolean, a number, a string, an array or a tagged object")
    }

    fn visit_unit<E: de::Error>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
        i64::try_from(v).map(Value::Int).map_err(|_| {
            E::custom(format!(
                "{v} does not fit in a 64-bit integer; write {{\"numeric\": \"{v}\"}}"
            ))
        })
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

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(JsonValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Some(tag) = map.next_key::<String>()? else {
            return Err(de::Error::custom(format!(
                "an empty object is not a value; a tagged value has one key of: {TAGS}"
            )));
        };
        let text = |map: &mut A| map.next_value::<String>();
        let typed = |kind: TypeKind, text: &str, what: &str| {
            parse_typed(&kind, text.as_bytes())
                .ok_or_else(|| de::Error::custom(format!("`{text}` is not {what}")))
        };
        let value = match tag.as_str() {
            "float" => {
                let t = text(&mut map)?;
                match t.as_str() {
                    "NaN" => Value::Float(f64::NAN),
                    "Infinity" => Value::Float(f64::INFINITY),
                    "-Infinity" => Value::Float(f64::NEG_INFINITY),
                    other => other.parse::<f64>().map(Value::Float).map_err(|_| {
                        de::Error::custom(format!(
                            "`{other}` is not a float: write a JSON number, \"NaN\", \
                             \"Infinity\" or \"-Infinity\""
                        ))
                    })?,
                }
            }
            "numeric" => {
                let t = text(&mut map)?;
                typed(
                    TypeKind::Numeric,
                    &t,
                    "a numeric (decimal text like \"12.50\")",
                )?
            }
            "bytes" => {
                let t = text(&mut map)?;
                let digits = t.strip_prefix("\\x").unwrap_or(&t);
                Value::Bytes(unhex(digits).ok_or_else(|| {
                    de::Error::custom(format!(
                        "`{t}` is not hex bytes (an even number of hex digits, like \"deadbeef\")"
                    ))
                })?)
            }
            // jsonb's text form: keys in the order written, `, ` and `: `.
            "json" => Value::Json(map.next_value::<Ordered>()?.compact_string()),
            "json_text" => Value::Json(text(&mut map)?),
            "timestamp" => {
                let t = normalize_timestamp(&text(&mut map)?);
                typed(
                    TypeKind::Timestamp,
                    &t,
                    "a timestamp (like \"2026-12-02 10:00:00.5\", \"infinity\")",
                )?
            }
            "timestamptz" => {
                let t = normalize_timestamp(&text(&mut map)?);
                typed(
                    TypeKind::TimestampTz,
                    &t,
                    "a timestamptz (like \"2026-12-02 10:00:00.5+00\", \"infinity\")",
                )?
            }
            "date" => {
                let t = text(&mut map)?;
                typed(
                    TypeKind::Date,
                    &t,
                    "a date (like \"2026-12-02\", \"0044-03-15 BC\")",
                )?
            }
            "time" => {
                let t = text(&mut map)?;
                typed(TypeKind::Time, &t, "a time (like \"10:00:00.5\")")?
            }
            "uuid" => {
                let t = text(&mut map)?.to_ascii_lowercase();
                typed(
                    TypeKind::Uuid,
                    &t,
                    "a uuid (like \"a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11\")",
                )?
            }
            "interval" => {
                let t = text(&mut map)?;
                typed(
                    TypeKind::Interval,
                    &t,
                    "an ISO 8601 interval (like \"P1Y2M3DT4H5M6.5S\")",
                )?
            }
            "unchanged" => {
                let _: serde::de::IgnoredAny = map.next_value()?;
                Value::Unchanged
            }
            "other" => {
                #[derive(Deserialize)]
                #[serde(deny_unknown_fields)]
                struct Other {
                    #[serde(rename = "type")]
                    type_name: String,
                    text: String,
                }
                let Other { type_name, text } = map.next_value()?;
                Value::Other { type_name, text }
            }
            other => {
                return Err(de::Error::custom(format!(
                    "unknown value tag `{other}`; the tags are: {TAGS}"
                )));
            }
        };
        if map.next_key::<de::IgnoredAny>()?.is_some() {
            return Err(de::Error::custom(format!(
                "a tagged value has exactly one key (`{tag}` and another were given)"
            )));
        }
        Ok(value)
    }
}

// ---------------------------------------------------------------------------
// Rows, changes, batches: writing.

/// A row in its JSON form: an object in column order.
struct RowJson<'a>(&'a Row);

impl Serialize for RowJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (name, value) in self.0.fields() {
            map.serialize_entry(name, &ValueJson(value))?;
        }
        map.end()
    }
}

/// Whether a change's JSON form lists its columns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ColumnsForm {
    /// Only when they cannot be inferred from the rows (with `key`).
    Auto,
    /// Never (when a fixture left them out, so a diff shows no noise).
    Omit,
    /// Never, but the key's column names as `key` (sinks' JSON lines).
    KeyOnly,
    /// The key's column names as `key`, then every column (sinks' JSON
    /// lines with `column_types`).
    KeyAndFull,
    /// Always.
    Full,
}

/// A change in its JSON form, keys in a fixed order.
pub(crate) struct ChangeJson<'a> {
    /// The change.
    pub change: &'a Change,
    /// Whether `columns` is written.
    pub columns: ColumnsForm,
}

impl fmt::Debug for ChangeJson<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChangeJson")
            .field("change", self.change)
            .finish_non_exhaustive()
    }
}

impl Serialize for ChangeJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let c = self.change;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("op", &c.op)?;
        if !(c.schema.is_empty() && c.table.is_empty()) {
            map.serialize_entry("schema", &c.schema)?;
            map.serialize_entry("table", &c.table)?;
        }
        let key: Vec<&str> = c
            .columns
            .iter()
            .filter(|col| col.key)
            .map(|col| col.name.as_str())
            .collect();
        let write_columns = match self.columns {
            ColumnsForm::Full | ColumnsForm::KeyAndFull => !c.columns.is_empty(),
            ColumnsForm::Omit | ColumnsForm::KeyOnly => false,
            ColumnsForm::Auto => {
                let key: Vec<String> = key.iter().map(|k| (*k).to_owned()).collect();
                c.columns != infer_columns(c.new.as_ref(), c.old.as_ref(), &key)
            }
        };
        // `key` even when empty: what is written states the columns, and a
        // reader then compares them.
        let write_key = match self.columns {
            ColumnsForm::Omit => false,
            ColumnsForm::KeyOnly | ColumnsForm::KeyAndFull => !c.columns.is_empty(),
            ColumnsForm::Auto | ColumnsForm::Full => !write_columns && !c.columns.is_empty(),
        };
        // A schema change's columns are its new shape's, written there.
        let (write_key, write_columns) = if c.schema_change.is_some() {
            (false, false)
        } else {
            (write_key, write_columns)
        };
        if write_key {
            map.serialize_entry("key", &key)?;
        }
        if write_columns {
            map.serialize_entry("columns", &c.columns)?;
        }
        if let Some(old) = &c.old {
            map.serialize_entry("old", &RowJson(old))?;
        }
        if let Some(new) = &c.new {
            map.serialize_entry("new", &RowJson(new))?;
        }
        if let Some(route) = &c.route {
            map.serialize_entry("route", route)?;
        }
        if let Some(truncate) = &c.truncate {
            map.serialize_entry("truncate", truncate)?;
        }
        if let Some(schema_change) = &c.schema_change {
            map.serialize_entry("schema_change", schema_change)?;
        }
        if let Some(message) = &c.message {
            #[derive(Serialize)]
            struct MessageJson<'a> {
                prefix: &'a str,
                content: JsonValue,
                transactional: bool,
            }
            let content = match std::str::from_utf8(&message.content) {
                Ok(text) => Value::Text(text.to_owned()),
                Err(_) => Value::Bytes(message.content.clone()),
            };
            map.serialize_entry(
                "message",
                &MessageJson {
                    prefix: &message.prefix,
                    content: JsonValue(content),
                    transactional: message.transactional,
                },
            )?;
        }
        map.end()
    }
}

/// Serialises a value as its `Display` text, without a `String` in between.
struct Text<T>(T);

impl<T: fmt::Display> Serialize for Text<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(&self.0)
    }
}

/// A transaction in its JSON form.
pub(crate) struct TxnJson<'a>(pub &'a Txn);

impl fmt::Debug for TxnJson<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for TxnJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let t = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("xid", &t.xid)?;
        map.serialize_entry("commit_lsn", &Text(Lsn(t.commit_lsn)))?;
        map.serialize_entry("end_lsn", &Text(Lsn(t.end_lsn)))?;
        map.serialize_entry(
            "commit_time",
            &format_timestamp(Timestamp::Micros(t.commit_time), true),
        )?;
        if t.chunk != 0 || !t.last {
            map.serialize_entry("chunk", &t.chunk)?;
            map.serialize_entry("last", &t.last)?;
        }
        map.end()
    }
}

/// A batch in its JSON form: `{"txn": ..., "changes": [...]}`.
pub(crate) struct BatchJson<'a>(pub &'a Batch);

impl fmt::Debug for BatchJson<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for BatchJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(2))?;
        map.serialize_entry("txn", &TxnJson(&self.0.txn))?;
        map.serialize_entry("changes", &Changes(&self.0.changes, ColumnsForm::Auto))?;
        map.end()
    }
}

/// A list of changes in their JSON form.
pub(crate) struct Changes<'a>(pub &'a [Change], pub ColumnsForm);

impl fmt::Debug for Changes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl Serialize for Changes<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut seq = serializer.serialize_seq(Some(self.0.len()))?;
        for change in self.0 {
            seq.serialize_element(&ChangeJson {
                change,
                columns: self.1,
            })?;
        }
        seq.end()
    }
}

/// The columns a change's rows imply: their names, in order (`new` first,
/// then names only `old` has), each typed by its first non-null value
/// (`text` when every value is null), `key` marking the given names.
pub(crate) fn infer_columns(new: Option<&Row>, old: Option<&Row>, key: &[String]) -> Vec<Column> {
    let mut columns: Vec<Column> = Vec::new();
    for row in [new, old].into_iter().flatten() {
        for (name, _) in row.fields() {
            if columns.iter().any(|c| c.name == name) {
                continue;
            }
            let type_name = [new, old]
                .into_iter()
                .flatten()
                .filter_map(|r| r.get(name))
                .find_map(type_of)
                .unwrap_or_else(|| "text".to_owned());
            columns.push(Column {
                name: name.to_owned(),
                type_name,
                key: key.iter().any(|k| k == name),
            });
        }
    }
    columns
}

/// The PostgreSQL type a value most plainly has; None for NULL and
/// unchanged values, which say nothing.
fn type_of(value: &Value) -> Option<String> {
    Some(
        match value {
            Value::Null | Value::Unchanged => return None,
            Value::Bool(_) => "bool",
            Value::Int(_) => "int8",
            Value::Float(_) => "float8",
            Value::Numeric(_) => "numeric",
            Value::Text(_) => "text",
            Value::Bytes(_) => "bytea",
            Value::Json(_) => "jsonb",
            Value::Timestamp(_) => "timestamp",
            Value::TimestampTz(_) => "timestamptz",
            Value::Date(_) => "date",
            Value::Time(_) => "time",
            Value::Uuid(_) => "uuid",
            Value::Interval(_) => "interval",
            Value::Array(items) => {
                let element = items.iter().find_map(type_of);
                return Some(format!(
                    "{}[]",
                    element.as_deref().unwrap_or("text").trim_end_matches("[]")
                ));
            }
            Value::Other { type_name, .. } => return Some(type_name.clone()),
        }
        .to_owned(),
    )
}

/// Where reading a JSON document failed: the line, column and field path,
/// and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError {
    /// 1-based line (0 when the error is not tied to a position).
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The field's path (`changes[2].new.created_at`), empty at the top.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}, column {}", self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, ", field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for ReadError {}

/// Reads a document, naming the line, column and field of what is wrong.
pub fn read<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, ReadError> {
    let mut de = serde_json::Deserializer::from_str(text);
    let result: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let value = result.map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        // serde_json appends " at line L column C"; the position is reported
        // on its own.
        let message = inner.to_string();
        let message = match message.rfind(" at line ") {
            Some(at) => message[..at].to_owned(),
            None => message,
        };
        ReadError {
            line: inner.line(),
            column: inner.column(),
            field: if field == "." { String::new() } else { field },
            message,
        }
    })?;
    de.end().map_err(|e| ReadError {
        line: e.line(),
        column: e.column(),
        field: String::new(),
        message: "trailing characters after the document".into(),
    })?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datum_guest::wire::{Date, Interval};

    fn value(json: &str) -> Value {
        read::<JsonValue>(json).expect(json).0
    }

    fn round_trip(v: Value) {
        let text = serde_json::to_string(&JsonValue(v.clone())).expect("serialize");
        let back = read::<JsonValue>(&text).expect(&text).0;
        match (&v, &back) {
            (Value::Float(a), Value::Float(b)) if a.is_nan() => assert!(b.is_nan(), "{text}"),
            _ => assert_eq!(back, v, "{text}"),
        }
    }

    #[test]
    fn plain_json_is_the_obvious_value() {
        assert_eq!(value("null"), Value::Null);
        assert_eq!(value("true"), Value::Bool(true));
        assert_eq!(value("-7"), Value::Int(-7));
        assert_eq!(value("1.5"), Value::Float(1.5));
        assert_eq!(value("1.0"), Value::Float(1.0));
        assert_eq!(value("\"a\""), Value::Text("a".into()));
        assert_eq!(
            value("[1, null]"),
            Value::Array(vec![Value::Int(1), Value::Null])
        );
    }

    #[test]
    fn tagged_values_read_postgres_text_forms() {
        assert_eq!(
            value(r#"{"timestamptz": "1970-01-01 00:00:01.5+00"}"#),
            Value::TimestampTz(Timestamp::Micros(1_500_000))
        );
        assert_eq!(
            value(r#"{"timestamptz": "1970-01-01T01:00:00Z"}"#),
            Value::TimestampTz(Timestamp::Micros(3_600_000_000))
        );
        assert_eq!(
            value(r#"{"timestamptz": "1970-01-01 02:00:00+02"}"#),
            Value::TimestampTz(Timestamp::Micros(0))
        );
        assert_eq!(
            value(r#"{"date": "1970-01-02"}"#),
            Value::Date(Date::Days(1))
        );
        assert_eq!(
            value(r#"{"numeric": "12.50"}"#),
            Value::Numeric("12.50".into())
        );
        assert_eq!(value(r#"{"bytes": "\\x00ff"}"#), Value::Bytes(vec![0, 255]));
        assert_eq!(
            value(r#"{"json": {"a": [1, 2]}}"#),
            Value::Json(r#"{"a": [1, 2]}"#.into())
        );
        assert!(matches!(value(r#"{"float": "NaN"}"#), Value::Float(f) if f.is_nan()));
    }

    #[test]
    fn every_value_round_trips() {
        for v in [
            Value::Null,
            Value::Bool(false),
            Value::Int(i64::MIN),
            Value::Float(-0.25),
            Value::Float(1e300),
            Value::Float(f64::NAN),
            Value::Float(f64::NEG_INFINITY),
            Value::Numeric("-1.000".into()),
            Value::Text("ü \"q\"".into()),
            Value::Bytes(vec![0, 1, 254]),
            Value::Json("[1,{\"b\":null}]".into()),
            Value::Json("{\"b\": 1, \"aa\": [true, null, 1.5, \"x\"]}".into()),
            Value::Json("not json".into()),
            Value::Timestamp(Timestamp::Micros(1_764_669_600_123_456)),
            Value::Timestamp(Timestamp::Micros(-62_135_596_800_000_001)),
            Value::TimestampTz(Timestamp::Infinity),
            Value::TimestampTz(Timestamp::Micros(-1)),
            Value::Date(Date::Days(-719_529)),
            Value::Date(Date::NegInfinity),
            Value::Date(Date::Days(20_424)),
            Value::Time(86_400_000_000),
            Value::Time(1),
            Value::Uuid([0xab; 16]),
            Value::Interval(Interval {
                months: -14,
                days: 3,
                micros: -5_400_500_000,
            }),
            Value::Interval(Interval {
                months: 0,
                days: 0,
                micros: 0,
            }),
            Value::Interval(Interval {
                months: 0,
                days: 0,
                micros: -500_000,
            }),
            Value::Array(vec![Value::Array(vec![Value::Int(1)])]),
            Value::Unchanged,
            Value::Other {
                type_name: "inet".into(),
                text: "10.0.0.1".into(),
            },
        ] {
            round_trip(v);
        }
    }

    #[test]
    fn bad_values_say_what_is_expected() {
        let err = read::<JsonValue>(r#"{"date": "2026-02-30"}"#).unwrap_err();
        assert!(err.message.contains("is not a date"), "{err}");
        let err = read::<JsonValue>(r#"{"when": "x"}"#).unwrap_err();
        assert!(err.message.contains("unknown value tag `when`"), "{err}");
        let err = read::<JsonValue>("18446744073709551615").unwrap_err();
        assert!(err.message.contains("numeric"), "{err}");
        let err = read::<JsonValue>(r#"{"numeric": "1", "date": "x"}"#).unwrap_err();
        assert!(err.message.contains("exactly one key"), "{err}");
    }
}
