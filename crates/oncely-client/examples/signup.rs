//! Signs up once, however many times the network fails: `cargo run -p oncely-client --example
//! signup -- http://127.0.0.1:8080 ada@example.com` against `oncely serve`.

use oncely_client::{Client, Operation};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let base = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let email = args.next().unwrap_or_else(|| "ada@example.com".into());
    let client = Client::new(base.parse()?);
    // One operation = one key. Send it as often as you like: the account and the email happen once.
    let signup = Operation::post("/v1/signup").json(&json!({ "email": email }))?;
    for _ in 0..3 {
        let answer = client.send(&signup).await?;
        println!(
            "{} after {} attempt(s), replayed: {}: {}",
            answer.status,
            answer.attempts,
            answer.replayed,
            String::from_utf8_lossy(&answer.body)
        );
    }
    Ok(())
}
