package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/chunkstore"
)

// packBytes is -pack: pack files in the store (0: none, as the daemon's
// file:// store).
var packBytes int

// openStore opens a file:// store in dir as the daemon does (Immutable: a
// file with other names, the warm image's pages, is cut once).
func openStore(ctx context.Context, dir string) (*chunkstore.Store, error) {
	return chunkstore.Open(ctx, "file://"+dir, chunkstore.Options{Immutable: true, PackBytes: packBytes})
}

// objects counts a store's objects under prefix: how many, their bytes,
// and what the filesystem allocates to them.
func objects(dir, prefix string) (n, size, alloc int64) {
	u, _ := du(filepath.Join(dir, prefix))
	_ = filepath.WalkDir(filepath.Join(dir, prefix), func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n++
				size += info.Size()
			}
		}
		return nil
	})
	return n, size, u.own + u.shared
}

// pausedImages lists the image directories of a daemon's paused sandboxes.
func pausedImages(dataDir string) ([]string, error) {
	ents, err := os.ReadDir(filepath.Join(dataDir, "paused"))
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, e := range ents {
		if e.IsDir() {
			dirs = append(dirs, filepath.Join(dataDir, "paused", e.Name()))
		}
	}
	return dirs, nil
}

// runStore exports the warm image, then every paused image of the run
// over it, into a file:// store; prints what each costs there, flat and
// over the base, and the time to import one and to collect.
func runStore(ctx context.Context, dataDir, warm, dir string) error {
	if warm == "" {
		return fmt.Errorf("-store needs -warm")
	}
	dirs, err := pausedImages(dataDir)
	if err != nil {
		return err
	}
	storeDir := filepath.Join(dir, "store")
	defer os.RemoveAll(dir)
	s, err := openStore(ctx, storeDir)
	if err != nil {
		return err
	}
	fmt.Printf("load average at start: %s (%s); %d paused images\n\n", loadavg(), time.Now().UTC().Format("2006-01-02 15:04"), len(dirs))
	ws, err := s.ExportBase(ctx, warm, map[string]string{"image": "warm"})
	if err != nil {
		return err
	}
	_, _, warmChunks := objects(storeDir, "chunks")
	_, _, warmPacks := objects(storeDir, "packs")
	warmAlloc := warmChunks + warmPacks
	var times []time.Duration
	var newBytes, manifestBytes, flatBytes, zeroBase int64
	var roots []chunkstore.Hash
	var marginal []string
	var sinceMark int64
	lastMark := 0
	marks := map[int]bool{1: true, 10: true, 100: true, 500: true, 1000: true, 2000: true, len(dirs): true}
	t0 := time.Now()
	for i, d := range dirs {
		// Export, as the daemon would: over the warm image's manifest,
		// found by the base-*.img it holds.
		st, err := s.Export(ctx, d, map[string]string{"sandbox": filepath.Base(d)})
		if err != nil {
			return err
		}
		sinceMark += st.TransferredBytes
		if marks[i+1] {
			marginal = append(marginal, fmt.Sprintf("| %d–%d | %.2f MB |", lastMark+1, i+1, float64(sinceMark)/float64(i+1-lastMark)/1e6))
			lastMark, sinceMark = i+1, 0
		}
		if st.Base != ws.Root {
			zeroBase++
		}
		times = append(times, st.Duration)
		roots = append(roots, st.Root)
		newBytes += st.TransferredBytes
		manifestBytes += int64(st.ManifestBytes)
		if i < 50 { // the flat form of a sample
			m, err := s.Manifest(ctx, st.Root)
			if err != nil {
				return err
			}
			b, _, err := m.Encode()
			if err != nil {
				return err
			}
			flatBytes += int64(len(b))
		}
	}
	exportAll := time.Since(t0)
	n := int64(len(dirs))
	cn, cs, ca := objects(storeDir, "chunks")
	pn, ps, pa := objects(storeDir, "packs")
	mn, ms_, ma := objects(storeDir, "manifests")
	fmt.Println("| what | value |")
	fmt.Println("|---|---:|")
	fmt.Printf("| warm image (flat manifest) | %.1f MB of chunks, %d chunks, manifest %.1f KB |\n", float64(ws.TransferredBytes)/1e6, ws.Transferred, float64(mustSize(storeDir, ws.Root))/1e3)
	fmt.Printf("| paused images exported over it | %d (%d written flat: base missing) |\n", n, zeroBase)
	fmt.Printf("| new chunk bytes per paused sandbox | %.2f MB |\n", float64(newBytes)/float64(n)/1e6)
	fmt.Printf("| manifest per paused sandbox, over the warm image | %.1f KB |\n", float64(manifestBytes)/float64(n)/1e3)
	fmt.Printf("| the same manifest flat (mean of %d) | %.1f KB |\n", min(n, 50), float64(flatBytes)/float64(min(n, 50))/1e3)
	fmt.Printf("| export over the base, p50 / p95 | %.1f / %.1f ms (%d in %.1f s) |\n", ms(median(times)), ms(pct(times, 0.95)), n, exportAll.Seconds())
	fmt.Printf("| store: chunks | %d files, %.2f GB (%.2f GB allocated) |\n", cn, float64(cs)/1e9, float64(ca)/1e9)
	fmt.Printf("| store: packs (-pack %d) | %d files, %.2f GB (%.2f GB allocated) |\n", packBytes, pn, float64(ps)/1e9, float64(pa)/1e9)
	fmt.Printf("| store: the warm image's chunks or packs | %.2f GB allocated |\n", float64(warmAlloc)/1e9)
	ca += pa
	fmt.Printf("| store: manifests | %d files, %.1f MB (%.1f MB allocated) |\n", mn, float64(ms_)/1e6, float64(ma)/1e6)
	fmt.Printf("| store bytes per paused sandbox (allocated, the warm image not counted) | %.2f MB |\n", float64(ca-warmAlloc+ma)/float64(n)/1e6)
	fmt.Print("\nNew chunk bytes per sandbox as the store fills:\n\n")
	fmt.Println("| sandboxes | new chunk bytes per sandbox |")
	fmt.Println("|---|---:|")
	for _, row := range marginal {
		fmt.Println(row)
	}
	fmt.Println()
	fmt.Println("| what | value |")
	fmt.Println("|---|---:|")

	// Wake from the store: import one (its base-*.img linked, the rest
	// assembled), median of 5.
	var imports []time.Duration
	for i := range 5 {
		out := filepath.Join(dir, "import-"+strconv.Itoa(i))
		st, err := s.Import(ctx, roots[i*len(roots)/5], out)
		if err != nil {
			return err
		}
		imports = append(imports, st.Duration)
		os.RemoveAll(out)
	}
	fmt.Printf("| import of one from the store (file://, the warm image on the host), p50 of 5 | %.1f ms |\n", ms(median(imports)))
	live := append(slices.Clone(roots), ws.Root)
	gs, err := s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return live, nil }), time.Hour)
	if err != nil {
		return err
	}
	fmt.Printf("| GC, everything live (mark: %d manifests, %d chunks listed) | %.0f ms |\n", gs.Manifests, gs.Chunks, ms(gs.Duration))
	gs, err = s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil }), 0)
	if err != nil {
		return err
	}
	fmt.Printf("| GC, nothing live (%d manifests, %d chunks and %d packs deleted, %.2f GB) | %.0f ms |\n", gs.DeletedManifests, gs.DeletedChunks, gs.DeletedPacks, float64(gs.BytesFreed)/1e9, ms(gs.Duration))
	fmt.Printf("\nload average at end: %s\n", loadavg())
	return nil
}

func mustSize(storeDir string, root chunkstore.Hash) int64 {
	info, err := os.Stat(filepath.Join(storeDir, chunkstore.ManifestKey(root)))
	if err != nil {
		return 0
	}
	return info.Size()
}

// runSynthetic fills a file:// store with n manifests over the warm
// image's, each a real paused image's (from -data-dir, exported over it:
// real chunks) with its own metadata, then lists and collects them.
func runSynthetic(ctx context.Context, dataDir, warm, dir string, n, putSample int) error {
	if warm == "" {
		return fmt.Errorf("-synthetic needs -warm")
	}
	dirs, err := pausedImages(dataDir)
	if err != nil {
		return err
	}
	if len(dirs) > 20 {
		dirs = dirs[:20]
	}
	if len(dirs) == 0 {
		return fmt.Errorf("no paused images in %s", dataDir)
	}
	storeDir := filepath.Join(dir, "store")
	defer os.RemoveAll(dir)
	s, err := openStore(ctx, storeDir)
	if err != nil {
		return err
	}
	fmt.Printf("load average at start: %s (%s)\n\n", loadavg(), time.Now().UTC().Format("2006-01-02 15:04"))
	ws, err := s.Export(ctx, warm, map[string]string{"image": "warm"})
	if err != nil {
		return err
	}
	var real []*chunkstore.Manifest
	for _, d := range dirs {
		st, err := s.ExportOver(ctx, d, nil, ws.Root)
		if err != nil {
			return err
		}
		m, err := s.Manifest(ctx, st.Root)
		if err != nil {
			return err
		}
		real = append(real, m)
	}
	base, err := s.Manifest(ctx, ws.Root)
	if err != nil {
		return err
	}
	b := s.Backend()
	// Manifest i is real image i%20's over the base, with metadata
	// {"sandbox":"synthetic-i"}: its encoding is that image's with the
	// metadata swapped, which is cheaper than encoding it again (the GC
	// below decodes and checks every one).
	const mark = `"meta":{"sandbox":"X"}}`
	var prefixes [][]byte
	for _, m := range real {
		m2 := *m
		m2.Meta = map[string]string{"sandbox": "X"}
		body, _, err := m2.EncodeOver(base, ws.Root)
		if err != nil {
			return err
		}
		if !bytes.HasSuffix(body, []byte(mark)) {
			return fmt.Errorf("encoding ends %q, want %q", body[len(body)-40:], mark)
		}
		prefixes = append(prefixes, body[:len(body)-len(mark)])
	}
	encode := func(i int) ([]byte, chunkstore.Hash, error) {
		p := prefixes[i%len(prefixes)]
		body := append(append(make([]byte, 0, len(p)+48), p...), `"meta":{"sandbox":"synthetic-`+strconv.Itoa(i)+`"}}`...)
		return body, chunkstore.Sum(body), nil
	}
	if body, root, _ := encode(7); true {
		m := *real[7%len(real)]
		m.Meta = map[string]string{"sandbox": "synthetic-7"}
		want, wantRoot, err := m.EncodeOver(base, ws.Root)
		if err != nil || root != wantRoot || !bytes.Equal(body, want) {
			return fmt.Errorf("the swapped encoding is not EncodeOver's: %v", err)
		}
	}
	fmt.Println("| step | n | time | rate | notes |")
	fmt.Println("|---|---:|---:|---:|---|")
	// Through the backend's Put (each manifest synced, and its directory),
	// a sample.
	t := time.Now()
	var roots []chunkstore.Hash
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i := range putSample {
		g.Go(func() error {
			body, root, err := encode(i)
			if err != nil {
				return err
			}
			mu.Lock()
			roots = append(roots, root)
			mu.Unlock()
			return b.Put(gctx, chunkstore.ManifestKey(root), body)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	d := time.Since(t)
	fmt.Printf("| write through Backend.Put (fsync each, 16 at once) | %d | %.1f s | %.0f /s | |\n", putSample, d.Seconds(), float64(putSample)/d.Seconds())
	// The rest written as the same files without a sync each, then one
	// syncfs: the store's layout, faster to fill.
	t = time.Now()
	var count atomic.Int64
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(runtime.GOMAXPROCS(0) * 2)
	mdir := filepath.Join(storeDir, "manifests")
	var bodyBytes atomic.Int64
	for i := putSample; i < n; i++ {
		if gctx.Err() != nil {
			break
		}
		g.Go(func() error {
			body, root, err := encode(i)
			if err != nil {
				return err
			}
			mu.Lock()
			roots = append(roots, root)
			mu.Unlock()
			bodyBytes.Add(int64(len(body)))
			count.Add(1)
			return os.WriteFile(filepath.Join(mdir, root.String()), body, 0o600)
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	if err := b.Flush(ctx); err != nil {
		return err
	}
	d = time.Since(t)
	fmt.Printf("| write the rest as files, one syncfs | %d | %.1f s | %.0f /s | %.1f KB each |\n", count.Load(), d.Seconds(), float64(count.Load())/d.Seconds(), float64(bodyBytes.Load())/float64(max(count.Load(), 1))/1e3)
	mn, msz, ma := objects(storeDir, "manifests")
	cn, csz, ca := objects(storeDir, "chunks")
	fmt.Printf("| store holds | %d manifests | | | %.2f GB (%.2f GB allocated); %d chunks, %.2f GB (%.2f allocated) |\n", mn, float64(msz)/1e9, float64(ma)/1e9, cn, float64(csz)/1e9, float64(ca)/1e9)

	t = time.Now()
	var listed int64
	if err := b.List(ctx, "manifests/", func(chunkstore.Object) error { listed++; return nil }); err != nil {
		return err
	}
	d = time.Since(t)
	fmt.Printf("| list the manifests | %d | %.1f s | %.0f /s | |\n", listed, d.Seconds(), float64(listed)/d.Seconds())

	t = time.Now()
	if _, err := s.Manifest(ctx, roots[len(roots)/2]); err != nil {
		return err
	}
	fmt.Printf("| read and resolve one (with its base) | 1 | %.1f ms | | |\n", ms(time.Since(t)))

	live := append(slices.Clone(roots), ws.Root)
	all := chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return live, nil })
	gs, err := s.GC(ctx, all, time.Hour)
	if err != nil {
		return err
	}
	fmt.Printf("| GC, all live (mark only) | %d | %.1f s | %.0f /s | %d manifests kept, %d chunks listed, %d deleted |\n", gs.Manifests, gs.Duration.Seconds(), float64(gs.Manifests)/gs.Duration.Seconds(), gs.LiveManifests, gs.Chunks, gs.DeletedChunks+gs.DeletedManifests)
	half := live[len(live)/2:]
	gs, err = s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return half, nil }), 0)
	if err != nil {
		return err
	}
	fmt.Printf("| GC, half live (mark and sweep) | %d | %.1f s | | %d manifests deleted, %d chunks deleted, %.2f GB freed |\n", gs.Manifests, gs.Duration.Seconds(), gs.DeletedManifests, gs.DeletedChunks, float64(gs.BytesFreed)/1e9)
	gs, err = s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return nil, nil }), 0)
	if err != nil {
		return err
	}
	fmt.Printf("| GC, nothing live | %d | %.1f s | | %d manifests deleted, %d chunks deleted, %.2f GB freed |\n", gs.Manifests, gs.Duration.Seconds(), gs.DeletedManifests, gs.DeletedChunks, float64(gs.BytesFreed)/1e9)
	fmt.Printf("\nload average at end: %s\n", loadavg())
	return nil
}
