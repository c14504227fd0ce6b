-- `planned_slot_due (due_at)` is read by no statement: the reconciler's
-- window reads `planned_slot_kind_due (kind, due_at)`, the report and the
-- gate read the primary key. Every planned slot still paid for it: a
-- `COPY` of 1,000,000 planned rows into a copy of the table took 5.4 s
-- without it against 7.0 s with it (4.8 s against 6.0 s on a second try;
-- docs/BENCHMARKS.md, "One index less on the plan").
DROP INDEX IF EXISTS planned_slot_due;
