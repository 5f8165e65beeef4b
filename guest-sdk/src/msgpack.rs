//! Just enough MessagePack to find the parts of a message without decoding
//! them, and to write an envelope's frame around pieces encoded elsewhere.
//!
//! The ABI glue uses it to split a batch into one byte range per change (so a
//! filter decodes each change on its own, and a kept change is answered by
//! its index instead of being re-encoded), and to write `{"changes": [...]}`.
//! Encoding the wire types belongs to `rmp-serde`; decoding them to `read`
//! for the shapes it knows, and to `rmp-serde` for everything else.

use std::ops::Range;

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Malformed(pub(crate) String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A cursor over a MessagePack buffer.
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    /// A cursor at byte `pos` of `buf`.
    pub(crate) fn at(buf: &'a [u8], pos: usize) -> Reader<'a> {
        Reader { buf, pos }
    }

    /// The offset of the next byte.
    pub(crate) fn position(&self) -> usize {
        self.pos
    }

    /// Whether every byte was read.
    pub(crate) fn at_end(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// The next byte, not consumed.
    pub(crate) fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    pub(crate) fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&end| end <= self.buf.len())
            .ok_or_else(|| Malformed(format!("truncated at byte {}", self.pos)))?;
        let bytes = &self.buf[self.pos..end];
        self.pos = end;
        Ok(bytes)
    }

    pub(crate) fn byte(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }

    /// A big-endian unsigned integer of `n` bytes (1, 2 or 4).
    pub(crate) fn uint(&mut self, n: usize) -> Result<usize, Malformed> {
        let bytes = self.take(n)?;
        let mut v: u64 = 0;
        for b in bytes {
            v = (v << 8) | u64::from(*b);
        }
        usize::try_from(v).map_err(|_| Malformed("length out of range".into()))
    }

    /// Reads a map header; returns its number of entries.
    pub(crate) fn map_len(&mut self) -> Result<usize, Malformed> {
        let at = self.pos;
        match self.byte()? {
            m @ 0x80..=0x8f => Ok(usize::from(m & 0x0f)),
            0xde => self.uint(2),
            0xdf => self.uint(4),
            m => Err(Malformed(format!(
                "expected a map at byte {at}, found marker {m:#04x}"
            ))),
        }
    }

    /// Reads an array header; returns its number of elements.
    pub(crate) fn array_len(&mut self) -> Result<usize, Malformed> {
        let at = self.pos;
        match self.byte()? {
            m @ 0x90..=0x9f => Ok(usize::from(m & 0x0f)),
            0xdc => self.uint(2),
            0xdd => self.uint(4),
            m => Err(Malformed(format!(
                "expected an array at byte {at}, found marker {m:#04x}"
            ))),
        }
    }

    /// Reads a string, or returns `None` (having skipped the value) when the
    /// next value is not a string.
    pub(crate) fn str_or_skip(&mut self) -> Result<Option<&'a str>, Malformed> {
        let at = self.pos;
        let len = match self.byte()? {
            m @ 0xa0..=0xbf => usize::from(m & 0x1f),
            0xd9 => self.uint(1)?,
            0xda => self.uint(2)?,
            0xdb => self.uint(4)?,
            _ => {
                self.pos = at;
                self.skip()?;
                return Ok(None);
            }
        };
        let bytes = self.take(len)?;
        std::str::from_utf8(bytes)
            .map(Some)
            .map_err(|_| Malformed(format!("invalid UTF-8 in the string at byte {at}")))
    }

    /// Skips one value (with everything nested in it); returns its range.
    ///
    /// Iterative, so a deeply nested value cannot overflow the stack; every
    /// step consumes a byte, so it ends on any input.
    pub(crate) fn skip(&mut self) -> Result<Range<usize>, Malformed> {
        let start = self.pos;
        let mut pending: u64 = 1;
        while pending > 0 {
            pending -= 1;
            let at = self.pos;
            let marker = self.byte()?;
            let body = match marker {
                0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
                0x80..=0x8f => {
                    pending += 2 * u64::from(marker & 0x0f);
                    0
                }
                0x90..=0x9f => {
                    pending += u64::from(marker & 0x0f);
                    0
                }
                0xa0..=0xbf => usize::from(marker & 0x1f),
                0xc4 | 0xd9 => self.uint(1)?,
                0xc5 | 0xda => self.uint(2)?,
                0xc6 | 0xdb => self.uint(4)?,
                0xc7 => self.uint(1)? + 1,
                0xc8 => self.uint(2)? + 1,
                0xc9 => self.uint(4)? + 1,
                0xca => 4,
                0xcb => 8,
                0xcc | 0xd0 => 1,
                0xcd | 0xd1 => 2,
                0xce | 0xd2 => 4,
                0xcf | 0xd3 => 8,
                0xd4 => 2,
                0xd5 => 3,
                0xd6 => 5,
                0xd7 => 9,
                0xd8 => 17,
                0xdc => {
                    pending += self.uint(2)? as u64;
                    0
                }
                0xdd => {
                    pending += self.uint(4)? as u64;
                    0
                }
                0xde => {
                    pending += 2 * self.uint(2)? as u64;
                    0
                }
                0xdf => {
                    pending += 2 * self.uint(4)? as u64;
                    0
                }
                0xc1 => {
                    return Err(Malformed(format!("invalid marker 0xc1 at byte {at}")));
                }
            };
            self.take(body)?;
        }
        Ok(start..self.pos)
    }
}

/// Whether `a` and `b` hold the same bytes: slice equality, eight bytes at
/// a time. On wasm32 `==` on slices is a call to a `memcmp` that compares
/// one byte at a time, and the batch readers compare the first hundreds of
/// bytes of every change with the last change's.
pub(crate) fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let word = |w: &[u8]| <[u8; 8]>::try_from(w).ok().map(u64::from_ne_bytes);
    let (mut x, mut y) = (a.chunks_exact(8), b.chunks_exact(8));
    for (p, q) in (&mut x).zip(&mut y) {
        if word(p) != word(q) {
            return false;
        }
    }
    x.remainder().iter().eq(y.remainder())
}

/// Appends an array header for `len` elements.
pub(crate) fn write_array_len(out: &mut Vec<u8>, len: u32) {
    if len < 16 {
        out.push(0x90 | len as u8);
    } else if let Ok(len) = u16::try_from(len) {
        out.push(0xdc);
        out.extend_from_slice(&len.to_be_bytes());
    } else {
        out.push(0xdd);
        out.extend_from_slice(&len.to_be_bytes());
    }
}

/// Appends an unsigned integer in its shortest form.
pub(crate) fn write_uint(out: &mut Vec<u8>, v: u32) {
    if v < 128 {
        out.push(v as u8);
    } else if let Ok(v) = u8::try_from(v) {
        out.extend_from_slice(&[0xcc, v]);
    } else if let Ok(v) = u16::try_from(v) {
        out.push(0xcd);
        out.extend_from_slice(&v.to_be_bytes());
    } else {
        out.push(0xce);
        out.extend_from_slice(&v.to_be_bytes());
    }
}

/// The bytes of `{"changes": ` (a one-entry map and its key).
pub(crate) const CHANGES_PREFIX: &[u8] = b"\x81\xa7changes";

/// The largest array header [`write_array_len`] writes.
pub(crate) const MAX_ARRAY_HEADER: usize = 5;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Batch, Change, Envelope, Op, Output, Row, Txn, Value, to_msgpack};

    #[test]
    fn same_bytes_is_slice_equality() {
        let bytes: Vec<u8> = (0..40u8).collect();
        for len in 0..bytes.len() {
            let a = &bytes[..len];
            assert!(same_bytes(a, a));
            assert!(!same_bytes(a, &bytes[..len + 1]));
            for at in 0..len {
                let mut b = a.to_vec();
                b[at] ^= 0x80;
                assert!(!same_bytes(a, &b), "{len} {at}");
            }
        }
    }

    #[test]
    fn skip_finds_every_value_of_a_batch() {
        let mut change = Change::new(Op::Insert, "public", "t");
        change.new = Some(Row::from_fields(vec![
            ("a".into(), Value::Int(-70_000)),
            ("b".into(), Value::Text("x".repeat(300))),
            ("c".into(), Value::Bytes(vec![1; 70_000])),
            ("d".into(), Value::Float(1.5)),
            ("e".into(), Value::Array(vec![Value::Null; 20])),
            ("f".into(), Value::Uuid([3; 16])),
        ]));
        let batch = Batch {
            txn: Txn::default(),
            changes: vec![change.clone(); 3],
        };
        let bytes = to_msgpack(&batch).expect("encode");
        let mut r = Reader::new(&bytes);
        assert_eq!(r.map_len(), Ok(2));
        assert_eq!(r.str_or_skip(), Ok(Some("txn")));
        r.skip().expect("txn");
        assert_eq!(r.str_or_skip(), Ok(Some("changes")));
        assert_eq!(r.array_len(), Ok(3));
        let one = to_msgpack(&change).expect("encode");
        for _ in 0..3 {
            let range = r.skip().expect("change");
            assert_eq!(&bytes[range], &one[..]);
        }
        assert!(r.at_end());
    }

    #[test]
    fn truncated_and_invalid_input_is_an_error_not_a_panic() {
        let bytes = to_msgpack(&Value::Text("hello".into())).expect("encode");
        for cut in 0..bytes.len() {
            assert!(Reader::new(&bytes[..cut]).skip().is_err());
        }
        assert!(Reader::new(&[0xc1]).skip().is_err());
        // An array claiming 2^32-1 elements in a short buffer.
        assert!(
            Reader::new(&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x01])
                .skip()
                .is_err()
        );
        // Deep nesting does not recurse.
        let deep = vec![0x91; 1_000_000];
        assert!(Reader::new(&deep).skip().is_err());
    }

    #[test]
    fn writers_agree_with_rmp_serde() {
        for n in [
            0u32,
            1,
            15,
            16,
            127,
            128,
            255,
            256,
            65_535,
            65_536,
            u32::MAX,
        ] {
            let mut ours = Vec::new();
            write_uint(&mut ours, n);
            assert_eq!(ours, to_msgpack(&n).expect("encode"), "uint {n}");
        }
        for n in [0u32, 15, 16, 65_535, 65_536] {
            let mut ours = Vec::new();
            write_array_len(&mut ours, n);
            let mut r = Reader::new(&ours);
            assert_eq!(r.array_len(), Ok(n as usize));
            assert!(ours.len() <= MAX_ARRAY_HEADER);
        }
        let mut envelope = CHANGES_PREFIX.to_vec();
        write_array_len(&mut envelope, 1);
        write_uint(&mut envelope, 300);
        assert_eq!(
            crate::wire::from_msgpack::<Envelope>(&envelope).expect("decode"),
            Envelope::Changes {
                changes: vec![Output::Keep(300)]
            }
        );
    }
}
