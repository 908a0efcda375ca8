-- The version of the order's state, grown by one at each change of state (created: 1, then paid
-- or declined: 2): the `version` of the order's webhook events, by which a receiver keeps the
-- latest of events that can arrive out of order.
ALTER TABLE orders ADD COLUMN version BIGINT NOT NULL DEFAULT 1;
UPDATE orders SET version = 2 WHERE status <> 'pending_payment';
