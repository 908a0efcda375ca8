-- When the endpoint was created or last changed by its owner (its URL, event types or limits).
ALTER TABLE webhook_endpoints ADD COLUMN updated_at_ms BIGINT NOT NULL DEFAULT 0;
UPDATE webhook_endpoints SET updated_at_ms = created_at_ms;
