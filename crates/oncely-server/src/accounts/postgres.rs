//! The account statements in PostgreSQL's dialect (see [`Statements`] for what each binds).
//! Times are `timestamptz`; `COALESCE($n, now())` reads the database clock unless the caller
//! bound an instant.

use super::{
    AccountSql, CodeStatements, EndpointStatements, LimitStatements, Statements, TenantStatements,
    TokenStatements, UserStatements, statements,
};
use crate::backend::Postgres;

impl AccountSql for Postgres {
    const ACCOUNT_SQL: Statements = statements!();
}

/// The statements of users.
const USERS: UserStatements = UserStatements {
    insert_user: "INSERT INTO oncely_users (id, tenant, email, source, created_at)
                  VALUES ($1, $2, $3, $4, COALESCE($5, now())) ON CONFLICT (tenant, email) DO NOTHING
                  RETURNING id",
    // One round trip for what a signup writes before its link. The counters as
    // `count_email_pair` (the pair's row only for a known client). The existing user is read
    // `FOR SHARE`: a transaction changing it (a verification) is waited for and its result
    // read, and none can change it until the signup commits; a user that a concurrent insert
    // committed after the statement's snapshot is not visible here and is read by the caller.
    // The endpoints are those of the statement's snapshot.
    // Index: oncely_users (tenant, email) unique; oncely_webhook_endpoints by tenant.
    signup_user_counted: Some(
        "WITH inserted AS (
             INSERT INTO oncely_users (id, tenant, email, source, created_at)
             VALUES ($1, $2, $3, $4, COALESCE($5, now())) ON CONFLICT (tenant, email) DO NOTHING
             RETURNING id
         ), pair AS (
             INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count)
             SELECT $2, $6, $8, 1 WHERE $6::text IS NOT NULL
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
             RETURNING count
         ), total AS (
             INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count)
             SELECT $2, $7, $8, 1
              WHERE CASE WHEN $6::text IS NULL THEN true
                         ELSE $10 AND COALESCE((SELECT count FROM pair) <= $9, false) END
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
             RETURNING count
         )
         SELECT (SELECT id FROM inserted) AS inserted,
                (SELECT id FROM oncely_users WHERE tenant = $2 AND email = $3 FOR SHARE) AS found,
                (SELECT status = 'verified' FROM oncely_users
                  WHERE tenant = $2 AND email = $3 FOR SHARE) AS verified,
                COALESCE((SELECT count FROM pair), 0)::bigint AS from_client,
                (SELECT count FROM total)::bigint AS to_address,
                (SELECT json_agg(json_build_array(id, events) ORDER BY created_at, id)::text
                   FROM oncely_webhook_endpoints
                  WHERE tenant = $2 AND disabled_at IS NULL) AS targets",
    ),
    find_user: "SELECT id, status = 'verified' AS verified FROM oncely_users
                 WHERE tenant = $1 AND email = $2",
    lock_user: "SELECT id, status = 'verified' AS verified FROM oncely_users
                 WHERE tenant = $1 AND email = $2 FOR UPDATE",
    // Index: oncely_users (tenant, email) unique.
    login_user: "SELECT id, status = 'verified' AS verified, password_hash FROM oncely_users
                  WHERE tenant = $1 AND email = $2",
    rehash_password: "UPDATE oncely_users SET password_hash = $3
                       WHERE id = $1 AND password_hash = $2",
    mark_verified: "UPDATE oncely_users SET status = 'verified', verified_at = COALESCE($2, now()),
                           password_hash = $3, locale = $4
                     WHERE id = $1 AND status = 'pending'",
    set_password: "UPDATE oncely_users SET password_hash = $2 WHERE id = $1",
    // Columns of the existing row need the table's alias (`u`) beside `excluded`.
    accept_invite: "INSERT INTO oncely_users AS u
                        (id, tenant, email, password_hash, source, status, verified_at, created_at, locale)
                    VALUES ($1, $2, $3, $4, 'invite', 'verified', COALESCE($5, now()), COALESCE($5, now()), $6)
                    ON CONFLICT (tenant, email) DO UPDATE
                       SET status = 'verified', verified_at = COALESCE(u.verified_at, excluded.verified_at),
                           locale = CASE WHEN u.status = 'pending' THEN excluded.locale
                                         ELSE COALESCE(u.locale, excluded.locale) END,
                           password_hash = CASE WHEN u.status = 'pending' THEN excluded.password_hash
                                            ELSE u.password_hash END
                    RETURNING id",
    insert_invited_user: "INSERT INTO oncely_users
                              (id, tenant, email, password_hash, source, status, verified_at, created_at, locale)
                          VALUES ($1, $2, $3, $4, 'invite', 'verified', COALESCE($5, now()), COALESCE($5, now()), $6)
                          ON CONFLICT (tenant, email) DO NOTHING",
    add_membership: "INSERT INTO oncely_memberships (tenant, user_id, created_at)
                     VALUES ($1, $2, COALESCE($3, now())) ON CONFLICT DO NOTHING",
    user_email: "SELECT email FROM oncely_users WHERE id = $1",
    // A pending account's locale came from a signup nobody has proven the address for yet.
    user_email_and_locale: "SELECT email, CASE WHEN status = 'verified' THEN locale END AS locale
                             FROM oncely_users WHERE id = $1",
    user_in_tenant: "SELECT email FROM oncely_users WHERE id = $1 AND tenant = $2",
    // The NOT EXISTS sees committed rows only: a concurrent change or signup to the same
    // address is stopped by the unique index instead (AccountError::Conflict).
    change_email: "UPDATE oncely_users AS u
                      SET email = $2, status = 'verified',
                          verified_at = COALESCE(u.verified_at, COALESCE($3, now())),
                          password_hash = CASE WHEN u.status = 'pending' THEN NULL
                                          ELSE u.password_hash END
                    WHERE u.id = $1
                      AND NOT EXISTS (SELECT 1 FROM oncely_users o
                                       WHERE o.tenant = u.tenant AND o.email = $2)",
};

/// The statements of the email and login caps' counters.
const LIMITS: LimitStatements = LimitStatements {
    uncount: "UPDATE oncely_rate_limits SET count = count - 1
               WHERE tenant = $1 AND bucket = $2 AND window_start = $3 AND count > 0",
    // `count` is an integer column: widened, as SQLite returns it.
    count_email: "INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count)
                  VALUES ($1, $2, $3, 1)
                  ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
                  RETURNING count::bigint",
    // Two rows of the limits table, neither shared with requests for other addresses.
    count_email_pair: Some(
        "WITH pair AS (
             INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count)
             VALUES ($1, $2, $4, 1)
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
             RETURNING count
         ), total AS (
             INSERT INTO oncely_rate_limits AS r (tenant, bucket, window_start, count)
             SELECT $1, $3, $4, 1 FROM pair WHERE pair.count <= $5 AND $6
             ON CONFLICT (tenant, bucket, window_start) DO UPDATE SET count = r.count + 1
             RETURNING count
         )
         SELECT (SELECT count FROM pair)::bigint, (SELECT count FROM total)::bigint",
    ),
    // Index: oncely_rate_limits_window. The table has no id: rows by `ctid`.
    prune_rate_limits: "DELETE FROM oncely_rate_limits WHERE ctid = ANY (ARRAY(
                            SELECT ctid FROM oncely_rate_limits WHERE window_start < $1
                             LIMIT $2 FOR UPDATE SKIP LOCKED))",
};

/// A token's insert (binds 1 id … 9 the signup's password hash, 10 the return URL, 11 the
/// locale, 12 whether the return URL is the tenant's first); the tail of
/// `supersede_and_insert_token`.
macro_rules! insert_token {
    () => {
        "INSERT INTO oncely_tokens
                (id, tenant, user_id, email, flow, token_hash, expires_at, created_at, password_hash,
                 return_to, locale)
         VALUES ($1, $2, $3, $4, $5, $6, $7, COALESCE($8, now()), $9,
                 CASE WHEN $12 THEN (SELECT url FROM oncely_return_urls
                                      WHERE tenant = $2 ORDER BY position LIMIT 1)
                      ELSE $10 END,
                 $11)"
    };
}

/// Webhook endpoints as [`EndpointRecord`](super::EndpointRecord)s, `$2` now (a previous
/// secret only while it signs).
macro_rules! endpoint_records {
    () => {
        "SELECT id, tenant, url, events, secret_sealed,
                CASE WHEN previous_secret_expires_at > COALESCE($2, now())
                     THEN previous_secret_sealed END AS previous_secret_sealed,
                CASE WHEN previous_secret_expires_at > COALESCE($2, now())
                     THEN floor(extract(epoch FROM previous_secret_expires_at) * 1000)::int8
                END AS previous_secret_expires_at_ms,
                floor(extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms,
                floor(extract(epoch FROM disabled_at) * 1000)::int8 AS disabled_at_ms,
                disabled_reason
           FROM oncely_webhook_endpoints"
    };
}

/// The statements of token records.
const TOKENS: TokenStatements = TokenStatements {
    supersede_flow: "UPDATE oncely_tokens SET superseded_at = COALESCE($4, now())
                      WHERE user_id = $1 AND flow = $2 AND $3
                        AND consumed_at IS NULL AND superseded_at IS NULL
                        AND password_hash IS NULL",
    insert_token: insert_token!(),
    // Both parts see the statement's snapshot: the update never reaches the inserted row.
    supersede_and_insert_token: Some(concat!(
        "WITH superseded AS (
             UPDATE oncely_tokens SET superseded_at = COALESCE($8, now())
              WHERE user_id = $3 AND flow = $5 AND $13
                AND consumed_at IS NULL AND superseded_at IS NULL
                AND password_hash IS NULL
         )
         ",
        insert_token!()
    ),
    ),
    // Index: token_hash unique, then the users' primary key. Every transaction that uses a
    // link locks its account first, then its token, then the account's other tokens (a reset
    // ends them, so does an email change): two links of one account used at once then run one
    // after the other, where locking token first deadlocked (each held its own token and
    // wanted the other's).
    lock_token_account: "SELECT 1 FROM oncely_users
                          WHERE id = (SELECT user_id FROM oncely_tokens WHERE token_hash = $1)
                            FOR UPDATE",
    // Index: token_hash unique (across tenants: the token names its tenant). `$2::text`: a
    // NULL alone has no type to infer.
    consume_token: "UPDATE oncely_tokens SET consumed_at = COALESCE($4, now())
                     WHERE token_hash = $1 AND ($2::text IS NULL OR tenant = $2) AND flow = $3
                       AND (user_id IS NOT NULL OR email IS NOT NULL)
                       AND consumed_at IS NULL AND superseded_at IS NULL
                       AND expires_at > COALESCE($4, now())
                    RETURNING tenant, user_id, email, password_hash, return_to, locale",
    signup_password_attempt: "UPDATE oncely_tokens SET password_attempts = password_attempts + 1
                               WHERE token_hash = $1 AND ($2::text IS NULL OR tenant = $2)
                                 AND flow = 'verification' AND user_id IS NOT NULL
                                 AND consumed_at IS NULL AND superseded_at IS NULL
                                 AND expires_at > COALESCE($3, now())
                              RETURNING password_hash, password_attempts::bigint",
    signup_password_unattempt: "UPDATE oncely_tokens SET password_attempts = password_attempts - 1
                                 WHERE token_hash = $1 AND password_attempts > 0",
    // Index: oncely_tokens_live.
    supersede_verification: "UPDATE oncely_tokens SET superseded_at = COALESCE($2, now())
                              WHERE user_id = $1 AND flow = 'verification'
                                AND consumed_at IS NULL AND superseded_at IS NULL",
    token_for_send: "SELECT t.flow, t.tenant, t.user_id, t.token_hash, COALESCE(t.email, u.email) AS recipient,
                            COALESCE(t.locale, CASE WHEN u.status = 'verified' THEN u.locale END) AS locale,
                            (t.consumed_at IS NULL AND t.superseded_at IS NULL
                             AND t.expires_at > COALESCE($2, now())) AS live
                       FROM oncely_tokens t LEFT JOIN oncely_users u ON u.id = t.user_id
                      WHERE t.id = $1",
    // Index: oncely_tokens_live.
    supersede_user_tokens: "UPDATE oncely_tokens SET superseded_at = COALESCE($2, now())
                             WHERE user_id = $1 AND ($3 OR flow <> 'invite')
                               AND consumed_at IS NULL AND superseded_at IS NULL",
    // Index: oncely_tokens_expires_at. SKIP LOCKED: never waits for a request.
    prune_tokens: "DELETE FROM oncely_tokens WHERE id = ANY (ARRAY(
                       SELECT id FROM oncely_tokens
                        WHERE expires_at < COALESCE($1, now()) - make_interval(secs => $2)
                        ORDER BY expires_at LIMIT $3 FOR UPDATE SKIP LOCKED))",
};

/// The statements of tenants.
const TENANTS: TenantStatements = TenantStatements {
    create_tenant: "INSERT INTO oncely_tenants (id, api_key_hash, created_at)
                    VALUES ($1, $2, COALESCE($3, now()))",
    // Index: api_key_hash unique, or oncely_tenants_previous_key (a bitmap OR of the two).
    tenant_by_key: "SELECT id FROM oncely_tenants
                     WHERE api_key_hash = $1
                        OR (previous_key_hash = $1 AND previous_key_expires_at > COALESCE($2, now()))",
    // Every right-hand side reads the row as it was: the replaced key becomes the previous one.
    rotate_tenant_key: "UPDATE oncely_tenants
                           SET api_key_hash = $2,
                               previous_key_hash = CASE WHEN $3 > 0 THEN api_key_hash END,
                               previous_key_expires_at = CASE WHEN $3 > 0
                                   THEN COALESCE($4, now()) + make_interval(secs => $3) END
                         WHERE id = $1
                     RETURNING floor(extract(epoch FROM previous_key_expires_at) * 1000)::int8
                               AS previous_key_expires_at_ms",
    tenants: "SELECT id, api_key_hash,
                     floor(extract(epoch FROM created_at) * 1000)::int8 AS created_at_ms,
                     CASE WHEN previous_key_expires_at > COALESCE($1, now())
                          THEN previous_key_hash END AS previous_key_hash,
                     CASE WHEN previous_key_expires_at > COALESCE($1, now())
                          THEN floor(extract(epoch FROM previous_key_expires_at) * 1000)::int8
                     END AS previous_key_expires_at_ms
                     , email_delivery, product_name, mail_from, support_email
                FROM oncely_tenants ORDER BY id",
    return_urls: "SELECT url FROM oncely_return_urls WHERE tenant = $1 ORDER BY position",
    all_return_urls: "SELECT tenant, url FROM oncely_return_urls ORDER BY tenant, position",
    lock_tenant: "SELECT id FROM oncely_tenants WHERE id = $1 FOR UPDATE",
    clear_return_urls: "DELETE FROM oncely_return_urls WHERE tenant = $1",
    add_return_url: "INSERT INTO oncely_return_urls (tenant, position, url) VALUES ($1, $2, $3)",
    // Index: oncely_webhook_endpoints_tenant.
    email_delivery: "SELECT email_delivery FROM oncely_tenants WHERE id = $1",
    branding: "SELECT product_name, mail_from, support_email FROM oncely_tenants WHERE id = $1",
    set_branding: "UPDATE oncely_tenants SET product_name = $2, mail_from = $3, support_email = $4
                   WHERE id = $1",
    set_email_delivery: "UPDATE oncely_tenants SET email_delivery = $2 WHERE id = $1",
};

/// The statements of one-time codes.
const CODES: CodeStatements = CodeStatements {
    // The token's own tenant, flow and consumption time: the code cannot say otherwise.
    insert_code: "INSERT INTO oncely_codes
                      (code_hash, tenant, user_id, flow, authenticated_at, expires_at)
                  SELECT $1, tenant, $3, flow, consumed_at, consumed_at + make_interval(secs => $4)
                    FROM oncely_tokens t WHERE token_hash = $2 AND consumed_at IS NOT NULL
                     AND EXISTS (SELECT 1 FROM oncely_return_urls r
                                  WHERE r.tenant = t.tenant AND r.url = t.return_to)",
    // Index: code_hash (primary key). One statement: of concurrent exchanges one updates the
    // row, the others find it consumed.
    exchange_code: "UPDATE oncely_codes c SET consumed_at = COALESCE($3, now())
                     WHERE code_hash = $1 AND tenant = $2
                       AND consumed_at IS NULL AND expires_at > COALESCE($3, now())
                    RETURNING user_id,
                              (SELECT u.email FROM oncely_users u WHERE u.id = c.user_id) AS email,
                              (SELECT u.status = 'verified' FROM oncely_users u WHERE u.id = c.user_id)
                                  AS email_verified,
                              flow,
                              floor(extract(epoch FROM authenticated_at) * 1000)::int8
                                  AS authenticated_at_ms",
    // Index: code_hash (primary key).
    code_live: "SELECT 1::int8 AS live FROM oncely_codes
                 WHERE code_hash = $1 AND tenant = $2 AND expires_at > COALESCE($3, now())",
    // Index: oncely_codes_expires_at.
    prune_codes: "DELETE FROM oncely_codes WHERE code_hash = ANY (ARRAY(
                      SELECT code_hash FROM oncely_codes WHERE expires_at < COALESCE($1, now())
                       ORDER BY expires_at LIMIT $2 FOR UPDATE SKIP LOCKED))",
};

/// The statements of webhook endpoints.
const ENDPOINTS: EndpointStatements = EndpointStatements {
    webhook_targets: "SELECT id, events FROM oncely_webhook_endpoints
                      WHERE tenant = $1 AND disabled_at IS NULL
                      ORDER BY created_at, id",
    insert_webhook_endpoint: "INSERT INTO oncely_webhook_endpoints
                                  (id, tenant, url, events, secret_sealed, created_at)
                              VALUES ($1, $2, $3, $4, $5, COALESCE($6, now()))",
    webhook_endpoint: concat!(endpoint_records!(), " WHERE id = $1"),
    // Index: oncely_webhook_endpoints_tenant (one tenant); every tenant: a scan of a small table.
    webhook_endpoints: concat!(
        endpoint_records!(),
        "
                          WHERE $1::text IS NULL OR tenant = $1
                          ORDER BY tenant, created_at, id"
    ),
    set_webhook_disabled: "UPDATE oncely_webhook_endpoints
                              SET disabled_at = CASE WHEN $3::text IS NULL THEN NULL
                                                     ELSE COALESCE($2, now()) END,
                                  disabled_reason = $3
                            WHERE id = $1",
    // Every right-hand side reads the row as it was: the replaced secret becomes the previous.
    rotate_webhook_secret: "UPDATE oncely_webhook_endpoints
                               SET secret_sealed = $2,
                                   previous_secret_sealed = CASE WHEN $3 > 0 THEN secret_sealed END,
                                   previous_secret_expires_at = CASE WHEN $3 > 0
                                       THEN COALESCE($4, now()) + make_interval(secs => $3) END
                             WHERE id = $1
                         RETURNING floor(extract(epoch FROM previous_secret_expires_at) * 1000)::int8
                                   AS previous_secret_expires_at_ms",
    reseal_webhook_secret: "UPDATE oncely_webhook_endpoints
                               SET secret_sealed = CASE WHEN secret_sealed = $2 THEN $3
                                                        ELSE secret_sealed END,
                                   previous_secret_sealed = CASE WHEN previous_secret_sealed = $2
                                                                 THEN $3 ELSE previous_secret_sealed END
                             WHERE id = $1",
    remove_webhook_endpoint: "DELETE FROM oncely_webhook_endpoints WHERE id = $1",
};
