-- no-transaction
-- The pick's index in the pick's order (kind, priority DESC, ready_at,
-- id) over ready drafts only, built without blocking writers: the gate
-- reads the first `n` entries of a kind and locks them SKIP LOCKED. The
-- old `draft_pick` (kind, ready_at, id) is left in place; dropping it
-- would take a lock on a hot table for no correctness gain.
CREATE INDEX CONCURRENTLY IF NOT EXISTS draft_pick_priority ON draft (kind, priority DESC, ready_at, id) WHERE status = 'ready';
