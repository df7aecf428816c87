package cluster

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cellfork/cellfork/test/cluster/harness"
)

// hostOf returns the harness host a sandbox lives on (slots are given in
// registration order: host N has slot N).
func hostOf(t *testing.T, sb sandbox) *harness.Host {
	t.Helper()
	var slot int
	fmt.Sscanf(decodeSlot(sb.ID), "%d", &slot)
	for _, h := range c.Hosts {
		if h.N == slot {
			return h
		}
	}
	t.Fatalf("no host with slot %d for %s", slot, sb.ID)
	return nil
}

// decodeSlot reads the host slot out of a sandbox id (positions 3-5).
func decodeSlot(id string) string {
	const alphabet = "0123456789abcdefghjkmnpqrstvwxyz"
	v := 0
	for _, ch := range id[3:6] {
		v = v*32 + strings.IndexRune(alphabet, ch)
	}
	return fmt.Sprint(v)
}

// testDatabaseOutage: PostgreSQL stops for 30 s. Running sandboxes keep
// answering through the gateways; creates get 503 with Retry-After at
// once; no host is declared lost; everything recovers.
func testDatabaseOutage(t *testing.T) {
	sb := create(t, "eu", nil)
	fenced := func() (n []int) { // each host's "declared lost" count so far
		for _, h := range c.Hosts {
			n = append(n, strings.Count(h.Logs(), "this host was declared lost"))
		}
		return n
	}
	before := fenced()
	stop := make(chan struct{})
	var calls, failures atomic.Int64
	var failed []string // the first few failures, to say what they were
	var wg sync.WaitGroup
	begin := time.Now()
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(200 * time.Millisecond):
			}
			calls.Add(1)
			t0 := time.Now()
			r := do(t, "eu", "POST", "/execute", map[string]any{"code": "print('up')"}, map[string]string{"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.Token, "X-API-KEY": ""})
			if !bytes.Contains(r.body, []byte(`"text":"up\n"`)) {
				if failures.Add(1) <= 5 {
					failed = append(failed, fmt.Sprintf("at %v (took %v): %d %s %.300s", t0.Sub(begin).Round(time.Millisecond), time.Since(t0).Round(time.Millisecond), r.status, r.header.Get("Server-Timing"), r.body))
				}
			}
		}
	})
	if err := c.PG.StopServer("fast"); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	t.Logf("the database stopped at %v, started again at %v", start.Sub(begin).Round(time.Millisecond), start.Add(30*time.Second).Sub(begin).Round(time.Millisecond))
	t0 := time.Now()
	r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, map[string]string{"X-Cellfork-Region": "eu"})
	if r.status != 503 || r.header.Get("Retry-After") == "" || time.Since(t0) > 2*time.Second {
		t.Errorf("create while the database is down: %d %s (Retry-After %q) after %v", r.status, r.body, r.header.Get("Retry-After"), time.Since(t0))
	}
	time.Sleep(30*time.Second - time.Since(start))
	if err := c.PG.StartServer(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * time.Second) // past a lease and the grace: a false loss would show
	close(stop)
	wg.Wait()
	if f := failures.Load(); f != 0 || calls.Load() < 50 {
		t.Errorf("run_code during the outage: %d of %d failed (times from the calls' start):\n%s", f, calls.Load(), strings.Join(failed, "\n"))
	}
	out, _ := c.AdminOut(context.Background(), "hosts")
	if after := fenced(); strings.Contains(out, "lost") || fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("a host was declared lost for the database's outage (hosts' fencings %v, before %v):\n%s", after, before, out)
	}
	eventually(t, 20*time.Second, "creates to work again", func() bool {
		r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 60}, nil)
		if r.status != 201 {
			return false
		}
		var s sandbox
		r.json(t, &s)
		do(t, "eu", "DELETE", "/sandboxes/"+s.ID, nil, nil)
		return true
	})
}

// testGatewayRestartWithoutDatabase: a gateway killed and started again
// while PostgreSQL is down routes from its cache file.
func testGatewayRestartWithoutDatabase(t *testing.T) {
	sb := create(t, "eu", nil)
	time.Sleep(11 * time.Second) // a cache write (every 10 s)
	if err := c.PG.StopServer("immediate"); err != nil {
		t.Fatal(err)
	}
	gw := c.Gateways["eu"]
	defer func() {
		if err := c.PG.StartServer(); err != nil {
			t.Fatal(err)
		}
		eventually(t, 30*time.Second, "the gateway to reach the database again", func() bool {
			var h map[string]any
			_ = jsonOf(do(t, "eu", "GET", "/health", nil, nil), &h)
			return h["database"] == true
		})
	}()
	gw.Signal(syscall.SIGKILL)
	t0 := time.Now()
	if err := gw.Start(); err != nil {
		t.Fatalf("the gateway did not start without the database: %v", err)
	}
	if out, status := runCode(t, "eu", sb, "print(1+1)"); out != "2\n" {
		t.Errorf("run_code through the restarted gateway: %d %q", status, out)
	}
	t.Logf("started and routed in %v without the database", time.Since(t0).Round(time.Millisecond))
}

// testPartitionAndHeal: a host cut off the network is declared lost (its
// sandboxes say so, and the data plane fails fast); healed, it takes its
// sandboxes back.
func testPartitionAndHeal(t *testing.T) {
	sb := create(t, "eu", nil)
	runCode(t, "eu", sb, "x = 'kept'")
	h := hostOf(t, sb)
	if err := h.Partition(); err != nil {
		t.Fatal(err)
	}
	healed := false
	defer func() {
		if !healed {
			_ = h.Heal()
		}
	}()
	eventually(t, 30*time.Second, "the partitioned host's sandbox to be reported lost", func() bool {
		var info map[string]any
		r := do(t, "eu", "GET", "/sandboxes/"+sb.ID, nil, nil)
		_ = jsonOf(r, &info)
		return info["state"] == "lost"
	})
	t0 := time.Now()
	r := do(t, "eu", "POST", "/execute", map[string]any{"code": "1"}, map[string]string{
		"E2b-Sandbox-Id": sb.ID, "E2b-Sandbox-Port": "49999", "X-Access-Token": sb.Token, "X-API-KEY": ""})
	if r.status != http.StatusBadGateway || time.Since(t0) > 1500*time.Millisecond || !strings.Contains(string(r.body), "lost") {
		t.Errorf("data plane to a lost host: %d %s after %v", r.status, r.body, time.Since(t0))
	}
	if err := h.Heal(); err != nil {
		t.Fatal(err)
	}
	healed = true
	eventually(t, 30*time.Second, "the healed host's sandbox to answer again", func() bool {
		out, _ := runCode(t, "eu", sb, "print(x)")
		return out == "kept\n"
	})
	var info map[string]any
	_ = jsonOf(do(t, "eu", "GET", "/sandboxes/"+sb.ID, nil, nil), &info)
	if info["state"] != "running" {
		t.Errorf("after healing: %v", info)
	}
}

// testHostKilled: a host loses power mid-exec, mid-create and while a
// paused sandbox's image is uploading (the store up: packs of it already
// written, not its manifest). The exec fails (no hang), creates go to the
// other host, its running sandboxes are reported lost within the lease
// and the data plane fails fast; the paused one waits for its host (no
// other host can resume it). Started again, the host takes new
// sandboxes, the dead ones are gone, and the paused one resumes there,
// once (two gateways asked at the same time), with its state.
func testHostKilled(t *testing.T) {
	ctx := context.Background()
	victim := create(t, "eu", nil)
	h := hostOf(t, victim)
	// On the same host, a sandbox with 192 MiB of its own memory (random:
	// no chunk of it is stored), paused to disk: its upload takes long
	// enough to be caught under way.
	var paused sandbox
	for paused.ID == "" || hostOf(t, paused).N != h.N {
		if paused.ID != "" {
			do(t, "eu", "DELETE", "/sandboxes/"+paused.ID, nil, nil)
		}
		paused = create(t, "eu", map[string]any{"memoryMB": 1024})
	}
	if out, status := runCode(t, "eu", paused, `import os; blob = os.urandom(192 << 20); v = 23; print(len(blob))`); out != "201326592\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	db := openDB(t)
	defer db.Close()
	packs := func() int {
		ents, _ := os.ReadDir(filepath.Join(c.StoreDir, "packs"))
		return len(ents)
	}
	execDone := make(chan error, 1)
	go func() {
		_, status := runCode(t, "eu", victim, "import time; time.sleep(60); print('never')")
		execDone <- fmt.Errorf("status %d", status)
	}()
	time.Sleep(500 * time.Millisecond)
	before := packs()
	if r := do(t, "eu", "POST", "/sandboxes/"+paused.ID+"/pause", map[string]any{"spill": true}, nil); r.status != 204 {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	eventually(t, 60*time.Second, "the paused image's upload to write a pack", func() bool { return packs() > before })
	var created, failed atomic.Int64
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 60}, nil)
			if r.status == 201 {
				created.Add(1)
				var s sandbox
				r.json(t, &s)
				defer do(t, "eu", "DELETE", "/sandboxes/"+s.ID, nil, nil)
			} else {
				failed.Add(1)
			}
		})
	}
	h.Kill()
	killed := time.Now()
	row, err := db.GetSandbox(ctx, paused.ID)
	if err != nil || row.State != "paused" || row.HostSlot != h.N {
		t.Fatalf("the paused sandbox's row at the kill: %+v %v", row, err)
	}
	if row.StoreRoot != "" {
		t.Fatalf("the upload ended before the kill (%d packs written before it): the test did not kill a host mid-upload", packs()-before)
	}
	t.Logf("host %d killed with %d packs of the paused image's upload written, not its manifest", h.N, packs()-before)
	select {
	case <-execDone:
	case <-time.After(10 * time.Second):
		t.Error("an exec on the killed host hung")
	}
	wg.Wait()
	t.Logf("creates during the kill: %d created, %d failed", created.Load(), failed.Load())
	if created.Load() == 0 {
		t.Error("no create went to the other host")
	}
	eventually(t, 20*time.Second, "the dead host's sandbox to be reported lost", func() bool {
		var info map[string]any
		_ = jsonOf(do(t, "eu", "GET", "/sandboxes/"+victim.ID, nil, nil), &info)
		return info["state"] == "lost"
	})
	t.Logf("reported lost %v after the kill", time.Since(killed).Round(time.Second))
	t0 := time.Now()
	if _, status := runCode(t, "eu", victim, "1"); status != http.StatusBadGateway || time.Since(t0) > 1500*time.Millisecond {
		t.Errorf("data plane to a dead host: %d after %v", status, time.Since(t0))
	}
	// The paused one waits for its host: its image is only there.
	if r := do(t, "eu", "POST", "/sandboxes/"+paused.ID+"/connect", map[string]any{"timeout": 120}, nil); r.status != 503 || !strings.Contains(string(r.body), "had not reached the chunk store") {
		t.Errorf("resuming the paused sandbox of the dead host: %d %s", r.status, r.body)
	}
	if row, err := db.GetSandbox(ctx, paused.ID); err != nil || row.HostSlot != h.N || row.State != "paused" || row.StoreRoot != "" {
		t.Errorf("the paused sandbox's row while its host is down: %+v %v", row, err)
	}
	checkOneCopy(t)
	rowsIntact(t) // the half-written upload left packs, no manifest

	if err := h.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "the dead sandbox to be gone once its host is back", func() bool {
		return do(t, "eu", "GET", "/sandboxes/"+victim.ID, nil, nil).status == 404
	})
	out, _ := c.AdminOut(ctx, "hosts")
	if strings.Count(out, " active ") != len(c.Hosts) {
		t.Errorf("hosts after the restart:\n%s", out)
	}
	// Both regions' gateways resume it at once: it runs once, on its host.
	regions := []string{"eu", "us"}
	var answers [2]resp
	var rw sync.WaitGroup
	for i, region := range regions {
		rw.Go(func() {
			for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
				if answers[i] = connect(region, paused.ID); answers[i].status/100 == 2 {
					return
				}
			}
		})
	}
	rw.Wait()
	for i, a := range answers {
		if a.status/100 != 2 {
			t.Errorf("resuming through %s once its host is back: %d %s", regions[i], a.status, a.body)
		}
	}
	if got := hostOf(t, paused); got.N != h.N {
		t.Errorf("resumed on host %d, not its own %d", got.N, h.N)
	}
	if out, status := runCode(t, "eu", paused, "print(v, len(blob))"); out != "23 201326592\n" {
		t.Errorf("state after the resume on its host: %d %q", status, out)
	}
	checkOneCopy(t)
	for _, o := range c.Hosts {
		if o.N != h.N && hostLists(t, o, paused.ID) {
			t.Errorf("host %d runs the sandbox too", o.N)
		}
	}
	if row, err := db.GetSandbox(ctx, paused.ID); err != nil || row.HostSlot != h.N || row.State != "running" {
		t.Errorf("row after the resume: %+v %v", row, err)
	}
}

// connect asks region's gateway to resume (or keep) sandbox id; safe to
// call from any goroutine (it fails no test).
func connect(region, id string) resp {
	req, _ := http.NewRequest("POST", c.URL(region)+"/sandboxes/"+id+"/connect", strings.NewReader(`{"timeout": 120}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-API-KEY", c.Key)
	r, err := client.Do(req)
	if err != nil {
		return resp{body: []byte(err.Error())}
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	return resp{r.StatusCode, r.Header, b}
}

func jsonOf(r resp, v any) error { return jsonUnmarshal(r.body, v) }

// testCreateFailsOver: a team whose creates go to us by default gets its
// sandbox in eu while us's gateway is down (a create is the one request
// that fails over), and not when it asked for us by name.
func testCreateFailsOver(t *testing.T) {
	ctx := context.Background()
	if err := c.Admin(ctx, "team", "add", "roaming", "--regions", "eu,us", "--default-region", "us"); err != nil {
		t.Fatal(err)
	}
	out, err := c.AdminOut(ctx, "key", "create", "roaming", "k")
	if err != nil {
		t.Fatal(err)
	}
	key := map[string]string{"X-API-KEY": strings.TrimSpace(out)}
	kill := func(r resp) {
		var sb sandbox
		if r.status == http.StatusCreated && jsonOf(r, &sb) == nil {
			do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, key)
		}
	}
	body := map[string]any{"templateID": "base", "timeout": 60}
	r := do(t, "eu", "POST", "/v2/sandboxes", body, key)
	var sb sandbox
	if r.status != http.StatusCreated || jsonOf(r, &sb) != nil {
		t.Fatalf("a create by the team's default: %d %s", r.status, r.body)
	}
	kill(r)
	inUS := func(id string) bool { return id[1:3] == sb.ID[1:3] } // the id's region
	if want := create(t, "us", nil); !inUS(want.ID) {
		t.Fatalf("the team's default region is us, but its create landed elsewhere: %s vs %s", sb.ID, want.ID)
	}

	gw := c.Gateways["us"]
	gw.Signal(syscall.SIGKILL)
	defer func() {
		if err := gw.Start(); err != nil {
			t.Fatalf("restarting the us gateway: %v", err)
		}
	}()
	r = do(t, "eu", "POST", "/v2/sandboxes", body, key)
	var moved sandbox
	if r.status != http.StatusCreated || jsonOf(r, &moved) != nil || inUS(moved.ID) {
		t.Errorf("a create while its default region's gateway is down: %d %s", r.status, r.body)
	}
	kill(r)
	r = do(t, "eu", "POST", "/v2/sandboxes", body, map[string]string{"X-API-KEY": key["X-API-KEY"], "X-Cellfork-Region": "us"})
	if r.status != http.StatusBadGateway {
		t.Errorf("a create that asked for the unreachable region: %d %s (want 502, not another region)", r.status, r.body)
	}
	kill(r)
}

// testDrainWaits: `admin drain SLOT --wait` returns once the host's
// running sandboxes have ended, and no create lands on a draining host.
func testDrainWaits(t *testing.T) {
	ctx := context.Background()
	sb := create(t, "eu", nil)
	h := hostOf(t, sb)
	slot := fmt.Sprint(h.N)
	type result struct {
		out string
		err error
	}
	done := make(chan result, 1)
	go func() {
		out, err := c.AdminOut(ctx, "drain", slot, "--wait", "--timeout", "90s")
		done <- result{out, err}
	}()
	defer func() {
		if err := c.Admin(ctx, "activate", slot); err != nil {
			t.Errorf("activating host %s again: %v", slot, err)
		}
	}()
	select {
	case r := <-done:
		t.Fatalf("drain --wait returned while host %s still ran %s: %q %v", slot, sb.ID, r.out, r.err)
	case <-time.After(4 * time.Second):
	}
	// The gateways see the state within a second or two (NOTIFY).
	time.Sleep(2 * time.Second)
	for range 2 {
		if other := create(t, "eu", nil); hostOf(t, other).N == h.N {
			t.Errorf("a create landed on draining host %s", slot)
		} else {
			do(t, "eu", "DELETE", "/sandboxes/"+other.ID, nil, nil)
		}
	}
	do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, nil)
	select {
	case r := <-done:
		if r.err != nil || !strings.Contains(r.out, "is drained") {
			t.Errorf("drain --wait: %q %v", r.out, r.err)
		}
	case <-time.After(30 * time.Second):
		hosts, _ := c.AdminOut(ctx, "hosts")
		rows, _ := c.AdminOut(ctx, "sandboxes", slot)
		hosts += "\nrows of host " + slot + ":\n" + rows
		var list []map[string]any
		_ = jsonOf(do(t, "eu", "GET", "/v2/sandboxes", nil, nil), &list)
		t.Fatalf("drain --wait did not return 30 s after the host's last sandbox ended\nhosts:\n%s\nthe team's sandboxes: %v", hosts, list)
	}
}
