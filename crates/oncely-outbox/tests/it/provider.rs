//! Small fake providers for classification and worker tests: an HTTP API and an SMTP server
//! whose answers a test scripts, counting the requests they get.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

/// What the fake HTTP API answers its `n`-th request (from 0): the status line's code and
/// reason, extra header lines, and the body.
pub type Script = dyn Fn(usize) -> (u16, Vec<String>, String) + Send + Sync;

/// A fake HTTP API on 127.0.0.1: one request per connection, answered by a script.
pub struct FakeApi {
    /// `http://127.0.0.1:port/emails`.
    pub url: String,
    requests: Arc<AtomicUsize>,
}

impl FakeApi {
    /// Starts the API; `script` answers each request.
    pub async fn start(
        script: impl Fn(usize) -> (u16, Vec<String>, String) + Send + Sync + 'static,
    ) -> Self {
        let script: Arc<Script> = Arc::new(script);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let seen = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let (seen, script) = (seen.clone(), script.clone());
                tokio::spawn(async move {
                    if !read_request(&mut stream).await {
                        return;
                    }
                    let n = seen.fetch_add(1, Ordering::SeqCst);
                    let (status, headers, body) = script(n);
                    let mut answer = format!(
                        "HTTP/1.1 {status} Whatever\r\nContent-Type: application/json\r\n\
                         Content-Length: {}\r\nConnection: close\r\n",
                        body.len()
                    );
                    for header in headers {
                        answer.push_str(&header);
                        answer.push_str("\r\n");
                    }
                    answer.push_str("\r\n");
                    answer.push_str(&body);
                    let _ = stream.write_all(answer.as_bytes()).await;
                });
            }
        });
        Self {
            url: format!("http://{addr}/emails"),
            requests,
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// Reads one request's head and its `Content-Length` body; `false` if the peer went away.
async fn read_request(stream: &mut tokio::net::TcpStream) -> bool {
    let mut buf = Vec::new();
    let mut chunk = [0; 8192];
    loop {
        let Ok(n) = stream.read(&mut chunk).await else {
            return false;
        };
        if n == 0 {
            return false;
        }
        buf.extend_from_slice(&chunk[..n]);
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0);
        if buf.len() >= end + 4 + length {
            return true;
        }
    }
}

/// A JSON success with a provider id.
pub fn accepted(n: usize) -> (u16, Vec<String>, String) {
    (200, vec![], format!(r#"{{"id":"msg-{n}"}}"#))
}

/// A fake SMTP server on 127.0.0.1 that answers `reply` to every command starting with
/// `verb` (`MAIL`, `AUTH`, `RCPT`, …) and accepts everything else; it offers `AUTH PLAIN`.
pub async fn smtp_answering(verb: &'static str, reply: &'static str) -> String {
    smtp_answering_first(verb, reply, usize::MAX).await
}

/// [`smtp_answering`], but only the first `times` such commands get `reply`; later ones are
/// accepted.
pub async fn smtp_answering_first(verb: &'static str, reply: &'static str, times: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let replied = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let replied = replied.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut lines = BufReader::new(read).lines();
                let _ = write.write_all(b"220 fake ESMTP\r\n").await;
                let mut in_data = false;
                while let Ok(Some(line)) = lines.next_line().await {
                    if in_data {
                        if line == "." {
                            in_data = false;
                            let _ = write.write_all(b"250 2.0.0 queued as fake-1\r\n").await;
                        }
                        continue;
                    }
                    let upper = line.to_ascii_uppercase();
                    let answer: String = if upper.starts_with(verb)
                        && replied.fetch_add(1, Ordering::SeqCst) < times
                    {
                        format!("{reply}\r\n")
                    } else if upper.starts_with("EHLO") {
                        "250-fake\r\n250 AUTH PLAIN LOGIN\r\n".into()
                    } else if upper.starts_with("AUTH") {
                        "235 2.7.0 ok\r\n".into()
                    } else if upper.starts_with("DATA") {
                        in_data = true;
                        "354 go on\r\n".into()
                    } else if upper.starts_with("QUIT") {
                        let _ = write.write_all(b"221 bye\r\n").await;
                        return;
                    } else {
                        "250 ok\r\n".into()
                    };
                    if write.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                    if answer.starts_with("421") {
                        return; // 421 closes the channel
                    }
                }
            });
        }
    });
    format!("127.0.0.1:{}", addr.port())
}
