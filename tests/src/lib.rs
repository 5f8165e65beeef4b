//! Support for Datum's integration tests: connecting to throwaway clusters.
//!
//! The cluster harness itself lives in [`datum::throwaway`] because `datum
//! demo` and the benchmarks use it too; this crate adds what only tests need.

pub use datum::throwaway::{Cluster, PasswordAuth};

/// Connects with tokio-postgres and drives the connection on a task.
/// Panics with the server's message if the connection fails: tests want the
/// reason, not an `Err` to unwrap.
pub async fn connect(conninfo: &str) -> tokio_postgres::Client {
    try_connect(conninfo)
        .await
        .unwrap_or_else(|err| panic!("connecting with `{conninfo}`: {err}"))
}

/// Like [`connect`], but returns the error (for authentication tests).
pub async fn try_connect(conninfo: &str) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let (client, connection) = tokio_postgres::connect(conninfo, tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        // The connection ends when the client is dropped or the server goes.
        let _ = connection.await;
    });
    Ok(client)
}

/// Starts a cluster with the default settings, panicking with the harness's
/// explanation (e.g. which packages to install) if it cannot.
pub fn cluster() -> Cluster {
    Cluster::start().unwrap_or_else(|err| panic!("starting a throwaway PostgreSQL: {err}"))
}

pub mod stream;
