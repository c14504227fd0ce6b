-- One gate: the batch path's plpgsql functions are replaced by set-based
-- statements in Rust (shared/src/store.rs, "the gate, set-based"), which
-- both delivery paths use; a single delivery is a batch of one. The gate
-- state machine and the execution upsert now exist once. Why, and the
-- measurements behind the choice: docs/DESIGN.md, "The gate".
DROP FUNCTION IF EXISTS slotgate_gate_batch(text[], text[], date[], integer[], text[], text[], boolean[],
                                           bigint[], integer[], timestamptz[], boolean[],
                                           text, bigint, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS slotgate_finish_batch(jsonb, text, bigint, timestamptz);
