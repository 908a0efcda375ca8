-- Failed attempts since the last success: an endpoint is disabled only after failing for long
-- enough and often enough, so that one failure on a quiet day is not mistaken for a dead endpoint.
ALTER TABLE webhook_endpoints ADD COLUMN failures_since_success BIGINT NOT NULL DEFAULT 0;
