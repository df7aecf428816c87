-- The built-in templates' artifacts. Their root file systems, each
-- definition built once and published to the chunk store: every host of
-- the cluster pulls the same bytes into the same path, so a checkpoint
-- taken on one host restores against the same files on another. And their
-- warm images, one per warm key (runtime, agent, boot configuration): a
-- host pulls the image instead of booting its own, and the images written
-- over it (snapshots, paused sandboxes) share one base on every host. The
-- first host to publish wins. The roots are live for the store's
-- collection.
CREATE TABLE builtin_templates (
    name       text NOT NULL,
    definition text NOT NULL,
    root       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, definition)
);

CREATE TABLE builtin_warm_images (
    name       text NOT NULL,
    warm_key   text NOT NULL,
    root       text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, warm_key)
);
