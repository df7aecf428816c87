-- When a host's current run of heartbeats began: a heartbeat that comes
-- after the host's lease ran out starts a new run. A host is declared lost
-- only once another host has been heard for the grace since both its own
-- run began and the lost host's lease ran out, so that after a database
-- outage (every run ends) each host has the grace to be heard again.
ALTER TABLE hosts ADD COLUMN heard_since timestamptz NOT NULL DEFAULT now();
