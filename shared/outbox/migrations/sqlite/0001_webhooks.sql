-- Outgoing webhooks: who receives a client's events, the outbox of events, one delivery per
-- event and recipient, and every attempt. Events and their deliveries are inserted in the same
-- transaction as the state change they report; the sender claims deliveries, attempts them and
-- records what happened. Times are milliseconds since the Unix epoch.

CREATE TABLE webhook_endpoints (
    endpoint_id      TEXT PRIMARY KEY,
    client_id        TEXT NOT NULL,
    url              TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN ('enabled', 'disabled')),
    disabled_reason  TEXT,
    -- The first failure since the last success: an endpoint failing for too long is disabled.
    failing_since_ms BIGINT,
    max_in_flight    BIGINT NOT NULL CHECK (max_in_flight > 0),
    rate_per_sec     BIGINT NOT NULL CHECK (rate_per_sec > 0),
    created_at_ms    BIGINT NOT NULL
);

CREATE INDEX webhook_endpoints_by_client ON webhook_endpoints (client_id, created_at_ms);

CREATE TABLE webhook_subscriptions (
    endpoint_id TEXT NOT NULL REFERENCES webhook_endpoints (endpoint_id),
    event_type  TEXT NOT NULL,
    PRIMARY KEY (endpoint_id, event_type)
);

-- Every secret signs until it expires; a rotation gives the previous ones an expiry (the overlap).
CREATE TABLE webhook_secrets (
    secret_id     TEXT PRIMARY KEY,
    endpoint_id   TEXT NOT NULL REFERENCES webhook_endpoints (endpoint_id),
    secret        TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT
);

CREATE INDEX webhook_secrets_by_endpoint ON webhook_secrets (endpoint_id, created_at_ms);

-- The outbox. payload is the exact body every delivery of the event sends.
CREATE TABLE webhook_events (
    event_id      TEXT PRIMARY KEY,
    client_id     TEXT NOT NULL,
    event_type    TEXT NOT NULL,
    payload       TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL
);

CREATE INDEX webhook_events_by_client ON webhook_events (client_id, created_at_ms);

CREATE TABLE webhook_deliveries (
    endpoint_id        TEXT NOT NULL REFERENCES webhook_endpoints (endpoint_id),
    event_id           TEXT NOT NULL REFERENCES webhook_events (event_id),
    state              TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'undelivered')),
    -- Attempts claimed so far (each claim numbers one), and failures in the current round of the
    -- retry schedule (a manual redelivery starts a new round).
    attempts           BIGINT NOT NULL,
    schedule_step      BIGINT NOT NULL,
    next_attempt_at_ms BIGINT NOT NULL,
    -- The sender working on it, until when; another sender may take it over after that.
    claim_token        TEXT,
    claimed_until_ms   BIGINT,
    created_at_ms      BIGINT NOT NULL,
    updated_at_ms      BIGINT NOT NULL,
    PRIMARY KEY (endpoint_id, event_id)
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, next_attempt_at_ms);
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, state, next_attempt_at_ms);

CREATE TABLE webhook_attempts (
    endpoint_id   TEXT NOT NULL,
    event_id      TEXT NOT NULL,
    attempt       BIGINT NOT NULL,
    started_at_ms BIGINT NOT NULL,
    duration_ms   BIGINT NOT NULL,
    -- The recipient's HTTP status, when it answered.
    status_code   BIGINT,
    outcome       TEXT NOT NULL CHECK (outcome IN ('delivered', 'failed')),
    error         TEXT,
    PRIMARY KEY (endpoint_id, event_id, attempt),
    FOREIGN KEY (endpoint_id, event_id) REFERENCES webhook_deliveries (endpoint_id, event_id)
);
