-- A draft's category (issue 41), for kinds with `rotate_by = "category"`:
-- the pick takes the category published least recently first. Nullable
-- (no category is a group of its own); adding a nullable column without a
-- default rewrites nothing and holds the table's lock only for a moment.
ALTER TABLE draft ADD COLUMN category text;
