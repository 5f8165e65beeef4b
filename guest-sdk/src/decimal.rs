//! `numeric` values as [`Decimal`]s (the `decimal` feature).
//!
//! Owns the conversion between PostgreSQL's `numeric` text and
//! `rust_decimal`'s [`Decimal`]: reading exactly or failing (`NaN`, the
//! infinities, and values a `Decimal` cannot hold without rounding), and
//! writing the plain decimal text PostgreSQL reads back. The value types
//! belong to [`wire`](crate::wire); the other accessors to `value` and
//! `change`.

use rust_decimal::Decimal;

use crate::error::{Error, Result};
use crate::wire::{Row, Value};

impl Value {
    /// A `numeric`, or an integer (`int2`, `int4`, `int8`, `oid`), as a
    /// [`Decimal`], exactly; `Ok(None)` for any other variant, NULL
    /// included. With the `decimal` feature.
    ///
    /// The scale is kept (`12.50` reads as 1250 × 10⁻², and writes back as
    /// `12.50`), up to the 28 digits after the point a `Decimal` has; zeros
    /// beyond them are dropped, since they change nothing of the value.
    ///
    /// An error, never a rounded value nor a panic, for what a `Decimal`
    /// cannot hold and PostgreSQL's `numeric` can: `NaN`, `Infinity` and
    /// `-Infinity`; a magnitude beyond [`Decimal::MAX`]
    /// (79,228,162,514,264,337,593,543,950,335); more significant digits
    /// than its 96 bits hold (28 or 29 in all, at most 28 after the point);
    /// and text that is not a decimal number. An exponent (`1.5e3`, as an
    /// upstream module may write; PostgreSQL never sends one) is read too.
    ///
    /// ```
    /// use datum_guest::{Decimal, Value};
    ///
    /// # fn main() -> datum_guest::Result<()> {
    /// let price = Value::Numeric("12.50".into());
    /// assert_eq!(price.to_decimal()?, Some(Decimal::new(1250, 2)));
    /// assert_eq!(Value::from(3).to_decimal()?, Some(Decimal::from(3)));
    /// assert_eq!(Value::Null.to_decimal()?, None);
    /// let error = Value::Numeric("NaN".into()).to_decimal().unwrap_err();
    /// assert!(error.message().contains("NaN"));
    /// # Ok(()) }
    /// ```
    pub fn to_decimal(&self) -> Result<Option<Decimal>> {
        match self {
            Value::Numeric(text) => parse_numeric(text).map(Some),
            Value::Int(i) => Ok(Some(Decimal::from(*i))),
            _ => Ok(None),
        }
    }
}

impl Row {
    /// A `numeric` (or integer) column as a [`Decimal`]; `Ok(None)` if the
    /// row lacks it or it holds something else (NULL included), an error
    /// naming the column if its value has no `Decimal` (see
    /// [`Value::to_decimal`]). With the `decimal` feature.
    ///
    /// ```
    /// use datum_guest::{Context, Decimal, Result, Value, row};
    ///
    /// # fn main() -> Result<()> {
    /// let order = row! { "price" => Value::Numeric("0.10".into()), "quantity" => 3 };
    /// let price = order.get_decimal("price")?.context("no price")?;
    /// let quantity = order.get_decimal("quantity")?.context("no quantity")?;
    /// let total = price.checked_mul(quantity).context("the total overflows")?;
    /// assert_eq!(total.to_string(), "0.30");
    /// assert_eq!(order.get_decimal("discount")?, None);
    /// # Ok(()) }
    /// ```
    pub fn get_decimal(&self, name: &str) -> Result<Option<Decimal>> {
        match self.get(name) {
            None => Ok(None),
            Some(value) => value
                .to_decimal()
                .map_err(|e| Error::new(format!("column `{name}`: {}", e.message()))),
        }
    }
}

impl From<Decimal> for Value {
    /// A `numeric` holding the decimal's text: plain digits, never an
    /// exponent, its scale kept (`Decimal::new(1250, 2)` becomes `12.50`),
    /// which PostgreSQL reads back as the same number.
    fn from(mut v: Decimal) -> Value {
        if v.is_zero() {
            // A zero reached by arithmetic may carry a sign; `numeric` has none.
            v.set_sign_positive(true);
        }
        Value::Numeric(v.to_string())
    }
}

/// The largest integer part a [`Decimal`] holds (`Decimal::MAX`), in digits.
const MAX_INTEGER: &str = "79228162514264337593543950335";

/// Reads `numeric` text exactly: an optional sign, digits with an optional
/// point, and an optional exponent (`1.5e3`, which PostgreSQL reads too and
/// modules may write, though PostgreSQL never sends one).
fn parse_numeric(text: &str) -> Result<Decimal> {
    let (negative, unsigned) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    let (mantissa, exponent) = match unsigned.split_once(['e', 'E']) {
        Some((mantissa, exponent)) => (mantissa, Some(exponent)),
        None => (unsigned, None),
    };
    let (integer, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let exponent = match exponent {
        None => Some(0),
        Some(e) => {
            let magnitude = e.strip_prefix(['-', '+']).unwrap_or(e);
            let sign = if e.starts_with('-') { -1 } else { 1 };
            (!magnitude.is_empty() && digits(magnitude)).then(|| {
                // Any exponent of 10,000,000 or more gives the same answer.
                let m = magnitude.trim_start_matches('0');
                sign * if m.len() > 7 {
                    10_000_000
                } else {
                    m.parse::<i64>().unwrap_or(0)
                }
            })
        }
    };
    let Some(exponent) = exponent.filter(|_| {
        digits(integer) && digits(fraction) && !(integer.is_empty() && fraction.is_empty())
    }) else {
        let special = ["NaN", "Infinity", "inf"]
            .iter()
            .any(|word| unsigned.eq_ignore_ascii_case(word));
        return Err(Error::new(if special {
            format!(
                "numeric `{}` has no Decimal value (a Decimal holds neither NaN nor infinities)",
                shown(text)
            )
        } else {
            format!("numeric `{}` is not a decimal number", shown(text))
        }));
    };
    if exponent == 0 {
        return parse_plain(text, negative, integer, fraction);
    }
    // Moves the point; a zero mantissa is zero whatever the exponent.
    let all: String = [integer, fraction].concat();
    if all.bytes().all(|b| b == b'0') {
        return Ok(Decimal::ZERO);
    }
    let point = i64::try_from(integer.len())
        .unwrap_or(i64::MAX)
        .saturating_add(exponent);
    let length = i64::try_from(all.len()).unwrap_or(i64::MAX);
    // Past these the value is out of range, or too precise, for sure.
    let (integer, fraction) = if point > length.saturating_add(40) {
        ([all.as_str(), &"0".repeat(40)].concat(), String::new())
    } else if point < -40 {
        (String::new(), [&"0".repeat(40), all.as_str()].concat())
    } else if point <= 0 {
        (
            String::new(),
            ["0".repeat(point.unsigned_abs() as usize), all].concat(),
        )
    } else if point >= length {
        let zeros = "0".repeat((point - length) as usize);
        ([all, zeros].concat(), String::new())
    } else {
        let (i, f) = all.split_at(point as usize);
        (i.to_owned(), f.to_owned())
    };
    parse_plain(text, negative, &integer, &fraction)
}

/// Reads digits with a point between them exactly; `text` is what the
/// messages show.
fn parse_plain(text: &str, negative: bool, integer: &str, fraction: &str) -> Result<Decimal> {
    let integer = integer.trim_start_matches('0');
    if integer.len() > MAX_INTEGER.len()
        || (integer.len() == MAX_INTEGER.len() && integer > MAX_INTEGER)
    {
        return Err(Error::new(format!(
            "numeric `{}` is beyond a Decimal's range (±{MAX_INTEGER})",
            shown(text)
        )));
    }
    // Trailing zeros are parsed away and restored by `rescale`, as many as
    // fit: `10.000…0` with 28 zeros holds with 27 of them.
    let significant = fraction.trim_end_matches('0');
    let mut exact = String::with_capacity(integer.len() + significant.len() + 3);
    if negative {
        exact.push('-');
    }
    exact.push_str(if integer.is_empty() { "0" } else { integer });
    if !significant.is_empty() {
        exact.push('.');
        exact.push_str(significant);
    }
    let mut value = Decimal::from_str_exact(&exact).map_err(|_| {
        Error::new(format!(
            "numeric `{}` has more digits than a Decimal holds without rounding \
             (28 or 29 in all, at most 28 after the point)",
            shown(text)
        ))
    })?;
    let scale = u32::try_from(fraction.len())
        .unwrap_or(u32::MAX)
        .min(Decimal::MAX_SCALE);
    if scale > value.scale() {
        value.rescale(scale);
    }
    if value.is_zero() {
        value.set_sign_positive(true);
    }
    Ok(value)
}

/// The text for a message: whole when short, else its start and its length
/// (a `numeric` may have over 100,000 digits).
fn shown(text: &str) -> String {
    const LONGEST: usize = 40;
    if text.chars().count() <= LONGEST {
        text.to_owned()
    } else {
        let start: String = text.chars().take(32).collect();
        format!("{start}… ({} characters)", text.chars().count())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Change, row};

    fn numeric(text: &str) -> Value {
        Value::Numeric(text.into())
    }

    fn read(text: &str) -> Decimal {
        numeric(text)
            .to_decimal()
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .unwrap_or_else(|| panic!("{text}: no decimal"))
    }

    fn refused(text: &str) -> String {
        match numeric(text).to_decimal() {
            Ok(d) => panic!("{text} read as {d:?}"),
            Err(e) => e.message().to_owned(),
        }
    }

    /// Reads the text and writes it back.
    fn round_trip(text: &str) -> Value {
        Value::from(read(text))
    }

    #[test]
    fn round_trips_keep_value_and_scale() {
        for text in [
            "0",
            "12.50",
            "-12.500",
            "0.001",
            "-0.000001",
            "1000000",
            "79228162514264337593543950335",
            "-79228162514264337593543950335",
            "7.9228162514264337593543950335",
            "0.0000000000000000000000000001",
            "-0.1234567890123456789012345678",
            "123456789012345678.1234567890",
        ] {
            assert_eq!(round_trip(text), numeric(text), "{text}");
        }
        assert_eq!(read("12.50"), Decimal::new(1250, 2));
        assert_eq!(read("12.50").scale(), 2);
        assert_eq!(read("-3.14"), Decimal::new(-314, 2));
        assert!(read("-3.14").is_sign_negative());
    }

    #[test]
    fn big_scales_keep_what_fits() {
        let zeros = |n| "0".repeat(n);
        // 28 places: a Decimal's largest scale.
        assert_eq!(read(&format!("1.{}", zeros(28))).scale(), 28);
        // 30 places of zeros: value exact, scale capped at 28.
        let one = read(&format!("1.{}", zeros(30)));
        assert_eq!((one, one.scale()), (Decimal::ONE, 28));
        // The mantissa of 10 × 10²⁸ needs 97 bits: scale 27.
        let ten = read(&format!("10.{}", zeros(28)));
        assert_eq!((ten, ten.scale()), (Decimal::TEN, 27));
        // numeric(1000, 900) zeros, and a zero with PostgreSQL's largest
        // scale, read at once.
        assert_eq!(read(&format!("0.{}", zeros(16383))), Decimal::ZERO);
        assert_eq!(
            read(&format!("-{}.{}", zeros(100), zeros(900))),
            Decimal::ZERO
        );
        // Leading zeros and the other spellings PostgreSQL reads.
        assert_eq!(read("000012.5"), Decimal::new(125, 1));
        assert_eq!(read(".5"), Decimal::new(5, 1));
        assert_eq!(read("5."), Decimal::from(5));
        assert_eq!(read("+5"), Decimal::from(5));
    }

    #[test]
    fn exponents_move_the_point() {
        for (text, plain) in [
            ("1.5e3", "1500"),
            ("1.50e1", "15.0"),
            ("-2.5E-3", "-0.0025"),
            ("+12E+0", "12"),
            ("1e-28", "0.0000000000000000000000000001"),
            (
                "7.9228162514264337593543950335e28",
                "79228162514264337593543950335",
            ),
            ("0e999999999999", "0"),
            ("0.000e-5", "0"),
        ] {
            assert_eq!(round_trip(text), numeric(plain), "{text}");
        }
        for text in ["1e29", "8e28", "1e999999999999", "-1e41", "00001e10000000"] {
            assert!(refused(text).contains("beyond a Decimal's range"), "{text}");
        }
        for text in ["1e-29", "1.5e-28", "1e-999999999999", "1e-41"] {
            assert!(
                refused(text).contains("more digits than a Decimal holds without rounding"),
                "{text}"
            );
        }
    }

    #[test]
    fn negative_zero_is_zero() {
        assert_eq!(round_trip("-0.00"), numeric("0.00"));
        let product = read("-1.5")
            .checked_mul(Decimal::ZERO)
            .expect("no overflow");
        assert_eq!(
            Value::from(product)
                .as_numeric()
                .map(|s| s.starts_with('-')),
            Some(false)
        );
    }

    #[test]
    fn computed_total_is_exact() {
        let sum = read("0.1").checked_add(read("0.2")).expect("no overflow");
        assert_eq!(sum, read("0.3"));
        assert_eq!(Value::from(sum), numeric("0.3"));
        assert_ne!(0.1_f64 + 0.2, 0.3, "what floats would have answered");

        let order = Change::insert("public", "orders")
            .column("id", "int4", true)
            .column("price", "numeric", false)
            .column("quantity", "int4", false)
            .column("shipping", "numeric", false)
            .new_row(row! {
                "id" => 1,
                "price" => numeric("0.10"),
                "quantity" => 3,
                "shipping" => numeric("0.20"),
            });
        let mut out = order;
        let total = {
            let row = out.new.as_ref().expect("a new row");
            let price = row.get_decimal("price").unwrap().unwrap();
            let quantity = row.get_decimal("quantity").unwrap().unwrap();
            let shipping = row.get_decimal("shipping").unwrap().unwrap();
            price
                .checked_mul(quantity)
                .and_then(|subtotal| subtotal.checked_add(shipping))
                .expect("no overflow")
        };
        assert!(out.set_column("total", "numeric", total));
        assert_eq!(
            out.new.as_ref().and_then(|r| r.get("total")),
            Some(&numeric("0.50"))
        );
    }

    #[test]
    fn nan_and_infinities_are_errors() {
        for text in ["NaN", "Infinity", "-Infinity", "nan", "inf", "-inf"] {
            let message = refused(text);
            assert_eq!(
                message,
                format!(
                    "numeric `{text}` has no Decimal value \
                     (a Decimal holds neither NaN nor infinities)"
                )
            );
        }
    }

    #[test]
    fn out_of_range_and_too_precise_are_errors() {
        let message = refused("79228162514264337593543950336");
        assert_eq!(
            message,
            "numeric `79228162514264337593543950336` is beyond a Decimal's range \
             (±79228162514264337593543950335)"
        );
        assert!(refused("-123456789012345678901234567890.5").contains("beyond a Decimal's range"));
        let huge = "9".repeat(131_072);
        let message = refused(&huge);
        assert!(message.contains("(131072 characters)"), "{message}");
        assert!(message.len() < 200, "{message}");

        for text in [
            "0.00000000000000000000000000001",
            "7.92281625142643375935439503351",
            "79228162514264337593543950335.5",
            "1.0000000000000000000000000000001",
        ] {
            assert!(
                refused(text).contains("more digits than a Decimal holds without rounding"),
                "{text}"
            );
        }
    }

    #[test]
    fn malformed_text_is_an_error() {
        for text in [
            "", "-", ".", "1_000", "1.2.3", " 1", "12,5", "--1", "١٢", "NaN1", "1e", "e5", "1e5.5",
            "1ee5", "1e+-5", ".e1",
        ] {
            assert_eq!(
                refused(text),
                format!("numeric `{text}` is not a decimal number"),
                "{text:?}"
            );
        }
    }

    #[test]
    fn other_variants_and_rows() {
        assert_eq!(Value::from(-7).to_decimal(), Ok(Some(Decimal::from(-7))));
        assert_eq!(
            Value::from(i64::MIN).to_decimal(),
            Ok(Some(Decimal::from(i64::MIN)))
        );
        for value in [
            Value::Null,
            Value::from("1.5"),
            Value::from(1.5),
            Value::Unchanged,
        ] {
            assert_eq!(value.to_decimal(), Ok(None), "{value:?}");
        }
        let r = row! { "amount" => numeric("2.50"), "bad" => numeric("NaN"), "note" => "x" };
        assert_eq!(r.get_decimal("amount"), Ok(Some(Decimal::new(250, 2))));
        assert_eq!(r.get_decimal("note"), Ok(None));
        assert_eq!(r.get_decimal("missing"), Ok(None));
        let error = r.get_decimal("bad").unwrap_err();
        assert!(
            error.message().starts_with("column `bad`: numeric `NaN`"),
            "{error}"
        );
    }
}
