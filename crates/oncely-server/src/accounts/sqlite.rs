//! Account SQL for SQLite (times: Unix milliseconds from this process's clock).

use std::borrow::Cow;

use oncely::store::sqlite::SqliteKeyStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use oncely_outbox::{Enqueued, NewJob, OutboxError};
use sqlx::migrate::{Migration, MigrationType, Migrator};
use sqlx::{Row, SqlSafeStr, SqliteConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Accounts, NewToken, SignupRow, TokenForSend};
use crate::email::EmailAddress;

/// The service's migrations on SQLite.
pub fn migrator() -> Migrator {
    let mut migrator = Migrator::with_migrations(vec![Migration::new(
        1,
        Cow::Borrowed("accounts"),
        MigrationType::Simple,
        include_str!("../../migrations/sqlite/0001_accounts.sql").into_sql_str(),
        false,
    )]);
    migrator.dangerous_set_table_name("_oncely_server_migrations");
    migrator
}

fn ms(t: OffsetDateTime) -> i64 {
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).unwrap_or(i64::MAX)
}

fn now() -> i64 {
    ms(OffsetDateTime::now_utc())
}

impl Accounts for SqliteKeyStore {
    type Jobs = SqliteJobStore;

    fn jobs(&self, _poll_only: bool) -> SqliteJobStore {
        SqliteJobStore::new(self.pool().clone())
    }

    async fn migrate_accounts(&self) -> anyhow::Result<()> {
        migrator().run(self.pool()).await?;
        Ok(())
    }

    async fn signup_user(
        conn: &mut SqliteConnection,
        tenant: &str,
        email: &EmailAddress,
        password_hash: Option<&str>,
        source: Option<&str>,
    ) -> anyhow::Result<SignupRow> {
        let inserted: Option<Uuid> = sqlx::query_scalar(
            "INSERT INTO oncely_users (id, tenant, email, password_hash, source, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (tenant, email) DO NOTHING RETURNING id",
        )
        .bind(Uuid::new_v4())
        .bind(tenant)
        .bind(email.as_str())
        .bind(password_hash)
        .bind(source)
        .bind(now())
        .fetch_optional(&mut *conn)
        .await?;
        if let Some(id) = inserted {
            return Ok(SignupRow::Created(id));
        }
        let row =
            sqlx::query("SELECT id, status FROM oncely_users WHERE tenant = ?1 AND email = ?2")
                .bind(tenant)
                .bind(email.as_str())
                .fetch_one(conn)
                .await?;
        let id = row.try_get("id")?;
        Ok(if row.try_get::<&str, _>("status")? == "verified" {
            SignupRow::Verified(id)
        } else {
            SignupRow::Pending(id)
        })
    }

    async fn insert_token(conn: &mut SqliteConnection, token: &NewToken<'_>) -> anyhow::Result<()> {
        let now = now();
        sqlx::query(
            "UPDATE oncely_tokens SET superseded_at = ?3
              WHERE user_id = ?1 AND flow = ?2 AND consumed_at IS NULL AND superseded_at IS NULL",
        )
        .bind(token.user_id)
        .bind(token.flow)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO oncely_tokens (id, tenant, user_id, flow, token_hash, expires_at, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        )
        .bind(token.id)
        .bind(token.tenant)
        .bind(token.user_id)
        .bind(token.flow)
        .bind(token.hash)
        .bind(ms(token.expires_at))
        .bind(now)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn consume_token(
        conn: &mut SqliteConnection,
        tenant: &str,
        flow: &str,
        hash: &[u8],
    ) -> anyhow::Result<Option<Uuid>> {
        Ok(sqlx::query_scalar(
            "UPDATE oncely_tokens SET consumed_at = ?4
              WHERE token_hash = ?1 AND tenant = ?2 AND flow = ?3
                AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > ?4
             RETURNING user_id",
        )
        .bind(hash)
        .bind(tenant)
        .bind(flow)
        .bind(now())
        .fetch_optional(conn)
        .await?)
    }

    async fn mark_verified(conn: &mut SqliteConnection, user_id: Uuid) -> anyhow::Result<()> {
        sqlx::query("UPDATE oncely_users SET status = 'verified', verified_at = ?2 WHERE id = ?1 AND status = 'pending'")
            .bind(user_id)
            .bind(now())
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn enqueue(conn: &mut SqliteConnection, job: &NewJob) -> Result<Enqueued, OutboxError> {
        oncely_outbox::store::sqlite::enqueue(conn, job).await
    }

    async fn token_for_send(&self, token_id: Uuid) -> anyhow::Result<Option<TokenForSend>> {
        let row = sqlx::query(
            "SELECT u.email, (t.consumed_at IS NULL AND t.superseded_at IS NULL AND t.expires_at > ?2) AS live
               FROM oncely_tokens t JOIN oncely_users u ON u.id = t.user_id WHERE t.id = ?1",
        )
        .bind(token_id)
        .bind(now())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(TokenForSend {
                email: r.try_get("email")?,
                live: r.try_get("live")?,
            })
        })
        .transpose()
    }

    async fn user_email(&self, user_id: Uuid) -> anyhow::Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT email FROM oncely_users WHERE id = ?1")
                .bind(user_id)
                .fetch_optional(self.pool())
                .await?,
        )
    }

    fn notify_workers(jobs: &SqliteJobStore) {
        jobs.notify();
    }
}
