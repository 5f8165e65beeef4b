//! PostgreSQL's text forms of values (`DateStyle=ISO`, `IntervalStyle=iso_8601`,
//! timestamps in UTC), as the JSON form, the pretty sink and the admin
//! client print them, and the spellings people type that read back to them.

use datum_guest::wire::{Date, Interval, Timestamp};

const USECS_PER_SEC: i64 = 1_000_000;
const USECS_PER_DAY: i64 = 86_400 * USECS_PER_SEC;

/// Accepts the ISO 8601 spellings people type too: `T` for the space, `Z`
/// for `+00`.
pub(crate) fn normalize_timestamp(text: &str) -> String {
    let mut t = text.replacen('T', " ", 1);
    if let Some(stripped) = t.strip_suffix('Z') {
        t = format!("{stripped}+00");
    }
    t
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn unhex(text: &str) -> Option<Vec<u8>> {
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

pub(crate) fn format_time(micros: i64) -> String {
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

pub(crate) fn format_date(d: Date) -> String {
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

pub(crate) fn format_uuid(u: &[u8; 16]) -> String {
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
pub(crate) fn format_interval(i: Interval) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
