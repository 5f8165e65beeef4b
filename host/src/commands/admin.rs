//! `datum admin`: the admin API's command-line client (docs/admin.md).
//!
//! [`run`] does a whole command: it finds the API and its token
//! ([`resolve`]), turns the [`Request`] into an HTTP call (reading the module,
//! its configuration and fixtures for a swap), sends it with the bearer token
//! ([`Client`]) and renders the answer, as it came with `--json` or as a
//! short summary ([`render`]). Its errors carry their exit status
//! ([`ClientError::exit_code`]): 1 when the API refused, 2 when it could not
//! be asked.
//!
//! The token is never printed: [`Token`]'s `Debug` hides it, errors do not
//! quote it, and the `Authorization` header is marked sensitive.

use std::fmt::{self, Write as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Method;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::canary::CanaryStart;
use super::summary::{field, list, short_sha};
use crate::event::ordered::{Ordered, to_pretty};

use crate::config::AdminConfig;

/// The API's address when neither `--url` nor `--config` gives one.
pub(crate) const DEFAULT_URL: &str = "http://127.0.0.1:7070";

/// The environment variable that holds the token.
pub(crate) const TOKEN_ENV: &str = "DATUM_ADMIN_TOKEN";

/// How long a request may take when the configuration does not say: the
/// host's own default `request_timeout` (30 s) and a margin.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(40);

/// How long connecting may take: the API is usually on this machine.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

// ---------------------------------------------------------------------------
// What to do.

/// A bearer token. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// The token itself, for the `Authorization` header.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Token {
    fn from(token: String) -> Token {
        Token(token)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

/// Where the API is and how to prove who we are, as the command line says.
#[derive(Debug, Clone, Default)]
pub(crate) struct Connection {
    /// `--config`: the host's configuration file, for its `[admin]` table.
    pub config: Option<PathBuf>,
    /// `--url`: the API's base URL; wins over the configuration's `listen`.
    pub url: Option<String>,
    /// `--token`: wins over the configuration, the environment and the
    /// token file.
    pub token: Option<Token>,
}

/// The API to call, resolved from a [`Connection`].
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Base URL without a trailing `/`, such as `http://127.0.0.1:7070`.
    pub url: String,
    /// The bearer token.
    pub token: Token,
    /// How long a request may take before it counts as unanswered.
    pub timeout: Duration,
}

/// A `datum admin` command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// `status [PIPELINE]`: every pipeline's status, or one's.
    Status {
        /// The pipeline; every pipeline when absent.
        pipeline: Option<String>,
    },
    /// `pause PIPELINE`.
    Pause {
        /// The pipeline.
        pipeline: String,
    },
    /// `resume PIPELINE`.
    Resume {
        /// The pipeline.
        pipeline: String,
    },
    /// `backfill PIPELINE TABLE... [--from KEY...]`.
    Backfill {
        /// The pipeline.
        pipeline: String,
        /// The tables.
        tables: Vec<String>,
        /// Copy only rows after this key.
        from: Option<Vec<String>>,
    },
    /// `versions PIPELINE [MODULE]`: a module's versions, or every module's.
    Versions {
        /// The pipeline.
        pipeline: String,
        /// The transform's name; every transform when absent.
        module: Option<String>,
    },
    /// `swap PIPELINE MODULE FILE.wasm`: upload a new version.
    Swap {
        /// The pipeline.
        pipeline: String,
        /// The transform's name.
        module: String,
        /// The new module.
        file: PathBuf,
        /// The module's configuration (TOML); by default the host keeps the
        /// active version's.
        config_file: Option<PathBuf>,
        /// Golden fixtures the host runs before it accepts the module.
        fixtures: Option<PathBuf>,
        /// Check only: nothing is stored or activated.
        dry_run: bool,
        /// Run it as a canary beside the active version instead of
        /// activating it.
        canary: Option<CanaryStart>,
    },
    /// `rollback PIPELINE MODULE [--to N]`.
    Rollback {
        /// The pipeline.
        pipeline: String,
        /// The transform's name.
        module: String,
        /// The version to re-activate; by default the one active before the
        /// current one.
        to: Option<u64>,
    },
    /// `canary PIPELINE [show [--record DIR] | promote | abort]`.
    Canary {
        /// The pipeline.
        pipeline: String,
        /// What to do with its canary.
        action: CanaryAction,
    },
    /// `dead-letters PIPELINE [list | show ID | replay ID | discard ID]`.
    DeadLetters {
        /// The pipeline.
        pipeline: String,
        /// What to do with them.
        action: DeadLetterAction,
    },
}

/// What `canary` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanaryAction {
    /// Print the report; with a directory, also write each kept
    /// difference there as a fixture.
    Show(Option<PathBuf>),
    /// Make the canary the active version.
    Promote,
    /// Stop it.
    Abort,
}

/// What `dead-letters` does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeadLetterAction {
    /// List them (the default).
    #[default]
    List,
    /// Print one's input batch.
    Show(u64),
    /// Run one through the modules and the sink again.
    Replay(u64),
    /// Delete one.
    Discard(u64),
}

/// A whole `datum admin` invocation.
#[derive(Debug, Clone)]
pub(crate) struct Args {
    /// Where the API is.
    pub connection: Connection,
    /// Print the API's JSON answer instead of a summary.
    pub json: bool,
    /// What to ask.
    pub request: Request,
}

/// Why a command did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The API answered with an error status (exit status 1).
    #[error("{}{message}", prefix(.code))]
    Refused {
        /// The HTTP status.
        status: u16,
        /// The error's `code` (`not_found`, `invalid_module`, ...), when the
        /// body has the API's error shape.
        code: Option<String>,
        /// The error's `message`, or the status line (and the start of the
        /// body) when the body is not the API's.
        message: String,
        /// The body, pretty-printed, when `--json` asked for it.
        json: Option<String>,
    },
    /// The host could not be reached or did not answer (exit status 2).
    #[error("cannot reach the admin API ({cause}): {hint}; tried {url}")]
    Unreachable {
        /// The base URL tried.
        url: String,
        /// What went wrong.
        cause: String,
        /// What to check.
        hint: &'static str,
    },
    /// The arguments, the configuration, the token or a file to upload are
    /// not usable (exit status 2).
    #[error("{0}")]
    Usage(String),
}

/// `CODE: ` before an API error's message.
fn prefix(code: &Option<String>) -> String {
    code.as_deref()
        .map(|code| format!("{code}: "))
        .unwrap_or_default()
}

impl ClientError {
    /// The process exit status: 1 when the API refused, 2 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Refused { .. } => 1,
            ClientError::Unreachable { .. } | ClientError::Usage(_) => 2,
        }
    }

    /// The API's error body, pretty-printed, when `--json` asked for it.
    pub fn json(&self) -> Option<&str> {
        match self {
            ClientError::Refused { json, .. } => json.as_deref(),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------
// The whole command.

/// `datum admin`: one request to a running host; its answer printed.
pub(crate) fn command(args: Args) -> Result<super::Outcome, super::CommandError> {
    let output = super::block_on(run(&args))??;
    super::say(&output);
    Ok(super::Outcome::Success)
}

/// Runs a command: resolves the API (with `DATUM_ADMIN_TOKEN` from the
/// environment), calls it, and returns what to print on standard output.
pub(crate) async fn run(args: &Args) -> Result<String, ClientError> {
    let target = resolve(&args.connection, std::env::var(TOKEN_ENV).ok())?;
    let call = prepare(&args.request)?;
    let client = Client::new(target)?;
    let body = client.call(call, args.json).await?;
    let mut out = if args.json {
        pretty(&body)
    } else {
        render(&args.request, &body)
    };
    if let Request::Canary {
        pipeline,
        action: CanaryAction::Show(Some(dir)),
    } = &args.request
    {
        let (indices, skipped) = super::canary::recordable(&body).map_err(ClientError::Usage)?;
        let mut fixtures = Vec::new();
        for index in indices {
            let path = format!("{}/canary/differences/{index}", pipeline_path(pipeline)?);
            let fixture = client.get(path).await?;
            fixtures.push(serde_json::from_str::<Value>(&fixture).map_err(|e| {
                ClientError::Usage(format!("difference {index} is not a fixture's JSON: {e}"))
            })?);
        }
        let recorded =
            super::canary::write_fixtures(dir, &fixtures, skipped).map_err(ClientError::Usage)?;
        if !args.json {
            out.push_str(&recorded);
        }
    }
    Ok(out)
}

// ---------------------------------------------------------------------------
// Address and token.

/// Finds the API's URL and token. `env_token` is `DATUM_ADMIN_TOKEN`'s
/// value, if set.
///
/// Without `--config`: `--url` (default [`DEFAULT_URL`]), and `--token` or
/// `env_token`. With it: the `[admin]` table's `listen` address, and its
/// `token`, else `env_token`, else the token file the host writes at start;
/// `--url` and `--token` still win.
pub(crate) fn resolve(
    connection: &Connection,
    env_token: Option<String>,
) -> Result<Target, ClientError> {
    let config = match &connection.config {
        Some(path) => Some((
            path.as_path(),
            AdminConfig::load(path).map_err(|e| ClientError::Usage(e.to_string()))?,
        )),
        None => None,
    };
    resolve_with(
        connection,
        config.as_ref().map(|(path, config)| (*path, config)),
        env_token,
        |path| std::fs::read_to_string(path),
    )
}

/// [`resolve`] with the configuration already loaded and the token file read
/// through `read`.
fn resolve_with(
    connection: &Connection,
    config: Option<(&Path, &AdminConfig)>,
    env_token: Option<String>,
    read: impl Fn(&Path) -> std::io::Result<String>,
) -> Result<Target, ClientError> {
    let env_token = env_token.and_then(nonempty).map(Token);
    let flag_token = match &connection.token {
        Some(token) => Some(
            nonempty(token.0.clone())
                .map(Token)
                .ok_or_else(|| ClientError::Usage("--token is empty".into()))?,
        ),
        None => None,
    };
    let (url, token, timeout) = match config {
        None => {
            let token = flag_token.clone().or(env_token).ok_or_else(|| {
                ClientError::Usage(format!(
                    "no admin token: give --token, set {TOKEN_ENV}, or give --config with \
                     the host's configuration file (its [admin] token, or the token file the \
                     host writes at start)"
                ))
            })?;
            let url = connection.url.as_deref().unwrap_or(DEFAULT_URL);
            (url.to_owned(), token, DEFAULT_TIMEOUT)
        }
        Some((path, config)) => {
            let Some(admin) = &config.admin else {
                return Err(ClientError::Usage(format!(
                    "{} has no [admin] table, so its host serves no admin API: add one \
                     (`[admin]` with `listen = \"127.0.0.1:7070\"`, docs/admin.md) and restart \
                     `datum run`",
                    path.display()
                )));
            };
            let url = match &connection.url {
                Some(url) => url.clone(),
                None => url_of(admin.listen.0),
            };
            let configured = admin.token.as_ref().and_then(|t| nonempty(t.0.clone()));
            let token = match flag_token.or(configured.map(Token)).or(env_token) {
                Some(token) => token,
                None => {
                    let file = admin.token_file(&config.state.0);
                    let text = read(&file).map_err(|err| {
                        ClientError::Usage(format!(
                            "no admin token: {}'s [admin] has no `token`, {TOKEN_ENV} is not \
                             set, and the token file {} cannot be read ({err}): is `datum run` \
                             running with this configuration? It writes the file at start",
                            path.display(),
                            file.display()
                        ))
                    })?;
                    nonempty(text).map(Token).ok_or_else(|| {
                        ClientError::Usage(format!(
                            "the token file {} is empty: restart `datum run` to write a new \
                             one, or give --token",
                            file.display()
                        ))
                    })?
                }
            };
            (
                url,
                token,
                admin.request_timeout.0 + Duration::from_secs(10),
            )
        }
    };
    Ok(Target {
        url: check_url(&url)?,
        token,
        timeout,
    })
}

/// The trimmed text, or `None` when nothing is left.
fn nonempty(text: String) -> Option<String> {
    let trimmed = text.trim();
    (!trimmed.is_empty()).then(|| trimmed.to_owned())
}

/// The URL that reaches a listen address: an unspecified address
/// (`0.0.0.0`, `[::]`) is reached on loopback.
fn url_of(mut addr: std::net::SocketAddr) -> String {
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr.ip() {
            std::net::IpAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::IpAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{addr}")
}

/// Checks a base URL and drops its trailing `/`.
fn check_url(url: &str) -> Result<String, ClientError> {
    let parsed = reqwest::Url::parse(url).map_err(|err| {
        ClientError::Usage(format!(
            "--url `{url}` is not a URL ({err}): write one like {DEFAULT_URL}"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host().is_none() {
        return Err(ClientError::Usage(format!(
            "--url `{url}` is not an http:// or https:// URL: write one like {DEFAULT_URL}"
        )));
    }
    if parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(ClientError::Usage(format!(
            "--url `{url}` has a query or fragment: give the API's base URL, like {DEFAULT_URL}"
        )));
    }
    Ok(url.trim_end_matches('/').to_owned())
}

// ---------------------------------------------------------------------------
// Requests.

/// One HTTP call, ready to send.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Call {
    method: Method,
    /// From the base URL on: `/v1/...`.
    path: String,
    /// Content type and body.
    body: Option<(String, Vec<u8>)>,
}

/// The call a request makes; reads the files a swap uploads.
fn prepare(request: &Request) -> Result<Call, ClientError> {
    let get = |path: String| Call {
        method: Method::GET,
        path,
        body: None,
    };
    let post = |path: String, body: Option<(String, Vec<u8>)>| Call {
        method: Method::POST,
        path,
        body,
    };
    let call = match request {
        Request::Status { pipeline: None } => get("/v1/pipelines".into()),
        Request::Status {
            pipeline: Some(pipeline),
        } => get(pipeline_path(pipeline)?),
        Request::Pause { pipeline } => post(format!("{}/pause", pipeline_path(pipeline)?), None),
        Request::Resume { pipeline } => post(format!("{}/resume", pipeline_path(pipeline)?), None),
        Request::Backfill {
            pipeline,
            tables,
            from,
        } => {
            let mut body = serde_json::json!({ "tables": tables });
            if let Some(from) = from {
                body["from"] = serde_json::json!(from);
            }
            post(
                format!("{}/backfill", pipeline_path(pipeline)?),
                Some(("application/json".to_owned(), body.to_string().into_bytes())),
            )
        }
        Request::Versions { pipeline, module } => match module {
            None => get(format!("{}/modules", pipeline_path(pipeline)?)),
            Some(module) => get(module_path(pipeline, module)?),
        },
        Request::Swap {
            pipeline,
            module,
            file,
            config_file,
            fixtures,
            dry_run,
            canary,
        } => {
            let mut path = match canary {
                Some(start) => super::canary::start_path(&module_path(pipeline, module)?, start),
                None => format!("{}/versions", module_path(pipeline, module)?),
            };
            if *dry_run {
                path.push_str("?dry_run=true");
            }
            let wasm = read_file(file, "the module")?;
            let body = if config_file.is_none() && fixtures.is_none() {
                ("application/wasm".to_owned(), wasm)
            } else {
                let mut parts = vec![Part {
                    name: "module".into(),
                    filename: Some(file_name(file)?),
                    content_type: "application/wasm".into(),
                    data: wasm,
                }];
                if let Some(config) = config_file {
                    parts.push(Part {
                        name: "config".into(),
                        filename: None,
                        content_type: "application/toml".into(),
                        data: read_file(config, "the module configuration")?,
                    });
                }
                if let Some(dir) = fixtures {
                    parts.extend(fixture_parts(dir)?);
                }
                let (boundary, body) = multipart(&parts);
                (format!("multipart/form-data; boundary={boundary}"), body)
            };
            post(path, Some(body))
        }
        Request::Rollback {
            pipeline,
            module,
            to,
        } => {
            let body = match to {
                Some(version) => serde_json::json!({ "version": version }),
                None => serde_json::json!({}),
            };
            post(
                format!("{}/rollback", module_path(pipeline, module)?),
                Some(("application/json".into(), body.to_string().into_bytes())),
            )
        }
        Request::Canary { pipeline, action } => {
            let base = format!("{}/canary", pipeline_path(pipeline)?);
            match action {
                CanaryAction::Show(_) => get(base),
                CanaryAction::Promote => post(format!("{base}/promote"), None),
                CanaryAction::Abort => post(format!("{base}/abort"), None),
            }
        }
        Request::DeadLetters { pipeline, action } => {
            let base = format!("{}/dead-letters", pipeline_path(pipeline)?);
            match action {
                DeadLetterAction::List => get(base),
                DeadLetterAction::Show(id) => get(format!("{base}/{id}")),
                DeadLetterAction::Replay(id) => post(format!("{base}/{id}/replay"), None),
                DeadLetterAction::Discard(id) => Call {
                    method: Method::DELETE,
                    path: format!("{base}/{id}"),
                    body: None,
                },
            }
        }
    };
    Ok(call)
}

fn pipeline_path(pipeline: &str) -> Result<String, ClientError> {
    Ok(format!("/v1/pipelines/{}", segment(pipeline, "pipeline")?))
}

fn module_path(pipeline: &str, module: &str) -> Result<String, ClientError> {
    Ok(format!(
        "{}/modules/{}",
        pipeline_path(pipeline)?,
        segment(module, "module")?
    ))
}

/// A path segment, percent-encoded.
fn segment(name: &str, what: &str) -> Result<String, ClientError> {
    if name.is_empty() {
        return Err(ClientError::Usage(format!("the {what} name is empty")));
    }
    let mut out = String::new();
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    Ok(out)
}

fn read_file(path: &Path, what: &str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path)
        .map_err(|err| ClientError::Usage(format!("cannot read {what} {}: {err}", path.display())))
}

fn file_name(path: &Path) -> Result<String, ClientError> {
    path.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| {
            ClientError::Usage(format!(
                "{} has no file name the API can be told (it must be UTF-8)",
                path.display()
            ))
        })
}

/// Whether a file in a fixtures directory is part of the suite.
fn is_fixture(name: &str) -> bool {
    name == "config.toml"
        || [".input.json", ".expected.json", ".config.toml"]
            .iter()
            .any(|suffix| name.len() > suffix.len() && name.ends_with(suffix))
}

/// A part per fixture file of `dir`, in file name order.
fn fixture_parts(dir: &Path) -> Result<Vec<Part>, ClientError> {
    let unreadable = |err: std::io::Error| {
        ClientError::Usage(format!(
            "cannot read the fixtures directory {}: {err}",
            dir.display()
        ))
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(unreadable)? {
        let path = entry.map_err(unreadable)?.path();
        if !path.is_file() {
            continue;
        }
        let name = file_name(&path)?;
        if is_fixture(&name) {
            files.push((name, path));
        }
    }
    if !files.iter().any(|(name, _)| name.ends_with(".input.json")) {
        return Err(ClientError::Usage(format!(
            "{} has no NAME.input.json fixture (docs/fixtures.md): nothing to test the \
             module with",
            dir.display()
        )));
    }
    files.sort();
    files
        .into_iter()
        .map(|(name, path)| {
            let content_type = if name.ends_with(".json") {
                "application/json"
            } else {
                "application/toml"
            };
            Ok(Part {
                name: "fixture".into(),
                content_type: content_type.into(),
                data: read_file(&path, "the fixture")?,
                filename: Some(name),
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------
// multipart/form-data.

/// One part of a `multipart/form-data` body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    /// The form field's name (`module`, `config`, `fixture`).
    pub name: String,
    /// The file name, for file parts.
    pub filename: Option<String>,
    /// The part's `Content-Type`.
    pub content_type: String,
    /// The part's bytes.
    pub data: Vec<u8>,
}

/// A `multipart/form-data` body (RFC 7578) of `parts`: the boundary and the
/// bytes. The boundary is derived from the contents and occurs in none of
/// them.
pub(crate) fn multipart(parts: &[Part]) -> (String, Vec<u8>) {
    let mut digest = Sha256::new();
    for part in parts {
        digest.update(&part.data);
    }
    let seed = digest.finalize();
    let candidates = (0u32..).map(|n| {
        let hash = Sha256::new()
            .chain_update(seed)
            .chain_update(n.to_le_bytes());
        let hex: String = hash.finalize()[..12]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!("datum-{hex}")
    });
    let boundary = first_absent(parts, candidates);
    let mut body = Vec::new();
    for part in parts {
        body.extend_from_slice(format!("--{boundary}\r\n").as_bytes());
        let mut disposition = format!(
            "Content-Disposition: form-data; name=\"{}\"",
            quoted(&part.name)
        );
        if let Some(filename) = &part.filename {
            let _ = write!(disposition, "; filename=\"{}\"", quoted(filename));
        }
        body.extend_from_slice(disposition.as_bytes());
        body.extend_from_slice(
            format!("\r\nContent-Type: {}\r\n\r\n", part.content_type).as_bytes(),
        );
        body.extend_from_slice(&part.data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (boundary, body)
}

/// The first candidate boundary whose delimiter occurs in no part.
fn first_absent(parts: &[Part], candidates: impl IntoIterator<Item = String>) -> String {
    candidates
        .into_iter()
        .find(|boundary| {
            let delimiter = format!("--{boundary}");
            !parts
                .iter()
                .any(|p| contains(&p.data, delimiter.as_bytes()))
        })
        .unwrap_or_else(|| "datum-boundary".into())
}

/// A name inside a quoted header parameter, escaped as browsers do (the
/// HTML standard's form encoding).
fn quoted(name: &str) -> String {
    name.replace('"', "%22")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---------------------------------------------------------------------------
// HTTP.

/// An HTTP client of one admin API.
#[derive(Debug)]
pub(crate) struct Client {
    http: reqwest::Client,
    url: String,
    auth: HeaderValue,
}

impl Client {
    /// A client of `target`'s API.
    pub(crate) fn new(target: Target) -> Result<Client, ClientError> {
        let mut auth = HeaderValue::from_str(&format!("Bearer {}", target.token.expose()))
            .map_err(|_| {
                ClientError::Usage(
                    "the admin token has characters an HTTP header cannot carry (control \
                     characters or non-ASCII)"
                        .into(),
                )
            })?;
        auth.set_sensitive(true);
        let http = reqwest::Client::builder()
            .timeout(target.timeout)
            .connect_timeout(CONNECT_TIMEOUT)
            // The token must go to the API only: no proxy, no redirect.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("datum-admin/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|err| {
                ClientError::Usage(format!("cannot build the HTTP client: {}", chain(&err)))
            })?;
        Ok(Client {
            http,
            url: target.url,
            auth,
        })
    }

    /// Sends `call`; the body of a success, or [`ClientError::Refused`]
    /// with the API's error (and its body when `json`).
    async fn call(&self, call: Call, json: bool) -> Result<String, ClientError> {
        let mut request = self
            .http
            .request(call.method, format!("{}{}", self.url, call.path))
            .header(AUTHORIZATION, self.auth.clone());
        if let Some((content_type, body)) = call.body {
            request = request.header(CONTENT_TYPE, content_type).body(body);
        }
        let response = request.send().await.map_err(|e| self.unreachable(&e))?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(|e| self.unreachable(&e))?;
        let body = String::from_utf8_lossy(&bytes).into_owned();
        if status.is_success() {
            Ok(body)
        } else {
            Err(refusal(status, &body, json))
        }
    }

    /// GETs `path` (from `/v1` on); the body of a success.
    pub(crate) async fn get(&self, path: String) -> Result<String, ClientError> {
        self.call(
            Call {
                method: Method::GET,
                path,
                body: None,
            },
            false,
        )
        .await
    }

    fn unreachable(&self, err: &reqwest::Error) -> ClientError {
        let (cause, hint) = if err.is_timeout() {
            (
                "no answer in time".to_owned(),
                "the host may be busy or stuck",
            )
        } else if err.is_connect() {
            // The innermost cause says it best ("Connection refused").
            let mut cause: &dyn std::error::Error = err;
            while let Some(next) = cause.source() {
                cause = next;
            }
            (
                cause.to_string(),
                "is `datum run` running with an [admin] table? Give its address with --url, \
                 or its configuration file with --config",
            )
        } else {
            (
                chain(err),
                "is this the address of a `datum run` admin API?",
            )
        };
        ClientError::Unreachable {
            url: self.url.clone(),
            cause,
            hint,
        }
    }
}

/// The error of a refused request: the API's `{"error": {"code",
/// "message"}}`, or the status line and the start of a body of another shape.
fn refusal(status: reqwest::StatusCode, body: &str, json: bool) -> ClientError {
    let parsed = serde_json::from_str::<Value>(body).ok();
    let error = parsed.as_ref().and_then(|v| v.get("error"));
    let code = error
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let message = match (&code, error.and_then(|e| e.get("message"))) {
        (Some(_), Some(Value::String(message))) => message.clone(),
        (Some(_), Some(other)) => other.to_string(),
        _ => {
            let excerpt: String = body.trim().chars().take(200).collect();
            if excerpt.is_empty() {
                format!("HTTP {status}")
            } else {
                format!("HTTP {status}: {excerpt}")
            }
        }
    };
    ClientError::Refused {
        status: status.as_u16(),
        code,
        message,
        json: (json && parsed.is_some()).then(|| pretty(body)),
    }
}

/// An error and its causes (reqwest's own message is often only "error
/// sending request"), without the URL.
fn chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(&format!(" for url ({url})"), "");
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

// ---------------------------------------------------------------------------
// Output.

/// A JSON text pretty-printed with its key order kept (the text itself,
/// with a newline, when it is not JSON).
fn pretty(body: &str) -> String {
    match serde_json::from_str::<Ordered>(body) {
        Ok(tree) => to_pretty(&tree),
        Err(_) => with_newline(body.to_owned()),
    }
}

fn with_newline(mut text: String) -> String {
    if !text.is_empty() && !text.ends_with('\n') {
        text.push('\n');
    }
    text
}

/// The human summary of `body`, a successful answer to `request` (the body
/// itself when it is not JSON).
pub(crate) fn render(request: &Request, body: &str) -> String {
    let Ok(answer) = serde_json::from_str::<Value>(body) else {
        // Not JSON (a proxy's page?): show it as it came.
        return with_newline(body.to_owned());
    };
    let answer = &answer;
    let out = match request {
        Request::Status { pipeline: None } => {
            match answer.get("pipelines").and_then(Value::as_array) {
                Some(pipelines) if pipelines.is_empty() => "no pipeline\n".to_owned(),
                Some(pipelines) => pipelines
                    .iter()
                    .map(render_status)
                    .collect::<Vec<_>>()
                    .join("\n"),
                None => render_status(answer),
            }
        }
        Request::Status { .. } | Request::Pause { .. } | Request::Resume { .. } => {
            render_status(answer)
        }
        Request::Backfill { pipeline, .. } => format!(
            "backfill of {} started; follow it with `datum admin status {pipeline}`\n",
            list(answer.get("tables"))
        ),
        Request::Versions { .. } => match answer.get("modules").and_then(Value::as_array) {
            Some(modules) if modules.is_empty() => "no transform\n".to_owned(),
            Some(modules) => modules
                .iter()
                .map(render_module)
                .collect::<Vec<_>>()
                .join("\n"),
            None => render_module(answer),
        },
        Request::Swap {
            canary: Some(_), ..
        } => super::canary::render(answer),
        Request::Swap { .. } | Request::Rollback { .. } => render_activation(answer),
        Request::Canary { action, .. } => match action {
            CanaryAction::Show(_) | CanaryAction::Abort => super::canary::render(answer),
            CanaryAction::Promote => render_activation(answer),
        },
        Request::DeadLetters { pipeline, action } => match action {
            DeadLetterAction::List => render_dead_letters(pipeline, answer),
            // The batch as it came, its keys in order: it can be saved as
            // a fixture's NAME.input.json.
            DeadLetterAction::Show(_) => match serde_json::from_str::<Ordered>(body) {
                Ok(Ordered::Object(entries)) => match entries.iter().find(|(k, _)| k == "batch") {
                    Some((_, batch)) => to_pretty(batch),
                    None => to_pretty(&Ordered::Object(entries)),
                },
                _ => pretty(body),
            },
            DeadLetterAction::Replay(id) => format!(
                "dead letter {id} replayed: {} changes written to the sink\n",
                field(answer, &["changes"])
            ),
            DeadLetterAction::Discard(id) => format!("dead letter {id} discarded\n"),
        },
    };
    with_newline(out)
}

/// One pipeline's status block.
pub(crate) fn render_status(status: &Value) -> String {
    let f = |path: &[&str]| field(status, path);
    let mut out = format!("{}: {}\n", f(&["name"]), f(&["state"]));
    let _ = writeln!(
        out,
        "  lsn       received {}, checkpointed {}, confirmed {}",
        f(&["lsn", "received"]),
        f(&["lsn", "checkpointed"]),
        f(&["lsn", "confirmed"])
    );
    let lag_bytes = status
        .pointer("/lag/bytes")
        .and_then(Value::as_u64)
        .map_or_else(|| "?".into(), size);
    let lag_seconds = status
        .pointer("/lag/seconds")
        .and_then(Value::as_f64)
        .map_or_else(|| "?".into(), |s| format!("{s:.1}"));
    let catching_up = status.pointer("/source/mode").and_then(Value::as_str) == Some("catch_up");
    let mode = if catching_up {
        " (catching up through SQL)"
    } else {
        ""
    };
    let _ = writeln!(out, "  lag       {lag_bytes}, {lag_seconds} s{mode}");
    let rate = |name: &str| {
        status
            .pointer(&format!("/rates/{name}"))
            .and_then(Value::as_f64)
            .map_or_else(|| "?".into(), |r| format!("{r:.1}"))
    };
    let _ = writeln!(
        out,
        "  rates     {} batches/s, {} changes/s",
        rate("batches_per_second"),
        rate("changes_per_second")
    );
    if status.get("totals").is_some() {
        let t = |name: &str| f(&["totals", name]);
        let _ = writeln!(
            out,
            "  totals    in {} batches, {} changes; out {} batches, {} changes",
            t("batches_in"),
            t("changes_in"),
            t("batches_out"),
            t("changes_out")
        );
        let _ = writeln!(
            out,
            "  problems  {} module failures, {} skipped, {} dead letters, {} sink retries",
            t("module_failures"),
            t("skipped"),
            t("dead_letters"),
            t("sink_retries")
        );
    }
    let modules = status
        .get("modules")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if modules.is_empty() {
        out.push_str("  modules   none\n");
    }
    for (i, module) in modules.iter().enumerate() {
        let _ = writeln!(
            out,
            "  {:<10}{} v{} (sha256 {})",
            if i == 0 { "modules" } else { "" },
            field(module, &["name"]),
            field(module, &["version"]),
            short_sha(module.get("sha256"))
        );
    }
    if let Some(canary) = status.get("canary").filter(|c| !c.is_null()) {
        let _ = writeln!(out, "{}", super::canary::status_line(canary));
    }
    for snapshot in status
        .get("snapshots")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let mut line = format!(
            "  snapshot  {}: {}, {} rows",
            field(snapshot, &["table"]),
            field(snapshot, &["state"]),
            field(snapshot, &["rows"])
        );
        if let Some(estimate) = snapshot.get("estimated_rows").and_then(Value::as_u64) {
            let _ = write!(line, " of ~{estimate}");
        }
        if let Some(rate) = snapshot.get("rows_per_second").and_then(Value::as_f64) {
            let _ = write!(line, ", {rate:.0} rows/s");
        }
        if let Some(eta) = snapshot.get("eta_seconds").and_then(Value::as_f64) {
            let _ = write!(line, ", ~{eta:.0} s left");
        }
        if let Some(error) = snapshot.get("error").and_then(Value::as_str) {
            let _ = write!(line, ": {}", one_line(error));
        }
        let _ = writeln!(out, "{line}");
    }
    if let Some(error) = status.get("last_error").filter(|e| !e.is_null()) {
        let at = error
            .get("at")
            .and_then(Value::as_i64)
            .map(|at| format!(" (at {})", time(at)))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  last error{at}: {}",
            one_line(&field(error, &["message"]))
        );
    }
    out
}

/// A module's versions and activations.
fn render_module(module: &Value) -> String {
    let mut out = field(module, &["name"]);
    match module.get("active").filter(|a| !a.is_null()) {
        Some(active) => {
            let _ = writeln!(
                out,
                ": version {} active (sha256 {})",
                field(active, &["version"]),
                short_sha(active.get("sha256"))
            );
        }
        None => out.push_str(": no active version\n"),
    }
    let mut rows = vec![vec![
        String::new(),
        "version".to_owned(),
        "sha256".to_owned(),
        "size".to_owned(),
        "origin".to_owned(),
        "fixtures".to_owned(),
        "stored".to_owned(),
    ]];
    for version in module
        .get("versions")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
    {
        let active = version.get("active").and_then(Value::as_bool) == Some(true);
        rows.push(vec![
            if active { "*" } else { "" }.to_owned(),
            field(version, &["version"]),
            short_sha(version.get("sha256")),
            version
                .get("size")
                .and_then(Value::as_u64)
                .map_or_else(|| "?".into(), size),
            field(version, &["origin"]),
            field(version, &["fixtures"]),
            version
                .get("stored_at")
                .and_then(Value::as_i64)
                .map_or_else(|| "?".into(), time),
        ]);
    }
    out.push_str(&table(&rows, "  "));
    let activations = module
        .get("activations")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if !activations.is_empty() {
        out.push_str("  activations:\n");
        for activation in activations {
            let _ = writeln!(
                out,
                "    version {} at {}, in force after {}",
                field(activation, &["version"]),
                activation
                    .get("at")
                    .and_then(Value::as_i64)
                    .map_or_else(|| "?".into(), time),
                field(activation, &["effective_after"])
            );
        }
    }
    out
}

/// The answer to a swap or a rollback.
fn render_activation(answer: &Value) -> String {
    let f = |name: &str| field(answer, &[name]);
    let fixtures = answer.get("fixtures").and_then(Value::as_u64).unwrap_or(0);
    let passed = match fixtures {
        0 => String::new(),
        1 => ", 1 fixture passed".to_owned(),
        n => format!(", {n} fixtures passed"),
    };
    if answer.get("dry_run").and_then(Value::as_bool) == Some(true) {
        format!(
            "{}: sha256 {} would be accepted{passed} (dry run: nothing stored)\n",
            f("module"),
            short_sha(answer.get("sha256"))
        )
    } else {
        format!(
            "{}: version {} (sha256 {}) in force after {}{passed}\n",
            f("module"),
            f("version"),
            short_sha(answer.get("sha256")),
            f("effective_after")
        )
    }
}

/// A line per dead letter.
fn render_dead_letters(pipeline: &str, answer: &Value) -> String {
    let letters = answer
        .get("dead_letters")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default();
    if letters.is_empty() {
        return format!("no dead letters in {pipeline}\n");
    }
    let rows: Vec<Vec<String>> = letters
        .iter()
        .map(|letter| {
            vec![
                format!("#{}", field(letter, &["id"])),
                letter
                    .get("at")
                    .and_then(Value::as_i64)
                    .map_or_else(|| "?".into(), time),
                format!("xid {}", field(letter, &["xid"])),
                format!("commit {}", field(letter, &["commit_lsn"])),
                match letter.get("changes").and_then(Value::as_u64) {
                    Some(1) => "1 change".to_owned(),
                    _ => format!("{} changes", field(letter, &["changes"])),
                },
                format!("module v{}", field(letter, &["module_version"])),
                one_line(&field(letter, &["error"])),
            ]
        })
        .collect();
    table(&rows, "")
}

/// Rows as aligned columns, each line starting with `indent`.
fn table(rows: &[Vec<String>], indent: &str) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_owned();
        for (c, cell) in row.iter().enumerate() {
            if c > 0 {
                line.push_str("  ");
            }
            let _ = write!(line, "{cell:<width$}", width = widths[c]);
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A message on one line.
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

/// µs since the Unix epoch, as `2025-12-02 10:00:00+00`.
fn time(micros: i64) -> String {
    crate::event::text::format_timestamp(datum_guest::wire::Timestamp::Micros(micros), true)
}

/// A byte count for people: `512 B`, `402.7 KiB`.
fn size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal body parser: the parts of a multipart body, as (headers,
    /// data).
    fn parse_multipart(body: &[u8], boundary: &str) -> Vec<(String, Vec<u8>)> {
        let delimiter = format!("\r\n--{boundary}");
        // The body starts with the delimiter minus its CRLF.
        let body = [b"\r\n".as_slice(), body].concat();
        let mut parts = Vec::new();
        let mut rest = &body[..];
        loop {
            let start = find(rest, delimiter.as_bytes()).expect("a delimiter");
            rest = &rest[start + delimiter.len()..];
            if rest.starts_with(b"--") {
                assert_eq!(&rest[2..], b"\r\n", "nothing after the close delimiter");
                return parts;
            }
            rest = rest
                .strip_prefix(b"\r\n")
                .expect("CRLF after the delimiter");
            let end = find(rest, delimiter.as_bytes()).expect("a next delimiter");
            let part = &rest[..end];
            let split = find(part, b"\r\n\r\n").expect("headers end");
            let headers = String::from_utf8(part[..split].to_vec()).expect("ascii headers");
            parts.push((headers, part[split + 4..].to_vec()));
            rest = &rest[end..];
        }
    }

    fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
        haystack.windows(needle.len()).position(|w| w == needle)
    }

    #[test]
    fn multipart_bodies_parse_back_with_their_names_filenames_and_bytes() {
        // Binary data with CRLFs and dashes in it, as a wasm file may hold.
        let wasm: Vec<u8> = b"\0asm\x01\0\0\0\r\n--\r\n--datum-\xff\xfe"
            .iter()
            .copied()
            .chain(0..=255)
            .collect();
        let parts = vec![
            Part {
                name: "module".into(),
                filename: Some("new.wasm".into()),
                content_type: "application/wasm".into(),
                data: wasm.clone(),
            },
            Part {
                name: "config".into(),
                filename: None,
                content_type: "application/toml".into(),
                data: b"columns = [\"email\"]\n".to_vec(),
            },
            Part {
                name: "fixture".into(),
                filename: Some("a \"quoted\".input.json".into()),
                content_type: "application/json".into(),
                data: Vec::new(),
            },
        ];
        let (boundary, body) = multipart(&parts);
        assert!(boundary.len() <= 70 && boundary.is_ascii(), "{boundary}");
        let parsed = parse_multipart(&body, &boundary);
        assert_eq!(parsed.len(), 3);
        assert_eq!(
            parsed[0].0,
            "Content-Disposition: form-data; name=\"module\"; filename=\"new.wasm\"\r\n\
             Content-Type: application/wasm"
        );
        assert_eq!(parsed[0].1, wasm);
        assert_eq!(
            parsed[1].0,
            "Content-Disposition: form-data; name=\"config\"\r\nContent-Type: application/toml"
        );
        assert_eq!(parsed[1].1, b"columns = [\"email\"]\n");
        assert!(
            parsed[2]
                .0
                .contains("name=\"fixture\"; filename=\"a %22quoted%22.input.json\""),
            "{}",
            parsed[2].0
        );
        assert!(parsed[2].1.is_empty());
    }

    #[test]
    fn the_boundary_avoids_the_data() {
        let part = |data: &[u8]| Part {
            name: "module".into(),
            filename: None,
            content_type: "application/wasm".into(),
            data: data.to_vec(),
        };
        let parts = [part(b"x"), part(b"\r\n--first\r\n")];
        let candidates = ["first", "second"].map(String::from);
        assert_eq!(first_absent(&parts, candidates), "second");
        let (boundary, body) = multipart(&parts);
        let parsed = parse_multipart(&body, &boundary);
        assert_eq!(parsed[1].1, b"\r\n--first\r\n");
    }

    #[test]
    fn swaps_with_fixtures_send_every_fixture_file_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("datum-admin-client-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("fixtures/sub")).unwrap();
        for (name, text) in [
            ("fixtures/a.input.json", "{}"),
            ("fixtures/a.expected.json", "{\"changes\": []}"),
            ("fixtures/a.config.toml", "x = 1"),
            ("fixtures/config.toml", "y = 2"),
            ("fixtures/README.md", "no"),
            ("fixtures/sub/b.input.json", "{}"),
            ("new.wasm", "\0asm"),
            ("cfg.toml", "z = 3"),
        ] {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let call = prepare(&Request::Swap {
            pipeline: "shop".into(),
            module: "mask_pii".into(),
            file: dir.join("new.wasm"),
            config_file: Some(dir.join("cfg.toml")),
            fixtures: Some(dir.join("fixtures")),
            dry_run: true,
            canary: None,
        })
        .expect("prepares");
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(call.method, Method::POST);
        assert_eq!(
            call.path,
            "/v1/pipelines/shop/modules/mask_pii/versions?dry_run=true"
        );
        let (content_type, body) = call.body.expect("a body");
        let boundary = content_type
            .strip_prefix("multipart/form-data; boundary=")
            .expect("multipart");
        let parts = parse_multipart(&body, boundary);
        let names: Vec<&str> = parts
            .iter()
            .map(|(headers, _)| headers.lines().next().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "Content-Disposition: form-data; name=\"module\"; filename=\"new.wasm\"",
                "Content-Disposition: form-data; name=\"config\"",
                "Content-Disposition: form-data; name=\"fixture\"; filename=\"a.config.toml\"",
                "Content-Disposition: form-data; name=\"fixture\"; filename=\"a.expected.json\"",
                "Content-Disposition: form-data; name=\"fixture\"; filename=\"a.input.json\"",
                "Content-Disposition: form-data; name=\"fixture\"; filename=\"config.toml\"",
            ]
        );
        assert_eq!(parts[0].1, b"\0asm");
        assert_eq!(parts[1].1, b"z = 3");
        assert_eq!(parts[5].1, b"y = 2");
    }

    #[test]
    fn requests_map_to_routes() {
        let call = |request| prepare(&request).expect("prepares");
        let rollback = call(Request::Rollback {
            pipeline: "shop".into(),
            module: "mask_pii".into(),
            to: Some(3),
        });
        assert_eq!(
            rollback.path,
            "/v1/pipelines/shop/modules/mask_pii/rollback"
        );
        assert_eq!(
            rollback.body,
            Some(("application/json".into(), b"{\"version\":3}".to_vec()))
        );
        let rollback = call(Request::Rollback {
            pipeline: "shop".into(),
            module: "mask_pii".into(),
            to: None,
        });
        assert_eq!(rollback.body.unwrap().1, b"{}");
        let discard = call(Request::DeadLetters {
            pipeline: "shop".into(),
            action: DeadLetterAction::Discard(7),
        });
        assert_eq!(
            (discard.method, discard.path.as_str()),
            (Method::DELETE, "/v1/pipelines/shop/dead-letters/7")
        );
        let status = call(Request::Status {
            pipeline: Some("a b/c".into()),
        });
        assert_eq!(status.path, "/v1/pipelines/a%20b%2Fc");
    }

    const CONFIG: &str = r#"
state = "/var/lib/datum/state.redb"

[[pipeline]]
name = "shop"
source.url = "postgres://u:${DATUM_TEST_UNSET_PASSWORD}@localhost/app"
sink.type = "stdout"
"#;

    fn config(admin: &str) -> AdminConfig {
        AdminConfig::parse(&format!("{CONFIG}\n{admin}")).expect("parses")
    }

    #[test]
    fn the_admin_client_reads_only_admin_so_source_passwords_need_not_be_set() {
        // `datum run` needs the variable; the admin client does not.
        let run = crate::config::Config::parse(CONFIG).unwrap_err();
        assert!(run.contains("DATUM_TEST_UNSET_PASSWORD"), "{run}");
        let admin = config("[admin]\ntoken = \"t\"");
        assert_eq!(admin.state.0, "/var/lib/datum/state.redb");
        assert!(admin.admin.is_some());
    }

    fn token_file(path: &Path) -> std::io::Result<String> {
        assert_eq!(path, Path::new("/var/lib/datum/state.redb.admin-token"));
        Ok("from-file\n".into())
    }

    fn no_file(_: &Path) -> std::io::Result<String> {
        Err(std::io::ErrorKind::NotFound.into())
    }

    fn with_config(
        connection: &Connection,
        config: &AdminConfig,
        env: Option<&str>,
        read: impl Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Target, ClientError> {
        resolve_with(
            connection,
            Some((Path::new("datum.toml"), config)),
            env.map(str::to_owned),
            read,
        )
    }

    #[test]
    fn tokens_come_from_the_config_then_the_environment_then_the_token_file() {
        let none = Connection::default();
        let configured = config("[admin]\nlisten = \"127.0.0.1:7171\"\ntoken = \"from-config\"");
        let target = with_config(&none, &configured, Some("from-env"), token_file).unwrap();
        assert_eq!(target.token.expose(), "from-config");
        assert_eq!(target.url, "http://127.0.0.1:7171");

        let generated = config("[admin]\nlisten = \"0.0.0.0:7070\"\nrequest_timeout = \"1m\"");
        let target = with_config(&none, &generated, Some("from-env"), token_file).unwrap();
        assert_eq!(target.token.expose(), "from-env");
        assert_eq!(
            target.url, "http://127.0.0.1:7070",
            "unspecified is loopback"
        );
        assert_eq!(target.timeout, Duration::from_secs(70));

        let target = with_config(&none, &generated, Some("  "), token_file).unwrap();
        assert_eq!(
            target.token.expose(),
            "from-file",
            "trimmed; empty env ignored"
        );

        let err = with_config(&none, &generated, None, no_file).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(text.contains("state.redb.admin-token"), "{text}");
        assert!(text.contains("datum run"), "{text}");
    }

    #[test]
    fn flags_win_over_the_config() {
        let explicit = Connection {
            config: Some("datum.toml".into()),
            url: Some("http://admin.internal:8080/".into()),
            token: Some(Token("from-flag".into())),
        };
        let configured = config("[admin]\ntoken = \"from-config\"");
        let target = with_config(&explicit, &configured, Some("from-env"), no_file).unwrap();
        assert_eq!(target.token.expose(), "from-flag");
        assert_eq!(target.url, "http://admin.internal:8080");

        let target = resolve_with(&explicit, None, Some("from-env".into()), no_file).unwrap();
        assert_eq!(target.token.expose(), "from-flag");
        let env_only = Connection::default();
        let target = resolve_with(&env_only, None, Some("from-env".into()), no_file).unwrap();
        assert_eq!(target.token.expose(), "from-env");
        assert_eq!(target.url, DEFAULT_URL);
        let err = resolve_with(&env_only, None, None, no_file).unwrap_err();
        assert!(err.to_string().contains("DATUM_ADMIN_TOKEN"), "{err}");
    }

    #[test]
    fn a_config_without_admin_says_to_add_one() {
        let err = with_config(&Connection::default(), &config(""), Some("t"), no_file).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("add one"), "{err}");
    }

    #[test]
    fn tokens_never_show() {
        let connection = Connection {
            config: None,
            url: Some("not a url".into()),
            token: Some(Token("s3cret".into())),
        };
        assert!(!format!("{connection:?}").contains("s3cret"));
        let err = resolve_with(&connection, None, None, no_file).unwrap_err();
        assert!(!err.to_string().contains("s3cret"), "{err}");
        let target = resolve_with(
            &Connection {
                url: None,
                ..connection
            },
            None,
            None,
            no_file,
        )
        .unwrap();
        assert!(!format!("{target:?}").contains("s3cret"));
        let client = Client::new(target).unwrap();
        assert!(!format!("{client:?}").contains("s3cret"), "{client:?}");
    }

    /// The STATUS example of docs/admin.md.
    const STATUS: &str = r#"{
  "name": "shop",
  "state": "running",
  "lsn": {"received": "0/16B3780", "checkpointed": "0/16B3780", "confirmed": "0/16B3780"},
  "lag": {"bytes": 0, "seconds": 0.0},
  "rates": {"batches_per_second": 3.0, "changes_per_second": 5.0},
  "totals": {"batches_in": 120, "changes_in": 200, "bytes_in": 24000, "batches_out": 120,
             "changes_out": 200, "bytes_out": 31000, "module_failures": 0, "skipped": 0,
             "dead_letters": 0, "sink_retries": 0},
  "modules": [{"name": "mask_pii", "version": 3, "sha256": "9f86…"}],
  "snapshots": [],
  "last_error": null
}"#;

    #[test]
    fn status_renders_as_a_block() {
        assert_eq!(
            render(
                &Request::Status { pipeline: None },
                &format!("{{\"pipelines\": [{STATUS}]}}")
            ),
            "shop: running\n\
             \x20 lsn       received 0/16B3780, checkpointed 0/16B3780, confirmed 0/16B3780\n\
             \x20 lag       0 B, 0.0 s\n\
             \x20 rates     3.0 batches/s, 5.0 changes/s\n\
             \x20 totals    in 120 batches, 200 changes; out 120 batches, 200 changes\n\
             \x20 problems  0 module failures, 0 skipped, 0 dead letters, 0 sink retries\n\
             \x20 modules   mask_pii v3 (sha256 9f86…)\n"
        );
    }

    #[test]
    fn status_shows_long_digests_short_and_the_last_error() {
        let mut status: Value = serde_json::from_str(STATUS).unwrap();
        status["modules"] = serde_json::json!([
            {"name": "mask_pii", "version": 3, "sha256": "9f86d081884c7d659a2feaa0c55ad015"},
            {"name": "enrich", "version": 1, "sha256": "2c26b46b68ffc68ff99b453c1d304134"},
        ]);
        status["state"] = "failed".into();
        status["lag"]["bytes"] = 2_500_000.into();
        status["source"] =
            serde_json::json!({"mode": "catch_up", "catch_ups": 1, "catch_up_changes": 10});
        status["last_error"] = serde_json::json!({"message": "sink refused\nHTTP 400", "at": 1_764_669_600_000_000_i64});
        let text = render_status(&status);
        assert!(text.starts_with("shop: failed\n"), "{text}");
        assert!(
            text.contains("  lag       2.4 MiB, 0.0 s (catching up through SQL)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "  modules   mask_pii v3 (sha256 9f86d081884c)\n            enrich v1 (sha256 2c26b46b68ff)\n"
            ),
            "{text}"
        );
        assert!(
            text.ends_with("  last error (at 2025-12-02 10:00:00+00): sink refused HTTP 400\n"),
            "{text}"
        );
    }

    #[test]
    fn versions_activations_swaps_and_dead_letters_render() {
        let module = serde_json::json!({
            "name": "mask_pii",
            "active": {"version": 3, "sha256": "9f86d081884c7d65"},
            "versions": [
                {"version": 3, "sha256": "9f86d081884c7d65", "size": 412345, "origin": "upload",
                 "fixtures": 12, "stored_at": 1_764_669_600_000_000_i64, "active": true},
                {"version": 2, "sha256": "2c26b46b68ffc68f", "size": 400, "origin": "config",
                 "fixtures": 0, "stored_at": 1_764_669_500_000_000_i64, "active": false},
            ],
            "activations": [{"version": 3, "at": 1_764_669_600_000_000_i64, "effective_after": "0/16B3780"}]
        });
        let versions = Request::Versions {
            pipeline: "shop".into(),
            module: Some("mask_pii".into()),
        };
        assert_eq!(
            render(&versions, &module.to_string()),
            "mask_pii: version 3 active (sha256 9f86d081884c)\n\
             \x20    version  sha256        size       origin  fixtures  stored\n\
             \x20 *  3        9f86d081884c  402.7 KiB  upload  12        2025-12-02 10:00:00+00\n\
             \x20    2        2c26b46b68ff  400 B      config  0         2025-12-02 09:58:20+00\n\
             \x20 activations:\n\
             \x20   version 3 at 2025-12-02 10:00:00+00, in force after 0/16B3780\n"
        );
        let swap = Request::Rollback {
            pipeline: "shop".into(),
            module: "mask_pii".into(),
            to: None,
        };
        let answer = serde_json::json!({"module": "mask_pii", "version": 4,
            "sha256": "2c26b46b68ffc68ff99b", "effective_after": "0/16B3F10", "fixtures": 0});
        assert_eq!(
            render(&swap, &answer.to_string()),
            "mask_pii: version 4 (sha256 2c26b46b68ff) in force after 0/16B3F10\n"
        );
        let dry = serde_json::json!({"module": "mask_pii", "sha256": "2c26b46b68ffc68ff99b",
            "fixtures": 12, "dry_run": true});
        assert_eq!(
            render(&swap, &dry.to_string()),
            "mask_pii: sha256 2c26b46b68ff would be accepted, 12 fixtures passed (dry run: \
             nothing stored)\n"
        );
        let list = Request::DeadLetters {
            pipeline: "shop".into(),
            action: DeadLetterAction::List,
        };
        let letters = serde_json::json!({"dead_letters": [
            {"id": 1, "error": "trap: unreachable", "module_version": 3,
             "at": 1_764_669_600_000_000_i64, "xid": 731, "commit_lsn": "0/16B3748", "changes": 2},
        ]});
        assert_eq!(
            render(&list, &letters.to_string()),
            "#1  2025-12-02 10:00:00+00  xid 731  commit 0/16B3748  2 changes  module v3  \
             trap: unreachable\n"
        );
        assert_eq!(
            render(&list, r#"{"dead_letters": []}"#),
            "no dead letters in shop\n"
        );
    }

    #[test]
    fn show_prints_the_batch_with_its_keys_in_order() {
        let show = Request::DeadLetters {
            pipeline: "shop".into(),
            action: DeadLetterAction::Show(1),
        };
        let body = r#"{"id": 1, "error": "trap", "batch": {"txn": {"xid": 731}, "changes": []}}"#;
        assert_eq!(
            render(&show, body),
            "{\"txn\": {\"xid\": 731}, \"changes\": []}\n"
        );
        assert_eq!(render(&show, "not json"), "not json\n");
    }

    #[test]
    fn errors_come_from_the_api_shape_or_the_status_line() {
        let body = r#"{"error": {"code": "not_found", "message": "no pipeline `x`"}}"#;
        let err = refusal(reqwest::StatusCode::NOT_FOUND, body, false);
        assert_eq!(err.to_string(), "not_found: no pipeline `x`");
        assert_eq!(err.exit_code(), 1);
        assert!(err.json().is_none());
        let err = refusal(reqwest::StatusCode::NOT_FOUND, body, true);
        assert_eq!(
            err.json(),
            Some("{\"error\": {\"code\": \"not_found\", \"message\": \"no pipeline `x`\"}}\n")
        );
        let err = refusal(reqwest::StatusCode::BAD_GATEWAY, "", false);
        assert_eq!(err.to_string(), "HTTP 502 Bad Gateway");
        let err = refusal(reqwest::StatusCode::BAD_GATEWAY, "<html>oops</html>", true);
        assert_eq!(err.to_string(), "HTTP 502 Bad Gateway: <html>oops</html>");
        assert!(err.json().is_none());
    }

    #[test]
    fn json_output_keeps_the_key_order() {
        assert_eq!(
            pretty(r#"{"z": 1, "a": [1.0, null, "x"]}"#),
            "{\"z\": 1, \"a\": [1.0, null, \"x\"]}\n"
        );
    }
}
