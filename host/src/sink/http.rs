//! The `http` sink: each batch POSTed as one JSON document to a URL.
//!
//! The body is the batch's transaction and its output changes, in the JSON
//! form of `docs/fixtures.md` (key columns named, no column types):
//!
//! ```text
//! {"txn": {"xid": 731, "commit_lsn": "0/16B3748", "end_lsn": "0/16B3780", "commit_time": "2026-12-02 10:00:00.5+00"},
//!  "changes": [{"op": "insert", "schema": "public", "table": "customers", "key": ["id"], "new": {"id": 1, "email": "…"}}]}
//! ```
//!
//! Every request carries `Content-Type: application/json`, the configured
//! headers (for auth; their values are never logged nor printed) and
//! `Idempotency-Key: [PREFIX:]XID-COMMITLSN-CHUNK` (the LSN in hex). The key
//! names the batch, not the attempt: a retry, or the replay of the
//! un-checkpointed tail after a restart, sends the same key, so a receiver
//! that remembers keys can drop the duplicates.
//!
//! A batch whose transforms left no changes is not sent: there is nothing
//! to deliver, and its acknowledgement still moves the checkpoint.
//!
//! One `write` is one attempt, bounded by the timeout, and its outcome is
//! classified: a 2xx acknowledges the batch; 408, 429, 5xx, a timeout or a
//! connection failure is transient (the pipeline retries with capped,
//! jittered exponential back-off and does not acknowledge meanwhile); a 3xx
//! (redirects are not followed) or any other 4xx is definite. The sink owns
//! neither the retries nor the checkpoint: the pipeline does.

use std::fmt;
use std::time::Duration;

use datum_guest::Txn;
use reqwest::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use reqwest::{StatusCode, Url};

use super::{Sink, SinkError};
use crate::sink::json::{Columns, Renderer};
use crate::transform::Transformed;

/// The header that names the batch.
pub(crate) const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// How much of an error response's body a message quotes.
const EXCERPT_CHARS: usize = 200;

/// See the module documentation.
pub struct HttpSink {
    client: reqwest::Client,
    url: Url,
    /// The URL without credentials, query or fragment, for messages.
    shown_url: String,
    headers: HeaderMap,
    timeout: Duration,
    key_prefix: String,
    columns: Columns,
    body: Vec<u8>,
    written: u64,
}

impl fmt::Debug for HttpSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Names only: header values hold secrets.
        let names: Vec<&str> = self.headers.keys().map(HeaderName::as_str).collect();
        f.debug_struct("HttpSink")
            .field("url", &self.shown_url)
            .field("headers", &names)
            .field("timeout", &self.timeout)
            .field("key_prefix", &self.key_prefix)
            .finish_non_exhaustive()
    }
}

impl HttpSink {
    /// A sink that POSTs to `url` (http or https) with `headers`, each
    /// request bounded by `timeout`. A bad URL, header or timeout is a
    /// definite error that says what is wrong (never a header's value).
    pub fn new(
        url: &str,
        headers: Vec<(String, String)>,
        timeout: Duration,
    ) -> Result<HttpSink, SinkError> {
        let parsed = Url::parse(url)
            .map_err(|e| SinkError::definite(format!("http sink: `url` is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
            return Err(SinkError::definite(format!(
                "http sink: `url` must be an http:// or https:// address with a host, not `{}`",
                shown(&parsed)
            )));
        }
        if timeout.is_zero() {
            return Err(SinkError::definite(
                "http sink: `timeout` must be more than zero",
            ));
        }
        let mut map = HeaderMap::new();
        for (name, value) in headers {
            let header = HeaderName::from_bytes(name.as_bytes()).map_err(|_| {
                SinkError::definite(format!(
                    "http sink: header name `{name}` is not a valid HTTP header name"
                ))
            })?;
            if header == CONTENT_TYPE || header.as_str() == IDEMPOTENCY_KEY {
                return Err(SinkError::definite(format!(
                    "http sink: header `{name}` is set by the sink and cannot be configured"
                )));
            }
            let mut value = HeaderValue::from_str(&value).map_err(|_| {
                SinkError::definite(format!(
                    "http sink: the value of header `{name}` has characters a header \
                     cannot carry (control characters or non-ASCII)"
                ))
            })?;
            value.set_sensitive(true);
            map.append(header, value);
        }
        map.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("datum/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| {
                SinkError::definite(format!(
                    "http sink: cannot build the HTTP client: {}",
                    chain(&e)
                ))
            })?;
        Ok(HttpSink {
            client,
            shown_url: shown(&parsed),
            url: parsed,
            headers: map,
            timeout,
            key_prefix: String::new(),
            columns: Columns::Key,
            body: Vec::new(),
            written: 0,
        })
    }

    /// With `column_types`, each change also carries `columns`: every
    /// column's name, PostgreSQL type and key flag.
    pub fn with_column_types(mut self, column_types: bool) -> HttpSink {
        self.columns = Columns::from_flag(column_types);
        self
    }

    /// Prefixes every idempotency key with `prefix:` — the pipeline's name,
    /// so that two pipelines that post the same transaction to one receiver
    /// do not look like replays of each other.
    pub fn with_key_prefix(mut self, prefix: &str) -> Result<HttpSink, SinkError> {
        if !prefix.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(SinkError::definite(format!(
                "http sink: idempotency key prefix `{prefix}` must be printable ASCII without spaces"
            )));
        }
        self.key_prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}:")
        };
        Ok(self)
    }

    /// The idempotency key of the batch of `txn`.
    pub fn idempotency_key(&self, txn: &Txn) -> String {
        format!("{}{}", self.key_prefix, idempotency_key(txn))
    }
}

/// The batch's identity: `XID-COMMITLSN-CHUNK`, the LSN in upper-case hex.
/// The commit LSN alone names a transaction; the xid makes the key readable
/// and the chunk tells a large transaction's batches apart.
pub(crate) fn idempotency_key(txn: &Txn) -> String {
    format!("{}-{:X}-{}", txn.xid, txn.commit_lsn, txn.chunk)
}

/// Writes the request body of `batch` to `out` (see the module docs), with
/// the changes' columns as `columns` says.
pub(crate) fn render(batch: &Transformed, columns: Columns, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"txn\":");
    crate::sink::jsonl::write_txn(out, batch.txn());
    out.extend_from_slice(b",\"changes\":[");
    let mut renderer = Renderer::new(columns);
    for (i, change) in batch.changes().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'{');
        renderer.write_rest(out, change);
    }
    out.extend_from_slice(b"]}");
}

impl Sink for HttpSink {
    async fn write(&mut self, batch: &Transformed) -> Result<(), SinkError> {
        if batch.is_empty() {
            return Ok(());
        }
        self.body.clear();
        render(batch, self.columns, &mut self.body);
        let key = self.idempotency_key(batch.txn());
        let key_value = HeaderValue::from_str(&key)
            .map_err(|_| SinkError::definite(format!("http sink: bad idempotency key `{key}`")))?;
        let sent = self
            .client
            .post(self.url.clone())
            .headers(self.headers.clone())
            .header(IDEMPOTENCY_KEY, key_value)
            .body(self.body.clone())
            .send()
            .await;
        let response = match sent {
            Ok(response) => response,
            Err(err) => {
                let what = if err.is_timeout() {
                    format!("timed out after {:?}", self.timeout)
                } else if err.is_connect() {
                    format!("could not connect: {}", chain(&err))
                } else {
                    chain(&err)
                };
                tracing::debug!(url = %self.shown_url, idempotency_key = %key, error = %what, "http sink: request failed");
                // Unknown means transient: a failed send may have reached
                // the receiver or not, and the key makes a resend harmless.
                return Err(SinkError::transient(format!(
                    "POST {} (batch {key}): {what}",
                    self.shown_url
                )));
            }
        };
        let status = response.status();
        tracing::debug!(url = %self.shown_url, idempotency_key = %key, status = status.as_u16(), "http sink: response");
        if status.is_success() {
            self.written += self.body.len() as u64;
            return Ok(());
        }
        let location = response
            .headers()
            .get(reqwest::header::LOCATION)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let excerpt = match tokio::time::timeout(self.timeout, response.bytes()).await {
            Ok(Ok(body)) => excerpt(&body),
            _ => String::new(),
        };
        let mut message = format!("POST {} (batch {key}): {status}", self.shown_url);
        if let Some(location) = location.filter(|_| status.is_redirection()) {
            message.push_str(&format!(
                " to {location}; redirects are not followed: set `url` to the final address"
            ));
        }
        if !excerpt.is_empty() {
            message.push_str(&format!(": {excerpt}"));
        }
        Err(if is_transient(status) {
            SinkError::transient(message)
        } else {
            SinkError::definite(message)
        })
    }
}

/// Whether a non-2xx answer may change on retry: the receiver timed out
/// (408), asked to slow down (429) or failed (5xx), or answered something
/// this sink does not understand. A 3xx or another 4xx will not change.
pub(crate) fn is_transient(status: StatusCode) -> bool {
    match status.as_u16() {
        408 | 429 => true,
        300..=499 => false,
        _ => true,
    }
}

/// The URL as messages show it: no credentials, query or fragment, which
/// may hold secrets.
fn shown(url: &Url) -> String {
    let mut url = url.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// The start of a response body, on one line.
fn excerpt(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let mut out: String = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .take(EXCERPT_CHARS + 1)
        .collect();
    if out.chars().count() > EXCERPT_CHARS {
        out = out.chars().take(EXCERPT_CHARS).collect();
        out.push('…');
    }
    out
}

/// An error and its causes (reqwest's own message is often only "error
/// sending request"), without the URL, which may hold secrets.
fn chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    if let Some(url) = err.url() {
        text = text.replace(url.as_str(), "");
    }
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.replace(" ()", "").trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(url: &str, headers: &[(&str, &str)], timeout: Duration) -> String {
        let headers = headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect();
        let err = HttpSink::new(url, headers, timeout).expect_err(url);
        assert!(!err.is_transient(), "{err}");
        err.to_string()
    }

    #[test]
    fn bad_settings_say_what_is_wrong_without_the_secret() {
        let second = Duration::from_secs(1);
        assert!(error("not a url", &[], second).contains("not a URL"));
        assert!(error("ftp://h/x", &[], second).contains("http:// or https://"));
        assert!(error("http://h/", &[], Duration::ZERO).contains("more than zero"));
        let e = error("http://h/", &[("bad name", "x")], second);
        assert!(e.contains("`bad name`"), "{e}");
        let e = error("http://h/", &[("Authorization", "Bearer s3cret\n")], second);
        assert!(e.contains("Authorization") && !e.contains("s3cret"), "{e}");
        let e = error("http://h/", &[("Idempotency-Key", "k")], second);
        assert!(e.contains("set by the sink"), "{e}");
        let sink = HttpSink::new(
            "https://user:pw@h/x?token=t",
            vec![("Authorization".into(), "Bearer s3cret".into())],
            second,
        )
        .expect("valid");
        let debug = format!("{sink:?}");
        assert!(!debug.contains("s3cret") && !debug.contains("pw") && !debug.contains("token"));
        assert!(debug.contains("authorization"), "{debug}");
    }

    #[test]
    fn the_key_names_the_batch() {
        let txn = Txn {
            xid: 731,
            commit_lsn: 0x16B_3748,
            end_lsn: 0,
            commit_time: 0,
            chunk: 2,
            last: false,
        };
        assert_eq!(idempotency_key(&txn), "731-16B3748-2");
        let sink = HttpSink::new("http://h/", Vec::new(), Duration::from_secs(1))
            .and_then(|s| s.with_key_prefix("orders"))
            .expect("valid");
        assert_eq!(sink.idempotency_key(&txn), "orders:731-16B3748-2");
    }

    #[test]
    fn statuses_are_classified() {
        for (code, transient) in [
            (301, false),
            (400, false),
            (401, false),
            (404, false),
            (408, true),
            (409, false),
            (429, true),
            (500, true),
            (503, true),
            (504, true),
        ] {
            let status = StatusCode::from_u16(code).expect("status");
            assert_eq!(is_transient(status), transient, "{code}");
        }
    }

    #[test]
    fn excerpts_are_short_and_on_one_line() {
        assert_eq!(excerpt(b"  busy\n  try later "), "busy try later");
        let long = excerpt("x".repeat(500).as_bytes());
        assert_eq!(long.chars().count(), EXCERPT_CHARS + 1);
        assert!(long.ends_with('…'));
    }
}
