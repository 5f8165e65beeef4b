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

use datum_guest::wire::{
    Batch, Change, Column, Date, Interval, LogicalMessage, Op, Row, Timestamp, Truncate, Txn, Value,
};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq};
use serde::{Deserialize, Serialize, Serializer};

use crate::source::Lsn;
use crate::source::values::{TypeKind, parse_typed};

const USECS_PER_SEC: i64 = 1_000_000;
const USECS_PER_DAY: i64 = 86_400 * USECS_PER_SEC;

// ---------------------------------------------------------------------------
// Values.

/// A value in its JSON form; serializes and deserializes as
/// `docs/fixtures.md` describes.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonValue(pub Value);

impl Serialize for JsonValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        ValueJson(&self.0).serialize(serializer)
    }
}

/// A borrowed value in its JSON form (what [`JsonValue`] writes, without
/// owning the value).
struct ValueJson<'a>(&'a Value);

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
            Value::Json(text) => match serde_json::from_str::<Node>(text) {
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
            "json" => Value::Json(map.next_value::<Node>()?.compact_string()),
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

/// Accepts the ISO 8601 spellings people type too: `T` for the space, `Z`
/// for `+00`.
fn normalize_timestamp(text: &str) -> String {
    let mut t = text.replacen('T', " ", 1);
    if let Some(stripped) = t.strip_suffix('Z') {
        t = format!("{stripped}+00");
    }
    t
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// (year, month, day) of days since 1970-01-01, astronomical year (Howard
/// Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Writes `YYYY-MM-DD`; returns the era suffix (` BC` for astronomical
/// years ≤ 0, else nothing).
fn write_ymd(out: &mut String, days: i64) -> &'static str {
    use std::fmt::Write as _;
    let (year, month, day) = civil_from_days(days);
    // Writing to a String cannot fail.
    if year <= 0 {
        let _ = write!(out, "{:04}-{month:02}-{day:02}", 1 - year);
        " BC"
    } else {
        let _ = write!(out, "{year:04}-{month:02}-{day:02}");
        ""
    }
}

/// Writes `HH:MM:SS` and the fraction with trailing zeros removed, as
/// PostgreSQL prints it.
fn write_time(out: &mut String, micros: i64) {
    use std::fmt::Write as _;
    let seconds = micros / USECS_PER_SEC;
    let _ = write!(
        out,
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    );
    push_fraction(out, micros % USECS_PER_SEC);
}

fn format_time(micros: i64) -> String {
    let mut text = String::with_capacity(15);
    write_time(&mut text, micros);
    text
}

/// `.` and the fraction's digits without trailing zeros (nothing for 0).
fn push_fraction(text: &mut String, fraction: i64) {
    use std::fmt::Write as _;
    if fraction != 0 {
        let (mut digits, mut width) = (fraction.abs(), 6usize);
        while digits % 10 == 0 {
            digits /= 10;
            width -= 1;
        }
        let _ = write!(text, ".{digits:0width$}");
    }
}

/// PostgreSQL's text form (`DateStyle=ISO`), in UTC for `timestamptz`.
pub(crate) fn format_timestamp(t: Timestamp, tz: bool) -> String {
    match t {
        Timestamp::Infinity => "infinity".into(),
        Timestamp::NegInfinity => "-infinity".into(),
        Timestamp::Micros(micros) => {
            let mut text = String::with_capacity(32);
            let era = write_ymd(&mut text, micros.div_euclid(USECS_PER_DAY));
            text.push(' ');
            write_time(&mut text, micros.rem_euclid(USECS_PER_DAY));
            if tz {
                text.push_str("+00");
            }
            text.push_str(era);
            text
        }
    }
}

fn format_date(d: Date) -> String {
    match d {
        Date::Infinity => "infinity".into(),
        Date::NegInfinity => "-infinity".into(),
        Date::Days(days) => {
            let mut text = String::with_capacity(13);
            let era = write_ymd(&mut text, i64::from(days));
            text.push_str(era);
            text
        }
    }
}

fn format_uuid(u: &[u8; 16]) -> String {
    let h = hex(u);
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// ISO 8601, as PostgreSQL prints it with `IntervalStyle=iso_8601`: each
/// part with its own sign, zero parts left out, `PT0S` for zero.
fn format_interval(i: Interval) -> String {
    let mut text = String::from("P");
    let (years, months) = (i.months / 12, i.months % 12);
    for (n, unit) in [
        (i64::from(years), 'Y'),
        (i64::from(months), 'M'),
        (i64::from(i.days), 'D'),
    ] {
        if n != 0 {
            text.push_str(&format!("{n}{unit}"));
        }
    }
    let hours = i.micros / (3600 * USECS_PER_SEC);
    let minutes = i.micros / (60 * USECS_PER_SEC) % 60;
    let rest = i.micros % (60 * USECS_PER_SEC);
    if hours != 0 || minutes != 0 || rest != 0 {
        text.push('T');
        if hours != 0 {
            text.push_str(&format!("{hours}H"));
        }
        if minutes != 0 {
            text.push_str(&format!("{minutes}M"));
        }
        if rest != 0 {
            let sign = if rest < 0 { "-" } else { "" };
            text.push_str(&format!("{sign}{}", rest.abs() / USECS_PER_SEC));
            push_fraction(&mut text, rest % USECS_PER_SEC);
            text.push('S');
        }
    }
    if text == "P" {
        text.push_str("T0S");
    }
    text
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
pub enum ColumnsForm {
    /// Only when they cannot be inferred from the rows (with `key`).
    Auto,
    /// Never (when a fixture left them out, so a diff shows no noise).
    Omit,
    /// Never, but the key's column names as `key` (sinks' JSON lines).
    KeyOnly,
    /// Always.
    Full,
}

/// A change in its JSON form, keys in a fixed order.
pub struct ChangeJson<'a> {
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
            ColumnsForm::Full => !c.columns.is_empty(),
            ColumnsForm::Omit | ColumnsForm::KeyOnly => false,
            ColumnsForm::Auto => {
                let key: Vec<String> = key.iter().map(|k| (*k).to_owned()).collect();
                infer_columns(c.new.as_ref(), c.old.as_ref(), &key) != c.columns
            }
        };
        // `key` even when empty: what is written states the columns, and a
        // reader then compares them.
        if write_columns {
            map.serialize_entry("columns", &c.columns)?;
        } else if !c.columns.is_empty() && self.columns != ColumnsForm::Omit {
            map.serialize_entry("key", &key)?;
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

/// A change of a transformed batch in the sinks' JSON form: what
/// `ChangeJson { columns: ColumnsForm::KeyOnly }` writes for its wire form,
/// written straight from the source's rows when the change is one (no copy
/// of names or values per row: this is the sinks' hot path).
#[derive(Debug)]
pub struct SinkChangeJson<'a>(pub crate::transform::encode::ChangeRef<'a>);

impl Serialize for SinkChangeJson<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use crate::batch::Change as Source;
        use crate::transform::encode::ChangeRef;
        let (op, relation, old, new) = match self.0 {
            ChangeRef::Wire(change) => {
                return ChangeJson {
                    change,
                    columns: ColumnsForm::KeyOnly,
                }
                .serialize(serializer);
            }
            ChangeRef::Source(Source::Insert { relation, new }) => {
                (Op::Insert, relation, None, Some(new))
            }
            ChangeRef::Source(Source::Update { relation, old, new }) => {
                (Op::Update, relation, old.as_ref(), Some(new))
            }
            ChangeRef::Source(Source::Delete { relation, old }) => {
                (Op::Delete, relation, Some(old), None)
            }
            ChangeRef::Source(other) => {
                return ChangeJson {
                    change: &crate::transform::encode::to_wire(other),
                    columns: ColumnsForm::KeyOnly,
                }
                .serialize(serializer);
            }
        };
        struct Key<'a>(&'a [crate::batch::Column]);
        impl Serialize for Key<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().filter(|c| c.key).map(|c| &c.name))
            }
        }
        struct Fields<'a> {
            columns: &'a [crate::batch::Column],
            values: &'a [Value],
            key_only: bool,
        }
        impl Serialize for Fields<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut map = serializer.serialize_map(None)?;
                for (column, value) in self.columns.iter().zip(self.values) {
                    if !self.key_only || column.key {
                        map.serialize_entry(&column.name, &ValueJson(value))?;
                    }
                }
                map.end()
            }
        }
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("op", &op)?;
        if !(relation.schema.is_empty() && relation.table.is_empty()) {
            map.serialize_entry("schema", &relation.schema)?;
            map.serialize_entry("table", &relation.table)?;
        }
        if !relation.columns.is_empty() {
            map.serialize_entry("key", &Key(&relation.columns))?;
        }
        if let Some(old) = old {
            map.serialize_entry(
                "old",
                &Fields {
                    columns: &relation.columns,
                    values: &old.values,
                    key_only: old.key_only,
                },
            )?;
        }
        if let Some(new) = new {
            map.serialize_entry(
                "new",
                &Fields {
                    columns: &relation.columns,
                    values: new,
                    key_only: false,
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
pub struct TxnJson<'a>(pub &'a Txn);

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
pub struct BatchJson<'a>(pub &'a Batch);

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
pub struct Changes<'a>(pub &'a [Change], pub ColumnsForm);

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
pub fn infer_columns(new: Option<&Row>, old: Option<&Row>, key: &[String]) -> Vec<Column> {
    let mut columns: Vec<Column> = Vec::new();
    for row in [new, old].into_iter().flatten() {
        for (name, _) in row.fields() {
            if columns.iter().any(|c| &c.name == name) {
                continue;
            }
            let type_name = [new, old]
                .into_iter()
                .flatten()
                .filter_map(|r| r.get(name))
                .find_map(type_of)
                .unwrap_or_else(|| "text".to_owned());
            columns.push(Column {
                name: name.clone(),
                type_name,
                key: key.contains(name),
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

// ---------------------------------------------------------------------------
// Rows, changes, batches: reading.

/// A change as read: the change, and whether `columns` (or `key`) was
/// written, so a comparison checks only what a fixture states.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadChange {
    /// The change, columns inferred when not given.
    pub change: Change,
    /// `columns` or `key` was written.
    pub columns_given: bool,
}

impl<'de> Deserialize<'de> for ReadChange {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ReadChange, D::Error> {
        let doc = ChangeDoc::deserialize(deserializer)?;
        doc.into_change().map_err(de::Error::custom)
    }
}

struct RowDoc(Row);

impl<'de> Deserialize<'de> for RowDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<RowDoc, D::Error> {
        struct RowVisitor;
        impl<'de> Visitor<'de> for RowVisitor {
            type Value = RowDoc;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a row: an object of column names to values")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<RowDoc, A::Error> {
                let mut row = Row::new();
                while let Some(name) = map.next_key::<String>()? {
                    if row.contains(&name) {
                        return Err(de::Error::custom(format!("column `{name}` is given twice")));
                    }
                    let JsonValue(value) = map.next_value()?;
                    row.set(name, value);
                }
                Ok(RowDoc(row))
            }
        }
        deserializer.deserialize_map(RowVisitor)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ColumnDoc {
    name: String,
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    key: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MessageDoc {
    prefix: String,
    content: JsonValue,
    #[serde(default = "yes")]
    transactional: bool,
}

fn yes() -> bool {
    true
}

fn public() -> String {
    "public".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChangeDoc {
    op: Op,
    #[serde(default = "public")]
    schema: String,
    #[serde(default)]
    table: String,
    columns: Option<Vec<ColumnDoc>>,
    key: Option<Vec<String>>,
    new: Option<RowDoc>,
    old: Option<RowDoc>,
    route: Option<String>,
    truncate: Option<Truncate>,
    message: Option<MessageDoc>,
}

impl ChangeDoc {
    fn into_change(self) -> Result<ReadChange, String> {
        let op_name = serde_json::to_value(self.op)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let new = self.new.map(|r| r.0);
        let old = self.old.map(|r| r.0);
        let needs = |what: &str, present: bool| {
            if present {
                Ok(())
            } else {
                Err(format!("a `{op_name}` change needs `{what}`"))
            }
        };
        let no = |what: &str, present: bool| {
            if present {
                Err(format!("a `{op_name}` change has no `{what}`"))
            } else {
                Ok(())
            }
        };
        match self.op {
            Op::Insert | Op::Snapshot => {
                needs("new", new.is_some())?;
                no("old", old.is_some())?;
            }
            Op::Update => needs("new", new.is_some())?,
            Op::Delete => {
                needs("old", old.is_some())?;
                no("new", new.is_some())?;
            }
            Op::Truncate => needs("truncate", self.truncate.is_some())?,
            Op::Message => needs("message", self.message.is_some())?,
        }
        if !matches!(self.op, Op::Truncate) {
            no("truncate", self.truncate.is_some())?;
        }
        if !matches!(self.op, Op::Message) {
            no("message", self.message.is_some())?;
        }
        if matches!(self.op, Op::Truncate | Op::Message) {
            no("new", new.is_some())?;
            no("old", old.is_some())?;
        }
        let columns_given = self.columns.is_some() || self.key.is_some();
        let columns = match (self.columns, self.key) {
            (Some(_), Some(_)) => {
                return Err("give `columns` (with `key` flags) or `key`, not both".to_owned());
            }
            (Some(columns), None) => {
                let columns: Vec<Column> = columns
                    .into_iter()
                    .map(|c| Column {
                        name: c.name,
                        type_name: c.type_name,
                        key: c.key,
                    })
                    .collect();
                for row in [&new, &old].into_iter().flatten() {
                    if let Some(name) = row.names().find(|n| !columns.iter().any(|c| c.name == *n))
                    {
                        return Err(format!(
                            "the row has column `{name}`, which `columns` lacks"
                        ));
                    }
                }
                columns
            }
            (None, key) => {
                let key = key.unwrap_or_default();
                let columns = infer_columns(new.as_ref(), old.as_ref(), &key);
                if let Some(k) = key.iter().find(|k| !columns.iter().any(|c| &c.name == *k)) {
                    return Err(format!("key column `{k}` is in no row"));
                }
                columns
            }
        };
        let (schema, table) = match self.op {
            Op::Message => (String::new(), String::new()),
            Op::Truncate if self.table.is_empty() => {
                let first = self.truncate.as_ref().and_then(|t| t.tables.first());
                (
                    first.map(|t| t.schema.clone()).unwrap_or_default(),
                    first.map(|t| t.table.clone()).unwrap_or_default(),
                )
            }
            _ if self.table.is_empty() => {
                return Err(format!("a `{op_name}` change needs `table`"));
            }
            _ => (self.schema, self.table),
        };
        let message = match self.message {
            None => None,
            Some(m) => Some(LogicalMessage {
                prefix: m.prefix,
                content: match m.content.0 {
                    Value::Text(text) => text.into_bytes(),
                    Value::Bytes(bytes) => bytes,
                    _ => {
                        return Err(
                            "a message's `content` is a string or {\"bytes\": \"<hex>\"}".into(),
                        );
                    }
                },
                transactional: m.transactional,
            }),
        };
        Ok(ReadChange {
            change: Change {
                op: self.op,
                schema,
                table,
                columns,
                new,
                old,
                route: self.route,
                truncate: self.truncate,
                message,
            },
            columns_given,
        })
    }
}

struct LsnDoc(Lsn);

impl<'de> Deserialize<'de> for LsnDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<LsnDoc, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map(LsnDoc).map_err(de::Error::custom)
    }
}

struct TimeDoc(i64);

impl<'de> Deserialize<'de> for TimeDoc {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<TimeDoc, D::Error> {
        let text = String::deserialize(deserializer)?;
        match parse_typed(
            &TypeKind::TimestampTz,
            normalize_timestamp(&text).as_bytes(),
        ) {
            Some(Value::TimestampTz(Timestamp::Micros(micros))) => Ok(TimeDoc(micros)),
            _ => Err(de::Error::custom(format!(
                "`{text}` is not a commit time (like \"2026-12-02 10:00:00+00\")"
            ))),
        }
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct TxnDoc {
    xid: Option<u32>,
    commit_lsn: Option<LsnDoc>,
    end_lsn: Option<LsnDoc>,
    commit_time: Option<TimeDoc>,
    chunk: Option<u32>,
    last: Option<bool>,
}

/// A batch as read from its JSON form.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadBatch {
    /// The transaction: what the document gave, defaults otherwise.
    pub txn: Txn,
    /// The changes.
    pub changes: Vec<ReadChange>,
}

impl ReadBatch {
    /// The batch, without the record of what was written.
    pub fn batch(&self) -> Batch {
        Batch {
            txn: self.txn,
            changes: self.changes.iter().map(|c| c.change.clone()).collect(),
        }
    }
}

impl<'de> Deserialize<'de> for ReadBatch {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ReadBatch, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct BatchDoc {
            #[serde(default)]
            txn: TxnDoc,
            changes: Vec<ReadChange>,
        }
        let doc = BatchDoc::deserialize(deserializer)?;
        let t = doc.txn;
        let last = t.last.unwrap_or(true);
        let commit_lsn = t.commit_lsn.map_or(0, |l| l.0.0);
        Ok(ReadBatch {
            txn: Txn {
                xid: t.xid.unwrap_or(0),
                commit_lsn,
                // The position past the commit: a plausible one when not given.
                end_lsn: t
                    .end_lsn
                    .map_or(if last { commit_lsn + 1 } else { 0 }, |l| l.0.0),
                commit_time: t.commit_time.map_or(0, |c| c.0),
                chunk: t.chunk.unwrap_or(0),
                last,
            },
            changes: doc.changes,
        })
    }
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

/// JSON text for people: a container that fits on a line of 100
/// characters stays on one line, a larger one gets a line per element;
/// keys keep their order. Ends with a newline.
pub fn to_pretty<T: Serialize + ?Sized>(value: &T) -> String {
    // Serializing these types cannot fail: every map key is a string, and a
    // compact document always reads back as a tree.
    let compact = serde_json::to_string(value).unwrap_or_default();
    let tree: Node =
        serde_json::from_str(&compact).unwrap_or(Node::Scalar(serde_json::Value::String(compact)));
    let mut out = String::new();
    tree.write(&mut out, 0);
    out.push('\n');
    out
}

/// A JSON document with its key order kept (serde_json's own map sorts
/// keys unless a crate-wide feature is turned on).
enum Node {
    Scalar(serde_json::Value),
    Array(Vec<Node>),
    Object(Vec<(String, Node)>),
}

const WIDTH: usize = 100;

impl Node {
    fn compact(&self, out: &mut String) {
        match self {
            Node::Scalar(value) => out.push_str(&value.to_string()),
            Node::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.compact(out);
                }
                out.push(']');
            }
            Node::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    out.push_str(&serde_json::Value::from(key.as_str()).to_string());
                    out.push_str(": ");
                    value.compact(out);
                }
                out.push('}');
            }
        }
    }

    fn compact_string(&self) -> String {
        let mut out = String::new();
        self.compact(&mut out);
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        let mut line = String::new();
        self.compact(&mut line);
        let column = out.len() - out.rfind('\n').map_or(0, |i| i + 1);
        if column + line.len() <= WIDTH || matches!(self, Node::Scalar(_)) {
            out.push_str(&line);
            return;
        }
        let pad = " ".repeat(indent + 2);
        match self {
            Node::Scalar(_) => {}
            Node::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    out.push_str(if i > 0 { ",\n" } else { "\n" });
                    out.push_str(&pad);
                    item.write(out, indent + 2);
                }
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                out.push(']');
            }
            Node::Object(entries) => {
                out.push('{');
                for (i, (key, value)) in entries.iter().enumerate() {
                    out.push_str(if i > 0 { ",\n" } else { "\n" });
                    out.push_str(&pad);
                    out.push_str(&serde_json::Value::from(key.as_str()).to_string());
                    out.push_str(": ");
                    value.write(out, indent + 2);
                }
                out.push('\n');
                out.push_str(&" ".repeat(indent));
                out.push('}');
            }
        }
    }
}

impl Serialize for Node {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Node::Scalar(value) => value.serialize(serializer),
            Node::Array(items) => {
                let mut seq = serializer.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Node::Object(entries) => {
                let mut map = serializer.serialize_map(Some(entries.len()))?;
                for (key, value) in entries {
                    map.serialize_entry(key, value)?;
                }
                map.end()
            }
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Node, D::Error> {
        struct NodeVisitor;
        impl<'de> Visitor<'de> for NodeVisitor {
            type Value = Node;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Node, E> {
                Ok(Node::Scalar(serde_json::Value::Null))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Node, E> {
                Ok(Node::Scalar(v.into()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Node, E> {
                Ok(Node::Scalar(v.into()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Node, E> {
                Ok(Node::Scalar(v.into()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Node, E> {
                Ok(Node::Scalar(v.into()))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Node, E> {
                Ok(Node::Scalar(v.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Node, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    items.push(item);
                }
                Ok(Node::Array(items))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Node, A::Error> {
                let mut entries = Vec::new();
                while let Some(entry) = map.next_entry()? {
                    entries.push(entry);
                }
                Ok(Node::Object(entries))
            }
        }
        deserializer.deserialize_any(NodeVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sinks write source changes straight from the source's rows; the
    /// result must be byte for byte what the wire form gives.
    #[test]
    fn source_changes_render_exactly_as_their_wire_form() {
        use crate::batch::{self, OldRow, ReplicaIdentity};
        use crate::transform::encode::{ChangeRef, to_wire};
        use std::sync::Arc;
        let column = |name: &str, type_name: &str, key| batch::Column::new(name, type_name, key);
        let relation = Arc::new(batch::Relation {
            oid: 7,
            schema: "sales \"eu\"".into(),
            table: "orders".into(),
            replica_identity: ReplicaIdentity::Default,
            columns: vec![
                column("id", "int8", true),
                column("region", "text", true),
                column("note", "text", false),
                column("amount", "numeric", false),
                column("tags", "_text", false),
                column("at", "timestamptz", false),
                column("raw", "bytea", false),
                column("doc", "jsonb", false),
                column("ratio", "float8", false),
            ],
        });
        let row = vec![
            Value::Int(-42),
            Value::Text("eu-west".into()),
            Value::Text("line\nbreak \"quoted\" \u{1F600} \\".into()),
            Value::Numeric("12345.670".into()),
            Value::Array(vec![Value::Text("a".into()), Value::Null]),
            Value::TimestampTz(Timestamp::Micros(1_000_000_123)),
            Value::Bytes(vec![0, 0xff, 0x10]),
            Value::Json("{\"a\":[1,2]}".into()),
            Value::Float(f64::NAN),
        ];
        let mut toasted = row.clone();
        toasted[2] = Value::Unchanged;
        let key = vec![
            Value::Int(-42),
            Value::Text("eu-west".into()),
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
        ];
        let no_columns = Arc::new(batch::Relation {
            columns: Vec::new(),
            ..(*relation).clone()
        });
        let changes = [
            batch::Change::Insert {
                relation: relation.clone(),
                new: row.clone(),
            },
            batch::Change::Update {
                relation: relation.clone(),
                old: None,
                new: toasted,
            },
            batch::Change::Update {
                relation: relation.clone(),
                old: Some(OldRow {
                    key_only: true,
                    values: key.clone(),
                }),
                new: row.clone(),
            },
            batch::Change::Update {
                relation: relation.clone(),
                old: Some(OldRow {
                    key_only: false,
                    values: row.clone(),
                }),
                new: row.clone(),
            },
            batch::Change::Delete {
                relation: relation.clone(),
                old: OldRow {
                    key_only: true,
                    values: key,
                },
            },
            batch::Change::Insert {
                relation: no_columns,
                new: Vec::new(),
            },
            batch::Change::Truncate {
                relations: vec![relation.clone()],
                cascade: true,
                restart_identity: false,
            },
            batch::Change::Message {
                transactional: true,
                lsn: Lsn(5),
                prefix: "p".into(),
                content: b"hello".to_vec(),
            },
        ];
        for change in &changes {
            let fast = serde_json::to_string(&SinkChangeJson(ChangeRef::Source(change)))
                .expect("serialize");
            let wire = to_wire(change);
            let slow = serde_json::to_string(&ChangeJson {
                change: &wire,
                columns: ColumnsForm::KeyOnly,
            })
            .expect("serialize");
            assert_eq!(fast, slow, "{change:?}");
            let via_wire =
                serde_json::to_string(&SinkChangeJson(ChangeRef::Wire(&wire))).expect("serialize");
            assert_eq!(via_wire, slow);
        }
    }

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
    fn bc_dates_print_as_postgres_does() {
        // 0001-01-01 BC is astronomical year 0.
        let days = -719_162 - 366;
        assert_eq!(format_date(Date::Days(days)), "0001-01-01 BC");
        assert_eq!(format_date(Date::Days(0)), "1970-01-01");
        assert_eq!(
            format_timestamp(Timestamp::Micros(-1), true),
            "1969-12-31 23:59:59.999999+00"
        );
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

    #[test]
    fn a_batch_reads_with_defaults_and_errors_name_the_field() {
        let batch: ReadBatch = read(
            r#"{"changes": [
                {"op": "insert", "table": "t", "key": ["id"], "new": {"id": 1, "at": null}},
                {"op": "delete", "schema": "s", "table": "t", "old": {"id": 1}}
            ]}"#,
        )
        .expect("reads");
        assert!(batch.txn.last);
        let first = &batch.changes[0].change;
        assert_eq!(first.schema, "public");
        assert_eq!(
            first.columns,
            vec![
                Column {
                    name: "id".into(),
                    type_name: "int8".into(),
                    key: true
                },
                Column {
                    name: "at".into(),
                    type_name: "text".into(),
                    key: false
                },
            ]
        );
        let err = read::<ReadBatch>(
            "{\"changes\": [\n {\"op\": \"insert\", \"table\": \"t\",\n  \"new\": {\"at\": {\"date\": \"soon\"}}}]}",
        )
        .unwrap_err();
        assert_eq!(err.field, "changes[0].new.at");
        assert_eq!(err.line, 3);
        let err =
            read::<ReadBatch>(r#"{"changes": [{"op": "upsert", "table": "t"}]}"#).unwrap_err();
        assert_eq!(err.field, "changes[0].op");
        assert!(err.message.contains("insert"), "{err}");
        let err = read::<ReadBatch>(r#"{"changes": [{"op": "insert", "table": "t", "nwe": {}}]}"#)
            .unwrap_err();
        assert!(err.message.contains("unknown field `nwe`"), "{err}");
        let err =
            read::<ReadBatch>(r#"{"changes": [{"op": "delete", "table": "t"}]}"#).unwrap_err();
        assert!(err.message.contains("needs `old`"), "{err}");
        assert_eq!(err.field, "changes[0]");
    }

    #[test]
    fn a_written_batch_reads_back_the_same() {
        let text = r#"{"txn": {"xid": 7, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780",
            "commit_time": "2026-12-02 10:00:00+00"},
          "changes": [
            {"op": "update", "table": "t",
             "columns": [{"name": "id", "type": "int4", "key": true},
                         {"name": "v", "type": "text"}],
             "old": {"id": 1}, "new": {"id": 2, "v": {"unchanged": true}}},
            {"op": "truncate", "truncate": {"tables": [{"schema": "public", "table": "t"}],
             "cascade": true, "restart_identity": false}},
            {"op": "message", "message": {"prefix": "p", "content": {"bytes": "ff00"}}},
            {"op": "insert", "table": "t", "key": ["id"], "new": {"id": 3}, "route": "r"}
          ]}"#;
        let batch: ReadBatch = read(text).expect("reads");
        let written = to_pretty(&BatchJson(&batch.batch()));
        let again: ReadBatch = read(&written).expect(&written);
        assert_eq!(again.batch(), batch.batch(), "{written}");
        assert!(
            written.contains("\"columns\""),
            "int4 is not inferable: {written}"
        );
        assert!(written.contains("\"key\": [\"id\"]"), "{written}");
    }
}
