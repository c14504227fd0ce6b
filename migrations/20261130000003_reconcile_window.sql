-- The reconciler reads only the planned slots due in each kind's window
-- (starting_deadline plus a margin before now), never all history: this
-- index serves "kind = $k AND due_at in (since, now]". Contracts: README
-- "Reconciler".
CREATE INDEX planned_slot_kind_due ON planned_slot (kind, due_at);
