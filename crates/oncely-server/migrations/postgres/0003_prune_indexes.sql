-- Pruning: tokens by expiry, rate-limit counters by window.
CREATE INDEX oncely_tokens_expires_at ON oncely_tokens (expires_at);
CREATE INDEX oncely_rate_limits_window ON oncely_rate_limits (window_start);
