-- The delivery log reads an endpoint's deliveries newest first, a page at a time from a cursor.
CREATE INDEX webhook_deliveries_log ON webhook_deliveries (endpoint_id, created_at_ms, event_id);
