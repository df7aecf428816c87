package chunkstore_test

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// progressLog keeps, per "op/phase", the most done and the totals seen.
type progressLog struct {
	mu     sync.Mutex
	done   map[string]int64
	totals map[string]map[int64]bool
}

func (l *progressLog) report(p chunkstore.Progress) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k := p.Op + "/" + p.Phase
	if p.Done < 0 || p.Done > p.Total {
		l.done[k] = -1 // out of range: fails the check below
		return
	}
	if l.done[k] >= 0 {
		l.done[k] = max(l.done[k], p.Done)
	}
	if l.totals[k] == nil {
		l.totals[k] = make(map[int64]bool)
	}
	l.totals[k][p.Total] = true
}

// check wants every phase in want reported with one total, reached.
func (l *progressLog) check(t *testing.T, want ...string) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range want {
		if len(l.totals[k]) != 1 {
			t.Errorf("%s: totals %v, want one", k, l.totals[k])
			continue
		}
		for total := range l.totals[k] {
			if l.done[k] != total {
				t.Errorf("%s: done %d of %d", k, l.done[k], total)
			}
		}
	}
	l.done, l.totals = make(map[string]int64), make(map[string]map[int64]bool)
}

// TestProgressReachesTotal exports and imports an image of two files with
// zero pages, with and without a cache and with linked files: each phase
// reports one total for the whole image and reaches it.
func TestProgressReachesTotal(t *testing.T) {
	tmp := t.TempDir()
	img := filepath.Join(tmp, "img")
	chunkstoretest.Image{Seed: 1, Pool: 1, Pages: 1000, ZeroRun: 64}.Write(t, img)
	b, err := chunkstore.OpenFile(filepath.Join(tmp, "store"))
	if err != nil {
		t.Fatal(err)
	}
	cache, err := chunkstore.OpenCache(filepath.Join(tmp, "cache"), 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cache.Flush)
	l := &progressLog{done: make(map[string]int64), totals: make(map[string]map[int64]bool)}
	open := func(opts chunkstore.Options) *chunkstore.Store {
		opts.Progress = l.report
		s, err := chunkstore.New(b, opts)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	ctx := context.Background()
	st, err := open(chunkstore.Options{}).Export(ctx, img, nil)
	if err != nil {
		t.Fatal(err)
	}
	if st.ZeroChunks == 0 {
		t.Fatalf("the image has no zero chunk: %s", &st)
	}
	l.check(t, "export/chunk", "export/upload")

	for i, c := range []struct {
		opts chunkstore.Options
		want []string
	}{
		{chunkstore.Options{}, []string{"import/assemble"}},
		{chunkstore.Options{Cache: cache}, []string{"import/fetch", "import/assemble"}},
		{chunkstore.Options{Cache: cache, LinkFiles: true}, []string{"import/assemble"}}, // assembles, keeps the file
		{chunkstore.Options{Cache: cache, LinkFiles: true}, []string{"import/assemble"}}, // links pages.img
	} {
		out := filepath.Join(tmp, "out", string(rune('a'+i)))
		if err := os.MkdirAll(filepath.Dir(out), 0o700); err != nil {
			t.Fatal(err)
		}
		ist, err := open(c.opts).Import(ctx, st.Root, out)
		if err != nil {
			t.Fatal(err)
		}
		if i == 3 && ist.LinkedFiles == 0 {
			t.Fatalf("import %d linked nothing: %s", i, &ist)
		}
		l.check(t, c.want...)
		chunkstoretest.Equal(t, img, out)
	}
}
