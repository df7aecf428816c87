// Package clusterdb holds a cluster's state in PostgreSQL: its secrets,
// regions, hosts (slots, leases, capacity), teams and API keys, and a row
// per sandbox and snapshot saying where it lives. Gateways place and list
// from it; hosts register, heartbeat and keep their sandboxes' rows
// current. Nothing on a data-plane request's path reads it.
//
// The schema is versioned (migrations/NNNN_*.sql, applied in order under an
// advisory lock); a database newer than this binary is refused.
package clusterdb

import (
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/cellfork/cellfork/internal/errdefs"
)

//go:embed migrations/*.sql
var migrations embed.FS

// DB is a cluster database. Safe for concurrent use.
type DB struct {
	pool    *pgxpool.Pool
	url     string
	queries *queryCounter
}

// queryCounter counts the statements sent (a pgx tracer).
type queryCounter struct{ n atomic.Int64 }

func (q *queryCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queryCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Queries counts the statements this handle has sent.
func (db *DB) Queries() int64 { return db.queries.n.Load() }

// Errors placement and transitions tell apart.
var (
	ErrNoCapacity = errors.New("host has no capacity left")
	ErrTeamLimit  = errors.New("team is at its limit of running sandboxes")
	ErrNoTeam     = errors.New("no such team")
	ErrFenced     = errors.New("fenced: this host's lease was taken over")
	ErrStale      = errors.New("the sandbox moved on: its row has another host or generation")
)

// Open connects and brings the schema up to date.
func Open(ctx context.Context, url string) (*DB, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("cluster database URL: %w", err)
	}
	cfg.MaxConns = 16
	cfg.ConnConfig.ConnectTimeout = 3 * time.Second
	qc := &queryCounter{}
	cfg.ConnConfig.Tracer = qc
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	db := &DB{pool: pool, url: url, queries: qc}
	if err := db.migrate(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	return db, nil
}

// Close closes the connections.
func (db *DB) Close() { db.pool.Close() }

// Pool is the connection pool (for benchmarks and tests).
func (db *DB) Pool() *pgxpool.Pool { return db.pool }

// SchemaVersion is the version this binary's migrations reach.
func SchemaVersion() int {
	names, _ := fs.Glob(migrations, "migrations/*.sql")
	return len(names)
}

func (db *DB) migrate(ctx context.Context) error {
	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return err
	}
	sort.Strings(names)
	tx, err := db.pool.Begin(ctx)
	if err != nil {
		return unavailable(err)
	}
	defer tx.Rollback(ctx)
	// One migrator at a time, whichever gateway or host starts first.
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(727001)`); err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (version int PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())`); err != nil {
		return err
	}
	var have int
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM schema_migrations`).Scan(&have); err != nil {
		return err
	}
	if have > len(names) {
		return fmt.Errorf("the cluster database has schema version %d, newer than this cellfork's %d: upgrade cellfork", have, len(names))
	}
	for i, name := range names[have:] {
		v := have + i + 1
		if !strings.HasPrefix(name, fmt.Sprintf("migrations/%04d_", v)) {
			return fmt.Errorf("migration %s is out of sequence (want version %d)", name, v)
		}
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, string(sql)); err != nil {
			return fmt.Errorf("applying %s: %w", name, err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version) VALUES ($1)`, v); err != nil {
			return err
		}
	}
	return tx.Commit(ctx)
}

// unavailable marks a failure to reach the database as ErrUnavailable
// (503 with Retry-After at the edge), keeping its cause.
func unavailable(err error) error {
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		// Connection exceptions, a server shutting down or starting, too
		// many connections: the database is away, not the request wrong.
		if c := pgErr.Code; !strings.HasPrefix(c, "08") && !strings.HasPrefix(c, "57P") && !strings.HasPrefix(c, "53") {
			return err
		}
	} else if errors.Is(err, pgx.ErrNoRows) || errors.Is(err, context.Canceled) {
		return err
	}
	return fmt.Errorf("%w: %w", errdefs.New(errdefs.ErrUnavailable, "the cluster database is unavailable; retry later"), err)
}

// Secrets are the cluster's keys.
type Secrets struct {
	Internal []byte   // gateways sign internal calls with it
	Tokens   [][]byte // access tokens derive from these, newest first
}

// EnsureSecrets makes the cluster's keys on first use and returns them.
func (db *DB) EnsureSecrets(ctx context.Context, newKey func() []byte) (Secrets, error) {
	_, err := db.pool.Exec(ctx, `INSERT INTO cluster (internal_key, token_keys) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING`,
		newKey(), [][]byte{newKey()})
	if err != nil {
		return Secrets{}, unavailable(err)
	}
	var s Secrets
	err = db.pool.QueryRow(ctx, `SELECT internal_key, token_keys FROM cluster`).Scan(&s.Internal, &s.Tokens)
	return s, unavailable(err)
}

// RotateTokenKey puts a new token key first, keeping the last previous
// one (tokens of running sandboxes still check) and dropping older ones.
func (db *DB) RotateTokenKey(ctx context.Context, key []byte) error {
	_, err := db.pool.Exec(ctx, `UPDATE cluster SET token_keys = ARRAY[$1::bytea, token_keys[1]]`, key)
	return unavailable(err)
}

// Region is one region of the cluster.
type Region struct {
	ID         int      `json:"id"`
	Name       string   `json:"name"`
	Groups     []string `json:"groups"`
	GatewayURL string   `json:"gatewayURL"`
	Domain     string   `json:"domain"`
}

// PutRegion adds or changes a region.
func (db *DB) PutRegion(ctx context.Context, r Region) error {
	if r.Groups == nil {
		r.Groups = []string{}
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO regions (id, name, groups, gateway_url, domain) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET name = $2, groups = $3, gateway_url = $4, domain = $5`,
		r.ID, r.Name, r.Groups, r.GatewayURL, r.Domain)
	return unavailable(err)
}

// Regions returns every region.
func (db *DB) Regions(ctx context.Context) ([]Region, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, name, groups, gateway_url, domain FROM regions ORDER BY id`)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Region, error) {
		var x Region
		err := r.Scan(&x.ID, &x.Name, &x.Groups, &x.GatewayURL, &x.Domain)
		return x, err
	})
}

// Team is a tenant.
type Team struct {
	ID            string   `json:"id"`
	Name          string   `json:"name"`
	MaxSandboxes  int      `json:"maxSandboxes"` // 0: no bound
	Running       int      `json:"running"`
	Regions       []string `json:"regions"` // names or groups; empty: anywhere
	DefaultRegion string   `json:"defaultRegion"`
}

// PutTeam adds or changes a team (not its running count).
func (db *DB) PutTeam(ctx context.Context, t Team) error {
	if t.Regions == nil {
		t.Regions = []string{}
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO teams (id, name, max_sandboxes, regions, default_region) VALUES ($1, $2, $3, $4, $5)
		ON CONFLICT (id) DO UPDATE SET name = $2, max_sandboxes = $3, regions = $4, default_region = $5`,
		t.ID, t.Name, t.MaxSandboxes, t.Regions, t.DefaultRegion)
	return unavailable(err)
}

// Teams returns every team.
func (db *DB) Teams(ctx context.Context) ([]Team, error) {
	rows, err := db.pool.Query(ctx, `SELECT id, name, max_sandboxes, running, regions, default_region FROM teams ORDER BY id`)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Team, error) {
		var t Team
		err := r.Scan(&t.ID, &t.Name, &t.MaxSandboxes, &t.Running, &t.Regions, &t.DefaultRegion)
		return t, err
	})
}

// Key is an API key's record (never the key itself).
type Key struct {
	Hash    []byte
	Team    string
	Name    string
	Regions []string
	Revoked bool
}

// HashKey is what the database keeps of an API key.
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// AddKey stores an API key (its hash) for team.
func (db *DB) AddKey(ctx context.Context, key, team, name string, regions []string) error {
	if regions == nil {
		regions = []string{}
	}
	_, err := db.pool.Exec(ctx, `INSERT INTO api_keys (hash, team, name, regions) VALUES ($1, $2, $3, $4)`, HashKey(key), team, name, regions)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23503" {
		return fmt.Errorf("%w: %s", ErrNoTeam, team)
	}
	return unavailable(err)
}

// RevokeKey revokes the key with this name in team.
func (db *DB) RevokeKey(ctx context.Context, team, name string) error {
	tag, err := db.pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE team = $1 AND name = $2 AND revoked_at IS NULL`, team, name)
	if err != nil {
		return unavailable(err)
	}
	if tag.RowsAffected() == 0 {
		return errdefs.New(errdefs.ErrNotFound, "team %q has no key %q that is not revoked", team, name)
	}
	return nil
}

// Keys returns every key of the cluster (revoked ones included).
func (db *DB) Keys(ctx context.Context) ([]Key, error) {
	rows, err := db.pool.Query(ctx, `SELECT hash, team, name, regions, revoked_at IS NOT NULL FROM api_keys ORDER BY team, name`)
	if err != nil {
		return nil, unavailable(err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) {
		var k Key
		err := r.Scan(&k.Hash, &k.Team, &k.Name, &k.Regions, &k.Revoked)
		return k, err
	})
}

// LookupKey returns the key with this hash.
func (db *DB) LookupKey(ctx context.Context, hash []byte) (Key, error) {
	k := Key{Hash: hash}
	err := db.pool.QueryRow(ctx, `SELECT team, name, regions, revoked_at IS NOT NULL FROM api_keys WHERE hash = $1`, hash).
		Scan(&k.Team, &k.Name, &k.Regions, &k.Revoked)
	if errors.Is(err, pgx.ErrNoRows) {
		return k, errdefs.New(errdefs.ErrNotFound, "no such key")
	}
	return k, unavailable(err)
}
