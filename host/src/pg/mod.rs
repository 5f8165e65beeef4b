//! PostgreSQL primitives that every part speaking to a server shares: the
//! source, the `postgres` sink, `datum check` and `datum record` —
//! connection strings in libpq syntax, TLS with `sslmode`'s meaning, opening
//! an ordinary SQL connection, quoting, and what errors mean.
//!
//! It knows nothing of replication (the source's protocol is in
//! `source/replication.rs`) nor of Datum's own errors: each caller maps
//! [`ConnectError`] into its own.

mod connect;
pub(crate) mod conninfo;
mod error;
mod quote;
pub(crate) mod tls;

pub(crate) use connect::{ConnectError, cancel, connect};
pub(crate) use conninfo::{ConnInfo, Host, SslMode};
pub(crate) use error::{error_chain, sqlstate_class, transient_sqlstate};
pub(crate) use quote::{quote_ident, quote_literal};
pub(crate) use tls::TlsError;
