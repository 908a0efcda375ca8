-- One row per (scope, key): the unique primary key makes a repeat collide instead of executing.
CREATE TABLE idempotency_keys (
    scope           TEXT    NOT NULL, -- the client the key belongs to
    idempotency_key TEXT    NOT NULL,
    fingerprint     TEXT    NOT NULL, -- SHA-256 of the request; another request under the key is refused
    state           TEXT    NOT NULL CHECK (state IN ('in_flight', 'completed')),
    recovery_point  TEXT    NOT NULL, -- the last atomic phase committed
    resource_id     TEXT,             -- what the phases created (e.g. the order id)
    lock_token      BIGINT  NOT NULL, -- the current holder; phases commit only with it
    locked_until    BIGINT  NOT NULL, -- ms since the epoch; after it the lease can be taken over
    response_code   BIGINT,           -- the stored answer (gRPC code), once completed
    response_body   BLOB,
    created_at      BIGINT  NOT NULL,
    expires_at      BIGINT  NOT NULL,
    PRIMARY KEY (scope, idempotency_key)
);

CREATE INDEX idempotency_keys_expiry ON idempotency_keys (expires_at);
