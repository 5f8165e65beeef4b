//! Pieces of the summaries `datum admin` prints for people: a field of the
//! API's JSON answer as text, and a digest shortened as `datum test` shows
//! it.

use serde_json::Value;

/// How many characters of a digest the summaries show, as `datum test` does.
const SHORT_SHA: usize = 12;

/// A field as text: strings without quotes, `?` when missing.
pub(crate) fn field(value: &Value, path: &[&str]) -> String {
    let mut value = value;
    for key in path {
        match value.get(key) {
            Some(next) => value = next,
            None => return "?".into(),
        }
    }
    match value {
        Value::String(text) => text.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    }
}

/// The first characters of a digest.
pub(crate) fn short_sha(sha: Option<&Value>) -> String {
    match sha.and_then(Value::as_str) {
        Some(sha) => sha.chars().take(SHORT_SHA).collect(),
        None => "?".into(),
    }
}

/// A JSON array's elements as text, `a, b, c` (empty when it is not one).
pub(crate) fn list(value: Option<&Value>) -> String {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .map(|item| field(item, &[]))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}
