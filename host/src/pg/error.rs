//! What PostgreSQL's errors mean: which SQLSTATEs pass, and an error with
//! its causes as one line.

/// Whether an error of this SQLSTATE describes a passing condition.
pub(crate) fn transient_sqlstate(code: &str) -> bool {
    matches!(
        sqlstate_class(code),
        "08" // connection exception
        | "40" // transaction rollback
        | "53" // insufficient resources
        | "57" // operator intervention: shutdown, terminated backend
        | "58" // system error
    ) || code == "55006" // object in use: a slot still held by a dying walsender
}

/// The class of a SQLSTATE: its first two characters (all of it when
/// shorter, nothing when those are not two whole characters: a server's
/// text is never sliced inside a character).
pub(crate) fn sqlstate_class(code: &str) -> &str {
    code.get(..2)
        .unwrap_or(if code.len() < 2 { code } else { "" })
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A SQLSTATE whose first character is not one byte (from a server
    /// that is not PostgreSQL, or a peer on the network) panicked where
    /// its class was sliced off.
    #[test]
    fn a_sqlstate_of_wide_characters_has_no_class_and_does_not_panic() {
        assert_eq!(sqlstate_class("08006"), "08");
        assert_eq!(sqlstate_class("4"), "4");
        assert_eq!(sqlstate_class("é1234"), "é");
        assert_eq!(sqlstate_class("€0000"), "");
        assert!(!transient_sqlstate("€0000"));
        assert!(transient_sqlstate("57P01"));
    }
}
