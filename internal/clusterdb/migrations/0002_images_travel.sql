-- Snapshots that travel: a snapshot's (and a paused sandbox's) image in
-- the chunk store, named by its manifest's root, with the runsc build that
-- wrote it and the host's record another host restores it from.
ALTER TABLE snapshots
    ADD COLUMN store_root text NOT NULL DEFAULT '',
    ADD COLUMN runtime    text NOT NULL DEFAULT '',
    ADD COLUMN record     jsonb NOT NULL DEFAULT '{}';
ALTER TABLE sandboxes
    ADD COLUMN store_root text NOT NULL DEFAULT '',
    ADD COLUMN runtime    text NOT NULL DEFAULT '',
    ADD COLUMN record     jsonb NOT NULL DEFAULT '{}';
