// Package layers is the build cache of custom templates: one layer per
// build step, kept as the directory of files the step changed (an
// overlayfs upper directory: new and changed files, whiteouts for removed
// ones, opaque directories for replaced ones). A step runs on an overlay
// mount of the layers below it, so nothing is copied to run it; a template's
// root file system is the layers flattened into one directory of hard
// links (Flatten), so a sandbox reads a plain directory, as it reads the
// built-in template's, and no mount has to survive a restart.
//
// A layer is found again by its key: a hash of everything its step depends
// on (the step, its files, the layer below). Layers are immutable once
// committed.
package layers

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
)

// Layer is one committed layer.
type Layer struct {
	ID     string    `json:"id"`
	Key    string    `json:"key"`
	Parent string    `json:"parent,omitempty"` // layer below ("" for a base)
	Step   string    `json:"step"`             // what made it, for logs and listings
	Size   int64     `json:"size"`             // bytes its files take (blocks)
	Create time.Time `json:"createdAt"`
	Used   time.Time `json:"usedAt"`
	// External is set for a base layer that is an existing root file
	// system (the built-in template's): its diff is a link to it, and it is
	// never deleted, only the link.
	External string `json:"external,omitempty"`
	// Meta is the caller's record of what the layer leaves behind (for a
	// build step: the user, workdir and environment after it).
	Meta json.RawMessage `json:"meta,omitempty"`
}

// Store keeps the layers under one directory: <dir>/<id>/diff and
// <dir>/<id>/layer.json. Safe for concurrent use.
type Store struct {
	dir string
	mu  sync.Mutex
	// byKey maps a key to the newest layer made for it; guarded by mu.
	byKey map[string]*Layer
	byID  map[string]*Layer // guarded by mu
}

// Open loads the store in dir (created if needed), unmounting and removing
// what a crash left half made.
func Open(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	s := &Store{dir: dir, byKey: map[string]*Layer{}, byID: map[string]*Layer{}}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if strings.Contains(e.Name(), ".tmp-") {
			unmountAll(p)
			_ = os.RemoveAll(p)
			continue
		}
		b, err := os.ReadFile(filepath.Join(p, "layer.json"))
		if err != nil {
			continue // not a layer (or not committed): ignore
		}
		var l Layer
		if json.Unmarshal(b, &l) != nil || l.ID != e.Name() {
			continue
		}
		s.add(&l)
	}
	return s, nil
}

func (s *Store) add(l *Layer) {
	s.byID[l.ID] = l
	if old := s.byKey[l.Key]; old == nil || !l.Create.Before(old.Create) {
		s.byKey[l.Key] = l
	}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// DiffPath is the host path of a layer's files.
func (s *Store) DiffPath(id string) string { return filepath.Join(s.dir, id, "diff") }

// Key hashes what a layer depends on into a key.
func Key(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		fmt.Fprintf(h, "%d:%s\x00", len(p), p)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Lookup returns the newest layer made for key.
func (s *Store) Lookup(key string) (*Layer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.byKey[key]
	if !ok {
		return nil, false
	}
	c := *l
	return &c, true
}

// Get returns the layer with this id.
func (s *Store) Get(id string) (*Layer, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.byID[id]
	if !ok {
		return nil, false
	}
	c := *l
	return &c, true
}

// Touch records that the layers were used now (the collector keeps the
// recently used ones longest).
func (s *Store) Touch(ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now().UTC()
	for _, id := range ids {
		if l := s.byID[id]; l != nil {
			l.Used = now
			_ = writeJSON(filepath.Join(s.dir, id, "layer.json"), l)
		}
	}
}

// List returns every layer, oldest first.
func (s *Store) List() []Layer {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Layer, 0, len(s.byID))
	for _, l := range s.byID {
		out = append(out, *l)
	}
	slices.SortFunc(out, func(a, b Layer) int { return a.Create.Compare(b.Create) })
	return out
}

func newID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Pending is a layer being made: its diff directory, and the overlay
// mount the step runs on. Not safe for concurrent use.
type Pending struct {
	s       *Store
	id, key string
	parent  string
	tmp     string // <dir>/<id>.tmp-<rand>
	mounted bool
}

// Begin starts a layer for key on top of parent ("" for a base).
func (s *Store) Begin(key, parent string) (*Pending, error) {
	id := newID()
	tmp := filepath.Join(s.dir, id+".tmp-"+newID()[:6])
	for _, d := range []string{"diff", "work", "merged"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o755); err != nil {
			os.RemoveAll(tmp)
			return nil, err
		}
	}
	return &Pending{s: s, id: id, key: key, parent: parent, tmp: tmp}, nil
}

// ID is the id the layer will have.
func (p *Pending) ID() string { return p.id }

// Diff is the directory of the layer's files.
func (p *Pending) Diff() string { return filepath.Join(p.tmp, "diff") }

// Merged is where Mount shows the step's root.
func (p *Pending) Merged() string { return filepath.Join(p.tmp, "merged") }

// Commit makes the layer permanent (unmounting it first). meta is stored
// with it as JSON.
func (p *Pending) Commit(step string, meta any) (*Layer, error) {
	if err := p.Unmount(); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(filepath.Join(p.tmp, "work"))
	_ = os.Remove(filepath.Join(p.tmp, "merged"))
	size, err := DiskUsage(nil, p.Diff())
	if err != nil {
		return nil, err
	}
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	l := &Layer{ID: p.id, Key: p.key, Parent: p.parent, Step: step, Size: size, Create: now, Used: now, Meta: mb}
	if err := writeJSON(filepath.Join(p.tmp, "layer.json"), l); err != nil {
		return nil, err
	}
	if err := os.Rename(p.tmp, filepath.Join(p.s.dir, p.id)); err != nil {
		return nil, err
	}
	p.s.mu.Lock()
	p.s.add(l)
	p.s.mu.Unlock()
	c := *l
	return &c, nil
}

// Abort removes everything of the pending layer.
func (p *Pending) Abort() {
	_ = p.Unmount()
	unmountAll(p.tmp)
	_ = os.RemoveAll(p.tmp)
}

// AddExternal records rootfs (an existing root file system that outlives
// the store, like the built-in template's) as a base layer for key.
func (s *Store) AddExternal(key, rootfs, step string, meta any) (*Layer, error) {
	if l, ok := s.Lookup(key); ok && l.External == rootfs {
		return l, nil
	}
	p, err := s.Begin(key, "")
	if err != nil {
		return nil, err
	}
	defer p.Abort()
	if err := os.Remove(p.Diff()); err != nil {
		return nil, err
	}
	if err := os.Symlink(rootfs, p.Diff()); err != nil {
		return nil, err
	}
	_ = os.RemoveAll(filepath.Join(p.tmp, "work"))
	_ = os.Remove(filepath.Join(p.tmp, "merged"))
	mb, err := json.Marshal(meta)
	if err != nil {
		return nil, err
	}
	now := time.Now().UTC()
	l := &Layer{ID: p.id, Key: key, Step: step, Create: now, Used: now, External: rootfs, Meta: mb}
	if err := writeJSON(filepath.Join(p.tmp, "layer.json"), l); err != nil {
		return nil, err
	}
	if err := os.Rename(p.tmp, filepath.Join(s.dir, p.id)); err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.add(l)
	s.mu.Unlock()
	c := *l
	return &c, nil
}

// Chain returns the ids from the base up to id (bottom first).
func (s *Store) Chain(id string) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for id != "" {
		l := s.byID[id]
		if l == nil {
			return nil, fmt.Errorf("layer %s is missing", id)
		}
		out = append(out, id)
		id = l.Parent
		if len(out) > MaxDepth+1 {
			return nil, errors.New("layer chain too deep (a loop?)")
		}
	}
	slices.Reverse(out)
	return out, nil
}

// Remove deletes a layer (the caller knows nothing uses it).
func (s *Store) Remove(id string) error {
	s.mu.Lock()
	l := s.byID[id]
	if l == nil {
		s.mu.Unlock()
		return nil
	}
	delete(s.byID, id)
	if s.byKey[l.Key] == l {
		delete(s.byKey, l.Key)
		for _, o := range s.byID { // an older layer of the same key takes over
			if o.Key == l.Key && (s.byKey[l.Key] == nil || o.Create.After(s.byKey[l.Key].Create)) {
				s.byKey[l.Key] = o
			}
		}
	}
	s.mu.Unlock()
	// Renamed first, so that a crash never leaves half a layer under its id.
	gone := filepath.Join(s.dir, id+".tmp-rm"+newID()[:4])
	if err := os.Rename(filepath.Join(s.dir, id), gone); err != nil {
		return err
	}
	return os.RemoveAll(gone) // a symlinked external diff: the link only
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
