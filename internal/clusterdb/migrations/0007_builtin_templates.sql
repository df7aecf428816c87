-- The built-in templates' root file systems, each definition built once
-- and published to the chunk store: every host of the cluster pulls the
-- same bytes into the same path, so a checkpoint taken on one host
-- restores against the same files on another. The first host to publish
-- a definition wins. The roots are live for the store's collection.
CREATE TABLE builtin_templates (
    name       text NOT NULL,
    definition text NOT NULL,
    root       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, definition)
);
