// Package store persists sandbox records in SQLite (pure Go driver, so the
// daemon needs no cgo). Records are stored as JSON documents keyed by id;
// every Put is one atomic transaction.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"

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
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

// Put inserts or replaces a record.
func (s *Store) Put(ctx context.Context, sb *sandbox.Sandbox) error {
	doc, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	_, err = s.db.ExecContext(ctx, `INSERT INTO sandboxes (id, doc) VALUES (?, ?)
		ON CONFLICT(id) DO UPDATE SET doc = excluded.doc`, sb.ID, string(doc))
	if err != nil {
		return fmt.Errorf("storing sandbox %s: %w", sb.ID, err)
	}
	return nil
}

// Get returns the record with id, or an ErrNotFound error.
func (s *Store) Get(ctx context.Context, id string) (*sandbox.Sandbox, error) {
	var doc string
	err := s.db.QueryRowContext(ctx, `SELECT doc FROM sandboxes WHERE id = ?`, id).Scan(&doc)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("loading sandbox %s: %w", id, err)
	}
	return decode(doc)
}

// List returns every record.
func (s *Store) List(ctx context.Context) ([]*sandbox.Sandbox, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT doc FROM sandboxes ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	defer rows.Close()
	var out []*sandbox.Sandbox
	for rows.Next() {
		var doc string
		if err := rows.Scan(&doc); err != nil {
			return nil, err
		}
		sb, err := decode(doc)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, rows.Err()
}

// Delete removes a record; deleting a missing record is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("deleting sandbox %s: %w", id, err)
	}
	return nil
}

func decode(doc string) (*sandbox.Sandbox, error) {
	var sb sandbox.Sandbox
	if err := json.Unmarshal([]byte(doc), &sb); err != nil {
		return nil, fmt.Errorf("decoding sandbox record: %w", err)
	}
	return &sb, nil
}
