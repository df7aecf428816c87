package clusterdb

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Host is a host's row.
type Host struct {
	Slot        int               `json:"slot"`
	Name        string            `json:"name"`
	Region      int               `json:"region"`
	Addr        string            `json:"addr"`
	State       string            `json:"state"` // active, cordoned, draining, lost
	Epoch       int64             `json:"epoch"`
	HeartbeatAt time.Time         `json:"heartbeatAt"`
	LeaseUntil  time.Time         `json:"leaseUntil"`
	CPUs        int               `json:"cpus"`
	MemTotalMB  int64             `json:"memTotalMB"`
	MemAllocMB  int64             `json:"memAllocMB"`
	DiskFreeMB  int64             `json:"diskFreeMB"`
	StartQueue  int               `json:"startQueue"`
	Versions    map[string]string `json:"versions"`
	CPUFeatures []string          `json:"cpuFeatures"`
	Capacity    Capacity          `json:"capacity"`
	UpdatedAt   time.Time         `json:"updatedAt"`
}

// Capacity is what a host keeps ready and holds: placement prefers a host
// with what a create needs at hand.
type Capacity struct {
	Ready     map[string]int `json:"ready"`     // ready sandboxes per template
	Standbys  []string       `json:"standbys"`  // snapshots with a standby ready
	Images    []string       `json:"images"`    // snapshots whose image it has
	Sandboxes int            `json:"sandboxes"` // live sandboxes
	Pending   int            `json:"pending"`   // creates in flight
}

// Register adds a host by name, or finds it again (same slot: a slot is
// never given to another host), and returns its slot and epoch. A host
// that comes back is active again under the epoch its loss bumped, so its
// old lease can no longer heartbeat.
func (db *DB) Register(ctx context.Context, name string, region int, addr string) (slot int, epoch int64, err error) {
	err = db.pool.QueryRow(ctx, `INSERT INTO hosts (slot, name, region, addr, heartbeat_at, lease_until)
		VALUES (nextval('host_slots'), $1, $2, $3, now(), now())
		ON CONFLICT (name) DO UPDATE SET addr = $3, region = $2, heard_since = now(),
			state = CASE WHEN hosts.state = 'lost' THEN 'active' ELSE hosts.state END
		RETURNING slot, epoch`, name, region, addr).Scan(&slot, &epoch)
	return slot, epoch, unavailable(err)
}

// Heartbeat renews a host's lease for ttl and reports its capacity. It
// fails with ErrFenced once the host was declared lost (its epoch moved
// on): the host must register again and reconcile.
func (db *DB) Heartbeat(ctx context.Context, h Host, ttl time.Duration) error {
	versions, _ := json.Marshal(h.Versions)
	capacity, _ := json.Marshal(h.Capacity)
	if h.CPUFeatures == nil {
		h.CPUFeatures = []string{}
	}
	// mem_alloc: what the host reports, plus what gateways reserved for
	// creates that have not reached it yet (reservations are counted in
	// Capacity.Pending by the host once they arrive).
	tag, err := db.pool.Exec(ctx, `UPDATE hosts SET heartbeat_at = now(), lease_until = now() + $3 * interval '1 millisecond',
			heard_since = CASE WHEN lease_until < now() THEN now() ELSE heard_since END,
			cpus = $4, mem_total_mb = $5, mem_alloc_mb = $6, disk_free_mb = $7, start_queue = $8,
			versions = $9, cpu_features = $10, capacity = $11, updated_at = now()
		WHERE slot = $1 AND epoch = $2 AND state <> 'lost'`,
		h.Slot, h.Epoch, ttl.Milliseconds(), h.CPUs, h.MemTotalMB, h.MemAllocMB, h.DiskFreeMB, h.StartQueue,
		versions, h.CPUFeatures, capacity)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrFenced
	}
	return nil
}

const hostColumns = `slot, name, region, addr, state, epoch, heartbeat_at, lease_until, cpus, mem_total_mb, mem_alloc_mb,
	disk_free_mb, start_queue, versions, cpu_features, capacity, updated_at`

// Silent reports whether h's lease ran out (it may not be declared lost
// yet): its rows may lag what it did.
func (h Host) Silent() bool { return !h.LeaseUntil.After(time.Now()) }

func scanHost(r pgx.CollectableRow) (Host, error) {
	var h Host
	var versions, capacity []byte
	err := r.Scan(&h.Slot, &h.Name, &h.Region, &h.Addr, &h.State, &h.Epoch, &h.HeartbeatAt, &h.LeaseUntil, &h.CPUs,
		&h.MemTotalMB, &h.MemAllocMB, &h.DiskFreeMB, &h.StartQueue, &versions, &h.CPUFeatures, &capacity, &h.UpdatedAt)
	if err == nil {
		_ = json.Unmarshal(versions, &h.Versions)
		_ = json.Unmarshal(capacity, &h.Capacity)
	}
	return h, err
}

// Hosts returns the hosts updated at or after since (the zero time: all).
func (db *DB) Hosts(ctx context.Context, since time.Time) ([]Host, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+hostColumns+` FROM hosts WHERE updated_at >= $1 ORDER BY slot`, since)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, scanHost)
}

// SetHostState cordons (no new sandboxes), drains (no new sandboxes, and
// the host's own are waited for) or reactivates a host.
func (db *DB) SetHostState(ctx context.Context, slot int, state string) error {
	tag, err := db.pool.Exec(ctx, `UPDATE hosts SET state = $2, updated_at = now() WHERE slot = $1 AND state <> 'lost'`, slot, state)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return errors.New("no such host, or it is lost")
	}
	return nil
}

// SweepLost declares lost the hosts whose lease ran out while another host
// kept heartbeating for grace more, counted from the later of that lease's
// end and the start of the other host's run of heartbeats (heard_since).
// A database outage stops every heartbeat and ends every run, so it never
// declares the fleet lost: once the database is back, each host has grace,
// longer than its heartbeat interval, to be heard again, whichever host is
// heard first. It bumps the lost hosts' epoch and marks their running
// sandboxes lost. One sweeper at a time (an advisory lock); it returns the
// slots declared lost.
func (db *DB) SweepLost(ctx context.Context, grace time.Duration) ([]int, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	defer tx.Rollback(ctx)
	var got bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(727002)`).Scan(&got); err != nil || !got {
		return nil, unavailable(err)
	}
	rows, err := tx.Query(ctx, `UPDATE hosts h SET state = 'lost', epoch = epoch + 1, updated_at = now()
		WHERE state <> 'lost' AND lease_until < now()
		  AND EXISTS (SELECT 1 FROM hosts o WHERE o.slot <> h.slot
		      AND o.heartbeat_at > greatest(h.lease_until, o.heard_since) + $1 * interval '1 millisecond')
		RETURNING slot`, grace.Milliseconds())
	if err != nil {
		return nil, unavailable(err)
	}
	lost, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		return nil, err
	}
	if len(lost) > 0 {
		if _, err := tx.Exec(ctx, `UPDATE sandboxes SET state = 'lost', updated_at = now()
			WHERE host_slot = ANY($1) AND state IN ('creating', 'running')`, lost); err != nil {
			return nil, err
		}
	}
	return lost, unavailable(tx.Commit(ctx))
}
