-- The shared chunk store is collected by one host per round: a round is
-- claimed by moving its row's ran_at (jobs), and the roots it keeps are
-- the rows' store_root (partial indexes: most rows name none).
CREATE TABLE jobs (
    name   text PRIMARY KEY,
    holder integer NOT NULL,
    ran_at timestamptz NOT NULL
);
CREATE INDEX sandboxes_store_root ON sandboxes (store_root) WHERE store_root <> '';
CREATE INDEX snapshots_store_root ON snapshots (store_root) WHERE store_root <> '';
