package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

// testNeverTwoCopies runs random lifecycle steps, moves and host faults
// on a few sandboxes and checks after each, by asking every host itself,
// that no sandbox id is live on two hosts, that each live one is on the
// host its id (or the moved map) names, and that every image the rows
// name is in the chunk store whole (the hosts collect it meanwhile). The
// moves: a paused sandbox's host is cordoned and evacuated (the sandbox
// resumed on its new host, with its state), and a host is evacuated with
// --running (its running sandboxes checkpointed and moved too). Each runs
// at least once.
func testNeverTwoCopies(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	defer db.Close()
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("CELLFORK_SEED"); s != "" { // a failed run's seed, again
		var err error
		if seed, err = strconv.ParseUint(s, 10, 64); err != nil {
			t.Fatalf("CELLFORK_SEED: %v", err)
		}
	}
	t.Logf("seed %d (CELLFORK_SEED runs it again)", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var live []sandbox
	step := func(what string, f func()) {
		t.Logf("step: %s", what)
		f()
		checkOneCopy(t)
		rowsIntact(t)
	}
	// Each sandbox knows its own id (in its REPL): a move must bring the
	// same sandbox back.
	mark := func(sb sandbox) {
		if out, status := runCode(t, "eu", sb, fmt.Sprintf("me = %q; print(me)", sb.ID)); out != sb.ID+"\n" {
			t.Fatalf("marking %s: %d %q", sb.ID, status, out)
		}
	}
	// evacuate cordons host slot, evacuates it (with --running or not) and
	// makes it active again.
	evacuate := func(slot int, running bool) string {
		args := []string{"evacuate", fmt.Sprint(slot)}
		if running {
			args = append(args, "--running")
		}
		if err := c.Admin(ctx, "cordon", fmt.Sprint(slot)); err != nil {
			t.Fatal(err)
		}
		out, err := c.AdminOut(ctx, args...)
		if aerr := c.Admin(ctx, "activate", fmt.Sprint(slot)); aerr != nil {
			t.Fatal(aerr)
		}
		if err != nil {
			t.Fatalf("evacuate %v: %v %s", args, err, out)
		}
		t.Logf("evacuate %v: %s", args, out)
		time.Sleep(time.Second) // the gateways hear of the moves (NOTIFY)
		return out
	}
	moved, evacuated := false, false
	for i := 0; i < 14 || (!moved || !evacuated) && i < 18; i++ {
		op := rng.IntN(9)
		switch {
		case i >= 10 && !moved:
			op = 7
		case i >= 12 && !evacuated:
			op = 8
		}
		switch {
		case op <= 1 || len(live) == 0:
			step("create", func() {
				sb := create(t, "eu", map[string]any{"timeout": 600})
				mark(sb)
				live = append(live, sb)
			})
		case op == 2:
			sb := live[rng.IntN(len(live))]
			step("pause "+sb.ID, func() { do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", nil, nil) })
		case op == 3:
			sb := live[rng.IntN(len(live))]
			step("connect "+sb.ID, func() { do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 600}, nil) })
		case op == 4:
			j := rng.IntN(len(live))
			sb := live[j]
			live = append(live[:j], live[j+1:]...)
			step("kill "+sb.ID, func() { do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, nil) })
		case op == 5:
			h := c.Hosts[rng.IntN(2)]
			step(fmt.Sprintf("restart the daemon of host %d", h.N), func() {
				h.Signal(syscall.SIGKILL) // the daemon only: its sandboxes run on
				if err := h.Start(); err != nil {
					t.Fatal(err)
				}
			})
		case op == 6:
			h := c.Hosts[rng.IntN(2)]
			step(fmt.Sprintf("partition host %d for 3 s", h.N), func() {
				if err := h.Partition(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(3 * time.Second)
				if err := h.Heal(); err != nil {
					t.Fatal(err)
				}
			})
		case op == 7:
			sb := live[rng.IntN(len(live))]
			step("move "+sb.ID+": pause, evacuate its host, connect", func() {
				do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/pause", map[string]any{"spill": true}, nil) // 409 if paused already
				pausedInStore(t, sb.ID)
				row, err := db.GetSandbox(ctx, sb.ID)
				if err != nil {
					t.Fatal(err)
				}
				if out := evacuate(row.HostSlot, false); !strings.Contains(out, sb.ID+" -> host ") {
					t.Fatalf("%s did not move: %s", sb.ID, out)
				}
				if r := do(t, "eu", "POST", "/sandboxes/"+sb.ID+"/connect", map[string]any{"timeout": 600}, nil); r.status/100 != 2 {
					t.Fatalf("connect after the move: %d %s", r.status, r.body)
				}
				// It moved (its row's generation grew); it may have moved on
				// again, even back: a gateway whose view still had the
				// evacuation's target silent (a partition just healed)
				// moves it off that host at the connect.
				after, err := db.GetSandbox(ctx, sb.ID)
				if err != nil || after.Generation <= row.Generation || after.State != "running" {
					t.Fatalf("row after the move from host %d: %+v %v", row.HostSlot, after, err)
				}
				if after.HostSlot == row.HostSlot {
					t.Logf("%s moved off host %d and back (generation %d -> %d)", sb.ID, row.HostSlot, row.Generation, after.Generation)
				}
				if out, status := runCode(t, "eu", sb, "print(me)"); out != sb.ID+"\n" {
					t.Fatalf("%s after its move: %d %q", sb.ID, status, out)
				}
				// Its old host (up all along) drops its copy.
				for _, h := range c.Hosts {
					if h.N == row.HostSlot && h.N != after.HostSlot {
						eventually(t, 10*time.Second, fmt.Sprintf("host %d to drop its copy of %s", h.N, sb.ID), func() bool { return !hostLists(t, h, sb.ID) })
					}
				}
				moved = true
			})
		case op == 8:
			h := c.Hosts[rng.IntN(2)]
			step(fmt.Sprintf("evacuate host %d with --running", h.N), func() {
				evacuate(h.N, true)
				for _, sb := range live {
					row, err := db.GetSandbox(ctx, sb.ID)
					if err != nil {
						continue
					}
					if row.HostSlot != h.N {
						eventually(t, 10*time.Second, fmt.Sprintf("host %d to drop its copy of %s", h.N, sb.ID), func() bool { return !hostLists(t, h, sb.ID) })
					}
					if row.State == "running" {
						if out, status := runCode(t, "eu", sb, "print(me)"); out != sb.ID+"\n" {
							t.Fatalf("%s after the evacuation: %d %q", sb.ID, status, out)
						}
					}
				}
				evacuated = true
			})
		}
	}
}

// checkOneCopy asks every host which sandboxes it runs (or keeps
// paused): none is on two hosts, and each is on the host its id names
// or, once moved, its row names.
func checkOneCopy(t *testing.T) {
	t.Helper()
	db := openDB(t)
	defer db.Close()
	moved, err := db.Moved(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	where := map[string]int{}
	for _, h := range c.Hosts {
		ids, ok := listed(t, h)
		if !ok {
			continue // restarting: its sandboxes are checked next time
		}
		for _, id := range ids {
			if other, ok := where[id]; ok {
				t.Fatalf("sandbox %s is live on hosts %d and %d", id, other, h.N)
			}
			where[id] = h.N
			slot := decodeSlot(id)
			if m, ok := moved[id]; ok {
				slot = fmt.Sprint(m)
			}
			if slot != fmt.Sprint(h.N) {
				t.Errorf("sandbox %s lives on host %d, and its id or row names host %s", id, h.N, slot)
			}
		}
	}
}

// listed returns the ids of the sandboxes host h runs or holds paused,
// asked directly as a gateway asks (signed with the cluster's internal
// key); ok is false if the host does not answer, or not yet.
func listed(t *testing.T, h *harness.Host) (ids []string, ok bool) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+h.Addr+"/v2/sandboxes?state=running,paused&limit=1000", nil)
	clusterauth.Sign(req, internalKey(t), c.Team, "", time.Now())
	resp, err := client.Do(req)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	var list []struct {
		ID string `json:"sandboxID"`
	}
	if resp.StatusCode != http.StatusOK {
		return nil, false // starting
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		t.Fatalf("listing host %d: %v", h.N, err)
	}
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids, true
}

// internalKey is the cluster's internal key, which gateways sign their
// calls to hosts with.
func internalKey(t *testing.T) []byte {
	t.Helper()
	db := openDB(t)
	defer db.Close()
	secrets, err := db.EnsureSecrets(context.Background(), ids.RandomKey)
	if err != nil {
		t.Fatal(err)
	}
	return secrets.Internal
}
