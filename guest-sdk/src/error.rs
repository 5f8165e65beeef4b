//! A transform's error: what the module tells the host when it refuses a
//! change or a batch.
//!
//! Owns [`Error`] (a message and, where known, the index of the input change
//! at fault), [`Result`], the [`Context`] extension and the [`bail!`] and
//! [`ensure!`](crate::ensure) macros. How an error becomes the ABI's error
//! envelope belongs to the glue (`abi`).

use std::fmt;

use crate::wire::GuestError;

/// A transform's error: a message and, where known, the input change at
/// fault.
///
/// Any `std::error::Error` converts into it with `?` (its message is the
/// error's `Display` followed by its sources, `: `-separated), and so do
/// `String` and `&str`. Like `anyhow::Error`, it does not itself implement
/// `std::error::Error`, which is what lets that blanket conversion exist.
///
/// When a `#[filter]`, `#[map]` or `#[flat_map]` function fails, the glue sets
/// the index of the change it was given unless the error already has one;
/// a `#[transform]` function sets it itself with [`Error::at`].
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    message: String,
    index: Option<u32>,
}

/// `std::result::Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error with this message and no change index.
    pub fn new(message: impl fmt::Display) -> Error {
        Error {
            message: message.to_string(),
            index: None,
        }
    }

    /// The same error, blaming input change number `index` (of the batch as
    /// the module received it).
    #[must_use]
    pub fn at(mut self, index: usize) -> Error {
        self.index = u32::try_from(index).ok();
        self
    }

    /// The message.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The input change at fault, if known.
    pub fn index(&self) -> Option<u32> {
        self.index
    }

    /// Blames change `index` unless the error already names one.
    pub(crate) fn or_at(mut self, index: u32) -> Error {
        self.index.get_or_insert(index);
        self
    }

    /// The wire form of the error.
    pub fn into_guest_error(self) -> GuestError {
        GuestError {
            message: self.message,
            index: self.index,
        }
    }
}

impl<E> From<E> for Error
where
    E: Into<Box<dyn std::error::Error>>,
{
    fn from(err: E) -> Error {
        let err: Box<dyn std::error::Error> = err.into();
        let mut message = err.to_string();
        let mut source = err.source();
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Error {
            message,
            index: None,
        }
    }
}

impl From<Error> for GuestError {
    fn from(err: Error) -> GuestError {
        err.into_guest_error()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(index) = self.index {
            write!(f, " (change {index})")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("message", &self.message)
            .field("index", &self.index)
            .finish()
    }
}

/// Adds a message to a failure, the way `anyhow::Context` does:
/// `row.get_str("email").context("no email")?`.
pub trait Context<T> {
    /// Turns `None` or an error into an [`Error`] saying `message` (followed
    /// by the original error's message, if any).
    fn context(self, message: impl fmt::Display) -> Result<T>;

    /// Like [`Context::context`], with a message built only on failure.
    fn with_context<M: fmt::Display>(self, message: impl FnOnce() -> M) -> Result<T>;
}

impl<T, E: Into<Error>> Context<T> for std::result::Result<T, E> {
    fn context(self, message: impl fmt::Display) -> Result<T> {
        self.map_err(|e| wrap(message, e.into()))
    }

    fn with_context<M: fmt::Display>(self, message: impl FnOnce() -> M) -> Result<T> {
        self.map_err(|e| wrap(message(), e.into()))
    }
}

impl<T> Context<T> for Option<T> {
    fn context(self, message: impl fmt::Display) -> Result<T> {
        self.ok_or_else(|| Error::new(message))
    }

    fn with_context<M: fmt::Display>(self, message: impl FnOnce() -> M) -> Result<T> {
        self.ok_or_else(|| Error::new(message()))
    }
}

fn wrap(message: impl fmt::Display, inner: Error) -> Error {
    Error {
        message: format!("{message}: {}", inner.message),
        index: inner.index,
    }
}

/// Returns early with an [`Error`](crate::Error) built like `format!`:
/// `bail!("column {name} is not text")`.
#[macro_export]
macro_rules! bail {
    ($($arg:tt)+) => {
        return ::core::result::Result::Err($crate::Error::new(::std::format!($($arg)+)).into())
    };
}

/// Returns early with an [`Error`](crate::Error) unless a condition holds:
/// `ensure!(row.contains("id"), "no id column")`.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($arg:tt)+) => {
        if !$cond {
            $crate::bail!($($arg)+);
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Outer(std::num::ParseIntError);
    impl fmt::Display for Outer {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bad count")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    fn parse(s: &str) -> Result<i64> {
        Ok(s.parse::<i64>()?)
    }

    #[test]
    fn converts_from_strings_and_std_errors() {
        assert_eq!(Error::from("plain").message(), "plain");
        assert_eq!(Error::from(String::from("owned")).message(), "owned");
        assert_eq!(
            parse("x").unwrap_err().message(),
            "invalid digit found in string"
        );
        let chained = Error::from(Outer("x".parse::<i64>().unwrap_err()));
        assert_eq!(
            chained.message(),
            "bad count: invalid digit found in string"
        );
    }

    #[test]
    fn index_is_kept_once_set() {
        let e = Error::new("boom").at(3).or_at(7);
        assert_eq!(e.index(), Some(3));
        assert_eq!(Error::new("boom").or_at(7).index(), Some(7));
        assert_eq!(e.to_string(), "boom (change 3)");
        assert_eq!(
            e.into_guest_error(),
            GuestError {
                message: "boom".into(),
                index: Some(3)
            }
        );
    }

    #[test]
    fn context_and_macros() {
        fn f(x: Option<i32>, limit: i32) -> Result<i32> {
            let x = x.context("no x")?;
            crate::ensure!(x < limit, "{x} is not below {limit}");
            if x == 0 {
                crate::bail!("zero");
            }
            Ok(x)
        }
        assert_eq!(f(None, 1).unwrap_err().message(), "no x");
        assert_eq!(f(Some(5), 1).unwrap_err().message(), "5 is not below 1");
        assert_eq!(f(Some(0), 1).unwrap_err().message(), "zero");
        assert_eq!(f(Some(1), 2), Ok(1));
        let e = "x".parse::<i32>().context("count").unwrap_err();
        assert_eq!(e.message(), "count: invalid digit found in string");
    }
}
