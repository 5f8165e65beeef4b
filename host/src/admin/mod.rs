//! The admin API (docs/admin.md): an axum server inside `datum run` for
//! status, metrics, pause and resume, hot swap and rollback, dead letters,
//! and a dashboard page that uses them (`dashboard.rs`).
//!
//! Owns HTTP: listening (loopback unless a strong token is configured),
//! connections (a cap, a header timeout), the bearer token (compared in
//! constant time, never logged), body limits and a timeout on every
//! request, refusals answered from the headers alone, and one error shape
//! for every failure — axum's own rejections included. What a request does
//! belongs elsewhere: [`crate::daemon::PipelineControl`] pauses and resumes,
//! `crate::daemon::hotswap` swaps, the state file stores.

mod canary;
mod dashboard;
pub(crate) mod metrics;
pub(crate) mod openapi;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, FromRequest, Path, RawQuery, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use datum_guest::wire;
use serde_json::{Value as Json, json};
use tokio::sync::watch;

use crate::checkpoint::Store;
use crate::config::AdminSpec;
use crate::daemon::hotswap::{self, SwapError};
use crate::daemon::{PipelineControl, PipelineState};
use crate::digest::sha256;
use crate::event::Lsn;
use crate::transform::{Chain, Engine};

/// Bodies of requests other than uploads.
const SMALL_BODY: usize = 1 << 20;

/// What the API manages.
#[derive(Debug, Clone)]
pub struct Host {
    /// Every pipeline, in configuration order.
    pub pipelines: Vec<Arc<PipelineControl>>,
    /// The state file.
    pub store: Arc<Store>,
    /// The engine modules compile on.
    pub engine: Engine,
}

struct App {
    host: Host,
    /// SHA-256 of the token: comparing digests takes the same time whatever
    /// the guess, its length included.
    token_digest: [u8; 32],
    timeout: Duration,
    max_upload: usize,
    /// Dead letters being replayed, by pipeline and id: one replay each at
    /// a time.
    replaying: std::sync::Mutex<std::collections::HashSet<(String, u64)>>,
}

/// A dead letter claimed for one replay; the claim ends when this drops
/// (the replay answered or failed; not when its request went away, since
/// what was sent to the sink is then still written).
struct Replaying {
    app: Arc<App>,
    key: (String, u64),
}

impl Replaying {
    /// Claims dead letter `id` of `pipeline`, unless a replay of it is
    /// under way.
    fn claim(app: &Arc<App>, pipeline: &str, id: u64) -> Result<Replaying, ApiError> {
        let key = (pipeline.to_owned(), id);
        let mut replaying = app.replaying.lock().unwrap_or_else(|p| p.into_inner());
        if !replaying.insert(key.clone()) {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!(
                    "dead letter {id} of pipeline `{pipeline}` is being replayed by another \
                     request: wait for its answer"
                ),
            ));
        }
        Ok(Replaying {
            app: app.clone(),
            key,
        })
    }
}

impl Drop for Replaying {
    fn drop(&mut self) {
        self.app
            .replaying
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

/// An API error: status, stable code, message.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {"code": self.code, "message": self.message}});
        let mut response = reply(self.status, &body);
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

impl From<SwapError> for ApiError {
    fn from(err: SwapError) -> ApiError {
        match err {
            SwapError::Module(e) => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_module",
                e.to_string(),
            ),
            SwapError::Config(m) => ApiError::bad_request(m),
            e @ SwapError::Fixtures { .. } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "fixtures_failed",
                e.to_string(),
            ),
            SwapError::NotFound(m) => ApiError::not_found(m),
            SwapError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
            SwapError::State(e) => ApiError::internal(e.to_string()),
            SwapError::Internal(m) => ApiError::internal(m),
        }
    }
}

impl From<crate::checkpoint::CheckpointError> for ApiError {
    fn from(err: crate::checkpoint::CheckpointError) -> ApiError {
        ApiError::internal(err.to_string())
    }
}

fn reply(status: StatusCode, body: &Json) -> Response {
    let mut response = (status, body.to_string()).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

fn ok(body: Json) -> Result<Response, ApiError> {
    Ok(reply(StatusCode::OK, &body))
}

/// Why the admin API could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// A non-loopback listen without a token.
    #[error(
        "refusing to listen on {listen} without a token: anyone who can reach it could swap \
         modules. Set [admin] token = \"${{DATUM_ADMIN_TOKEN}}\" (or the DATUM_ADMIN_TOKEN \
         variable), or listen on 127.0.0.1"
    )]
    NoToken {
        /// The address asked for.
        listen: SocketAddr,
    },
    /// A non-loopback listen with a token too weak to guard it.
    #[error(
        "refusing to listen on {listen} with this token: {why}. Anyone who can reach the \
         address could guess it and swap modules. Use at least {MIN_TOKEN_BYTES} bytes of \
         random data, e.g. `openssl rand -hex 32`, or listen on 127.0.0.1"
    )]
    WeakToken {
        /// The address asked for.
        listen: SocketAddr,
        /// What is wrong with the token (never the token).
        why: String,
    },
    /// No token was configured and none could be generated.
    #[error("cannot generate the admin token into {}: {source}", path.display())]
    TokenFile {
        /// The token file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The address cannot be listened on.
    #[error("cannot listen on {listen}: {source}")]
    Listen {
        /// The address asked for.
        listen: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Starts the API; the server stops when `stop` turns true. Returns the
/// server's task.
pub async fn serve(
    spec: &AdminSpec,
    state_path: &str,
    host: Host,
    stop: watch::Receiver<bool>,
) -> Result<tokio::task::JoinHandle<()>, ServeError> {
    let listen = spec.listen.0;
    let configured = spec
        .token
        .as_ref()
        .map(|t| t.0.clone())
        .or_else(|| std::env::var("DATUM_ADMIN_TOKEN").ok())
        // Trimmed as a client's is: a secret mounted from a file often
        // ends with a newline, and then no client could ever match it.
        .map(|t| t.trim().to_owned())
        .filter(|t| !t.is_empty());
    if !listen.ip().is_loopback() {
        match &configured {
            None => return Err(ServeError::NoToken { listen }),
            Some(token) => {
                strong_enough(token).map_err(|why| ServeError::WeakToken { listen, why })?
            }
        }
    }
    let token = match configured {
        Some(token) => token,
        None => {
            let path = spec.token_file(state_path);
            let token = generate_token(&path).map_err(|source| ServeError::TokenFile {
                path: path.clone(),
                source,
            })?;
            tracing::info!(token_file = %path.display(), "admin API token generated (datum admin --config reads it)");
            token
        }
    };
    let app = Arc::new(App {
        host,
        token_digest: sha256(token.as_bytes()),
        timeout: spec.request_timeout.0,
        max_upload: spec.max_upload.0,
        replaying: Default::default(),
    });
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Listen { listen, source })?;
    let bound: SocketAddr = listener
        .local_addr()
        .map_err(|source| ServeError::Listen { listen, source })?;
    tracing::info!(address = %bound, "admin API listening");
    let router = router(app, spec.max_upload.0);
    let limits = ConnectionLimits {
        header_timeout: spec.header_timeout.0,
        max_connections: spec.max_connections.0,
    };
    Ok(tokio::spawn(accept(listener, router, limits, stop)))
}

/// The fewest bytes of entropy a token needs for a non-loopback listen.
const MIN_TOKEN_BYTES: usize = 32;

/// Why `token` is too weak to guard a non-loopback listen, if it is: fewer
/// than [`MIN_TOKEN_BYTES`] bytes of entropy, or so repetitive that its
/// length says little. Entropy is estimated from the alphabet the token
/// draws on — 16 symbols for hex, else the classes it uses (digits, lower
/// case, upper case, punctuation) — times its length, and capped by its own
/// character frequencies: `openssl rand -hex 32` (64 hex digits, 256 bits)
/// and `openssl rand -base64 32` pass; 32 hex digits (128 bits) do not.
/// Never quotes the token.
fn strong_enough(token: &str) -> Result<(), String> {
    let bytes = token.as_bytes();
    let needed = MIN_TOKEN_BYTES * 8;
    let hex = !bytes.is_empty() && bytes.iter().all(u8::is_ascii_hexdigit);
    let alphabet: usize = if hex {
        16
    } else {
        type Class = (fn(&u8) -> bool, usize);
        let classes: [Class; 4] = [
            (u8::is_ascii_digit, 10),
            (u8::is_ascii_lowercase, 26),
            (u8::is_ascii_uppercase, 26),
            (|b: &u8| !b.is_ascii_alphanumeric(), 32),
        ];
        classes
            .iter()
            .filter(|(class, _)| bytes.iter().any(class))
            .map(|(_, size)| size)
            .sum()
    };
    let by_alphabet = bytes.len() as f64 * (alphabet.max(1) as f64).log2();
    let mut counts = [0usize; 256];
    for &b in bytes {
        counts[usize::from(b)] += 1;
    }
    let distinct = counts.iter().filter(|&&c| c > 0).count();
    let n = bytes.len() as f64;
    let by_frequency: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2() * n
        })
        .sum();
    let repeated = (1..=bytes.len() / 2).any(|period| {
        bytes.len().is_multiple_of(period) && bytes.chunks(period).all(|c| c == &bytes[..period])
    });
    // A little slack: 43 base64url characters carry 256 bits, and a random
    // one may happen to use one class fewer.
    let enough = by_alphabet >= needed as f64 * 0.98;
    if repeated || distinct < 8 || by_frequency < needed as f64 / 2.0 || !enough {
        return Err(format!(
            "it carries about {} bits ({} bytes, {distinct} distinct characters); a token \
             needs at least {MIN_TOKEN_BYTES} bytes ({needed} bits) of random data",
            by_alphabet.min(by_frequency * 2.0) as u64,
            bytes.len(),
        ));
    }
    Ok(())
}

/// What one listener allows its clients.
#[derive(Debug, Clone, Copy)]
struct ConnectionLimits {
    /// How long a client may take to send a request's headers, the first
    /// or the next on a kept-alive connection.
    header_timeout: Duration,
    /// Connections served at once.
    max_connections: usize,
}

/// How long a closed connection still swallows what its client sends
/// (see [`linger`]).
const LINGER: Duration = Duration::from_secs(2);

/// Accepts connections until `stop` turns true: at most
/// `limits.max_connections` at once (the next ones are answered 503 and
/// closed at once), each served by hyper with a header timeout.
async fn accept(
    listener: tokio::net::TcpListener,
    router: Router,
    limits: ConnectionLimits,
    mut stop: watch::Receiver<bool>,
) {
    let permits = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let mut at_capacity = false;
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = stop.wait_for(|s| *s) => return,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors, most likely: wait for some to close
                // rather than spin.
                tracing::warn!(error = %err, "admin API: cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            if !at_capacity {
                at_capacity = true;
                tracing::warn!(
                    max_connections = limits.max_connections,
                    %peer,
                    "admin API connection limit reached: new connections are refused until \
                     some close (admin.max_connections)"
                );
            }
            refuse(stream);
            continue;
        };
        if at_capacity {
            at_capacity = false;
            tracing::info!("admin API below its connection limit again");
        }
        let router = router.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            serve_connection(stream, router, limits.header_timeout, stop).await;
            drop(permit);
        });
    }
}

/// Answers a connection over the cap without reading from it, and closes
/// it.
fn refuse(stream: tokio::net::TcpStream) {
    const BODY: &str = "{\"error\": {\"code\": \"too_many_connections\", \"message\": \
                        \"the admin API serves as many connections as it may \
                        (admin.max_connections): try again shortly\"}}";
    let answer = format!(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nRetry-After: 1\r\nConnection: close\r\n\r\n{BODY}",
        BODY.len()
    );
    // One non-blocking write into an empty socket buffer: it fits, and a
    // client that does not read costs nothing.
    let _ = stream.try_write(answer.as_bytes());
}

/// Serves one connection: HTTP/1.1 with keep-alive, headers within
/// `header_timeout`, then a lingering close.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    router: Router,
    header_timeout: Duration,
    mut stop: watch::Receiver<bool>,
) {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let service = hyper_util::service::TowerToHyperService::new(router);
    // Boxed, so the connection can be polled without shutting its socket
    // (`poll_without_shutdown` wants an `Unpin` future).
    let service = hyper::service::service_fn(move |request| {
        Box::pin(hyper::service::Service::call(&service, request))
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .keep_alive(true);
    // A client that stops reading cannot hold its connection (and a place
    // under `max_connections`) for ever: hyper has no write timeout.
    let stream = SendDeadline::new(stream, header_timeout);
    let mut connection = builder.serve_connection(TokioIo::new(stream), service);
    let mut stopping = false;
    let served = loop {
        tokio::select! {
            served = std::future::poll_fn(|cx| connection.poll_without_shutdown(cx)) => break served,
            _ = stop.wait_for(|s| *s), if !stopping => {
                stopping = true;
                std::pin::Pin::new(&mut connection).graceful_shutdown();
            }
        }
    };
    match served {
        Ok(()) => linger(connection.into_parts().io.into_inner().stream).await,
        // A header timeout, a client gone, a malformed request: hyper has
        // answered what could be; drop the socket.
        Err(err) => tracing::debug!(error = %err, "admin API connection ended"),
    }
}

/// A connection's socket on which a write may not wait longer than `limit`
/// for the client to take what was sent: past it, the write fails with
/// `TimedOut` and hyper ends the connection. Every write that goes through
/// starts the wait anew.
#[derive(Debug)]
struct SendDeadline {
    stream: tokio::net::TcpStream,
    limit: Duration,
    stalled: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
}

impl SendDeadline {
    fn new(stream: tokio::net::TcpStream, limit: Duration) -> SendDeadline {
        SendDeadline {
            stream,
            limit,
            stalled: None,
        }
    }

    /// `polled`'s outcome, or `TimedOut` once writes have waited `limit`.
    fn bounded<T>(
        &mut self,
        cx: &mut std::task::Context<'_>,
        polled: std::task::Poll<std::io::Result<T>>,
    ) -> std::task::Poll<std::io::Result<T>> {
        use std::future::Future;
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            std::task::Poll::Ready(()) => std::task::Poll::Ready(Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the client took nothing of the answer for admin.header_timeout",
            ))),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    }
}

impl tokio::io::AsyncRead for SendDeadline {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for SendDeadline {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.stream).poll_write(cx, buf);
        this.bounded(cx, polled)
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        this.bounded(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = std::pin::Pin::new(&mut this.stream).poll_flush(cx);
        this.bounded(cx, polled)
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// Closes a connection whose last answer may have come before the request's
/// body (a refusal from the headers): sends FIN so the client has the whole
/// answer, then reads and discards what the client still sends, for at most
/// [`LINGER`], so that closing does not reset the connection and destroy
/// the answer before the client read it. Nothing read is kept.
async fn linger(mut stream: tokio::net::TcpStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    if stream.shutdown().await.is_err() {
        return;
    }
    let mut discard = vec![0u8; 8192];
    let _ = tokio::time::timeout(LINGER, async {
        while let Ok(n) = stream.read(&mut discard).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// `n` random bytes, from the kernel.
fn random_bytes<const N: usize>() -> std::io::Result<[u8; N]> {
    use std::io::Read;
    let mut bytes = [0u8; N];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes))?;
    Ok(bytes)
}

/// A random token: 32 bytes, in hex.
fn random_token() -> std::io::Result<String> {
    let bytes = random_bytes::<32>()?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A random token, written to `path` (mode 0600) for `datum admin`.
fn generate_token(path: &std::path::Path) -> std::io::Result<String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let token = random_token()?;
    let _ = std::fs::remove_file(path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(token.as_bytes()))?;
    Ok(token)
}

fn router(app: Arc<App>, max_upload: usize) -> Router {
    let protected = Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/v1/pipelines", get(list_pipelines))
        .route("/v1/pipelines/{pipeline}", get(pipeline_status))
        .route("/v1/pipelines/{pipeline}/pause", post(pause))
        .route("/v1/pipelines/{pipeline}/resume", post(resume))
        .route("/v1/pipelines/{pipeline}/backfill", post(backfill))
        .route("/v1/pipelines/{pipeline}/modules", get(list_modules))
        .route(
            "/v1/pipelines/{pipeline}/modules/{module}",
            get(show_module),
        )
        .route(
            "/v1/pipelines/{pipeline}/modules/{module}/versions",
            post(upload).layer(DefaultBodyLimit::max(max_upload)),
        )
        .route(
            "/v1/pipelines/{pipeline}/modules/{module}/rollback",
            post(rollback),
        )
        .route(
            "/v1/pipelines/{pipeline}/modules/{module}/canary",
            post(canary::start).layer(DefaultBodyLimit::max(max_upload)),
        )
        .route("/v1/pipelines/{pipeline}/canary", get(canary::show))
        .route(
            "/v1/pipelines/{pipeline}/canary/differences/{index}",
            get(canary::difference),
        )
        .route(
            "/v1/pipelines/{pipeline}/canary/promote",
            post(canary::promote),
        )
        .route("/v1/pipelines/{pipeline}/canary/abort", post(canary::abort))
        .route(
            "/v1/pipelines/{pipeline}/dead-letters",
            get(list_dead_letters),
        )
        .route(
            "/v1/pipelines/{pipeline}/dead-letters/{id}",
            get(show_dead_letter).delete(discard_dead_letter),
        )
        .route(
            "/v1/pipelines/{pipeline}/dead-letters/{id}/replay",
            post(replay_dead_letter),
        )
        .route_layer(middleware::from_fn_with_state(app.clone(), authorize));
    Router::new()
        .route("/", get(dashboard::page))
        .route("/dashboard.js", get(dashboard::script))
        .route("/dashboard.css", get(dashboard::style))
        .route("/v1/health", get(|| async { ok(json!({"status": "ok"})) }))
        .route("/v1/ready", get(ready))
        .route(
            "/v1/openapi.json",
            get(|| async { ok(openapi::document()) }),
        )
        .merge(protected)
        .fallback(|| async { ApiError::not_found("no such route: see /v1/openapi.json") })
        .layer(DefaultBodyLimit::max(SMALL_BODY))
        .layer(middleware::from_fn_with_state(app.clone(), time_limit))
        .layer(middleware::from_fn(shape_errors))
        .with_state(app)
}

async fn authorize(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| sha256(t.trim().as_bytes()));
    let refusal = match given {
        None => Some(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "missing_token",
            "send the admin token: Authorization: Bearer TOKEN",
        )),
        Some(digest) => {
            let differs = digest
                .iter()
                .zip(app.token_digest.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b));
            (std::hint::black_box(differs) != 0).then(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "invalid_token",
                    "the token is wrong",
                )
            })
        }
    };
    match refusal {
        None => next.run(request).await,
        // From the headers alone: the body is never read, and the
        // connection is closed after the answer (see `linger`).
        Some(refusal) => closing(refusal.into_response()),
    }
}

/// `response`, telling the client the connection closes after it: a
/// request answered before its body was read cannot be followed by another
/// on the same connection.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

async fn time_limit(State(app): State<Arc<App>>, request: Request, next: Next) -> Response {
    match tokio::time::timeout(app.timeout, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "timeout",
            format!(
                "the request took longer than {:?} (admin.request_timeout); a swap still in \
                 progress completes on its own: check the module's versions",
                app.timeout
            ),
        )
        .into_response(),
    }
}

/// The code of an error known only by its status (axum's rejections).
fn code_for(status: StatusCode) -> &'static str {
    match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "payload_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::REQUEST_TIMEOUT => "timeout",
        StatusCode::UNAUTHORIZED => "missing_token",
        s if s.is_server_error() => "internal",
        _ => "invalid_request",
    }
}

/// An axum rejection in the API's shape.
fn rejected(status: StatusCode, text: String) -> ApiError {
    ApiError::new(status, code_for(status), text)
}

/// Gives axum's own rejections (404, 405, 413, 415, ...) the API's error
/// shape.
///
/// An error answering a request that has a body closes the connection: the
/// body may not have been read (nor will it be).
async fn shape_errors(request: Request, next: Next) -> Response {
    let has_body = request.headers().contains_key(header::TRANSFER_ENCODING)
        || request
            .headers()
            .get(header::CONTENT_LENGTH)
            .is_some_and(|v| v.as_bytes() != b"0");
    let response = next.run(request).await;
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let response = if has_body {
        closing(response)
    } else {
        response
    };
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if is_json {
        return response;
    }
    let code = code_for(status);
    let close = response.headers().get(header::CONNECTION).cloned();
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_owned();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    let mut shaped = ApiError::new(status, code, message).into_response();
    if let Some(close) = close {
        shaped.headers_mut().insert(header::CONNECTION, close);
    }
    shaped
}

impl App {
    fn pipeline(&self, name: &str) -> Result<&Arc<PipelineControl>, ApiError> {
        self.host
            .pipelines
            .iter()
            .find(|p| p.name == name)
            .ok_or_else(|| ApiError::not_found(format!("no pipeline named `{name}`")))
    }
}

async fn ready(State(app): State<Arc<App>>) -> Response {
    let mut states = serde_json::Map::new();
    let mut ready = true;
    for p in &app.host.pipelines {
        let state = p.state();
        ready &= matches!(
            state,
            PipelineState::Running | PipelineState::Paused | PipelineState::Standby
        );
        states.insert(p.name.clone(), json!(state.as_str()));
    }
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    reply(status, &json!({"ready": ready, "pipelines": states}))
}

async fn metrics_handler(State(app): State<Arc<App>>) -> Response {
    let text = metrics::render(&app.host.pipelines, &app.host.store);
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

/// A pipeline's status document (docs/admin.md).
pub(crate) fn status(control: &PipelineControl, store: &Store) -> Json {
    use std::sync::atomic::Ordering::Relaxed;
    let source = &control.source_stats;
    let stats = &control.stats;
    let received = Lsn(source.received_lsn.load(Relaxed));
    let checkpointed = match control.handles() {
        Some(h) => h.feedback.flushed(),
        None => store
            .offset(&control.name)
            .ok()
            .flatten()
            .map(|o| o.end_lsn)
            .unwrap_or_default(),
    };
    let confirmed = Lsn(source.confirmed_lsn.load(Relaxed));
    let (batches_per_second, changes_per_second, waiting) = control.rates();
    let last_error = stats
        .last_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone()
        .map(|(message, at)| json!({"message": message, "at": at}));
    let snapshots: Vec<Json> = store
        .snapshot_progress(&control.name)
        .unwrap_or_default()
        .into_iter()
        .map(|s| {
            crate::daemon::snapshot::status(
                &s,
                control.handles().and_then(|h| h.snapshots.live(&s.table)),
            )
        })
        .collect();
    json!({
        "name": control.name,
        "state": control.state().as_str(),
        "lsn": {
            "received": received.max(checkpointed).to_string(),
            "checkpointed": checkpointed.to_string(),
            "confirmed": confirmed.to_string(),
        },
        "source": {
            "mode": if source.catching_up.load(Relaxed) { "catch_up" } else { "streaming" },
            "catch_ups": source.catch_ups.load(Relaxed),
            "catch_up_changes": source.catch_up_changes.load(Relaxed),
        },
        "lag": lag(control, store, received, checkpointed, waiting),
        "rates": {
            "batches_per_second": batches_per_second,
            "changes_per_second": changes_per_second,
        },
        "totals": {
            "batches_in": source.batches.load(Relaxed),
            "changes_in": source.changes.load(Relaxed),
            "bytes_in": source.bytes.load(Relaxed),
            "batches_out": stats.batches_written.load(Relaxed),
            "changes_out": stats.changes_written.load(Relaxed),
            "bytes_out": stats.bytes_written.load(Relaxed),
            "module_failures": stats.module_failures.load(Relaxed),
            "skipped": stats.skipped.load(Relaxed),
            "dead_letters": stats.dead_letters.load(Relaxed),
            "sink_retries": stats.sink_retries.load(Relaxed),
            "schema_changes": stats.schema_changes.load(Relaxed),
        },
        "modules": control.chain.info(),
        "canary": control.canary.report(false),
        "snapshots": snapshots,
        "last_error": last_error,
        "state_file": state_file(store),
    })
}

/// How far the checkpoint trails the server: in bytes of WAL (against the
/// server's position, so also while paused), in seconds of commit time
/// (the newest transaction received against the checkpointed one), how
/// long un-checkpointed work has waited, and the WAL the slot retains.
fn lag(
    control: &PipelineControl,
    store: &Store,
    received: Lsn,
    checkpointed: Lsn,
    waiting: f64,
) -> Json {
    use std::sync::atomic::Ordering::Relaxed;
    let stats = &control.source_stats;
    let server = Lsn(stats.server_lsn.load(Relaxed)).max(received);
    let polled_at = stats.server_polled_at.load(Relaxed);
    json!({
        "bytes": server.0.saturating_sub(checkpointed.0),
        "seconds": commit_lag(control, store, checkpointed),
        "waiting_seconds": waiting,
        "server_lsn": server.to_string(),
        "slot_retained_bytes": (polled_at > 0).then(|| stats.slot_retained_bytes.load(Relaxed)),
        "server_polled_at": (polled_at > 0).then_some(polled_at),
    })
}

/// Seconds between the newest commit received and the commit of the
/// checkpointed transaction (0 when everything received is checkpointed).
pub(crate) fn commit_lag(control: &PipelineControl, store: &Store, checkpointed: Lsn) -> f64 {
    use std::sync::atomic::Ordering::Relaxed;
    let received = Lsn(control.source_stats.received_lsn.load(Relaxed));
    if received <= checkpointed {
        return 0.0;
    }
    let newest = control.source_stats.newest_commit_time.load(Relaxed);
    let durable = store
        .offset(&control.name)
        .ok()
        .flatten()
        .map(|o| o.commit_time)
        .unwrap_or(0);
    if newest <= 0 || durable <= 0 {
        return 0.0;
    }
    newest.saturating_sub(durable).max(0) as f64 / 1e6
}

/// How the state file fares: failing while its last use failed (a full
/// disk), with the last error.
fn state_file(store: &Store) -> Json {
    let health = store.health();
    json!({
        "failing": health.failing,
        "io_errors": health.io_errors,
        "reopens": health.reopens,
        "last_error": health
            .last_error
            .map(|(message, at)| json!({"message": message, "at": at})),
    })
}

async fn list_pipelines(State(app): State<Arc<App>>) -> Result<Response, ApiError> {
    let all: Vec<Json> = app
        .host
        .pipelines
        .iter()
        .map(|p| status(p, &app.host.store))
        .collect();
    ok(json!({ "pipelines": all }))
}

async fn pipeline_status(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    ok(status(control, &app.host.store))
}

/// The body of a backfill request.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BackfillBody {
    tables: Vec<String>,
    #[serde(default)]
    from: Option<Vec<String>>,
}

/// Copies tables on the running pipeline: new ones (added to the
/// publication when Datum manages it), or again, optionally from a key on.
async fn backfill(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?.clone();
    let request: BackfillBody = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body: {e} (send {{\"tables\": [\"schema.table\", ...]}}, with \"from\": \
             [key values as text] to copy one table from a key on)"
        ))
    })?;
    let Some(handles) = control.handles() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "pipeline `{pipeline}` is {}: backfills start on a running pipeline",
                control.state().as_str()
            ),
        ));
    };
    // In a task of its own: a timed-out request does not cancel it.
    let accepted = tokio::spawn(async move {
        handles
            .snapshots
            .backfill(request.tables, request.from)
            .await
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?;
    use crate::daemon::snapshot::BackfillError;
    let tables = accepted.map_err(|e| match e {
        BackfillError::Invalid(m) => ApiError::bad_request(m),
        BackfillError::Conflict(m) => ApiError::new(StatusCode::CONFLICT, "conflict", m),
        BackfillError::Unavailable(m) => {
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "unavailable", m)
        }
    })?;
    tracing::info!(pipeline = %pipeline, tables = ?tables, "backfill requested over the admin API");
    Ok(reply(
        StatusCode::ACCEPTED,
        &json!({"pipeline": pipeline, "tables": tables}),
    ))
}

async fn pause(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?.clone();
    // In a task of its own: a timed-out request does not cancel the pause.
    let state = tokio::spawn(async move { control.pause().await })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    tracing::info!(pipeline = %pipeline, state = state.as_str(), "pause requested over the admin API");
    ok(status(app.pipeline(&pipeline)?, &app.host.store))
}

async fn resume(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?.clone();
    let resumed = tokio::spawn(async move { control.resume().await })
        .await
        .map_err(|e| ApiError::internal(e.to_string()))?;
    if let Err(state) = resumed {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "pipeline `{pipeline}` is {} and cannot resume: restart the host (its status \
                 shows the last error)",
                state.as_str()
            ),
        ));
    }
    tracing::info!(pipeline = %pipeline, "resume requested over the admin API");
    ok(status(app.pipeline(&pipeline)?, &app.host.store))
}

fn module_json(store: &Store, pipeline: &str, slot: &hotswap::SlotInfo) -> Result<Json, ApiError> {
    let key = hotswap::key(pipeline, &slot.name);
    let versions: Vec<Json> = store
        .module_versions(&key)?
        .into_iter()
        .map(|v| {
            json!({
                "version": v.version,
                "sha256": v.sha256,
                "size": v.wasm.len(),
                "origin": v.origin,
                "fixtures": v.fixtures,
                "stored_at": v.stored_at,
                "active": v.version == slot.version,
            })
        })
        .collect();
    let activations: Vec<Json> = store
        .module_activations(&key)?
        .into_iter()
        .map(|a| {
            json!({
                "version": a.version,
                "at": a.at,
                "effective_after": a.effective_after.to_string(),
            })
        })
        .collect();
    let mut module = json!({
        "name": slot.name,
        "active": {"version": slot.version, "sha256": slot.sha256},
        "versions": versions,
        "activations": activations,
    });
    if let Some(pending) = slot.pending {
        module["pending"] = json!({ "version": pending });
    }
    Ok(module)
}

async fn list_modules(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    let modules = control
        .chain
        .info()
        .iter()
        .map(|slot| module_json(&app.host.store, &pipeline, slot))
        .collect::<Result<Vec<_>, _>>()?;
    ok(json!({ "modules": modules }))
}

fn find_slot(
    control: &PipelineControl,
    pipeline: &str,
    module: &str,
) -> Result<hotswap::Slot, ApiError> {
    control
        .chain
        .slots()
        .into_iter()
        .find(|s| s.name == module)
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "pipeline `{pipeline}` has no transform named `{module}`"
            ))
        })
}

async fn show_module(
    State(app): State<Arc<App>>,
    Path((pipeline, module)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let control = app.pipeline(&pipeline)?;
    find_slot(control, &pipeline, &module)?;
    let info = control
        .chain
        .info()
        .into_iter()
        .find(|s| s.name == module)
        .ok_or_else(|| ApiError::not_found(format!("no transform named `{module}`")))?;
    ok(module_json(&app.host.store, &pipeline, &info)?)
}

/// An upload's parts.
#[derive(Debug, Default)]
struct Upload {
    wasm: Option<Vec<u8>>,
    config: Option<String>,
    fixtures: Vec<(String, Vec<u8>)>,
}

fn fixture_name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        && (name.ends_with(crate::golden::INPUT_SUFFIX)
            || name.ends_with(crate::golden::EXPECTED_SUFFIX)
            || name.ends_with(".config.toml")
            || name == "config.toml")
}

/// Refuses an upload whose announced body exceeds `max_upload`, from its
/// headers.
fn check_announced_length(app: &App, headers: &header::HeaderMap) -> Result<(), ApiError> {
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(length) = announced
        && length > app.max_upload as u64
    {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!(
                "the body is {length} bytes; this host takes uploads of at most {} bytes \
                 (admin.max_upload)",
                app.max_upload
            ),
        ));
    }
    Ok(())
}

async fn read_upload(app: &Arc<App>, request: Request) -> Result<Upload, ApiError> {
    let content_type = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if content_type.starts_with("multipart/form-data") {
        let mut multipart = axum::extract::Multipart::from_request(request, app)
            .await
            .map_err(|e| rejected(e.status(), e.body_text()))?;
        let mut upload = Upload::default();
        while let Some(field) = multipart
            .next_field()
            .await
            .map_err(|e| rejected(e.status(), e.body_text()))?
        {
            let name = field.name().unwrap_or("").to_owned();
            let file_name = field.file_name().map(str::to_owned);
            let bytes = field
                .bytes()
                .await
                .map_err(|e| rejected(e.status(), e.body_text()))?;
            match name.as_str() {
                "module" => upload.wasm = Some(bytes.to_vec()),
                "config" => {
                    upload.config = Some(String::from_utf8(bytes.to_vec()).map_err(|_| {
                        ApiError::bad_request("the `config` part is not UTF-8 TOML")
                    })?)
                }
                _ => {
                    let file = file_name.unwrap_or(name);
                    if !fixture_name_ok(&file) {
                        return Err(ApiError::bad_request(format!(
                            "unexpected part `{file}`: parts are `module`, `config`, and \
                             fixtures named NAME.input.json, NAME.expected.json, \
                             NAME.config.toml or config.toml"
                        )));
                    }
                    if upload.fixtures.iter().any(|(name, _)| *name == file) {
                        return Err(ApiError::bad_request(format!(
                            "the part `{file}` is sent twice: each fixture file once"
                        )));
                    }
                    if upload.fixtures.len() >= MAX_FIXTURE_FILES {
                        return Err(ApiError::bad_request(format!(
                            "more than {MAX_FIXTURE_FILES} fixture files: send the cases that \
                             prove this version, and run the whole suite with `datum test`"
                        )));
                    }
                    upload.fixtures.push((file, bytes.to_vec()));
                }
            }
        }
        if upload.wasm.is_none() {
            return Err(ApiError::bad_request(
                "the multipart body has no `module` part (the wasm file)",
            ));
        }
        Ok(upload)
    } else if content_type.is_empty()
        || content_type.starts_with("application/wasm")
        || content_type.starts_with("application/octet-stream")
    {
        let bytes = Bytes::from_request(request, app)
            .await
            .map_err(|e| rejected(e.status(), e.body_text()))?;
        Ok(Upload {
            wasm: Some(bytes.to_vec()),
            ..Upload::default()
        })
    } else {
        Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "`{content_type}`: send the module as application/wasm (or \
                 application/octet-stream), or multipart/form-data with fixtures"
            ),
        ))
    }
}

/// The query's `key=value` pairs (a bare `key` is `key=true`), each key one
/// of `known`.
fn query_pairs<'q>(
    query: Option<&'q str>,
    known: &[&str],
) -> Result<Vec<(&'q str, &'q str)>, ApiError> {
    let mut pairs = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, "true"));
        if !known.contains(&key) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter `{key}` (known: {})",
                known.join(", ")
            )));
        }
        pairs.push((key, value));
    }
    Ok(pairs)
}

/// A query parameter's value as a boolean.
fn boolean(name: &str, value: &str) -> Result<bool, ApiError> {
    match value {
        "true" | "1" => Ok(true),
        "false" | "0" => Ok(false),
        other => Err(ApiError::bad_request(format!(
            "{name}={other}: use true or false"
        ))),
    }
}

fn flag(query: Option<&str>, name: &str) -> Result<bool, ApiError> {
    let mut on = false;
    for (key, value) in query_pairs(query, &[name])? {
        on = boolean(key, value)?;
    }
    Ok(on)
}

/// Fixture files one upload may bring: each case runs under the
/// transform's time limit, so they bound how long vetting an upload takes.
const MAX_FIXTURE_FILES: usize = 600;

/// Runs `fixtures` (file name, bytes) against `wasm` under the transform's
/// `limits`, as its batches will run: the number of cases
/// that passed, or the report of those that did not.
fn run_fixtures(
    wasm: &[u8],
    config: &str,
    fixtures: &[(String, Vec<u8>)],
    limits: crate::transform::Limits,
) -> Result<u64, SwapError> {
    let internal = |e: std::io::Error| SwapError::Internal(format!("fixtures: {e}"));
    // Removed when it goes out of scope, whatever the outcome.
    let private = PrivateDir::new().map_err(internal)?;
    let dir = private.path();
    let module = dir.join("module.wasm");
    write_new(&module, wasm).map_err(internal)?;
    if !fixtures.iter().any(|(name, _)| name == "config.toml") {
        write_new(&dir.join("config.toml"), config.as_bytes()).map_err(internal)?;
    }
    for (name, bytes) in fixtures {
        write_new(&dir.join(name), bytes).map_err(internal)?;
    }
    let mut report = Vec::new();
    let summary = crate::golden::run_suite(
        &module,
        dir,
        &crate::golden::Options {
            limits: Some(limits),
            ..crate::golden::Options::default()
        },
        &mut report,
    )
    .map_err(|e| SwapError::Fixtures {
        failed: 1,
        total: 1,
        report: e.to_string(),
    })?;
    if summary.failed > 0 {
        return Err(SwapError::Fixtures {
            failed: summary.failed,
            total: summary.failed + summary.passed,
            report: String::from_utf8_lossy(&report).into_owned(),
        });
    }
    Ok(summary.passed as u64)
}

/// A directory only this process's user can enter, made by `mkdtemp(3)`
/// in the temporary directory: a fresh random name, created atomically
/// with mode 0700, so nothing another local user prepared (a directory of
/// the same name, symlinks in it) is ever used. Removed on drop.
#[derive(Debug)]
struct PrivateDir(std::path::PathBuf);

impl PrivateDir {
    fn new() -> std::io::Result<PrivateDir> {
        nix::unistd::mkdtemp(&std::env::temp_dir().join("datum-upload-XXXXXX"))
            .map(PrivateDir)
            .map_err(std::io::Error::from)
    }

    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Writes a file that must not exist yet (`O_EXCL`: never through a
/// symlink), readable by this user only.
fn write_new(path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?
        .write_all(bytes)
}

/// Compiles an upload's module as a version of `slot`'s transform (with the
/// active version's configuration unless it brings one), lets `datum_init`
/// vet the configuration, and runs the fixtures it brings.
async fn vet(
    engine: crate::transform::Engine,
    slot: hotswap::Slot,
    upload: Upload,
) -> Result<hotswap::Candidate, ApiError> {
    let wasm = upload.wasm.unwrap_or_default();
    let config = upload.config.unwrap_or_else(|| slot.config.clone());
    let fixtures = upload.fixtures;
    let candidate = tokio::task::spawn_blocking(move || {
        let module = hotswap::compile(&engine, &slot.name, &wasm, &config, slot.limits)?;
        let passed = if fixtures.is_empty() {
            0
        } else {
            run_fixtures(&wasm, &config, &fixtures, slot.limits)?
        };
        Ok::<_, SwapError>(hotswap::Candidate {
            wasm,
            config,
            module,
            fixtures: passed,
        })
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))??;
    Ok(candidate)
}

async fn upload(
    State(app): State<Arc<App>>,
    Path((pipeline, module)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    request: Request,
) -> Result<Response, ApiError> {
    // Everything the headers, the path and the query decide comes before
    // the body: a refusal reads none of it (the connection then closes).
    check_announced_length(&app, request.headers())?;
    let dry_run = flag(query.as_deref(), "dry_run")?;
    let control = app.pipeline(&pipeline)?.clone();
    let slot = find_slot(&control, &pipeline, &module)?;
    let began = std::time::Instant::now();
    let upload = read_upload(&app, request).await?;
    let read = began.elapsed();
    let store = app.host.store.clone();
    let engine = app.host.engine.clone();
    // The work runs in a task of its own, so a request that times out does
    // not leave a swap half done.
    let work = tokio::spawn(async move {
        let candidate = vet(engine, slot, upload).await?;
        let vetted = began.elapsed();
        if dry_run {
            return ok(json!({
                "module": module,
                "sha256": candidate.module.sha256(),
                "fixtures": candidate.fixtures,
                "dry_run": true,
            }));
        }
        let swapped = hotswap::swap(&store, &control.chain, &pipeline, &module, candidate).await?;
        tracing::debug!(
            pipeline,
            module,
            read_ms = read.as_millis() as u64,
            vetted_ms = vetted.as_millis() as u64,
            active_ms = began.elapsed().as_millis() as u64,
            "swap timings"
        );
        Ok(reply(
            StatusCode::CREATED,
            &serde_json::to_value(&swapped).unwrap_or_default(),
        ))
    });
    work.await.map_err(|e| ApiError::internal(e.to_string()))?
}

async fn rollback(
    State(app): State<Arc<App>>,
    Path((pipeline, module)): Path<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        version: Option<u64>,
    }
    let refused = |why: String| {
        ApiError::bad_request(format!(
            "the body: {why} (send {{\"version\": N}} or nothing)"
        ))
    };
    let to = if body.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        // An object, and only an object: serde's derive would also take a
        // struct from an array, reading `[1]` as `{"version": 1}`.
        let value: Json = serde_json::from_slice(&body).map_err(|e| refused(e.to_string()))?;
        let kind = match &value {
            Json::Object(_) => None,
            Json::Array(_) => Some("an array"),
            Json::String(_) => Some("a string"),
            Json::Number(_) => Some("a number"),
            Json::Bool(_) => Some("a boolean"),
            Json::Null => Some("null"),
        };
        if let Some(kind) = kind {
            return Err(refused(format!("a JSON object is expected, not {kind}")));
        }
        serde_json::from_value::<Body>(value)
            .map_err(|e| refused(e.to_string()))?
            .version
    };
    let control = app.pipeline(&pipeline)?.clone();
    find_slot(&control, &pipeline, &module)?;
    let (store, engine) = (app.host.store.clone(), app.host.engine.clone());
    let work = tokio::spawn(async move {
        hotswap::rollback(&engine, &store, &control.chain, &pipeline, &module, to).await
    });
    let swapped = work
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    ok(serde_json::to_value(&swapped).unwrap_or_default())
}

fn letter_json(letter: &crate::checkpoint::DeadLetter, with_batch: bool) -> Json {
    let batch: Option<wire::Batch> = wire::from_msgpack(&letter.batch).ok();
    let mut value = json!({
        "id": letter.id,
        "error": letter.error,
        "module_version": letter.module_version,
        "at": letter.at,
        "xid": batch.as_ref().map(|b| b.txn.xid),
        "commit_lsn": batch.as_ref().map(|b| Lsn(b.txn.commit_lsn).to_string()),
        "changes": batch.as_ref().map(|b| b.changes.len()),
    });
    if with_batch && let Some(batch) = &batch {
        value["batch"] =
            serde_json::to_value(crate::event::json::BatchJson(batch)).unwrap_or_default();
    }
    value
}

async fn list_dead_letters(
    State(app): State<Arc<App>>,
    Path(pipeline): Path<String>,
) -> Result<Response, ApiError> {
    app.pipeline(&pipeline)?;
    let letters: Vec<Json> = app
        .host
        .store
        .dead_letters(Some(&pipeline))?
        .iter()
        .map(|l| letter_json(l, false))
        .collect();
    ok(json!({ "dead_letters": letters }))
}

fn letter(app: &App, pipeline: &str, id: &str) -> Result<crate::checkpoint::DeadLetter, ApiError> {
    app.pipeline(pipeline)?;
    let id: u64 = id
        .parse()
        .map_err(|_| ApiError::bad_request(format!("`{id}` is not a dead letter id")))?;
    app.host.store.dead_letter(pipeline, id)?.ok_or_else(|| {
        ApiError::not_found(format!("pipeline `{pipeline}` has no dead letter {id}"))
    })
}

async fn show_dead_letter(
    State(app): State<Arc<App>>,
    Path((pipeline, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let letter = letter(&app, &pipeline, &id)?;
    ok(letter_json(&letter, true))
}

async fn discard_dead_letter(
    State(app): State<Arc<App>>,
    Path((pipeline, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let letter = letter(&app, &pipeline, &id)?;
    app.host.store.remove_dead_letter(&pipeline, letter.id)?;
    tracing::info!(pipeline = %pipeline, id = letter.id, "dead letter discarded over the admin API");
    ok(json!({"id": letter.id, "discarded": true}))
}

async fn replay_dead_letter(
    State(app): State<Arc<App>>,
    Path((pipeline, id)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let claimed = letter(&app, &pipeline, &id)?;
    let claim = Replaying::claim(&app, &pipeline, claimed.id)?;
    // Read again under the claim: a replay that ended since removed it.
    let letter = letter(&app, &pipeline, &id)?;
    let control = app.pipeline(&pipeline)?.clone();
    let Some(handles) = control.handles() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "pipeline `{pipeline}` is {}: resume it to replay (the sink is reached through \
                 the running pipeline)",
                control.state().as_str()
            ),
        ));
    };
    let batch: wire::Batch = wire::from_msgpack(&letter.batch).map_err(|e| {
        ApiError::internal(format!("dead letter {} does not decode: {e}", letter.id))
    })?;
    let modules = control.chain.modules();
    let transformed = tokio::task::spawn_blocking(move || {
        let mut chain = Chain::new(&modules);
        chain.run_items(crate::golden::source_items(&batch))
    })
    .await
    .map_err(|e| ApiError::internal(e.to_string()))?
    .map_err(|e| {
        ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "transform_failed",
            format!("the modules failed on it again (it is kept): {e}"),
        )
    })?;
    let changes = transformed.len();
    // From here on the replay runs to its end in a task of its own, holding
    // the claim: a request that times out or goes away must not leave a
    // batch on its way to the sink while the letter stays replayable.
    let id = letter.id;
    let app = app.clone();
    let delivery = tokio::spawn(async move {
        let _claim = claim;
        let (done, answer) = tokio::sync::oneshot::channel();
        handles
            .replay
            .send(crate::daemon::pipeline::Replay {
                batch: transformed,
                done,
            })
            .await
            .map_err(|_| ApiError::new(StatusCode::CONFLICT, "conflict", "the pipeline stopped"))?;
        match answer.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => {
                return Err(ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "sink_failed",
                    format!("the sink refused it (it is kept): {err}"),
                ));
            }
            Err(_) => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "conflict",
                    "the pipeline stopped before the sink answered (it is kept)",
                ));
            }
        }
        app.host.store.remove_dead_letter(&pipeline, id)?;
        tracing::info!(pipeline = %pipeline, id, changes, "dead letter replayed over the admin API");
        Ok(())
    });
    delivery
        .await
        .map_err(|e| ApiError::internal(e.to_string()))??;
    ok(json!({"id": id, "replayed": true, "changes": changes}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_token_is_strong_enough_for_any_listen() {
        for _ in 0..100 {
            let token = random_token().expect("a token");
            assert_eq!(strong_enough(&token), Ok(()), "{token}");
        }
        // What `openssl rand -hex 32` and `openssl rand -base64 32` print.
        assert_eq!(
            strong_enough("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
            Ok(())
        );
        assert_eq!(
            strong_enough("n4bQgYhMfWWaL+qgxVrQFaO/TxsrC4Is0V/sRSbNXm4="),
            Ok(())
        );
    }

    #[test]
    fn short_or_repetitive_tokens_are_too_weak_and_the_reason_does_not_quote_them() {
        for token in [
            "",
            "s3cret",
            "0123456789abcdef0123456789abcde",
            // 32 hex digits: 16 bytes of entropy, not 32.
            "9f86d081884c7d659a2feaa0c55ad015",
            // 32 random-looking letters and digits: about 190 bits.
            "q7Rk2mZx9LpW4vNc8TbY1sHd6GfJ3aEu",
            &"a".repeat(64),
            &"ab".repeat(32),
            &"abcd".repeat(16),
            &"password".repeat(4),
            &"0123456789abcdef".repeat(2),
        ] {
            let why = strong_enough(token).expect_err(token);
            assert!(why.contains("32 bytes"), "{token}: {why}");
            assert!(token.is_empty() || !why.contains(token), "{why}");
        }
    }
}
