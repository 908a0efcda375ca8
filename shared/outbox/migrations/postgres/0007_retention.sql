-- Retention reaps the oldest events with their deliveries and attempts, found by event.
CREATE INDEX webhook_events_by_age ON webhook_events (created_at_ms);
CREATE INDEX webhook_deliveries_by_event ON webhook_deliveries (event_id);
CREATE INDEX webhook_attempts_by_event ON webhook_attempts (event_id);
