//! `filter_rows`: keeps the changes whose column matches a configured
//! predicate (`column`, `op`, `value`).
//!
//! A row change is kept when any of its rows matches: `new` for an insert or
//! a snapshot, `old` for a delete, either for an update (so a row that leaves
//! the predicate is still seen leaving). NULL matches only `is_null`, as in
//! SQL. A row that lacks the column, or holds an unchanged TOAST value, cannot
//! be judged: `if_missing` decides, except that a delete that cannot be judged
//! is always kept, since dropping it could leave a deleted row in the sink.
//! Truncates and logical messages pass unless `keep_truncates` or
//! `keep_messages` is false; tables outside `tables` (when given) pass
//! unfiltered.

use std::cmp::Ordering;
use std::sync::OnceLock;

use datum_guest::{Change, Config, Context, Error, Op, Result, Row, Value, bail, filter, init};
use serde::Deserialize;

/// The comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Comparison {
    /// Equal to `value`.
    Eq,
    /// Not equal to `value` (NULL is neither).
    Ne,
    /// Less than `value`.
    Lt,
    /// Less than or equal to `value`.
    Le,
    /// Greater than `value`.
    Gt,
    /// Greater than or equal to `value`.
    Ge,
    /// Text containing `value`, or an array with an element equal to it.
    Contains,
    /// NULL.
    IsNull,
    /// Not NULL.
    NotNull,
}

impl Comparison {
    /// The name the configuration uses.
    pub fn name(self) -> &'static str {
        match self {
            Comparison::Eq => "eq",
            Comparison::Ne => "ne",
            Comparison::Lt => "lt",
            Comparison::Le => "le",
            Comparison::Gt => "gt",
            Comparison::Ge => "ge",
            Comparison::Contains => "contains",
            Comparison::IsNull => "is_null",
            Comparison::NotNull => "not_null",
        }
    }
}

/// A configured value.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Literal {
    /// `true` / `false`.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Text(String),
}

/// What to do with a row that cannot be judged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IfMissing {
    /// Drop it.
    #[default]
    Drop,
    /// Keep it.
    Keep,
}

fn yes() -> bool {
    true
}

/// The module's configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    /// The column to test.
    pub column: String,
    /// The comparison.
    pub op: Comparison,
    /// The value to compare with (not for `is_null` / `not_null`).
    #[serde(default)]
    pub value: Option<Literal>,
    /// `schema.table` names to filter; others pass. All tables when absent.
    #[serde(default)]
    pub tables: Option<Vec<String>>,
    /// Rows lacking the column (or with an unchanged TOAST value).
    #[serde(default)]
    pub if_missing: IfMissing,
    /// Keep truncates (default true).
    #[serde(default = "yes")]
    pub keep_truncates: bool,
    /// Keep logical messages (default true).
    #[serde(default = "yes")]
    pub keep_messages: bool,
}

impl Settings {
    /// Reads and checks the configuration.
    pub fn from_config(config: &Config) -> Result<Settings> {
        let settings: Settings = config.parse()?;
        match (settings.op, &settings.value) {
            (Comparison::IsNull | Comparison::NotNull, Some(_)) => {
                bail!("`value` has no meaning with op `is_null` or `not_null`")
            }
            (Comparison::IsNull | Comparison::NotNull, None) => {}
            (_, None) => bail!("op `{}` needs a `value`", settings.op.name()),
            (Comparison::Contains, Some(Literal::Float(_))) => {
                bail!("op `contains` needs a string, integer or boolean `value`")
            }
            (_, Some(_)) => {}
        }
        Ok(settings)
    }

    /// Whether to keep `change`.
    pub fn keeps(&self, change: &Change) -> Result<bool> {
        match change.op {
            Op::Truncate => return Ok(self.keep_truncates),
            Op::Message => return Ok(self.keep_messages),
            Op::Insert | Op::Update | Op::Delete | Op::Snapshot => {}
            // Schema changes pass a `#[filter]` by without reaching it.
            Op::Schema => return Ok(true),
        }
        if let Some(tables) = &self.tables
            && !tables.contains(&change.qualified_table())
        {
            return Ok(true);
        }
        let mut undecided = false;
        for row in [change.new.as_ref(), change.old.as_ref()]
            .into_iter()
            .flatten()
        {
            match self.matches(row)? {
                Some(true) => return Ok(true),
                Some(false) => {}
                None => undecided = true,
            }
        }
        let nothing_judged = change.new.is_none() && change.old.is_none();
        if undecided || nothing_judged {
            return Ok(change.op == Op::Delete || self.if_missing == IfMissing::Keep);
        }
        Ok(false)
    }

    /// Whether a row matches; `None` if it cannot be judged.
    fn matches(&self, row: &Row) -> Result<Option<bool>> {
        let value = match row.get(&self.column) {
            None | Some(Value::Unchanged) => return Ok(None),
            Some(value) => value,
        };
        let literal = match (self.op, &self.value) {
            (Comparison::IsNull, _) => return Ok(Some(value.is_null())),
            (Comparison::NotNull, _) => return Ok(Some(!value.is_null())),
            (_, _) if value.is_null() => return Ok(Some(false)),
            (_, Some(literal)) => literal,
            // `from_config` refuses the other ops without a value.
            (_, None) => return Ok(Some(false)),
        };
        if self.op == Comparison::Contains {
            return contains(value, literal)
                .map(Some)
                .with_context(|| self.mismatch(value));
        }
        let ordering = compare(value, literal).with_context(|| self.mismatch(value))?;
        Ok(Some(match (self.op, ordering) {
            (_, None) => self.op == Comparison::Ne, // NaN: only "not equal" holds
            (Comparison::Eq, Some(o)) => o == Ordering::Equal,
            (Comparison::Ne, Some(o)) => o != Ordering::Equal,
            (Comparison::Lt, Some(o)) => o == Ordering::Less,
            (Comparison::Le, Some(o)) => o != Ordering::Greater,
            (Comparison::Gt, Some(o)) => o == Ordering::Greater,
            (Comparison::Ge, Some(o)) => o != Ordering::Less,
            (_, Some(_)) => false,
        }))
    }

    fn mismatch(&self, value: &Value) -> String {
        format!(
            "column `{}` holds {}, which op `{}` cannot compare with {}",
            self.column,
            value.kind(),
            self.op.name(),
            match &self.value {
                Some(Literal::Bool(_)) => "a boolean",
                Some(Literal::Int(_) | Literal::Float(_)) => "a number",
                Some(Literal::Text(_)) => "a string",
                None => "nothing",
            }
        )
    }
}

/// A number as it compares: integers exactly, floats as floats.
#[derive(Debug, Clone, Copy)]
enum Number {
    Int(i64),
    Float(f64),
}

impl Number {
    fn partial_cmp(self, other: Number) -> Option<Ordering> {
        match (self, other) {
            (Number::Int(a), Number::Int(b)) => Some(a.cmp(&b)),
            (Number::Int(a), Number::Float(b)) => (a as f64).partial_cmp(&b),
            (Number::Float(a), Number::Int(b)) => a.partial_cmp(&(b as f64)),
            (Number::Float(a), Number::Float(b)) => a.partial_cmp(&b),
        }
    }
}

fn value_number(value: &Value) -> Option<Number> {
    match value {
        Value::Int(i) | Value::Time(i) => Some(Number::Int(*i)),
        Value::Float(f) => Some(Number::Float(*f)),
        Value::Numeric(n) => n.parse::<f64>().ok().map(Number::Float),
        Value::Timestamp(t) | Value::TimestampTz(t) => Some(match t {
            datum_guest::Timestamp::Micros(m) => Number::Int(*m),
            datum_guest::Timestamp::Infinity => Number::Float(f64::INFINITY),
            datum_guest::Timestamp::NegInfinity => Number::Float(f64::NEG_INFINITY),
        }),
        Value::Date(d) => Some(match d {
            datum_guest::Date::Days(days) => Number::Int(i64::from(*days)),
            datum_guest::Date::Infinity => Number::Float(f64::INFINITY),
            datum_guest::Date::NegInfinity => Number::Float(f64::NEG_INFINITY),
        }),
        _ => None,
    }
}

/// Compares a column value with a literal; an error when they are not
/// comparable (a configuration mistake worth stopping for).
fn compare(value: &Value, literal: &Literal) -> Result<Option<Ordering>> {
    match literal {
        Literal::Bool(b) => match value {
            Value::Bool(v) => Ok(Some(v.cmp(b))),
            _ => Err(Error::new("not a boolean")),
        },
        Literal::Int(i) => value_number(value)
            .map(|n| n.partial_cmp(Number::Int(*i)))
            .context("not a number"),
        Literal::Float(f) => value_number(value)
            .map(|n| n.partial_cmp(Number::Float(*f)))
            .context("not a number"),
        Literal::Text(s) => match value {
            Value::Text(_) | Value::Uuid(_) | Value::Other { .. } | Value::Json(_) => {
                let text = value.to_text().context("no text form")?;
                Ok(Some(text.as_ref().cmp(s.as_str())))
            }
            _ => Err(Error::new("not text")),
        },
    }
}

fn contains(value: &Value, literal: &Literal) -> Result<bool> {
    match (value, literal) {
        (Value::Text(text), Literal::Text(s)) => Ok(text.contains(s.as_str())),
        (Value::Array(items), _) => {
            for item in items {
                if !item.is_null() && compare(item, literal)? == Some(Ordering::Equal) {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        _ => Err(Error::new("neither text nor an array")),
    }
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();

/// Reads the configuration once per instance.
#[init]
pub fn configure(config: Config) -> Result<()> {
    let settings = Settings::from_config(&config)?;
    SETTINGS
        .set(settings)
        .map_err(|_| Error::new("filter_rows is configured twice"))
}

/// Keeps the changes that match the configured predicate.
#[filter]
pub fn filter_rows(change: &Change) -> Result<bool> {
    SETTINGS
        .get()
        .context("filter_rows is not configured")?
        .keeps(change)
}

#[cfg(test)]
mod tests {
    use datum_guest::{Batch, Txn, row, testing};

    use super::*;

    fn settings(toml: &str) -> Settings {
        Settings::from_config(&Config::from_toml(toml)).expect("valid settings")
    }

    fn insert(row: Row) -> Change {
        Change::insert("public", "orders")
            .column("id", "int4", true)
            .new_row(row)
    }

    #[test]
    fn comparisons() {
        let cases = [
            (
                r#"op = "eq""#,
                "value = \"paid\"",
                row! { "status" => "paid" },
                true,
            ),
            (
                r#"op = "eq""#,
                "value = \"paid\"",
                row! { "status" => "new" },
                false,
            ),
            (
                r#"op = "ne""#,
                "value = \"paid\"",
                row! { "status" => "new" },
                true,
            ),
            (
                r#"op = "ne""#,
                "value = \"paid\"",
                row! { "status" => Value::Null },
                false,
            ),
            (r#"op = "gt""#, "value = 10", row! { "status" => 11 }, true),
            (r#"op = "gt""#, "value = 10", row! { "status" => 10 }, false),
            (
                r#"op = "ge""#,
                "value = 10",
                row! { "status" => 10.0 },
                true,
            ),
            (
                r#"op = "lt""#,
                "value = 1.5",
                row! { "status" => Value::Numeric("1.25".into()) },
                true,
            ),
            (
                r#"op = "le""#,
                "value = 1",
                row! { "status" => Value::Float(f64::NAN) },
                false,
            ),
            (
                r#"op = "contains""#,
                "value = \"@example\"",
                row! { "status" => "a@example.com" },
                true,
            ),
            (
                r#"op = "contains""#,
                "value = 3",
                row! { "status" => vec![Value::Int(1), Value::Int(3)] },
                true,
            ),
            (
                r#"op = "is_null""#,
                "",
                row! { "status" => Value::Null },
                true,
            ),
            (
                r#"op = "not_null""#,
                "",
                row! { "status" => Value::Null },
                false,
            ),
            (
                r#"op = "eq""#,
                "value = true",
                row! { "status" => true },
                true,
            ),
        ];
        for (op, value, row, expected) in cases {
            let s = settings(&format!("column = \"status\"\n{op}\n{value}"));
            assert_eq!(
                s.keeps(&insert(row.clone())),
                Ok(expected),
                "{op} {value} on {row:?}"
            );
        }
    }

    #[test]
    fn incomparable_values_are_an_error() {
        let s = settings("column = \"status\"\nop = \"gt\"\nvalue = 3");
        let err = s.keeps(&insert(row! { "status" => "paid" })).unwrap_err();
        assert_eq!(
            err.message(),
            "column `status` holds text, which op `gt` cannot compare with a number: not a number"
        );
        let answer = testing::run_filter(
            |c: &Change| s.keeps(c),
            &Batch::new(
                Txn::committed(1, 1),
                vec![
                    insert(row! { "status" => 4 }),
                    insert(row! { "status" => "x" }),
                ],
            ),
        );
        assert_eq!(answer.unwrap_err().index(), Some(1));
    }

    #[test]
    fn which_row_is_judged() {
        let s = settings("column = \"status\"\nop = \"eq\"\nvalue = \"paid\"");
        let delete_full =
            Change::delete("public", "orders").old_row(row! { "id" => 1, "status" => "new" });
        assert_eq!(s.keeps(&delete_full), Ok(false));
        let delete_key_only = Change::delete("public", "orders").old_row(row! { "id" => 1 });
        assert_eq!(
            s.keeps(&delete_key_only),
            Ok(true),
            "a delete that cannot be judged is kept"
        );
        let leaving = Change::update("public", "orders")
            .new_row(row! { "status" => "refunded" })
            .old_row(row! { "status" => "paid" });
        assert_eq!(
            s.keeps(&leaving),
            Ok(true),
            "a row leaving the predicate is seen leaving"
        );
        let toast = insert(row! { "status" => Value::Unchanged });
        assert_eq!(s.keeps(&toast), Ok(false));
        let lacking = insert(row! { "id" => 1 });
        assert_eq!(s.keeps(&lacking), Ok(false));
        let keep_missing =
            settings("column = \"status\"\nop = \"eq\"\nvalue = \"paid\"\nif_missing = \"keep\"");
        assert_eq!(keep_missing.keeps(&lacking), Ok(true));
    }

    #[test]
    fn other_changes_and_tables() {
        let s = settings(
            "column = \"status\"\nop = \"eq\"\nvalue = \"paid\"\ntables = [\"public.orders\"]\nkeep_messages = false",
        );
        assert_eq!(
            s.keeps(&Change::truncate_tables([("public", "orders")])),
            Ok(true)
        );
        assert_eq!(
            s.keeps(&Change::logical_message("p", b"x".to_vec(), true)),
            Ok(false)
        );
        let other_table = Change::insert("public", "users").new_row(row! { "status" => "new" });
        assert_eq!(s.keeps(&other_table), Ok(true));
    }

    #[test]
    fn configuration_mistakes_are_named() {
        let err = |toml: &str| {
            Settings::from_config(&Config::from_toml(toml))
                .unwrap_err()
                .message()
                .to_owned()
        };
        assert_eq!(
            err("column = \"a\"\nop = \"eq\""),
            "op `eq` needs a `value`"
        );
        assert_eq!(
            err("column = \"a\"\nop = \"is_null\"\nvalue = 1"),
            "`value` has no meaning with op `is_null` or `not_null`"
        );
        assert!(err("op = \"eq\"\nvalue = 1").contains("missing field `column`"));
        assert!(err("column = \"a\"\nop = \"like\"\nvalue = 1").contains("`op`"));
        assert!(
            err("column = \"a\"\nop = \"eq\"\nvalue = 1\ncolour = 2")
                .contains("unknown field `colour`")
        );
    }

    #[test]
    fn end_to_end_answers_kept_indexes() {
        let s = settings("column = \"total\"\nop = \"ge\"\nvalue = 100");
        let batch = Batch::new(
            Txn::committed(1, 1),
            (0..5)
                .map(|i| insert(row! { "id" => i, "total" => i * 50 }))
                .collect(),
        );
        let answer = testing::run_filter(|c: &Change| s.keeps(c), &batch).expect("runs");
        assert_eq!(answer.kept(), [2, 3, 4]);
    }
}
