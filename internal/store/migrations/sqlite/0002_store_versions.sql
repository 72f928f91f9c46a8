-- Named version counters. A writer bumps a counter in the transaction that
-- changes what it counts; a reader compares the number it read with the one
-- its cached copy was made at. The store knows no names: each is owned by
-- the package that bumps and reads it (store/dirversion's "directory").
CREATE TABLE store_versions (
    name    TEXT PRIMARY KEY,
    version BIGINT NOT NULL
);
