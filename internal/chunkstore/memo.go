package chunkstore

import (
	"os"
	"syscall"
)

// fileID is what identifies a file's contents under Options.Immutable:
// the same inode, size and modification time are the same bytes.
type fileID struct {
	dev, ino uint64
	size     int64
	mtime    int64 // ns
}

// maxMemo bounds the files remembered; past it, the memo starts afresh.
const maxMemo = 4096

// identify returns path's identity (ok false if it cannot be read).
func identify(path string) (fileID, bool) {
	info, err := os.Stat(path)
	if err != nil {
		return fileID{}, false
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if !ok || !info.Mode().IsRegular() {
		return fileID{}, false
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino, size: info.Size(), mtime: info.ModTime().UnixNano()}, true
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
	f, ok := s.memo[id]
	return f, ok
}

// rememberFile keeps the chunks of path, cut as f, if its identity before the
// cut is still its identity (Immutable only).
func (s *Store) rememberFile(path string, before fileID, f File) {
	if !s.immutable || before == (fileID{}) {
		return
	}
	if after, ok := identify(path); !ok || after != before {
		return
	}
	s.memoMu.Lock()
	defer s.memoMu.Unlock()
	if s.memo == nil || len(s.memo) >= maxMemo {
		s.memo = make(map[fileID]File)
	}
	s.memo[before] = f
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
