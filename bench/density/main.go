// Command density measures what suspended sandboxes cost on one host and
// prints Markdown tables (docs/benchmarks.md, "Density"):
//
//	go run ./bench/density -url URL -key KEY -data-dir DIR -n 2000
//	    N real sandboxes of the default template, each given a distinct
//	    REPL variable and paused to disk, against a running daemon: bytes
//	    on the host's disk per sandbox, its state database, time to list
//	    them and to wake one and run a command, at checkpoints.
//	go run ./bench/density -store -data-dir DIR -warm WARM
//	    the paused images of that run exported into a file:// store, flat
//	    and as manifests over the warm image's.
//	go run ./bench/density -synthetic 1000000 -data-dir DIR -warm WARM -dir TMP
//	    a million manifests over the warm image's in one file:// store,
//	    each one of 20 paused images of that run (real chunks) with its own
//	    metadata: bytes, files, writing, listing and GC times.
//
// It kills nothing it did not create; -cleanup kills the sandboxes of a
// run (their ids are in DIR/density-ids).
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/client"
)

func main() {
	base := flag.String("url", "http://127.0.0.1:19700", "daemon URL")
	key := flag.String("key", "", "API key (default: DATA_DIR/api-key)")
	dataDir := flag.String("data-dir", "", "the daemon's data directory (for bytes on disk)")
	n := flag.Int("n", 1000, "sandboxes to create, give a change and pause to disk")
	minutes := flag.Float64("minutes", 20, "stop creating after this long")
	template := flag.String("template", "base", "template")
	wakes := flag.Int("wakes", 0, "wake this many of a run's sandboxes at random (run a command, pause again) and exit")
	cleanup := flag.Bool("cleanup", false, "kill the sandboxes of a run and exit")
	store := flag.Bool("store", false, "export the run's paused images into a file:// store")
	warm := flag.String("warm", "", "the template's warm image directory (for -store and -synthetic)")
	synthetic := flag.Int("synthetic", 0, "manifests over the warm image's to write into a file:// store")
	putSample := flag.Int("put-sample", 10000, "of the -synthetic manifests, how many to write through the backend's Put (synced one by one)")
	dir := flag.String("dir", "/tmp/den-synthetic", "scratch directory of -store and -synthetic (removed at the end)")
	flag.IntVar(&packBytes, "pack", 0, "-store, -synthetic: pack files of this many bytes in the store (0: none, as the daemon's file:// store)")
	flag.Parse()
	ctx := context.Background()
	var err error
	switch {
	case *synthetic > 0:
		err = runSynthetic(ctx, *dataDir, *warm, *dir, *synthetic, min(*putSample, *synthetic))
	case *store:
		err = runStore(ctx, *dataDir, *warm, *dir)
	default:
		if *key == "" {
			b, rerr := os.ReadFile(filepath.Join(*dataDir, "api-key"))
			if rerr != nil {
				fmt.Fprintln(os.Stderr, "density: -key or -data-dir with an api-key file")
				os.Exit(2)
			}
			*key = strings.TrimSpace(string(b))
		}
		c, cerr := client.New(*base, *key, nil)
		if cerr != nil {
			err = cerr
			break
		}
		if *wakes > 0 {
			err = wakeSome(ctx, c, *dataDir, *wakes)
			break
		}
		if *cleanup {
			err = killAll(ctx, c, *dataDir)
			break
		}
		err = runReal(ctx, c, *dataDir, *template, *n, time.Duration(*minutes*float64(time.Minute)))
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "density:", err)
		os.Exit(1)
	}
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(float64(len(s))*p))]
}

// diskUse is what a directory tree holds: bytes allocated to files only it
// names (one link), to files with other names as well (hard links to a
// template's image, counted once), and its inodes.
type diskUse struct {
	own, shared int64
	inodes      int64
}

func du(root string) (diskUse, error) {
	var u diskUse
	seen := map[uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		st := info.Sys().(*syscall.Stat_t)
		if seen[st.Ino] {
			return nil
		}
		seen[st.Ino] = true
		u.inodes++
		b := st.Blocks * 512
		if !d.IsDir() && st.Nlink > 1 {
			u.shared += b
		} else {
			u.own += b
		}
		return nil
	})
	return u, err
}

func fileSize(paths ...string) int64 {
	var n int64
	for _, p := range paths {
		if info, err := os.Stat(p); err == nil {
			n += info.Size()
		}
	}
	return n
}

type sandboxAnswer struct {
	SandboxID       string `json:"sandboxID"`
	EnvdAccessToken string `json:"envdAccessToken"`
}

// runReal creates, changes and pauses n sandboxes one at a time, printing
// a row at each checkpoint.
func runReal(ctx context.Context, c *client.Client, dataDir, template string, n int, limit time.Duration) error {
	idsPath := filepath.Join(dataDir, "density-ids")
	ids, err := os.OpenFile(idsPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer ids.Close()
	fmt.Printf("load average at start: %s (%s)\n\n", loadavg(), time.Now().UTC().Format("2006-01-02 15:04"))
	fmt.Println("| paused | host disk, own bytes per sandbox | shared with the template (once) | inodes per sandbox | state.db | create p50 / p95 (ms) | change p50 (ms) | pause to disk p50 / p95 (ms) | list: first 1,000 / all (ms) | wake + command p50 (ms, of 3) | load |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
	checkpoints := map[int]bool{1: true, 10: true, 100: true, 250: true, 500: true, 750: true, 1000: true, 1500: true, 2000: true, 3000: true, 5000: true, 10000: true}
	var created []string // this run's and those of runs before it
	if b, err := os.ReadFile(idsPath); err == nil {
		created = strings.Fields(string(b))
	}
	var tCreate, tChange, tPause []time.Duration
	start := time.Now()
	for i := len(created) + 1; i <= n; i++ {
		t0 := time.Now()
		var sb sandboxAnswer
		if _, err := c.Do(ctx, http.MethodPost, "/v2/sandboxes", nil, map[string]any{"templateID": template, "timeout": 86400}, &sb); err != nil {
			return fmt.Errorf("creating sandbox %d: %w", i, err)
		}
		created = append(created, sb.SandboxID)
		fmt.Fprintln(ids, sb.SandboxID)
		t1 := time.Now()
		ex, err := c.RunCode(ctx, sb.SandboxID, sb.EnvdAccessToken, fmt.Sprintf("x = %d\nopen('/tmp/mark', 'w').write('sandbox %d')", i, i), "", time.Minute)
		if err != nil || ex.Error != nil {
			return fmt.Errorf("changing sandbox %d: %v %v", i, err, ex.Error)
		}
		t2 := time.Now()
		if _, err := c.Do(ctx, http.MethodPost, "/sandboxes/"+sb.SandboxID+"/pause", nil, map[string]any{"spill": true}, nil); err != nil {
			return fmt.Errorf("pausing sandbox %d: %w", i, err)
		}
		t3 := time.Now()
		tCreate, tChange, tPause = append(tCreate, t1.Sub(t0)), append(tChange, t2.Sub(t1)), append(tPause, t3.Sub(t2))
		last := i == n || time.Since(start) > limit
		if checkpoints[len(created)] || last {
			if err := checkpoint(ctx, c, dataDir, created, tCreate, tChange, tPause); err != nil {
				return err
			}
			tCreate, tChange, tPause = nil, nil, nil
		}
		if last {
			break
		}
	}
	fmt.Printf("\n%d sandboxes in %.0f s; load average at end: %s\n", len(created), time.Since(start).Seconds(), loadavg())
	return nil
}

func checkpoint(ctx context.Context, c *client.Client, dataDir string, created []string, tCreate, tChange, tPause []time.Duration) error {
	u, err := du(filepath.Join(dataDir, "paused"))
	if err != nil {
		return err
	}
	n := int64(len(created))
	db := fileSize(filepath.Join(dataDir, "state.db"), filepath.Join(dataDir, "state.db-wal"))
	var lists, firsts []time.Duration
	for range 3 {
		t := time.Now()
		listed := 0
		next := ""
		for page := 0; ; page++ {
			q := url.Values{"state": {"paused"}, "limit": {"1000"}}
			if next != "" {
				q.Set("nextToken", next)
			}
			var out []map[string]any
			tp := time.Now()
			h, err := c.Do(ctx, http.MethodGet, "/v2/sandboxes", q, nil, &out)
			if err != nil {
				return fmt.Errorf("listing: %w", err)
			}
			if page == 0 {
				firsts = append(firsts, time.Since(tp))
			}
			listed += len(out)
			if next = h.Get("X-Next-Token"); next == "" {
				break
			}
		}
		lists = append(lists, time.Since(t))
		if int64(listed) < n {
			return fmt.Errorf("listing: %d paused sandboxes, want %d or more", listed, n)
		}
	}
	var wakes []time.Duration
	for range 3 {
		id := created[rand.IntN(len(created))]
		t := time.Now()
		sb, err := c.Connect(ctx, id)
		if err != nil {
			return fmt.Errorf("waking %s: %w", id, err)
		}
		res, err := c.RunCommand(ctx, id, sb.EnvdAccessToken, "", "cat /tmp/mark", "", nil, time.Minute)
		if err != nil || !strings.HasPrefix(res.Stdout, "sandbox ") {
			return fmt.Errorf("running a command in %s after waking it: %v %+v", id, err, res)
		}
		wakes = append(wakes, time.Since(t))
		if _, err := c.Do(ctx, http.MethodPost, "/sandboxes/"+id+"/pause", nil, map[string]any{"spill": true}, nil); err != nil {
			return fmt.Errorf("pausing %s again: %w", id, err)
		}
	}
	fmt.Printf("| %d | %.2f MB | %.1f MB | %.1f | %.1f MB | %.0f / %.0f | %.0f | %.0f / %.0f | %.1f / %.1f | %.0f | %s |\n",
		n, float64(u.own)/float64(n)/1e6, float64(u.shared)/1e6, float64(u.inodes)/float64(n), float64(db)/1e6,
		ms(median(tCreate)), ms(pct(tCreate, 0.95)), ms(median(tChange)), ms(median(tPause)), ms(pct(tPause, 0.95)),
		ms(median(firsts)), ms(median(lists)), ms(median(wakes)), loadavg())
	return nil
}

// killAll kills the sandboxes a run created.
func killAll(ctx context.Context, c *client.Client, dataDir string) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "density-ids"))
	if err != nil {
		return err
	}
	ids := strings.Fields(string(b))
	t := time.Now()
	failed := 0
	for _, id := range ids {
		if code, _, err := c.Call(ctx, http.MethodDelete, "/sandboxes/"+id, nil, nil, nil); err != nil && code != http.StatusNotFound {
			failed++
		}
	}
	fmt.Printf("killed %d sandboxes (%d failed) in %.1f s\n", len(ids)-failed, failed, time.Since(t).Seconds())
	if failed == 0 {
		return os.Remove(filepath.Join(dataDir, "density-ids"))
	}
	return nil
}

// wakeSome wakes n of a run's paused sandboxes at random, runs a command
// in each and pauses it to disk again.
func wakeSome(ctx context.Context, c *client.Client, dataDir string, n int) error {
	b, err := os.ReadFile(filepath.Join(dataDir, "density-ids"))
	if err != nil {
		return err
	}
	ids := strings.Fields(string(b))
	fmt.Printf("load average at start: %s (%s); %d paused sandboxes\n\n", loadavg(), time.Now().UTC().Format("2006-01-02 15:04"), len(ids))
	var connects, commands, totals []time.Duration
	for range n {
		id := ids[rand.IntN(len(ids))]
		t := time.Now()
		sb, err := c.Connect(ctx, id)
		if err != nil {
			return fmt.Errorf("waking %s: %w", id, err)
		}
		t1 := time.Now()
		res, err := c.RunCommand(ctx, id, sb.EnvdAccessToken, "", "cat /tmp/mark", "", nil, time.Minute)
		if err != nil || !strings.HasPrefix(res.Stdout, "sandbox ") {
			return fmt.Errorf("running a command in %s after waking it: %v %+v", id, err, res)
		}
		connects, commands, totals = append(connects, t1.Sub(t)), append(commands, time.Since(t1)), append(totals, time.Since(t))
		if _, err := c.Do(ctx, http.MethodPost, "/sandboxes/"+id+"/pause", nil, map[string]any{"spill": true}, nil); err != nil {
			return fmt.Errorf("pausing %s again: %w", id, err)
		}
	}
	fmt.Println("| of the paused sandboxes, at random | n | p50 (ms) | p95 (ms) |")
	fmt.Println("|---|---:|---:|---:|")
	fmt.Printf("| connect (resume from disk) | %d | %.0f | %.0f |\n", n, ms(median(connects)), ms(pct(connects, 0.95)))
	fmt.Printf("| then the command (`cat /tmp/mark`) | %d | %.0f | %.0f |\n", n, ms(median(commands)), ms(pct(commands, 0.95)))
	fmt.Printf("| wake and run a command | %d | %.0f | %.0f |\n", n, ms(median(totals)), ms(pct(totals, 0.95)))
	fmt.Printf("\nload average at end: %s\n", loadavg())
	return nil
}
