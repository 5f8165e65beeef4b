//! The replication connection: the PostgreSQL wire protocol spoken directly
//! over tokio, because tokio-postgres cannot open a walsender connection.
//!
//! Owns the transport (TCP, unix socket, TLS through [`super::tls`]), the
//! startup and authentication exchange (trust, cleartext, MD5, SCRAM-SHA-256
//! with channel binding over TLS), the simple-query protocol used for
//! replication commands, and the COPY-both stream of `XLogData` and keepalive
//! frames with the standby status updates that answer them.
//!
//! It does not own what the frames mean (see [`super::pgoutput`] and
//! [`super::stream`]), nor ordinary SQL (tokio-postgres does that).
//!
//! The password is only ever handed to the authentication code; no error or
//! log line built here contains it.

use std::time::{Duration, Instant, SystemTime};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{self, ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::SourceError;
use crate::event::Lsn;
use crate::pg::tls;
use crate::pg::{ConnInfo, Host, SslMode};

/// Microseconds between the Unix epoch and PostgreSQL's (2000-01-01).
pub(crate) const PG_EPOCH_OFFSET_MICROS: i64 = 946_684_800_000_000;

/// Settings sent in the startup packet. They fix the text form of every value
/// the walsender sends, which [`super::values`] parses.
pub(crate) const SESSION_SETTINGS: [(&str, &str); 7] = [
    ("client_encoding", "UTF8"),
    ("DateStyle", "ISO, MDY"),
    ("TimeZone", "UTC"),
    ("IntervalStyle", "iso_8601"),
    ("extra_float_digits", "3"),
    ("bytea_output", "hex"),
    // Literals Datum writes (a copy's stored position) double quotes only.
    ("standard_conforming_strings", "on"),
];

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// An error or notice sent by the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    /// `ERROR`, `FATAL`, `PANIC` (or `WARNING`... for notices).
    pub severity: String,
    /// The SQLSTATE code.
    pub code: String,
    /// The primary message.
    pub message: String,
    /// The detail, if any.
    pub detail: Option<String>,
    /// The hint, if any.
    pub hint: Option<String>,
}

impl std::fmt::Display for ServerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} (SQLSTATE {})",
            self.severity, self.message, self.code
        )?;
        if let Some(detail) = &self.detail {
            write!(f, "; {detail}")?;
        }
        if let Some(hint) = &self.hint {
            write!(f, "; hint: {hint}")?;
        }
        Ok(())
    }
}

impl ServerError {
    fn parse(mut body: &[u8]) -> ServerError {
        let mut err = ServerError {
            severity: String::new(),
            code: String::new(),
            message: String::new(),
            detail: None,
            hint: None,
        };
        while let Some((&kind, rest)) = body.split_first() {
            if kind == 0 {
                break;
            }
            let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
            let value = String::from_utf8_lossy(&rest[..end]).into_owned();
            body = rest.get(end + 1..).unwrap_or_default();
            match kind {
                b'V' => err.severity = value,
                b'S' if err.severity.is_empty() => err.severity = value,
                b'C' => err.code = value,
                b'M' => err.message = value,
                b'D' => err.detail = Some(value),
                b'H' => err.hint = Some(value),
                _ => {}
            }
        }
        err
    }
}

/// A frame of the replication stream.
#[derive(Debug)]
pub(crate) enum Frame {
    /// WAL data: one pgoutput message.
    XLogData { wal_end: Lsn, data: Bytes },
    /// The server's keepalive; `reply` asks for an immediate status update.
    Keepalive { wal_end: Lsn, reply: bool },
    /// The server ended the stream (e.g. the slot was dropped).
    CopyDone,
}

/// A connection to a walsender (`replication=database`).
pub(crate) struct Connection {
    io: Box<dyn Io>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    backend_pid: i32,
    streaming: bool,
    /// When the last read returned, and how much it brought.
    last_read: Option<(Instant, usize)>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("backend_pid", &self.backend_pid)
            .field("streaming", &self.streaming)
            .finish_non_exhaustive()
    }
}

const READ_CHUNK: usize = 128 * 1024;

/// While the stream is busy, how long a read that found the socket empty
/// lets the walsender's messages gather before it waits on the socket.
///
/// The walsender writes each change as a message of its own. A reader that
/// keeps up empties the socket every few messages and goes to sleep on it,
/// and the next message wakes it: a thread switch on each side for a
/// handful of changes, a large share of both processes' CPU time per
/// change. Pausing first lets a read take a few dozen messages at once, and
/// the walsender writes meanwhile without waking anyone. The pause is
/// shorter than the time the walsender needs to fill a unix socket (about
/// 0.5 ms for its ~200 small messages at full speed), so it does not hold
/// the walsender up; `docs/benchmarks.md` (Reads gathered) has the
/// measurements.
const GATHER: Duration = Duration::from_micros(150);

/// A stream counts as busy when the last read came back within this of the
/// next one being needed...
const BUSY_WITHIN: Duration = Duration::from_micros(500);

/// ...and brought less than this; a larger read says the walsender is ahead
/// (the socket holds more): read again at once.
const BUSY_BELOW: usize = 32 * 1024;

impl Connection {
    /// Connects and authenticates, with `replication=database` in the
    /// startup packet.
    pub(crate) async fn connect(info: &ConnInfo) -> Result<Connection, SourceError> {
        let timeout = info.connect_timeout.unwrap_or(Duration::from_secs(30));
        match tokio::time::timeout(timeout, Connection::connect_inner(info)).await {
            Ok(result) => result,
            Err(_) => Err(SourceError::Connect {
                target: info.redacted(),
                reason: format!("timed out after {timeout:?}"),
                transient: true,
            }),
        }
    }

    async fn connect_inner(info: &ConnInfo) -> Result<Connection, SourceError> {
        let connect_err = |err: std::io::Error| SourceError::Connect {
            target: info.redacted(),
            reason: err.to_string(),
            transient: true,
        };
        let mut end_point = None;
        let io: Box<dyn Io> = match &info.host {
            Host::Unix(_) => {
                let path = info.socket_path().unwrap_or_default();
                Box::new(UnixStream::connect(&path).await.map_err(connect_err)?)
            }
            Host::Tcp(host) => {
                // hostaddr, when given, is where to connect; host stays the
                // name that TLS verifies.
                let tcp = match info.hostaddr {
                    Some(addr) => TcpStream::connect((addr, info.port)).await,
                    None => TcpStream::connect((host.as_str(), info.port)).await,
                };
                let mut tcp = tcp.map_err(connect_err)?;
                tcp.set_nodelay(true).map_err(connect_err)?;
                match tls::connector(info)? {
                    None => Box::new(tcp),
                    Some(tls) => {
                        if negotiate_ssl(&mut tcp).await.map_err(connect_err)? {
                            let stream = tls.handshake(tcp).await?;
                            end_point = tls::server_end_point(&stream);
                            Box::new(stream)
                        } else if tls.mode() == SslMode::Prefer {
                            Box::new(tcp)
                        } else {
                            return Err(SourceError::Connect {
                                target: info.redacted(),
                                reason: format!(
                                    "the server does not support SSL, but sslmode={} \
                                     requires it: enable ssl on the server or use sslmode=prefer",
                                    tls.mode()
                                ),
                                transient: false,
                            });
                        }
                    }
                }
            }
        };
        let mut conn = Connection {
            io,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(1024),
            backend_pid: 0,
            streaming: false,
            last_read: None,
        };
        conn.startup(info, end_point).await?;
        Ok(conn)
    }

    /// The walsender's process id, as `pg_stat_replication.pid` shows it.
    pub(crate) fn backend_pid(&self) -> i32 {
        self.backend_pid
    }

    async fn startup(
        &mut self,
        info: &ConnInfo,
        end_point: Option<Vec<u8>>,
    ) -> Result<(), SourceError> {
        let mut params: Vec<(&str, &str)> = vec![
            ("user", info.user.as_str()),
            ("database", info.dbname.as_str()),
            ("replication", "database"),
            (
                "application_name",
                info.application_name.as_deref().unwrap_or("datum"),
            ),
        ];
        params.extend(SESSION_SETTINGS);
        if let Some(options) = &info.options {
            params.push(("options", options.as_str()));
        }
        frontend::startup_message(params.iter().copied(), &mut self.wbuf)
            .map_err(|e| SourceError::Protocol(format!("encoding the startup message: {e}")))?;
        self.flush().await?;

        let mut scram: Option<ScramSha256> = None;
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'R' => {
                    let mut body = body;
                    if body.len() < 4 {
                        return Err(SourceError::Protocol("short authentication message".into()));
                    }
                    let code = body.get_i32();
                    match code {
                        0 => {}
                        3 => {
                            let password = self.password(info)?;
                            frontend::password_message(password.as_bytes(), &mut self.wbuf)
                                .map_err(|e| SourceError::Protocol(e.to_string()))?;
                            self.flush().await?;
                        }
                        5 => {
                            if body.len() < 4 {
                                return Err(SourceError::Protocol("short MD5 salt".into()));
                            }
                            let mut salt = [0u8; 4];
                            salt.copy_from_slice(&body[..4]);
                            let password = self.password(info)?;
                            let hash = md5_hash(info.user.as_bytes(), password.as_bytes(), salt);
                            frontend::password_message(hash.as_bytes(), &mut self.wbuf)
                                .map_err(|e| SourceError::Protocol(e.to_string()))?;
                            self.flush().await?;
                        }
                        10 => {
                            let mechanisms: Vec<&[u8]> = body[..]
                                .split(|&b| b == 0)
                                .filter(|m| !m.is_empty())
                                .collect();
                            let has = |m: &str| mechanisms.contains(&m.as_bytes());
                            let (mechanism, binding) = match &end_point {
                                Some(hash) if has(sasl::SCRAM_SHA_256_PLUS) => (
                                    sasl::SCRAM_SHA_256_PLUS,
                                    ChannelBinding::tls_server_end_point(hash.clone()),
                                ),
                                Some(_) => (sasl::SCRAM_SHA_256, ChannelBinding::unrequested()),
                                None => (sasl::SCRAM_SHA_256, ChannelBinding::unsupported()),
                            };
                            if !has(sasl::SCRAM_SHA_256) && mechanism == sasl::SCRAM_SHA_256 {
                                return Err(SourceError::Auth {
                                    user: info.user.clone(),
                                    reason: "the server offers no SASL mechanism Datum \
                                             supports (SCRAM-SHA-256)"
                                        .into(),
                                });
                            }
                            let password = self.password(info)?;
                            let client = ScramSha256::new(password.as_bytes(), binding);
                            frontend::sasl_initial_response(
                                mechanism,
                                client.message(),
                                &mut self.wbuf,
                            )
                            .map_err(|e| SourceError::Protocol(e.to_string()))?;
                            scram = Some(client);
                            self.flush().await?;
                        }
                        11 => {
                            let client = scram.as_mut().ok_or_else(|| {
                                SourceError::Protocol("SASL continue without a SASL start".into())
                            })?;
                            client.update(&body).map_err(|e| SourceError::Auth {
                                user: info.user.clone(),
                                reason: format!("SCRAM exchange failed: {e}"),
                            })?;
                            frontend::sasl_response(client.message(), &mut self.wbuf)
                                .map_err(|e| SourceError::Protocol(e.to_string()))?;
                            self.flush().await?;
                        }
                        12 => {
                            let client = scram.as_mut().ok_or_else(|| {
                                SourceError::Protocol("SASL final without a SASL start".into())
                            })?;
                            client.finish(&body).map_err(|e| SourceError::Auth {
                                user: info.user.clone(),
                                reason: format!(
                                    "the server's SCRAM signature did not verify ({e}): \
                                     it may not know the password it claims to"
                                ),
                            })?;
                        }
                        other => {
                            return Err(SourceError::Auth {
                                user: info.user.clone(),
                                reason: format!(
                                    "the server asks for authentication method {other}, which \
                                     Datum does not support (use scram-sha-256, md5, password \
                                     or trust in pg_hba.conf)"
                                ),
                            });
                        }
                    }
                }
                b'K' => {
                    let mut body = body;
                    if body.len() >= 4 {
                        self.backend_pid = body.get_i32();
                    }
                }
                b'S' => {}
                b'N' => log_notice(&body),
                b'Z' => return Ok(()),
                b'E' => {
                    let err = ServerError::parse(&body);
                    return Err(if err.code.starts_with("28") {
                        SourceError::Auth {
                            user: info.user.clone(),
                            reason: err.to_string(),
                        }
                    } else {
                        SourceError::Server(err)
                    });
                }
                other => {
                    return Err(SourceError::Protocol(format!(
                        "unexpected message `{}` during startup",
                        other as char
                    )));
                }
            }
        }
    }

    fn password<'a>(&self, info: &'a ConnInfo) -> Result<&'a str, SourceError> {
        info.password
            .as_ref()
            .map(|p| p.expose())
            .ok_or_else(|| SourceError::Auth {
                user: info.user.clone(),
                reason: "the server asks for a password and none was given: add password= to \
                         the connection string, or set PGPASSWORD"
                    .into(),
            })
    }

    /// Sends `START_REPLICATION` and waits for the COPY-both stream to open.
    pub(crate) async fn start_replication(&mut self, command: &str) -> Result<(), SourceError> {
        frontend::query(command, &mut self.wbuf)
            .map_err(|e| SourceError::Protocol(e.to_string()))?;
        self.flush().await?;
        loop {
            let (tag, body) = self.read_message().await?;
            match tag {
                b'W' => {
                    self.streaming = true;
                    return Ok(());
                }
                b'N' => log_notice(&body),
                b'S' => {}
                b'E' => {
                    let err = ServerError::parse(&body);
                    // Drain to ReadyForQuery so the connection stays usable.
                    loop {
                        let (tag, _) = self.read_message().await?;
                        if tag == b'Z' {
                            break;
                        }
                    }
                    return Err(SourceError::Server(err));
                }
                other => {
                    return Err(SourceError::Protocol(format!(
                        "unexpected message `{}` in reply to START_REPLICATION",
                        other as char
                    )));
                }
            }
        }
    }

    /// Whether a whole message is already buffered, so that [`recv`] would
    /// not wait for the socket.
    ///
    /// [`recv`]: Connection::recv
    pub(crate) fn has_message(&self) -> bool {
        self.rbuf.len() >= 5 && {
            let len = u32::from_be_bytes([self.rbuf[1], self.rbuf[2], self.rbuf[3], self.rbuf[4]]);
            self.rbuf.len() > len as usize
        }
    }

    /// Receives the next frame of the replication stream. Cancel-safe: a
    /// frame is either returned whole or left in the buffer.
    pub(crate) async fn recv(&mut self) -> Result<Frame, SourceError> {
        loop {
            if let Some(frame) = self.try_recv()? {
                return Ok(frame);
            }
            self.fill().await?;
        }
    }

    /// The next frame if one is already buffered, without waiting.
    pub(crate) fn try_recv(&mut self) -> Result<Option<Frame>, SourceError> {
        while let Some((tag, body)) = self.take_message()? {
            match tag {
                b'd' => return parse_copy_data(body.freeze()).map(Some),
                // The server ends a stream with CopyDone, or, on a clean
                // shutdown, with CommandComplete (`COPY 0`) and no CopyDone
                // (`docs/architecture.md`, pitfall 15); ReadyForQuery may follow either. Each is a
                // reason to reconnect, never a protocol violation.
                b'c' | b'C' | b'Z' => return Ok(Some(Frame::CopyDone)),
                b'N' => log_notice(&body),
                b'S' => {}
                b'E' => return Err(SourceError::Server(ServerError::parse(&body))),
                other => {
                    return Err(SourceError::Protocol(format!(
                        "unexpected message `{}` in the replication stream",
                        other as char
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Sends a standby status update. `write` is what we received, `flush`
    /// and `apply` what is durably checkpointed (`Lsn::ZERO`: nothing yet).
    pub(crate) async fn send_status(
        &mut self,
        write: Lsn,
        flush: Lsn,
        apply: Lsn,
        reply: bool,
    ) -> Result<(), SourceError> {
        self.wbuf.put_u8(b'd');
        self.wbuf.put_i32(4 + 1 + 8 * 4 + 1);
        self.wbuf.put_u8(b'r');
        self.wbuf.put_u64(write.0);
        self.wbuf.put_u64(flush.0);
        self.wbuf.put_u64(apply.0);
        self.wbuf.put_i64(pg_now());
        self.wbuf.put_u8(u8::from(reply));
        self.flush().await
    }

    /// Ends the COPY stream politely and closes the connection.
    pub(crate) async fn close(mut self) {
        if self.streaming {
            frontend::copy_done(&mut self.wbuf);
        }
        frontend::terminate(&mut self.wbuf);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.flush()).await;
    }

    async fn flush(&mut self) -> Result<(), SourceError> {
        self.io
            .write_all(&self.wbuf)
            .await
            .map_err(SourceError::Io)?;
        self.io.flush().await.map_err(SourceError::Io)?;
        self.wbuf.clear();
        Ok(())
    }

    async fn fill(&mut self) -> Result<(), SourceError> {
        if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
            self.rbuf.reserve(READ_CHUNK);
        }
        if self.streaming
            && let Some((at, n)) = self.last_read
            && n < BUSY_BELOW
            && at.elapsed() < BUSY_WITHIN
        {
            // Blocks the thread, not a task: the stream's reader runs on a
            // thread and runtime of its own (daemon/pipeline.rs,
            // `spawn_source`), and tokio's timers cannot wait less than a
            // millisecond.
            std::thread::sleep(GATHER);
        }
        let n = self
            .io
            .read_buf(&mut self.rbuf)
            .await
            .map_err(SourceError::Io)?;
        if n == 0 {
            return Err(SourceError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            )));
        }
        self.last_read = Some((Instant::now(), n));
        Ok(())
    }

    fn take_message(&mut self) -> Result<Option<(u8, BytesMut)>, SourceError> {
        take_message(&mut self.rbuf)
    }

    async fn read_message(&mut self) -> Result<(u8, BytesMut), SourceError> {
        loop {
            if let Some(message) = self.take_message()? {
                return Ok(message);
            }
            self.fill().await?;
        }
    }
}

/// The longest message length a server declares: PostgreSQL builds each
/// message's body in a buffer of at most `MaxAllocSize` (1 GiB less a
/// byte), and the length counts its own 4 bytes too. A longer one is not
/// PostgreSQL talking.
const MAX_MESSAGE: u32 = (1 << 30) + 4;

/// How much room is made ahead of a long message's bytes arriving: the
/// buffer grows as they come (doubling), not by the length a peer declares.
const RESERVE_AHEAD: usize = 8 * 1024 * 1024;

/// Splits the next whole message (tag, body) off the front of `rbuf`, or
/// `None` until all of it has arrived.
fn take_message(rbuf: &mut BytesMut) -> Result<Option<(u8, BytesMut)>, SourceError> {
    if rbuf.len() < 5 {
        return Ok(None);
    }
    let tag = rbuf[0];
    let len = u32::from_be_bytes([rbuf[1], rbuf[2], rbuf[3], rbuf[4]]);
    if !(4..=MAX_MESSAGE).contains(&len) {
        return Err(SourceError::Protocol(format!(
            "message `{}` with invalid length {len} (a PostgreSQL server sends 4 to {MAX_MESSAGE}): \
             is the address a PostgreSQL server?",
            tag.escape_ascii()
        )));
    }
    let total = len as usize + 1;
    if rbuf.len() < total {
        rbuf.reserve((total - rbuf.len()).min(RESERVE_AHEAD));
        return Ok(None);
    }
    let mut message = rbuf.split_to(total);
    message.advance(5);
    Ok(Some((tag, message)))
}

/// Sends SSLRequest; `true` if the server agreed to TLS.
async fn negotiate_ssl(tcp: &mut TcpStream) -> std::io::Result<bool> {
    let mut buf = BytesMut::new();
    frontend::ssl_request(&mut buf);
    tcp.write_all(&buf).await?;
    let answer = tcp.read_u8().await?;
    match answer {
        b'S' => Ok(true),
        b'N' => Ok(false),
        other => Err(std::io::Error::other(format!(
            "unexpected answer `{}` to SSLRequest",
            other as char
        ))),
    }
}

fn parse_copy_data(data: Bytes) -> Result<Frame, SourceError> {
    let short = || SourceError::Protocol("short replication frame".into());
    let Some(&kind) = data.first() else {
        return Err(short());
    };
    match kind {
        b'w' => {
            if data.len() < 25 {
                return Err(short());
            }
            // Skip the start LSN: pgoutput's messages carry their own.
            let mut header = &data[9..25];
            let wal_end = Lsn(header.get_u64());
            Ok(Frame::XLogData {
                wal_end,
                data: data.slice(25..),
            })
        }
        b'k' => {
            if data.len() < 18 {
                return Err(short());
            }
            let mut body = &data[1..18];
            let wal_end = Lsn(body.get_u64());
            let _send_time = body.get_i64();
            Ok(Frame::Keepalive {
                wal_end,
                reply: body.get_u8() != 0,
            })
        }
        other => Err(SourceError::Protocol(format!(
            "unknown replication frame `{}`",
            other as char
        ))),
    }
}

fn log_notice(body: &[u8]) {
    let notice = ServerError::parse(body);
    tracing::info!(severity = %notice.severity, code = %notice.code, "server notice: {}", notice.message);
}

/// Now, in microseconds since 2000-01-01, as the protocol wants it.
pub(crate) fn pg_now() -> i64 {
    let unix = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0);
    unix - PG_EPOCH_OFFSET_MICROS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_server_errors() {
        let body =
            b"SERROR\0VERROR\0C42704\0Mreplication slot \"x\" does not exist\0Hcreate it\0\0";
        let err = ServerError::parse(body);
        assert_eq!(err.severity, "ERROR");
        assert_eq!(err.code, "42704");
        assert_eq!(err.message, "replication slot \"x\" does not exist");
        assert_eq!(err.hint.as_deref(), Some("create it"));
        assert_eq!(
            err.to_string(),
            "ERROR: replication slot \"x\" does not exist (SQLSTATE 42704); hint: create it"
        );
        // Truncated input must not panic.
        for cut in 0..body.len() {
            let _ = ServerError::parse(&body[..cut]);
        }
    }

    #[test]
    fn parses_replication_frames() {
        let mut w = vec![b'w'];
        w.extend_from_slice(&0x10u64.to_be_bytes());
        w.extend_from_slice(&0x20u64.to_be_bytes());
        w.extend_from_slice(&0i64.to_be_bytes());
        w.extend_from_slice(b"Bpayload");
        match parse_copy_data(Bytes::from(w.clone())).expect("xlogdata") {
            Frame::XLogData { wal_end, data } => {
                assert_eq!(wal_end, Lsn(0x20));
                assert_eq!(&data[..], b"Bpayload");
            }
            other => panic!("{other:?}"),
        }
        let mut k = vec![b'k'];
        k.extend_from_slice(&0x30u64.to_be_bytes());
        k.extend_from_slice(&0i64.to_be_bytes());
        k.push(1);
        assert!(matches!(
            parse_copy_data(Bytes::from(k.clone())).expect("keepalive"),
            Frame::Keepalive {
                wal_end: Lsn(0x30),
                reply: true
            }
        ));
        for frame in [w, k] {
            for cut in 0..frame.len().min(25) {
                if cut < 18 || frame[0] == b'w' {
                    assert!(parse_copy_data(Bytes::copy_from_slice(&frame[..cut])).is_err());
                }
            }
        }
        assert!(parse_copy_data(Bytes::from_static(b"z")).is_err());
    }

    /// A peer declaring a message of gigabytes made the host reserve all of
    /// it at once, before a byte of it arrived.
    #[test]
    fn a_declared_message_length_is_neither_trusted_nor_reserved_at_once() {
        let frame = |len: u32| {
            let mut buf = BytesMut::new();
            buf.extend_from_slice(b"d");
            buf.extend_from_slice(&len.to_be_bytes());
            buf
        };
        let mut huge = frame(u32::MAX);
        let err = take_message(&mut huge).expect_err("4 GiB");
        assert!(
            err.to_string().contains("invalid length 4294967295"),
            "{err}"
        );
        assert!(take_message(&mut frame(3)).is_err());

        let mut long = frame(MAX_MESSAGE);
        assert!(take_message(&mut long).expect("legal length").is_none());
        assert!(long.capacity() <= 5 + RESERVE_AHEAD, "{}", long.capacity());

        let mut whole = frame(4 + 3);
        whole.extend_from_slice(b"abc");
        whole.extend_from_slice(b"Z");
        let (tag, body) = take_message(&mut whole).expect("whole").expect("some");
        assert_eq!((tag, &body[..]), (b'd', &b"abc"[..]));
        assert_eq!(&whole[..], b"Z");
        assert!(take_message(&mut whole).expect("partial").is_none());
    }
}
