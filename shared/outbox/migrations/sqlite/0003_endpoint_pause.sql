-- Until when the recipient asked for no deliveries (a 429 or 503 with Retry-After). It is the
-- endpoint's state, not a sender's: every sender honours it, and it outlasts their restarts.
ALTER TABLE webhook_endpoints ADD COLUMN paused_until_ms BIGINT;
