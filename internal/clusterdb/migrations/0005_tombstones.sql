-- A sandbox's row, once deleted (it ended), leaves its id here for a
-- while: a host that was away and still holds the sandbox (it moved to
-- another host meanwhile and ended there) must drop its copy, not write
-- the row back. Pruned after 30 days (clusterdb.PruneTombstones).
CREATE TABLE sandbox_tombstones (
    id text PRIMARY KEY,
    at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sandbox_tombstones_at ON sandbox_tombstones (at);
