-- Keys whose work is half-done (past the first phase, not completed), for the completer that
-- settles them: few rows among many, so a partial index keeps its query off the whole table.
CREATE INDEX idempotency_keys_unsettled ON idempotency_keys (created_at)
    WHERE state = 'in_flight' AND recovery_point <> 'started';
