-- The labels a node had when the atoms reconciler last placed it: a label
-- change that keeps the node in its pool (a dedicated taint, a shape) must
-- still reach the placer's index, so the reconciler compares them.
ALTER TABLE node_pools ADD COLUMN labels TEXT NOT NULL DEFAULT '';
