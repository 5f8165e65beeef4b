//! Connection strings in libpq syntax, parsed into a [`ConnInfo`].
//!
//! Owns turning what a user wrote — a `postgres://` / `postgresql://` URL or a
//! `key=value` string — plus the `PG*` environment variables and libpq's
//! defaults into one validated description of where and how to connect. It
//! does not open connections: the replication connection and `tls` do that,
//! and [`ConnInfo::tokio_postgres_config`] hands the same settings to
//! tokio-postgres for ordinary SQL connections.
//!
//! Where we differ from libpq, on purpose:
//!
//! * Only the keys listed in [`KEYS`] are accepted; any other key, and any bad
//!   value, is an error naming the key and what it accepts (libpq silently
//!   ignores some settings we could not honour).
//! * One server only: several hosts (`host=a,b`) are an error.
//! * `sslmode=allow` (plaintext first, TLS only if the server insists) is an
//!   error: use `prefer` (TLS first, plaintext if the server has none) or
//!   `disable`. Quietly upgrading it would change which `pg_hba.conf` lines
//!   match; quietly keeping it would mean a plaintext password by default.
//! * Without a host, libpq uses the socket directory compiled into it
//!   (`/var/run/postgresql` on Debian and Red Hat, `/tmp` upstream and on
//!   Homebrew). We cannot know which libpq the user has, so we look for the
//!   socket `.s.PGSQL.<port>` in `/var/run/postgresql`, then `/tmp`, and fall
//!   back to TCP on `localhost` — which also finds a server in a container
//!   that publishes its port. [`ConnInfo::redacted`] shows what was chosen.
//! * `sslmode` is ignored on unix sockets, as in libpq (the server does not
//!   offer TLS there); we record it as [`SslMode::Disable`] so that what is
//!   printed is what happens.
//! * With only `hostaddr`, the host is that address, and `verify-full` checks
//!   the certificate against it (libpq refuses `verify-full` without `host`).
//! * `~/.pgpass`, service files and client certificates are not supported.
//!
//! Errors never contain the password, not even a fragment of a malformed
//! one: values from a URL are never echoed (a password with an unescaped `@`,
//! `/` or `?` spills into the host, port or query), and in `key=value`
//! strings a stray word is reported by position, not by its text.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// The keys accepted in connection strings, in the order they are printed.
pub(crate) const KEYS: [&str; 11] = [
    "host",
    "hostaddr",
    "port",
    "user",
    "password",
    "dbname",
    "sslmode",
    "sslrootcert",
    "application_name",
    "connect_timeout",
    "options",
];

/// PostgreSQL's default port.
pub(crate) const DEFAULT_PORT: u16 = 5432;

/// Socket directories probed when no host is given, in order.
const DEFAULT_SOCKET_DIRS: [&str; 2] = ["/var/run/postgresql", "/tmp"];

/// Where and how to connect to one PostgreSQL server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnInfo {
    /// The server: a host name or address, or a unix-socket directory.
    pub host: Host,
    /// `hostaddr`: the address to connect to instead of resolving `host`;
    /// `host` still names the server for certificate checks.
    pub hostaddr: Option<IpAddr>,
    /// The TCP port, or the number in the socket's file name.
    pub port: u16,
    /// The role to log in as.
    pub user: String,
    /// The password, if any.
    pub password: Option<Password>,
    /// The database.
    pub dbname: String,
    /// How TLS is negotiated and what is verified.
    pub ssl_mode: SslMode,
    /// The certificate authorities to verify the server against; `None`
    /// means `~/.postgresql/root.crt`, as in libpq.
    pub ssl_root_cert: Option<RootCert>,
    /// Reported to the server as `application_name`.
    pub application_name: Option<String>,
    /// How long establishing the connection may take; `None` is no limit.
    pub connect_timeout: Option<Duration>,
    /// Command-line options sent to the server at start-up (`-c key=value`).
    pub options: Option<String>,
}

/// Where the server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Host {
    /// A host name or IP address, reached over TCP.
    Tcp(String),
    /// A directory holding the server's unix-domain socket.
    Unix(PathBuf),
}

/// libpq's `sslmode`, less `allow` (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Never use TLS.
    Disable,
    /// Try TLS; fall back to plaintext when the server does not offer it.
    /// Verifies the certificate only when a root certificate is available.
    Prefer,
    /// Use TLS; verify the certificate only when a root certificate is
    /// available (then as `verify-ca`, like libpq).
    Require,
    /// Use TLS and verify the certificate chain, but not the host name.
    VerifyCa,
    /// Use TLS and verify the certificate chain and the host name.
    VerifyFull,
}

impl SslMode {
    /// The name used in connection strings.
    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }

    /// Whether a certificate chain must be verified whatever else is set.
    pub fn verifies(self) -> bool {
        matches!(self, SslMode::VerifyCa | SslMode::VerifyFull)
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where the trusted certificate authorities come from (`sslrootcert`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCert {
    /// A PEM file of one or more CA certificates.
    File(PathBuf),
    /// `sslrootcert=system`: the operating system's trust store (as in
    /// PostgreSQL 16, this makes `verify-full` the default and the minimum).
    System,
}

/// A password. It prints as `********`; [`Password::expose`] is the only way
/// to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wraps a password.
    pub fn new(password: impl Into<String>) -> Password {
        Password(password.into())
    }

    /// The password itself, for the authentication exchange only.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("********")
    }
}

impl fmt::Display for Password {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("********")
    }
}

/// Where a setting came from, for error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// A `key=value` connection string.
    KeyValue,
    /// A `postgres://` URL.
    Url,
    /// An environment variable.
    Env(&'static str),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::KeyValue => f.write_str("in the connection string"),
            Origin::Url => f.write_str("in the connection URL"),
            Origin::Env(var) => write!(f, "from the environment variable {var}"),
        }
    }
}

/// Why a connection string was refused. All are definite: the same string
/// fails the same way until the user changes it. None contains the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConnInfoError {
    /// The string is not well formed.
    #[error("malformed connection {kind}: {problem}")]
    Syntax {
        /// `string` or `URL`.
        kind: &'static str,
        /// What is wrong and where, without quoting values.
        problem: String,
    },
    /// A key we do not know (or do not support).
    #[error(
        "unknown connection parameter `{key}` {origin}; accepted: {}",
        KEYS.join(", ")
    )]
    UnknownKey {
        /// The key as written.
        key: String,
        /// Where it was written.
        origin: Origin,
    },
    /// A known key with a value it cannot take.
    #[error("invalid {key}{} {origin}: {expected}", value.as_ref().map(|v| format!(" `{v}`")).unwrap_or_default())]
    BadValue {
        /// The key.
        key: &'static str,
        /// The value, when it is safe to show.
        value: Option<String>,
        /// Where it was set.
        origin: Origin,
        /// What is accepted instead.
        expected: String,
    },
    /// More than one host or port.
    #[error(
        "{key} lists several servers (separated by commas) {origin}; Datum connects to \
         exactly one: give one {key}"
    )]
    MultipleHosts {
        /// `host`, `hostaddr` or `port`.
        key: &'static str,
        /// Where it was set.
        origin: Origin,
    },
    /// No user given and none could be derived from the operating system.
    #[error("no user name: set user in the connection string or PGUSER ({reason})")]
    NoUser {
        /// Why the operating-system user is not available.
        reason: String,
    },
}

fn syntax(kind: &'static str, problem: impl Into<String>) -> ConnInfoError {
    ConnInfoError::Syntax {
        kind,
        problem: problem.into(),
    }
}

impl FromStr for ConnInfo {
    type Err = ConnInfoError;

    /// Parses a URL or `key=value` string; unset keys come from the `PG*`
    /// environment variables, then libpq's defaults.
    fn from_str(s: &str) -> Result<ConnInfo, ConnInfoError> {
        ConnInfo::parse_with_env(s, &|var| std::env::var(var).ok())
    }
}

/// One key of a connection string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Host,
    Hostaddr,
    Port,
    User,
    Password,
    Dbname,
    SslMode,
    SslRootCert,
    ApplicationName,
    ConnectTimeout,
    Options,
}

impl Key {
    const ALL: [Key; 11] = [
        Key::Host,
        Key::Hostaddr,
        Key::Port,
        Key::User,
        Key::Password,
        Key::Dbname,
        Key::SslMode,
        Key::SslRootCert,
        Key::ApplicationName,
        Key::ConnectTimeout,
        Key::Options,
    ];

    fn name(self) -> &'static str {
        KEYS[self as usize]
    }

    fn env(self) -> &'static str {
        match self {
            Key::Host => "PGHOST",
            Key::Hostaddr => "PGHOSTADDR",
            Key::Port => "PGPORT",
            Key::User => "PGUSER",
            Key::Password => "PGPASSWORD",
            Key::Dbname => "PGDATABASE",
            Key::SslMode => "PGSSLMODE",
            Key::SslRootCert => "PGSSLROOTCERT",
            Key::ApplicationName => "PGAPPNAME",
            Key::ConnectTimeout => "PGCONNECT_TIMEOUT",
            Key::Options => "PGOPTIONS",
        }
    }

    fn parse(name: &str, origin: Origin) -> Result<Key, ConnInfoError> {
        Key::ALL
            .into_iter()
            .find(|key| key.name() == name)
            .ok_or_else(|| ConnInfoError::UnknownKey {
                key: name.to_owned(),
                origin,
            })
    }
}

/// What the string set, before defaults: the last value of each key wins.
#[derive(Default)]
struct Given {
    values: [Option<String>; 11],
    origin: Option<Origin>,
}

impl Given {
    fn set(&mut self, key: Key, value: String) {
        self.values[key as usize] = Some(value);
    }
}

/// A value and where it came from; empty values count as unset, as in libpq.
struct Setting {
    value: String,
    origin: Origin,
}

impl ConnInfo {
    /// Like [`FromStr`], with `env` standing in for the process environment.
    pub fn parse_with_env(
        s: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<ConnInfo, ConnInfoError> {
        let trimmed = s.trim_start();
        let given = match ["postgresql://", "postgres://"]
            .into_iter()
            .find_map(|scheme| trimmed.strip_prefix(scheme))
        {
            Some(rest) => parse_url(rest)?,
            None => parse_key_value(s)?,
        };
        resolve(given, env, &|path| path.exists())
    }

    /// A printable `key=value` form of every setting, with the password (if
    /// any) shown as `********`.
    pub fn redacted(&self) -> String {
        let mut out = Vec::new();
        let mut push = |key: &str, value: &str| out.push(format!("{key}={}", quote(value)));
        match &self.host {
            Host::Tcp(host) => push("host", host),
            Host::Unix(dir) => push("host", &dir.to_string_lossy()),
        }
        if let Some(addr) = self.hostaddr {
            push("hostaddr", &addr.to_string());
        }
        push("port", &self.port.to_string());
        push("user", &self.user);
        if self.password.is_some() {
            push("password", "********");
        }
        push("dbname", &self.dbname);
        push("sslmode", self.ssl_mode.as_str());
        match &self.ssl_root_cert {
            Some(RootCert::File(path)) => push("sslrootcert", &path.to_string_lossy()),
            Some(RootCert::System) => push("sslrootcert", "system"),
            None => {}
        }
        if let Some(name) = &self.application_name {
            push("application_name", name);
        }
        if let Some(timeout) = self.connect_timeout {
            push("connect_timeout", &timeout.as_secs().to_string());
        }
        if let Some(options) = &self.options {
            push("options", options);
        }
        out.join(" ")
    }

    /// The server's socket file, `<dir>/.s.PGSQL.<port>`, for a unix-socket
    /// host; `None` for TCP.
    pub fn socket_path(&self) -> Option<PathBuf> {
        match &self.host {
            Host::Unix(dir) => Some(socket_file(dir, self.port)),
            Host::Tcp(_) => None,
        }
    }

    /// The same settings for tokio-postgres, for ordinary SQL connections.
    ///
    /// tokio-postgres knows only `disable`, `prefer` and `require`; the
    /// `verify-*` modes become `require` and are enforced by the TLS
    /// connector that `tls::connector` builds from this `ConnInfo`, which
    /// must be the one passed to `connect`.
    pub fn tokio_postgres_config(&self) -> tokio_postgres::Config {
        use tokio_postgres::config::SslMode as PgSslMode;
        let mut config = tokio_postgres::Config::new();
        match &self.host {
            Host::Tcp(host) => config.host(host),
            Host::Unix(dir) => config.host_path(dir),
        };
        if let Some(addr) = self.hostaddr {
            config.hostaddr(addr);
        }
        config
            .port(self.port)
            .user(&self.user)
            .dbname(&self.dbname)
            .ssl_mode(match self.ssl_mode {
                SslMode::Disable => PgSslMode::Disable,
                SslMode::Prefer => PgSslMode::Prefer,
                SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
            });
        if let Some(password) = &self.password {
            config.password(password.expose());
        }
        if let Some(name) = &self.application_name {
            config.application_name(name);
        }
        if let Some(timeout) = self.connect_timeout {
            config.connect_timeout(timeout);
        }
        if let Some(options) = &self.options {
            config.options(options);
        }
        config
    }
}

fn socket_file(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!(".s.PGSQL.{port}"))
}

/// Quotes a value for a `key=value` string when it needs it.
fn quote(value: &str) -> String {
    let plain = !value.is_empty()
        && !value
            .chars()
            .any(|c| c.is_whitespace() || c == '\'' || c == '\\');
    if plain {
        value.to_owned()
    } else {
        format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'"))
    }
}

// ---------------------------------------------------------------------------
// key=value strings, as libpq's conninfo_parse reads them.

fn parse_key_value(s: &str) -> Result<Given, ConnInfoError> {
    const KIND: &str = "string";
    let mut given = Given {
        origin: Some(Origin::KeyValue),
        ..Given::default()
    };
    let mut chars = s.char_indices().peekable();
    let skip_space = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        while chars.next_if(|(_, c)| c.is_whitespace()).is_some() {}
    };
    loop {
        skip_space(&mut chars);
        let Some(&(start, _)) = chars.peek() else {
            break;
        };
        let mut key = String::new();
        while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace() && *c != '=') {
            key.push(c);
        }
        skip_space(&mut chars);
        if chars.next_if(|(_, c)| *c == '=').is_none() {
            // The word may be a password that lost its quotes: say where it
            // is, not what it is.
            return Err(syntax(
                KIND,
                format!(
                    "expected `key=value`, found a word without `=` at byte {start}; \
                     quote values that contain spaces: key='a value'"
                ),
            ));
        }
        let key = Key::parse(&key, Origin::KeyValue)?;
        skip_space(&mut chars);
        let mut value = String::new();
        if chars.next_if(|(_, c)| *c == '\'').is_some() {
            loop {
                match chars.next() {
                    Some((_, '\\')) => match chars.next() {
                        Some((_, c)) => value.push(c),
                        None => return Err(unterminated(key)),
                    },
                    Some((_, '\'')) => break,
                    Some((_, c)) => value.push(c),
                    None => return Err(unterminated(key)),
                }
            }
        } else {
            while let Some((_, c)) = chars.next_if(|(_, c)| !c.is_whitespace()) {
                if c == '\\' {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(escaped);
                    }
                } else {
                    value.push(c);
                }
            }
        }
        given.set(key, value);
    }
    Ok(given)
}

fn unterminated(key: Key) -> ConnInfoError {
    syntax(
        "string",
        format!(
            "the quoted value of {} has no closing quote; inside quotes, write \\' for a quote \
             and \\\\ for a backslash",
            key.name()
        ),
    )
}

// ---------------------------------------------------------------------------
// URLs: postgresql://[user[:password]@][host][:port][/dbname][?key=value&...]

fn parse_url(rest: &str) -> Result<Given, ConnInfoError> {
    const KIND: &str = "URL";
    let mut given = Given {
        origin: Some(Origin::Url),
        ..Given::default()
    };
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, rest) = rest.split_at(authority_end);
    let (path, query) = match rest.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (rest, None),
    };

    // The last `@` ends the user info, so an unescaped `@` in a password
    // still parses (libpq would take the first and fail later).
    let host_port = match authority.rsplit_once('@') {
        Some((user_info, host_port)) => {
            let (user, password) = match user_info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (user_info, None),
            };
            given.set(Key::User, decode(user, "the user name")?);
            if let Some(password) = password {
                given.set(Key::Password, decode(password, "the password")?);
            }
            host_port
        }
        None => authority,
    };

    let (host, port) = if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed
            .split_once(']')
            .ok_or_else(|| syntax(KIND, "an IPv6 address in `[` has no closing `]`"))?;
        let port = match after {
            "" => None,
            _ if after.contains(',') => {
                return Err(ConnInfoError::MultipleHosts {
                    key: "host",
                    origin: Origin::Url,
                });
            }
            _ => Some(after.strip_prefix(':').ok_or_else(|| {
                syntax(
                    KIND,
                    "expected `:port` or `/dbname` after the `]` of an IPv6 address",
                )
            })?),
        };
        (host.to_owned(), port)
    } else {
        match host_port.split_once(':') {
            Some((host, port)) => (decode(host, "the host")?, Some(port)),
            None => (decode(host_port, "the host")?, None),
        }
    };
    if host.contains(',') || port.is_some_and(|p| p.contains(',')) {
        return Err(ConnInfoError::MultipleHosts {
            key: "host",
            origin: Origin::Url,
        });
    }
    given.set(Key::Host, host);
    if let Some(port) = port {
        given.set(Key::Port, port.to_owned());
    }
    if let Some(dbname) = path.strip_prefix('/') {
        given.set(Key::Dbname, decode(dbname, "the database name")?);
    }

    for (index, pair) in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|pair| !pair.is_empty())
        .enumerate()
    {
        let (key, value) = pair.split_once('=').ok_or_else(|| {
            syntax(
                KIND,
                format!("query parameter {} has no `=`; write key=value", index + 1),
            )
        })?;
        let key = decode(key, "a query parameter name")?;
        let key = Key::parse(&key, Origin::Url)?;
        let value = decode(value, &format!("the value of {}", key.name()))?;
        given.set(key, value);
    }
    Ok(given)
}

/// Decodes `%XX` escapes (libpq does not turn `+` into a space).
fn decode(text: &str, what: &str) -> Result<String, ConnInfoError> {
    let bad = |problem: &str| syntax("URL", format!("{what} {problem}"));
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| {
                    bad("has a `%` not followed by two hex digits; write `%25` for `%`")
                })?;
            if hex == 0 {
                return Err(bad("contains `%00`, which is not allowed"));
            }
            out.push(hex);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| bad("decodes to invalid UTF-8"))
}

// ---------------------------------------------------------------------------
// Defaults and validation.

fn resolve(
    given: Given,
    env: &dyn Fn(&str) -> Option<String>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<ConnInfo, ConnInfoError> {
    let origin = given.origin.unwrap_or(Origin::KeyValue);
    let mut values = given.values;
    let mut get = |key: Key| -> Option<Setting> {
        let from_string = values[key as usize].take().filter(|v| !v.is_empty());
        match from_string {
            Some(value) => Some(Setting { value, origin }),
            None => env(key.env())
                .filter(|v| !v.is_empty())
                .map(|value| Setting {
                    value,
                    origin: Origin::Env(key.env()),
                }),
        }
    };
    // Values from a URL may hold pieces of a mangled password; values from
    // the environment or a key=value string are what they claim to be.
    let shown = |setting: &Setting| match setting.origin {
        Origin::Url => None,
        Origin::KeyValue | Origin::Env(_) => Some(setting.value.clone()),
    };
    let bad = |key: Key, setting: &Setting, expected: &str| ConnInfoError::BadValue {
        key: key.name(),
        value: shown(setting),
        origin: setting.origin,
        expected: expected.to_owned(),
    };
    let single = |key: Key, setting: &Setting| {
        if setting.value.contains(',') {
            Err(ConnInfoError::MultipleHosts {
                key: key.name(),
                origin: setting.origin,
            })
        } else {
            Ok(())
        }
    };

    let port = match get(Key::Port) {
        Some(setting) => {
            single(Key::Port, &setting)?;
            setting
                .value
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|&p| p != 0)
                .ok_or_else(|| {
                    bad(
                        Key::Port,
                        &setting,
                        "expected a port number from 1 to 65535",
                    )
                })?
        }
        None => DEFAULT_PORT,
    };

    let hostaddr = match get(Key::Hostaddr) {
        Some(setting) => {
            single(Key::Hostaddr, &setting)?;
            Some(setting.value.parse::<IpAddr>().map_err(|_| {
                bad(
                    Key::Hostaddr,
                    &setting,
                    "expected a numeric IPv4 or IPv6 address (put host names in host)",
                )
            })?)
        }
        None => None,
    };

    let host = match get(Key::Host) {
        Some(setting) => {
            single(Key::Host, &setting)?;
            if setting.value.starts_with('/') {
                Host::Unix(PathBuf::from(setting.value))
            } else if setting.value.starts_with('@') {
                return Err(bad(
                    Key::Host,
                    &setting,
                    "abstract unix sockets (`@name`) are not supported; give a host name, an \
                     IP address or a socket directory starting with /",
                ));
            } else {
                Host::Tcp(setting.value)
            }
        }
        None => match hostaddr {
            Some(addr) => Host::Tcp(addr.to_string()),
            None => default_host(port, exists),
        },
    };
    if hostaddr.is_some() && matches!(host, Host::Unix(_)) {
        return Err(ConnInfoError::BadValue {
            key: "hostaddr",
            value: None,
            origin,
            expected: "hostaddr cannot be combined with a unix-socket directory in host; \
                       drop one of them"
                .to_owned(),
        });
    }

    let user = match get(Key::User) {
        Some(setting) => setting.value,
        None => os_user()?,
    };
    let password = get(Key::Password).map(|setting| Password(setting.value));
    let dbname = get(Key::Dbname).map_or_else(|| user.clone(), |setting| setting.value);

    let ssl_root_cert = get(Key::SslRootCert).map(|setting| {
        if setting.value == "system" {
            RootCert::System
        } else {
            RootCert::File(PathBuf::from(setting.value))
        }
    });

    let explicit_mode = match get(Key::SslMode) {
        Some(setting) => {
            let mode = parse_ssl_mode(&setting).map_err(|expected| ConnInfoError::BadValue {
                key: "sslmode",
                value: shown(&setting),
                origin: setting.origin,
                expected,
            })?;
            Some((mode, setting.origin))
        }
        None => None,
    };
    if ssl_root_cert == Some(RootCert::System)
        && matches!(host, Host::Tcp(_))
        && let Some((mode, origin)) = explicit_mode
        && mode != SslMode::VerifyFull
    {
        // PostgreSQL 16: trusting every public CA only makes sense with
        // host-name checks. (On a unix socket sslmode means nothing.)
        return Err(ConnInfoError::BadValue {
            key: "sslmode",
            value: Some(mode.as_str().to_owned()),
            origin,
            expected: "sslrootcert=system requires sslmode=verify-full (any public CA could \
                       vouch for the server otherwise)"
                .to_owned(),
        });
    }
    let ssl_mode = match (&host, explicit_mode) {
        (Host::Unix(_), _) => SslMode::Disable,
        (Host::Tcp(_), Some((mode, _))) => mode,
        (Host::Tcp(_), None) if ssl_root_cert == Some(RootCert::System) => SslMode::VerifyFull,
        (Host::Tcp(_), None) => SslMode::Prefer,
    };

    let application_name = get(Key::ApplicationName).map(|setting| setting.value);
    let connect_timeout = match get(Key::ConnectTimeout) {
        Some(setting) => {
            let seconds = setting.value.trim().parse::<i64>().map_err(|_| {
                bad(
                    Key::ConnectTimeout,
                    &setting,
                    "expected a whole number of seconds (0 for no limit)",
                )
            })?;
            // libpq: zero or negative is no limit, and 2 s is the minimum.
            (seconds > 0).then(|| Duration::from_secs(seconds.max(2) as u64))
        }
        None => None,
    };
    let options = get(Key::Options).map(|setting| setting.value);

    Ok(ConnInfo {
        host,
        hostaddr,
        port,
        user,
        password,
        dbname,
        ssl_mode,
        ssl_root_cert,
        application_name,
        connect_timeout,
        options,
    })
}

fn parse_ssl_mode(setting: &Setting) -> Result<SslMode, String> {
    const ACCEPTED: &str = "expected disable, prefer, require, verify-ca or verify-full";
    match setting.value.as_str() {
        "disable" => Ok(SslMode::Disable),
        "prefer" => Ok(SslMode::Prefer),
        "require" => Ok(SslMode::Require),
        "verify-ca" => Ok(SslMode::VerifyCa),
        "verify-full" => Ok(SslMode::VerifyFull),
        "allow" => Err(format!(
            "allow (plaintext first, TLS only if the server insists) is not supported: use \
             prefer to try TLS first, or disable; {ACCEPTED}"
        )),
        _ => Err(ACCEPTED.to_owned()),
    }
}

/// The first default socket directory that holds this port's socket, else
/// TCP to `localhost` (see the module documentation).
fn default_host(port: u16, exists: &dyn Fn(&Path) -> bool) -> Host {
    DEFAULT_SOCKET_DIRS
        .into_iter()
        .map(Path::new)
        .find(|dir| exists(&socket_file(dir, port)))
        .map(|dir| Host::Unix(dir.to_owned()))
        .unwrap_or_else(|| Host::Tcp("localhost".to_owned()))
}

/// The name of the effective user, as libpq takes it from the password file.
fn os_user() -> Result<String, ConnInfoError> {
    let uid = nix::unistd::Uid::effective();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => Ok(user.name),
        Ok(None) => Err(ConnInfoError::NoUser {
            reason: format!("uid {uid} has no entry in the user database"),
        }),
        Err(err) => Err(ConnInfoError::NoUser {
            reason: format!("looking up uid {uid}: {err}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "hunter2";

    fn parse_env(s: &str, env: &[(&str, &str)]) -> Result<ConnInfo, ConnInfoError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        let given = match ["postgresql://", "postgres://"]
            .into_iter()
            .find_map(|scheme| s.strip_prefix(scheme))
        {
            Some(rest) => parse_url(rest)?,
            None => parse_key_value(s)?,
        };
        // No socket anywhere: the default host is deterministic.
        resolve(
            given,
            &|var| env.iter().find(|(k, _)| k == var).map(|(_, v)| v.clone()),
            &|_| false,
        )
    }

    fn parse(s: &str) -> ConnInfo {
        parse_env(s, &[]).unwrap_or_else(|err| panic!("parsing {s:?}: {err}"))
    }

    fn error(s: &str) -> String {
        match parse_env(s, &[]) {
            Ok(info) => panic!("{s:?} parsed as {info:?}"),
            Err(err) => err.to_string(),
        }
    }

    #[test]
    fn key_value_with_every_key() {
        let info = parse(
            "host=db.example port=6543 user=alice password=pw dbname=shop sslmode=verify-full \
             sslrootcert=/etc/ca.pem application_name=datum connect_timeout=10 \
             options='-c search_path=app' hostaddr=10.0.0.5",
        );
        assert_eq!(
            info,
            ConnInfo {
                host: Host::Tcp("db.example".into()),
                hostaddr: Some("10.0.0.5".parse().unwrap()),
                port: 6543,
                user: "alice".into(),
                password: Some(Password::new("pw")),
                dbname: "shop".into(),
                ssl_mode: SslMode::VerifyFull,
                ssl_root_cert: Some(RootCert::File("/etc/ca.pem".into())),
                application_name: Some("datum".into()),
                connect_timeout: Some(Duration::from_secs(10)),
                options: Some("-c search_path=app".into()),
            }
        );
    }

    #[test]
    fn key_value_quoting_follows_libpq() {
        let info = parse(r"user = 'o\'brien'  password='a \\ b c' dbname=we\ ird");
        assert_eq!(info.user, "o'brien");
        assert_eq!(
            info.password.as_ref().map(Password::expose),
            Some(r"a \ b c")
        );
        assert_eq!(info.dbname, "we ird");
        // An empty quoted value means "unset"; the last occurrence wins.
        let info = parse("user=a user=b dbname=''");
        assert_eq!((info.user.as_str(), info.dbname.as_str()), ("b", "b"));
        // libpq quirk: after `=`, whitespace is skipped, so the next word
        // becomes the value.
        assert_eq!(parse("user= dbname=x").user, "dbname=x");
        assert_eq!(parse("").port, DEFAULT_PORT);
    }

    #[test]
    fn url_with_every_part() {
        let info = parse(
            "postgresql://al%40ice:p%40ss%2Fw@db.example:6543/sh%20op?sslmode=require&\
             application_name=datum&connect_timeout=1",
        );
        assert_eq!(info.host, Host::Tcp("db.example".into()));
        assert_eq!(info.port, 6543);
        assert_eq!(info.user, "al@ice");
        assert_eq!(info.password.as_ref().map(Password::expose), Some("p@ss/w"));
        assert_eq!(info.dbname, "sh op");
        assert_eq!(info.ssl_mode, SslMode::Require);
        assert_eq!(info.application_name.as_deref(), Some("datum"));
        assert_eq!(
            info.connect_timeout,
            Some(Duration::from_secs(2)),
            "1 s means 2 s"
        );
    }

    #[test]
    fn url_hosts_ipv6_and_sockets() {
        let info = parse("postgres://[::1]:5433/db");
        assert_eq!(info.host, Host::Tcp("::1".into()));
        assert_eq!(info.port, 5433);
        let info = parse("postgres://u@[2001:db8::2]/db");
        assert_eq!(info.host, Host::Tcp("2001:db8::2".into()));
        assert_eq!(info.port, DEFAULT_PORT);

        let info = parse("postgres://%2Fvar%2Frun%2Fpostgresql/db");
        assert_eq!(info.host, Host::Unix("/var/run/postgresql".into()));
        assert_eq!(info.ssl_mode, SslMode::Disable, "no TLS on unix sockets");
        assert_eq!(
            info.socket_path(),
            Some(PathBuf::from("/var/run/postgresql/.s.PGSQL.5432"))
        );
        let info = parse("postgresql:///db?host=/tmp/pg&port=7000&sslmode=require");
        assert_eq!(info.host, Host::Unix("/tmp/pg".into()));
        assert_eq!(
            info.ssl_mode,
            SslMode::Disable,
            "sslmode is ignored on sockets"
        );
        assert_eq!(
            info.socket_path(),
            Some(PathBuf::from("/tmp/pg/.s.PGSQL.7000"))
        );
        // The last `@` ends the user info.
        let info = parse("postgres://u:p@ss@h/d");
        assert_eq!(info.password.as_ref().map(Password::expose), Some("p@ss"));
        assert_eq!(info.host, Host::Tcp("h".into()));
    }

    #[test]
    fn defaults_follow_libpq() {
        let info = parse_env("", &[("PGUSER", "env_user")]).unwrap();
        assert_eq!(info.host, Host::Tcp("localhost".into()));
        assert_eq!(info.port, 5432);
        assert_eq!(info.user, "env_user");
        assert_eq!(info.dbname, "env_user", "dbname defaults to the user");
        assert_eq!(info.ssl_mode, SslMode::Prefer);
        assert_eq!(info.password, None);
        assert_eq!(info.ssl_root_cert, None);

        let info = parse("");
        assert_eq!(
            info.user,
            os_user().unwrap(),
            "user defaults to the OS user"
        );
    }

    #[test]
    fn default_host_is_the_first_directory_with_a_socket() {
        let only = |wanted: &'static str| move |p: &Path| p == Path::new(wanted);
        assert_eq!(
            default_host(5432, &only("/var/run/postgresql/.s.PGSQL.5432")),
            Host::Unix("/var/run/postgresql".into())
        );
        assert_eq!(
            default_host(6000, &only("/tmp/.s.PGSQL.6000")),
            Host::Unix("/tmp".into())
        );
        assert_eq!(
            default_host(5432, &only("/tmp/.s.PGSQL.6000")),
            Host::Tcp("localhost".into())
        );
    }

    #[test]
    fn environment_fills_what_the_string_leaves_out() {
        let env = [
            ("PGHOST", "envhost"),
            ("PGPORT", "7777"),
            ("PGUSER", "envuser"),
            ("PGPASSWORD", "envpw"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "require"),
            ("PGSSLROOTCERT", "/ca.pem"),
            ("PGAPPNAME", "envapp"),
            ("PGCONNECT_TIMEOUT", "0"),
            ("PGOPTIONS", "-c x=y"),
        ];
        let info = parse_env("port=1234 dbname=mine", &env).unwrap();
        assert_eq!(info.host, Host::Tcp("envhost".into()));
        assert_eq!(info.port, 1234, "the string wins over the environment");
        assert_eq!(info.user, "envuser");
        assert_eq!(info.password, Some(Password::new("envpw")));
        assert_eq!(info.dbname, "mine");
        assert_eq!(info.ssl_mode, SslMode::Require);
        assert_eq!(info.ssl_root_cert, Some(RootCert::File("/ca.pem".into())));
        assert_eq!(info.application_name.as_deref(), Some("envapp"));
        assert_eq!(info.connect_timeout, None, "0 means no limit");
        assert_eq!(info.options.as_deref(), Some("-c x=y"));

        let err = parse_env("", &[("PGPORT", "http")])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("PGPORT") && err.contains("1 to 65535"),
            "{err}"
        );
    }

    #[test]
    fn hostaddr_alone_is_the_host() {
        let info = parse("hostaddr=127.0.0.1");
        assert_eq!(info.host, Host::Tcp("127.0.0.1".into()));
        assert_eq!(info.hostaddr, Some("127.0.0.1".parse().unwrap()));
        let err = error("hostaddr=db.example");
        assert!(err.contains("numeric"), "{err}");
        let err = error("host=/tmp hostaddr=127.0.0.1");
        assert!(err.contains("unix-socket"), "{err}");
    }

    #[test]
    fn sslrootcert_system_means_verify_full() {
        let info = parse("host=db sslrootcert=system");
        assert_eq!(info.ssl_root_cert, Some(RootCert::System));
        assert_eq!(info.ssl_mode, SslMode::VerifyFull);
        let err = error("host=db sslrootcert=system sslmode=require");
        assert!(err.contains("verify-full"), "{err}");
    }

    #[test]
    fn allow_is_refused_with_the_alternatives() {
        let err = error("host=db sslmode=allow");
        assert!(
            err.contains("sslmode") && err.contains("not supported") && err.contains("prefer"),
            "{err}"
        );
        let err = error("sslmode=strict");
        assert!(
            err.contains("`strict`") && err.contains("verify-full"),
            "{err}"
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_name_the_key() {
        let err = error("host=db sslcert=/c.pem");
        assert!(
            err.contains("`sslcert`") && err.contains("accepted: host, hostaddr"),
            "{err}"
        );
        let err = error("postgres://h/d?target_session_attrs=any");
        assert!(err.contains("`target_session_attrs`"), "{err}");
        let err = error("port=0");
        assert!(err.contains("port `0`"), "{err}");
        let err = error("connect_timeout=soon");
        assert!(err.contains("connect_timeout `soon`"), "{err}");
        let err = error("mysql://h/d");
        assert!(err.contains("without `=`"), "{err}");
    }

    #[test]
    fn several_hosts_are_refused() {
        for s in [
            "host=a,b",
            "host=a port=5432,5433",
            "hostaddr=10.0.0.1,10.0.0.2",
            "postgres://a,b/db",
            "postgres://a:1,b:2/db",
            "postgres://[::1]:1,[::2]:2/db",
        ] {
            let err = error(s);
            assert!(err.contains("several servers"), "{s}: {err}");
        }
    }

    #[test]
    fn errors_never_contain_the_password() {
        let bad = [
            // A password with a space and no quotes: the rest is a stray word.
            format!("host=h password={SECRET} x{SECRET} port=1"),
            format!("password='{SECRET}"),
            format!("password={SECRET} sslmode=bogus"),
            format!("password={SECRET} color=blue"),
            // Unescaped `/` or `?` in a URL password: it spills into the port.
            format!("postgres://u:{SECRET}/x@h/db"),
            format!("postgres://u:{SECRET}?x@h/db"),
            format!("postgres://u:{SECRET}"),
            format!("postgres://u:{SECRET}%zz@h/db"),
            format!("postgres://u:{SECRET}%00@h/db"),
            format!("postgres://u:{SECRET}@h:{SECRET}/db"),
            format!("postgres://u:p@h/db?password={SECRET}&port={SECRET}"),
            format!("postgres://u:p@h/db?password={SECRET}&{SECRET}"),
            format!("postgres://u:p@[::1/{SECRET}"),
            format!("postgres://u:{SECRET}@h/db?sslmode={SECRET}"),
        ];
        for s in &bad {
            let err = parse_env(s, &[]).expect_err(s);
            for shown in [err.to_string(), format!("{err:?}")] {
                assert!(!shown.contains(SECRET), "{s:?} gave {shown}");
            }
        }
        let err = parse_env("", &[("PGPASSWORD", SECRET), ("PGPORT", "x")]).unwrap_err();
        assert!(!format!("{err} {err:?}").contains(SECRET));
    }

    #[test]
    fn printing_never_shows_the_password() {
        let info = parse(&format!(
            "host=h user=u password={SECRET} application_name='my app'"
        ));
        let redacted = info.redacted();
        assert_eq!(
            redacted,
            "host=h port=5432 user=u password=******** dbname=u sslmode=prefer \
             application_name='my app'"
        );
        assert!(!format!("{info:?}").contains(SECRET));
        assert!(format!("{info:?}").contains("********"));
        let password = info.password.as_ref().unwrap();
        assert_eq!(format!("{password} {password:?}"), "******** ********");
        assert_eq!(password.expose(), SECRET);
    }

    #[test]
    fn redacted_form_parses_back() {
        let info = parse(concat!(
            r"host=/tmp/my\ sockets port=7 user='o\'b' dbname=d options='-c a=b' ",
            "sslrootcert=system application_name=x connect_timeout=30",
        ));
        assert_eq!(parse(&info.redacted()), info);
        let info = parse("host=h sslmode=verify-ca sslrootcert=/ca.pem hostaddr=::1");
        assert_eq!(parse(&info.redacted()), info);
    }

    #[test]
    fn tokio_postgres_config_carries_everything() {
        use tokio_postgres::config::{Host as PgHost, SslMode as PgSslMode};
        let info = parse(&format!(
            "host=db hostaddr=10.1.2.3 port=6000 user=u password={SECRET} dbname=d \
             sslmode=verify-full application_name=a connect_timeout=5 options=-cx=y"
        ));
        let config = info.tokio_postgres_config();
        assert_eq!(config.get_hosts(), &[PgHost::Tcp("db".into())]);
        assert_eq!(
            config.get_hostaddrs(),
            &["10.1.2.3".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(config.get_ports(), &[6000]);
        assert_eq!(config.get_user(), Some("u"));
        assert_eq!(config.get_password(), Some(SECRET.as_bytes()));
        assert_eq!(config.get_dbname(), Some("d"));
        assert_eq!(config.get_ssl_mode(), PgSslMode::Require);
        assert_eq!(config.get_application_name(), Some("a"));
        assert_eq!(config.get_connect_timeout(), Some(&Duration::from_secs(5)));
        assert_eq!(config.get_options(), Some("-cx=y"));

        let config = parse("host=/run/pg sslmode=require").tokio_postgres_config();
        assert_eq!(config.get_hosts(), &[PgHost::Unix("/run/pg".into())]);
        assert_eq!(config.get_ssl_mode(), PgSslMode::Disable);
    }
}
