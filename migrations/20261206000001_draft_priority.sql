-- A draft's priority (issue 41): the gate picks the highest priority
-- first, then the oldest ready, then the lowest id. A constant default
-- adds the column without rewriting the table (Postgres 11+), so existing
-- drafts are priority 0 and keep today's order among themselves.
ALTER TABLE draft ADD COLUMN priority integer NOT NULL DEFAULT 0;
