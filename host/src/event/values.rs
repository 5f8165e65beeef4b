//! PostgreSQL text-format column values into typed [`Value`]s.
//!
//! pgoutput (protocol v1) sends every column value in its type's text output
//! form. This module owns turning that text into a [`datum_guest::Value`]
//! given how the column's type reads ([`TypeKind`]): which built-in type OIDs
//! read as which kind ([`TypeKind::builtin`]), their names, and the exact
//! formats PostgreSQL prints under the replication session's settings
//! (`DateStyle=ISO, MDY`, `TimeZone=UTC`, `IntervalStyle=iso_8601`,
//! `extra_float_digits=3`, `bytea_output=hex`, `client_encoding=UTF8`).
//! [`parse`] never fails: text that does not read as its type becomes
//! [`Value::Other`] with the text, so nothing is lost.
//!
//! It does not own catalog lookups (the caller resolves a non-built-in type
//! into a [`TypeKind`]: an enum reads as `Text`, a domain as its base type,
//! anything else as `Other` with its schema-qualified name), nor pgoutput
//! framing (NULL and unchanged TOAST values never reach this module).
//!
//! This is the hot path: values are read straight from bytes, and the only
//! allocations are the returned `Value`'s own `String`s and `Vec`s (plus one
//! reusable buffer for an array that has backslash-escaped elements).

use datum_guest::{Date, Interval, Timestamp, Value};

const USECS_PER_SEC: i64 = 1_000_000;
const USECS_PER_MIN: i64 = 60 * USECS_PER_SEC;
const USECS_PER_HOUR: i64 = 60 * USECS_PER_MIN;
const USECS_PER_DAY: i64 = 24 * USECS_PER_HOUR;
/// Most dimensions a PostgreSQL array has (`MAXDIM`).
const MAX_DIMS: usize = 6;

/// How a column's text form becomes a Value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TypeKind {
    /// `bool`: `t` or `f`.
    Bool,
    /// `int2`, `int4`, `int8`, `oid`.
    Int,
    /// `float4`: read as `f32`, then widened, so the value is exactly the
    /// stored one.
    Float4,
    /// `float8`, `NaN` and `±Infinity` included.
    Float8,
    /// `numeric`: the text unchanged (`NaN`, `Infinity`, `-Infinity`).
    Numeric,
    /// `text`, `varchar`, `bpchar`, `name`, `"char"`, and enums.
    Text,
    /// `bytea` in hex format (`\x0102`).
    Bytea,
    /// `json`, `jsonb`: the JSON text unchanged.
    Json,
    /// `timestamp` (without time zone).
    Timestamp,
    /// `timestamptz`.
    TimestampTz,
    /// `date`.
    Date,
    /// `time` (without time zone).
    Time,
    /// `uuid`.
    Uuid,
    /// `interval`, in `IntervalStyle=iso_8601`.
    Interval,
    /// An array whose elements read as `element`, separated by `delimiter`
    /// (the element type's `typdelim`: `,` for every type but `box`).
    Array {
        /// How each element reads.
        element: Box<TypeKind>,
        /// The byte between elements.
        delimiter: u8,
    },
    /// Any other type: the text is kept as it is, with this name.
    Other {
        /// The type's name as shown to users, schema-qualified unless in
        /// `pg_catalog`.
        type_name: String,
    },
}

impl TypeKind {
    /// The kind of a built-in type by OID, with its name for `Other`; None for
    /// an OID that is not built in (the caller then asks the catalog: enums
    /// become Text, domains their base type's kind).
    ///
    /// Built in means listed in PostgreSQL's `pg_type.dat` (OIDs below
    /// 10000). Types that `initdb` creates later (the `information_schema`
    /// domains, most catalogs' row types) are not: they are looked up.
    pub(crate) fn builtin(oid: u32) -> Option<TypeKind> {
        if let Some(kind) = scalar_kind(oid) {
            return Some(kind);
        }
        if let Some(element) = array_element_kind(oid) {
            return Some(TypeKind::Array {
                element: Box::new(element),
                delimiter: b',',
            });
        }
        builtin_name(oid).map(|name| TypeKind::Other {
            type_name: name.to_owned(),
        })
    }

    /// The type's name as shown to users (e.g. "int4", "_text" is shown as
    /// "text[]", custom types schema-qualified by the caller).
    ///
    /// A kind that stands for several types cannot tell which it is, and
    /// names one: `Int` is "int8" (the width of `Value::Int`), `Text` is
    /// "text", `Json` is "json"; an array of them likewise. `builtin_name`
    /// gives the exact name of a built-in type by OID.
    pub(crate) fn name(&self) -> String {
        match self {
            TypeKind::Array { element, .. } => format!("{}[]", element.name()),
            TypeKind::Other { type_name } => type_name.clone(),
            TypeKind::Bool => "bool".to_owned(),
            TypeKind::Int => "int8".to_owned(),
            TypeKind::Float4 => "float4".to_owned(),
            TypeKind::Float8 => "float8".to_owned(),
            TypeKind::Numeric => "numeric".to_owned(),
            TypeKind::Text => "text".to_owned(),
            TypeKind::Bytea => "bytea".to_owned(),
            TypeKind::Json => "json".to_owned(),
            TypeKind::Timestamp => "timestamp".to_owned(),
            TypeKind::TimestampTz => "timestamptz".to_owned(),
            TypeKind::Date => "date".to_owned(),
            TypeKind::Time => "time".to_owned(),
            TypeKind::Uuid => "uuid".to_owned(),
            TypeKind::Interval => "interval".to_owned(),
        }
    }
}

/// The name of a built-in type as shown to users (`int4`, `text[]` for
/// `_text`), or None for an OID that is not built in.
pub(crate) fn builtin_name(oid: u32) -> Option<&'static str> {
    BUILTIN_NAMES
        .binary_search_by_key(&oid, |&(o, _)| o)
        .ok()
        .map(|i| BUILTIN_NAMES[i].1)
}

/// The kind of a built-in type that is not an array, if it has its own.
fn scalar_kind(oid: u32) -> Option<TypeKind> {
    Some(match oid {
        16 => TypeKind::Bool,
        20 | 21 | 23 | 26 => TypeKind::Int,
        700 => TypeKind::Float4,
        701 => TypeKind::Float8,
        1700 => TypeKind::Numeric,
        18 | 19 | 25 | 1042 | 1043 => TypeKind::Text,
        17 => TypeKind::Bytea,
        114 | 3802 => TypeKind::Json,
        1114 => TypeKind::Timestamp,
        1184 => TypeKind::TimestampTz,
        1082 => TypeKind::Date,
        1083 => TypeKind::Time,
        2950 => TypeKind::Uuid,
        1186 => TypeKind::Interval,
        _ => return None,
    })
}

/// The element kind of a built-in array type whose element has its own kind
/// (`typarray` of each type in [`scalar_kind`]).
fn array_element_kind(oid: u32) -> Option<TypeKind> {
    let element = match oid {
        1000 => 16,
        1016 => 20,
        1005 => 21,
        1007 => 23,
        1028 => 26,
        1021 => 700,
        1022 => 701,
        1231 => 1700,
        1002 => 18,
        1003 => 19,
        1009 => 25,
        1014 => 1042,
        1015 => 1043,
        1001 => 17,
        199 => 114,
        3807 => 3802,
        1115 => 1114,
        1185 => 1184,
        1182 => 1082,
        1183 => 1083,
        2951 => 2950,
        1187 => 1186,
        _ => return None,
    };
    scalar_kind(element)
}

/// Never fails: text that does not parse as its type (which the session
/// settings in the module doc should make impossible) becomes
/// `Value::Other { type_name, text }` so nothing is lost. So does a value
/// the `Value` cannot hold: a timestamp past `i64` microseconds since 1970
/// (294247 AD to PostgreSQL's 294276 AD), an array with a lower bound other
/// than 1. An array element that does not parse becomes `Value::Other` in
/// its place, the rest of the array typed.
///
/// Text that is not UTF-8 (impossible with `client_encoding=UTF8`) becomes
/// `Value::Other` too, its text made UTF-8 lossily (invalid sequences become
/// U+FFFD): the only case where bytes are lost, and one the server rules out.
pub(crate) fn parse(kind: &TypeKind, text: &[u8]) -> Value {
    match parse_typed(kind, text) {
        Some(value) => value,
        None => other(kind, text),
    }
}

/// [`parse`] for text already known to be UTF-8 (a snapshot chunk's rows
/// arrive as checked strings): the kinds whose value is the text itself
/// take it without checking it again.
pub(crate) fn parse_str(kind: &TypeKind, text: &str) -> Value {
    match kind {
        TypeKind::Text => Value::Text(text.to_owned()),
        TypeKind::Json => Value::Json(text.to_owned()),
        TypeKind::Numeric if is_numeric(text.as_bytes()) => Value::Numeric(text.to_owned()),
        _ => parse(kind, text.as_bytes()),
    }
}

#[cold]
fn other(kind: &TypeKind, text: &[u8]) -> Value {
    Value::Other {
        type_name: kind.name(),
        text: String::from_utf8_lossy(text).into_owned(),
    }
}

/// The typed value, or None for text that does not read as `kind` (and for
/// `Other`, which has no typed form).
pub(crate) fn parse_typed(kind: &TypeKind, text: &[u8]) -> Option<Value> {
    Some(match kind {
        TypeKind::Bool => Value::Bool(match text {
            b"t" => true,
            b"f" => false,
            _ => return None,
        }),
        TypeKind::Int => Value::Int(parse_int(text)?),
        // Rust's float reading is correctly rounded, like PostgreSQL's
        // strtof/strtod, and takes `NaN`, `Infinity` and `-Infinity`.
        TypeKind::Float4 => Value::Float(f64::from(utf8(text)?.parse::<f32>().ok()?)),
        TypeKind::Float8 => Value::Float(utf8(text)?.parse::<f64>().ok()?),
        TypeKind::Numeric if is_numeric(text) => Value::Numeric(utf8(text)?.to_owned()),
        TypeKind::Numeric => return None,
        TypeKind::Text => Value::Text(utf8(text)?.to_owned()),
        TypeKind::Bytea => Value::Bytes(parse_bytea(text)?),
        TypeKind::Json => Value::Json(utf8(text)?.to_owned()),
        TypeKind::Timestamp => Value::Timestamp(parse_timestamp(text, false)?),
        TypeKind::TimestampTz => Value::TimestampTz(parse_timestamp(text, true)?),
        TypeKind::Date => Value::Date(parse_date(text)?),
        TypeKind::Time => Value::Time(parse_time(text)?),
        TypeKind::Uuid => Value::Uuid(parse_uuid(text)?),
        TypeKind::Interval => Value::Interval(parse_interval(text)?),
        TypeKind::Array { element, delimiter } => parse_array(element, *delimiter, text)?,
        TypeKind::Other { .. } => return None,
    })
}

fn utf8(text: &[u8]) -> Option<&str> {
    std::str::from_utf8(text).ok()
}

/// `-?[0-9]+`, within `i64` (`int8`'s minimum included).
fn parse_int(text: &[u8]) -> Option<i64> {
    let (negative, digits) = match text {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, text),
    };
    if digits.is_empty() {
        return None;
    }
    // Accumulate negatively: i64::MIN has no positive counterpart.
    let mut acc: i64 = 0;
    for &b in digits {
        let digit = b.wrapping_sub(b'0');
        if digit > 9 {
            return None;
        }
        acc = acc.checked_mul(10)?.checked_sub(i64::from(digit))?;
    }
    if negative {
        Some(acc)
    } else {
        acc.checked_neg()
    }
}

/// What `numeric_out` prints: `-?[0-9]+(\.[0-9]+)?`, `NaN`, `Infinity`,
/// `-Infinity` (never an exponent).
fn is_numeric(text: &[u8]) -> bool {
    if matches!(text, b"NaN" | b"Infinity" | b"-Infinity") {
        return true;
    }
    let unsigned = text.strip_prefix(b"-").unwrap_or(text);
    let (whole, fraction) = match unsigned.iter().position(|&b| b == b'.') {
        Some(dot) => (&unsigned[..dot], Some(&unsigned[dot + 1..])),
        None => (unsigned, None),
    };
    let all_digits = |s: &[u8]| !s.is_empty() && s.iter().all(u8::is_ascii_digit);
    all_digits(whole) && fraction.is_none_or(all_digits)
}

/// `\x` and an even number of hex digits.
fn parse_bytea(text: &[u8]) -> Option<Vec<u8>> {
    let hex = text.strip_prefix(b"\\x")?;
    if hex.len() % 2 != 0 {
        return None;
    }
    let mut bytes = Vec::with_capacity(hex.len() / 2);
    for pair in hex.chunks_exact(2) {
        bytes.push(hex_digit(pair[0])? << 4 | hex_digit(pair[1])?);
    }
    Some(bytes)
}

fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (`uuid_out`, lowercase; uppercase
/// is taken too).
fn parse_uuid(text: &[u8]) -> Option<[u8; 16]> {
    if text.len() != 36 {
        return None;
    }
    let mut uuid = [0u8; 16];
    let mut i = 0;
    for (n, byte) in uuid.iter_mut().enumerate() {
        if matches!(n, 4 | 6 | 8 | 10) {
            if text[i] != b'-' {
                return None;
            }
            i += 1;
        }
        *byte = hex_digit(text[i])? << 4 | hex_digit(text[i + 1])?;
        i += 2;
    }
    Some(uuid)
}

/// A reading position in a value's text.
struct Cursor<'a> {
    text: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn new(text: &'a [u8]) -> Self {
        Cursor { text, pos: 0 }
    }

    fn peek(&self) -> Option<u8> {
        self.text.get(self.pos).copied()
    }

    fn next_byte(&mut self) -> Option<u8> {
        let b = self.peek()?;
        self.pos += 1;
        Some(b)
    }

    /// Consumes `b` if it is next.
    fn eat(&mut self, b: u8) -> bool {
        let found = self.peek() == Some(b);
        if found {
            self.pos += 1;
        }
        found
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        self.eat(b).then_some(())
    }

    /// Consumes `suffix` if the text ends with it here.
    fn eat_rest(&mut self, suffix: &[u8]) -> bool {
        let found = &self.text[self.pos..] == suffix;
        if found {
            self.pos = self.text.len();
        }
        found
    }

    fn end(&self) -> Option<()> {
        (self.pos == self.text.len()).then_some(())
    }

    /// `min` to `max` decimal digits (`max` at most 19, so the value fits).
    /// Stops after `max`: a further digit is left for the caller to reject.
    fn digits(&mut self, min: usize, max: usize) -> Option<u64> {
        let start = self.pos;
        let mut value: u64 = 0;
        while self.pos - start < max {
            match self.peek() {
                Some(b @ b'0'..=b'9') => {
                    value = value * 10 + u64::from(b - b'0');
                    self.pos += 1;
                }
                _ => break,
            }
        }
        (self.pos - start >= min).then_some(value)
    }

    /// An optional `.` and 1 to 6 digits, as microseconds.
    fn fraction(&mut self) -> Option<i64> {
        if !self.eat(b'.') {
            return Some(0);
        }
        let start = self.pos;
        let mut value = self.digits(1, 6)? as i64;
        for _ in self.pos - start..6 {
            value *= 10;
        }
        Some(value)
    }

    /// `YYYY-MM-DD` with a year of 4 to 9 digits (PostgreSQL pads to 4 and
    /// prints up to 7), checked against the calendar later, once the era is
    /// known.
    fn date(&mut self) -> Option<(i64, u32, u32)> {
        let year = self.digits(4, 9)? as i64;
        self.expect(b'-')?;
        let month = self.digits(2, 2)? as u32;
        self.expect(b'-')?;
        let day = self.digits(2, 2)? as u32;
        Some((year, month, day))
    }

    /// ` BC` or nothing, turning the year into an astronomical one (1 BC is
    /// year 0) and checking the day against that year's calendar.
    fn era(&mut self, (year, month, day): (i64, u32, u32)) -> Option<i64> {
        if year == 0 {
            return None;
        }
        let year = if self.eat_rest(b" BC") {
            1 - year
        } else {
            year
        };
        let valid = (1..=12).contains(&month) && day >= 1 && day <= days_in_month(year, month);
        valid.then_some(year)
    }

    /// `HH:MM:SS[.ffffff]` as microseconds since midnight, the hour at most
    /// `max_hour`.
    fn time_of_day(&mut self, max_hour: u64) -> Option<i64> {
        let hour = self.digits(2, 2)?;
        self.expect(b':')?;
        let minute = self.digits(2, 2)?;
        self.expect(b':')?;
        let second = self.digits(2, 2)?;
        if hour > max_hour || minute > 59 || second > 59 {
            return None;
        }
        let whole = (hour * 3600 + minute * 60 + second) as i64;
        Some(whole * USECS_PER_SEC + self.fraction()?)
    }

    /// A UTC offset `+HH[:MM[:SS]]` or `-HH[:MM[:SS]]`, in microseconds east
    /// of UTC.
    fn offset(&mut self) -> Option<i64> {
        let negative = match self.next_byte()? {
            b'+' => false,
            b'-' => true,
            _ => return None,
        };
        let mut seconds = self.digits(2, 2)? * 3600;
        if self.eat(b':') {
            let minute = self.digits(2, 2)?;
            seconds += minute * 60;
            if self.eat(b':') {
                let second = self.digits(2, 2)?;
                seconds += second;
                if second > 59 {
                    return None;
                }
            }
            if minute > 59 {
                return None;
            }
        }
        let micros = seconds as i64 * USECS_PER_SEC;
        Some(if negative { -micros } else { micros })
    }
}

fn is_leap(year: i64) -> bool {
    year % 4 == 0 && (year % 100 != 0 || year % 400 == 0)
}

fn days_in_month(year: i64, month: u32) -> u32 {
    match month {
        2 if is_leap(year) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days from 1970-01-01 to a proleptic Gregorian date with an astronomical
/// year (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_from_march = i64::from((month + 9) % 12);
    let day_of_year = (153 * month_from_march + 2) / 5 + i64::from(day) - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][offset][ BC]`, `infinity`, `-infinity`.
/// The offset is there exactly for `timestamptz`. A time past what `i64`
/// microseconds since 1970 hold is None, never wrapped or clamped.
fn parse_timestamp(text: &[u8], with_offset: bool) -> Option<Timestamp> {
    match text {
        b"infinity" => return Some(Timestamp::Infinity),
        b"-infinity" => return Some(Timestamp::NegInfinity),
        _ => {}
    }
    let mut c = Cursor::new(text);
    let date = c.date()?;
    c.expect(b' ')?;
    let time = c.time_of_day(23)?;
    let offset = if with_offset { c.offset()? } else { 0 };
    let year = c.era(date)?;
    c.end()?;
    let days = days_from_civil(year, date.1, date.2);
    // i128: the local time may pass i64's end while UTC does not.
    let micros = i128::from(days) * i128::from(USECS_PER_DAY) + i128::from(time - offset);
    i64::try_from(micros).ok().map(Timestamp::Micros)
}

/// `YYYY-MM-DD[ BC]`, `infinity`, `-infinity`.
fn parse_date(text: &[u8]) -> Option<Date> {
    match text {
        b"infinity" => return Some(Date::Infinity),
        b"-infinity" => return Some(Date::NegInfinity),
        _ => {}
    }
    let mut c = Cursor::new(text);
    let date = c.date()?;
    let year = c.era(date)?;
    c.end()?;
    i32::try_from(days_from_civil(year, date.1, date.2))
        .ok()
        .map(Date::Days)
}

/// `HH:MM:SS[.ffffff]`, up to `24:00:00`.
fn parse_time(text: &[u8]) -> Option<i64> {
    let mut c = Cursor::new(text);
    let micros = c.time_of_day(24)?;
    c.end()?;
    (micros <= USECS_PER_DAY).then_some(micros)
}

/// What `EncodeInterval` prints for `IntervalStyle=iso_8601`:
/// `P[nY][nM][nD][T[nH][nM][n[.ffffff]S]]`, each part left out when zero,
/// each with its own sign (only `-` is printed; `+` is taken too), the zero
/// interval as `PT0S`. Hours are not folded into days, nor days into months.
fn parse_interval(text: &[u8]) -> Option<Interval> {
    let mut c = Cursor::new(text);
    c.expect(b'P')?;
    let (mut months, mut days, mut micros) = (0i128, 0i128, 0i128);
    // The last part read: 1 to 3 for Y, M, D; 4 to 6 for H, M, S. Parts come
    // in that order, each at most once.
    let mut last = 0;
    let mut in_time = false;
    while c.peek().is_some() {
        if c.eat(b'T') {
            if in_time {
                return None;
            }
            in_time = true;
            last = 3;
            continue;
        }
        let negative = c.eat(b'-') || {
            c.eat(b'+');
            false
        };
        let whole = i128::from(c.digits(1, 19)?);
        let fraction = if c.peek() == Some(b'.') {
            Some(c.fraction()?)
        } else {
            None
        };
        let part = match (in_time, c.next_byte()?) {
            (false, b'Y') => 1,
            (false, b'M') => 2,
            (false, b'D') => 3,
            (true, b'H') => 4,
            (true, b'M') => 5,
            (true, b'S') => 6,
            _ => return None,
        };
        if part <= last || (fraction.is_some() && part != 6) {
            return None;
        }
        last = part;
        let sign = if negative { -1 } else { 1 };
        match part {
            1 => months += sign * whole * 12,
            2 => months += sign * whole,
            3 => days += sign * whole,
            4 => micros += sign * whole * i128::from(USECS_PER_HOUR),
            5 => micros += sign * whole * i128::from(USECS_PER_MIN),
            _ => {
                let fraction = i128::from(fraction.unwrap_or(0));
                micros += sign * (whole * i128::from(USECS_PER_SEC) + fraction);
            }
        }
    }
    // `P` alone, or a `T` with no time part after it, is not an interval.
    if last == 0 || last == 3 && in_time {
        return None;
    }
    Some(Interval {
        months: i32::try_from(months).ok()?,
        days: i32::try_from(days).ok()?,
        micros: i64::try_from(micros).ok()?,
    })
}

/// How one array reads: what its elements are, and what its shape is so far.
struct ArrayReader<'k> {
    element: &'k TypeKind,
    delimiter: u8,
    /// The unescaped bytes of a quoted element that has backslashes, reused
    /// from one such element to the next.
    scratch: Vec<u8>,
    /// The number of items at each depth, from the first sub-array read
    /// there (0: none read yet), so that the array is rectangular.
    lengths: [usize; MAX_DIMS],
    /// The depth at which elements (not sub-arrays) sit, once one is read.
    leaf_depth: Option<usize>,
}

/// What `array_out` prints: `{}`, or `{` elements separated by the delimiter
/// `}`, nested once per extra dimension (`{{1,2},{3,4}}`). An element is
/// `NULL` (unquoted) for null, bare, or in double quotes with `\"` and `\\`
/// escaped; whitespace around elements is skipped, as `array_in` does. A
/// dimension decoration (`[0:1]={1,2}`, printed when a lower bound is not 1)
/// is not representable: None.
fn parse_array(element: &TypeKind, delimiter: u8, text: &[u8]) -> Option<Value> {
    let mut reader = ArrayReader {
        element,
        delimiter,
        scratch: Vec::new(),
        lengths: [0; MAX_DIMS],
        leaf_depth: None,
    };
    let mut c = Cursor::new(text);
    skip_space(&mut c);
    let value = reader.array(&mut c, 0)?;
    skip_space(&mut c);
    c.end()?;
    Some(value)
}

impl ArrayReader<'_> {
    /// One `{...}` at `depth` (0 for the whole array).
    fn array(&mut self, c: &mut Cursor<'_>, depth: usize) -> Option<Value> {
        c.expect(b'{')?;
        skip_space(c);
        // Size the items once: as many as the sub-arrays already read at this
        // depth had, else (for elements) one more than the delimiters before
        // the next `}`, a close bound unless quoted elements hold delimiters.
        let capacity = match self.lengths[depth] {
            0 if c.peek() != Some(b'{') => {
                let rest = &c.text[c.pos..];
                let end = rest.iter().position(|&b| b == b'}').unwrap_or(rest.len());
                1 + rest[..end].iter().filter(|&&b| b == self.delimiter).count()
            }
            known => known,
        };
        let mut items = Vec::with_capacity(capacity);
        if c.eat(b'}') {
            // `{}` is the empty array; PostgreSQL never nests one.
            return (depth == 0).then_some(Value::Array(items));
        }
        loop {
            skip_space(c);
            if c.peek() == Some(b'{') {
                if depth + 1 >= MAX_DIMS || self.leaf_depth.is_some_and(|d| d <= depth) {
                    return None;
                }
                items.push(self.array(c, depth + 1)?);
            } else {
                if *self.leaf_depth.get_or_insert(depth) != depth {
                    return None;
                }
                items.push(self.element(c)?);
            }
            skip_space(c);
            match c.next_byte()? {
                b'}' => break,
                b if b == self.delimiter => {}
                _ => return None,
            }
        }
        let expected = &mut self.lengths[depth];
        if *expected == 0 {
            *expected = items.len();
        } else if *expected != items.len() {
            return None;
        }
        Some(Value::Array(items))
    }

    /// One element, quoted or not.
    fn element(&mut self, c: &mut Cursor<'_>) -> Option<Value> {
        if c.eat(b'"') {
            let start = c.pos;
            loop {
                match c.next_byte()? {
                    b'"' => return Some(parse(self.element, &c.text[start..c.pos - 1])),
                    b'\\' => break,
                    _ => {}
                }
            }
            // Backslash escapes: unescape into the scratch buffer.
            self.scratch.clear();
            self.scratch.extend_from_slice(&c.text[start..c.pos - 1]);
            self.scratch.push(c.next_byte()?);
            loop {
                match c.next_byte()? {
                    b'"' => break,
                    b'\\' => self.scratch.push(c.next_byte()?),
                    b => self.scratch.push(b),
                }
            }
            return Some(parse(self.element, &self.scratch));
        }
        let start = c.pos;
        while let Some(b) = c.peek() {
            if b == self.delimiter || b == b'}' {
                break;
            }
            // `array_out` quotes any element with these.
            if matches!(b, b'{' | b'"' | b'\\') {
                return None;
            }
            c.pos += 1;
        }
        let mut bare = &c.text[start..c.pos];
        while let [rest @ .., last] = bare
            && is_array_space(*last)
        {
            bare = rest;
        }
        if bare.is_empty() {
            None
        } else if bare.eq_ignore_ascii_case(b"NULL") {
            Some(Value::Null)
        } else {
            Some(parse(self.element, bare))
        }
    }
}

/// Whitespace as `array_in` skips it (`array_isspace`).
fn is_array_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

fn skip_space(c: &mut Cursor<'_>) {
    while c.peek().is_some_and(is_array_space) {
        c.pos += 1;
    }
}

/// Every type in PostgreSQL 15's `pg_type.dat`, by OID, with its name as shown
/// to users (an array type `_x` as `x[]`). From `SELECT t.oid, CASE WHEN
/// t.typelem <> 0 AND t.typname LIKE '\_%' THEN e.typname || '[]' ELSE t.typname END
/// FROM pg_type t LEFT JOIN pg_type e ON e.oid = t.typelem WHERE t.oid < 10000
/// ORDER BY t.oid`.
const BUILTIN_NAMES: &[(u32, &str)] = &[
    (16, "bool"),
    (17, "bytea"),
    (18, "char"),
    (19, "name"),
    (20, "int8"),
    (21, "int2"),
    (22, "int2vector"),
    (23, "int4"),
    (24, "regproc"),
    (25, "text"),
    (26, "oid"),
    (27, "tid"),
    (28, "xid"),
    (29, "cid"),
    (30, "oidvector"),
    (32, "pg_ddl_command"),
    (71, "pg_type"),
    (75, "pg_attribute"),
    (81, "pg_proc"),
    (83, "pg_class"),
    (114, "json"),
    (142, "xml"),
    (143, "xml[]"),
    (194, "pg_node_tree"),
    (199, "json[]"),
    (210, "pg_type[]"),
    (269, "table_am_handler"),
    (270, "pg_attribute[]"),
    (271, "xid8[]"),
    (272, "pg_proc[]"),
    (273, "pg_class[]"),
    (325, "index_am_handler"),
    (600, "point"),
    (601, "lseg"),
    (602, "path"),
    (603, "box"),
    (604, "polygon"),
    (628, "line"),
    (629, "line[]"),
    (650, "cidr"),
    (651, "cidr[]"),
    (700, "float4"),
    (701, "float8"),
    (705, "unknown"),
    (718, "circle"),
    (719, "circle[]"),
    (774, "macaddr8"),
    (775, "macaddr8[]"),
    (790, "money"),
    (791, "money[]"),
    (829, "macaddr"),
    (869, "inet"),
    (1000, "bool[]"),
    (1001, "bytea[]"),
    (1002, "char[]"),
    (1003, "name[]"),
    (1005, "int2[]"),
    (1006, "int2vector[]"),
    (1007, "int4[]"),
    (1008, "regproc[]"),
    (1009, "text[]"),
    (1010, "tid[]"),
    (1011, "xid[]"),
    (1012, "cid[]"),
    (1013, "oidvector[]"),
    (1014, "bpchar[]"),
    (1015, "varchar[]"),
    (1016, "int8[]"),
    (1017, "point[]"),
    (1018, "lseg[]"),
    (1019, "path[]"),
    (1020, "box[]"),
    (1021, "float4[]"),
    (1022, "float8[]"),
    (1027, "polygon[]"),
    (1028, "oid[]"),
    (1033, "aclitem"),
    (1034, "aclitem[]"),
    (1040, "macaddr[]"),
    (1041, "inet[]"),
    (1042, "bpchar"),
    (1043, "varchar"),
    (1082, "date"),
    (1083, "time"),
    (1114, "timestamp"),
    (1115, "timestamp[]"),
    (1182, "date[]"),
    (1183, "time[]"),
    (1184, "timestamptz"),
    (1185, "timestamptz[]"),
    (1186, "interval"),
    (1187, "interval[]"),
    (1231, "numeric[]"),
    (1248, "pg_database"),
    (1263, "cstring[]"),
    (1266, "timetz"),
    (1270, "timetz[]"),
    (1560, "bit"),
    (1561, "bit[]"),
    (1562, "varbit"),
    (1563, "varbit[]"),
    (1700, "numeric"),
    (1790, "refcursor"),
    (2201, "refcursor[]"),
    (2202, "regprocedure"),
    (2203, "regoper"),
    (2204, "regoperator"),
    (2205, "regclass"),
    (2206, "regtype"),
    (2207, "regprocedure[]"),
    (2208, "regoper[]"),
    (2209, "regoperator[]"),
    (2210, "regclass[]"),
    (2211, "regtype[]"),
    (2249, "record"),
    (2275, "cstring"),
    (2276, "any"),
    (2277, "anyarray"),
    (2278, "void"),
    (2279, "trigger"),
    (2280, "language_handler"),
    (2281, "internal"),
    (2283, "anyelement"),
    (2287, "record[]"),
    (2776, "anynonarray"),
    (2842, "pg_authid"),
    (2843, "pg_auth_members"),
    (2949, "txid_snapshot[]"),
    (2950, "uuid"),
    (2951, "uuid[]"),
    (2970, "txid_snapshot"),
    (3115, "fdw_handler"),
    (3220, "pg_lsn"),
    (3221, "pg_lsn[]"),
    (3310, "tsm_handler"),
    (3361, "pg_ndistinct"),
    (3402, "pg_dependencies"),
    (3500, "anyenum"),
    (3614, "tsvector"),
    (3615, "tsquery"),
    (3642, "gtsvector"),
    (3643, "tsvector[]"),
    (3644, "gtsvector[]"),
    (3645, "tsquery[]"),
    (3734, "regconfig"),
    (3735, "regconfig[]"),
    (3769, "regdictionary"),
    (3770, "regdictionary[]"),
    (3802, "jsonb"),
    (3807, "jsonb[]"),
    (3831, "anyrange"),
    (3838, "event_trigger"),
    (3904, "int4range"),
    (3905, "int4range[]"),
    (3906, "numrange"),
    (3907, "numrange[]"),
    (3908, "tsrange"),
    (3909, "tsrange[]"),
    (3910, "tstzrange"),
    (3911, "tstzrange[]"),
    (3912, "daterange"),
    (3913, "daterange[]"),
    (3926, "int8range"),
    (3927, "int8range[]"),
    (4066, "pg_shseclabel"),
    (4072, "jsonpath"),
    (4073, "jsonpath[]"),
    (4089, "regnamespace"),
    (4090, "regnamespace[]"),
    (4096, "regrole"),
    (4097, "regrole[]"),
    (4191, "regcollation"),
    (4192, "regcollation[]"),
    (4451, "int4multirange"),
    (4532, "nummultirange"),
    (4533, "tsmultirange"),
    (4534, "tstzmultirange"),
    (4535, "datemultirange"),
    (4536, "int8multirange"),
    (4537, "anymultirange"),
    (4538, "anycompatiblemultirange"),
    (4600, "pg_brin_bloom_summary"),
    (4601, "pg_brin_minmax_multi_summary"),
    (5017, "pg_mcv_list"),
    (5038, "pg_snapshot"),
    (5039, "pg_snapshot[]"),
    (5069, "xid8"),
    (5077, "anycompatible"),
    (5078, "anycompatiblearray"),
    (5079, "anycompatiblenonarray"),
    (5080, "anycompatiblerange"),
    (6101, "pg_subscription"),
    (6150, "int4multirange[]"),
    (6151, "nummultirange[]"),
    (6152, "tsmultirange[]"),
    (6153, "tstzmultirange[]"),
    (6155, "datemultirange[]"),
    (6157, "int8multirange[]"),
];

#[cfg(test)]
mod tests {
    //! Every text literal below is what PostgreSQL 15.18 printed, over psql
    //! with `PGOPTIONS='-c DateStyle=ISO,MDY -c TimeZone=UTC -c
    //! IntervalStyle=iso_8601 -c extra_float_digits=3 -c bytea_output=hex -c
    //! client_encoding=UTF8'`, for the SQL named beside it.

    use super::*;

    /// `parse`, and `parse_str` agreeing with it (compared as printed,
    /// since NaN is not equal to itself).
    fn p(kind: TypeKind, text: &str) -> Value {
        let value = parse(&kind, text.as_bytes());
        let checked = parse_str(&kind, text);
        assert_eq!(format!("{checked:?}"), format!("{value:?}"), "{text}");
        value
    }

    fn other(type_name: &str, text: &str) -> Value {
        Value::Other {
            type_name: type_name.to_owned(),
            text: text.to_owned(),
        }
    }

    fn ts(micros: i64) -> Value {
        Value::Timestamp(Timestamp::Micros(micros))
    }

    fn tstz(micros: i64) -> Value {
        Value::TimestampTz(Timestamp::Micros(micros))
    }

    fn days(days: i32) -> Value {
        Value::Date(Date::Days(days))
    }

    fn interval(months: i32, days: i32, micros: i64) -> Value {
        Value::Interval(Interval {
            months,
            days,
            micros,
        })
    }

    fn text(s: &str) -> Value {
        Value::Text(s.to_owned())
    }

    fn array(kind: TypeKind) -> TypeKind {
        TypeKind::Array {
            element: Box::new(kind),
            delimiter: b',',
        }
    }

    /// Whether `text` reads as `Value::Other` with the text unchanged.
    fn is_other(kind: TypeKind, text: &str) -> bool {
        let name = kind.name();
        p(kind, text) == other(&name, text)
    }

    #[test]
    fn builtin_kinds() {
        // SELECT oid, typname, typarray FROM pg_type WHERE oid IN (...) ORDER BY oid
        let mapped = [
            (16, "bool", 1000, TypeKind::Bool),
            (17, "bytea", 1001, TypeKind::Bytea),
            (18, "char", 1002, TypeKind::Text),
            (19, "name", 1003, TypeKind::Text),
            (20, "int8", 1016, TypeKind::Int),
            (21, "int2", 1005, TypeKind::Int),
            (23, "int4", 1007, TypeKind::Int),
            (25, "text", 1009, TypeKind::Text),
            (26, "oid", 1028, TypeKind::Int),
            (114, "json", 199, TypeKind::Json),
            (700, "float4", 1021, TypeKind::Float4),
            (701, "float8", 1022, TypeKind::Float8),
            (1042, "bpchar", 1014, TypeKind::Text),
            (1043, "varchar", 1015, TypeKind::Text),
            (1082, "date", 1182, TypeKind::Date),
            (1083, "time", 1183, TypeKind::Time),
            (1114, "timestamp", 1115, TypeKind::Timestamp),
            (1184, "timestamptz", 1185, TypeKind::TimestampTz),
            (1186, "interval", 1187, TypeKind::Interval),
            (1700, "numeric", 1231, TypeKind::Numeric),
            (2950, "uuid", 2951, TypeKind::Uuid),
            (3802, "jsonb", 3807, TypeKind::Json),
        ];
        for (oid, name, array_oid, kind) in mapped.clone() {
            assert_eq!(TypeKind::builtin(oid), Some(kind.clone()), "{name}");
            assert_eq!(builtin_name(oid), Some(name));
            assert_eq!(TypeKind::builtin(array_oid), Some(array(kind)), "{name}[]");
            assert_eq!(builtin_name(array_oid), Some(format!("{name}[]").as_str()));
        }
        // Every other built-in type is Other with its name.
        let mut others = 0;
        for &(oid, name) in BUILTIN_NAMES {
            if mapped.iter().any(|m| m.0 == oid || m.2 == oid) {
                continue;
            }
            let expected = TypeKind::Other {
                type_name: name.to_owned(),
            };
            assert_eq!(TypeKind::builtin(oid), Some(expected), "{oid}");
            others += 1;
        }
        assert_eq!(others + 2 * mapped.len(), BUILTIN_NAMES.len());
        for (oid, name) in [
            (1266, "timetz"),
            (1270, "timetz[]"),
            (600, "point"),
            (869, "inet"),
            (790, "money"),
            (1560, "bit"),
            (142, "xml"),
            (3614, "tsvector"),
            (3904, "int4range"),
            (4451, "int4multirange"),
            (3220, "pg_lsn"),
            (22, "int2vector"),
            (30, "oidvector"),
            (1020, "box[]"),
            (2287, "record[]"),
        ] {
            let kind = TypeKind::builtin(oid).unwrap();
            assert_eq!(kind.name(), name);
            assert!(matches!(kind, TypeKind::Other { .. }));
        }
        // Not built in: information_schema domains, catalogs' row types
        // from initdb, user types.
        for oid in [0, 1, 13221, 10052, 16384, 100_000, u32::MAX] {
            assert_eq!(TypeKind::builtin(oid), None, "{oid}");
            assert_eq!(builtin_name(oid), None);
        }
        assert!(BUILTIN_NAMES.windows(2).all(|w| w[0].0 < w[1].0));
        assert_eq!(BUILTIN_NAMES.len(), 198);
    }

    #[test]
    fn kind_names() {
        assert_eq!(TypeKind::Int.name(), "int8");
        assert_eq!(TypeKind::Text.name(), "text");
        assert_eq!(TypeKind::TimestampTz.name(), "timestamptz");
        assert_eq!(array(TypeKind::Text).name(), "text[]");
        let custom = TypeKind::Other {
            type_name: "app.mood".to_owned(),
        };
        assert_eq!(array(custom.clone()).name(), "app.mood[]");
        assert_eq!(custom.name(), "app.mood");
        // Other keeps the text as is, under its name.
        assert_eq!(p(custom, "happy"), other("app.mood", "happy"));
        // SELECT '12:00+03'::timetz, '1.2.3.4/24'::inet, '12.5'::money,
        //   B'101'::bit(3), '<a/>'::xml, 'a b'::tsvector, '[1,3)'::int4range
        for (oid, text) in [
            (1266, "12:00:00+03"),
            (869, "1.2.3.4/24"),
            (790, "$12.50"),
            (1560, "101"),
            (142, "<a/>"),
            (3614, "'a' 'b'"),
            (3904, "[1,3)"),
            (3220, "0/16B3748"),
            (1017, "{\"(1,2)\"}"),
        ] {
            let kind = TypeKind::builtin(oid).unwrap();
            let name = builtin_name(oid).unwrap();
            assert_eq!(parse(&kind, text.as_bytes()), other(name, text));
        }
    }

    #[test]
    fn bools() {
        // SELECT 't'::bool, 'f'::bool
        assert_eq!(p(TypeKind::Bool, "t"), Value::Bool(true));
        assert_eq!(p(TypeKind::Bool, "f"), Value::Bool(false));
        for bad in ["", "true", "T", "1", "tt"] {
            assert!(is_other(TypeKind::Bool, bad), "{bad}");
        }
    }

    #[test]
    fn ints() {
        // SELECT (-9223372036854775808)::int8, 9223372036854775807::int8,
        //   (-32768)::int2, 4294967295::oid, (-2147483648)::int4, 0::int2
        for (text, value) in [
            ("-9223372036854775808", i64::MIN),
            ("9223372036854775807", i64::MAX),
            ("-32768", -32768),
            ("4294967295", 4_294_967_295),
            ("-2147483648", -2_147_483_648),
            ("0", 0),
            ("-0", 0),
            ("007", 7),
        ] {
            assert_eq!(p(TypeKind::Int, text), Value::Int(value), "{text}");
        }
        for bad in [
            "",
            "-",
            "9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999999",
            "1.0",
            " 1",
            "1 ",
            "+1",
            "1e3",
            "--1",
            "١",
        ] {
            assert!(is_other(TypeKind::Int, bad), "{bad}");
        }
    }

    #[test]
    fn floats() {
        // SELECT 0.1::float4, 1e-45::float4, 3.4028235e38::float4,
        //   1.17549435e-38::float4, 1e38::float4, -3.4028235e38::float4,
        //   'NaN'::float4, 'Infinity'::float4, '-Infinity'::float4, 0.3::float4,
        //   16777217::float4, -0::float4
        for (text, value) in [
            ("0.1", 0.1f32),
            ("1e-45", f32::from_bits(1)),
            ("3.4028235e+38", f32::MAX),
            ("1.1754944e-38", f32::MIN_POSITIVE),
            ("1e+38", 1e38),
            ("-3.4028235e+38", f32::MIN),
            ("Infinity", f32::INFINITY),
            ("-Infinity", f32::NEG_INFINITY),
            ("0.3", 0.3),
            ("1.6777216e+07", 16_777_216.0),
        ] {
            let Value::Float(f) = p(TypeKind::Float4, text) else {
                panic!("{text}")
            };
            // Exactly the float4, widened: 0.1f32 is not 0.1f64.
            assert_eq!(f.to_bits(), f64::from(value).to_bits(), "{text}");
        }
        assert!(matches!(p(TypeKind::Float4, "NaN"), Value::Float(f) if f.is_nan()));
        let Value::Float(neg_zero) = p(TypeKind::Float4, "-0") else {
            panic!()
        };
        assert_eq!(neg_zero.to_bits(), (-0.0f64).to_bits());

        // SELECT 'NaN'::float8, '-Infinity'::float8, 1.7976931348623157e308::float8,
        //   4.9e-324::float8, 2.2250738585072014e-308::float8, -0::float8,
        //   123456789012::float8, 1e15::float8, 1e16::float8, 1e-5::float8,
        //   0.0001::float8
        for (text, value) in [
            ("-Infinity", f64::NEG_INFINITY),
            ("Infinity", f64::INFINITY),
            ("1.7976931348623157e+308", f64::MAX),
            ("-1.7976931348623157e+308", f64::MIN),
            ("5e-324", f64::from_bits(1)),
            ("2.2250738585072014e-308", f64::MIN_POSITIVE),
            ("-0", -0.0),
            ("123456789012", 123_456_789_012.0),
            ("1e+15", 1e15),
            ("1e+16", 1e16),
            ("1e-05", 1e-5),
            ("0.0001", 0.0001),
            ("0.1", 0.1),
        ] {
            let Value::Float(f) = p(TypeKind::Float8, text) else {
                panic!("{text}")
            };
            assert_eq!(f.to_bits(), value.to_bits(), "{text}");
        }
        assert!(matches!(p(TypeKind::Float8, "NaN"), Value::Float(f) if f.is_nan()));
        for bad in ["", "abc", "1,5", " 1", "0x10", "1e"] {
            assert!(is_other(TypeKind::Float8, bad), "{bad}");
            assert!(is_other(TypeKind::Float4, bad), "{bad}");
        }
    }

    #[test]
    fn numerics() {
        // SELECT 'NaN'::numeric, 'Infinity'::numeric, '-Infinity'::numeric,
        //   0.000::numeric, -1.50::numeric, 1e20::numeric, 1e-20::numeric,
        //   repeat('9',100)::numeric,
        //   ('-'||repeat('1',50)||'.'||repeat('2',50))::numeric
        let hundred_nines = "9".repeat(100);
        let long = format!("-{}.{}", "1".repeat(50), "2".repeat(50));
        for text in [
            "NaN",
            "Infinity",
            "-Infinity",
            "0.000",
            "-1.50",
            "100000000000000000000",
            "0.00000000000000000001",
            &hundred_nines,
            &long,
        ] {
            assert_eq!(
                p(TypeKind::Numeric, text),
                Value::Numeric(text.to_owned()),
                "{text}"
            );
        }
        for bad in [
            "", "-", ".5", "5.", "1e5", "nan", "1.2.3", "+1", " 1", "--1",
        ] {
            assert!(is_other(TypeKind::Numeric, bad), "{bad}");
        }
    }

    #[test]
    fn texts() {
        // SELECT 'é日本語🎉'::text, ''::text, ''::varchar, '   '::bpchar(3),
        //   'ab'::name, 'é'::"char", 'Ω'::"char"
        for text in [
            "é日本語🎉",
            "",
            "   ",
            "ab",
            "\\303",
            "\\316",
            "NULL",
            "a\tb\nc",
        ] {
            assert_eq!(p(TypeKind::Text, text), Value::Text(text.to_owned()));
        }
        // Not UTF-8 (impossible with client_encoding=UTF8): Other, lossily.
        assert_eq!(
            parse(&TypeKind::Text, b"a\xffb"),
            other("text", "a\u{fffd}b")
        );
    }

    #[test]
    fn json() {
        // SELECT '{"a":"é\u00e9","b":[1,2.50,null,{}]}'::jsonb,
        //   '{"a":"é\u00e9",  "b":[1,2.50]}'::json, '[]'::jsonb, 'null'::json
        for text in [
            r#"{"a": "éé", "b": [1, 2.50, null, {}]}"#,
            r#"{"a":"é\u00e9",  "b":[1,2.50]}"#,
            "[]",
            "null",
        ] {
            assert_eq!(p(TypeKind::Json, text), Value::Json(text.to_owned()));
        }
    }

    #[test]
    fn byteas() {
        // SELECT decode(string_agg(lpad(to_hex(i),2,'0'),'' ORDER BY i),'hex')
        //   FROM generate_series(0,255) i
        let all = concat!(
            "\\x000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f",
            "202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f",
            "404142434445464748494a4b4c4d4e4f505152535455565758595a5b5c5d5e5f",
            "606162636465666768696a6b6c6d6e6f707172737475767778797a7b7c7d7e7f",
            "808182838485868788898a8b8c8d8e8f909192939495969798999a9b9c9d9e9f",
            "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf",
            "c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf",
            "e0e1e2e3e4e5e6e7e8e9eaebecedeeeff0f1f2f3f4f5f6f7f8f9fafbfcfdfeff",
        );
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(p(TypeKind::Bytea, all), Value::Bytes(bytes));
        // SELECT '\x00ff'::bytea, ''::bytea, E'\\\\'::bytea
        assert_eq!(p(TypeKind::Bytea, "\\x00ff"), Value::Bytes(vec![0, 255]));
        assert_eq!(p(TypeKind::Bytea, "\\x"), Value::Bytes(vec![]));
        assert_eq!(p(TypeKind::Bytea, "\\x5c"), Value::Bytes(vec![b'\\']));
        assert_eq!(
            p(TypeKind::Bytea, "\\xABcd"),
            Value::Bytes(vec![0xab, 0xcd])
        );
        // Escape format, odd digits, not hex.
        for bad in ["", "\\", "abc", "\\x0", "\\x0g", "\\000", "x00", "\\X00"] {
            assert!(is_other(TypeKind::Bytea, bad), "{bad}");
        }
    }

    #[test]
    fn uuids() {
        // SELECT 'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'::uuid,
        //   '00000000-0000-0000-0000-000000000000'::uuid,
        //   'FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF'::uuid
        assert_eq!(
            p(TypeKind::Uuid, "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11"),
            Value::Uuid([
                0xa0, 0xee, 0xbc, 0x99, 0x9c, 0x0b, 0x4e, 0xf8, 0xbb, 0x6d, 0x6b, 0xb9, 0xbd, 0x38,
                0x0a, 0x11
            ])
        );
        assert_eq!(
            p(TypeKind::Uuid, "00000000-0000-0000-0000-000000000000"),
            Value::Uuid([0; 16])
        );
        assert_eq!(
            p(TypeKind::Uuid, "ffffffff-ffff-ffff-ffff-ffffffffffff"),
            Value::Uuid([0xff; 16])
        );
        for bad in [
            "",
            "a0eebc999c0b4ef8bb6d6bb9bd380a11",
            "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1",
            "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a1g",
            "a0eebc99-9c0b-4ef8-bb6d+6bb9bd380a11",
            "a0eebc999-c0b-4ef8-bb6d-6bb9bd380a11",
        ] {
            assert!(is_other(TypeKind::Uuid, bad), "{bad}");
        }
    }

    #[test]
    fn timestamps() {
        // SELECT ts::text, (extract(epoch FROM ts)*1000000)::int8 FROM ...
        // (fixed values, then timestamp '4714-11-24 00:00:00 BC' + random() *
        // interval '100000000 days' after setseed(0.42))
        let cases: &[(&str, i64)] = &[
            ("1970-01-01 00:00:00", 0),
            ("1969-12-31 23:59:59.999999", -1),
            ("2038-01-19 03:14:08", 2147483648000000),
            ("2000-02-29 12:34:56.789", 951827696789000),
            ("0044-03-15 12:00:00 BC", -63517780800000000),
            ("0001-01-01 00:00:00", -62135596800000000),
            ("0001-12-31 23:59:59.999999 BC", -62135596800000001),
            ("4713-01-01 00:00:00 BC", -210863520000000000),
            ("4714-11-24 00:00:00 BC", -210866803200000000),
            ("9999-12-31 23:59:59.999999", 253402300799999999),
            ("10000-01-01 00:00:00", 253402300800000000),
            ("100000-06-15 01:02:03.04", 3093542326923040000),
            ("294247-01-10 04:00:54.775806", 9223372036854775806),
            ("198699-04-18 12:43:32.666416", 6208176919412666416),
            ("94528-12-29 07:56:51.847544", 2920879727811847544),
            ("251721-08-10 15:08:29.885788", 7881399500909885788),
            ("12898-02-14 08:43:33.565922", 344858287413565922),
            ("21094-07-29 19:55:31.772822", 603513316531772822),
            ("53841-12-25 11:40:27.817905", 1636921654827817905),
            ("129685-01-29 20:13:46.388168", 4030298712826388168),
            ("101860-02-07 04:59:13.221631", 3152227121953221631),
            ("152854-05-05 04:43:19.197435", 4761449930599197435),
            ("201714-03-02 15:19:12.069712", 6303317066352069712),
            ("151218-05-02 14:10:12.011218", 4709822508612011218),
            ("260714-08-15 08:11:03.49225", 8165191507863492250),
            // SELECT '2024-01-02 03:04:05.1'::timestamp (fractions of 1 to 6
            // digits print without trailing zeros)
            ("2024-01-02 03:04:05.1", 1704164645100000),
            ("2024-01-02 03:04:05.12", 1704164645120000),
            ("2024-01-02 03:04:05.123456", 1704164645123456),
        ];
        for &(text, micros) in cases {
            assert_eq!(p(TypeKind::Timestamp, text), ts(micros), "{text}");
            let with_offset = match text.strip_suffix(" BC") {
                Some(ad) => format!("{ad}+00 BC"),
                None => format!("{text}+00"),
            };
            assert_eq!(
                p(TypeKind::TimestampTz, &with_offset),
                tstz(micros),
                "{with_offset}"
            );
        }
        // The end of i64: '294247-01-10 04:00:54.775807'::timestamp is
        // ('294247-01-10'::date - '1970-01-01'::date) = 106751991 days and
        // 4:00:54.775807, i64::MAX µs; PostgreSQL goes on to 294276 AD.
        // SELECT '294247-01-10 04:00:54.775807'::timestamp,
        //   '294247-01-10 04:00:54.775808'::timestamp,
        //   '294276-12-31 23:59:59.999999'::timestamp
        assert_eq!(
            p(TypeKind::Timestamp, "294247-01-10 04:00:54.775807"),
            ts(i64::MAX)
        );
        for text in [
            "294247-01-10 04:00:54.775808",
            "294247-01-11 00:00:00",
            "294276-12-31 23:59:59.999999",
        ] {
            assert_eq!(p(TypeKind::Timestamp, text), other("timestamp", text));
        }
        // SELECT '294247-01-10 04:00:54.775807+00'::timestamptz,
        //   '294247-01-10 04:00:54.775808+00'::timestamptz,
        //   '294276-12-31 23:59:59.999999+00'::timestamptz
        assert_eq!(
            p(TypeKind::TimestampTz, "294247-01-10 04:00:54.775807+00"),
            tstz(i64::MAX)
        );
        for text in [
            "294247-01-10 04:00:54.775808+00",
            "294276-12-31 23:59:59.999999+00",
            "294247-01-10 04:00:54.775807-00:00:01",
        ] {
            assert_eq!(p(TypeKind::TimestampTz, text), other("timestamptz", text));
        }
        // Local time past i64 but UTC within it.
        assert_eq!(
            p(TypeKind::TimestampTz, "294247-01-10 05:00:54.775807+01"),
            tstz(i64::MAX)
        );

        // SELECT 'infinity'::timestamp, '-infinity'::timestamptz
        assert_eq!(
            p(TypeKind::Timestamp, "infinity"),
            Value::Timestamp(Timestamp::Infinity)
        );
        assert_eq!(
            p(TypeKind::Timestamp, "-infinity"),
            Value::Timestamp(Timestamp::NegInfinity)
        );
        assert_eq!(
            p(TypeKind::TimestampTz, "infinity"),
            Value::TimestampTz(Timestamp::Infinity)
        );
        assert_eq!(
            p(TypeKind::TimestampTz, "-infinity"),
            Value::TimestampTz(Timestamp::NegInfinity)
        );

        // SELECT t::text, (extract(epoch FROM t)*1000000)::int8 FROM ...
        for (text, micros) in [
            ("0001-01-01 00:00:00+00", -62135596800000000),
            ("1900-01-01 00:00:00+00", -2208988800000000),
            ("2024-07-01 00:00:00.5+00", 1719792000500000),
            ("2155-04-15 08:45:19.100267+00", 5847065119100267),
            ("2149-04-28 04:42:00.793339+00", 5658871320793339),
            ("1767-11-05 15:14:36.495831+00", -6379375523504169),
            ("1802-06-28 03:17:01.879844+00", -5286199378120156),
            ("1866-12-29 11:30:13.383513+00", -3250585786616487),
            ("2175-11-05 01:45:39.505563+00", 6495817539505563),
            // SELECT '0001-12-31 23:59:59.5 BC'::timestamptz: the offset
            // comes before the era.
            ("0001-12-31 23:59:59.5+00 BC", -62135596800500000),
            // SELECT '4714-11-24 00:00:00+00 BC'::timestamptz
            ("4714-11-24 00:00:00+00 BC", -210866803200000000),
        ] {
            assert_eq!(p(TypeKind::TimestampTz, text), tstz(micros), "{text}");
        }
        // Other time zones (not this session's), e.g. SET timezone =
        // 'America/New_York'; SELECT '1800-01-01 00:00'::timestamptz,
        // '2024-07-01 00:00'::timestamptz, '0044-03-15 12:00:00 BC'::timestamptz;
        // SET timezone = 'Asia/Kolkata'; SELECT '2024-07-01 00:00'::timestamptz,
        // '1800-01-01 00:00'::timestamptz
        let ny_1800 = -5364662400000000 + (4 * 3600 + 56 * 60 + 2) * USECS_PER_SEC;
        for (text, micros) in [
            ("1800-01-01 00:00:00-04:56:02", ny_1800),
            (
                "2024-07-01 00:00:00-04",
                1719792000000000 + 4 * USECS_PER_HOUR,
            ),
            (
                "0044-03-15 12:00:00-04:56:02 BC",
                -63517780800000000 + (4 * 3600 + 56 * 60 + 2) * USECS_PER_SEC,
            ),
            (
                "2024-07-01 00:00:00+05:30",
                1719792000000000 - 330 * USECS_PER_MIN,
            ),
            (
                "1800-01-01 00:00:00+05:53:28",
                -5364662400000000 - (5 * 3600 + 53 * 60 + 28) * USECS_PER_SEC,
            ),
        ] {
            assert_eq!(p(TypeKind::TimestampTz, text), tstz(micros), "{text}");
        }

        for bad in [
            "",
            "infinite",
            "Infinity",
            "2024-01-02",
            "2024-01-02 03:04",
            "2024-01-02T03:04:05",
            "2024-1-02 03:04:05",
            "24-01-02 03:04:05",
            "2024-01-02 03:04:05.",
            "2024-01-02 03:04:05.1234567",
            "2024-01-02 03:04:05 AD",
            "2024-01-02 03:04:05 BC ",
            "2024-13-02 03:04:05",
            "2024-00-02 03:04:05",
            "2024-02-30 03:04:05",
            "2023-02-29 03:04:05",
            "1900-02-29 00:00:00",
            "2024-01-00 03:04:05",
            "2024-01-02 24:00:00",
            "2024-01-02 23:60:00",
            "2024-01-02 23:59:60",
            "0000-01-01 00:00:00",
            "0000-01-01 00:00:00 BC",
            "2024-01-02 03:04:05+00",
            "2024-01-02 03:04:05 ",
        ] {
            assert!(is_other(TypeKind::Timestamp, bad), "{bad}");
        }
        for bad in [
            "2024-01-02 03:04:05",
            "2024-01-02 03:04:05+0",
            "2024-01-02 03:04:05+000",
            "2024-01-02 03:04:05+00:",
            "2024-01-02 03:04:05+00:60",
            "2024-01-02 03:04:05+00:00:60",
            "2024-01-02 03:04:05 +00",
            "2024-01-02 03:04:05 BC+00",
            "2024-01-02 03:04:05Z",
        ] {
            assert!(is_other(TypeKind::TimestampTz, bad), "{bad}");
        }
    }

    #[test]
    fn leap_years_are_astronomical() {
        // SELECT '0001-02-29 BC'::date, '0005-02-29 BC'::date,
        //   '0401-02-29 BC'::date, '0001-02-29 BC'::date - '1970-01-01'::date
        // while '0004-02-29 BC', '0100-02-29 BC' and '0101-02-29 BC' are
        // out of range: 1 BC is year 0, a leap year.
        assert_eq!(p(TypeKind::Date, "0001-02-29 BC"), days(-719469));
        assert!(matches!(p(TypeKind::Date, "0005-02-29 BC"), Value::Date(_)));
        assert!(matches!(p(TypeKind::Date, "0401-02-29 BC"), Value::Date(_)));
        for bad in ["0004-02-29 BC", "0100-02-29 BC", "0101-02-29 BC"] {
            assert!(is_other(TypeKind::Date, bad), "{bad}");
        }
        assert!(matches!(p(TypeKind::Date, "2000-02-29"), Value::Date(_)));
        assert!(is_other(TypeKind::Date, "1900-02-29"));
    }

    #[test]
    fn dates() {
        // SELECT d::text, d - date '1970-01-01' FROM ...
        for (text, n) in [
            ("1970-01-01", 0),
            ("1969-12-31", -1),
            ("2000-02-29", 11016),
            ("0001-01-01", -719162),
            ("0001-12-31 BC", -719163),
            ("0044-03-15 BC", -735160),
            ("4714-11-24 BC", -2440588),
            ("5874897-12-31", 2145042905),
            ("2038-01-19", 24855),
            ("10000-01-01", 2932897),
            ("477728-07-08", 173767230),
            ("4761969-10-21", 1738554228),
            ("2403962-06-11", 877309724),
            ("1859849-03-22", 678576451),
            ("2482987-12-14", 906173199),
            ("2731339-11-20", 996881880),
            ("5739254-01-11", 2095499962),
            ("5179706-01-21", 1891129261),
        ] {
            assert_eq!(p(TypeKind::Date, text), days(n), "{text}");
        }
        // SELECT 'infinity'::date, '-infinity'::date
        assert_eq!(p(TypeKind::Date, "infinity"), Value::Date(Date::Infinity));
        assert_eq!(
            p(TypeKind::Date, "-infinity"),
            Value::Date(Date::NegInfinity)
        );
        for bad in [
            "",
            "2024-01-02 00:00:00",
            "2024-01-32",
            "2024-1-2",
            "2024-01-02 BC ",
            "2024/01/02",
            "0000-01-01",
            // Past i32 days.
            "9999999-01-01",
            "999999999-12-31",
        ] {
            assert!(is_other(TypeKind::Date, bad), "{bad}");
        }
    }

    #[test]
    fn times() {
        // SELECT t::text, (extract(epoch FROM t)*1000000)::int8 FROM ...
        for (text, micros) in [
            ("00:00:00", 0),
            ("24:00:00", 86400000000),
            ("23:59:59.999999", 86399999999),
            ("12:34:56.5", 45296500000),
            ("00:00:00.000001", 1),
            ("22:38:19.907557", 81499907557),
            ("08:31:21.356993", 30681356993),
            ("11:44:30.72865", 42270728650),
            ("15:19:10.905062", 55150905062),
        ] {
            assert_eq!(p(TypeKind::Time, text), Value::Time(micros), "{text}");
        }
        for bad in [
            "",
            "24:00:00.000001",
            "24:00:01",
            "25:00:00",
            "12:60:00",
            "12:00:60",
            "12:00",
            "1:00:00",
            "12:00:00+00",
            "12:00:00.1234567",
            "allballs",
        ] {
            assert!(is_other(TypeKind::Time, bad), "{bad}");
        }
    }

    #[test]
    fn intervals() {
        // SELECT i::text, (extract(year FROM i)*12 + extract(month FROM i))::int,
        //   extract(day FROM i)::int, (extract(hour FROM i)*3600000000 +
        //   extract(minute FROM i)*60000000 + extract(microseconds FROM i))::int8
        // FROM unnest(array['1 year 2 mons 3 days 04:05:06.789', ...]::interval[]) i
        // Each part carries its own sign; PostgreSQL prints no '+' and never
        // a leading '-P'.
        for (text, months, d, micros) in [
            ("P1Y2M3DT4H5M6.789S", 14, 3, 14706789000),
            ("PT0S", 0, 0, 0),
            ("P-1Y-2M3DT-4H-5M-6.5S", -14, 3, -14706500000),
            ("P-1Y", -12, 0, 0),
            ("P-1D", 0, -1, 0),
            ("PT-1S", 0, 0, -1000000),
            ("PT-0.5S", 0, 0, -500000),
            ("P1Y-1D", 12, -1, 0),
            ("P-1MT1S", -1, 0, 1000000),
            ("P1DT-0.000001S", 0, 1, -1),
            ("P178000000Y", 2136000000, 0, 0),
            ("P-178000000Y", -2136000000, 0, 0),
            ("P2147483647D", 0, 2147483647, 0),
            ("P-2147483648D", 0, -2147483648, 0),
            ("PT2562047788H54.775807S", 0, 0, 9223372036854775807),
            ("P1M15D", 1, 15, 0),
            ("P7D", 0, 7, 0),
            ("P1DT25H", 0, 1, 90000000000),
            ("P-1Y-6M", -18, 0, 0),
            ("P-11M", -11, 0, 0),
            ("P-98Y549DT-63H-23M-5.444697S", -1176, 549, -228185444697),
            (
                "P-35Y-5M-904DT-105H-8M-39.53079S",
                -425,
                -904,
                -378519530790,
            ),
            ("P118Y1M1759DT78H37M14.100354S", 1417, 1759, 283034100354),
            (
                "P-106Y-4M1304DT-133H-40M-10.705429S",
                -1276,
                1304,
                -481210705429,
            ),
            ("P-88Y-6M589DT115H53M28.205216S", -1062, 589, 417208205216),
            (
                "P-159Y-9M-1523DT-107H-50M-6.737335S",
                -1917,
                -1523,
                -388206737335,
            ),
            // SELECT '3 hours'::interval, '3 minutes'::interval,
            //   '0.000001 seconds'::interval
            ("PT3H", 0, 0, 3 * USECS_PER_HOUR),
            ("PT3M", 0, 0, 3 * USECS_PER_MIN),
            ("PT0.000001S", 0, 0, 1),
        ] {
            assert_eq!(
                p(TypeKind::Interval, text),
                interval(months, d, micros),
                "{text}"
            );
        }
        // The far ends. SELECT make_interval(months => 2147483647),
        //   make_interval(months => -2147483647) - '1 mon'::interval,
        //   '-2147483648 mons -2147483648 days -2562047788:00:54.775807'::interval
        //     - interval '0.000001 s'
        assert_eq!(
            p(TypeKind::Interval, "P178956970Y7M"),
            interval(i32::MAX, 0, 0)
        );
        assert_eq!(
            p(TypeKind::Interval, "P-178956970Y-8M"),
            interval(i32::MIN, 0, 0)
        );
        assert_eq!(
            p(
                TypeKind::Interval,
                "P-178956970Y-8M-2147483648DT-2562047788H-54.775808S"
            ),
            interval(i32::MIN, i32::MIN, i64::MIN)
        );
        assert_eq!(
            p(TypeKind::Interval, "P178956970Y7M-2147483648D"),
            interval(i32::MAX, i32::MIN, 0)
        );
        // Taken though PostgreSQL does not print them.
        assert_eq!(
            p(TypeKind::Interval, "P-1Y-2M+3DT-4H-5M-6.5S"),
            interval(-14, 3, -14706500000)
        );
        assert_eq!(p(TypeKind::Interval, "PT0H"), interval(0, 0, 0));
        for bad in [
            "",
            "P",
            "PT",
            "P1YT",
            "-P1Y",
            "P1Y2Y",
            "P1M1Y",
            "PT1S1M",
            "P1H",
            "PT1D",
            "P1.5Y",
            "PT1.5M",
            "PT1.S",
            "PT1.1234567S",
            "P1YTT1S",
            "P--1Y",
            "P1W",
            "1 year",
            "P178956970Y8M",
            "P2147483648D",
            "PT2562047788H54.775808S",
            "P99999999999999999999Y",
            "P1Y ",
            "p1y",
        ] {
            assert!(is_other(TypeKind::Interval, bad), "{bad}");
        }
    }

    #[test]
    fn arrays() {
        // SELECT '{}'::int4[], '{1,2,NULL}'::int4[]
        assert_eq!(p(array(TypeKind::Int), "{}"), Value::Array(vec![]));
        assert_eq!(
            p(array(TypeKind::Int), "{1,2,NULL}"),
            Value::Array(vec![Value::Int(1), Value::Int(2), Value::Null])
        );
        // SELECT array['a b','c"d','e\f','NULL','','null',' x','é','{',',','a}']::text[]
        assert_eq!(
            p(
                array(TypeKind::Text),
                r#"{"a b","c\"d","e\\f","NULL","","null"," x",é,"{",",","a}"}"#
            ),
            Value::Array(
                [
                    "a b", "c\"d", "e\\f", "NULL", "", "null", " x", "é", "{", ",", "a}"
                ]
                .into_iter()
                .map(text)
                .collect()
            )
        );
        // SELECT '{{1,2},{3,4}}'::int4[], '{{{1}},{{2}}}'::int[]
        let int = |n| Value::Int(n);
        assert_eq!(
            p(array(TypeKind::Int), "{{1,2},{3,4}}"),
            Value::Array(vec![
                Value::Array(vec![int(1), int(2)]),
                Value::Array(vec![int(3), int(4)]),
            ])
        );
        assert_eq!(
            p(array(TypeKind::Int), "{{{1}},{{2}}}"),
            Value::Array(vec![
                Value::Array(vec![Value::Array(vec![int(1)])]),
                Value::Array(vec![Value::Array(vec![int(2)])]),
            ])
        );
        // SELECT array[array['a','b'],array[NULL,'"']]
        assert_eq!(
            p(array(TypeKind::Text), r#"{{a,b},{NULL,"\""}}"#),
            Value::Array(vec![
                Value::Array(vec![text("a"), text("b")]),
                Value::Array(vec![Value::Null, text("\"")]),
            ])
        );
        // SELECT '[0:1]={1,2}'::int4[], '[1:2][3:4]={{1,2},{3,4}}'::int4[]:
        // lower bounds other than 1 are not representable.
        assert!(is_other(array(TypeKind::Int), "[0:1]={1,2}"));
        assert!(is_other(array(TypeKind::Int), "[1:2][3:4]={{1,2},{3,4}}"));
        // SELECT array['2024-01-02 03:04:05.5'::timestamp, 'infinity',
        //   '0044-03-15 12:00:00 BC'], array['2024-01-02'::timestamptz]
        assert_eq!(
            p(
                array(TypeKind::Timestamp),
                r#"{"2024-01-02 03:04:05.5",infinity,"0044-03-15 12:00:00 BC"}"#
            ),
            Value::Array(vec![
                ts(1704164645500000),
                Value::Timestamp(Timestamp::Infinity),
                ts(-63517780800000000),
            ])
        );
        assert_eq!(
            p(
                array(TypeKind::TimestampTz),
                r#"{"2024-01-02 00:00:00+00"}"#
            ),
            Value::Array(vec![tstz(1704153600000000)])
        );
        // An element past i64 stays an element, as Other.
        assert_eq!(
            p(
                array(TypeKind::Timestamp),
                r#"{"294276-12-31 23:59:59.999999","1970-01-01 00:00:00"}"#
            ),
            Value::Array(vec![
                other("timestamp", "294276-12-31 23:59:59.999999"),
                ts(0)
            ])
        );
        // SELECT array['\x0102'::bytea, '\x'::bytea, '\xff'],
        //   array[decode('00015c22ff7b7d2c','hex')]
        assert_eq!(
            p(array(TypeKind::Bytea), r#"{"\\x0102","\\x","\\xff"}"#),
            Value::Array(vec![
                Value::Bytes(vec![1, 2]),
                Value::Bytes(vec![]),
                Value::Bytes(vec![255]),
            ])
        );
        assert_eq!(
            p(array(TypeKind::Bytea), r#"{"\\x00015c22ff7b7d2c"}"#),
            Value::Array(vec![Value::Bytes(vec![
                0x00, 0x01, 0x5c, 0x22, 0xff, 0x7b, 0x7d, 0x2c
            ])])
        );
        // SELECT array['{"a": 1, "b": [1, "x,}"]}'::json, '"str"', 'null'],
        //   array['{"a": 1, "b": [1, "x,}"]}'::jsonb]
        assert_eq!(
            p(
                array(TypeKind::Json),
                r#"{"{\"a\": 1, \"b\": [1, \"x,}\"]}","\"str\"","null"}"#
            ),
            Value::Array(vec![
                Value::Json(r#"{"a": 1, "b": [1, "x,}"]}"#.to_owned()),
                Value::Json(r#""str""#.to_owned()),
                Value::Json("null".to_owned()),
            ])
        );
        // SELECT array[1.5::float4, 'NaN', 'Infinity', '-Infinity',
        //   3.4028235e38, 1.4e-45], array[1e308::float8, 5e-324, 0.1, -0.0]
        let Value::Array(floats) = p(
            array(TypeKind::Float4),
            "{1.5,NaN,Infinity,-Infinity,3.4028235e+38,1e-45}",
        ) else {
            panic!()
        };
        assert_eq!(floats.len(), 6);
        assert!(matches!(floats[1], Value::Float(f) if f.is_nan()));
        assert_eq!(floats[4], Value::Float(f64::from(f32::MAX)));
        assert_eq!(
            p(array(TypeKind::Float8), "{1e+308,5e-324,0.1,0}"),
            Value::Array(vec![
                Value::Float(1e308),
                Value::Float(5e-324),
                Value::Float(0.1),
                Value::Float(0.0),
            ])
        );
        // SELECT array[true,false], array['P1Y'::interval, '-1 day'],
        //   array['24:00'::time], array['2024-01-01'::date, 'infinity',
        //   '0001-01-01 BC'], array['a0eebc99-...'::uuid]
        assert_eq!(
            p(array(TypeKind::Bool), "{t,f}"),
            Value::Array(vec![Value::Bool(true), Value::Bool(false)])
        );
        assert_eq!(
            p(array(TypeKind::Interval), "{P1Y,P-1D}"),
            Value::Array(vec![interval(12, 0, 0), interval(0, -1, 0)])
        );
        assert_eq!(
            p(array(TypeKind::Time), "{24:00:00}"),
            Value::Array(vec![Value::Time(USECS_PER_DAY)])
        );
        assert_eq!(
            p(
                array(TypeKind::Date),
                r#"{2024-01-01,infinity,"0001-01-01 BC"}"#
            ),
            Value::Array(vec![
                days(19723),
                Value::Date(Date::Infinity),
                days(-719528)
            ])
        );
        assert!(matches!(
            &p(array(TypeKind::Uuid), "{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}"),
            Value::Array(v) if matches!(v[..], [Value::Uuid(_)])
        ));
        // SELECT array['1.5'::numeric, 'NaN', 'Infinity', '-Infinity'],
        //   array[1::oid, 4294967295], array['a'::"char"], array['ab'::name],
        //   array['x '::bpchar(3)], array['x'::varchar]
        assert_eq!(
            p(array(TypeKind::Numeric), "{1.5,NaN,Infinity,-Infinity}"),
            Value::Array(
                ["1.5", "NaN", "Infinity", "-Infinity"]
                    .into_iter()
                    .map(|n| Value::Numeric(n.to_owned()))
                    .collect()
            )
        );
        assert_eq!(
            p(array(TypeKind::Int), "{1,4294967295}"),
            Value::Array(vec![int(1), int(4294967295)])
        );
        assert_eq!(
            p(array(TypeKind::Text), r#"{"x  "}"#),
            Value::Array(vec![text("x  ")])
        );
        // SELECT array['((0,0),(1,1))'::box, '((2,2),(3,3))']: box's
        // delimiter is ';'.
        let boxes = TypeKind::Array {
            element: Box::new(TypeKind::Other {
                type_name: "box".to_owned(),
            }),
            delimiter: b';',
        };
        assert_eq!(
            p(boxes, "{(1,1),(0,0);(3,3),(2,2)}"),
            Value::Array(vec![
                other("box", "(1,1),(0,0)"),
                other("box", "(3,3),(2,2)")
            ])
        );
        // What array_in takes beyond what array_out prints: whitespace,
        // lowercase null.
        assert_eq!(
            p(array(TypeKind::Int), " { 1 , null ,\t\"3\" } "),
            Value::Array(vec![int(1), Value::Null, int(3)])
        );
        // An element that does not read as its type becomes Other in place.
        assert_eq!(
            p(array(TypeKind::Int), "{1,x}"),
            Value::Array(vec![int(1), other("int8", "x")])
        );
        // Malformed arrays.
        for bad in [
            "",
            "{",
            "}",
            "{1,2",
            "{1,,2}",
            "{,}",
            "{1,}",
            "{1}}",
            "{1}x",
            "{{}}",
            "{{1},2}",
            "{1,{2}}",
            "{{1,2},{3}}",
            "{{1},{{2}}}",
            "{{{{{{{1}}}}}}}",
            r#"{"1}"#,
            r#"{"1"x}"#,
            r#"{"1\"}"#,
            r#"{a"b}"#,
            r#"{a\b}"#,
            "1,2",
            "[1:2]={1,2}",
        ] {
            assert!(is_other(array(TypeKind::Int), bad), "{bad}");
        }
        // Six dimensions are the most PostgreSQL has.
        assert!(matches!(
            p(array(TypeKind::Int), "{{{{{{1}}}}}}"),
            Value::Array(_)
        ));
    }

    #[test]
    fn other_array_keeps_its_text() {
        // SELECT '{"(1,2)"}'::point[] is built-in point[], not an Array.
        let kind = TypeKind::builtin(1017).unwrap();
        assert_eq!(p(kind, r#"{"(1,2)"}"#), other("point[]", r#"{"(1,2)"}"#));
        // Not UTF-8 in an Other: lossy.
        let kind = TypeKind::Other {
            type_name: "x".to_owned(),
        };
        assert_eq!(parse(&kind, b"\xff"), other("x", "\u{fffd}"));
    }
}
