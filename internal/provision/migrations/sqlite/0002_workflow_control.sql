-- An operator pauses, resumes and retries workflows. pause_time is when a
-- paused workflow was paused: a resume moves its in-flight step's deadline
-- on by the time it spent paused, since a paused workflow's deadlines do
-- not fail it. restarts counts the retries from a step. The state CHECK
-- already allows 'paused', and a retried step goes back to 'pending', so no
-- CHECK changes and no table rebuild.
ALTER TABLE provision_workflows ADD COLUMN pause_time TIMESTAMP;
ALTER TABLE provision_workflows ADD COLUMN restarts INTEGER NOT NULL DEFAULT 0;
