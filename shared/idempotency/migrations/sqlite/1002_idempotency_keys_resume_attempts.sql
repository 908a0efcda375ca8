-- How many times a completer took the key over to resume it: a key whose resumes keep failing is
-- parked at the completer's limit, left for an operator instead of being tried for ever, and the
-- completer takes the keys tried least first. A constant default adds the column without
-- rewriting the table.
ALTER TABLE idempotency_keys ADD COLUMN resume_attempts BIGINT NOT NULL DEFAULT 0;
