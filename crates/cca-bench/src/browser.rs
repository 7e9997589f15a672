//! Headless Chromium driven over the DevTools protocol, for the web
//! console's browser tests and its load benchmark: launched with a profile
//! of its own and a debugging port the kernel picks, it opens tabs,
//! evaluates script in them, waits for a condition on the page, takes
//! screenshots and reads what a tab costs (its renderer's resident memory
//! and JavaScript heap). The browser is a child process stopped when the
//! [`Browser`] drops, pass or fail. Synchronous: one request at a time on
//! one WebSocket, events skipped.

use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde_json::{Value, json};
use tungstenite::{Message, WebSocket};

/// How long a launch waits for the browser's DevTools address.
const LAUNCH_WAIT: Duration = Duration::from_secs(30);
/// How long one protocol call may take.
const CALL_WAIT: Duration = Duration::from_secs(60);
/// How often [`Browser::wait_for`] evaluates its condition.
const POLL: Duration = Duration::from_millis(100);

/// What went wrong driving the browser.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error(
        "no Chromium found (tried $CCA_CHROMIUM, chromium, chromium-browser, google-chrome): \
         install Debian's `chromium` (scripts/test does)"
    )]
    NotInstalled,
    #[error("starting {binary}: {reason}")]
    Launch { binary: String, reason: String },
    #[error("the DevTools connection failed: {0}")]
    Connection(String),
    #[error("DevTools refused {method}: {message}")]
    Protocol { method: String, message: String },
    #[error("the page's script threw: {0}")]
    Script(String),
    #[error("waited {waited:?} for `{condition}`; the page last showed:\n{page}")]
    Timeout {
        condition: String,
        waited: Duration,
        page: String,
    },
    #[error("writing {path}: {reason}")]
    Write { path: String, reason: String },
}

pub type BrowserResult<T> = Result<T, BrowserError>;

/// One tab, attached on the browser's connection.
#[derive(Clone, Debug)]
pub struct Tab {
    target: String,
    session: String,
}

/// A headless Chromium and the WebSocket of its DevTools protocol.
pub struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    socket: WebSocket<TcpStream>,
    next_id: u64,
}

impl std::fmt::Debug for Browser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Browser")
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Chromium binary: `$CCA_CHROMIUM`, else the first of the usual
/// names that runs.
pub fn chromium() -> Option<String> {
    let candidates = std::env::var("CCA_CHROMIUM").into_iter().chain(
        ["chromium", "chromium-browser", "google-chrome"]
            .into_iter()
            .map(str::to_owned),
    );
    candidates.into_iter().find(|binary| {
        Command::new(binary)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    })
}

impl Browser {
    /// Starts a headless Chromium with a window of `width`×`height`.
    pub fn launch(width: u32, height: u32) -> BrowserResult<Self> {
        Self::launch_with(width, height, &[])
    }

    /// [`Browser::launch`] with more command-line switches (a test's
    /// `--ignore-certificate-errors` for a CA of its own).
    pub fn launch_with(width: u32, height: u32, switches: &[&str]) -> BrowserResult<Self> {
        let binary = chromium().ok_or(BrowserError::NotInstalled)?;
        let launch_error = |reason: String| BrowserError::Launch {
            binary: binary.clone(),
            reason,
        };
        let profile = tempfile::tempdir().map_err(|e| launch_error(e.to_string()))?;
        let mut child = Command::new(&binary)
            .args([
                "--headless",
                // Root has no sandbox to enter; the pages are our own.
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                &format!("--window-size={width},{height}"),
            ])
            .args(switches)
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| launch_error(e.to_string()))?;
        let address = devtools_address(&mut child).map_err(|reason| {
            let _ = child.kill();
            let _ = child.wait();
            launch_error(reason)
        })?;
        let socket = connect(&address)?;
        Ok(Browser {
            child,
            _profile: profile,
            socket,
            next_id: 0,
        })
    }

    /// Opens `url` in a new tab.
    pub fn open(&mut self, url: &str) -> BrowserResult<Tab> {
        let target = self.call(None, "Target.createTarget", json!({ "url": url }))?;
        let target_id = target["targetId"].as_str().unwrap_or_default().to_owned();
        let attached = self.call(
            None,
            "Target.attachToTarget",
            json!({ "targetId": target_id, "flatten": true }),
        )?;
        let session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| BrowserError::Connection("attaching gave no session".into()))?
            .to_owned();
        Ok(Tab {
            target: target_id,
            session,
        })
    }

    /// Closes `tab`.
    pub fn close(&mut self, tab: Tab) -> BrowserResult<()> {
        self.call(
            None,
            "Target.closeTarget",
            json!({ "targetId": tab.target }),
        )?;
        Ok(())
    }

    /// The memory of `tab`'s renderer: the renderer that goes when the
    /// tab is closed (closed here, and waited for up to `wait`), read just
    /// before. `None` when no renderer went (the tab shared one).
    pub fn close_measuring(
        &mut self,
        tab: Tab,
        wait: Duration,
    ) -> BrowserResult<Option<ProcessMemory>> {
        let before = self.renderers()?;
        self.close(tab)?;
        let started = Instant::now();
        while started.elapsed() < wait {
            let after = self.renderers()?;
            if let Some(gone) = before
                .iter()
                .find(|process| after.iter().all(|left| left.pid != process.pid))
            {
                return Ok(Some(*gone));
            }
            std::thread::sleep(POLL);
        }
        Ok(None)
    }

    /// Evaluates `expression` in `tab` (awaiting a promise) and returns
    /// its value.
    pub fn eval(&mut self, tab: &Tab, expression: &str) -> BrowserResult<Value> {
        let answer = self.call(
            Some(&tab.session),
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        )?;
        if let Some(details) = answer.get("exceptionDetails") {
            let text = details["exception"]["description"]
                .as_str()
                .or_else(|| details["text"].as_str())
                .unwrap_or("an exception");
            return Err(BrowserError::Script(text.to_owned()));
        }
        Ok(answer["result"]["value"].clone())
    }

    /// Evaluates `condition` until it is truthy (returning its value) or
    /// `timeout` passes (an error with the page's text). A script error
    /// counts as not yet: the page may still be loading.
    pub fn wait_for(
        &mut self,
        tab: &Tab,
        condition: &str,
        timeout: Duration,
    ) -> BrowserResult<Value> {
        self.wait_for_every(tab, condition, timeout, POLL)
    }

    /// [`Browser::wait_for`], evaluating every `poll`.
    pub fn wait_for_every(
        &mut self,
        tab: &Tab,
        condition: &str,
        timeout: Duration,
        poll: Duration,
    ) -> BrowserResult<Value> {
        let started = Instant::now();
        loop {
            if let Ok(value) = self.eval(tab, condition)
                && truthy(&value)
            {
                return Ok(value);
            }
            if started.elapsed() > timeout {
                let page = self
                    .eval(tab, "document.body ? document.body.innerText : ''")
                    .ok()
                    .and_then(|text| text.as_str().map(|t| t.chars().take(2000).collect()))
                    .unwrap_or_default();
                return Err(BrowserError::Timeout {
                    condition: condition.to_owned(),
                    waited: started.elapsed(),
                    page,
                });
            }
            std::thread::sleep(poll);
        }
    }

    /// Saves a PNG of what `tab` shows.
    pub fn screenshot(&mut self, tab: &Tab, path: &Path) -> BrowserResult<()> {
        let shot = self.call(
            Some(&tab.session),
            "Page.captureScreenshot",
            json!({ "format": "png" }),
        )?;
        let write_error = |reason: String| BrowserError::Write {
            path: path.display().to_string(),
            reason,
        };
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap_or_default())
            .map_err(|e| write_error(e.to_string()))?;
        std::fs::write(path, png).map_err(|e| write_error(e.to_string()))
    }

    /// The JavaScript heap `tab` uses, in bytes.
    pub fn js_heap(&mut self, tab: &Tab) -> BrowserResult<u64> {
        let usage = self.call(Some(&tab.session), "Runtime.getHeapUsage", json!({}))?;
        Ok(usage["usedSize"].as_f64().unwrap_or(0.0) as u64)
    }

    /// The memory of every renderer process (one per tab, and spares).
    pub fn renderers(&mut self) -> BrowserResult<Vec<ProcessMemory>> {
        let info = self.call(None, "SystemInfo.getProcessInfo", json!({}))?;
        Ok(info["processInfo"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|process| process["type"] == "renderer")
            .filter_map(|process| process["id"].as_u64())
            .filter_map(ProcessMemory::of)
            .collect())
    }

    /// Sends one command and waits for its answer, skipping events.
    fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> BrowserResult<Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut request = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            request["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(request.to_string()))
            .map_err(|e| BrowserError::Connection(e.to_string()))?;
        let deadline = Instant::now() + CALL_WAIT;
        while Instant::now() < deadline {
            let message = match self.socket.read() {
                Ok(message) => message,
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(BrowserError::Connection(e.to_string())),
            };
            let Message::Text(text) = message else {
                continue;
            };
            let answer: Value = serde_json::from_str(text.as_str())
                .map_err(|e| BrowserError::Connection(format!("a message is not JSON: {e}")))?;
            if answer["id"] != id {
                continue;
            }
            if let Some(error) = answer.get("error") {
                return Err(BrowserError::Protocol {
                    method: method.to_owned(),
                    message: error["message"].as_str().unwrap_or("").to_owned(),
                });
            }
            return Ok(answer["result"].clone());
        }
        Err(BrowserError::Connection(format!(
            "{method} got no answer in {CALL_WAIT:?}"
        )))
    }
}

fn truthy(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|n| n != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

/// The `ws://` address the browser prints on stderr once it listens.
fn devtools_address(child: &mut Child) -> Result<String, String> {
    let stderr = child.stderr.take().ok_or("its stderr is not piped")?;
    let (sender, received) = mpsc::channel();
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(address) = line.strip_prefix("DevTools listening on ") {
                let _ = sender.send(Ok(address.trim().to_owned()));
                // Keep reading so that the browser never blocks on a full pipe.
                continue;
            }
            if seen.len() < 20 {
                seen.push(line);
            }
        }
        let _ = sender.send(Err(format!("it exited: {}", seen.join("\n"))));
    });
    received
        .recv_timeout(LAUNCH_WAIT)
        .map_err(|_| format!("it printed no DevTools address in {LAUNCH_WAIT:?}"))?
}

fn connect(address: &str) -> BrowserResult<WebSocket<TcpStream>> {
    let failed = |reason: String| BrowserError::Connection(format!("{address}: {reason}"));
    let host = address
        .strip_prefix("ws://")
        .and_then(|rest| rest.split('/').next())
        .ok_or_else(|| failed("not a ws:// address".into()))?;
    let stream = TcpStream::connect(host).map_err(|e| failed(e.to_string()))?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| failed(e.to_string()))?;
    let (socket, _) =
        tungstenite::client::client(address, stream).map_err(|e| failed(e.to_string()))?;
    Ok(socket)
}

/// What one process holds in memory, in bytes, from
/// `/proc/PID/smaps_rollup`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProcessMemory {
    pub pid: u64,
    /// Resident, shared pages counted whole.
    pub resident: u64,
    /// Resident, shared pages divided among their sharers (PSS).
    pub proportional: u64,
    /// Pages only this process maps: what closing it frees (close to
    /// Chromium's own "memory footprint" of a tab).
    pub private: u64,
}

impl ProcessMemory {
    fn of(pid: u64) -> Option<Self> {
        let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        let field = |name: &str| -> u64 {
            rollup
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .and_then(|rest| {
                    rest.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .ok()
                })
                .map_or(0, |kib| kib * 1024)
        };
        Some(ProcessMemory {
            pid,
            resident: field("Rss:"),
            proportional: field("Pss:"),
            private: field("Private_Clean:") + field("Private_Dirty:"),
        })
    }
}
