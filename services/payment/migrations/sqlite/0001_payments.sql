-- One row per payment, written in the same transaction that completes its idempotency key.
CREATE TABLE payments (
    payment_id      TEXT PRIMARY KEY,
    order_id        TEXT NOT NULL,
    amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
    currency        TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('approved', 'declined')),
    bank_charge_id  TEXT NOT NULL,
    decline_reason  TEXT,
    created_at      TEXT NOT NULL
);
