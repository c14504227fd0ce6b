-- Drafts that live in a CMS (WordPress posts in a kind's `drafts` status),
-- mirrored into `draft` by `planner drafts sync` and by the worker before a
-- WordPress kind's gate. `cms_id` is the post's id at the CMS; one row per
-- post and kind, so a sync upserts instead of adding a second row for a
-- post it has seen before. Drafts added to slotgate itself have no cms_id.
ALTER TABLE draft ADD COLUMN cms_id bigint;
CREATE UNIQUE INDEX draft_cms_post ON draft (kind, cms_id) WHERE cms_id IS NOT NULL;
