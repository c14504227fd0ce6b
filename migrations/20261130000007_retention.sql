-- Retention (`planner prune`): old execution rows are deleted in small
-- batches by start time, so each batch must find its rows through an index
-- rather than scan the table.
CREATE INDEX execution_started ON execution (started_at);
