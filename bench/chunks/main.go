// Command chunks measures the chunk store on real gVisor images and prints
// Markdown tables (docs/benchmarks.md, "Chunk store"):
//
//	go run ./bench/chunks -images DIR
//
// DIR holds image directories: warm/ (a template's warm image), a/ and b/
// (two sandboxes restored from it, different small workloads, spilled)
// and, optionally, big/ (a spilled sandbox of about 200 MB). It measures
// how much the images share under several chunkings, then exports and
// imports them through a file:// store and an S3 server (versitygw on
// loopback, started here). -only packs compares stores with and without
// pack files on one S3 server (cold imports taking turns); -only requests
// what 66 MB costs to GET by object size.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

func main() {
	images := flag.String("images", "", "directory with warm/, a/, b/ and optionally big/")
	runs := flag.Int("runs", 5, "imports per measurement (the median is shown)")
	only := flag.String("only", "share,store", "sections to run: share, store, packs, requests")
	flag.Parse()
	if *images == "" {
		fmt.Fprintln(os.Stderr, "usage: chunks -images DIR")
		os.Exit(2)
	}
	if err := run(*images, *runs, *only); err != nil {
		fmt.Fprintln(os.Stderr, "chunks:", err)
		os.Exit(1)
	}
}

func run(dir string, runs int, only string) error {
	load, _ := os.ReadFile("/proc/loadavg")
	fmt.Printf("load average at start: %s\n", strings.Join(strings.Fields(string(load))[:3], " "))
	if strings.Contains(only, "share") {
		if err := share(dir); err != nil {
			return err
		}
	}
	if strings.Contains(only, "store") {
		tmp, err := os.MkdirTemp("", "chunks-bench-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		small := filepath.Join(tmp, "small")
		chunkstoretest.Image{Seed: 5, Pool: 6, Pages: 1750}.Write(tb{}, small)
		if err := stores(dir, small, tmp, runs); err != nil {
			return err
		}
	}
	if strings.Contains(only, "packs") {
		tmp, err := os.MkdirTemp("", "chunks-packs-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		if err := packs(dir, tmp, runs); err != nil {
			return err
		}
	}
	if strings.Contains(only, "requests") {
		if err := requests(runs); err != nil {
			return err
		}
	}
	load, _ = os.ReadFile("/proc/loadavg")
	fmt.Printf("\nload average at end: %s\n", strings.Join(strings.Fields(string(load))[:3], " "))
	return nil
}

// tb lets chunkstoretest's image writer run outside a test.
type tb struct{}

func (tb) Helper()           {}
func (tb) Fatal(args ...any) { panic(fmt.Sprint(args...)) }

// chunkSet is an image's stored chunks: hash -> size, and the list.
type chunkSet struct {
	set   map[[32]byte]int
	list  [][32]byte
	sizes []int
	zeros int
}

func cut(dir string, c chunkstore.Chunking) (chunkSet, error) {
	cs := chunkSet{set: map[[32]byte]int{}}
	names, err := filepath.Glob(filepath.Join(dir, "*.img"))
	if err != nil {
		return cs, err
	}
	for _, n := range names {
		f, err := os.Open(n)
		if err != nil {
			return cs, err
		}
		err = c.Split(f, func(_ int64, data []byte) error {
			if bytes.Count(data, []byte{0}) == len(data) {
				cs.zeros++
				return nil
			}
			h := chunkstore.Sum(data)
			cs.set[h] = len(data)
			cs.list = append(cs.list, h)
			cs.sizes = append(cs.sizes, len(data))
			return nil
		})
		f.Close()
		if err != nil {
			return cs, err
		}
	}
	return cs, nil
}

func share(dir string) error {
	chunkings := []struct {
		name string
		c    chunkstore.Chunking
	}{
		{"fixed 64 KiB", chunkstore.FixedChunking(64 << 10)},
		{"fixed 4 KiB (pages)", chunkstore.FixedChunking(4 << 10)},
		{"FastCDC 16/64/256 KiB", chunkstore.Chunking{Alg: chunkstore.AlgFastCDC, Min: 16 << 10, Avg: 64 << 10, Max: 256 << 10}},
		{"FastCDC 8/32/128 KiB (default)", chunkstore.DefaultChunking},
		{"FastCDC 4/16/64 KiB", chunkstore.Chunking{Alg: chunkstore.AlgFastCDC, Min: 4 << 10, Avg: 16 << 10, Max: 64 << 10}},
	}
	fmt.Println("\n### How much the images share")
	fmt.Println()
	fmt.Println("| chunking | image | chunks (zero) | mean chunk | in warm image | in warm or the other | new bytes |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|")
	for _, ch := range chunkings {
		warm, err := cut(filepath.Join(dir, "warm"), ch.c)
		if err != nil {
			return err
		}
		sets := map[string]chunkSet{}
		for _, n := range []string{"a", "b"} {
			if sets[n], err = cut(filepath.Join(dir, n), ch.c); err != nil {
				return err
			}
		}
		for _, n := range []string{"a", "b"} {
			other := sets[map[string]string{"a": "b", "b": "a"}[n]]
			s := sets[n]
			var inW, inEither int
			var total, fresh int64
			for i, h := range s.list {
				_, w := warm.set[h]
				_, o := other.set[h]
				total += int64(s.sizes[i])
				if w {
					inW++
				}
				if w || o {
					inEither++
				} else {
					fresh += int64(s.sizes[i])
				}
			}
			f := float64(len(s.list))
			fmt.Printf("| %s | %s | %d (%d) | %.1f KiB | %.1f%% | %.1f%% | %.1f MB of %.1f |\n", ch.name, n, len(s.list), s.zeros,
				float64(total)/f/1024, 100*float64(inW)/f, 100*float64(inEither)/f, float64(fresh)/1e6, float64(total)/1e6)
		}
	}
	return nil
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d.Microseconds())/1000) }

func median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func phases(st chunkstore.Stats) string {
	var parts []string
	for _, p := range st.Phases {
		parts = append(parts, fmt.Sprintf("%s %s", strings.TrimPrefix(strings.TrimPrefix(p.Name, "export."), "import."), ms(p.Dur)))
	}
	return strings.Join(parts, ", ")
}

func dirBytes(dir string) int64 {
	var n int64
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if info, err := e.Info(); err == nil {
			n += info.Size()
		}
	}
	return n
}

// copyDir copies an image directory file by file: what an import costs at
// least if it writes every byte.
func copyDir(src, dst string) error {
	if err := os.Mkdir(dst, 0o700); err != nil {
		return err
	}
	ents, _ := os.ReadDir(src)
	for _, e := range ents {
		in, err := os.Open(filepath.Join(src, e.Name()))
		if err != nil {
			return err
		}
		out, err := os.Create(filepath.Join(dst, e.Name()))
		if err != nil {
			in.Close()
			return err
		}
		_, err = io.Copy(out, in)
		in.Close()
		out.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func stores(dir, small, tmp string, runs int) error {
	ctx := context.Background()
	srv, err := chunkstoretest.NewS3Server(filepath.Join(tmp, "s3"))
	if err != nil {
		return err
	}
	defer srv.Close()
	bucket, err := srv.MakeBucket()
	if err != nil {
		return err
	}
	images := []struct{ name, path string }{
		{"warm (default template)", filepath.Join(dir, "warm")},
		{"a (spilled)", filepath.Join(dir, "a")},
		{"b (spilled)", filepath.Join(dir, "b")},
		{"small (synthetic)", small},
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); err == nil {
		images = append(images, struct{ name, path string }{"big (spilled, 140 MB of random data)", filepath.Join(dir, "big")})
	}
	n := 0
	fresh := func() string { n++; return filepath.Join(tmp, fmt.Sprintf("x%d", n)) }

	// Baselines: copying and hashing every byte.
	fmt.Println("\n### Baselines (what any import that writes every byte pays)")
	fmt.Println()
	fmt.Println("| image | size | copy the directory (ms) | BLAKE3 of every byte (ms) | SHA-256 of every byte (ms) |")
	fmt.Println("|---|---:|---:|---:|---:|")
	for _, im := range images {
		var cp, b3, s2 []time.Duration
		for range runs {
			out := fresh()
			t := time.Now()
			if err := copyDir(im.path, out); err != nil {
				return err
			}
			cp = append(cp, time.Since(t))
			os.RemoveAll(out)
			data, _ := os.ReadFile(filepath.Join(im.path, "pages.img"))
			t = time.Now()
			for off := 0; off < len(data); off += 32 << 10 {
				chunkstore.Sum(data[off:min(off+32<<10, len(data))])
			}
			b3 = append(b3, time.Since(t))
			t = time.Now()
			for off := 0; off < len(data); off += 32 << 10 {
				sha256.Sum256(data[off:min(off+32<<10, len(data))])
			}
			s2 = append(s2, time.Since(t))
		}
		fmt.Printf("| %s | %.1f MB | %s | %s | %s |\n", im.name, float64(dirBytes(im.path))/1e6, ms(median(cp)), ms(median(b3)), ms(median(s2)))
	}

	for _, kind := range []string{"file", "s3"} {
		var b chunkstore.Backend
		if kind == "file" {
			b, err = chunkstore.OpenFile(filepath.Join(tmp, "store"))
		} else {
			b, err = chunkstore.OpenS3(ctx, bucket, "bench", srv.Config())
		}
		if err != nil {
			return err
		}
		cache, err := chunkstore.OpenCache(filepath.Join(tmp, kind+"-cache"), 8<<30)
		if err != nil {
			return err
		}
		s, err := chunkstore.New(b, chunkstore.Options{Cache: cache})
		if err != nil {
			return err
		}
		fmt.Printf("\n### Export into %s (in this order; the host cache fills as it goes)\n\n", kind+"://")
		fmt.Println("| image | export | ms | chunks (distinct) | already stored | uploaded | manifest | phases (ms) |")
		fmt.Println("|---|---|---:|---:|---:|---:|---:|---|")
		roots := map[string]chunkstore.Hash{}
		for _, im := range images {
			for _, which := range []string{"first", "again"} {
				st, err := s.Export(ctx, im.path, map[string]string{"image": im.name})
				if err != nil {
					return err
				}
				roots[im.name] = st.Root
				mb, _ := b.Get(ctx, chunkstore.ManifestKey(st.Root))
				fmt.Printf("| %s | %s | %s | %d (%d) | %.1f%% | %d chunks, %.2f MB | %.1f KB | %s |\n", im.name, which, ms(st.Duration), st.Chunks, st.Distinct,
					100*float64(st.Present)/float64(max(st.Distinct, 1)), st.Transferred, float64(st.TransferredBytes)/1e6, float64(len(mb))/1e3, phases(st))
			}
		}

		fmt.Printf("\n### Import from %s (median of %d)\n\n", kind+"://", runs)
		fmt.Println("| image | from | ms | fetched | phases (ms) |")
		fmt.Println("|---|---|---:|---:|---|")
		for _, im := range images {
			root := roots[im.name]
			type mode struct {
				name  string
				store func() (*chunkstore.Store, *chunkstore.Cache, error)
			}
			linked, err := chunkstore.New(b, chunkstore.Options{Cache: cache, LinkFiles: true})
			if err != nil {
				return err
			}
			modes := []mode{
				{"host cache (warm)", func() (*chunkstore.Store, *chunkstore.Cache, error) { return s, cache, nil }},
				{"host cache, LinkFiles (after one import)", func() (*chunkstore.Store, *chunkstore.Cache, error) { return linked, cache, nil }},
			}
			if kind == "s3" {
				modes = append(modes, mode{"S3, cold cache", func() (*chunkstore.Store, *chunkstore.Cache, error) {
					c, err := chunkstore.OpenCache(fresh(), 8<<30)
					if err != nil {
						return nil, nil, err
					}
					st, err := chunkstore.New(b, chunkstore.Options{Cache: c})
					return st, c, err
				}}, mode{"S3, cold cache, warm image noted (Remember; not timed)", func() (*chunkstore.Store, *chunkstore.Cache, error) {
					// A host of the cluster: the template's warm image is on
					// its disk, noted at start; nothing else is cached.
					c, err := chunkstore.OpenCache(fresh(), 8<<30)
					if err != nil {
						return nil, nil, err
					}
					st, err := chunkstore.New(b, chunkstore.Options{Cache: c, Immutable: true})
					if err != nil {
						return nil, nil, err
					}
					warm := fresh()
					if err := copyDir(filepath.Join(dir, "warm"), warm); err != nil {
						return nil, nil, err
					}
					return st, c, st.Remember(ctx, warm)
				}})
			} else {
				modes = append(modes, mode{"file store, no cache", func() (*chunkstore.Store, *chunkstore.Cache, error) {
					st, err := chunkstore.New(b, chunkstore.Options{})
					return st, nil, err
				}})
			}
			for _, md := range modes {
				var ds []time.Duration
				var last chunkstore.Stats
				for range runs {
					st, c, err := md.store()
					if err != nil {
						return err
					}
					out := fresh()
					ist, err := st.Import(ctx, root, out)
					if err != nil {
						return err
					}
					if c != nil {
						flush(c) // its writes behind the import, before the next
					}
					ds = append(ds, ist.Duration)
					last = ist
					os.RemoveAll(out)
				}
				fmt.Printf("| %s | %s | %s | %d chunks, %.1f MB | %s |\n", im.name, md.name, ms(median(ds)), last.Transferred, float64(last.TransferredBytes)/1e6, phases(last))
			}
		}
		if kind == "file" {
			// What the spilled sandboxes cost once the warm image is stored.
			gcStart := time.Now()
			keep := roots["warm (default template)"]
			st, err := s.GC(ctx, chunkstore.RootsFunc(func(context.Context) ([]chunkstore.Hash, error) { return []chunkstore.Hash{keep}, nil }), 0)
			if err != nil {
				return err
			}
			fmt.Printf("\nGC keeping only the warm image: %d manifests and %d chunks deleted, %.1f MB freed, %s ms (%s ms in all)\n",
				st.DeletedManifests, st.DeletedChunks, float64(st.BytesFreed)/1e6, ms(st.Duration), ms(time.Since(gcStart)))
		}
		cs := cache.Stats()
		fmt.Printf("\nhost cache: %d objects, %.1f MB\n", cs.Objects, float64(cs.Bytes)/1e6)
	}
	return nil
}

// requests measures what 66 MB cost to GET from the S3 server as objects
// of different sizes, 16 in flight: the case for pack files.
func requests(runs int) error {
	ctx := context.Background()
	tmp, err := os.MkdirTemp("", "chunks-requests-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	srv, err := chunkstoretest.NewS3Server(filepath.Join(tmp, "s3"))
	if err != nil {
		return err
	}
	defer srv.Close()
	bucket, err := srv.MakeBucket()
	if err != nil {
		return err
	}
	b, err := chunkstore.OpenS3(ctx, bucket, "req", srv.Config())
	if err != nil {
		return err
	}
	const total = 66 << 20
	fmt.Println("\n### GET 66 MB from S3 (versitygw, loopback) by object size, 16 in flight")
	fmt.Println()
	fmt.Println("| object size | objects | ms (median) | MB/s |")
	fmt.Println("|---:|---:|---:|---:|")
	for _, size := range []int{32 << 10, 256 << 10, 1 << 20, 4 << 20} {
		n := total / size
		data := make([]byte, size)
		keys := make([]string, n)
		for i := range keys {
			data[0], data[1], data[2] = byte(i), byte(i>>8), byte(size>>10)
			keys[i] = fmt.Sprintf("obj/%d/%d", size, i)
			if err := b.Put(ctx, keys[i], data); err != nil {
				return err
			}
		}
		var ds []time.Duration
		for range runs {
			t := time.Now()
			sem := make(chan struct{}, 16)
			errs := make(chan error, n)
			for _, k := range keys {
				sem <- struct{}{}
				go func() {
					defer func() { <-sem }()
					_, err := b.Get(ctx, k)
					errs <- err
				}()
			}
			for range keys {
				if err := <-errs; err != nil {
					return err
				}
			}
			ds = append(ds, time.Since(t))
		}
		m := median(ds)
		fmt.Printf("| %d KiB | %d | %s | %.0f |\n", size>>10, n, ms(m), float64(total)/1e6/m.Seconds())
	}
	// The same bytes as one object read in 4 MiB ranges: a pack file.
	big := make([]byte, total)
	for i := range big {
		big[i] = byte(i * 7)
	}
	if err := b.Put(ctx, "obj/packed", big); err != nil {
		return err
	}
	var ds []time.Duration
	for range runs {
		t := time.Now()
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(16)
		for off := int64(0); off < total; off += 4 << 20 {
			g.Go(func() error {
				d, err := b.GetRange(gctx, "obj/packed", off, 4<<20)
				if err == nil && len(d) != 4<<20 {
					err = fmt.Errorf("ranged read of %d bytes", len(d))
				}
				return err
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		ds = append(ds, time.Since(t))
	}
	m := median(ds)
	fmt.Printf("| one object, 4 MiB ranged reads | %d | %s | %.0f |\n", total>>22, ms(m), float64(total)/1e6/m.Seconds())
	return nil
}

// flush waits for the cache's writes behind an import (Cache.Flush), so
// that the next import is not timed against them. A build whose imports
// wait for the cache themselves has no Flush: nothing to wait for (the
// bench builds against such a build too, for a side-by-side run).
func flush(c *chunkstore.Cache) {
	if f, ok := any(c).(interface{ Flush() }); ok {
		f.Flush()
	}
}
