//! The command line the docs describe is the binary's: every command and flag written in
//! README.md and docs/ exists, every variable they name is read, and README's configuration
//! table lists exactly the variables of `serve` and `worker`, with their defaults. The
//! definitions are the binary's own (`Cli::command()`, what `--help` prints).

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;
use oncely_cli::cli::Cli;

/// Variables the docs may name that are not the binary's, and who reads them.
const NOT_THE_BINARYS: &[(&str, &str)] = &[
    (
        "ONCELY_FUZZ_CASES",
        "crates/oncely-cli/tests/it/properties.rs",
    ),
    ("ONCELY_BIN", "scripts/schemathesis"),
    ("ONCELY_PG_BIN", "crates/oncely-chaos/src/failover.rs"),
];

fn workspace(path: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// README.md and every docs/*.md, by name.
fn docs() -> Vec<(String, String)> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut names = vec!["README.md".to_owned()];
    let mut in_docs: Vec<String> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    in_docs.sort();
    names.extend(in_docs);
    names
        .into_iter()
        .map(|n| {
            let text = workspace(&n);
            (n, text)
        })
        .collect()
}

/// Every command of the binary by its path (`["outbox", "retry"]`), the root included.
fn commands() -> BTreeMap<Vec<String>, clap::Command> {
    fn walk(
        path: Vec<String>,
        cmd: &clap::Command,
        out: &mut BTreeMap<Vec<String>, clap::Command>,
    ) {
        for sub in cmd.get_subcommands() {
            let mut p = path.clone();
            p.push(sub.get_name().to_owned());
            walk(p, sub, out);
        }
        out.insert(path, cmd.clone());
    }
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = BTreeMap::new();
    walk(Vec::new(), &cmd, &mut out);
    out
}

/// Environment variable → (the commands that read it, its default as `--help` shows it).
fn variables() -> BTreeMap<String, (BTreeSet<String>, Option<String>)> {
    let mut out: BTreeMap<String, (BTreeSet<String>, Option<String>)> = BTreeMap::new();
    for (path, cmd) in commands() {
        for arg in cmd.get_arguments() {
            let Some(env) = arg.get_env() else { continue };
            let default = arg
                .get_default_values()
                .first()
                .map(|v| v.to_string_lossy().into_owned());
            let entry = out
                .entry(env.to_string_lossy().into_owned())
                .or_insert_with(|| (BTreeSet::new(), default.clone()));
            assert_eq!(entry.1, default, "{env:?} has two defaults in two commands");
            entry.0.insert(path.join(" "));
        }
    }
    out
}

/// Words like `ONCELY_SECRET` (and `DATABASE_URL`) in a text.
fn named_variables(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for (i, _) in text
        .match_indices("ONCELY_")
        .chain(text.match_indices("DATABASE_URL"))
    {
        if i > 0 && text[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue;
        }
        let word: String = text[i..]
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        // `ONCELY_MAIL_CAP_*` names a family: its prefix.
        let family = text[i + word.len()..].starts_with('*');
        found.insert(if family {
            format!("{word}*")
        } else {
            word.trim_end_matches('_').to_owned()
        });
    }
    found
}

#[test]
fn every_variable_the_docs_name_is_read_by_the_binary() {
    let read = variables();
    for (doc, text) in docs() {
        for name in named_variables(&text) {
            if let Some((_, reader)) = NOT_THE_BINARYS.iter().find(|(n, _)| *n == name) {
                assert!(
                    workspace(reader).contains(&name),
                    "{doc} names {name}, said to be read by {reader}, which does not read it"
                );
                continue;
            }
            if let Some(prefix) = name.strip_suffix('*') {
                assert!(
                    read.keys().any(|v| v.starts_with(prefix)),
                    "{doc} names {name}, and no variable the binary reads starts so"
                );
                continue;
            }
            assert!(
                read.contains_key(&name),
                "{doc} names {name}, which no command of the binary reads"
            );
        }
    }
}

/// README's `| \`VARIABLE\` | meaning | default |` rows.
fn readme_table() -> BTreeMap<String, String> {
    let readme = workspace("README.md");
    let start = readme
        .find("## Configuration")
        .expect("README has a Configuration section");
    let mut rows = BTreeMap::new();
    for line in readme[start..].lines().skip(1) {
        if line.starts_with("## ") {
            break;
        }
        if !line.starts_with("| ") {
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let Some(first) = cells.first() else { continue };
        let name = first.trim_start_matches("| ").trim_matches('`');
        if !(name.starts_with("ONCELY_") || name == "DATABASE_URL") {
            continue;
        }
        let default = cells
            .last()
            .unwrap()
            .trim_end_matches(" |")
            .trim()
            .to_owned();
        assert!(
            rows.insert(name.to_owned(), default).is_none(),
            "README's table lists {name} twice"
        );
    }
    rows
}

#[test]
fn readmes_variable_table_is_the_help_of_serve_and_worker_with_its_defaults() {
    let table = readme_table();
    let read = variables();
    let of_serve_and_worker: BTreeSet<&String> = read
        .iter()
        .filter(|(_, (by, _))| by.contains("serve") || by.contains("worker"))
        .map(|(name, _)| name)
        .collect();
    let documented: BTreeSet<&String> = table.keys().collect();
    assert_eq!(
        documented, of_serve_and_worker,
        "README's configuration table and the variables of `oncely serve --help` and `oncely worker --help` differ"
    );
    for (name, documented) in &table {
        let actual = read[name].1.as_deref();
        // A default written as one code span or a bare number is checked word for word; prose
        // ("generated …", "4 × the above") names a default the settings compute.
        let literal = documented
            .strip_prefix('`')
            .and_then(|d| d.strip_suffix('`'))
            .filter(|d| !d.contains('`'))
            .or_else(|| {
                documented
                    .parse::<u64>()
                    .is_ok()
                    .then_some(documented.as_str())
            });
        match (literal, actual) {
            (Some(doc), Some(help)) => assert_eq!(
                doc, help,
                "README says {name} defaults to {doc}; --help says {help}"
            ),
            (Some(doc), None) => {
                panic!("README says {name} defaults to {doc}; --help has no default")
            }
            // A switch: "off" is how a table says `false`.
            (None, Some("false")) => assert_eq!(documented, "off", "README's default of {name}"),
            (None, Some(help)) => assert!(
                documented.contains(help) || documented.contains(&format!("`{help}`")),
                "README's default of {name} ({documented}) does not say --help's {help}"
            ),
            (None, None) => {}
        }
    }
}

/// `oncely …` invocations written in code: backtick spans and fenced blocks, with
/// `cargo run --release -- …` read as `oncely …`.
fn invocations(text: &str) -> Vec<String> {
    let mut code = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            code.push(line.to_owned());
        } else {
            code.extend(line.split('`').skip(1).step_by(2).map(str::to_owned));
        }
    }
    let mut out = Vec::new();
    for piece in code {
        let piece = piece
            .replace("cargo run --release -- ", "oncely ")
            .replace("cargo run -- ", "oncely ");
        for (i, _) in piece.match_indices("oncely ") {
            let before = piece[..i].chars().last();
            if before.is_some_and(|c| !(c == ' ' || c == '/' || c == '$' || c == '(')) {
                continue;
            }
            let rest = &piece[i + "oncely ".len()..];
            let end = rest
                .find(['|', ';', '#', '&', ')'])
                .map_or(rest.len(), |e| {
                    // `list|show|retry`: alternatives of one word, not a pipe.
                    if rest[e..].starts_with('|') && !rest[e..].starts_with("| ") {
                        rest[e..]
                            .find([' ', ';', '#', '&', ')'])
                            .map_or(rest.len(), |f| e + f)
                    } else {
                        e
                    }
                });
            out.push(rest[..end].trim().to_owned());
        }
    }
    out
}

#[test]
fn every_command_and_flag_the_docs_write_exists() {
    let commands = commands();
    let mut checked = 0;
    for (doc, text) in docs() {
        for invocation in invocations(&text) {
            let mut words = invocation.split_whitespace().peekable();
            let mut path: Vec<String> = Vec::new();
            // The subcommands: lower-case words naming one; `a|b` names alternatives.
            while let Some(word) = words.peek() {
                let alternatives: Vec<&str> = word.split('|').collect();
                let known = |w: &&str| {
                    let mut p = path.clone();
                    p.push((*w).to_owned());
                    commands.contains_key(&p)
                };
                if alternatives.iter().all(known) {
                    if alternatives.len() > 1 {
                        words.next();
                        path.clear();
                        break;
                    }
                    path.push(alternatives[0].to_owned());
                    words.next();
                } else {
                    break;
                }
            }
            if path.is_empty() {
                // Prose in code (`oncely inbox [--provider-mode]` is fine; `oncely -p …` is
                // cargo's): only a first word that looks like a command must be one.
                if let Some(first) = invocation.split_whitespace().next() {
                    let word = first.split('|').next().unwrap();
                    if word.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                        && !word.starts_with('-')
                        && !word.is_empty()
                        && !invocation.contains('|')
                    {
                        panic!("{doc}: `oncely {invocation}`: no command `{word}`");
                    }
                }
                continue;
            }
            let cmd = &commands[&path];
            for word in words {
                let word = word
                    .trim_start_matches('[')
                    .trim_end_matches([']', ',', '.']);
                let Some(flag) = word.strip_prefix("--") else {
                    continue;
                };
                let flag = flag.split('=').next().unwrap();
                if flag.is_empty() || flag == "help" || flag == "version" {
                    continue;
                }
                assert!(
                    cmd.get_arguments().any(|a| a.get_long() == Some(flag)),
                    "{doc}: `oncely {invocation}`: `oncely {}` has no --{flag}",
                    path.join(" ")
                );
            }
            checked += 1;
        }
    }
    assert!(
        checked > 20,
        "only {checked} invocations found: is the parser broken?"
    );
}

#[test]
fn the_invocation_parser_reads_what_the_docs_write() {
    let text = "Run `oncely serve --workers 0` and\n```sh\n$ target/release/oncely outbox retry --kind x | head\nDATABASE_URL=x cargo run --release -- migrate\n```\n`oncely outbox list|show|retry` or `oncely-inbox`.";
    assert_eq!(
        invocations(text),
        [
            "serve --workers 0",
            "outbox retry --kind x",
            "migrate",
            "outbox list|show|retry"
        ]
    );
    assert_eq!(
        named_variables("set `ONCELY_SECRET` and DATABASE_URL, not XONCELY_Y; ONCELY_MAIL_CAP_*"),
        BTreeSet::from([
            "ONCELY_SECRET".to_owned(),
            "DATABASE_URL".to_owned(),
            "ONCELY_MAIL_CAP_*".to_owned()
        ])
    );
}

/// Where the docs list the job statuses (`--status a|b|…`, "`status` (`a`, `b`, …)"), they list
/// exactly the outbox's.
#[test]
fn the_docs_list_every_job_status_and_no_other() {
    let statuses: BTreeSet<String> = oncely_outbox::JobStatus::ALL
        .iter()
        .map(|s| s.as_str().to_owned())
        .collect();
    let mut lists = 0;
    for (doc, text) in docs() {
        for (i, _) in text.match_indices("--status ") {
            let list: String = text[i + "--status ".len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || *c == '|')
                .collect();
            if !list.contains('|') {
                continue; // one status: an example, not a list
            }
            let listed: BTreeSet<String> = list.split('|').map(str::to_owned).collect();
            assert_eq!(listed, statuses, "{doc}: `--status {list}`");
            lists += 1;
        }
        for (i, _) in text.match_indices("`status` (") {
            let inside = &text[i + "`status` (".len()..];
            let inside = &inside[..inside.find(')').unwrap()];
            let listed: BTreeSet<String> = inside
                .split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_owned)
                .collect();
            assert_eq!(listed, statuses, "{doc}: `status` ({inside})");
            lists += 1;
        }
    }
    assert!(lists >= 2, "the docs list the statuses somewhere");
}
