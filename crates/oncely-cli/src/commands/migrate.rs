//! `oncely migrate`: applies the migrations and reports what it applied.

use std::fmt::Write;

use oncely_server::accounts::Accounts;
use oncely_server::backend::Backend;
use oncely_server::backend::COMMAND_POOL;
use oncely_server::startup;
use serde_json::Value;
use serde_json::json;

use crate::output::OutputArgs;
use crate::output::render;

/// Settings of `oncely migrate`: an operator command's (the database, how it prints).
pub type MigrateArgs = super::OperatorArgs;

/// What `oncely migrate` prints: per library what it applied (`outbox 1 applied, schema at
/// 0007`), or with `--json` `{"database": "postgres", "applied": n, "libraries":
/// [{"library": "outbox", "applied": 1, "schema": "0007", "unknown": 0}, …]}` (`unknown`:
/// migrations a newer release applied that this binary does not know).
pub fn migrated<B: Backend>(
    migrated: &oncely_sql::schema::Migrated,
    output: OutputArgs,
) -> anyhow::Result<String> {
    let libraries: Vec<Value> = migrated
        .libraries()
        .map(|(applied, after)| {
            json!({
                "library": after.library,
                "applied": applied,
                "schema": oncely_sql::schema::version_name(after.at),
                "unknown": after.unknown,
            })
        })
        .collect();
    let value = json!({
        "database": B::NAME,
        "applied": migrated.applied(),
        "libraries": libraries,
    });
    render(output, &value, |out| {
        write!(out, "{migrated}")?;
        Ok(())
    })
}

/// Runs `oncely migrate` on backend `B`: what it prints.
pub async fn run<B: Accounts>(args: MigrateArgs) -> anyhow::Result<()> {
    let backend = B::connect(&args.database.location(), COMMAND_POOL).await?;
    let applied = startup::migrate(&backend).await?;
    print!("{}", migrated::<B>(&applied, args.output)?);
    Ok(())
}
