-- One row per order. The idempotency key is unique per client, so a repeated create finds the
-- order it already made instead of making a second one.
CREATE TABLE orders (
    order_id            TEXT PRIMARY KEY,
    client_id           TEXT NOT NULL,
    idempotency_key     TEXT NOT NULL,
    -- SHA-256 of the request: a reused key with another request is refused.
    request_fingerprint TEXT NOT NULL,
    customer_id         TEXT NOT NULL,
    items               TEXT NOT NULL, -- JSON array of {"sku", "quantity"}
    amount_minor        INTEGER NOT NULL CHECK (amount_minor > 0),
    currency            TEXT NOT NULL,
    status              TEXT NOT NULL CHECK (status IN ('pending_payment', 'paid', 'payment_declined')),
    payment_id          TEXT,
    bank_charge_id      TEXT,
    decline_reason      TEXT,
    created_at          TEXT NOT NULL,
    UNIQUE (client_id, idempotency_key)
);
