//! A throwaway `nats-server` with JetStream, started by a test like the
//! PostgreSQL clusters: its own directory, port and store, killed and
//! removed when dropped. `.ci/run` installs Debian's `nats-server` when it
//! is missing; `NATS_SERVER` names another binary.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// See the module documentation.
#[derive(Debug)]
pub struct NatsServer {
    dir: PathBuf,
    port: u16,
    child: Option<Child>,
}

/// The server binary: `$NATS_SERVER`, else `nats-server` on `PATH` or in
/// `/usr/sbin` (where Debian puts it).
pub fn nats_server_bin() -> PathBuf {
    if let Some(path) = std::env::var_os("NATS_SERVER") {
        return PathBuf::from(path);
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/local/bin")])
        .map(|dir| dir.join("nats-server"))
        .find(|p| p.is_file());
    on_path.unwrap_or_else(|| {
        panic!(
            "nats-server not found: install it (apt-get install nats-server; .ci/run does) \
             or set NATS_SERVER to its path"
        )
    })
}

impl NatsServer {
    /// A server with JetStream and nothing else configured.
    pub fn start() -> NatsServer {
        NatsServer::start_with("")
    }

    /// A server whose configuration file also holds `extra` (an
    /// `authorization` block, a `tls` block); `{dir}` in it is the
    /// server's directory.
    pub fn start_with(extra: &str) -> NatsServer {
        let dir =
            std::env::temp_dir().join(format!("datum-nats-{}-{}", std::process::id(), unique()));
        std::fs::create_dir_all(&dir).expect("nats directory");
        let port = crate::free_port();
        let config = format!(
            "listen: \"127.0.0.1:{port}\"\n\
             jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  \
             max_file_store: 2GB\n}}\n{extra}\n",
            store = dir.join("store").display(),
            extra = extra.replace("{dir}", &dir.display().to_string()),
        );
        std::fs::write(dir.join("nats.conf"), config).expect("nats.conf");
        let mut server = NatsServer {
            dir,
            port,
            child: None,
        };
        server.start_again();
        server
    }

    /// Starts the server again (after `kill`), on the same port and store.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "the nats server is running");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("nats.log"))
            .expect("nats.log");
        let mut command = Command::new(nats_server_bin());
        command
            .arg("-c")
            .arg(self.dir.join("nats.conf"))
            .stdout(Stdio::null())
            .stderr(log);
        // The server dies with the thread that started it (the test's), so
        // a test killed with SIGKILL leaves no server behind.
        // SAFETY: only an async-signal-safe prctl between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", nats_server_bin().display()));
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(stream) = TcpStream::connect(("127.0.0.1", self.port)) {
                let mut line = String::new();
                let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
                if BufReader::new(&stream).read_line(&mut line).is_ok() && line.starts_with("INFO")
                {
                    // Said hello: the server accepts clients. Leave politely.
                    let _ = (&stream).write_all(b"CONNECT {\"verbose\":false}\r\n");
                    return;
                }
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!("nats-server exited ({status}):\n{}", self.log());
            }
            assert!(
                Instant::now() < deadline,
                "nats-server not accepting within 20 s:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, and wait until it is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's directory (its configuration, store and log).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// What the server logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("nats.log")).unwrap_or_default()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn unique() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
