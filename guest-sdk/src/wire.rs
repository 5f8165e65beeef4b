//! The event model shared by the host and the guests (`DESIGN.md` §3).
//!
//! Owns the Rust shape of a value, a change and a batch. It does not own how
//! they cross the ABI (MessagePack, `docs/abi.md`), nor how the host decodes
//! them from PostgreSQL.

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
