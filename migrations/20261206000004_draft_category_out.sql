-- no-transaction
-- A rotating kind's pick asks, per category, when it last published:
-- max(published_at) over the kind's published drafts of that category,
-- one index look-up each. Built without blocking writers.
CREATE INDEX CONCURRENTLY IF NOT EXISTS draft_category_out ON draft (kind, category, published_at) WHERE status = 'published';
