//! The account statements in SQLite's dialect (see [`Statements`] for what each binds). Times
//! are Unix milliseconds from the process clock, always bound: one process owns the file.

use super::{
    AccountSql, CodeStatements, EndpointStatements, LimitStatements, Statements, TenantStatements,
    TokenStatements, UserStatements, statements,
};
use crate::backend::Sqlite;

impl AccountSql for Sqlite {
    const ACCOUNT_SQL: Statements = statements!();
}

/// The statements of users.
const USERS: UserStatements = UserStatements {
    insert_user: "INSERT INTO oncely_users (id, tenant, email, source, created_at)
                  VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (tenant, email) DO NOTHING
                  RETURNING id",
    // Differs: no data-modifying CTEs (the statements one after another, in-process).
    signup_user_counted: None,
    find_user: "SELECT id, status = 'verified' AS verified FROM oncely_users
                 WHERE tenant = ?1 AND email = ?2",
    // Differs: nothing to lock — the transaction holds the database's one write lock.
    lock_user: "SELECT id, status = 'verified' AS verified FROM oncely_users
                 WHERE tenant = ?1 AND email = ?2",
    // Index: oncely_users (tenant, email) unique.
    login_user: "SELECT id, status = 'verified' AS verified, password_hash FROM oncely_users
                  WHERE tenant = ?1 AND email = ?2",
    rehash_password: "UPDATE oncely_users SET password_hash = ?3
                       WHERE id = ?1 AND password_hash = ?2",
    mark_verified: "UPDATE oncely_users SET status = 'verified', verified_at = ?2, password_hash = ?3,
                                          locale = ?4
                     WHERE id = ?1 AND status = 'pending'",
    set_password: "UPDATE oncely_users SET password_hash = ?2 WHERE id = ?1",
    // Unqualified columns in DO UPDATE are the existing row's.
    accept_invite: "INSERT INTO oncely_users
                        (id, tenant, email, password_hash, source, status, verified_at, created_at, locale)
                    VALUES (?1, ?2, ?3, ?4, 'invite', 'verified', ?5, ?5, ?6)
                    ON CONFLICT (tenant, email) DO UPDATE
                       SET status = 'verified', verified_at = COALESCE(verified_at, excluded.verified_at),
                           locale = CASE WHEN status = 'pending' THEN excluded.locale
                                         ELSE COALESCE(locale, excluded.locale) END,
                           password_hash = CASE WHEN status = 'pending' THEN excluded.password_hash
                                            ELSE password_hash END
                    RETURNING id",
    insert_invited_user: "INSERT INTO oncely_users
                              (id, tenant, email, password_hash, source, status, verified_at, created_at, locale)
                          VALUES (?1, ?2, ?3, ?4, 'invite', 'verified', ?5, ?5, ?6)
                          ON CONFLICT (tenant, email) DO NOTHING",
    add_membership: "INSERT INTO oncely_memberships (tenant, user_id, created_at)
                     VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
    user_email: "SELECT email FROM oncely_users WHERE id = ?1",
    // A pending account's locale came from a signup nobody has proven the address for yet.
    user_email_and_locale: "SELECT email, CASE WHEN status = 'verified' THEN locale END AS locale
                             FROM oncely_users WHERE id = ?1",
    user_in_tenant: "SELECT email FROM oncely_users WHERE id = ?1 AND tenant = ?2",
    // Unqualified columns in SET are the row's own; one writer at a time: no race past the
    // NOT EXISTS.
    change_email: "UPDATE oncely_users
                      SET email = ?2, status = 'verified', verified_at = COALESCE(verified_at, ?3),
                          password_hash = CASE WHEN status = 'pending' THEN NULL
                                          ELSE password_hash END
                    WHERE id = ?1
                      AND NOT EXISTS (SELECT 1 FROM oncely_users o
                                       WHERE o.tenant = oncely_users.tenant AND o.email = ?2)",
};

/// The statements of the email and login caps' counters.
const LIMITS: LimitStatements = LimitStatements {
    uncount: "UPDATE oncely_rate_limits SET count = count - 1
               WHERE tenant = ?1 AND bucket = ?2 AND window_start = ?3 AND count > 0",
    count_email: "INSERT INTO oncely_rate_limits (tenant, bucket, window_start, count)
                  VALUES (?1, ?2, ?3, 1)
                  ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = count + 1
                  RETURNING count",
    // Differs: no data-modifying CTEs (two statements, in-process).
    count_email_pair: None,
    // Index: oncely_rate_limits_window.
    prune_rate_limits: "DELETE FROM oncely_rate_limits WHERE rowid IN (
                            SELECT rowid FROM oncely_rate_limits WHERE window_start < ?1 LIMIT ?2)",
};

/// The statements of token records.
const TOKENS: TokenStatements = TokenStatements {
    supersede_flow: "UPDATE oncely_tokens SET superseded_at = ?4
                      WHERE user_id = ?1 AND flow = ?2 AND ?3
                        AND consumed_at IS NULL AND superseded_at IS NULL
                        AND password_hash IS NULL",
    insert_token: "INSERT INTO oncely_tokens
                       (id, tenant, user_id, email, flow, token_hash, expires_at, created_at, password_hash,
                        return_to, locale)
                   VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9,
                           CASE WHEN ?12 THEN (SELECT url FROM oncely_return_urls
                                                WHERE tenant = ?2 ORDER BY position LIMIT 1)
                                ELSE ?10 END,
                           ?11)",
    // Differs: no data-modifying CTEs (two statements, in-process).
    supersede_and_insert_token: None,
    // Differs: nothing to lock — the transaction holds the database's one write lock.
    lock_token_account: "SELECT 1 WHERE ?1 IS NULL",
    // Index: token_hash unique (across tenants: the token names its tenant).
    consume_token: "UPDATE oncely_tokens SET consumed_at = ?4
                     WHERE token_hash = ?1 AND (?2 IS NULL OR tenant = ?2) AND flow = ?3
                       AND (user_id IS NOT NULL OR email IS NOT NULL)
                       AND consumed_at IS NULL AND superseded_at IS NULL AND expires_at > ?4
                    RETURNING tenant, user_id, email, password_hash, return_to, locale",
    signup_password_attempt: "UPDATE oncely_tokens SET password_attempts = password_attempts + 1
                               WHERE token_hash = ?1 AND (?2 IS NULL OR tenant = ?2)
                                 AND flow = 'verification' AND user_id IS NOT NULL
                                 AND consumed_at IS NULL AND superseded_at IS NULL
                                 AND expires_at > ?3
                              RETURNING password_hash, password_attempts",
    signup_password_unattempt: "UPDATE oncely_tokens SET password_attempts = password_attempts - 1
                                 WHERE token_hash = ?1 AND password_attempts > 0",
    // Index: oncely_tokens_live.
    supersede_verification: "UPDATE oncely_tokens SET superseded_at = ?2
                              WHERE user_id = ?1 AND flow = 'verification'
                                AND consumed_at IS NULL AND superseded_at IS NULL",
    token_for_send: "SELECT t.flow, t.tenant, t.user_id, t.token_hash, COALESCE(t.email, u.email) AS recipient,
                            COALESCE(t.locale, CASE WHEN u.status = 'verified' THEN u.locale END) AS locale,
                            (t.consumed_at IS NULL AND t.superseded_at IS NULL
                             AND t.expires_at > ?2) AS live
                       FROM oncely_tokens t LEFT JOIN oncely_users u ON u.id = t.user_id
                      WHERE t.id = ?1",
    // Index: oncely_tokens_live.
    supersede_user_tokens: "UPDATE oncely_tokens SET superseded_at = ?2
                             WHERE user_id = ?1 AND (?3 OR flow <> 'invite')
                               AND consumed_at IS NULL AND superseded_at IS NULL",
    // Index: oncely_tokens_expires_at. Milliseconds: the interval is seconds × 1000. No row
    // locks to skip: one writer at a time.
    prune_tokens: "DELETE FROM oncely_tokens WHERE rowid IN (
                       SELECT rowid FROM oncely_tokens
                        WHERE expires_at < ?1 - CAST(?2 * 1000 AS INTEGER)
                        ORDER BY expires_at LIMIT ?3)",
};

/// The statements of tenants.
const TENANTS: TenantStatements = TenantStatements {
    create_tenant: "INSERT INTO oncely_tenants (id, api_key_hash, created_at) VALUES (?1, ?2, ?3)",
    // Index: api_key_hash unique, or oncely_tenants_previous_key (SQLite's OR optimization).
    tenant_by_key: "SELECT id FROM oncely_tenants
                     WHERE api_key_hash = ?1
                        OR (previous_key_hash = ?1 AND previous_key_expires_at > ?2)",
    // Milliseconds: the grace is seconds × 1000.
    rotate_tenant_key: "UPDATE oncely_tenants
                           SET api_key_hash = ?2,
                               previous_key_hash = CASE WHEN ?3 > 0 THEN api_key_hash END,
                               previous_key_expires_at = CASE WHEN ?3 > 0
                                   THEN ?4 + CAST(?3 * 1000 AS INTEGER) END
                         WHERE id = ?1
                     RETURNING previous_key_expires_at AS previous_key_expires_at_ms",
    tenants: "SELECT id, api_key_hash, created_at AS created_at_ms,
                     CASE WHEN previous_key_expires_at > ?1 THEN previous_key_hash END
                         AS previous_key_hash,
                     CASE WHEN previous_key_expires_at > ?1 THEN previous_key_expires_at END
                         AS previous_key_expires_at_ms
                     , email_delivery, product_name, mail_from, support_email
                FROM oncely_tenants ORDER BY id",
    return_urls: "SELECT url FROM oncely_return_urls WHERE tenant = ?1 ORDER BY position",
    all_return_urls: "SELECT tenant, url FROM oncely_return_urls ORDER BY tenant, position",
    // One writer at a time: nothing to lock.
    lock_tenant: "SELECT id FROM oncely_tenants WHERE id = ?1",
    clear_return_urls: "DELETE FROM oncely_return_urls WHERE tenant = ?1",
    add_return_url: "INSERT INTO oncely_return_urls (tenant, position, url) VALUES (?1, ?2, ?3)",
    // Index: oncely_webhook_endpoints_tenant.
    email_delivery: "SELECT email_delivery FROM oncely_tenants WHERE id = ?1",
    branding: "SELECT product_name, mail_from, support_email FROM oncely_tenants WHERE id = ?1",
    set_branding: "UPDATE oncely_tenants SET product_name = ?2, mail_from = ?3, support_email = ?4
                   WHERE id = ?1",
    set_email_delivery: "UPDATE oncely_tenants SET email_delivery = ?2 WHERE id = ?1",
};

/// The statements of one-time codes.
const CODES: CodeStatements = CodeStatements {
    // See PostgreSQL's. Milliseconds: the lifetime is seconds × 1000.
    insert_code: "INSERT INTO oncely_codes
                      (code_hash, tenant, user_id, flow, authenticated_at, expires_at)
                  SELECT ?1, tenant, ?3, flow, consumed_at, consumed_at + CAST(?4 * 1000 AS INTEGER)
                    FROM oncely_tokens t WHERE token_hash = ?2 AND consumed_at IS NOT NULL
                     AND EXISTS (SELECT 1 FROM oncely_return_urls r
                                  WHERE r.tenant = t.tenant AND r.url = t.return_to)",
    // Index: code_hash (primary key). SQLite's RETURNING may not name another table: the
    // user's columns come from subqueries.
    exchange_code: "UPDATE oncely_codes SET consumed_at = ?3
                     WHERE code_hash = ?1 AND tenant = ?2
                       AND consumed_at IS NULL AND expires_at > ?3
                    RETURNING user_id,
                              (SELECT u.email FROM oncely_users u WHERE u.id = user_id) AS email,
                              (SELECT u.status = 'verified' FROM oncely_users u WHERE u.id = user_id)
                                  AS email_verified,
                              flow, authenticated_at AS authenticated_at_ms",
    // Index: code_hash (primary key).
    code_live: "SELECT 1 AS live FROM oncely_codes
                 WHERE code_hash = ?1 AND tenant = ?2 AND expires_at > ?3",
    // Index: oncely_codes_expires_at.
    prune_codes: "DELETE FROM oncely_codes WHERE rowid IN (
                      SELECT rowid FROM oncely_codes WHERE expires_at < ?1
                       ORDER BY expires_at LIMIT ?2)",
};

/// Webhook endpoints as [`EndpointRecord`](super::EndpointRecord)s, `?2` now (a previous
/// secret only while it signs).
macro_rules! endpoint_records {
    () => {
        "SELECT id, tenant, url, events, secret_sealed,
                CASE WHEN previous_secret_expires_at > ?2
                     THEN previous_secret_sealed END AS previous_secret_sealed,
                CASE WHEN previous_secret_expires_at > ?2
                     THEN previous_secret_expires_at END AS previous_secret_expires_at_ms,
                created_at AS created_at_ms, disabled_at AS disabled_at_ms,
                disabled_reason
           FROM oncely_webhook_endpoints"
    };
}

/// The statements of webhook endpoints.
const ENDPOINTS: EndpointStatements = EndpointStatements {
    webhook_targets: "SELECT id, events FROM oncely_webhook_endpoints
                      WHERE tenant = ?1 AND disabled_at IS NULL
                      ORDER BY created_at, id",
    insert_webhook_endpoint: "INSERT INTO oncely_webhook_endpoints
                                  (id, tenant, url, events, secret_sealed, created_at)
                              VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
    webhook_endpoint: concat!(endpoint_records!(), " WHERE id = ?1"),
    webhook_endpoints: concat!(
        endpoint_records!(),
        "
                          WHERE ?1 IS NULL OR tenant = ?1
                          ORDER BY tenant, created_at, id"
    ),
    set_webhook_disabled: "UPDATE oncely_webhook_endpoints
                              SET disabled_at = CASE WHEN ?3 IS NULL THEN NULL ELSE ?2 END,
                                  disabled_reason = ?3
                            WHERE id = ?1",
    // See PostgreSQL's. Milliseconds: the grace is seconds × 1000.
    rotate_webhook_secret: "UPDATE oncely_webhook_endpoints
                               SET secret_sealed = ?2,
                                   previous_secret_sealed = CASE WHEN ?3 > 0 THEN secret_sealed END,
                                   previous_secret_expires_at = CASE WHEN ?3 > 0
                                       THEN ?4 + CAST(?3 * 1000 AS INTEGER) END
                             WHERE id = ?1
                         RETURNING previous_secret_expires_at AS previous_secret_expires_at_ms",
    reseal_webhook_secret: "UPDATE oncely_webhook_endpoints
                               SET secret_sealed = CASE WHEN secret_sealed = ?2 THEN ?3
                                                        ELSE secret_sealed END,
                                   previous_secret_sealed = CASE WHEN previous_secret_sealed = ?2
                                                                 THEN ?3 ELSE previous_secret_sealed END
                             WHERE id = ?1",
    remove_webhook_endpoint: "DELETE FROM oncely_webhook_endpoints WHERE id = ?1",
};
