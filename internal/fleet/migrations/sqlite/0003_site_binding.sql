-- A site token is a join token of role site bound to one site: the site
-- agent that joins with it (and its certificate, through its node) acts
-- for that site only. '' for every other token and node.
ALTER TABLE join_tokens ADD COLUMN site_id TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN site_id TEXT NOT NULL DEFAULT '';
