// Command cluster measures cellfork's cluster on one machine and prints
// Markdown tables (docs/benchmarks.md, "Cluster"):
//
//   - placement: the decision against 1, 100, 1,000 and 10,000 hosts (rows
//     in PostgreSQL, no sandboxes) and the reservation's round trip;
//
//   - the gateway's cost: a hot run_code and a 1 KB file read through the
//     gateway and straight to the host, interleaved, and the database
//     queries per data-plane request;
//
//   - creates through the gateway and straight to the host (pool hits),
//     and creates per second through one gateway against three hosts;
//
//   - 10,000 idle keep-alive connections held by one gateway: its memory,
//     and a hot run_code's latency meanwhile;
//
//   - a fork beyond the parent's host (forks.go): its own cluster, with an
//     S3 store, this build's gateway against -gateway-b's.
//
//     scripts/bench.sh --suite cluster   (go run ./bench/cluster)
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/clusterdb/pgtest"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

var (
	bin      = flag.String("bin", "bin/cellfork", "the cellfork binary")
	tpl      = flag.String("template-dir", "/var/lib/cellfork/templates", "the template directory")
	n        = flag.Int("n", 300, "samples of the hot paths")
	conns    = flag.Int("conns", 10000, "idle connections to hold")
	quick    = flag.Bool("quick", false, "fewer samples")
	only     = flag.String("only", "", "run only these parts, comma-separated: placement, overhead, creates, connections, forks")
	gwBQuiet = flag.Bool("gateway-b-quiet", false, "run -gateway-b's gateway without -v (requests not logged)")
	gwBEnv   = flag.String("gateway-b-env", "", "environment for -gateway-b's gateway, comma-separated (GOMAXPROCS=1)")
	gwB      = flag.String("gateway-b", "", "a second build's cellfork binary: its gateway (region eu, beside the first) is measured in the same run as the gateway's overhead and the forks, requests interleaved")
)

// part reports whether a part of the benchmark is to run.
func part(name string) bool {
	if *only == "" {
		return true
	}
	for _, p := range strings.Split(*only, ",") {
		if strings.TrimSpace(p) == name {
			return true
		}
	}
	return false
}

func main() {
	flag.Parse()
	if *quick {
		*n, *conns = 60, 2000
	}
	// Room for the idle connections (the gateway inherits it).
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: 65536, Max: 65536})
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "cellfork-bench-cluster-")
	defer os.RemoveAll(dir)
	fmt.Printf("load average before: %s\n\n", loadavg())
	if part("placement") {
		if err := benchPlacement(ctx, dir); err != nil {
			fail(err)
		}
	}
	if part("forks") {
		if err := benchForks(ctx, dir); err != nil {
			fail(err)
		}
	}
	if !part("overhead") && !part("creates") && !part("connections") {
		return
	}
	absBin, _ := filepath.Abs(*bin)
	c, err := harness.Start(ctx, harness.Options{Dir: filepath.Join(dir, "c"), Bin: absBin, TemplateDir: *tpl,
		HostFlags: []string{"--pool-ready", "1", "--pool-shells", "1"}})
	if err != nil {
		fail(err)
	}
	defer c.Close()
	db, err := clusterdb.Open(ctx, c.PG.URL)
	if err != nil {
		fail(err)
	}
	secrets, err := db.EnsureSecrets(ctx, ids.RandomKey)
	db.Close()
	if err != nil {
		fail(err)
	}
	b := &bench{c: c, key: secrets.Internal}
	if part("overhead") {
		b.overhead()
	}
	if part("creates") {
		b.creates()
	}
	if part("connections") {
		b.connections()
	}
	fmt.Printf("load average after: %s\n", loadavg())
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench cluster:", err)
	os.Exit(1)
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// pct returns the q-quantile of xs (sorted here).
func pct(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	return xs[min(len(xs)-1, int(q*float64(len(xs)-1)+0.5))]
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }

// benchPlacement: the decision in memory and the reservation in
// PostgreSQL, against simulated hosts.
func benchPlacement(ctx context.Context, dir string) error {
	pg, err := pgtest.Start(filepath.Join(dir, "placement"), "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer pg.Stop()
	db, err := clusterdb.Open(ctx, pg.URL)
	if err != nil {
		return err
	}
	defer db.Close()
	if err := db.PutRegion(ctx, clusterdb.Region{ID: 1, Name: "r"}); err != nil {
		return err
	}
	if err := db.PutTeam(ctx, clusterdb.Team{ID: "t"}); err != nil {
		return err
	}
	fmt.Println("### Placement (simulated hosts: rows in PostgreSQL, no sandboxes)")
	fmt.Println()
	fmt.Println("| hosts | decision p50 (µs) | decision p99 (µs) | reserve + release p50 (ms) | reserve + release p99 (ms) | table load (ms) |")
	fmt.Println("|---|---|---|---|---|---|")
	have := 0
	for _, want := range []int{1, 100, 1000, 10000} {
		for ; have < want; have++ {
			slot, epoch, err := db.Register(ctx, fmt.Sprintf("sim-%d", have), 1, fmt.Sprintf("10.0.%d.%d:3000", have/250, have%250))
			if err != nil {
				return err
			}
			ready := map[string]int{}
			if have%3 == 0 {
				ready["base"] = 1
			}
			if err := db.Heartbeat(ctx, clusterdb.Host{Slot: slot, Epoch: epoch, CPUs: 32, MemTotalMB: 262144,
				MemAllocMB: int64(rand.IntN(200000)), Versions: map[string]string{"runsc": "v"},
				Capacity: clusterdb.Capacity{Ready: ready}}, time.Hour); err != nil {
				return err
			}
		}
		t0 := time.Now()
		hosts, err := db.Hosts(ctx, time.Time{})
		if err != nil {
			return err
		}
		load := time.Since(t0)
		tbl := placement.NewTable(hosts, time.Now())
		rng := rand.New(rand.NewPCG(1, 2))
		var dec, res []float64
		for i := 0; i < 5000; i++ {
			t := time.Now()
			cands, _ := tbl.Choose(placement.Request{Region: 1, MemoryMB: 1024, Template: "base"}, rng)
			dec = append(dec, float64(time.Since(t).Nanoseconds())/1e3)
			if len(cands) == 0 {
				return fmt.Errorf("nothing placed among %d hosts", want)
			}
			if i < 300 {
				h := cands[0]
				id := ids.NewSandbox(1, h.Slot)
				t = time.Now()
				if err := db.Reserve(ctx, clusterdb.Sandbox{ID: id, Team: "t", Region: 1, HostSlot: h.Slot, MemoryMB: 1024}, 0); err != nil {
					return err
				}
				if err := db.Release(ctx, id, h.Slot, 1024); err != nil {
					return err
				}
				res = append(res, ms(time.Since(t)))
			}
		}
		fmt.Printf("| %d | %.1f | %.1f | %.2f | %.2f | %.1f |\n", want, pct(dec, 0.5), pct(dec, 0.99), pct(res, 0.5), pct(res, 0.99), ms(load))
	}
	fmt.Println()
	return nil
}

type bench struct {
	c   *harness.Cluster
	key []byte
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}, Timeout: 2 * time.Minute}

type sbx struct {
	ID    string `json:"sandboxID"`
	Token string `json:"envdAccessToken"`
}

// viaGateway makes a request to eu's gateway.
func (b *bench) viaGateway(method, path string, body []byte, h map[string]string) (int, []byte, http.Header) {
	return b.send(b.c.URL("eu")+path, method, body, h, nil)
}

// direct makes a request to a host, signed as its gateway would.
func (b *bench) direct(host, method, path string, body []byte, h map[string]string, team, mint string) (int, []byte, http.Header) {
	return b.send("http://"+host+path, method, body, h, func(r *http.Request) { clusterauth.Sign(r, b.key, team, mint, time.Now()) })
}

func (b *bench) send(url, method string, body []byte, h map[string]string, sign func(*http.Request)) (int, []byte, http.Header) {
	req, _ := http.NewRequest(method, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range h {
		req.Header.Set(k, v)
	}
	if sign != nil {
		sign(req)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, []byte(err.Error()), nil
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out, resp.Header
}

func (b *bench) create() sbx {
	st, body, _ := b.viaGateway("POST", "/v2/sandboxes", []byte(`{"templateID":"base","timeout":600}`), map[string]string{"X-API-KEY": b.c.Key})
	if st != 201 {
		fail(fmt.Errorf("create: %d %s", st, body))
	}
	var s sbx
	_ = json.Unmarshal(body, &s)
	return s
}

func (b *bench) kill(s sbx) {
	b.viaGateway("DELETE", "/sandboxes/"+s.ID, nil, map[string]string{"X-API-KEY": b.c.Key})
}

// hostAddr is where a sandbox lives (slot N is host N).
func (b *bench) hostAddr(id string) string {
	s, _ := ids.ParseSandbox(id)
	return b.c.Hosts[s.Slot-1].Addr
}

func (b *bench) gatewayQueries() int64 {
	_, body, _ := b.viaGateway("GET", "/health", nil, nil)
	var h struct {
		Q int64 `json:"dbQueries"`
	}
	_ = json.Unmarshal(body, &h)
	return h.Q
}

// overhead: the same requests through the gateway and straight to the
// host, interleaved (and through a second build's gateway, -gateway-b,
// in the same rotation).
func (b *bench) overhead() {
	s := b.create()
	defer b.kill(s)
	host := b.hostAddr(s.ID)
	type path struct {
		name string
		send func(method, path string, body []byte, h map[string]string) (int, []byte, http.Header)
		pid  int // the gateway's, for its CPU time
	}
	paths := []path{
		{"direct", func(method, p string, body []byte, h map[string]string) (int, []byte, http.Header) {
			return b.direct(host, method, p, body, h, "", "")
		}, 0},
		{"gateway", b.viaGateway, b.c.Gateways["eu"].PID()},
	}
	if *gwB != "" {
		abs, _ := filepath.Abs(*gwB)
		o := harness.GatewayOptions{Bin: abs, Quiet: *gwBQuiet}
		if *gwBEnv != "" {
			o.Env = strings.Split(*gwBEnv, ",")
		}
		g, err := b.c.AddGateway("eu", o)
		if err != nil {
			fail(err)
		}
		paths[1].name = "gateway A"
		paths = append(paths, path{"gateway B", func(method, p string, body []byte, h map[string]string) (int, []byte, http.Header) {
			return b.send("http://"+g.Addr+p, method, body, h, nil)
		}, g.PID()})
		time.Sleep(2 * time.Second) // its first look at the hosts
	}
	dp := func(port string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": s.ID, "E2b-Sandbox-Port": port, "X-Access-Token": s.Token}
	}
	kb := strings.Repeat("x", 1024)
	b.viaGateway("POST", "/files?path=/home/user/kb.txt&username=user", []byte(kb), map[string]string{
		"E2b-Sandbox-Id": s.ID, "E2b-Sandbox-Port": "49983", "X-Access-Token": s.Token, "Content-Type": "application/octet-stream"})
	type op struct {
		name, method, path, port string
		body                     []byte
	}
	ops := []op{
		{"hot run_code", "POST", "/execute", "49999", []byte(`{"code":"1"}`)},
		{"1 KB file read", "GET", "/files?path=/home/user/kb.txt&username=user", "49983", nil},
	}
	fmt.Println("### Gateway overhead (same sandbox, requests alternating between the gateway and the host)")
	fmt.Println()
	fmt.Println("| request | path | p50 (ms) | added p50 | p99 (ms) | added p99 | gateway `route` p50 | gateway CPU per request (µs) |")
	fmt.Println("|---|---|---|---|---|---|---|---|")
	idleQ0 := b.gatewayQueries()
	time.Sleep(3 * time.Second)
	idleRate := float64(b.gatewayQueries()-idleQ0-1) / 3 // the gateway's own refreshes, per second
	q0, t0 := b.gatewayQueries(), time.Now()
	requests := 0
	for _, o := range ops {
		for i := 0; i < 20; i++ { // warm every path's connections
			for _, p := range paths {
				p.send(o.method, o.path, o.body, dp(o.port))
			}
		}
		lat := make([][]float64, len(paths))
		route := make([][]float64, len(paths))
		cpu0 := make([]int64, len(paths))
		for j, p := range paths {
			cpu0[j] = cpuNS(p.pid)
		}
		for i := 0; i < *n; i++ {
			for k := range paths {
				j := (i + k) % len(paths) // each path first in turn
				p := paths[j]
				t := time.Now()
				st, body, hdr := p.send(o.method, o.path, o.body, dp(o.port))
				if st != 200 {
					fail(fmt.Errorf("%s %s: %d %s", o.name, p.name, st, body))
				}
				lat[j] = append(lat[j], ms(time.Since(t)))
				if j == 1 {
					requests++
				}
				if v := phase(hdr.Get("Server-Timing"), "route"); j > 0 && v >= 0 {
					route[j] = append(route[j], v)
				}
			}
		}
		d50, d99 := pct(lat[0], .5), pct(lat[0], .99)
		fmt.Printf("| %s | direct | %.2f | | %.2f | | | |\n", o.name, d50, d99)
		for j := 1; j < len(paths); j++ {
			g50, g99 := pct(lat[j], .5), pct(lat[j], .99)
			cpu := float64(cpuNS(paths[j].pid)-cpu0[j]) / 1e3 / float64(*n)
			fmt.Printf("| %s | %s | %.2f | **%+.2f** | %.2f | %+.2f | %.3f | %.0f |\n", o.name, paths[j].name, g50, g50-d50, g99, g99-d99, pct(route[j], .5), cpu)
		}
	}
	q1, el := b.gatewayQueries(), time.Since(t0).Seconds()
	perReq := (float64(q1-q0-1) - idleRate*el) / float64(requests)
	fmt.Printf("\nDatabase queries per data-plane request through the gateway: %.3f (%d requests; %d queries in %.1f s, the gateway's own refreshes at %.1f/s subtracted)\n\n",
		max(perReq, 0), requests, q1-q0-1, el, idleRate)
}

// phase reads a phase's duration (ms) out of a Server-Timing header: the
// last one of that name (the gateway's own phases follow the host's), or
// -1.
func phase(h, name string) float64 {
	got := -1.0
	for _, part := range strings.Split(h, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), ";dur=")
		if ok && k == name {
			got, _ = strconv.ParseFloat(v, 64)
		}
	}
	return got
}

// creates: pool hits through the gateway and straight to the host, and a
// burst's rate.
func (b *bench) creates() {
	samples := 8
	if *quick {
		samples = 3
	}
	var g, d []float64
	team := b.c.Team
	for i := 0; i < samples; i++ {
		time.Sleep(2 * time.Second) // the pools refill
		t := time.Now()
		s := b.create()
		g = append(g, ms(time.Since(t)))
		b.kill(s)
		time.Sleep(2 * time.Second)
		h := b.c.Hosts[0]
		id := ids.NewSandbox(1, 1)
		// A row first, as the gateway's reservation makes.
		t = time.Now()
		st, body, _ := b.direct(h.Addr, "POST", "/v2/sandboxes", []byte(`{"templateID":"base","timeout":600}`), nil, team, id)
		if st != 201 {
			fail(fmt.Errorf("direct create: %d %s", st, body))
		}
		d = append(d, ms(time.Since(t)))
		b.direct(h.Addr, "DELETE", "/sandboxes/"+id, nil, nil, team, "")
	}
	fmt.Println("### Create (pool hit), client wall time")
	fmt.Println()
	fmt.Println("| path | n | p50 (ms) | p99 (ms) |")
	fmt.Println("|---|---|---|---|")
	fmt.Printf("| straight to the host | %d | %.1f | %.1f |\n", len(d), pct(d, .5), pct(d, .99))
	fmt.Printf("| through the gateway (placement, reservation, host) | %d | %.1f | %.1f |\n\n", len(g), pct(g, .5), pct(g, .99))

	burst := 12
	if *quick {
		burst = 6
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var made []sbx
	t0 := time.Now()
	sem := make(chan struct{}, 4)
	for i := 0; i < burst; i++ {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			s := b.create()
			mu.Lock()
			made = append(made, s)
			mu.Unlock()
		})
	}
	wg.Wait()
	el := time.Since(t0)
	for _, s := range made {
		b.kill(s)
	}
	fmt.Printf("Creates per second through one gateway against three hosts: %.1f (%d creates, 4 at a time, in %.1f s; restores bound it on this 2-core machine)\n\n",
		float64(burst)/el.Seconds(), burst, el.Seconds())
}

// connections: idle keep-alive connections held by the gateway.
func (b *bench) connections() {
	s := b.create()
	defer b.kill(s)
	gw := b.c.Gateways["eu"]
	rss0 := rss(gw.PID())
	addr := gw.Addr
	var held []net.Conn
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	t0 := time.Now()
	for i := 0; i < *conns; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			fmt.Printf("(stopped at %d connections: %v)\n", i, err)
			break
		}
		fmt.Fprintf(c, "GET /health HTTP/1.1\r\nHost: gw\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			fmt.Printf("(stopped at %d connections: %v)\n", i, err)
			break
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		held = append(held, c)
	}
	opened := time.Since(t0)
	rss1 := rss(gw.PID())
	dp := map[string]string{"E2b-Sandbox-Id": s.ID, "E2b-Sandbox-Port": "49999", "X-Access-Token": s.Token}
	var lat []float64
	for i := 0; i < *n; i++ {
		t := time.Now()
		if st, body, _ := b.viaGateway("POST", "/execute", []byte(`{"code":"1"}`), dp); st != 200 {
			fail(fmt.Errorf("run_code while holding connections: %d %s", st, body))
		}
		lat = append(lat, ms(time.Since(t)))
	}
	fmt.Println("### Idle connections held by one gateway")
	fmt.Println()
	fmt.Println("| idle keep-alive connections | opened in (s) | gateway RSS before (MiB) | after (MiB) | per connection (KiB) | hot run_code p50 meanwhile (ms) | p99 (ms) |")
	fmt.Println("|---|---|---|---|---|---|---|")
	fmt.Printf("| %d | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n\n", len(held), opened.Seconds(), float64(rss0)/1024, float64(rss1)/1024,
		float64(rss1-rss0)/float64(max(len(held), 1)), pct(lat, .5), pct(lat, .99))
}

// cpuNS is the CPU time a process's threads have run (ns; schedstat), 0
// for pid 0.
func cpuNS(pid int) int64 {
	if pid == 0 {
		return 0
	}
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/schedstat", pid))
	var sum int64
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		if f := strings.Fields(string(b)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			sum += n
		}
	}
	return sum
}

// rss is a process's resident memory in KiB.
func rss(pid int) int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				n, _ := strconv.ParseInt(f[0], 10, 64)
				return n
			}
		}
	}
	return 0
}
