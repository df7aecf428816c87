package clusterdb

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// Sandbox is a sandbox's row.
type Sandbox struct {
	ID         string            `json:"id"`
	Team       string            `json:"team"`
	Region     int               `json:"region"`
	HomeSlot   int               `json:"homeSlot"`
	HostSlot   int               `json:"hostSlot"`
	Generation int64             `json:"generation"`
	State      string            `json:"state"` // creating, running, paused, lost
	MemoryMB   int               `json:"memoryMB"`
	TemplateID string            `json:"templateID"`
	StartedAt  time.Time         `json:"startedAt"`
	EndAt      time.Time         `json:"endAt"`
	Metadata   map[string]string `json:"metadata"`
	// Doc is what a list shows of it (E2B's ListedSandbox), as its host
	// wrote it.
	Doc json.RawMessage `json:"doc"`
	// StoreRoot names a paused sandbox's image in the chunk store ("":
	// running, or its image is only on its host); Runtime is the runsc
	// build of its host. Record is its host's record of it, from which
	// another host resumes it (read by GetRecord only).
	StoreRoot string          `json:"storeRoot,omitempty"`
	Runtime   string          `json:"runtime,omitempty"`
	Record    json.RawMessage `json:"-"`
}

// Reserve places a new sandbox on a host: its memory is taken from the
// host's free memory and its row inserted (state creating), in one
// transaction, or neither. ErrNoCapacity: the host has no room (or is not
// active, or its lease ran out); ErrTeamLimit: the team is at its bound;
// ErrNoTeam.
func (db *DB) Reserve(ctx context.Context, s Sandbox, reserveMB int64) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE hosts SET mem_alloc_mb = mem_alloc_mb + $2
		WHERE slot = $1 AND state = 'active' AND lease_until > now() AND mem_alloc_mb + $2 <= mem_total_mb - $3`,
		s.HostSlot, s.MemoryMB, reserveMB)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNoCapacity
	}
	if err := insertSandbox(ctx, tx, s, "creating"); err != nil {
		return err
	}
	return unavailable(tx.Commit(ctx))
}

func insertSandbox(ctx context.Context, tx pgx.Tx, s Sandbox, state string) error {
	meta, _ := json.Marshal(orEmpty(s.Metadata))
	doc := s.Doc
	if doc == nil {
		doc = json.RawMessage("{}")
	}
	_, err := tx.Exec(ctx, `INSERT INTO sandboxes (id, team, region, home_slot, host_slot, state, memory_mb, template_id,
			started_at, end_at, metadata, doc, store_root, runtime, record)
		VALUES ($1, $2, $3, $4, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)`,
		s.ID, s.Team, s.Region, s.HostSlot, state, s.MemoryMB, s.TemplateID, s.StartedAt, s.EndAt, meta, []byte(doc),
		s.StoreRoot, s.Runtime, []byte(orJSON(s.Record)))
	return teamError(err)
}

func teamError(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "CF001":
			return ErrTeamLimit
		case "CF002":
			return ErrNoTeam
		case "23505":
			return errdefs.New(errdefs.ErrAlreadyExists, "a sandbox with this id exists")
		}
	}
	return unavailable(err)
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// Release undoes a reservation whose create failed: the row (still
// creating) goes and the host gets its memory back.
func (db *DB) Release(ctx context.Context, id string, slot, memoryMB int) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `DELETE FROM sandboxes WHERE id = $1 AND host_slot = $2 AND state = 'creating'`, id, slot)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() > 0 {
		if _, err := tx.Exec(ctx, `UPDATE hosts SET mem_alloc_mb = greatest(mem_alloc_mb - $2, 0) WHERE slot = $1`, slot, memoryMB); err != nil {
			return unavailable(err)
		}
	}
	return unavailable(tx.Commit(ctx))
}

// Sync writes what host slot knows of a sandbox: its row is created (a
// fork child, a sandbox created on the host directly) or updated, but only
// while the row says it lives there; otherwise ErrStale (it moved on, and
// the host must drop its copy).
func (db *DB) Sync(ctx context.Context, s Sandbox) error {
	meta, _ := json.Marshal(orEmpty(s.Metadata))
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE sandboxes SET state = $3, memory_mb = $4, template_id = $5, started_at = $6,
			end_at = $7, metadata = $8, doc = $9, store_root = $10, runtime = $11, record = $12, updated_at = now()
		WHERE id = $1 AND host_slot = $2`,
		s.ID, s.HostSlot, s.State, s.MemoryMB, s.TemplateID, s.StartedAt, s.EndAt, meta, []byte(s.Doc),
		s.StoreRoot, s.Runtime, []byte(orJSON(s.Record)))
	if err != nil {
		return teamError(err)
	}
	if tag.RowsAffected() == 0 {
		// No row of this host's: another host's (it moved on), an ended
		// sandbox's (its tombstone), or none yet (written first now).
		var gone bool
		err := tx.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM sandboxes WHERE id = $1)
			OR EXISTS (SELECT 1 FROM sandbox_tombstones WHERE id = $1)`, s.ID).Scan(&gone)
		switch {
		case err != nil:
			return unavailable(err)
		case gone:
			return ErrStale
		}
		if err := insertSandbox(ctx, tx, s, s.State); err != nil {
			return err
		}
	}
	return unavailable(tx.Commit(ctx))
}

// ExpireCreating gives back the reservations of creates that never reached
// their host (a gateway that died mid create): rows still creating after
// age. It returns how many.
func (db *DB) ExpireCreating(ctx context.Context, age time.Duration) (int, error) {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return 0, unavailable(err)
	}
	defer tx.Rollback(ctx)
	rows, err := tx.Query(ctx, `DELETE FROM sandboxes WHERE state = 'creating' AND updated_at < now() - $1 * interval '1 millisecond'
		RETURNING host_slot, memory_mb`, age.Milliseconds())
	if err != nil {
		return 0, unavailable(err)
	}
	var slots, mems []int
	var s, m int
	if _, err := pgx.ForEachRow(rows, []any{&s, &m}, func() error { slots = append(slots, s); mems = append(mems, m); return nil }); err != nil {
		return 0, unavailable(err)
	}
	for i := range slots {
		if _, err := tx.Exec(ctx, `UPDATE hosts SET mem_alloc_mb = greatest(mem_alloc_mb - $2, 0) WHERE slot = $1`, slots[i], mems[i]); err != nil {
			return 0, unavailable(err)
		}
	}
	return len(slots), unavailable(tx.Commit(ctx))
}

// Forget deletes a sandbox's row, if host slot holds it.
func (db *DB) Forget(ctx context.Context, id string, slot int) error {
	_, err := db.pool.Exec(ctx, `WITH d AS (DELETE FROM sandboxes WHERE id = $1 AND host_slot = $2 RETURNING id)
		INSERT INTO sandbox_tombstones (id) SELECT id FROM d ON CONFLICT (id) DO NOTHING`, id, slot)
	return unavailable(err)
}

// PruneTombstones forgets the ids of sandboxes that ended more than age
// ago (see migrations/0005_tombstones.sql).
func (db *DB) PruneTombstones(ctx context.Context, age time.Duration) error {
	_, err := db.pool.Exec(ctx, `DELETE FROM sandbox_tombstones WHERE at < now() - $1 * interval '1 millisecond'`, age.Milliseconds())
	return unavailable(err)
}

// ForgetLost deletes the row of a sandbox whose host is lost, lost with it
// or paused (killing it, as far as the cluster can: its host is gone).
func (db *DB) ForgetLost(ctx context.Context, id, team string) (bool, error) {
	var n int
	err := db.pool.QueryRow(ctx, `WITH d AS (DELETE FROM sandboxes WHERE id = $1 AND team = $2 AND state IN ('lost', 'paused') RETURNING id),
		t AS (INSERT INTO sandbox_tombstones (id) SELECT id FROM d ON CONFLICT (id) DO NOTHING)
		SELECT count(*) FROM d`, id, team).Scan(&n)
	return n > 0, unavailable(err)
}

const sandboxColumns = `id, team, region, home_slot, host_slot, generation, state, memory_mb, template_id, started_at, end_at,
	metadata, doc, store_root, runtime`

func scanSandbox(r pgx.CollectableRow) (Sandbox, error) { return scanSandboxRow(r, false) }

// scanSandboxRecord scans sandboxColumns followed by record.
func scanSandboxRecord(r pgx.CollectableRow) (Sandbox, error) { return scanSandboxRow(r, true) }

func scanSandboxRow(r pgx.CollectableRow, withRecord bool) (Sandbox, error) {
	var s Sandbox
	var meta []byte
	dst := []any{&s.ID, &s.Team, &s.Region, &s.HomeSlot, &s.HostSlot, &s.Generation, &s.State, &s.MemoryMB,
		&s.TemplateID, &s.StartedAt, &s.EndAt, &meta, &s.Doc, &s.StoreRoot, &s.Runtime}
	if withRecord {
		dst = append(dst, &s.Record)
	}
	err := r.Scan(dst...)
	if err == nil {
		_ = json.Unmarshal(meta, &s.Metadata)
	}
	return s, err
}

// GetSandbox returns a sandbox's row.
func (db *DB) GetSandbox(ctx context.Context, id string) (Sandbox, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1`, id)
	if err != nil {
		return Sandbox{}, unavailable(err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSandbox)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return s, unavailable(err)
}

// GetRecord returns a sandbox's row with the record its host published.
func (db *DB) GetRecord(ctx context.Context, id string) (Sandbox, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+sandboxColumns+`, record FROM sandboxes WHERE id = $1`, id)
	if err != nil {
		return Sandbox{}, unavailable(err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSandboxRecord)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, errdefs.New(errdefs.ErrNotFound, "sandbox %q not found", id)
	}
	return s, unavailable(err)
}

// Move hands a paused sandbox whose image is in the chunk store to host
// to: its row's host_slot becomes to and its generation grows, if it is
// still paused on from at generation gen (else ErrStale) and to has room
// for its memory (taken as Reserve takes it; else ErrNoCapacity). From
// then on only to writes the row; the moved map follows (NOTIFY).
func (db *DB) Move(ctx context.Context, id string, from int, gen int64, to int, reserveMB int64) error {
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer tx.Rollback(ctx)
	tag, err := tx.Exec(ctx, `UPDATE sandboxes SET host_slot = $4, generation = generation + 1, updated_at = now()
		WHERE id = $1 AND host_slot = $2 AND generation = $3 AND state = 'paused' AND store_root <> ''`, id, from, gen, to)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrStale
	}
	tag, err = tx.Exec(ctx, `UPDATE hosts SET mem_alloc_mb = mem_alloc_mb + s.memory_mb FROM sandboxes s
		WHERE hosts.slot = $2 AND s.id = $1 AND hosts.state = 'active' AND hosts.lease_until > now()
		  AND hosts.mem_alloc_mb + s.memory_mb <= hosts.mem_total_mb - $3`, id, to, reserveMB)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrNoCapacity
	}
	return unavailable(tx.Commit(ctx))
}

// Hand moves a running sandbox's row from host from to host to (a merge
// across hosts: its id goes on in a fork child's box on to): a
// compare-and-swap on its host and generation, ErrStale when it changed.
// From then on from's copy is stale (its next row write says so, and it
// drops the copy).
func (db *DB) Hand(ctx context.Context, id string, from int, gen int64, to int) error {
	tag, err := db.pool.Exec(ctx, `UPDATE sandboxes SET host_slot = $4, generation = generation + 1, updated_at = now()
		WHERE id = $1 AND host_slot = $2 AND generation = $3 AND state = 'running'`, id, from, gen, to)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return ErrStale
	}
	return nil
}

// ListFilter selects a team's sandboxes for a list.
type ListFilter struct {
	Team     string
	States   []string // running, paused (lost ones are listed as lost)
	Metadata map[string]string
	Template string
	After    time.Time // started strictly after
	Desc     bool
	// Cursor continues after (or, descending, before) this sandbox.
	CursorStarted time.Time
	CursorID      string
	Limit         int
}

// ListSandboxes returns a page of a team's sandboxes, ordered by start time
// then id.
func (db *DB) ListSandboxes(ctx context.Context, f ListFilter) ([]Sandbox, error) {
	meta, _ := json.Marshal(orEmpty(f.Metadata))
	op, dir := ">", "ASC"
	if f.Desc {
		op, dir = "<", "DESC"
	}
	q := `SELECT ` + sandboxColumns + ` FROM sandboxes
		WHERE team = $1 AND state = ANY($2) AND metadata @> $3 AND ($4 = '' OR template_id = $4) AND started_at > $5
		  AND ($6 = '' OR (started_at, id) ` + op + ` ($7, $6))
		ORDER BY started_at ` + dir + `, id ` + dir + ` LIMIT $8`
	rows, err := db.pool.Query(ctx, q, f.Team, f.States, meta, f.Template, f.After, f.CursorID, f.CursorStarted, f.Limit)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, scanSandbox)
}

// Moved returns the sandboxes that live away from their home host.
func (db *DB) Moved(ctx context.Context) (map[string]int, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, host_slot FROM sandboxes WHERE host_slot <> home_slot`)
	if err != nil {
		return nil, unavailable(err)
	}
	out := map[string]int{}
	var id string
	var slot int
	_, err = pgx.ForEachRow(rows, []any{&id, &slot}, func() error { out[id] = slot; return nil })
	return out, unavailable(err)
}

// AwayFrom returns which of ids have rows that name a host other than
// slot.
func (db *DB) AwayFrom(ctx context.Context, slot int, ids []string) ([]string, error) {
	rows, err := db.pool.Query(ctx, `SELECT id FROM sandboxes WHERE id = ANY($1) AND host_slot <> $2`, ids, slot)
	if err != nil {
		return nil, unavailable(err)
	}
	away, err := pgx.CollectRows(rows, pgx.RowTo[string])
	return away, unavailable(err)
}

// HostSandboxes returns the rows of the sandboxes that live on host slot.
func (db *DB) HostSandboxes(ctx context.Context, slot int) ([]Sandbox, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE host_slot = $1`, slot)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, scanSandbox)
}

// Snapshot is a snapshot's row: which host holds its image.
type Snapshot struct {
	ID        string          `json:"id"`
	Team      string          `json:"team"`
	Region    int             `json:"region"`
	HostSlot  int             `json:"hostSlot"`
	SandboxID string          `json:"sandboxID"`
	Names     []string        `json:"names"`
	CreatedAt time.Time       `json:"createdAt"`
	Doc       json.RawMessage `json:"doc"`
	// StoreRoot names its image's manifest in the cluster's chunk store
	// once uploaded ("": only on its host); Runtime is the runsc build
	// that wrote it (only a host of that build restores it). Record is the
	// host's record of it, from which another host restores it.
	StoreRoot string          `json:"storeRoot,omitempty"`
	Runtime   string          `json:"runtime,omitempty"`
	Record    json.RawMessage `json:"-"`
}

// SyncSnapshot writes a snapshot's row (its host's view).
func (db *DB) SyncSnapshot(ctx context.Context, s Snapshot) error {
	if s.Names == nil {
		s.Names = []string{}
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO snapshots (id, team, region, host_slot, sandbox_id, names, doc, created_at,
			store_root, runtime, record)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
		ON CONFLICT (id) DO UPDATE SET names = $6, doc = $7, store_root = $9, runtime = $10, record = $11`,
		s.ID, s.Team, s.Region, s.HostSlot, s.SandboxID, s.Names, []byte(s.Doc), s.CreatedAt,
		s.StoreRoot, s.Runtime, []byte(orJSON(s.Record)))
	return unavailable(err)
}

func orJSON(b json.RawMessage) json.RawMessage {
	if b == nil {
		return json.RawMessage("{}")
	}
	return b
}

// ForgetSnapshot deletes a snapshot's row.
func (db *DB) ForgetSnapshot(ctx context.Context, id string) error {
	_, err := db.pool.Exec(ctx, `DELETE FROM snapshots WHERE id = $1`, id)
	return unavailable(err)
}

// FindSnapshot returns a team's snapshot by id or name.
func (db *DB) FindSnapshot(ctx context.Context, team, idOrName string) (Snapshot, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE team = $1 AND (id = $2 OR $2 = ANY(names)) ORDER BY (id = $2) DESC, created_at DESC LIMIT 1`, team, idOrName)
	if err != nil {
		return Snapshot{}, unavailable(err)
	}
	s, err := pgx.CollectExactlyOneRow(rows, scanSnapshot)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, errdefs.New(errdefs.ErrNotFound, "snapshot %q not found", idOrName)
	}
	return s, unavailable(err)
}

const snapshotColumns = `id, team, region, host_slot, sandbox_id, names, created_at, doc, store_root, runtime, record`

func scanSnapshot(r pgx.CollectableRow) (Snapshot, error) {
	var s Snapshot
	err := r.Scan(&s.ID, &s.Team, &s.Region, &s.HostSlot, &s.SandboxID, &s.Names, &s.CreatedAt, &s.Doc,
		&s.StoreRoot, &s.Runtime, &s.Record)
	return s, err
}

// ListSnapshots returns a team's snapshots, oldest first.
func (db *DB) ListSnapshots(ctx context.Context, team string) ([]Snapshot, error) {
	rows, err := db.pool.Query(ctx, `SELECT `+snapshotColumns+` FROM snapshots
		WHERE team = $1 ORDER BY created_at, id`, team)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, scanSnapshot)
}
