//! Typed access to a [`Value`]: `value.as_str()`, `value.as_i64()`, ... and a
//! few more conversions into one.
//!
//! Owns reading and building single values. The wire form of a value
//! belongs to [`wire`](crate::wire); rows and changes to `change`.

use std::borrow::Cow;

use crate::wire::{Date, Interval, Timestamp, Value};

impl Value {
    /// Whether the value is SQL NULL.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// Whether the value is an unchanged TOAST value, which PostgreSQL did
    /// not send (not NULL).
    pub fn is_unchanged(&self) -> bool {
        matches!(self, Value::Unchanged)
    }

    /// The text of a `text`-like value (`text`, `varchar`, enum labels...).
    /// `None` for any other variant, `numeric` and `json` included (see
    /// [`Value::as_numeric`], [`Value::as_json`]).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Text(s) => Some(s),
            _ => None,
        }
    }

    /// An integer (`int2`, `int4`, `int8`, `oid`).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(i) => Some(*i),
            _ => None,
        }
    }

    /// A float; an integer converts too (beyond 2^53 it loses precision).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Float(f) => Some(*f),
            Value::Int(i) => Some(*i as f64),
            _ => None,
        }
    }

    /// A `bool`.
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Value::Bool(b) => Some(*b),
            _ => None,
        }
    }

    /// The bytes of a `bytea`.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The decimal text of a `numeric`, exact: `12.50`, or `NaN`,
    /// `Infinity`, `-Infinity`. To compute with it, the `decimal` feature
    /// reads it as a `rust_decimal::Decimal` (`to_decimal`), and converts a
    /// `Decimal` back into a `numeric` value.
    pub fn as_numeric(&self) -> Option<&str> {
        match self {
            Value::Numeric(n) => Some(n),
            _ => None,
        }
    }

    /// The JSON text of a `json` or `jsonb`.
    pub fn as_json(&self) -> Option<&str> {
        match self {
            Value::Json(j) => Some(j),
            _ => None,
        }
    }

    /// A `timestamp` or a `timestamptz`.
    pub fn as_timestamp(&self) -> Option<Timestamp> {
        match self {
            Value::Timestamp(t) | Value::TimestampTz(t) => Some(*t),
            _ => None,
        }
    }

    /// A `date`.
    pub fn as_date(&self) -> Option<Date> {
        match self {
            Value::Date(d) => Some(*d),
            _ => None,
        }
    }

    /// A `time`, in microseconds since midnight.
    pub fn as_time(&self) -> Option<i64> {
        match self {
            Value::Time(t) => Some(*t),
            _ => None,
        }
    }

    /// A `uuid`'s 16 bytes.
    pub fn as_uuid(&self) -> Option<&[u8; 16]> {
        match self {
            Value::Uuid(u) => Some(u),
            _ => None,
        }
    }

    /// An `interval`.
    pub fn as_interval(&self) -> Option<Interval> {
        match self {
            Value::Interval(i) => Some(*i),
            _ => None,
        }
    }

    /// An array's elements.
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(items) => Some(items),
            _ => None,
        }
    }

    /// The variant's name as the wire spells its tag (`"null"`, `"bool"`,
    /// `"int"`, `"float"`, `"text"`, `"bytes"`, `"array"`, `"numeric"`,
    /// `"json"`, `"timestamp"`, `"timestamptz"`, `"date"`, `"time"`, `"uuid"`,
    /// `"interval"`, `"unchanged"`, `"other"`): for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "bool",
            Value::Int(_) => "int",
            Value::Float(_) => "float",
            Value::Numeric(_) => "numeric",
            Value::Text(_) => "text",
            Value::Bytes(_) => "bytes",
            Value::Json(_) => "json",
            Value::Timestamp(_) => "timestamp",
            Value::TimestampTz(_) => "timestamptz",
            Value::Date(_) => "date",
            Value::Time(_) => "time",
            Value::Uuid(_) => "uuid",
            Value::Interval(_) => "interval",
            Value::Array(_) => "array",
            Value::Unchanged => "unchanged",
            Value::Other { .. } => "other",
        }
    }

    /// The value as text, for the types whose text is cheap and unambiguous:
    /// text and `other` values as they are, `numeric` and `json` as their
    /// text, integers and floats in decimal (`NaN`, `inf`, `-inf`), `bool` as
    /// `true`/`false`, a `uuid` in its canonical hyphenated form. `None` for
    /// NULL, unchanged, bytes, arrays and the date and time types.
    pub fn to_text(&self) -> Option<Cow<'_, str>> {
        match self {
            Value::Text(s) | Value::Numeric(s) | Value::Json(s) => Some(Cow::Borrowed(s)),
            Value::Other { text, .. } => Some(Cow::Borrowed(text)),
            Value::Int(i) => Some(Cow::Owned(i.to_string())),
            Value::Float(f) => Some(Cow::Owned(f.to_string())),
            Value::Bool(b) => Some(Cow::Borrowed(if *b { "true" } else { "false" })),
            Value::Uuid(u) => Some(Cow::Owned(uuid_text(u))),
            _ => None,
        }
    }
}

fn uuid_text(u: &[u8; 16]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(36);
    for (i, b) in u.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            s.push('-');
        }
        s.push(char::from(HEX[usize::from(b >> 4)]));
        s.push(char::from(HEX[usize::from(b & 0x0f)]));
    }
    s
}

impl From<i16> for Value {
    fn from(v: i16) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<u32> for Value {
    fn from(v: u32) -> Value {
        Value::Int(i64::from(v))
    }
}

impl From<f32> for Value {
    fn from(v: f32) -> Value {
        Value::Float(f64::from(v))
    }
}

impl From<&[u8]> for Value {
    fn from(v: &[u8]) -> Value {
        Value::Bytes(v.to_vec())
    }
}

impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Value {
        Value::Array(v)
    }
}

impl From<Date> for Value {
    fn from(v: Date) -> Value {
        Value::Date(v)
    }
}

impl From<Interval> for Value {
    fn from(v: Interval) -> Value {
        Value::Interval(v)
    }
}

impl From<&String> for Value {
    fn from(v: &String) -> Value {
        Value::Text(v.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getters_match_only_their_variant() {
        let text = Value::from("ada");
        assert_eq!(text.as_str(), Some("ada"));
        assert_eq!(text.as_i64(), None);
        assert_eq!(Value::from(7).as_i64(), Some(7));
        assert_eq!(Value::from(7).as_f64(), Some(7.0));
        assert_eq!(Value::from(true).as_bool(), Some(true));
        assert_eq!(Value::from(vec![1u8, 2]).as_bytes(), Some(&[1u8, 2][..]));
        assert_eq!(Value::Numeric("1.5".into()).as_numeric(), Some("1.5"));
        assert_eq!(Value::Numeric("1.5".into()).as_str(), None);
        assert_eq!(Value::Json("{}".into()).as_json(), Some("{}"));
        assert!(Value::Null.is_null() && !Value::Unchanged.is_null());
        assert!(Value::Unchanged.is_unchanged());
        assert_eq!(
            Value::TimestampTz(Timestamp::Infinity).as_timestamp(),
            Some(Timestamp::Infinity)
        );
        assert_eq!(
            Value::from(vec![Value::Null]).as_array().map(<[_]>::len),
            Some(1)
        );
        assert_eq!(Value::Unchanged.kind(), "unchanged");
    }

    /// Runs with and without the `decimal` feature: it adds ways to read a
    /// `numeric`, and changes none of these.
    #[test]
    fn numeric_is_exact_text() {
        for text in ["12.50", "-0.001", "NaN", "Infinity", "-Infinity"] {
            let value = Value::Numeric(text.into());
            assert_eq!(value.as_numeric(), Some(text));
            assert_eq!(value.to_text().as_deref(), Some(text));
            assert_eq!((value.as_f64(), value.as_i64()), (None, None));
            assert_eq!(value.kind(), "numeric");
        }
    }

    #[test]
    fn text_forms() {
        let uuid = Value::Uuid([
            0x12, 0x3e, 0x45, 0x67, 0xe8, 0x9b, 0x12, 0xd3, 0xa4, 0x56, 0x42, 0x66, 0x14, 0x17,
            0x40, 0x00,
        ]);
        assert_eq!(
            uuid.to_text().as_deref(),
            Some("123e4567-e89b-12d3-a456-426614174000")
        );
        assert_eq!(Value::from(-3).to_text().as_deref(), Some("-3"));
        assert_eq!(Value::from(false).to_text().as_deref(), Some("false"));
        assert_eq!(Value::Null.to_text(), None);
    }
}
