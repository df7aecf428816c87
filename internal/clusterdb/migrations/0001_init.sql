-- cellfork cluster state, version 1.

-- The cluster's secrets: the key gateways sign internal calls with, and
-- the keys sandbox access tokens are derived from (newest first).
CREATE TABLE cluster (
    id           int PRIMARY KEY DEFAULT 1 CHECK (id = 1),
    internal_key bytea NOT NULL,
    token_keys   bytea[] NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Regions: each has gateways (gateway_url is how other regions forward to
-- them) and a domain ({port}-{id}.{domain} hosts). groups are what
-- location policies name besides regions (a country, a continent).
CREATE TABLE regions (
    id          int PRIMARY KEY CHECK (id >= 0 AND id < 1024),
    name        text NOT NULL UNIQUE,
    groups      text[] NOT NULL DEFAULT '{}',
    gateway_url text NOT NULL DEFAULT '',
    domain      text NOT NULL DEFAULT ''
);

-- Host slots are never reused: an old id never routes to another machine.
CREATE SEQUENCE host_slots MINVALUE 1 MAXVALUE 32767 NO CYCLE;

CREATE TABLE hosts (
    slot          int PRIMARY KEY,
    name          text NOT NULL UNIQUE,      -- the host's identity, kept in its data dir
    region        int NOT NULL REFERENCES regions(id),
    addr          text NOT NULL,             -- host:port gateways call
    state         text NOT NULL DEFAULT 'active' CHECK (state IN ('active', 'cordoned', 'draining', 'lost')),
    epoch         bigint NOT NULL DEFAULT 1, -- bumped when declared lost
    heartbeat_at  timestamptz NOT NULL DEFAULT now(),
    lease_until   timestamptz NOT NULL DEFAULT now(),
    cpus          int NOT NULL DEFAULT 0,
    mem_total_mb  bigint NOT NULL DEFAULT 0,
    mem_alloc_mb  bigint NOT NULL DEFAULT 0, -- reported, plus reservations since
    disk_free_mb  bigint NOT NULL DEFAULT 0,
    start_queue   int NOT NULL DEFAULT 0,
    versions      jsonb NOT NULL DEFAULT '{}', -- runsc, agent, build
    cpu_features  text[] NOT NULL DEFAULT '{}',
    capacity      jsonb NOT NULL DEFAULT '{}', -- pool per template, standbys, images
    updated_at    timestamptz NOT NULL DEFAULT now()
);

-- Teams: max_sandboxes bounds running sandboxes (0 = no bound); regions
-- are where its sandboxes may live (names or groups; empty = anywhere).
CREATE TABLE teams (
    id             text PRIMARY KEY,
    name           text NOT NULL DEFAULT '',
    max_sandboxes  int NOT NULL DEFAULT 0,
    running        int NOT NULL DEFAULT 0,
    regions        text[] NOT NULL DEFAULT '{}',
    default_region text NOT NULL DEFAULT '',
    created_at     timestamptz NOT NULL DEFAULT now()
);

-- API keys, stored as their SHA-256; regions narrow the team's.
CREATE TABLE api_keys (
    hash       bytea PRIMARY KEY,
    team       text NOT NULL REFERENCES teams(id) ON DELETE CASCADE,
    name       text NOT NULL DEFAULT '',
    regions    text[] NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- Sandboxes: where each lives (home_slot is the one in its id; host_slot
-- where it is now: they differ once it moved), and what a list shows.
-- generation fences every transition that could make a second live copy.
CREATE TABLE sandboxes (
    id          text PRIMARY KEY,
    team        text NOT NULL,
    region      int NOT NULL,
    home_slot   int NOT NULL,
    host_slot   int NOT NULL,
    generation  bigint NOT NULL DEFAULT 1,
    state       text NOT NULL CHECK (state IN ('creating', 'running', 'paused', 'lost')),
    memory_mb   int NOT NULL DEFAULT 0,
    template_id text NOT NULL DEFAULT '',
    started_at  timestamptz NOT NULL DEFAULT now(),
    end_at      timestamptz NOT NULL DEFAULT now(),
    metadata    jsonb NOT NULL DEFAULT '{}',
    doc         jsonb NOT NULL DEFAULT '{}', -- the record's listed fields
    updated_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX sandboxes_team_started ON sandboxes (team, started_at, id);
CREATE INDEX sandboxes_host ON sandboxes (host_slot);
CREATE INDEX sandboxes_moved ON sandboxes (id) WHERE host_slot <> home_slot;

CREATE TABLE snapshots (
    id         text PRIMARY KEY,
    team       text NOT NULL,
    region     int NOT NULL,
    host_slot  int NOT NULL,
    sandbox_id text NOT NULL,
    names      text[] NOT NULL DEFAULT '{}',
    doc        jsonb NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX snapshots_team ON snapshots (team, created_at, id);

-- A team's running count, kept by the database in the same statement as
-- the row: a create over the bound fails atomically, whichever gateway
-- places it.
CREATE FUNCTION counts(state text) RETURNS boolean LANGUAGE sql IMMUTABLE AS
$$ SELECT state IN ('creating', 'running') $$;

CREATE FUNCTION sandboxes_count() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    delta int := 0;
    t text;
BEGIN
    IF TG_OP = 'INSERT' THEN
        t := NEW.team;
        IF counts(NEW.state) THEN delta := 1; END IF;
    ELSIF TG_OP = 'DELETE' THEN
        t := OLD.team;
        IF counts(OLD.state) THEN delta := -1; END IF;
    ELSE
        t := NEW.team;
        IF counts(NEW.state) AND NOT counts(OLD.state) THEN delta := 1;
        ELSIF counts(OLD.state) AND NOT counts(NEW.state) THEN delta := -1;
        END IF;
    END IF;
    IF delta > 0 THEN
        UPDATE teams SET running = running + 1
            WHERE id = t AND (max_sandboxes = 0 OR running < max_sandboxes);
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM teams WHERE id = t) THEN
                RAISE EXCEPTION 'team % is at its limit of running sandboxes', t USING ERRCODE = 'CF001';
            END IF;
            RAISE EXCEPTION 'team % does not exist', t USING ERRCODE = 'CF002';
        END IF;
    ELSIF delta < 0 THEN
        UPDATE teams SET running = greatest(running - 1, 0) WHERE id = t;
    END IF;
    IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER sandboxes_count AFTER INSERT OR UPDATE OF state OR DELETE ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION sandboxes_count();

-- Gateways keep an in-memory map of sandboxes that left their home host,
-- and the host table: told of changes, rare, by NOTIFY.
CREATE FUNCTION sandboxes_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        IF OLD.host_slot <> OLD.home_slot THEN
            PERFORM pg_notify('cellfork_moved', OLD.id || ':' || OLD.home_slot);
        END IF;
        RETURN OLD;
    END IF;
    IF TG_OP = 'INSERT' AND NEW.host_slot = NEW.home_slot THEN RETURN NEW; END IF;
    IF TG_OP = 'UPDATE' AND NEW.host_slot = OLD.host_slot THEN RETURN NEW; END IF;
    PERFORM pg_notify('cellfork_moved', NEW.id || ':' || NEW.host_slot);
    RETURN NEW;
END $$;

CREATE TRIGGER sandboxes_moved AFTER INSERT OR UPDATE OF host_slot OR DELETE ON sandboxes
    FOR EACH ROW EXECUTE FUNCTION sandboxes_moved();

CREATE FUNCTION hosts_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.state <> OLD.state OR NEW.addr <> OLD.addr OR NEW.epoch <> OLD.epoch THEN
        PERFORM pg_notify('cellfork_hosts', NEW.slot::text);
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER hosts_changed AFTER INSERT OR UPDATE ON hosts
    FOR EACH ROW EXECUTE FUNCTION hosts_changed();

CREATE FUNCTION keys_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('cellfork_keys', '');
    RETURN NULL;
END $$;

CREATE TRIGGER keys_changed AFTER UPDATE OR DELETE ON api_keys
    FOR EACH STATEMENT EXECUTE FUNCTION keys_changed();
-- Not on running's every change: only what the gateways cache.
CREATE TRIGGER teams_changed AFTER UPDATE OF max_sandboxes, regions, default_region OR DELETE ON teams
    FOR EACH STATEMENT EXECUTE FUNCTION keys_changed();
