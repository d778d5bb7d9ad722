//! Account SQL for PostgreSQL.

use oncely::store::postgres::PgKeyStore;
use oncely_outbox::store::postgres::PgJobStore;
use sqlx::migrate::Migrator;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::{Accounts, ConsumedToken, NewToken, SignupRow, TokenForSend, UserRow};
use crate::email::EmailAddress;

/// The service's migrations on PostgreSQL.
pub fn migrator() -> Migrator {
    super::migrator_of(&[
        (
            1,
            "accounts",
            include_str!("../../migrations/postgres/0001_accounts.sql"),
        ),
        (
            2,
            "tenants, invites, rate limits",
            include_str!("../../migrations/postgres/0002_tenants_invites_limits.sql"),
        ),
        (
            3,
            "prune indexes",
            include_str!("../../migrations/postgres/0003_prune_indexes.sql"),
        ),
        (
            4,
            "signup password on its verification token",
            include_str!("../../migrations/postgres/0004_signup_password_on_token.sql"),
        ),
        (
            5,
            "signup password attempts",
            include_str!("../../migrations/postgres/0005_signup_password_attempts.sql"),
        ),
    ])
}

impl Accounts for PgKeyStore {
    type Jobs = PgJobStore;

    fn jobs(&self, poll_only: bool) -> PgJobStore {
        let jobs = PgJobStore::new(self.pool().clone());
        if poll_only { jobs.poll_only() } else { jobs }
    }

    async fn migrate_accounts(&self) -> anyhow::Result<()> {
        migrator().run(self.pool()).await?;
        Ok(())
    }

    async fn signup_user(
        conn: &mut PgConnection,
        tenant: &str,
        email: &EmailAddress,
        source: Option<&str>,
    ) -> anyhow::Result<SignupRow> {
        let new_id = Uuid::new_v4();
        sqlx::query(
            "INSERT INTO oncely_users (id, tenant, email, source)
             VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, email) DO NOTHING",
        )
        .bind(new_id)
        .bind(tenant)
        .bind(email.as_str())
        .bind(source)
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
        conn: &mut PgConnection,
        tenant: &str,
        email: &EmailAddress,
    ) -> anyhow::Result<Option<UserRow>> {
        let row = sqlx::query("SELECT id, status = 'verified' AS verified FROM oncely_users WHERE tenant = $1 AND email = $2")
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
        conn: &mut PgConnection,
        tenant: &str,
        bucket: &str,
        window_start: i64,
    ) -> anyhow::Result<i64> {
        let count: i32 = sqlx::query_scalar(
            "INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count) VALUES ($1, $2, $3, 1)
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
             RETURNING count",
        )
        .bind(tenant)
        .bind(bucket)
        .bind(window_start)
        .fetch_one(conn)
        .await?;
        Ok(i64::from(count))
    }

    async fn insert_token(conn: &mut PgConnection, token: &NewToken<'_>) -> anyhow::Result<()> {
        sqlx::query(
            "UPDATE oncely_tokens SET superseded_at = now()
              WHERE user_id = $1 AND flow = $2 AND $3 AND consumed_at IS NULL AND superseded_at IS NULL
                AND password_hash IS NULL",
        )
        .bind(token.user_id)
        .bind(token.flow)
        .bind(token.supersede)
        .execute(&mut *conn)
        .await?;
        sqlx::query(
            "INSERT INTO oncely_tokens (id, tenant, user_id, email, flow, token_hash, expires_at, password_hash)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(token.id)
        .bind(token.tenant)
        .bind(token.user_id)
        .bind(token.email)
        .bind(token.flow)
        .bind(token.hash)
        .bind(token.expires_at)
        .bind(token.password_hash)
        .execute(conn)
        .await?;
        Ok(())
    }

    async fn consume_token(
        conn: &mut PgConnection,
        tenant: Option<&str>,
        flow: &str,
        hash: &[u8],
    ) -> anyhow::Result<Option<ConsumedToken>> {
        // Index: token_hash unique (across tenants: the token names its tenant).
        let row = sqlx::query(
            "UPDATE oncely_tokens SET consumed_at = now()
              WHERE token_hash = $1 AND ($2::text IS NULL OR tenant = $2) AND flow = $3
                AND (user_id IS NOT NULL OR email IS NOT NULL)
                AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > now()
             RETURNING tenant, user_id, email, password_hash",
        )
        .bind(hash)
        .bind(tenant)
        .bind(flow)
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
        let row: Option<(Option<String>, i32)> = sqlx::query_as(
            "UPDATE oncely_tokens SET password_attempts = password_attempts + 1
              WHERE token_hash = $1 AND ($2::text IS NULL OR tenant = $2) AND flow = 'verification'
                AND user_id IS NOT NULL
                AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > now()
             RETURNING password_hash, password_attempts",
        )
        .bind(hash)
        .bind(tenant)
        .fetch_optional(self.pool())
        .await?;
        Ok(row.map(|(password, attempts)| (password, i64::from(attempts))))
    }

    async fn mark_verified(
        conn: &mut PgConnection,
        user_id: Uuid,
        password_hash: Option<&str>,
    ) -> anyhow::Result<()> {
        let updated = sqlx::query(
            "UPDATE oncely_users SET status = 'verified', verified_at = now(),
                    password_hash = $2
              WHERE id = $1 AND status = 'pending'",
        )
        .bind(user_id)
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
        conn: &mut PgConnection,
        user_id: Uuid,
        password_hash: &str,
    ) -> anyhow::Result<()> {
        sqlx::query("UPDATE oncely_users SET password_hash = $2 WHERE id = $1")
            .bind(user_id)
            .bind(password_hash)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn accept_invite(
        conn: &mut PgConnection,
        tenant: &str,
        email: &str,
        password_hash: Option<&str>,
    ) -> anyhow::Result<Uuid> {
        let id: Uuid = sqlx::query_scalar(
            "INSERT INTO oncely_users AS u (id, tenant, email, password_hash, source, status, verified_at)
             VALUES ($1, $2, $3, $4, 'invite', 'verified', now())
             ON CONFLICT (tenant, email) DO UPDATE
                SET status = 'verified', verified_at = COALESCE(u.verified_at, now()),
                    password_hash = CASE WHEN u.status = 'pending' THEN excluded.password_hash
                                     ELSE u.password_hash END
             RETURNING id",
        )
        .bind(Uuid::new_v4())
        .bind(tenant)
        .bind(email)
        .bind(password_hash)
        .fetch_one(&mut *conn)
        .await?;
        sqlx::query("INSERT INTO oncely_memberships (tenant, user_id) VALUES ($1, $2) ON CONFLICT DO NOTHING")
            .bind(tenant)
            .bind(id)
            .execute(&mut *conn)
            .await?;
        supersede_verification(conn, id).await?;
        Ok(id)
    }

    async fn token_for_send(&self, token_id: Uuid) -> anyhow::Result<Option<TokenForSend>> {
        let row = sqlx::query(
            "SELECT t.flow, t.token_hash, COALESCE(u.email, t.email) AS recipient,
                    (t.consumed_at IS NULL AND t.superseded_at IS NULL AND t.expires_at > now()) AS live
               FROM oncely_tokens t LEFT JOIN oncely_users u ON u.id = t.user_id WHERE t.id = $1",
        )
        .bind(token_id)
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
            sqlx::query_scalar("SELECT email FROM oncely_users WHERE id = $1")
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
        // Index: oncely_tokens_expires_at. SKIP LOCKED: never waits for a request.
        let done = sqlx::query(
            "DELETE FROM oncely_tokens WHERE id = ANY (ARRAY(
                 SELECT id FROM oncely_tokens WHERE expires_at < now() - make_interval(secs => $1)
                  ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
        )
        .bind(expired_for.as_secs_f64())
        .bind(i64::from(limit))
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    async fn prune_rate_limits(&self, before_window: i64, limit: u32) -> anyhow::Result<u64> {
        // Index: oncely_rate_limits_window.
        let done = sqlx::query(
            "DELETE FROM oncely_rate_limits WHERE ctid = ANY (ARRAY(
                 SELECT ctid FROM oncely_rate_limits WHERE window_start < $1
                  LIMIT $2 FOR UPDATE SKIP LOCKED))",
        )
        .bind(before_window)
        .bind(i64::from(limit))
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected())
    }

    async fn create_tenant(&self, id: &str, api_key_hash: &[u8]) -> anyhow::Result<()> {
        sqlx::query("INSERT INTO oncely_tenants (id, api_key_hash) VALUES ($1, $2)")
            .bind(id)
            .bind(api_key_hash)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn tenant_by_key(&self, api_key_hash: &[u8]) -> anyhow::Result<Option<String>> {
        Ok(
            sqlx::query_scalar("SELECT id FROM oncely_tenants WHERE api_key_hash = $1")
                .bind(api_key_hash)
                .fetch_optional(self.pool())
                .await?,
        )
    }
}

/// Supersedes a user's live verification tokens once the address is proven (index:
/// `oncely_tokens_live`).
async fn supersede_verification(conn: &mut PgConnection, user_id: Uuid) -> anyhow::Result<()> {
    sqlx::query(
        "UPDATE oncely_tokens SET superseded_at = now()
          WHERE user_id = $1 AND flow = 'verification' AND consumed_at IS NULL AND superseded_at IS NULL",
    )
    .bind(user_id)
    .execute(conn)
    .await?;
    Ok(())
}
