-- Custom templates: the template host publishes each build it finishes
-- (its artifact: layers and warm image in the chunk store) before the
-- build reports ready; every host finds a team's template here by id,
-- name or name:tag. The roots are live for the store's collection.
CREATE TABLE template_builds (
    build_id    text PRIMARY KEY,
    team        text NOT NULL,
    template_id text NOT NULL,
    names       text[] NOT NULL,
    tags        text[] NOT NULL,
    runtime     text NOT NULL,
    roots       text[] NOT NULL,
    artifact    jsonb NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX template_builds_template ON template_builds (team, template_id);
