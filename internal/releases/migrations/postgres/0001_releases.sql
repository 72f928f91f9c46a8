-- Published bcd releases: the platform's. manifest is the signed envelope
-- exactly as it was uploaded; platforms is the comma-separated list of the
-- platforms it carries a binary for.
CREATE TABLE releases (
    version                   TEXT PRIMARY KEY,
    min_control_plane_version TEXT NOT NULL,
    manifest                  TEXT NOT NULL,
    platforms                 TEXT NOT NULL,
    key_id                    TEXT NOT NULL,
    created_by                TEXT NOT NULL,
    create_time               TIMESTAMPTZ NOT NULL
);

-- A release's binaries and SBOMs. Their bytes live in the blob store (the
-- image catalog's) under sha256/<hex>; a blob goes when neither a release
-- file nor an image names it.
CREATE TABLE release_files (
    version    TEXT NOT NULL REFERENCES releases (version) ON DELETE CASCADE,
    name       TEXT NOT NULL,
    platform   TEXT NOT NULL CHECK (platform IN ('linux-amd64', 'linux-arm64')),
    kind       TEXT NOT NULL CHECK (kind IN ('binary', 'sbom')),
    sha256     TEXT NOT NULL,
    size_bytes BIGINT NOT NULL CHECK (size_bytes > 0),
    PRIMARY KEY (version, name),
    UNIQUE (version, platform, kind)
);
CREATE INDEX release_files_sha256 ON release_files (sha256);
