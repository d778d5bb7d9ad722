//! The verification snippets of docs/webhooks.md work: each is taken from the page as written and
//! run (Python with the reference `standardwebhooks` package, JavaScript with Node.js) on
//! deliveries signed as the worker signs them — accepted as sent, during a rotation (two
//! signatures), and refused when the body is changed, the timestamp is stale, or the secret is
//! another. A missing interpreter or package skips that language visibly.

use std::process::Stdio;

use oncely_server::secret::signing::{SigningSecret, signature_header};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

/// The code blocks of `lang` in docs/webhooks.md.
fn snippets(lang: &str) -> Vec<String> {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/webhooks.md");
    let page = std::fs::read_to_string(page).expect("docs/webhooks.md");
    let fence = format!("```{lang}\n");
    page.split(fence.as_str())
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_owned())
        .collect()
}

/// One delivery as the worker makes it: `(headers, body)`, signed by `secrets` at `timestamp`.
fn delivery(secrets: &[SigningSecret], timestamp: i64, body: &str) -> (Value, String) {
    let id = "msg_0f1e2d3c4b5a69788796a5b4c3d2e1f0";
    let headers = json!({
        "webhook-id": id,
        "webhook-timestamp": timestamp.to_string(),
        "webhook-signature": signature_header(secrets, id, timestamp, body.as_bytes()),
    });
    (headers, body.to_owned())
}

/// Cases and the verdict the snippet must give: `(name, secret it checks with, headers, body,
/// accepted)`.
fn cases() -> Vec<(&'static str, String, Value, String, bool)> {
    let (current, previous, other) = (
        SigningSecret::generate(),
        SigningSecret::generate(),
        SigningSecret::generate(),
    );
    let now = time::OffsetDateTime::now_utc().unix_timestamp();
    let body = r#"{"type":"user.verified","timestamp":"2026-12-02T09:14:03.512Z","data":{"user_id":"0b6d","email":"a***@example.com"}}"#;
    let (headers, sent) = delivery(std::slice::from_ref(&current), now, body);
    let (rotated, _) = delivery(&[current.clone(), previous.clone()], now, body);
    let (stale, _) = delivery(std::slice::from_ref(&current), now - 6 * 60, body);
    let c = current.expose().to_owned();
    vec![
        ("as sent", c.clone(), headers.clone(), sent.clone(), true),
        (
            "rotation: new",
            c.clone(),
            rotated.clone(),
            sent.clone(),
            true,
        ),
        (
            "rotation: previous",
            previous.expose().to_owned(),
            rotated,
            sent.clone(),
            true,
        ),
        (
            "body changed",
            c.clone(),
            headers.clone(),
            sent.replace("0b6d", "0b6e"),
            false,
        ),
        ("stale", c, stale, sent.clone(), false),
        (
            "another secret",
            other.expose().to_owned(),
            headers,
            sent,
            false,
        ),
    ]
}

/// Runs `program args` with `stdin`; `None` when it cannot start (not installed).
async fn run(program: &str, args: &[&str], stdin: &str) -> Option<std::process::Output> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .ok()?;
    let mut input = child.stdin.take().expect("piped");
    input.write_all(stdin.as_bytes()).await.unwrap();
    drop(input);
    Some(child.wait_with_output().await.unwrap())
}

/// The verdicts a snippet gave, one line per case (`ok` or `refused`), given a driver that
/// reads the cases as JSON lines `{secret, headers, body}` on stdin.
async fn verdicts(program: &str, script: String) -> Option<Vec<String>> {
    let input: String = cases()
        .into_iter()
        .map(|(_, secret, headers, body, _)| {
            json!({ "secret": secret, "headers": headers, "body": body }).to_string() + "\n"
        })
        .collect();
    let flag = if program == "node" { "-e" } else { "-c" };
    let output = run(program, &[flag, &script], &input).await?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    if output.status.code() == Some(3) {
        println!("SKIPPED: the {program} snippet of docs/webhooks.md: {stderr}");
        return None;
    }
    assert!(output.status.success(), "{program} failed: {stderr}");
    Some(
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect(),
    )
}

fn expected() -> Vec<(&'static str, String)> {
    cases()
        .into_iter()
        .map(|(name, .., accepted)| (name, if accepted { "ok" } else { "refused" }.to_owned()))
        .collect()
}

fn check(language: &str, verdicts: Vec<String>) {
    let expected = expected();
    assert_eq!(verdicts.len(), expected.len(), "{language}: {verdicts:?}");
    for ((name, want), got) in expected.iter().zip(&verdicts) {
        assert_eq!(got, want, "{language} snippet, case {name:?}");
    }
}

#[tokio::test]
async fn the_python_snippet_verifies_what_the_worker_signs_and_refuses_the_rest() {
    let [snippet] = snippets("python").try_into().expect("one Python snippet");
    let script = format!(
        r#"
import json, sys
try:
    import standardwebhooks
except ImportError:
    print("the standardwebhooks package is not installed (pip install standardwebhooks)", file=sys.stderr)
    sys.exit(3)
{snippet}
for line in sys.stdin:
    case = json.loads(line)
    SECRET = case["secret"]
    try:
        event = handle(case["body"].encode(), case["headers"])
        assert event["type"] == "user.verified"
        print("ok")
    except standardwebhooks.WebhookVerificationError:
        print("refused")
"#
    );
    match verdicts("python3", script).await {
        Some(verdicts) => check("Python", verdicts),
        None => println!("SKIPPED: python3 is not available for the docs/webhooks.md snippet"),
    }
}

#[tokio::test]
async fn the_javascript_snippet_verifies_what_the_worker_signs_and_refuses_the_rest() {
    let [snippet] = snippets("js").try_into().expect("one JavaScript snippet");
    let script = format!(
        r#"
{snippet}
const lines = require("node:fs").readFileSync(0, "utf8").split("\n").filter(Boolean);
for (const line of lines) {{
  const c = JSON.parse(line);
  try {{
    const event = verify(c.secret, c.headers, c.body);
    if (event.type !== "user.verified") throw new Error("wrong event");
    console.log("ok");
  }} catch (e) {{
    console.log("refused");
  }}
}}
"#
    );
    match verdicts("node", script).await {
        Some(verdicts) => check("JavaScript", verdicts),
        None => println!("SKIPPED: node is not available for the docs/webhooks.md snippet"),
    }
}
