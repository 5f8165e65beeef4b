//! The `nats` sink: each change published to a NATS JetStream stream, one
//! message per change, acknowledged only once JetStream has stored every
//! message of the batch.
//!
//! * **Once per change for a consumer.** Every message carries `Nats-Msg-Id`
//!   = pipeline, commit LSN, transaction id, chunk and index in the batch:
//!   the same change always gets the same id, so the un-checkpointed tail
//!   that a restart publishes again is dropped by the stream's duplicate
//!   window (`docs/sinks.md` says what that does and does not cover).
//! * **Acknowledged when stored.** A batch's messages are published
//!   asynchronously, at most `max_pending` awaiting their acknowledgement;
//!   `write` returns once every one was acknowledged.
//! * **Errors by what retrying can do.** No answer, a server that is down,
//!   restarting or out of space is transient (the pipeline retries with its
//!   back-off, and the slot holds); a subject no stream takes, a subject of
//!   another stream, a message too large or a permission the server denies
//!   is definite and follows `on_error`.
//! * **Order.** Messages go out on one connection in the batch's order and
//!   JetStream stores them in the order they arrive, so within a subject
//!   changes are stored in commit order.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::jetstream::{self, context::PublishErrorKind, message::PublishMessage};
use async_nats::{HeaderMap, ServerError};
use serde::Serialize;

use super::json::{Columns, Renderer, SinkChangeJson};
use super::{Sink, SinkError};
use crate::config::{NatsFormat, NatsRetention, NatsSpec, NatsStorage};
use crate::event::Lsn;
use crate::event::json::TxnJson;
use crate::transform::Transformed;
use crate::transform::encode::ChangeRef;

/// The `nats` sink's settings, checked (`config::SinkSpec::Nats`).
#[derive(Debug, Clone)]
pub(crate) struct NatsSettings {
    /// `nats://host:port`, several separated by commas.
    pub url: String,
    /// The subject template, parsed.
    pub subject: Template,
    /// The stream the subjects belong to.
    pub stream: String,
    /// The stream to create when it is missing.
    pub create: Option<StreamSettings>,
    /// `msgpack` instead of JSON.
    pub msgpack: bool,
    pub auth: Auth,
    pub tls: Tls,
    /// How long a message's acknowledgement may take.
    pub timeout: Duration,
    /// Messages awaiting their acknowledgement at most.
    pub max_pending: usize,
    pub columns: Columns,
}

/// How the sink proves who it is.
#[derive(Clone, Default)]
pub(crate) enum Auth {
    #[default]
    None,
    Token(String),
    UserPassword(String, String),
    /// An NKey seed (`SU…`).
    NKey(String),
    /// A `.creds` file: a user JWT and its NKey seed.
    Credentials(std::path::PathBuf),
}

impl std::fmt::Debug for Auth {
    // Never print a secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Auth::None => "None",
            Auth::Token(_) => "Token(..)",
            Auth::UserPassword(..) => "UserPassword(..)",
            Auth::NKey(_) => "NKey(..)",
            Auth::Credentials(_) => "Credentials(..)",
        })
    }
}

/// TLS towards the server.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tls {
    /// Refuse a connection without TLS.
    pub required: bool,
    /// CA certificates (PEM) to trust besides the system's.
    pub ca: Option<std::path::PathBuf>,
    /// A client certificate and its key (PEM), for servers that verify
    /// clients.
    pub client: Option<(std::path::PathBuf, std::path::PathBuf)>,
}

/// The stream created when it is missing.
#[derive(Debug, Clone)]
pub(crate) struct StreamSettings {
    pub subjects: Vec<String>,
    pub retention: jetstream::stream::RetentionPolicy,
    pub storage: jetstream::stream::StorageType,
    pub duplicate_window: Duration,
    pub max_age: Duration,
    pub replicas: usize,
}

impl NatsSettings {
    /// The settings of a `type = "nats"` sink. The error names the keys
    /// that do not go together.
    pub(crate) fn from_spec(spec: &NatsSpec) -> Result<NatsSettings, String> {
        let NatsSpec {
            url,
            subject,
            stream,
            create_stream,
            format,
            token,
            user,
            password,
            nkey_seed,
            credentials,
            tls,
            timeout,
            max_pending,
            column_types,
            ..
        } = spec;
        let given = [
            token.is_some(),
            user.is_some() || password.is_some(),
            nkey_seed.is_some(),
            credentials.is_some(),
        ];
        if given.iter().filter(|g| **g).count() > 1 {
            return Err(
                "the nats sink takes one way to authenticate: `token`, `user` with `password`, \
                 `nkey_seed` or `credentials`"
                    .into(),
            );
        }
        let auth = match (token, user, password, nkey_seed, credentials) {
            (Some(token), ..) => Auth::Token(token.0.clone()),
            (_, Some(user), Some(password), ..) => {
                Auth::UserPassword(user.0.clone(), password.0.clone())
            }
            (_, Some(_), None, ..) | (_, None, Some(_), ..) => {
                return Err("the nats sink's `user` and `password` go together: give both".into());
            }
            (.., Some(seed), _) => Auth::NKey(seed.0.clone()),
            (.., Some(path)) => Auth::Credentials(path.0.clone().into()),
            _ => Auth::None,
        };
        let client = match (&tls.cert, &tls.key) {
            (Some(cert), Some(key)) => Some((cert.0.clone().into(), key.0.clone().into())),
            (None, None) => None,
            _ => {
                return Err(
                    "the nats sink's `tls.cert` and `tls.key` go together: give both".into(),
                );
            }
        };
        let create = create_stream.as_ref().map(|c| StreamSettings {
            subjects: c.subjects.clone(),
            retention: match c.retention {
                NatsRetention::Limits => jetstream::stream::RetentionPolicy::Limits,
                NatsRetention::Interest => jetstream::stream::RetentionPolicy::Interest,
                NatsRetention::Workqueue => jetstream::stream::RetentionPolicy::WorkQueue,
            },
            storage: match c.storage {
                NatsStorage::File => jetstream::stream::StorageType::File,
                NatsStorage::Memory => jetstream::stream::StorageType::Memory,
            },
            duplicate_window: c.duplicate_window.0,
            max_age: c.max_age.map_or(Duration::ZERO, |a| a.0),
            replicas: c.replicas.0,
        });
        if let Some(create) = &create
            && create.subjects.is_empty()
        {
            return Err(
                "the nats sink's `create_stream.subjects` is empty: list the subjects the \
                 stream stores (e.g. [\"datum.>\"])"
                    .into(),
            );
        }
        let subject = Template::parse(subject)?;
        Ok(NatsSettings {
            url: url.0.clone(),
            subject,
            stream: stream.0.clone(),
            create,
            msgpack: *format == NatsFormat::Msgpack,
            auth,
            tls: Tls {
                required: tls.required,
                ca: tls.ca.as_ref().map(|c| c.0.clone().into()),
                client,
            },
            timeout: timeout.0,
            max_pending: max_pending.0,
            columns: Columns::from_flag(*column_types),
        })
    }
}

/// See the module documentation.
pub(crate) struct NatsSink {
    pipeline: String,
    settings: NatsSettings,
    context: jetstream::Context,
    /// What the server refused, as it says so asynchronously (a refused
    /// login or a denied publish is not an answer to a message).
    denied: Arc<Mutex<Denied>>,
    /// Whether the stream was found (and created when missing) since the
    /// connection was made.
    stream_checked: bool,
    written: u64,
    /// Messages JetStream reported as duplicates (a replay it dropped).
    duplicates: u64,
    payload: Vec<u8>,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("pipeline", &self.pipeline)
            .field("stream", &self.settings.stream)
            .field("subject", &self.settings.subject)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// Checks the settings and starts connecting; a server that cannot be
    /// reached yet is not an error here (the connection is retried in the
    /// background, and writes wait for it as for any outage).
    pub(crate) async fn open(
        pipeline: &str,
        settings: NatsSettings,
    ) -> Result<NatsSink, SinkError> {
        let denied = Arc::new(Mutex::new(Denied::default()));
        let mut options = async_nats::ConnectOptions::new()
            .name(format!("datum {pipeline}"))
            .retry_on_initial_connect()
            .connection_timeout(settings.timeout)
            .max_reconnects(None);
        options = match &settings.auth {
            Auth::None => options,
            Auth::Token(token) => options.token(token.clone()),
            Auth::UserPassword(user, password) => {
                options.user_and_password(user.clone(), password.clone())
            }
            Auth::NKey(seed) => {
                if !seed.starts_with("SU") {
                    return Err(SinkError::definite(
                        "the nats sink's nkey_seed is not a user's NKey seed (one starts with \
                         `SU`: the seed `nk -gen user` or `nsc` printed, not the public key)",
                    ));
                }
                options.nkey(seed.clone())
            }
            Auth::Credentials(path) => options.credentials_file(path).await.map_err(|e| {
                SinkError::definite(format!(
                    "the nats sink's credentials file {}: {e} (a `.creds` file holds a user \
                     JWT and its NKey seed)",
                    path.display()
                ))
            })?,
        };
        if settings.tls.required {
            options = options.require_tls(true);
        }
        if let Some(ca) = &settings.tls.ca {
            readable(ca, "tls_ca")?;
            options = options.add_root_certificates(ca.clone());
        }
        if let Some((cert, key)) = &settings.tls.client {
            readable(cert, "tls_cert")?;
            readable(key, "tls_key")?;
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        let seen = denied.clone();
        let name = pipeline.to_owned();
        options = options.event_callback(move |event| {
            let seen = seen.clone();
            let name = name.clone();
            async move { observe(&seen, &name, event) }
        });
        let client = options
            .connect(settings.url.as_str())
            .await
            .map_err(|e| SinkError::definite(format!("the nats sink's url: {e}")))?;
        let context = jetstream::ContextBuilder::new()
            .timeout(settings.timeout)
            .max_ack_inflight(settings.max_pending.max(1))
            .backpressure_on_inflight(true)
            .build(client);
        Ok(NatsSink {
            pipeline: pipeline.to_owned(),
            settings,
            context,
            denied,
            stream_checked: false,
            written: 0,
            duplicates: 0,
            payload: Vec::new(),
        })
    }

    /// Finds the stream, creating it when it is missing and the settings
    /// say how.
    async fn check_stream(&mut self) -> Result<(), SinkError> {
        if self.stream_checked {
            return Ok(());
        }
        let name = &self.settings.stream;
        match self.context.get_stream(name).await {
            Ok(_) => {}
            Err(e) if is_not_found(&e) => {
                let Some(create) = &self.settings.create else {
                    return Err(SinkError::definite(format!(
                        "the JetStream stream {name} does not exist: create it (nats stream add \
                         {name} --subjects '…'), or give the sink a `create_stream` table so \
                         Datum creates it"
                    )));
                };
                let config = jetstream::stream::Config {
                    name: name.clone(),
                    subjects: create.subjects.clone(),
                    retention: create.retention,
                    storage: create.storage,
                    duplicate_window: create.duplicate_window,
                    max_age: create.max_age,
                    num_replicas: create.replicas,
                    ..Default::default()
                };
                if let Err(e) = self.context.create_stream(config).await {
                    // Another host (or pipeline) may have created it
                    // meanwhile: then it is there now.
                    if self.context.get_stream(name).await.is_err() {
                        let message = format!("creating the JetStream stream {name}: {e}");
                        // The server's refusal (bad settings, overlapping
                        // subjects) is definite; no answer is not.
                        return Err(
                            if matches!(
                                e.kind(),
                                jetstream::context::CreateStreamErrorKind::JetStream(_)
                            ) {
                                SinkError::definite(message)
                            } else {
                                SinkError::transient(message)
                            },
                        );
                    }
                }
                tracing::info!(pipeline = %self.pipeline, stream = %name, "nats sink: created the stream");
            }
            Err(e) => {
                return Err(self.refusal(None).unwrap_or_else(|| {
                    SinkError::transient(format!(
                        "looking up the JetStream stream {name}: {e} (is the server up, with \
                         JetStream enabled?)"
                    ))
                }));
            }
        }
        self.stream_checked = true;
        Ok(())
    }

    /// A definite error when the server refused the login, or denied a
    /// publish to `subject`.
    fn refusal(&self, subject: Option<&str>) -> Option<SinkError> {
        let denied = self.denied.lock().ok()?.clone();
        if let Some(why) = denied.credentials {
            return Some(SinkError::definite(format!(
                "the NATS server refused the credentials ({why}): check the sink's `token`, \
                 `user`/`password`, `nkey_seed` or `credentials` against the server's \
                 authorization settings"
            )));
        }
        match (subject, denied.permission) {
            (Some(subject), Some(text)) if text.contains(subject) => {
                Some(SinkError::definite(format!(
                    "publishing to {subject}: the server denied it ({text}); grant the sink's \
                     user publish permission for it (and for `$JS.API.>` to look up the \
                     stream), or change the `subject` template"
                )))
            }
            _ => None,
        }
    }

    /// Publishes every change of `batches`, then waits for every
    /// acknowledgement.
    async fn publish(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        self.check_stream().await?;
        if let Ok(mut denied) = self.denied.lock() {
            denied.permission = None;
        }
        let mut pending: VecDeque<(String, jetstream::context::PublishAckFuture)> = VecDeque::new();
        let mut bytes = 0u64;
        // One for the group: each table's fixed JSON is made once.
        let mut renderer = Renderer::new(self.settings.columns);
        for batch in batches {
            let txn = batch.txn();
            let headers = TxnHeaders::new(&self.pipeline, txn);
            for (index, change) in batch.changes().enumerate() {
                let subject = self.settings.subject.render(&self.pipeline, change);
                self.payload.clear();
                encode(
                    &mut self.payload,
                    txn,
                    change,
                    &mut renderer,
                    self.settings.msgpack,
                )?;
                bytes += self.payload.len() as u64;
                let id = message_id(&self.pipeline, txn, index);
                let message = PublishMessage::build()
                    .payload(bytes::Bytes::copy_from_slice(&self.payload))
                    .headers(headers.for_change(change))
                    .message_id(&id)
                    .expected_stream(&self.settings.stream);
                let ack = self
                    .context
                    .send_publish(subject.clone(), message)
                    .await
                    .map_err(|e| self.publish_error(&subject, &e))?;
                pending.push_back((subject, ack));
                if pending.len() >= self.settings.max_pending
                    && let Some((subject, ack)) = pending.pop_front()
                {
                    self.acknowledged(&subject, ack.await).await?;
                }
            }
        }
        while let Some((subject, ack)) = pending.pop_front() {
            self.acknowledged(&subject, ack.await).await?;
        }
        self.written += bytes;
        Ok(())
    }

    async fn acknowledged(
        &mut self,
        subject: &str,
        ack: Result<jetstream::publish::PublishAck, jetstream::context::PublishError>,
    ) -> Result<(), SinkError> {
        match ack {
            Ok(ack) => {
                if ack.duplicate {
                    self.duplicates += 1;
                }
                Ok(())
            }
            Err(e) if e.kind() == PublishErrorKind::StreamNotFound => {
                Err(self.no_stream_for(subject).await)
            }
            Err(e) => Err(self.publish_error(subject, &e)),
        }
    }

    /// No stream answered for `subject`: the server is not ready (a
    /// restart), the stream is gone, or the subject is not one of its.
    async fn no_stream_for(&mut self, subject: &str) -> SinkError {
        let name = self.settings.stream.clone();
        self.stream_checked = false;
        match self.context.get_stream(&name).await {
            Ok(mut stream) => match stream.info().await {
                Ok(info) => {
                    let subjects = &info.config.subjects;
                    if subjects.iter().any(|s| subject_matches(s, subject)) {
                        SinkError::transient(format!(
                            "JetStream did not answer for {subject} (stream {name} is \
                             starting or unavailable)"
                        ))
                    } else {
                        SinkError::definite(format!(
                            "subject {subject} is not one of stream {name}'s subjects ({}): \
                             add it to the stream (nats stream edit {name} --subjects …) or \
                             change the sink's `subject` template",
                            subjects.join(", ")
                        ))
                    }
                }
                Err(e) => SinkError::transient(format!(
                    "JetStream did not answer for {subject}, nor for stream {name}'s \
                     information: {e}"
                )),
            },
            Err(e) if is_not_found(&e) => {
                if self.settings.create.is_some() {
                    SinkError::transient(format!(
                        "stream {name} disappeared; it is created again on the next attempt"
                    ))
                } else {
                    SinkError::definite(format!(
                        "the JetStream stream {name} does not exist (it was deleted?): create \
                         it, or give the sink a `create_stream` table"
                    ))
                }
            }
            Err(e) => SinkError::transient(format!(
                "JetStream did not answer for {subject}: {e} (is the server up, with \
                 JetStream enabled?)"
            )),
        }
    }

    fn publish_error(&self, subject: &str, e: &jetstream::context::PublishError) -> SinkError {
        let kind = e.kind();
        let text = e.to_string();
        let text = text.as_str();
        let code = std::error::Error::source(e)
            .and_then(|s| s.downcast_ref::<jetstream::Error>())
            .map(|e| e.error_code().0);
        if let Some(refused) = self.refusal(Some(subject)) {
            return refused;
        }
        match kind {
            PublishErrorKind::MaxPayloadExceeded => SinkError::definite(format!(
                "a change for {subject} is larger than the server's max_payload: {text}; raise \
                 max_payload in the server's configuration, or leave large columns out with a \
                 module"
            )),
            PublishErrorKind::TimedOut | PublishErrorKind::BrokenPipe => {
                SinkError::transient(format!(
                    "publishing to {subject}: {text} (no acknowledgement within {} ms; is the \
                     NATS server up?)",
                    self.settings.timeout.as_millis()
                ))
            }
            PublishErrorKind::Other => {
                classify_api_error(subject, &self.settings.stream, code, text)
            }
            _ => SinkError::transient(format!("publishing to {subject}: {text}")),
        }
    }
}

/// A JetStream API error in a publish acknowledgement, by its error code.
fn classify_api_error(subject: &str, stream: &str, code: Option<u64>, text: &str) -> SinkError {
    match code {
        // Expected stream does not match: the subject belongs to another
        // stream.
        Some(10060) => SinkError::definite(format!(
            "subject {subject} is stored by another stream than {stream}: {text}; change the \
             sink's `subject` template or `stream`"
        )),
        // Message too large for the stream (max_msg_size).
        Some(10054) => SinkError::definite(format!(
            "a change for {subject} exceeds stream {stream}'s maximum message size: {text}"
        )),
        // Out of storage or limits with DiscardNew, no leader (a restart), and
        // the like: the stream may take it later.
        _ => SinkError::transient(format!(
            "JetStream did not store a message for {subject}: {text}"
        )),
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(e)
            if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

/// What the server refused, from its asynchronous errors.
#[derive(Debug, Clone, Default)]
struct Denied {
    /// The login (until a connection succeeds).
    credentials: Option<String>,
    /// A publish (`Permissions Violation for Publish to "SUBJECT"`).
    permission: Option<String>,
}

/// Notes what a client event says and logs it (never a secret: the
/// client's events carry none).
fn observe(denied: &Mutex<Denied>, pipeline: &str, event: async_nats::Event) {
    let Ok(mut denied) = denied.lock() else {
        return;
    };
    match event {
        async_nats::Event::Connected => {
            denied.credentials = None;
            tracing::info!(pipeline = %pipeline, "nats sink: connected");
        }
        async_nats::Event::Disconnected => {
            tracing::warn!(pipeline = %pipeline, "nats sink: disconnected; reconnecting");
        }
        async_nats::Event::ServerError(ServerError::AuthorizationViolation) => {
            denied.credentials = Some("authorization violation".into());
        }
        async_nats::Event::ClientError(async_nats::ClientError::Other(text))
            if text == "authorization violation" || text == "failed signing nonce" =>
        {
            if denied.credentials.is_none() {
                tracing::warn!(pipeline = %pipeline, "nats sink: the server refused the credentials ({text})");
            }
            denied.credentials = Some(text);
        }
        async_nats::Event::ServerError(ServerError::Other(text)) => {
            tracing::warn!(pipeline = %pipeline, "nats sink: the server says: {text}");
            if text.to_ascii_lowercase().contains("permissions violation") {
                denied.permission = Some(text);
            }
        }
        async_nats::Event::ClientError(e) => {
            tracing::debug!(pipeline = %pipeline, "nats sink: {e}");
        }
        other => tracing::debug!(pipeline = %pipeline, "nats sink: {other}"),
    }
}

fn readable(path: &std::path::Path, key: &str) -> Result<(), SinkError> {
    std::fs::metadata(path).map(|_| ()).map_err(|e| {
        SinkError::definite(format!(
            "the nats sink's {key} {}: {e} (a relative path is relative to the configuration \
             file's directory)",
            path.display()
        ))
    })
}

/// Whether NATS subject `pattern` (with `*` and `>` wildcards) matches
/// `subject`.
pub(crate) fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut pattern = pattern.split('.');
    let mut subject = subject.split('.');
    loop {
        match (pattern.next(), subject.next()) {
            (Some(">"), Some(_)) => return true,
            (Some("*"), Some(_)) => {}
            (Some(p), Some(s)) if p == s => {}
            (None, None) => return true,
            _ => return false,
        }
    }
}

/// The deterministic id of the `index`th change of the batch `txn`: the
/// same change gets the same id on every replay.
pub(crate) fn message_id(pipeline: &str, txn: &datum_guest::Txn, index: usize) -> String {
    format!(
        "{pipeline}:{}:{}:{}:{index}",
        Lsn(txn.commit_lsn),
        txn.xid,
        txn.chunk
    )
}

/// The headers every message of a batch carries.
struct TxnHeaders {
    base: HeaderMap,
}

impl TxnHeaders {
    fn new(pipeline: &str, txn: &datum_guest::Txn) -> TxnHeaders {
        let mut base = HeaderMap::new();
        base.insert("Datum-Pipeline", pipeline);
        base.insert("Datum-Xid", txn.xid.to_string().as_str());
        base.insert("Datum-Commit-Lsn", Lsn(txn.commit_lsn).to_string().as_str());
        base.insert("Datum-End-Lsn", Lsn(txn.end_lsn).to_string().as_str());
        base.insert(
            "Datum-Commit-Time",
            crate::event::text::format_timestamp(
                datum_guest::wire::Timestamp::Micros(txn.commit_time),
                true,
            )
            .as_str(),
        );
        base.insert("Datum-Chunk", txn.chunk.to_string().as_str());
        TxnHeaders { base }
    }

    fn for_change(&self, change: ChangeRef<'_>) -> HeaderMap {
        let mut headers = self.base.clone();
        headers.insert("Datum-Op", op_name(change));
        headers
    }
}

fn op_name(change: ChangeRef<'_>) -> &'static str {
    use crate::event::Change as Source;
    use datum_guest::wire::Op;
    let op = match change {
        ChangeRef::Wire(c) => c.op,
        ChangeRef::Source(Source::Insert { .. }) => Op::Insert,
        ChangeRef::Source(Source::Snapshot { .. }) => Op::Snapshot,
        ChangeRef::Source(Source::Update { .. }) => Op::Update,
        ChangeRef::Source(Source::Delete { .. }) => Op::Delete,
        ChangeRef::Source(Source::Truncate { .. }) => Op::Truncate,
        ChangeRef::Source(Source::Schema { .. }) => Op::Schema,
        ChangeRef::Source(Source::Message { .. }) => Op::Message,
    };
    op.as_str()
}

/// A message's body: the change in the file sink's JSON form (`txn` and
/// the change's fields, written by `renderer`), or the same map in
/// MessagePack.
fn encode<'a>(
    out: &mut Vec<u8>,
    txn: &datum_guest::Txn,
    change: ChangeRef<'a>,
    renderer: &mut Renderer<'a>,
    msgpack: bool,
) -> Result<(), SinkError> {
    if !msgpack {
        out.extend_from_slice(b"{\"txn\":");
        crate::sink::jsonl::write_txn(out, txn);
        out.push(b',');
        renderer.write_rest(out, change);
        return Ok(());
    }
    #[derive(Serialize)]
    struct Line<'a> {
        txn: TxnJson<'a>,
        #[serde(flatten)]
        change: SinkChangeJson<'a>,
    }
    let line = Line {
        txn: TxnJson(txn),
        change: SinkChangeJson(change, renderer.columns()),
    };
    line.serialize(&mut rmp_serde::Serializer::new(&mut *out).with_struct_map())
        .map_err(|e| SinkError::definite(format!("encoding a change: {e}")))
}

/// A subject template: literal text and `{pipeline}`, `{schema}`,
/// `{table}`, `{op}` and `{route}`.
#[derive(Debug, Clone)]
pub(crate) struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Pipeline,
    Schema,
    Table,
    Op,
    Route,
}

impl Template {
    /// Parses `text`; the error names what is wrong.
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let mut parts = Vec::new();
        let mut rest = text;
        while let Some(open) = rest.find('{') {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let Some(close) = rest[open..].find('}') else {
                return Err(format!(
                    "the nats sink's subject {text:?} has a `{{` without its `}}`"
                ));
            };
            let name = &rest[open + 1..open + close];
            parts.push(match name {
                "pipeline" => Part::Pipeline,
                "schema" => Part::Schema,
                "table" => Part::Table,
                "op" => Part::Op,
                "route" => Part::Route,
                other => {
                    return Err(format!(
                        "the nats sink's subject {text:?} names {{{other}}}; the placeholders \
                         are {{pipeline}}, {{schema}}, {{table}}, {{op}} and {{route}}"
                    ));
                }
            });
            rest = &rest[open + close + 1..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        let literal: String = parts
            .iter()
            .filter_map(|p| match p {
                Part::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        if literal.contains(['*', '>', ' ', '\t', '\r', '\n']) || text.is_empty() {
            return Err(format!(
                "the nats sink's subject {text:?} must be a subject to publish to: no \
                 wildcards (`*`, `>`) or spaces"
            ));
        }
        // Every placeholder is one non-empty token, so the literal text
        // decides whether a token can be empty.
        let sample: String = parts
            .iter()
            .map(|p| match p {
                Part::Text(t) => t.as_str(),
                _ => "x",
            })
            .collect();
        if sample.split('.').any(str::is_empty) {
            return Err(format!(
                "the nats sink's subject {text:?} has an empty token (a leading or trailing \
                 `.`, or `..`)"
            ));
        }
        Ok(Template { parts })
    }

    /// The subject of `change`. Each placeholder becomes one subject token:
    /// characters a token cannot hold (`.`, `*`, `>`, spaces) become `_`,
    /// and an empty value (a logical message has no table) is `_`.
    pub(crate) fn render(&self, pipeline: &str, change: ChangeRef<'_>) -> String {
        let (schema, table, route) = names(change);
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Text(text) => out.push_str(text),
                Part::Pipeline => push_token(&mut out, pipeline),
                Part::Schema => push_token(&mut out, schema),
                Part::Table => push_token(&mut out, table),
                Part::Op => out.push_str(op_name(change)),
                Part::Route => match route {
                    Some(route) => push_token(&mut out, route),
                    None => {
                        push_token(&mut out, schema);
                        out.push('.');
                        push_token(&mut out, table);
                    }
                },
            }
        }
        out
    }
}

fn names(change: ChangeRef<'_>) -> (&str, &str, Option<&str>) {
    use crate::event::Change as Source;
    match change {
        ChangeRef::Wire(c) => (&c.schema, &c.table, c.route.as_deref()),
        ChangeRef::Source(
            Source::Insert { relation, .. }
            | Source::Snapshot { relation, .. }
            | Source::Update { relation, .. }
            | Source::Delete { relation, .. },
        ) => (&relation.schema, &relation.table, None),
        ChangeRef::Source(Source::Truncate { relations, .. }) => relations
            .first()
            .map_or(("", "", None), |r| (&r.schema, &r.table, None)),
        ChangeRef::Source(_) => ("", "", None),
    }
}

fn push_token(out: &mut String, value: &str) {
    if value.is_empty() {
        out.push('_');
        return;
    }
    out.extend(value.chars().map(|c| match c {
        '.' | '*' | '>' => '_',
        c if c.is_whitespace() || c.is_control() => '_',
        c => c,
    }));
}

impl Sink for NatsSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        self.publish(std::slice::from_ref(batch)).await
    }

    async fn write_group(&mut self, batches: &[Transformed]) -> Result<(), SinkError> {
        self.publish(batches).await
    }

    fn bytes_written(&self) -> u64 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_match_like_the_server_matches_them() {
        assert!(subject_matches("datum.>", "datum.p.public.t"));
        assert!(subject_matches("datum.*.public.*", "datum.p.public.t"));
        assert!(subject_matches("datum.p.public.t", "datum.p.public.t"));
        assert!(!subject_matches("datum.*", "datum.p.public"));
        assert!(!subject_matches("datum.>", "datum"));
        assert!(!subject_matches("other.>", "datum.p"));
    }

    #[test]
    fn a_template_names_its_mistakes() {
        assert!(Template::parse("datum.{pipeline}.{schema}.{table}").is_ok());
        let unknown = Template::parse("datum.{tabel}").expect_err("unknown placeholder");
        assert!(
            unknown.contains("{tabel}") && unknown.contains("{table}"),
            "{unknown}"
        );
        let open = Template::parse("datum.{table").expect_err("unclosed");
        assert!(open.contains("without its"), "{open}");
        let wild = Template::parse("datum.*.{table}").expect_err("wildcard");
        assert!(wild.contains("wildcards"), "{wild}");
        for empty in [
            "datum..{table}",
            ".{table}",
            "{table}.",
            "datum.{schema}{table}.",
        ] {
            let refused = Template::parse(empty).expect_err(empty);
            assert!(refused.contains("empty token"), "{refused}");
        }
        assert!(Template::parse("{schema}{table}").is_ok());
    }

    #[test]
    fn placeholders_become_single_tokens() {
        let template = Template::parse("d.{pipeline}.{schema}.{table}.{op}").expect("template");
        let mut change = datum_guest::Change::new(datum_guest::Op::Insert, "sales eu", "orders.v2");
        let rendered = template.render("p1", ChangeRef::Wire(&change));
        assert_eq!(rendered, "d.p1.sales_eu.orders_v2.insert");
        change.route = Some("crm".into());
        let routed = Template::parse("d.{route}").expect("template");
        assert_eq!(routed.render("p1", ChangeRef::Wire(&change)), "d.crm");
        change.route = None;
        assert_eq!(
            routed.render("p1", ChangeRef::Wire(&change)),
            "d.sales_eu.orders_v2"
        );
        let message = datum_guest::Change::new(datum_guest::Op::Message, "", "");
        assert_eq!(
            template.render("p", ChangeRef::Wire(&message)),
            "d.p._._.message"
        );
    }

    #[test]
    fn the_msgpack_body_is_the_json_body_in_messagepack() {
        let txn = datum_guest::Txn {
            xid: 9,
            commit_lsn: 0x10,
            end_lsn: 0x20,
            last: true,
            ..Default::default()
        };
        let mut change = datum_guest::Change::new(datum_guest::Op::Insert, "public", "t");
        let mut row = datum_guest::Row::default();
        row.set("id", datum_guest::Value::Int(7));
        row.set("note", datum_guest::Value::Text("hé".into()));
        change.new = Some(row);
        let (mut json, mut packed) = (Vec::new(), Vec::new());
        let mut renderer = Renderer::new(Columns::Typed);
        encode(
            &mut json,
            &txn,
            ChangeRef::Wire(&change),
            &mut renderer,
            false,
        )
        .expect("json");
        encode(
            &mut packed,
            &txn,
            ChangeRef::Wire(&change),
            &mut renderer,
            true,
        )
        .expect("msgpack");
        // The same bytes as serde writes the line (`txn`, then the change's
        // fields flattened in).
        #[derive(Serialize)]
        struct Line<'a> {
            txn: TxnJson<'a>,
            #[serde(flatten)]
            change: SinkChangeJson<'a>,
        }
        let by_serde = serde_json::to_vec(&Line {
            txn: TxnJson(&txn),
            change: SinkChangeJson(ChangeRef::Wire(&change), Columns::Typed),
        })
        .expect("serialize");
        assert_eq!(
            String::from_utf8_lossy(&json),
            String::from_utf8_lossy(&by_serde)
        );
        let json: serde_json::Value = serde_json::from_slice(&json).expect("a JSON object");
        let unpacked: serde_json::Value =
            rmp_serde::from_slice(&packed).expect("a MessagePack map");
        assert_eq!(json, unpacked);
        assert_eq!(json["txn"]["xid"], 9, "{json}");
        assert_eq!(json["new"]["note"], "hé", "{json}");
    }

    #[test]
    fn message_ids_are_stable_and_distinct() {
        let txn = datum_guest::Txn {
            xid: 7,
            commit_lsn: 0x16B3748,
            chunk: 2,
            ..Default::default()
        };
        assert_eq!(message_id("p", &txn, 3), "p:0/16B3748:7:2:3");
        assert_ne!(message_id("p", &txn, 3), message_id("p", &txn, 4));
    }

    #[test]
    fn api_errors_are_definite_only_when_retrying_cannot_help() {
        let other = classify_api_error(
            "s",
            "S",
            Some(10060),
            "publish failed: expected stream does not match (code 400, error code 10060)",
        );
        assert!(!other.is_transient(), "{other}");
        let full = classify_api_error(
            "s",
            "S",
            Some(10077),
            "publish failed: maximum messages exceeded (code 503, error code 10077)",
        );
        assert!(full.is_transient(), "{full}");
    }
}
