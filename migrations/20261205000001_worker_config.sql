-- The config fingerprint each worker runs with (issue 39): a worker on an
-- old config and a planner on a new one dead-lettered each other's slots in
-- a loop, and a mixed `redis_partitions` fleet ran every slot only through
-- the reconciler, with nothing in `planner status` to say why. Each worker
-- stores its fingerprint with its clock measurement; `planner status` and
-- the console compare it with their own. A nullable column: adding it
-- rewrites nothing and takes no lock worth naming (worker_clock is a small
-- table no delivery touches).
ALTER TABLE worker_clock ADD COLUMN config text;
