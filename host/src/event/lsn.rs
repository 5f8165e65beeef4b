//! Log sequence numbers: positions in PostgreSQL's write-ahead log.

use std::fmt;
use std::str::FromStr;

/// A position in the WAL, printed as PostgreSQL prints it (`16/B374D848`).
/// `Lsn::ZERO` is PostgreSQL's `InvalidXLogRecPtr`: "no position".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// `0/0`, "no position".
    pub const ZERO: Lsn = Lsn(0);

    /// Appends the text `Display` writes, without a formatter.
    pub(crate) fn write_to(self, out: &mut Vec<u8>) {
        fn hex(out: &mut Vec<u8>, half: u64) {
            const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
            let mut shift = 28;
            while shift > 0 && (half >> shift) & 0xF == 0 {
                shift -= 4;
            }
            loop {
                out.push(DIGITS[((half >> shift) & 0xF) as usize]);
                if shift == 0 {
                    break;
                }
                shift -= 4;
            }
        }
        hex(out, self.0 >> 32);
        out.push(b'/');
        hex(out, self.0 & 0xFFFF_FFFF);
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

/// The text was not an LSN of the form `HI/LO` in hexadecimal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an LSN: expected two hexadecimal numbers separated by `/`, like 16/B374D848")]
pub struct ParseLsnError(String);

impl FromStr for Lsn {
    type Err = ParseLsnError;

    fn from_str(s: &str) -> Result<Lsn, ParseLsnError> {
        let err = || ParseLsnError(s.to_owned());
        let (hi, lo) = s.trim().split_once('/').ok_or_else(err)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| err())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| err())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl From<u64> for Lsn {
    fn from(v: u64) -> Lsn {
        Lsn(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_and_parses_like_postgres() {
        let lsn: Lsn = "16/B374D848".parse().expect("valid");
        assert_eq!(lsn, Lsn(0x16_B374_D848));
        assert_eq!(lsn.to_string(), "16/B374D848");
        assert_eq!(Lsn::ZERO.to_string(), "0/0");
        assert_eq!(Lsn(u64::MAX).to_string(), "FFFFFFFF/FFFFFFFF");
        assert_eq!("ffffffff/ffffffff".parse::<Lsn>(), Ok(Lsn(u64::MAX)));
    }

    #[test]
    fn written_without_a_formatter_as_displayed() {
        for n in [
            0,
            1,
            0xF,
            0x10,
            0x16_B374_D848,
            1 << 32,
            0xA_0000_0000,
            u64::MAX,
        ] {
            let mut out = Vec::new();
            Lsn(n).write_to(&mut out);
            assert_eq!(String::from_utf8_lossy(&out), Lsn(n).to_string());
        }
    }

    #[test]
    fn rejects_what_is_not_an_lsn() {
        for bad in ["", "16", "16/", "/1", "x/1", "1/1/1", "100000000/0"] {
            assert!(bad.parse::<Lsn>().is_err(), "{bad:?} parsed");
        }
    }
}
