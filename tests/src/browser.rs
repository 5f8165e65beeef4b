//! A real headless browser for the dashboard's tests: Debian's `chromium`
//! driven through `chromedriver` (WebDriver, plain HTTP and JSON), started
//! by the test and killed with its whole process group when dropped.
//! `.ci/run` installs both when they are missing; `CHROMIUM` and
//! `CHROMEDRIVER` name other binaries.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value as Json, json};

/// See the module documentation.
#[derive(Debug)]
pub struct Browser {
    driver: Child,
    base: String,
    session: String,
    client: reqwest::Client,
    profile: PathBuf,
}

fn binary(variable: &str, names: &[&str]) -> PathBuf {
    if let Some(path) = std::env::var_os(variable) {
        return PathBuf::from(path);
    }
    let dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.iter()
        .chain(
            [
                PathBuf::from("/usr/bin"),
                PathBuf::from("/usr/lib/chromium"),
            ]
            .iter(),
        )
        .flat_map(|dir| names.iter().map(move |name| dir.join(name)))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{} not found: install Debian's chromium and chromium-driver (.ci/run does) or \
                 set {variable}",
                names[0]
            )
        })
}

impl Browser {
    /// Starts `chromedriver` and a headless Chromium session.
    pub async fn start() -> Browser {
        let chromium = binary("CHROMIUM", &["chromium", "chromium-browser"]);
        let chromedriver = binary("CHROMEDRIVER", &["chromedriver"]);
        let port = crate::free_port();
        let profile =
            std::env::temp_dir().join(format!("datum-browser-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&profile).expect("browser profile");
        let mut command = Command::new(&chromedriver);
        command
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0);
        // SAFETY: only an async-signal-safe prctl between fork and exec.
        unsafe {
            command.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
                    .map_err(std::io::Error::from)
            });
        }
        let driver = command.spawn().expect("chromedriver");
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(r) = client.get(format!("{base}/status")).send().await
                && r.status().is_success()
            {
                break;
            }
            assert!(Instant::now() < deadline, "chromedriver did not start");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let capabilities = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                // Headless, and nothing that reaches for the network this
                // machine does not have.
                "args": [
                    "--headless=new", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
                    "--disable-background-networking", "--disable-component-update",
                    "--disable-sync", "--window-size=1280,1800",
                    format!("--user-data-dir={}", profile.display()),
                ],
            },
        }}});
        let mut browser = Browser {
            driver,
            base,
            session: String::new(),
            client,
            profile,
        };
        let answer = browser.send("POST", "/session", Some(capabilities)).await;
        browser.session = answer["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("no session: {answer}"))
            .to_owned();
        browser
    }

    async fn send(&self, method: &str, path: &str, body: Option<Json>) -> Json {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "POST" => self.client.post(url),
            "DELETE" => self.client.delete(url),
            _ => self.client.get(url),
        };
        let request = match body {
            Some(body) => request
                .header("content-type", "application/json")
                .body(body.to_string()),
            None => request,
        };
        let response = request.send().await.expect("webdriver request");
        let text = response.text().await.expect("webdriver answer");
        let answer: Json = serde_json::from_str(&text).unwrap_or(Json::Null);
        if answer["value"]["error"].is_string() {
            panic!("webdriver {method} {path}: {}", answer["value"]);
        }
        answer["value"].clone()
    }

    fn session_path(&self, rest: &str) -> String {
        format!("/session/{}{rest}", self.session)
    }

    /// Opens `url`.
    pub async fn goto(&self, url: &str) {
        self.send(
            "POST",
            &self.session_path("/url"),
            Some(json!({"url": url})),
        )
        .await;
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the
    /// page; what it returns.
    pub async fn eval(&self, script: &str, args: Vec<Json>) -> Json {
        self.send(
            "POST",
            &self.session_path("/execute/sync"),
            Some(json!({"script": script, "args": args})),
        )
        .await
    }

    /// Waits until `script` returns something truthy; that value.
    pub async fn wait_for(&self, what: &str, script: &str, secs: u64) -> Json {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let value = self.eval(script, vec![]).await;
            let truthy = match &value {
                Json::Null => false,
                Json::Bool(b) => *b,
                Json::String(s) => !s.is_empty(),
                Json::Number(n) => n.as_f64() != Some(0.0),
                _ => true,
            };
            if truthy {
                return value;
            }
            if Instant::now() > deadline {
                let body = self.eval("return document.body.innerText", vec![]).await;
                panic!("{what}: not within {secs}s; the page shows:\n{body}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Saves a PNG of the page at `path`.
    pub async fn screenshot(&self, path: &Path) {
        let data = self
            .send("GET", &self.session_path("/screenshot"), None)
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(data.as_str().unwrap_or_default())
            .expect("a base64 screenshot");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("screenshot directory");
        }
        std::fs::write(path, png).expect("screenshot");
    }

    /// Ends the session (Chromium quits) and the driver.
    pub async fn close(mut self) {
        let path = self.session_path("");
        let _ = self.send("DELETE", &path, None).await;
        self.kill();
    }

    fn kill(&mut self) {
        let group = nix::unistd::Pid::from_raw(self.driver.id() as i32);
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.driver.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if matches!(self.driver.try_wait(), Ok(None)) {
            self.kill();
        }
    }
}
