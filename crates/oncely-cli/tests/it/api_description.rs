//! `/openapi.json` describes every route, and `docs/api.md` and the code agree with it.

use std::collections::BTreeSet;

use oncely_server::routes::problem;
use serde_json::Value;

use crate::support::spawn_app_on;

fn workspace(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap()
}

async fn spec() -> (Value, crate::support::TestApp, oncely_testdb::TestSqlite) {
    let db = oncely_testdb::TestSqlite::new();
    let app = spawn_app_on(db.url(), |_| {}).await;
    let spec = app.get("/openapi.json").await.json().await.unwrap();
    (spec, app, db)
}

#[tokio::test]
async fn the_description_is_openapi_3_and_every_post_requires_an_idempotency_key() {
    let (spec, app, _db) = spec().await;
    assert!(spec["openapi"].as_str().unwrap().starts_with("3."));
    let schemas = spec["components"]["schemas"].as_object().unwrap();
    for (path, item) in spec["paths"].as_object().unwrap() {
        for (method, operation) in item.as_object().unwrap() {
            let responses = operation["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path} has no responses");
            if method == "post" {
                let key = operation["parameters"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|p| p["name"] == "Idempotency-Key");
                // But login's: with one a retry replays the identity, without one each runs.
                let required = path != "/v1/login";
                assert_eq!(
                    key.map(|k| (&k["in"], &k["required"])),
                    Some((&"header".into(), &required.into())),
                    "{path}"
                );
                assert!(
                    responses.contains_key("422") && responses.contains_key("409"),
                    "{path}"
                );
            }
        }
    }
    // Every reference points at a schema that exists.
    let text = spec.to_string();
    for reference in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = &reference[..reference.find('"').unwrap()];
        assert!(schemas.contains_key(name), "dangling reference to {name}");
    }
    // A real answer has what its schema requires.
    let answers = [
        ("Accepted", "api", "api@example.com"),
        ("Problem", "api-2", "nope"),
    ];
    for (schema, key, email) in answers {
        let body = serde_json::json!({ "email": email });
        let answer: Value = app
            .post("/v1/signup", key, &body)
            .await
            .json()
            .await
            .unwrap();
        for field in schemas[schema]["required"].as_array().unwrap() {
            assert!(
                answer.get(field.as_str().unwrap()).is_some(),
                "the {schema} answer lacks {field}"
            );
        }
    }
}

/// `### \`POST /v1/…\`` headings of docs/api.md.
fn documented_routes(api_md: &str) -> BTreeSet<(String, String)> {
    api_md
        .lines()
        .filter(|l| l.starts_with("### `"))
        .flat_map(|l| {
            l.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter_map(|route| {
            let (method, path) = route.split_once(' ')?;
            Some((method.to_lowercase(), path.split('?').next()?.to_owned()))
        })
        .collect()
}

#[tokio::test]
async fn docs_api_md_documents_every_route_of_the_description_and_no_other() {
    let (spec, _app, _db) = spec().await;
    let described: BTreeSet<(String, String)> = spec["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.clone(), path.clone()))
        })
        // The pages a link opens are documented with their flows, not as routes of their own.
        .filter(|(method, path)| {
            method == "post" || !path.starts_with("/v1/") || path == "/v1/verify"
        })
        .filter(|(_, path)| path != "/metrics")
        .collect();
    let documented = documented_routes(&workspace("docs/api.md"));
    assert_eq!(
        described, documented,
        "docs/api.md and /openapi.json disagree"
    );
}

fn listed() -> BTreeSet<(String, u16)> {
    problem::all()
        .map(|p| (p.slug.to_owned(), p.status.as_u16()))
        .collect()
}

#[test]
fn problem_types_are_the_same_in_the_code_and_the_docs() {
    // docs/api.md's table: | `slug` | status |
    let api_md = workspace("docs/api.md");
    let table = &api_md[api_md.find("## Problem types").unwrap()..];
    let documented: BTreeSet<(String, u16)> = table
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let slug = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((slug.to_owned(), cells.get(2)?.parse().ok()?))
        })
        .collect();
    assert_eq!(
        listed(),
        documented,
        "docs/api.md's problem table and routes::problem::all() disagree"
    );
    // The server builds every problem from routes::problem (whose own test checks that each of
    // its types is answered): no slug is spelled out anywhere else in its code.
    assert_eq!(
        slugs_given_to_problem_new("crates/oncely-server/src"),
        BTreeSet::new(),
        "a server problem built outside routes::problem"
    );
    // The layer builds its problems from `oncely::problem::ProblemType` alone, too.
    assert_eq!(
        slugs_given_to_problem_new("crates/oncely/src"),
        BTreeSet::new(),
        "a layer problem built outside oncely::problem::ProblemType"
    );
}

#[tokio::test]
async fn the_description_lists_every_problem_type() {
    let (spec, _app, _db) = spec().await;
    let type_uri = &spec["components"]["schemas"]["Problem"]["properties"]["type"];
    let described: BTreeSet<String> = type_uri["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|uri| uri.as_str().unwrap().to_owned())
        .collect();
    let listed: BTreeSet<String> = listed()
        .into_iter()
        .map(|(slug, _)| format!("https://oncely.dev/problems/{slug}"))
        .collect();
    assert_eq!(described, listed);
    let description = type_uri["description"].as_str().unwrap();
    for (slug, status) in self::listed() {
        assert!(
            description.contains(&format!("`{slug}` ({status})")),
            "{slug} is not described"
        );
    }
}

/// The slugs written as a string literal in the second argument of `Problem::new(…)` in the
/// Rust files under `dir`.
fn slugs_given_to_problem_new(dir: &str) -> BTreeSet<String> {
    let mut slugs = BTreeSet::new();
    for file in rust_files(dir) {
        let text = workspace(&file);
        for call in text.split("Problem::new(").skip(1) {
            let slug = call_arguments(call).get(1).and_then(|argument| {
                let literal = argument.strip_prefix('"')?;
                Some(literal[..literal.find('"')?].to_owned())
            });
            slugs.extend(slug);
        }
    }
    slugs
}

/// The trimmed top-level arguments of a call, given the text after its opening parenthesis.
fn call_arguments(after_parenthesis: &str) -> Vec<&str> {
    let (mut depth, mut in_string, mut start) = (0, false, 0);
    let mut arguments = Vec::new();
    let mut chars = after_parenthesis.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' if in_string => {
                chars.next();
            }
            '"' => in_string = !in_string,
            _ if in_string => {}
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' if depth > 0 => depth -= 1,
            ',' | ')' if depth == 0 => {
                arguments.push(after_parenthesis[start..i].trim());
                start = i + 1;
                if c == ')' {
                    break;
                }
            }
            _ => {}
        }
    }
    arguments
}

fn rust_files(dir: &str) -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut out = Vec::new();
    let mut stack = vec![root.join(dir)];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(path).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(
                    path.strip_prefix(&root)
                        .unwrap()
                        .to_string_lossy()
                        .into_owned(),
                );
            }
        }
    }
    out
}

/// Regression (schemathesis): the key header's schema once allowed an empty key, so schema-valid
/// requests were refused. Every value the schema allows must be a key the server takes.
#[tokio::test]
async fn the_key_header_schema_allows_only_keys_the_server_accepts() {
    let (spec, _app, _db) = spec().await;
    let parameter = spec["paths"]["/v1/signup"]["post"]["parameters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "Idempotency-Key")
        .unwrap()
        .clone();
    let schema = &parameter["schema"];
    assert_eq!(schema["minLength"], 1);
    assert_eq!(schema["maxLength"], 255);
    assert_eq!(
        schema["pattern"],
        format!("^{}+$", oncely::key::BARE_KEY_CLASS)
    );
    // The pattern's class excludes exactly the characters a bare key may not have.
    for refused in ["\"", "\\", ",", " ", "\u{7f}", "é"] {
        assert!(
            oncely::IdempotencyKey::parse(format!("a{refused}b")).is_err(),
            "{refused:?}"
        );
    }
}

/// Regression (schemathesis): an undeclared method was answered by the tenant check (401) or
/// the key check (400) instead of 405.
#[tokio::test]
async fn undeclared_methods_are_405_before_any_other_check() {
    let (_spec, app, _db) = spec().await;
    for method in ["PUT", "DELETE", "PATCH", "TRACE"] {
        let response = app
            .client
            .request(method.parse().unwrap(), format!("{}/v1/signup", app.base))
            .bearer_auth("not-a-key")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 405, "{method}");
        // Issue 15, item 6: problem+json like every other error (it was an empty body), and
        // `Allow` says what the path takes.
        assert_eq!(response.headers()["allow"], "POST", "{method}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json"
        );
        let problem: serde_json::Value = response.json().await.unwrap();
        assert_eq!(
            problem["type"],
            "https://oncely.dev/problems/method-not-allowed"
        );
    }
    let missing = app
        .client
        .get(format!("{}/v1/no-such-path", app.base))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(
        missing.headers()["content-type"],
        "application/problem+json"
    );
    let problem: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(problem["type"], "https://oncely.dev/problems/not-found");
}
