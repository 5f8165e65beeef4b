//! Ordinary SQL connections (tokio-postgres) with the TLS settings a
//! [`ConnInfo`] asks for, and what a failure to connect means.

use tokio_postgres::Client;

use super::conninfo::ConnInfo;
use super::error::{error_chain, transient_sqlstate};
use super::tls::{self, TlsError};

/// Why a connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The server could not be reached, or refused the connection.
    #[error("cannot connect to {target}: {reason}")]
    Refused {
        /// The connection target, without password.
        target: String,
        /// Why (never the password).
        reason: String,
        /// Whether trying again may help (an unreachable server or one
        /// starting up may come back; a missing database or a refused
        /// certificate will not).
        transient: bool,
    },
    /// The server refused the login.
    #[error("authentication failed for user `{user}`: {reason}")]
    Auth {
        /// The role.
        user: String,
        /// Why (never the password).
        reason: String,
    },
    /// TLS could not be set up as `sslmode` demands.
    #[error(transparent)]
    Tls(#[from] TlsError),
}

impl ConnectError {
    /// Whether trying again may help.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ConnectError::Refused {
                transient: true,
                ..
            }
        )
    }
}

/// Opens an ordinary SQL connection and drives it on a task.
pub(crate) async fn connect(info: &ConnInfo) -> Result<Client, ConnectError> {
    let config = info.tokio_postgres_config();
    let client = match tls::connector(info)? {
        None => {
            let (client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(|e| connect_error(info, e))?;
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "SQL connection ended");
                }
            });
            client
        }
        Some(tls) => {
            let (client, connection) = config
                .connect(tls)
                .await
                .map_err(|e| connect_error(info, e))?;
            tokio::spawn(async move {
                if let Err(err) = connection.await {
                    tracing::debug!(error = %err, "SQL connection ended");
                }
            });
            client
        }
    };
    Ok(client)
}

/// Asks the server to cancel what `client`'s session is running (a
/// statement waiting for a lock, say), over a connection of its own, as
/// `client` was made (TLS included). Gives up after `within`; what went
/// wrong is logged, not returned: the session is being left either way.
pub(crate) async fn cancel(info: &ConnInfo, client: &Client, within: std::time::Duration) {
    let token = client.cancel_token();
    let sent = tokio::time::timeout(within, async {
        match tls::connector(info) {
            Ok(None) => token.cancel_query(tokio_postgres::NoTls).await,
            Ok(Some(tls)) => token.cancel_query(tls).await,
            Err(err) => {
                tracing::debug!(error = %err, "no TLS for the cancel request");
                Ok(())
            }
        }
    })
    .await;
    match sent {
        Ok(Ok(())) => {}
        Ok(Err(err)) => {
            tracing::warn!(error = %err, "asking the server to cancel a statement failed")
        }
        Err(_) => tracing::warn!("asking the server to cancel a statement timed out"),
    }
}

fn connect_error(info: &ConnInfo, err: tokio_postgres::Error) -> ConnectError {
    if let Some(db) = err.as_db_error()
        && db.code().code().starts_with("28")
    {
        return ConnectError::Auth {
            user: info.user.clone(),
            reason: db.message().to_owned(),
        };
    }
    // A server's refusal is as transient as its SQLSTATE says: a server
    // starting up or shutting down (57P03, 57P01) comes back, a missing
    // database (3D000) does not. A refused certificate comes back wrapped
    // by tokio-postgres; it is as definite as on the replication
    // connection.
    let mut transient = err
        .as_db_error()
        .is_none_or(|db| transient_sqlstate(db.code().code()));
    let mut source = std::error::Error::source(&err);
    while let Some(cause) = source {
        if let Some(tls) = cause.downcast_ref::<TlsError>() {
            transient = tls.is_transient();
        }
        source = cause.source();
    }
    // tokio-postgres errors name the failing step, never the password.
    ConnectError::Refused {
        target: info.redacted(),
        reason: error_chain(&err),
        transient,
    }
}
