-- Labels a node reports about itself (inventory section "labels": its
-- Kubernetes Node's, under the prefixes bcd was told to report). Pool
-- selectors see them beside the join token's labels (nodes.labels), which
-- win on a shared key.
ALTER TABLE nodes ADD COLUMN reported_labels TEXT NOT NULL DEFAULT '{}';
