//! Throwaway PostgreSQL clusters: for the tests, for `datum demo` and for the
//! benchmarks.
//!
//! Owns finding the server binaries, creating a cluster (through a cached,
//! `initdb`-ed template that is copied per cluster, about 6× faster than
//! running `initdb` each time), starting the server on a free loopback port
//! with logical decoding enabled, running it as an unprivileged user when the
//! caller is root (PostgreSQL refuses to run as root), and removing every trace
//! of it:
//!
//! * on [`Drop`] — which also runs when a test panics;
//! * on SIGINT, SIGTERM or SIGHUP — a signal thread stops every live cluster
//!   and removes its directory before the process dies with the signal;
//! * when the owning process is killed outright — the server receives SIGQUIT
//!   through `PR_SET_PDEATHSIG`, and the next harness run sweeps the directory
//!   of any cluster whose owner process is gone.
//!
//! With [`Builder::ssl`] the server also speaks TLS, with a certificate for
//! `localhost`, `127.0.0.1` and `::1` signed by a CA made for that cluster
//! alone ([`Cluster::ca_cert`]), so clients can test every `sslmode` up to
//! `verify-full`. Logins in the `datum_auth_ssl` group
//! ([`PasswordAuth::ScramSsl`]) are refused without TLS.
//!
//! It does not own SQL clients: callers connect with the URL, conninfo string or
//! socket directory it hands out. [`Cluster::psql`] exists for setup statements
//! in code that has no client of its own.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{self, Write};
use std::net::TcpListener;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once, OnceLock, mpsc};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use nix::sys::signal::{self, Signal};

use nix::unistd::{Gid, Pid, Uid, User};

/// `name` as an SQL identifier, quoted.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// `text` as an SQL string literal, quoted (`standard_conforming_strings`).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// Bump when the template's `initdb` arguments, `pg_hba.conf` or setup SQL
/// change, so that stale cached templates are not reused.
const TEMPLATE_REVISION: u32 = 2;

/// Name prefix of everything this module creates in the temporary directory.
const PREFIX: &str = "datum-pg-";
const TEMPLATE_PREFIX: &str = "datum-pg-template-";

/// The superuser of every throwaway cluster.
pub const SUPERUSER: &str = "postgres";

/// How long a server may take to accept connections before we give up.
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long an immediate shutdown may take before the server is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts at finding a free port when another process takes ours first.
const PORT_ATTEMPTS: usize = 8;

/// What can go wrong while creating, starting or stopping a cluster.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// No directory holding `initdb` and `postgres` was found.
    #[error(
        "PostgreSQL server binaries (initdb, postgres) not found; looked in: {searched}. \
         Install them (Debian/Ubuntu: `apt-get install postgresql`; Fedora: `dnf install \
         postgresql-server`; macOS: `brew install postgresql@16`) or set PG_BIN to the \
         directory that holds initdb and postgres"
    )]
    BinariesNotFound {
        /// The places that were searched, in order.
        searched: String,
    },
    /// `PG_BIN` was set but does not hold the server binaries.
    #[error(
        "PG_BIN={} does not contain initdb and postgres; point PG_BIN at the server's bin \
         directory (for example /usr/lib/postgresql/15/bin) or unset it. No server installed? \
         Debian/Ubuntu: `apt-get install postgresql`; Fedora: `dnf install postgresql-server`; \
         macOS: `brew install postgresql@16`",
        dir.display()
    )]
    BadPgBin {
        /// The value of `PG_BIN`.
        dir: PathBuf,
    },
    /// Running as root and no unprivileged user to run the server as.
    #[error(
        "running as root, and PostgreSQL refuses to; the user `{user}` to run it as does not \
         exist: create it (`useradd --system {user}`) or set DATUM_PG_USER to an existing \
         unprivileged user"
    )]
    NoUnprivilegedUser {
        /// The user that was looked up.
        user: String,
    },
    /// A file-system or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// A helper program (`initdb`, `psql`, ...) exited with an error.
    #[error("{what} failed ({status}):\n{output}")]
    Command {
        /// The program and what it was asked to do.
        what: String,
        /// Its exit status.
        status: String,
        /// What it printed.
        output: String,
    },
    /// The throwaway CA or server certificate could not be made.
    #[cfg(feature = "tls")]
    #[error("generating the throwaway TLS certificates ({what}): {source}")]
    Certificate {
        /// Which step failed.
        what: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },
    /// The server did not come up.
    #[error("PostgreSQL did not start: {reason}; server log:\n{log}")]
    Start {
        /// Why we gave up.
        reason: String,
        /// The tail of the server log.
        log: String,
    },
}

impl HarnessError {
    fn io(what: impl Into<String>) -> impl FnOnce(io::Error) -> HarnessError {
        let what = what.into();
        move |source| HarnessError::Io { what, source }
    }
}

type Result<T, E = HarnessError> = std::result::Result<T, E>;

/// The PostgreSQL server binaries the harness uses.
#[derive(Debug, Clone)]
pub struct Binaries {
    dir: PathBuf,
    version: String,
}

impl Binaries {
    /// Finds the server binaries: `PG_BIN`, then `pg_config --bindir`, then the
    /// newest `/usr/lib/postgresql/*/bin`.
    pub fn locate() -> Result<Binaries> {
        let dir = locate_bin_dir()?;
        let output = Command::new(dir.join("postgres"))
            .arg("--version")
            .output()
            .map_err(HarnessError::io(format!(
                "running {}/postgres --version",
                dir.display()
            )))?;
        let version = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        Ok(Binaries { dir, version })
    }

    /// The directory that holds `initdb`, `postgres`, `psql`, `pg_recvlogical`.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What `postgres --version` printed, e.g. `postgres (PostgreSQL) 15.18`.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The path of one of the binaries.
    pub fn tool(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

fn has_server(dir: &Path) -> bool {
    dir.join("initdb").is_file() && dir.join("postgres").is_file()
}

fn locate_bin_dir() -> Result<PathBuf> {
    let mut searched = Vec::new();
    if let Some(dir) = std::env::var_os("PG_BIN").filter(|v| !v.is_empty()) {
        let dir = PathBuf::from(dir);
        // An explicit choice that does not work is an error, not a hint to
        // quietly use some other server.
        return if has_server(&dir) {
            Ok(dir)
        } else {
            Err(HarnessError::BadPgBin { dir })
        };
    }
    searched.push("PG_BIN (unset)".to_owned());

    match Command::new("pg_config").arg("--bindir").output() {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_server(&dir) {
                return Ok(dir);
            }
            searched.push(format!("`pg_config --bindir` ({})", dir.display()));
        }
        _ => searched.push("`pg_config --bindir` (no pg_config on PATH)".to_owned()),
    }

    let mut versioned: Vec<(Vec<u32>, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name();
            let version = name
                .to_str()?
                .split('.')
                .map(|part| part.parse::<u32>().ok())
                .collect::<Option<Vec<u32>>>()?;
            Some((version, entry.path().join("bin")))
        })
        .collect();
    versioned.sort();
    if let Some((_, dir)) = versioned.iter().rev().find(|(_, dir)| has_server(dir)) {
        return Ok(dir.clone());
    }
    searched.push("/usr/lib/postgresql/*/bin".to_owned());
    Err(HarnessError::BinariesNotFound {
        searched: searched.join(", "),
    })
}

/// The unprivileged user the server runs as when we are root.
#[derive(Debug, Clone)]
struct RunAs {
    uid: Uid,
    gid: Gid,
}

impl RunAs {
    /// `None` when we are not root: the server then runs as ourselves.
    fn current() -> Result<Option<RunAs>> {
        if !Uid::effective().is_root() {
            return Ok(None);
        }
        let wanted = std::env::var("DATUM_PG_USER")
            .ok()
            .filter(|u| !u.is_empty());
        let candidates: Vec<String> = match wanted {
            Some(user) => vec![user],
            None => vec!["postgres".to_owned(), "nobody".to_owned()],
        };
        for name in &candidates {
            if let Ok(Some(user)) = User::from_name(name) {
                if user.uid.is_root() {
                    continue;
                }
                return Ok(Some(RunAs {
                    uid: user.uid,
                    gid: user.gid,
                }));
            }
        }
        Err(HarnessError::NoUnprivilegedUser {
            user: candidates[0].clone(),
        })
    }

    fn apply(this: Option<&RunAs>, cmd: &mut Command) {
        if let Some(run_as) = this {
            cmd.uid(run_as.uid.as_raw()).gid(run_as.gid.as_raw());
        }
    }

    fn chown(this: Option<&RunAs>, path: &Path) -> Result<()> {
        if let Some(run_as) = this {
            std::os::unix::fs::chown(path, Some(run_as.uid.as_raw()), Some(run_as.gid.as_raw()))
                .map_err(HarnessError::io(format!("chown {}", path.display())))?;
        }
        Ok(())
    }
}

/// How a login created by [`Cluster::create_login`] must authenticate.
///
/// The template's `pg_hba.conf` gives members of four group roles a password
/// method, and everyone else `trust`; a login is put in the group of its method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PasswordAuth {
    /// `scram-sha-256`.
    Scram,
    /// `md5`, with the password stored as an MD5 hash.
    Md5,
    /// `password`: the password is sent in clear text (use TLS).
    Cleartext,
    /// `scram-sha-256`, and only over TLS (`hostssl`): without TLS, and on
    /// the unix socket, the login is rejected. Needs a cluster started with
    /// [`Builder::ssl`].
    ScramSsl,
}

impl PasswordAuth {
    fn group(self) -> &'static str {
        match self {
            PasswordAuth::Scram => "datum_auth_scram",
            PasswordAuth::Md5 => "datum_auth_md5",
            PasswordAuth::Cleartext => "datum_auth_password",
            PasswordAuth::ScramSsl => "datum_auth_ssl",
        }
    }

    fn hba_method(self) -> &'static str {
        match self {
            PasswordAuth::Scram | PasswordAuth::ScramSsl => "scram-sha-256",
            PasswordAuth::Md5 => "md5",
            PasswordAuth::Cleartext => "password",
        }
    }

    const ALL: [PasswordAuth; 4] = [
        PasswordAuth::Scram,
        PasswordAuth::Md5,
        PasswordAuth::Cleartext,
        PasswordAuth::ScramSsl,
    ];
}

fn hba_conf() -> String {
    let mut hba = String::from(
        "# Written by the Datum harness: password methods for the datum_auth_* groups,\n\
         # trust for everyone else.\n\
         # TYPE  DATABASE     USER  ADDRESS  METHOD\n",
    );
    for auth in PasswordAuth::ALL {
        for database in ["all", "replication"] {
            let user = format!("+{}", auth.group());
            let method = auth.hba_method();
            if auth == PasswordAuth::ScramSsl {
                // TLS or nothing. On a cluster without ssl=on the hostssl
                // lines never match (the server logs that once at start).
                hba.push_str(&format!("local {database} {user} reject\n"));
                for address in ["127.0.0.1/32", "::1/128"] {
                    hba.push_str(&format!("hostssl {database} {user} {address} {method}\n"));
                    hba.push_str(&format!("hostnossl {database} {user} {address} reject\n"));
                }
                continue;
            }
            hba.push_str(&format!("local {database} {user} {method}\n"));
            hba.push_str(&format!("host {database} {user} 127.0.0.1/32 {method}\n"));
            hba.push_str(&format!("host {database} {user} ::1/128 {method}\n"));
        }
    }
    for database in ["all", "replication"] {
        hba.push_str(&format!("local {database} all trust\n"));
        hba.push_str(&format!("host {database} all 127.0.0.1/32 trust\n"));
        hba.push_str(&format!("host {database} all ::1/128 trust\n"));
    }
    hba
}

/// Settings every throwaway cluster starts with; [`Builder::setting`] overrides.
fn default_settings() -> BTreeMap<String, String> {
    [
        ("wal_level", "logical"),
        ("max_replication_slots", "16"),
        ("max_wal_senders", "16"),
        ("max_connections", "60"),
        ("shared_buffers", "16MB"),
        // A throwaway cluster never survives an OS crash; skipping fsync makes
        // tests and the demo faster without changing any replication behaviour.
        ("fsync", "off"),
        ("full_page_writes", "off"),
        ("password_encryption", "scram-sha-256"),
        ("log_min_messages", "warning"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect()
}

/// Configures a cluster before it starts.
#[derive(Debug, Clone)]
pub struct Builder {
    settings: BTreeMap<String, String>,
    handle_signals: bool,
    base_dir: Option<PathBuf>,
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    ssl: bool,
}

impl Default for Builder {
    fn default() -> Self {
        Builder {
            settings: default_settings(),
            handle_signals: true,
            base_dir: None,
            ssl: false,
        }
    }
}

/// Where clusters live unless told otherwise: `DATUM_PG_TMPDIR`, else
/// `/dev/shm` when it is a writable directory, else the temporary directory.
///
/// Creating files is the bulk of a cluster's start-up cost, and on the small
/// VMs this project runs on it costs 0.4 ms per file on disk (about 1 s for the
/// ~1,000 files of a data directory) against 0.05 s in all on tmpfs.
pub fn default_base_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("DATUM_PG_TMPDIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && nix::unistd::access(shm, nix::unistd::AccessFlags::W_OK).is_ok() {
        return shm.to_owned();
    }
    std::env::temp_dir()
}

impl Builder {
    /// Sets a server setting (`postgres -c key=value`), replacing the default.
    pub fn setting(mut self, key: impl Into<String>, value: impl Into<String>) -> Builder {
        self.settings.insert(key.into(), value.into());
        self
    }

    /// Whether the harness installs its SIGINT/SIGTERM/SIGHUP cleanup (on by
    /// default). A program that handles these signals itself, such as `datum
    /// demo`, turns it off and drops the cluster on its own way out.
    pub fn handle_signals(mut self, on: bool) -> Builder {
        self.handle_signals = on;
        self
    }

    /// Creates the cluster under `dir` instead of [`default_base_dir`] — for
    /// benchmarks whose data should not sit in memory.
    pub fn base_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.base_dir = Some(dir.into());
        self
    }

    /// Whether the server accepts TLS (off by default). On: a CA and a
    /// server certificate for `localhost`, `127.0.0.1` and `::1` are made for
    /// this cluster alone, and it starts with `ssl=on`; clients verify it
    /// with [`Cluster::ca_cert`] (e.g. `sslmode=verify-full`). Needs the
    /// `tls` feature.
    #[cfg(feature = "tls")]
    pub fn ssl(mut self, on: bool) -> Builder {
        self.ssl = on;
        self
    }

    /// Creates and starts the cluster; returns once it accepts connections.
    pub fn start(self) -> Result<Cluster> {
        let binaries = Binaries::locate()?;
        let base = self.base_dir.clone().unwrap_or_else(default_base_dir);
        sweep_stale(&base);
        if self.handle_signals {
            install_signal_cleanup();
        }
        let run_as = RunAs::current()?;
        let template = template(&base, &binaries, run_as.as_ref())?;

        let root = create_root(&base, run_as.as_ref())?;
        // From here on the directory is registered, so a signal removes it.
        let mut cluster = Cluster {
            binaries,
            root,
            port: 0,
            child: None,
            run_as,
            ca_cert: None,
            settings: BTreeMap::new(),
        };
        copy_dir(&template.join("data"), &cluster.data_dir())?;
        #[allow(unused_mut)]
        let mut settings = self.settings;
        #[cfg(feature = "tls")]
        if self.ssl {
            cluster.ca_cert = Some(install_certificates(
                &cluster.root,
                &cluster.data_dir(),
                cluster.run_as.as_ref(),
            )?);
            settings.insert("ssl".to_owned(), "on".to_owned());
        }
        cluster.launch(&settings)?;
        cluster.settings = settings;
        Ok(cluster)
    }
}

/// A running throwaway PostgreSQL cluster. Dropping it stops the server and
/// removes its directory.
pub struct Cluster {
    binaries: Binaries,
    root: PathBuf,
    port: u16,
    child: Option<Child>,
    run_as: Option<RunAs>,
    ca_cert: Option<PathBuf>,
    settings: BTreeMap<String, String>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("root", &self.root)
            .field("port", &self.port)
            .field("pid", &self.child.as_ref().map(Child::id))
            .field("ssl", &self.ca_cert.is_some())
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// Starts a cluster with the default settings.
    pub fn start() -> Result<Cluster> {
        Builder::default().start()
    }

    /// A builder, to change settings before starting.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The TCP port the server listens on (loopback only).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address the server listens on.
    pub fn host(&self) -> &'static str {
        "127.0.0.1"
    }

    /// The directory of the server's unix-domain socket.
    pub fn socket_dir(&self) -> &Path {
        &self.root
    }

    /// The cluster's own directory: data directory, socket and log.
    pub fn root_dir(&self) -> &Path {
        &self.root
    }

    /// The data directory.
    pub fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The postmaster's process id.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server binaries in use.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`, for the superuser over TCP.
    pub fn url(&self, database: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@{}:{}/{database}",
            self.host(),
            self.port
        )
    }

    /// A libpq `key=value` string for the superuser over TCP.
    pub fn conninfo(&self, database: &str) -> String {
        format!(
            "host={} port={} user={SUPERUSER} dbname={database}",
            self.host(),
            self.port
        )
    }

    /// A libpq `key=value` string for the superuser over the unix socket.
    pub fn socket_conninfo(&self, database: &str) -> String {
        format!(
            "host={} port={} user={SUPERUSER} dbname={database}",
            self.root.display(),
            self.port
        )
    }

    /// The PEM file of the CA that signed the server's certificate, when the
    /// cluster was started with [`Builder::ssl`]; `None` otherwise.
    pub fn ca_cert(&self) -> Option<PathBuf> {
        self.ca_cert.clone()
    }

    /// A libpq `key=value` string for the superuser over TLS, verifying the
    /// server against [`Cluster::ca_cert`] (`sslmode=verify-full`); `None`
    /// when the cluster was started without [`Builder::ssl`].
    pub fn ssl_conninfo(&self, database: &str) -> Option<String> {
        let ca = self.ca_cert.as_ref()?;
        Some(format!(
            "host=localhost port={} user={SUPERUSER} dbname={database} sslmode=verify-full \
             sslrootcert='{}'",
            self.port,
            ca.display()
                .to_string()
                .replace('\\', "\\\\")
                .replace('\'', "\\'")
        ))
    }

    /// What the server has logged so far.
    pub fn log(&self) -> String {
        fs::read_to_string(self.root.join("server.log")).unwrap_or_default()
    }

    /// Runs SQL with `psql` as the superuser, stopping at the first error, and
    /// returns the unaligned, tuples-only output.
    pub fn psql(&self, database: &str, sql: &str) -> Result<String> {
        let psql = self.binaries.tool("psql");
        let psql = if psql.is_file() {
            psql
        } else {
            PathBuf::from("psql")
        };
        let mut child = Command::new(&psql)
            .args(["-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-h"])
            .arg(&self.root)
            .arg("-p")
            .arg(self.port.to_string())
            .args(["-U", SUPERUSER, "-d", database, "-f", "-"])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(HarnessError::io(format!("starting {}", psql.display())))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(sql.as_bytes())
                .map_err(HarnessError::io("writing SQL to psql"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(HarnessError::io("waiting for psql"))?;
        if !out.status.success() {
            return Err(HarnessError::Command {
                what: format!("psql -d {database}"),
                status: out.status.to_string(),
                output: String::from_utf8_lossy(&out.stderr).into_owned(),
            });
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim_end().to_owned())
    }

    /// Creates a database owned by the superuser.
    pub fn create_database(&self, name: &str) -> Result<()> {
        self.psql(
            "postgres",
            &format!("CREATE DATABASE {};", quote_ident(name)),
        )
        .map(drop)
    }

    /// Creates a login role that must authenticate with `password` by `auth`.
    /// `attributes` are added to the role, e.g. `"REPLICATION"`.
    pub fn create_login(
        &self,
        name: &str,
        password: &str,
        auth: PasswordAuth,
        attributes: &str,
    ) -> Result<()> {
        let encryption = match auth {
            PasswordAuth::Md5 => "md5",
            PasswordAuth::Scram | PasswordAuth::Cleartext | PasswordAuth::ScramSsl => {
                "scram-sha-256"
            }
        };
        let sql = format!(
            "SET password_encryption = '{encryption}';\n\
             CREATE ROLE {} LOGIN {attributes} PASSWORD {} IN ROLE {};",
            quote_ident(name),
            quote_literal(password),
            auth.group(),
        );
        self.psql("postgres", &sql).map(drop)
    }

    /// Stops the server (immediate shutdown) and removes the directory,
    /// reporting what went wrong; [`Drop`] does the same silently.
    pub fn stop(mut self) -> Result<()> {
        self.shutdown()
    }

    /// Crashes the server (immediate shutdown, so the next start runs crash
    /// recovery) and starts it again on the same port with the same
    /// settings. Connections are cut; replication slots keep only what their
    /// last checkpoint saved.
    pub fn restart(&mut self) -> Result<()> {
        if let Some(child) = self.child.take() {
            stop_server(child, Signal::SIGQUIT)?;
        }
        self.start_again()
    }

    /// Restarts the server as `pg_ctl restart -m fast` does: a clean
    /// shutdown (walsenders end their streams, a shutdown checkpoint is
    /// written), then a start on the same port with the same settings.
    pub fn restart_fast(&mut self) -> Result<()> {
        self.stop_fast()?;
        self.start_again()
    }

    /// Shuts the server down cleanly (`pg_ctl stop -m fast`) and leaves it
    /// down, keeping its directory and port, until [`Cluster::start_again`].
    pub fn stop_fast(&mut self) -> Result<()> {
        match self.child.take() {
            Some(child) => stop_server(child, Signal::SIGINT),
            None => Ok(()),
        }
    }

    /// Starts a server that was stopped by [`Cluster::stop_fast`] (or
    /// crashed) again, on the same port with the same settings.
    pub fn start_again(&mut self) -> Result<()> {
        if let Some(child) = self.child.take() {
            stop_server(child, Signal::SIGQUIT)?;
        }
        let settings = self.settings.clone();
        match self.spawn_server(self.port, &settings)? {
            Launch::Ready => Ok(()),
            Launch::PortTaken(log) => Err(HarnessError::Start {
                reason: format!("port {} was taken while the server restarted", self.port),
                log,
            }),
        }
    }

    fn launch(&mut self, settings: &BTreeMap<String, String>) -> Result<()> {
        let mut last = None;
        for _ in 0..PORT_ATTEMPTS {
            let port = free_port()?;
            match self.spawn_server(port, settings)? {
                Launch::Ready => {
                    self.port = port;
                    return Ok(());
                }
                // Another process took the port between our probe and the
                // server's bind: try another one.
                Launch::PortTaken(log) => last = Some(log),
            }
        }
        Err(HarnessError::Start {
            reason: format!("no free port after {PORT_ATTEMPTS} attempts"),
            log: last.unwrap_or_default(),
        })
    }

    fn spawn_server(&mut self, port: u16, settings: &BTreeMap<String, String>) -> Result<Launch> {
        let log_path = self.root.join("server.log");
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(HarnessError::io(format!("opening {}", log_path.display())))?;
        let log_err = log
            .try_clone()
            .map_err(HarnessError::io("duplicating the log file handle"))?;
        let mut cmd = Command::new(self.binaries.tool("postgres"));
        cmd.arg("-D")
            .arg(self.data_dir())
            .arg("-p")
            .arg(port.to_string())
            .arg("-c")
            .arg("listen_addresses=127.0.0.1")
            .arg("-c")
            .arg(format!("unix_socket_directories={}", self.root.display()));
        for (key, value) in settings {
            cmd.arg("-c").arg(format!("{key}={value}"));
        }
        cmd.current_dir(&self.root)
            .env_remove("PGDATA")
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(log_err))
            // Our own process group: a Ctrl-C at the terminal reaches us, and
            // we stop the server in order instead of racing it.
            .process_group(0);
        RunAs::apply(self.run_as.as_ref(), &mut cmd);
        let child =
            spawn_tied_to_process(cmd).map_err(HarnessError::io("starting postgres".to_owned()))?;
        register(&self.root, Some(child.id()));
        self.child = Some(child);
        self.wait_ready()
    }

    fn wait_ready(&mut self) -> Result<Launch> {
        let deadline = Instant::now() + START_TIMEOUT;
        let pid_file = self.data_dir().join("postmaster.pid");
        loop {
            let Some(child) = self.child.as_mut() else {
                unreachable!("wait_ready runs after spawn");
            };
            if let Some(status) = child
                .try_wait()
                .map_err(HarnessError::io("waiting for postgres"))?
            {
                self.child = None;
                let log = self.log();
                if log.contains("could not bind") || log.contains("Address already in use") {
                    // Keep the log short for the next attempt.
                    let _ = fs::remove_file(self.root.join("server.log"));
                    return Ok(Launch::PortTaken(log));
                }
                return Err(HarnessError::Start {
                    reason: format!("postgres exited with {status}"),
                    log: tail(&log),
                });
            }
            if let Ok(contents) = fs::read_to_string(&pid_file) {
                let lines: Vec<&str> = contents.lines().collect();
                let ours = lines.first().map(|l| l.trim()) == Some(&child.id().to_string());
                if ours && lines.get(7).map(|l| l.trim()) == Some("ready") {
                    return Ok(Launch::Ready);
                }
            }
            if Instant::now() > deadline {
                return Err(HarnessError::Start {
                    reason: format!("not ready after {}s", START_TIMEOUT.as_secs()),
                    log: tail(&self.log()),
                });
            }
            thread::sleep(Duration::from_millis(5));
        }
    }

    fn shutdown(&mut self) -> Result<()> {
        let stopped = match self.child.take() {
            Some(child) => stop_server(child, Signal::SIGQUIT),
            None => Ok(()),
        };
        let removed = remove_root(&self.root);
        unregister(&self.root);
        stopped.and(removed)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if let Err(err) = self.shutdown() {
            eprintln!("datum harness: cleaning up {}: {err}", self.root.display());
        }
    }
}

enum Launch {
    Ready,
    PortTaken(String),
}

/// Immediate shutdown (SIGQUIT): the cluster is thrown away, so there is no
/// point in a checkpoint. SIGKILL if it does not go in time.
/// Stops the postmaster with `how`: SIGQUIT for an immediate shutdown,
/// SIGINT for a fast (clean) one.
fn stop_server(mut child: Child, how: Signal) -> Result<()> {
    let pid = Pid::from_raw(child.id() as i32);
    let _ = signal::kill(pid, how);
    let deadline = Instant::now() + STOP_TIMEOUT;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return Ok(()),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(5)),
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Ok(());
            }
            Err(err) => return Err(HarnessError::io("waiting for postgres to stop")(err)),
        }
    }
}

fn remove_root(root: &Path) -> Result<()> {
    match fs::remove_dir_all(root) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(HarnessError::io(format!("removing {}", root.display()))(
            err,
        )),
    }
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

fn free_port() -> Result<u16> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(HarnessError::io("finding a free port"))?;
    listener
        .local_addr()
        .map(|addr| addr.port())
        .map_err(HarnessError::io("finding a free port"))
}

fn unique_suffix() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{}-{}-{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

fn make_private_dir(path: &Path, run_as: Option<&RunAs>) -> Result<()> {
    fs::DirBuilder::new()
        .mode(0o700)
        .create(path)
        .map_err(HarnessError::io(format!("creating {}", path.display())))?;
    RunAs::chown(run_as, path)
}

/// Creates the cluster's root directory, records who owns it, and registers it
/// for cleanup.
fn create_root(base: &Path, run_as: Option<&RunAs>) -> Result<PathBuf> {
    let root = base.join(format!("{PREFIX}{}", unique_suffix()));
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&root)
        .map_err(HarnessError::io(format!("creating {}", root.display())))?;
    register(&root, None);
    let owner = root.join("owner");
    fs::write(&owner, std::process::id().to_string())
        .map_err(HarnessError::io(format!("writing {}", owner.display())))?;
    RunAs::chown(run_as, &root)?;
    Ok(root)
}

/// Makes a CA for this cluster alone and a server certificate it signs for
/// `localhost`, `127.0.0.1` and `::1`; writes the server's pair where
/// `ssl=on` looks for it (`server.crt`, `server.key` in the data directory,
/// the key private to the server's user as PostgreSQL insists) and the CA
/// to `ca.crt` in the cluster's root. Returns the CA's path.
#[cfg(feature = "tls")]
fn install_certificates(root: &Path, data: &Path, run_as: Option<&RunAs>) -> Result<PathBuf> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let failed = |what: &'static str| move |source| HarnessError::Certificate { what, source };

    let ca_key = KeyPair::generate().map_err(failed("generating the CA key"))?;
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(failed("the CA"))?;
    ca.distinguished_name
        .push(DnType::CommonName, "Datum throwaway CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca.self_signed(&ca_key).map_err(failed("signing the CA"))?;

    let server_key = KeyPair::generate().map_err(failed("generating the server key"))?;
    let names = ["localhost", "127.0.0.1", "::1"]
        .map(str::to_owned)
        .to_vec();
    let mut server = CertificateParams::new(names).map_err(failed("the server certificate"))?;
    server
        .distinguished_name
        .push(DnType::CommonName, "localhost");
    let server = server
        .signed_by(&server_key, &ca, &ca_key)
        .map_err(failed("signing the server certificate"))?;

    write_private(&data.join("server.crt"), &server.pem(), 0o644, run_as)?;
    write_private(
        &data.join("server.key"),
        &server_key.serialize_pem(),
        0o600,
        run_as,
    )?;
    let ca_path = root.join("ca.crt");
    write_private(&ca_path, &ca.pem(), 0o644, run_as)?;
    Ok(ca_path)
}

/// Writes a new file with `mode`, owned by the server's user.
#[cfg(feature = "tls")]
fn write_private(path: &Path, contents: &str, mode: u32, run_as: Option<&RunAs>) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(HarnessError::io(format!("creating {}", path.display())))?;
    file.write_all(contents.as_bytes())
        .map_err(HarnessError::io(format!("writing {}", path.display())))?;
    RunAs::chown(run_as, path)
}

fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    // `cp -a` keeps modes and owners (the data directory must stay 0700 and
    // owned by the server's user).
    let out = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .output()
        .map_err(HarnessError::io("running cp"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Command {
            what: format!("cp -a {} {}", from.display(), to.display()),
            status: out.status.to_string(),
            output: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
}

/// Returns the directory of an `initdb`-ed template for these binaries and
/// this user, creating it once; concurrent creators race harmlessly (each
/// builds in its own directory, the first rename wins).
fn template(base: &Path, binaries: &Binaries, run_as: Option<&RunAs>) -> Result<PathBuf> {
    let mut hasher = DefaultHasher::new();
    (
        TEMPLATE_REVISION,
        binaries.dir(),
        binaries.version(),
        run_as.map(|r| r.uid.as_raw()),
    )
        .hash(&mut hasher);
    let path = base.join(format!("{TEMPLATE_PREFIX}{:016x}", hasher.finish()));
    if path.join("data").join("PG_VERSION").is_file() {
        return Ok(path);
    }

    let building = PathBuf::from(format!("{}.building-{}", path.display(), unique_suffix()));
    let result = build_template(binaries, run_as, &building);
    if let Err(err) = result {
        let _ = fs::remove_dir_all(&building);
        return Err(err);
    }
    if fs::rename(&building, &path).is_err() {
        // Someone else finished first; theirs is as good as ours.
        let _ = fs::remove_dir_all(&building);
    }
    if path.join("data").join("PG_VERSION").is_file() {
        Ok(path)
    } else {
        Err(HarnessError::Io {
            what: format!("installing the template at {}", path.display()),
            source: io::Error::other("the template directory is incomplete"),
        })
    }
}

fn build_template(binaries: &Binaries, run_as: Option<&RunAs>, dir: &Path) -> Result<()> {
    make_private_dir(dir, run_as)?;
    let data = dir.join("data");
    let mut initdb = Command::new(binaries.tool("initdb"));
    initdb
        .arg("-D")
        .arg(&data)
        .args([
            "-U",
            SUPERUSER,
            "--auth=trust",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ])
        .current_dir(dir)
        .env_remove("PGDATA");
    RunAs::apply(run_as, &mut initdb);
    run(&mut initdb, "initdb", None)?;

    let hba = data.join("pg_hba.conf");
    fs::write(&hba, hba_conf()).map_err(HarnessError::io(format!("writing {}", hba.display())))?;

    // Roles that pg_hba.conf refers to, created in single-user mode so that
    // no server has to be started for the template.
    let mut setup = String::new();
    for auth in PasswordAuth::ALL {
        setup.push_str(&format!("CREATE ROLE {} NOLOGIN;\n", auth.group()));
    }
    let mut single = Command::new(binaries.tool("postgres"));
    single
        .args(["--single", "-D"])
        .arg(&data)
        .args(["-c", "exit_on_error=on", "-c", "fsync=off", "postgres"])
        .current_dir(dir)
        .env_remove("PGDATA");
    RunAs::apply(run_as, &mut single);
    run(
        &mut single,
        "postgres --single (template setup)",
        Some(&setup),
    )?;
    Ok(())
}

fn run(cmd: &mut Command, what: &str, stdin: Option<&str>) -> Result<()> {
    cmd.stdin(if stdin.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    })
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(HarnessError::io(format!("starting {what}")))?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(input.as_bytes())
            .map_err(HarnessError::io(format!("writing to {what}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(HarnessError::io(format!("waiting for {what}")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(HarnessError::Command {
            what: what.to_owned(),
            status: out.status.to_string(),
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
        })
    }
}

// ---------------------------------------------------------------------------
// Tying servers to this process.

type SpawnJob = (Command, mpsc::Sender<io::Result<Child>>);

/// Spawns `cmd` so that it receives SIGQUIT when this process dies.
///
/// `PR_SET_PDEATHSIG` fires when the *thread* that forked the child exits, not
/// the process; test threads come and go, so every server is forked by one
/// long-lived keeper thread.
fn spawn_tied_to_process(cmd: Command) -> io::Result<Child> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnJob>>> = OnceLock::new();
    let keeper = KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnJob>();
        thread::Builder::new()
            .name("pg-harness-keeper".to_owned())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(spawn_with_pdeathsig(&mut cmd));
                }
            })
            .expect("spawning the harness keeper thread");
        Mutex::new(tx)
    });
    let (reply_tx, reply_rx) = mpsc::channel();
    keeper
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .send((cmd, reply_tx))
        .map_err(|_| io::Error::other("the harness keeper thread is gone"))?;
    reply_rx
        .recv()
        .map_err(|_| io::Error::other("the harness keeper thread is gone"))?
}

fn spawn_with_pdeathsig(cmd: &mut Command) -> io::Result<Child> {
    let parent = std::process::id() as i32;
    // SAFETY: the closure runs between fork and exec and only makes
    // async-signal-safe system calls (prctl, getppid); it allocates nothing.
    // std applies uid/gid before running it, so the death signal survives
    // the credential change (which would otherwise clear it).
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGQUIT).map_err(io::Error::from)?;
            if nix::unistd::getppid().as_raw() != parent {
                // We died before the death signal was armed.
                return Err(io::Error::other("parent exited during spawn"));
            }
            Ok(())
        });
    }
    cmd.spawn()
}

// ---------------------------------------------------------------------------
// Cleanup on signals and of earlier runs.

/// Live clusters of this process: root directory and postmaster pid.
type Live = Mutex<Vec<(PathBuf, Option<u32>)>>;

fn live() -> &'static Live {
    static LIVE: OnceLock<Live> = OnceLock::new();
    LIVE.get_or_init(|| Mutex::new(Vec::new()))
}

fn register(root: &Path, pid: Option<u32>) {
    let mut live = live().lock().unwrap_or_else(|p| p.into_inner());
    live.retain(|(r, _)| r != root);
    live.push((root.to_owned(), pid));
}

fn unregister(root: &Path) {
    live()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .retain(|(r, _)| r != root);
}

fn install_signal_cleanup() {
    static INSTALLED: Once = Once::new();
    INSTALLED.call_once(|| {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let Ok(mut signals) = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP]) else {
            return;
        };
        let _ = thread::Builder::new()
            .name("pg-harness-signals".to_owned())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    cleanup_all_live();
                    // Die of the signal as if we had never caught it.
                    let _ = signal_hook::low_level::emulate_default_handler(sig);
                    std::process::exit(128 + sig);
                }
            });
    });
}

fn cleanup_all_live() {
    let entries: Vec<(PathBuf, Option<u32>)> =
        live().lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (root, pid) in entries {
        if let Some(pid) = pid {
            stop_pid(Pid::from_raw(pid as i32));
        }
        let _ = fs::remove_dir_all(&root);
    }
}

/// Stops a server we may not hold a `Child` for (signal path, stale sweep).
fn stop_pid(pid: Pid) {
    use nix::sys::wait::{WaitPidFlag, waitpid};
    if signal::kill(pid, Signal::SIGQUIT).is_err() {
        return;
    }
    let deadline = Instant::now() + STOP_TIMEOUT;
    while Instant::now() < deadline {
        // Our own child must be reaped to disappear; someone else's just goes.
        let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
        if signal::kill(pid, None).is_err() {
            return;
        }
        thread::sleep(Duration::from_millis(10));
    }
    let _ = signal::kill(pid, Signal::SIGKILL);
    let _ = waitpid(pid, None);
}

fn alive(pid: i32) -> bool {
    // EPERM means it exists but belongs to someone else.
    !matches!(
        signal::kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes what earlier runs left behind when they were killed outright:
/// cluster directories whose owner process is gone (stopping a server that is
/// somehow still running in one), and unfinished templates.
fn sweep_stale(base: &Path) {
    static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
    {
        let mut swept = SWEPT.lock().unwrap_or_else(|p| p.into_inner());
        if swept.iter().any(|d| d == base) {
            return;
        }
        swept.push(base.to_owned());
    }
    {
        let Ok(entries) = fs::read_dir(base) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let path = entry.path();
            if let Some(rest) = name.strip_prefix(TEMPLATE_PREFIX) {
                if let Some(owner) = building_owner(rest)
                    && !alive(owner)
                {
                    let _ = fs::remove_dir_all(&path);
                }
                continue;
            }
            if !name.starts_with(PREFIX) {
                continue;
            }
            let Some(owner) = read_pid(&path.join("owner")) else {
                continue;
            };
            if owner == std::process::id() as i32 || alive(owner) {
                continue;
            }
            if let Some(postmaster) = read_pid(&path.join("data").join("postmaster.pid"))
                && alive(postmaster)
                && is_postgres(postmaster)
            {
                stop_pid(Pid::from_raw(postmaster));
            }
            let _ = fs::remove_dir_all(&path);
        }
    }
}

/// `KEY.building-PID-SEQ-NANOS` → PID.
fn building_owner(rest: &str) -> Option<i32> {
    rest.split_once(".building-")?
        .1
        .split('-')
        .next()?
        .parse()
        .ok()
}

fn read_pid(path: &Path) -> Option<i32> {
    fs::read_to_string(path)
        .ok()?
        .lines()
        .next()?
        .trim()
        .parse()
        .ok()
}

fn is_postgres(pid: i32) -> bool {
    fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .and_then(|exe| exe.file_name().map(|n| n == OsStr::new("postgres")))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_doubles_embedded_quotes() {
        assert_eq!(quote_ident(r#"we"ird"#), r#""we""ird""#);
        assert_eq!(quote_literal("it's"), "'it''s'");
    }

    #[test]
    fn building_owner_parses_the_pid() {
        assert_eq!(
            building_owner("00ff.building-1234-7-abc"),
            Some(1234),
            "the pid follows .building-"
        );
        assert_eq!(building_owner("00ff"), None);
    }

    #[test]
    fn hba_lets_the_ssl_group_in_only_over_tls() {
        let hba = hba_conf();
        let trust = hba.find("all all trust").expect("trust rule");
        for rule in [
            "local all +datum_auth_ssl reject",
            "hostssl all +datum_auth_ssl 127.0.0.1/32 scram-sha-256",
            "hostnossl all +datum_auth_ssl 127.0.0.1/32 reject",
            "hostnossl replication +datum_auth_ssl ::1/128 reject",
        ] {
            let at = hba
                .find(rule)
                .unwrap_or_else(|| panic!("no `{rule}` in:\n{hba}"));
            assert!(at < trust, "`{rule}` must come before trust:\n{hba}");
        }
        assert!(
            !hba.contains("host all +datum_auth_ssl"),
            "no rule may admit the ssl group without TLS:\n{hba}"
        );
    }

    #[test]
    fn hba_puts_password_groups_before_trust() {
        let hba = hba_conf();
        let scram = hba.find("+datum_auth_scram").expect("scram rule");
        let trust = hba.find("all all trust").expect("trust rule");
        assert!(scram < trust, "pg_hba.conf is matched top-down:\n{hba}");
    }
}
