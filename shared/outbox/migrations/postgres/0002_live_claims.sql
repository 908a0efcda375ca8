-- A claim counts the endpoint's live claims (claimed_until_ms in the future) against its
-- max_in_flight: this keeps that count to the few live rows instead of every delivery of the
-- endpoint.
CREATE INDEX webhook_deliveries_live_claims ON webhook_deliveries (endpoint_id, claimed_until_ms);
