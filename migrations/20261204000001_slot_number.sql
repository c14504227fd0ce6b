-- The number each configured local time of a kind carries, for good
-- (issue 26.2). Before this table a slot's number was its position in the
-- kind's `slots` list, so inserting "09:00" before "12:00" re-keyed 12:00
-- as slot 2 and gave today's already-run 12:00 a second run (and 09:00
-- none). Now a time keeps the number it was first given; a new time takes
-- the kind's highest number + 1; a removed time keeps its row (its number
-- is never reused, and comes back if the time does).
--
-- `occurrence` tells apart a time listed twice (two slots at 09:00): the
-- first listing is 1, the second 2. A kind's first numbering takes the
-- list's positions, so every key planned before this table stays valid.
CREATE TABLE slot_number (
    kind        text        NOT NULL,
    local_time  time        NOT NULL,
    occurrence  integer     NOT NULL CHECK (occurrence >= 1),
    slot        integer     NOT NULL CHECK (slot >= 1),
    created_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (kind, local_time, occurrence),
    UNIQUE (kind, slot)
);
