//! Account SQL for SQLite (times: Unix milliseconds from this process's clock).

use oncely::store::sqlite::SqliteKeyStore;
use oncely_outbox::store::sqlite::SqliteJobStore;
use sqlx::migrate::Migrator;
use sqlx::{Row, SqliteConnection};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{Accounts, ConsumedToken, NewToken, SignupRow, TokenForSend, UserRow};
use crate::email::EmailAddress;

/// The service's migrations on SQLite.
pub fn migrator() -> Migrator {
    super::migrator_of(&[
        (
            1,
            "accounts",
            include_str!("../../migrations/sqlite/0001_accounts.sql"),
        ),
        (
            2,
            "tenants, invites, rate limits",
            include_str!("../../migrations/sqlite/0002_tenants_invites_limits.sql"),
        ),
        (
            3,
            "prune indexes",
            include_str!("../../migrations/sqlite/0003_prune_indexes.sql"),
        ),
        (
            4,
            "signup password on its verification token",
            include_str!("../../migrations/sqlite/0004_signup_password_on_token.sql"),
        ),
        (
            5,
            "signup password attempts",
            include_str!("../../migrations/sqlite/0005_signup_password_attempts.sql"),
        ),
    ])
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
        source: Option<&str>,
    ) -> anyhow::Result<SignupRow> {
        let new_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO oncely_users (id, tenant, email, source, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, email) DO NOTHING",
        )
        .bind(new_id)
        .bind(tenant)
        .bind(email.as_str())
        .bind(source)
        .bind(now())
        .execute(&mut *conn)
        .await?;
        let user = Self::find_user(conn, tenant, email)
            .await?
            .ok_or_else(|| anyhow::anyhow!("user vanished"))?;
        Ok(match user {
            UserRow { id, .. } if id == new_id => SignupRow::Created(id),
            UserRow { id, verified: true } => SignupRow::Verified(id),
            UserRow {
                id,
                verified: false,
            } => SignupRow::Pending(id),
        })
    }

    async fn find_user(
        conn: &mut SqliteConnection,
        tenant: &str,
        email: &EmailAddress,
    ) -> anyhow::Result<Option<UserRow>> {
        let row = sqlx::query("SELECT id, status = 'verified' AS verified FROM oncely_users WHERE tenant = ?1 AND email = ?2")
            .bind(tenant)
            .bind(email.as_str())
            .fetch_optional(conn)
            .await?;
        row.map(|r| {
            Ok(UserRow {
                id: r.try_get("id")?,
                verified: r.try_get("verified")?,
            })
        })
        .transpose()
    }

    async fn count_email(
        conn: &mut SqliteConnection,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> anyhow::Result<i64> {
        Ok(sqlx::query_scalar(
            "INSERT INTO oncely_rate_limits (tenant, bucket, window_start, count) VALUES (?1, ?2, ?3, 1)
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = count + 1
             RETURNING count",
        )
        .bind(tenant)
        .bind(bucket)
        .bind(window_start)
        .fetch_one(conn)
        .await?)
    }

    async fn insert_token(conn: &mut SqliteConnection, token: &NewToken<'_>) -> anyhow::Result<()> {
        let now = now();
        sqlx::query(
            "UPDATE oncely_tokens SET superseded_at = ?4
              WHERE user_id = ?1 AND flow = ?2 AND ?3 AND consumed_at IS NULL AND superseded_at IS NULL
                AND password_hash IS NULL",
        )
        .bind(token.user_id)
        .bind(token.flow)
        .bind(token.supersede)
        .bind(now)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO oncely_tokens (id, tenant, user_id, email, flow, token_hash, expires_at, created_at, password_hash)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .bind(token.id)
        .bind(token.tenant)
        .bind(token.user_id)
        .bind(token.email)
        .bind(token.flow)
        .bind(token.hash)
        .bind(ms(token.expires_at))
        .bind(now)
        .bind(token.password_hash)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn consume_token(
        conn: &mut SqliteConnection,
        tenant: Option<&str>,
        flow: &str,
        hash: &[u8],
    ) -> anyhow::Result<Option<ConsumedToken>> {
        let row = sqlx::query(
            "UPDATE oncely_tokens SET consumed_at = ?4
              WHERE token_hash = ?1 AND (?2 IS NULL OR tenant = ?2) AND flow = ?3
                AND (user_id IS NOT NULL OR email IS NOT NULL)
                AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > ?4
             RETURNING tenant, user_id, email, password_hash",
        )
        .bind(hash)
        .bind(tenant)
        .bind(flow)
        .bind(now())
        .fetch_optional(conn)
        .await?;
        row.map(|r| {
            Ok(ConsumedToken {
                tenant: r.try_get("tenant")?,
                user_id: r.try_get("user_id")?,
                email: r.try_get("email")?,
                password_hash: r.try_get("password_hash")?,
            })
        })
        .transpose()
    }

    async fn signup_password_attempt(
        &self,
        tenant: Option<&str>,
        hash: &[u8],
    ) -> anyhow::Result<Option<(Option<String>, i64)>> {
        // Its own statement on the pool: the count survives the request's rollback.
        let row: Option<(Option<String>, i64)> = sqlx::query_as(
            "UPDATE oncely_tokens SET password_attempts = password_attempts + 1
              WHERE token_hash = ?1 AND (?2 IS NULL OR tenant = ?2) AND flow = 'verification'
                AND user_id IS NOT NULL
                AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > ?3
             RETURNING password_hash, password_attempts",
        )
        .bind(hash)
        .bind(tenant)
        .bind(now())
        .fetch_optional(self.pool())
        .await?;
        Ok(row)
    }

    async fn mark_verified(
        conn: &mut SqliteConnection,
        user_id: Uuid,
        password_hash: Option<&str>,
    ) -> anyhow::Result<()> {
        let updated = sqlx::query(
            "UPDATE oncely_users SET status = 'verified', verified_at = ?2,
                    password_hash = ?3
              WHERE id = ?1 AND status = 'pending'",
        )
        .bind(user_id)
        .bind(now())
        .bind(password_hash)
        .execute(&mut *conn)
        .await?;
        // An account verified before has no live verification links to end.
        if updated.rows_affected() == 0 {
            return Ok(());
        }
        supersede_verification(conn, user_id).await
    }

    async fn set_password(
        conn: &mut SqliteConnection,
        user_id: Uuid,
        password_hash: &str,
    ) -> anyhow::Result<()> {
        sqlx::query("UPDATE oncely_users SET password_hash = ?2 WHERE id = ?1")
            .bind(user_id)
            .bind(password_hash)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn accept_invite(
        conn: &mut SqliteConnection,
        tenant: &str,
        email: &str,
        password_hash: Option<&str>,
    ) -> anyhow::Result<Uuid> {
        let now = now();
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO oncely_users (id, tenant, email, password_hash, source, status, verified_at, created_at)
             VALUES (?1, ?2, ?3, ?4, 'invite', 'verified', ?5, ?5)
             ON CONFLICT (tenant, email) DO UPDATE
                SET status = 'verified', verified_at = COALESCE(verified_at, excluded.verified_at),
                    password_hash = CASE WHEN status = 'pending' THEN excluded.password_hash
                                     ELSE password_hash END
             RETURNING id",
        )
        .bind(Uuid::new_v4())
        .bind(tenant)
        .bind(email)
        .bind(password_hash)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("INSERT INTO oncely_memberships (tenant, user_id, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING")
            .bind(tenant)
            .bind(id)
            .bind(now)
            .execute(&mut *conn)
            .await?;
        supersede_verification(conn, id).await?;
        Ok(id)
    }

    async fn token_for_send(&self, token_id: Uuid) -> anyhow::Result<Option<TokenForSend>> {
        let row = sqlx::query(
            "SELECT t.flow, t.token_hash, COALESCE(u.email, t.email) AS recipient,
                    (t.consumed_at IS NULL AND t.superseded_at IS NULL AND t.expires_at > ?2) AS live
               FROM oncely_tokens t LEFT JOIN oncely_users u ON u.id = t.user_id WHERE t.id = ?1",
        )
        .bind(token_id)
        .bind(now())
        .fetch_optional(self.pool())
        .await?;
        row.map(|r| {
            Ok(TokenForSend {
                flow: r.try_get("flow")?,
                recipient: r.try_get("recipient")?,
                live: r.try_get("live")?,
                hash: r.try_get("token_hash")?,
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

    async fn prune_tokens(
        &self,
        expired_for: std::time::Duration,
        limit: u32,
    ) -> anyhow::Result<u64> {
        // Index: oncely_tokens_expires_at.
        let cutoff = now() - i64::try_from(expired_for.as_millis()).unwrap_or(i64::MAX);
        let done = sqlx::query(
            "DELETE FROM oncely_tokens WHERE rowid IN (
                 SELECT rowid FROM oncely_tokens WHERE expires_at < ?1 ORDER BY expires_at LIMIT ?2)",
        )
        .bind(cutoff)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    async fn prune_rate_limits(&self, before_window: i64, limit: u32) -> anyhow::Result<u64> {
        // Index: oncely_rate_limits_window.
        let done = sqlx::query(
            "DELETE FROM oncely_rate_limits WHERE rowid IN (
                 SELECT rowid FROM oncely_rate_limits WHERE window_start < ?1 LIMIT ?2)",
        )
        .bind(before_window)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    async fn create_tenant(&self, id: &str, api_key_hash: &[u8]) -> anyhow::Result<()> {
        sqlx::query(
            "INSERT INTO oncely_tenants (id, api_key_hash, created_at) VALUES (?1, ?2, ?3)",
        )
        .bind(id)
        .bind(api_key_hash)
        .bind(now())
        .execute(self.pool())
        .await?;
        Ok(())
    }

    async fn tenant_by_key(&self, api_key_hash: &[u8]) -> anyhow::Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM oncely_tenants WHERE api_key_hash = ?1")
                .bind(api_key_hash)
                .fetch_optional(self.pool())
                .await?,
        )
    }
}

/// Supersedes a user's live verification tokens once the address is proven (index:
/// `oncely_tokens_live`).
async fn supersede_verification(conn: &mut SqliteConnection, user_id: Uuid) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE oncely_tokens SET superseded_at = ?2
          WHERE user_id = ?1 AND flow = 'verification' AND consumed_at IS NULL AND superseded_at IS NULL",
    )
    .bind(user_id)
    .bind(now())
    .execute(conn)
    .await?;
    Ok(())
}
