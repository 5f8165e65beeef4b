//! What PostgreSQL's errors mean: which SQLSTATEs pass, and an error with
//! its causes as one line.

/// Whether an error of this SQLSTATE describes a passing condition.
pub(crate) fn transient_sqlstate(code: &str) -> bool {
    matches!(
        &code[..code.len().min(2)],
        "08" // connection exception
        | "40" // transaction rollback
        | "53" // insufficient resources
        | "57" // operator intervention: shutdown, terminated backend
        | "58" // system error
    ) || code == "55006" // object in use: a slot still held by a dying walsender
}

/// An error with its causes, `a: b: c` (a cause already in the text is
/// not repeated).
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
