-- A step's when and acceptance conditions and the step it is the fallback
-- for (profiles as documents), as one JSON object: the engine reads them
-- with the step and no query filters on them.
ALTER TABLE provision_steps ADD COLUMN rules TEXT NOT NULL DEFAULT '{}';
