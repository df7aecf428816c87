// Package store persists sandbox records in SQLite (pure Go driver, so the
// daemon needs no cgo). Records are the store's own versioned structs
// (records.go), stored as JSON documents keyed by id; every Put is one
// atomic transaction.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Store is a SQLite-backed sandbox.Store. Safe for concurrent use.
type Store struct {
	db *sql.DB
}

var _ sandbox.Store = (*Store)(nil)

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id   TEXT PRIMARY KEY,
	doc  TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS snapshots (
	id   TEXT PRIMARY KEY,
	doc  TEXT NOT NULL
);`

// Open opens (creating if needed) the database at path.
func Open(path string) (*Store, error) {
	dsn := "file:" + path + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)"
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, fmt.Errorf("opening store: %w", err)
	}
	db.SetMaxOpenConns(1) // one writer; reads are cheap at this size
	if _, err := db.Exec(schema); err != nil {
		db.Close()
		return nil, fmt.Errorf("creating schema: %w", err)
	}
	// Records hold access tokens and network rules' header values
	// (secrets): the daemon's alone. SQLite gives new WAL and shared-memory
	// files the database's mode; those of an older daemon are changed too.
	if err := os.Chmod(path, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("opening store: %w", err)
	}
	for _, f := range []string{path + "-wal", path + "-shm"} {
		if err := os.Chmod(f, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			db.Close()
			return nil, fmt.Errorf("opening store: %w", err)
		}
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// table is one kind of record: documents of type R (the record, JSON) for
// domain values of type T, keyed by id.
type table[T, R any] struct {
	db       *sql.DB
	name     string // trusted constant
	what     string // for messages
	id       func(*T) string
	toRecord func(*T) *R
	domain   func(*R) (*T, error)
}

func (t table[T, R]) put(ctx context.Context, v *T) error {
	doc, err := json.Marshal(t.toRecord(v))
	if err != nil {
		return err
	}
	_, err = t.db.ExecContext(ctx, `INSERT INTO `+t.name+` (id, doc) VALUES (?, ?)
		ON CONFLICT(id) DO UPDATE SET doc = excluded.doc`, t.id(v), string(doc))
	if err != nil {
		return fmt.Errorf("storing %s %s: %w", t.what, t.id(v), err)
	}
	return nil
}

func (t table[T, R]) get(ctx context.Context, id string) (*T, error) {
	var doc string
	err := t.db.QueryRowContext(ctx, `SELECT doc FROM `+t.name+` WHERE id = ?`, id).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%s %s: %w", t.what, id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("loading %s %s: %w", t.what, id, err)
	}
	return t.decode(doc)
}

func (t table[T, R]) list(ctx context.Context) ([]*T, error) {
	rows, err := t.db.QueryContext(ctx, `SELECT doc FROM `+t.name+` ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing %ss: %w", t.what, err)
	}
	defer rows.Close()
	var out []*T
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, err
		}
		v, err := t.decode(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func (t table[T, R]) delete(ctx context.Context, id string) error {
	if _, err := t.db.ExecContext(ctx, `DELETE FROM `+t.name+` WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting %s %s: %w", t.what, id, err)
	}
	return nil
}

func (t table[T, R]) decode(doc string) (*T, error) {
	var r R
	if err := json.Unmarshal([]byte(doc), &r); err != nil {
		return nil, fmt.Errorf("decoding %s record: %w", t.what, err)
	}
	return t.domain(&r)
}

func (s *Store) sandboxes() table[sandbox.Sandbox, sandboxRecord] {
	return table[sandbox.Sandbox, sandboxRecord]{s.db, "sandboxes", "sandbox",
		func(v *sandbox.Sandbox) string { return v.ID }, sandboxToRecord, (*sandboxRecord).domain}
}

func (s *Store) snapshots() table[sandbox.Snapshot, snapshotRecord] {
	return table[sandbox.Snapshot, snapshotRecord]{s.db, "snapshots", "snapshot",
		func(v *sandbox.Snapshot) string { return v.ID }, snapshotToRecord, (*snapshotRecord).domain}
}

// Put inserts or replaces a sandbox record.
func (s *Store) Put(ctx context.Context, sb *sandbox.Sandbox) error {
	return s.sandboxes().put(ctx, sb)
}

// Get returns the sandbox record with id, or an ErrNotFound error.
func (s *Store) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	return s.sandboxes().get(ctx, id)
}

// List returns every sandbox record.
func (s *Store) List(ctx context.Context) ([]*sandbox.Sandbox, error) { return s.sandboxes().list(ctx) }

// Delete removes a sandbox record; deleting a missing one is not an error.
func (s *Store) Delete(ctx context.Context, id string) error { return s.sandboxes().delete(ctx, id) }

// PutSnapshot inserts or replaces a snapshot record.
func (s *Store) PutSnapshot(ctx context.Context, sn *sandbox.Snapshot) error {
	return s.snapshots().put(ctx, sn)
}

// GetSnapshot returns the snapshot record with id, or an ErrNotFound error.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*sandbox.Snapshot, error) {
	return s.snapshots().get(ctx, id)
}

// ListSnapshots returns every snapshot record.
func (s *Store) ListSnapshots(ctx context.Context) ([]*sandbox.Snapshot, error) {
	return s.snapshots().list(ctx)
}

// DeleteSnapshot removes a snapshot record; deleting a missing one is not
// an error.
func (s *Store) DeleteSnapshot(ctx context.Context, id string) error {
	return s.snapshots().delete(ctx, id)
}
