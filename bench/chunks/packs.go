package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore"
	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
)

// packs compares, on one S3 server in one run, the store without pack
// files (one object a chunk, manifests of version 1 and 2: main before
// pack files) and with them (DefaultPackBytes, version 3): the warm image
// exported flat, the spilled sandboxes over it (as the daemon writes
// them), then cold imports of each, the two forms taking turns.
func packs(dir, tmp string, runs int) error {
	ctx := context.Background()
	srv, err := chunkstoretest.NewS3Server(filepath.Join(tmp, "s3-packs"))
	if err != nil {
		return err
	}
	defer srv.Close()
	bucket, err := srv.MakeBucket()
	if err != nil {
		return err
	}
	type image struct{ name, path string }
	images := []image{
		{"warm (default template)", filepath.Join(dir, "warm")},
		{"a (spilled)", filepath.Join(dir, "a")},
		{"b (spilled)", filepath.Join(dir, "b")},
	}
	if _, err := os.Stat(filepath.Join(dir, "big")); err == nil {
		images = append(images, image{"big (spilled, 140 MB of random data)", filepath.Join(dir, "big")})
	}
	type mode struct {
		name string
		pack int
		b    chunkstore.Backend
	}
	modes := []*mode{{name: "loose", pack: -1}, {name: "packs", pack: chunkstore.DefaultPackBytes}}
	n := 0
	fresh := func() string { n++; return filepath.Join(tmp, fmt.Sprintf("p%d", n)) }
	roots := map[string]map[string]chunkstore.Hash{}

	fmt.Println("\n### Pack files: export into S3 (warm flat, the spilled sandboxes over it)")
	fmt.Println()
	fmt.Println("| image | store | ms | uploaded | objects written | manifest | phases (ms) |")
	fmt.Println("|---|---|---:|---:|---:|---:|---|")
	for _, md := range modes {
		b, err := chunkstore.OpenS3(ctx, bucket, md.name, srv.Config())
		if err != nil {
			return err
		}
		md.b = b
		s, err := chunkstore.New(b, chunkstore.Options{PackBytes: md.pack})
		if err != nil {
			return err
		}
		roots[md.name] = map[string]chunkstore.Hash{}
		var warm chunkstore.Hash
		for i, im := range images {
			st, err := s.ExportOver(ctx, im.path, map[string]string{"image": im.name}, warm)
			if err != nil {
				return err
			}
			if i == 0 {
				warm = st.Root
			}
			roots[md.name][im.name] = st.Root
			objs := st.Transferred
			if md.pack > 0 {
				objs = st.Packs
			}
			fmt.Printf("| %s | %s | %s | %.2f MB | %d + manifest | %.1f KB | %s |\n", im.name, md.name, ms(st.Duration),
				float64(st.TransferredBytes)/1e6, objs, float64(st.ManifestBytes)/1e3, phases(st))
		}
	}
	fmt.Println()
	fmt.Println("| store | chunk objects | pack objects | bytes of chunks and packs |")
	fmt.Println("|---|---:|---:|---:|")
	for _, md := range modes {
		var chunks, packs int
		var bytes int64
		for prefix, c := range map[string]*int{"chunks/": &chunks, "packs/": &packs} {
			if err := md.b.List(ctx, prefix, func(o chunkstore.Object) error { *c++; bytes += o.Size; return nil }); err != nil {
				return err
			}
		}
		fmt.Printf("| %s | %d | %d | %.1f MB |\n", md.name, chunks, packs, float64(bytes)/1e6)
	}

	fmt.Printf("\n### Pack files: import from S3 with a cold cache (median of %d, the two stores taking turns)\n\n", runs)
	fmt.Println("| image | host | loose ms | loose fetched | packs ms | packs fetched | loose / packs | packs phases (ms, last run) |")
	fmt.Println("|---|---|---:|---:|---:|---:|---:|---|")
	// The hosts: cold (nothing cached, no template); one that has the
	// template's warm image (noted at start, and pulled through the store;
	// not timed); and one that also holds the sandbox's own chunks in its
	// cache (an import before, not timed): the wake from the host cache.
	const cold, noted, cached = "cold", "warm image noted", "warm image noted, its chunks cached"
	for _, im := range images {
		for _, host := range []string{cold, noted, cached} {
			if host != cold && im.name == images[0].name {
				continue // the warm image itself is linked, nothing fetched
			}
			ds := map[string][]time.Duration{}
			last := map[string]chunkstore.Stats{}
			behind := map[string]time.Duration{}
			for range runs {
				for _, md := range modes {
					c, err := chunkstore.OpenCache(fresh(), 8<<30)
					if err != nil {
						return err
					}
					s, err := chunkstore.New(md.b, chunkstore.Options{Cache: c, PackBytes: md.pack, Immutable: host != cold})
					if err != nil {
						return err
					}
					if host != cold {
						// A host with the template's warm image on its disk,
						// noted at start, and pulled through the store as a
						// cluster host pulls it (its files linked, its
						// manifest read; not timed).
						warm := fresh()
						if err := copyDir(images[0].path, warm); err != nil {
							return err
						}
						if err := s.Remember(ctx, warm); err != nil {
							return err
						}
						pulled := fresh()
						if _, err := s.Import(ctx, roots[md.name][images[0].name], pulled); err != nil {
							return err
						}
						flush(c)
						os.RemoveAll(pulled)
					}
					if host == cached {
						before := fresh()
						if _, err := s.Import(ctx, roots[md.name][im.name], before); err != nil {
							return err
						}
						flush(c)
						os.RemoveAll(before)
					}
					// The copies and removals before it written back, so
					// that the import is not timed against their
					// writeback (a host's warm image is long on disk).
					syscall.Sync()
					out := fresh()
					ist, err := s.Import(ctx, roots[md.name][im.name], out)
					if err != nil {
						return err
					}
					// The cache's writes behind the import, done before the
					// next one (not timed in the import).
					t := time.Now()
					flush(c)
					behind[md.name] = time.Since(t)
					ds[md.name] = append(ds[md.name], ist.Duration)
					last[md.name] = ist
					os.RemoveAll(out)
					os.RemoveAll(c.Dir())
				}
			}
			l, p := last["loose"], last["packs"]
			fmt.Printf("| %s | %s | %s | %d chunks, %.1f MB | %s | %d ranged reads, %.1f MB | %.1fx | %s, cache written behind %s |\n", im.name, host,
				ms(median(ds["loose"])), l.Transferred, float64(l.TransferredBytes)/1e6,
				ms(median(ds["packs"])), p.Packs, float64(p.TransferredBytes)/1e6,
				float64(median(ds["loose"]))/float64(median(ds["packs"])), phases(p), ms(behind["packs"]))
		}
	}
	return nil
}
