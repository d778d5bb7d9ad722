//! A real browser for the tests: headless Chromium (Debian's package) driven over the DevTools
//! protocol — a WebSocket on `--remote-debugging-port=0`, whose port Chromium writes to
//! `DevToolsActivePort` in its profile — to open pages, click with the mouse, type, run
//! script, watch what the page logs and take screenshots. Where Chromium is not installed,
//! [`Browser::launch`] says so on stderr ("SKIPPED: …") and the test returns early.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// How long a page may take to show what a test waits for.
const WAIT: Duration = Duration::from_secs(15);

/// How long Chromium may take to start listening: on a loaded 2-core CI machine, with other
/// tests' browsers and servers starting at once, more than [`WAIT`] (a fresh-clone run saw
/// "chromium wrote no DevToolsActivePort" after 15 s).
const START: Duration = Duration::from_secs(60);

/// Headless Chromium from Debian's packages; `None` (and a visible note naming `test`) where it
/// is absent.
pub fn chromium(test: &str) -> Option<&'static str> {
    let found = ["/usr/bin/chromium", "/usr/bin/chromium-browser"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    if found.is_none() {
        eprintln!(
            "SKIPPED: chromium is not installed (apt-get install chromium); {test} did not run"
        );
    }
    found
}

/// Where a test's screenshots go: `target/tmp/screenshots/` (printed by [`Browser::screenshot`]).
pub fn screenshot_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One headless Chromium with one page, driven over the DevTools protocol.
pub struct Browser {
    child: tokio::process::Child,
    _profile: tempfile::TempDir,
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    /// The page's session (flat mode: commands to the page carry it).
    session: String,
    next_id: u64,
    /// What the page logged: console messages, uncaught exceptions, browser log entries (CSP
    /// violations among them), as `level: text`.
    pub log: Vec<String>,
    /// Dialogs the page opened (`alert`, `confirm`, …; each dismissed at once): their messages.
    pub dialogs: Vec<String>,
    /// The page's frames that run in a process of their own (Chromium isolates sandboxed
    /// frames and other sites' frames), once [`Browser::watch_frames`] is on: each one's
    /// session and the URL it had when attached (often still `about:blank` or empty). What they log and the dialogs they open go to [`Browser::log`] and
    /// [`Browser::dialogs`] like the page's.
    pub frames: Vec<(String, String)>,
}

impl Browser {
    /// Starts Chromium with `args` added (`--host-resolver-rules=…`) and opens a blank page;
    /// `None` if Chromium is not installed (see [`chromium`]).
    pub async fn launch(test: &str, args: &[&str]) -> Option<Self> {
        let chromium = chromium(test)?;
        let profile = tempfile::tempdir().unwrap();
        let child = tokio::process::Command::new(chromium)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-quic",
                "--remote-debugging-port=0",
                "--window-size=1280,900",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .args(args)
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("chromium starts");
        // Chromium writes its port and the browser's WebSocket path once it listens.
        let port_file = profile.path().join("DevToolsActivePort");
        let deadline = Instant::now() + START;
        let url = loop {
            let written = std::fs::read_to_string(&port_file).unwrap_or_default();
            let mut lines = written.lines();
            if let (Some(port), Some(path)) = (lines.next(), lines.next()) {
                break format!("ws://127.0.0.1:{port}{path}");
            }
            assert!(
                Instant::now() < deadline,
                "chromium wrote no DevToolsActivePort"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (socket, _) = tokio_tungstenite::connect_async(url.as_str())
            .await
            .expect("the DevTools WebSocket");
        let mut browser = Self {
            child,
            _profile: profile,
            socket,
            session: String::new(),
            next_id: 0,
            log: Vec::new(),
            dialogs: Vec::new(),
            frames: Vec::new(),
        };
        let target = browser
            .browser_command("Target.createTarget", json!({ "url": "about:blank" }))
            .await;
        let attached = browser
            .browser_command(
                "Target.attachToTarget",
                json!({ "targetId": target["targetId"], "flatten": true }),
            )
            .await;
        browser.session = attached["sessionId"].as_str().unwrap().to_owned();
        for domain in ["Page.enable", "Runtime.enable", "Log.enable"] {
            browser.command(domain, json!({})).await;
        }
        browser
            .command(
                "Emulation.setDeviceMetricsOverride",
                json!({ "width": 1280, "height": 900, "deviceScaleFactor": 1, "mobile": false }),
            )
            .await;
        Some(browser)
    }

    /// A command to the browser itself.
    async fn browser_command(&mut self, method: &str, params: Value) -> Value {
        self.send(None, method, params).await
    }

    /// A command to the page; its result (a protocol error fails the test).
    pub async fn command(&mut self, method: &str, params: Value) -> Value {
        let session = self.session.clone();
        self.send(Some(session), method, params).await
    }

    async fn send(&mut self, session: Option<String>, method: &str, params: Value) -> Value {
        let answer = self.try_send(session, method, params).await;
        answer.unwrap_or_else(|error| panic!("{method} failed: {error}"))
    }

    /// A command's result, or the protocol's error.
    async fn try_send(
        &mut self,
        session: Option<String>,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({ "id": id, "method": method, "params": params });
        if let Some(session) = session {
            message["sessionId"] = json!(session);
        }
        self.socket
            .send(Message::text(message.to_string()))
            .await
            .unwrap();
        loop {
            let received = self.receive().await;
            if received["id"] == id {
                return match received.get("error") {
                    Some(error) => Err(error.clone()),
                    None => Ok(received["result"].clone()),
                };
            }
            self.note(received).await;
        }
    }

    async fn receive(&mut self) -> Value {
        loop {
            let frame = tokio::time::timeout(WAIT, self.socket.next())
                .await
                .expect("chromium answers")
                .expect("the DevTools connection is open")
                .unwrap();
            if let Message::Text(text) = frame {
                return serde_json::from_str(&text).unwrap();
            }
        }
    }

    /// Notes what the page logged and the dialogs it opened; a dialog is dismissed at once (it
    /// blocks the page's script, and the answer of a command waiting on it).
    async fn note(&mut self, event: Value) {
        let params = &event["params"];
        match event["method"].as_str() {
            Some("Runtime.consoleAPICalled") => {
                let text: Vec<String> = params["args"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|a| {
                        a["value"]
                            .as_str()
                            .map_or_else(|| a.to_string(), str::to_owned)
                    })
                    .collect();
                self.log
                    .push(format!("console.{}: {}", params["type"], text.join(" ")));
            }
            Some("Runtime.exceptionThrown") => self.log.push(format!(
                "exception: {}",
                params["exceptionDetails"]["exception"]["description"]
            )),
            Some("Log.entryAdded") => self.log.push(format!(
                "{}: {}",
                params["entry"]["level"], params["entry"]["text"]
            )),
            Some("Page.javascriptDialogOpening") => {
                self.dialogs
                    .push(params["message"].as_str().unwrap_or_default().to_owned());
                self.next_id += 1;
                let dismiss = json!({ "id": self.next_id, "sessionId": event["sessionId"],
                    "method": "Page.handleJavaScriptDialog", "params": { "accept": false } });
                self.socket
                    .send(Message::text(dismiss.to_string()))
                    .await
                    .unwrap();
            }
            Some("Target.attachedToTarget") => {
                // A frame in a process of its own, paused before it runs anything: watch it
                // like the page, then let it run (fire and forget: the answers are ignored).
                let session = params["sessionId"].as_str().unwrap_or_default().to_owned();
                let url = params["targetInfo"]["url"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned();
                for method in [
                    "Page.enable",
                    "Runtime.enable",
                    "Log.enable",
                    "Runtime.runIfWaitingForDebugger",
                ] {
                    self.next_id += 1;
                    let command = json!({ "id": self.next_id, "sessionId": session,
                        "method": method, "params": {} });
                    self.socket
                        .send(Message::text(command.to_string()))
                        .await
                        .unwrap();
                }
                self.frames.push((session, url));
            }
            _ => {}
        }
    }

    /// Attaches to each frame of the page that runs in a process of its own as it appears
    /// (before it runs anything), watching its log and dialogs ([`Browser::frames`]).
    pub async fn watch_frames(&mut self) {
        self.command(
            "Target.setAutoAttach",
            json!({ "autoAttach": true, "waitForDebuggerOnStart": true, "flatten": true }),
        )
        .await;
    }

    /// A command to one of [`Browser::frames`] (by its session): its result, or the
    /// protocol's error (a frame may have gone meanwhile).
    pub async fn frame_command(
        &mut self,
        session: &str,
        method: &str,
        params: Value,
    ) -> Result<Value, Value> {
        self.try_send(Some(session.to_owned()), method, params)
            .await
    }

    /// Reads whatever events arrived by now (without waiting for more).
    async fn drain_events(&mut self) {
        while let Ok(Some(Ok(Message::Text(text)))) =
            tokio::time::timeout(Duration::from_millis(1), self.socket.next()).await
        {
            let event = serde_json::from_str(&text).unwrap();
            self.note(event).await;
        }
    }

    /// Opens `url` and waits until it has loaded.
    pub async fn goto(&mut self, url: &str) {
        let navigated = self.command("Page.navigate", json!({ "url": url })).await;
        assert!(
            navigated.get("errorText").is_none(),
            "{url}: {}",
            navigated["errorText"]
        );
        self.wait_for("document.readyState === 'complete'").await;
    }

    /// The value of `expression` (awaited if it is a promise); an exception fails the test.
    pub async fn eval(&mut self, expression: &str) -> Value {
        self.drain_events().await;
        let result = self
            .command(
                "Runtime.evaluate",
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
            )
            .await;
        assert!(
            result.get("exceptionDetails").is_none(),
            "{expression}: {}",
            result["exceptionDetails"]
        );
        result["result"]["value"].clone()
    }

    /// Waits until `expression` is truthy (up to 15 s); its value.
    pub async fn wait_for(&mut self, expression: &str) -> Value {
        let deadline = Instant::now() + WAIT;
        loop {
            // A page that navigates meanwhile has no context to evaluate in: not yet.
            self.drain_events().await;
            let session = self.session.clone();
            let params =
                json!({ "expression": expression, "returnByValue": true, "awaitPromise": true });
            let value = match self
                .try_send(Some(session), "Runtime.evaluate", params)
                .await
            {
                Ok(result) => {
                    assert!(
                        result.get("exceptionDetails").is_none(),
                        "{expression}: {}",
                        result["exceptionDetails"]
                    );
                    result["result"]["value"].clone()
                }
                Err(error) if navigating(&error) => Value::Null,
                Err(error) => panic!("Runtime.evaluate failed: {error}"),
            };
            let truthy = !matches!(&value, Value::Null | Value::Bool(false))
                && value != json!(0)
                && value != json!("");
            if truthy {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "waited 15 s for {expression}; page log: {:?}",
                self.log
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Clicks the first element `selector` matches with the mouse, as a person would: in the
    /// middle of its first box (a link's first line), scrolled into view first.
    pub async fn click(&mut self, selector: &str) {
        let found = self
            .wait_for(&format!(
                "(() => {{ const e = document.querySelector({selector:?}); if (!e) return null; \
                 e.scrollIntoView({{block: 'center'}}); const r = e.getClientRects()[0]; if (!r) return null; \
                 return r.width > 0 && r.height > 0 ? [r.x + r.width / 2, r.y + r.height / 2] : null; }})()"
            ))
            .await;
        let (x, y) = (found[0].clone(), found[1].clone());
        for kind in ["mousePressed", "mouseReleased"] {
            self.command(
                "Input.dispatchMouseEvent",
                json!({ "type": kind, "x": x, "y": y, "button": "left", "clickCount": 1 }),
            )
            .await;
        }
    }

    /// The text the page shows (`document.body.innerText`).
    pub async fn text(&mut self) -> String {
        let text = self
            .eval("document.body ? document.body.innerText : ''")
            .await;
        text.as_str().unwrap_or_default().to_owned()
    }

    /// Replaces what the first field `selector` matches holds with `text`, typed as a person
    /// would: the field is clicked, its text selected (the select-all command) and `text` typed
    /// over it (or, when empty, the selection deleted with Backspace).
    pub async fn fill(&mut self, selector: &str, text: &str) {
        self.click(selector).await;
        self.command(
            "Input.dispatchKeyEvent",
            json!({ "type": "rawKeyDown", "commands": ["selectAll"] }),
        )
        .await;
        if text.is_empty() {
            for kind in ["rawKeyDown", "keyUp"] {
                self.command(
                    "Input.dispatchKeyEvent",
                    json!({ "type": kind, "key": "Backspace", "code": "Backspace",
                            "windowsVirtualKeyCode": 8 }),
                )
                .await;
            }
        } else {
            self.command("Input.insertText", json!({ "text": text }))
                .await;
        }
    }

    /// Shows times as if the browser were in `zone` (an IANA name: `Asia/Tokyo`).
    pub async fn time_zone(&mut self, zone: &str) {
        self.command(
            "Emulation.setTimezoneOverride",
            json!({ "timezoneId": zone }),
        )
        .await;
    }

    /// Saves a PNG of the whole page as `target/tmp/screenshots/<name>.png` and prints where.
    pub async fn screenshot(&mut self, name: &str) -> PathBuf {
        let shot = self
            .command(
                "Page.captureScreenshot",
                json!({ "format": "png", "captureBeyondViewport": true }),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(shot["data"].as_str().unwrap())
            .unwrap();
        let path = screenshot_dir().join(format!("{name}.png"));
        std::fs::write(&path, png).unwrap();
        eprintln!("screenshot: {}", path.display());
        path
    }

    /// Closes the browser.
    pub async fn close(mut self) {
        let _ = self.child.kill().await;
    }
}

/// Whether a protocol error says the page navigated under the command (its context is gone).
fn navigating(error: &Value) -> bool {
    let message = error["message"].as_str().unwrap_or_default();
    [
        "navigated or closed",
        "context was destroyed",
        "Cannot find context",
    ]
    .iter()
    .any(|m| message.contains(m))
}
