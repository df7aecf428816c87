package chunkstore

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"

	"github.com/cellfork/cellfork/internal/errdefs"
)

// fileID is what identifies a file's contents under Options.Immutable:
// the same inode, size and modification time are the same bytes.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64 // ns
}

// remembered is a file Export cut (Options.Immutable): its chunks, and
// the names it was seen under that still name it, oldest first.
type remembered struct {
	file  File
	paths []string
	// The base (NoteBase) that holds this file, if it is one's.
	base *base
}

// maxNames bounds the names kept per remembered file.
const maxNames = 16

// maxMemoChunks bounds the chunks of the files remembered (about 50 bytes
// each); past it, the memo starts afresh.
const maxMemoChunks = 1 << 20

// identify returns path's identity (ok false if it cannot be read).
func identify(path string) (fileID, bool) {
	id, _, ok := identifyLinks(path)
	return id, ok
}

// identifyLinks is identify, and whether the file has other names (hard
// links), which only the files worth remembering have: the bases images
// share, not an image's own files.
func identifyLinks(path string) (fileID, bool, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return fileID{}, false, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || !info.Mode().IsRegular() {
		return fileID{}, false, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: info.Size(), mtime: info.ModTime().UnixNano()}, st.Nlink > 1, true
}

// recall returns the chunks of path if it was cut before (Immutable only).
func (s *Store) recall(path string) (File, bool) {
	if !s.immutable {
		return File{}, false
	}
	id, ok := identify(path)
	if !ok {
		return File{}, false
	}
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	r, ok := s.memo[id]
	if ok {
		r.paths = addName(r.paths, path, id)
		s.memo[id] = r
	}
	return r.file, ok
}

// addName adds path to the names of file id, dropping those that no
// longer name it (their image was deleted) and, past maxNames, the oldest.
func addName(paths []string, path string, id fileID) []string {
	kept := paths[:0]
	for _, p := range paths {
		if cur, ok := identify(p); ok && cur == id && p != path {
			kept = append(kept, p)
		}
	}
	kept = append(kept, path)
	if len(kept) > maxNames {
		kept = kept[len(kept)-maxNames:]
	}
	return kept
}

// keep remembers path, cut as f, if its identity before the cut is still
// its identity (and, with linkedOnly, it has other names).
func (s *Store) keep(path string, before fileID, f File, linkedOnly bool) {
	if !s.immutable || before == (fileID{}) {
		return
	}
	if after, linked, ok := identifyLinks(path); !ok || (linkedOnly && !linked) || after != before {
		return
	}
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	if s.memo == nil || s.memoChunks+len(f.Chunks) > maxMemoChunks {
		s.memo, s.memoByKey, s.memoChunks = make(map[fileID]remembered), make(map[string]fileID), 0
	}
	s.memo[before] = remembered{file: f, paths: []string{path}}
	s.memoByKey[fileKey(f)] = before
	s.memoChunks += len(f.Chunks)
}

// linkRemembered makes dst a hard link to a file on this host that Export
// cut and that holds exactly mf's bytes (the same size, mode and chunks),
// if there is one still unchanged (Immutable only): an import of an image
// whose base this host has links it instead of assembling it.
func (s *Store) linkRemembered(mf File, dst string) bool {
	if !s.immutable {
		return false
	}
	key := fileKey(mf)
	s.memoMu.Lock()
	id, ok := s.memoByKey[key]
	paths := slices.Clone(s.memo[id].paths)
	s.memoMu.Unlock()
	if !ok {
		return false
	}
	for _, p := range slices.Backward(paths) {
		if cur, ok := identify(p); ok && cur == id && os.Link(p, dst) == nil {
			return true
		}
	}
	return false
}

// reuseFile accounts for a remembered file as chunkFile does for one it
// cuts: where each new distinct chunk is (for the upload), the counts, the
// progress.
func (s *Store) reuseFile(f File, fileIdx int, locs map[Hash]where, pr *chunkProgress, st *Stats) {
	var off int64
	for _, c := range f.Chunks {
		if c.Zero {
			st.ZeroChunks++
		} else if _, ok := locs[c.Hash]; !ok {
			locs[c.Hash] = where{fileIdx, off, c.Size}
		}
		off += int64(c.Size)
	}
	st.Chunks += len(f.Chunks)
	s.report("export", "chunk", min(pr.done.Add(f.Size), pr.total), pr.total)
	st.Reused++
}

// Remember cuts the regular files of the image directory dir and
// remembers them (Immutable only), as an export of it would, without
// storing anything: an import of an image holding one of them links it
// rather than assembling it, and with a cache, the chunks it shares with
// them are read from the cache rather than fetched. A host remembers its
// templates' warm images, which the snapshots and paused sandboxes of
// those templates share most of their bytes with.
func (s *Store) Remember(ctx context.Context, dir string) error {
	if !s.immutable {
		return nil
	}
	names, err := imageFiles(dir)
	if err != nil {
		return err
	}
	for _, name := range names {
		path := filepath.Join(dir, name)
		if _, ok := s.recall(path); ok {
			continue
		}
		before, ok := identify(path)
		if !ok {
			continue
		}
		var st Stats
		f, err := s.chunkFile(ctx, path, name, 0, map[Hash]where{}, &chunkProgress{}, &st)
		if err != nil {
			return fmt.Errorf("remembering %s: %w", path, err)
		}
		s.keep(path, before, f, false)
	}
	return nil
}

// base is an image noted as the base of later exports (NoteBase): its
// directory, the metadata to export it with, and the root of its last
// export (zero before the first).
type base struct {
	dir  string
	meta map[string]string
	root Hash
}

// baseFor returns the base an export of the image dir (its files names)
// is written over: the one noted for a file it holds by identity (a
// base-*.img linked to a template's warm pages), if another image's.
func (s *Store) baseFor(dir string, names []string) (base, bool) {
	if !s.immutable {
		return base{}, false
	}
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	for _, name := range names {
		id, ok := identify(filepath.Join(dir, name))
		if !ok {
			continue
		}
		if r, ok := s.memo[id]; ok && r.base != nil && r.base.dir != dir {
			return *r.base, true
		}
	}
	return base{}, false
}

// NoteBase remembers the image directory dir (Remember) and notes it as
// the base of later exports of images that hold one of its files by
// identity (hard links): a template's warm image, whose pages every
// snapshot and paused sandbox of the template holds as its base-*.img
// (Immutable only). Nothing is stored yet: the first such export exports
// dir (flat, with meta) before it, and so does any export that finds
// its manifest collected (a collection drops it once no live manifest is
// over it). Their manifests are then a few KB instead of 80 (base.go).
func (s *Store) NoteBase(ctx context.Context, dir string, meta map[string]string) error {
	if !s.immutable {
		return errdefs.New(errdefs.ErrFailedPrecondition, "noting a base needs Options.Immutable")
	}
	if err := s.Remember(ctx, dir); err != nil {
		return err
	}
	s.setBase(dir, base{dir: dir, meta: meta})
	return nil
}

// setBase notes b for the remembered files of dir.
func (s *Store) setBase(dir string, b base) {
	names, err := imageFiles(dir)
	if err != nil {
		return
	}
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	for _, name := range names {
		if id, ok := identify(filepath.Join(dir, name)); ok {
			if r, ok := s.memo[id]; ok {
				r.base = &b
				s.memo[id] = r
			}
		}
	}
}

// ExportBase is NoteBase, then an export of dir now; it returns that
// export's Stats.
func (s *Store) ExportBase(ctx context.Context, dir string, meta map[string]string) (Stats, error) {
	if err := s.NoteBase(ctx, dir, meta); err != nil {
		return Stats{}, err
	}
	return s.exportBase(ctx, base{dir: dir, meta: meta})
}

// exportBase exports the noted base b (flat) and notes its root.
func (s *Store) exportBase(ctx context.Context, b base) (Stats, error) {
	st, err := s.ExportOver(ctx, b.dir, b.meta, Hash{})
	if err != nil {
		return st, err
	}
	b.root = st.Root
	s.setBase(b.dir, b)
	return st, nil
}
