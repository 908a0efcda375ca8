-- A range redelivery, run by the sender in batches of short transactions, never one long one:
-- at most one per endpoint at a time. The next batch starts after the event at
-- (cursor_created_at_ms, cursor_event_id), in that order; finished_at_ms is set when none is left.
CREATE TABLE webhook_redeliveries (
    endpoint_id          TEXT PRIMARY KEY REFERENCES webhook_endpoints (endpoint_id),
    client_id            TEXT NOT NULL,
    until_ms             BIGINT NOT NULL,
    -- Whether deliveries already delivered are sent again too.
    include_delivered    BOOLEAN NOT NULL,
    cursor_created_at_ms BIGINT NOT NULL,
    cursor_event_id      TEXT NOT NULL,
    requested_at_ms      BIGINT NOT NULL,
    -- When its last batch ran: the running redelivery whose turn is oldest goes next.
    updated_at_ms        BIGINT NOT NULL,
    finished_at_ms       BIGINT
);

CREATE INDEX webhook_redeliveries_running ON webhook_redeliveries (finished_at_ms, updated_at_ms);
