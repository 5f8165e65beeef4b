//! Rows of `COPY ... TO STDOUT` in PostgreSQL's text format, as a copy's
//! chunks arrive: one row per message, its fields separated by tabs, `\N`
//! for NULL, and backslash escapes for backslashes and control characters
//! in the values.
//!
//! Owns splitting a row into fields and undoing the escapes. What a field's
//! text means is the values' parser's business (`host/src/event/values.rs`):
//! `COPY` writes each value with the same output function, under the same
//! session settings, as a query's text result does.

/// A row's text without its line end, checked to be UTF-8 (the whole line
/// at once: escapes are ASCII, so every field of it is UTF-8 too unless an
/// escape names a byte).
pub(crate) fn line(data: &[u8]) -> Result<&str, String> {
    let data = data.strip_suffix(b"\n").unwrap_or(data);
    std::str::from_utf8(data).map_err(|e| format!("a row of the copy is not UTF-8 ({e})"))
}

/// The raw (still escaped) fields of `line`, in order.
pub(crate) fn fields(line: &str) -> Fields<'_> {
    Fields { rest: Some(line) }
}

/// See [`fields`].
pub(crate) struct Fields<'a> {
    rest: Option<&'a str>,
}

impl<'a> Iterator for Fields<'a> {
    type Item = &'a str;

    fn next(&mut self) -> Option<&'a str> {
        let rest = self.rest?;
        // A tab in the data is written `\t`: every tab ends a field.
        match memchr::memchr(b'\t', rest.as_bytes()) {
            Some(at) => {
                self.rest = Some(&rest[at + 1..]);
                Some(&rest[..at])
            }
            None => {
                self.rest = None;
                Some(rest)
            }
        }
    }
}

/// A raw field's value: `None` for NULL, else its text, borrowed from the
/// field when it has no escapes and written into `scratch` when it has.
/// Reads every escape `COPY FROM` reads (`\b \f \n \r \t \v`, octal `\0`
/// to `\377`, `\x` with one or two hex digits, and a backslash before any
/// other character standing for that character), though `COPY TO` writes
/// only the named ones and `\\`.
pub(crate) fn decode<'s>(
    raw: &'s str,
    scratch: &'s mut Vec<u8>,
) -> Result<Option<&'s str>, String> {
    if raw == "\\N" {
        return Ok(None);
    }
    let bytes = raw.as_bytes();
    let Some(first) = memchr::memchr(b'\\', bytes) else {
        return Ok(Some(raw));
    };
    scratch.clear();
    scratch.extend_from_slice(&bytes[..first]);
    let mut i = first;
    while i < bytes.len() {
        let b = bytes[i];
        if b != b'\\' {
            scratch.push(b);
            i += 1;
            continue;
        }
        let Some(&c) = bytes.get(i + 1) else {
            return Err(format!(
                "a field of the copy ends in a lone backslash: {raw:?}"
            ));
        };
        i += 2;
        match c {
            b'b' => scratch.push(0x08),
            b'f' => scratch.push(0x0c),
            b'n' => scratch.push(b'\n'),
            b'r' => scratch.push(b'\r'),
            b't' => scratch.push(b'\t'),
            b'v' => scratch.push(0x0b),
            b'0'..=b'7' => {
                let mut value = u32::from(c - b'0');
                for _ in 0..2 {
                    match bytes.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            value = value * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                // Three octal digits reach 0o777; COPY FROM keeps the low byte.
                scratch.push((value & 0xff) as u8);
            }
            b'x' if bytes.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut value = 0u8;
                for _ in 0..2 {
                    match bytes.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            value = value * 16 + d as u8;
                            i += 1;
                        }
                        None => break,
                    }
                }
                scratch.push(value);
            }
            other => scratch.push(other),
        }
    }
    std::str::from_utf8(scratch)
        .map(Some)
        .map_err(|e| format!("a field of the copy is not UTF-8 once unescaped ({e}): {raw:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(raw: &str) -> Result<Option<String>, String> {
        let mut scratch = Vec::new();
        decode(raw, &mut scratch).map(|v| v.map(str::to_owned))
    }

    #[test]
    fn a_row_splits_at_every_tab_and_keeps_empty_fields() {
        let row = line(b"1\t\tab c\t\\N\t\n").expect("utf-8");
        assert_eq!(
            fields(row).collect::<Vec<_>>(),
            ["1", "", "ab c", "\\N", ""]
        );
        assert_eq!(fields("").collect::<Vec<_>>(), [""]);
        assert!(line(b"\xff\n").is_err());
    }

    #[test]
    fn escapes_read_as_copy_from_reads_them() {
        assert_eq!(decoded("\\N"), Ok(None));
        assert_eq!(decoded("\\\\N"), Ok(Some("\\N".into())));
        assert_eq!(decoded("\\Nx"), Ok(Some("Nx".into())));
        assert_eq!(decoded(""), Ok(Some(String::new())));
        assert_eq!(
            decoded("a\\tb\\nc\\rd\\\\e\\bf\\fg\\vh"),
            Ok(Some("a\tb\nc\rd\\e\x08f\x0cg\x0bh".into()))
        );
        assert_eq!(decoded("\\101\\0\\12x\\7"), Ok(Some("A\0\nx\x07".into())));
        assert_eq!(decoded("\\x41\\x4g\\xz"), Ok(Some("A\x04gxz".into())));
        assert_eq!(decoded("\\é\\'"), Ok(Some("é'".into())));
        assert_eq!(decoded("\\\\x00ff"), Ok(Some("\\x00ff".into())));
        assert!(decoded("ab\\").is_err());
        assert!(decoded("\\377").is_err(), "a lone 0xff byte is not UTF-8");
        assert_eq!(decoded("\\303\\251"), Ok(Some("é".into())));
    }

    #[test]
    fn every_text_escaped_as_copy_to_escapes_it_reads_back() {
        // COPY TO's escaping (CopyAttributeOutText): backslash and the
        // control characters with a name; every other byte as it is.
        fn escape(text: &str) -> String {
            let mut out = String::new();
            for c in text.chars() {
                match c {
                    '\\' => out.push_str("\\\\"),
                    '\x08' => out.push_str("\\b"),
                    '\x0c' => out.push_str("\\f"),
                    '\n' => out.push_str("\\n"),
                    '\r' => out.push_str("\\r"),
                    '\t' => out.push_str("\\t"),
                    '\x0b' => out.push_str("\\v"),
                    c => out.push(c),
                }
            }
            out
        }
        let texts = [
            "plain",
            "",
            "\\N",
            "N",
            "\\",
            "\\\\",
            "tab\there",
            "line\nend\r\n",
            "{\"a\\\\b\"}",
            "\\x0a0b",
            "ü\u{1}\u{7f}\u{1f600}",
            "\x08\x0b\x0c",
            "ends with \\",
        ];
        let row = texts
            .iter()
            .map(|t| escape(t))
            .collect::<Vec<_>>()
            .join("\t")
            + "\n";
        let row = line(row.as_bytes()).expect("utf-8");
        let read: Vec<String> = fields(row)
            .map(|raw| decoded(raw).expect("decodes").expect("not NULL"))
            .collect();
        assert_eq!(read, texts);
    }
}
