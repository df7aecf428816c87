package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"syscall"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/ids"
)

// testNeverTwoCopies runs random lifecycle steps and host faults on a few
// sandboxes and checks after each, by asking every host itself, that no
// sandbox id is live on two hosts, that each live one is on the host its
// id (or the moved map) names, and that every image the rows name is in
// the chunk store whole (the hosts collect it meanwhile).
func testNeverTwoCopies(t *testing.T) {
	ctx := context.Background()
	db, err := clusterdb.Open(ctx, c.PG.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	secrets, err := db.EnsureSecrets(ctx, ids.RandomKey)
	if err != nil {
		t.Fatal(err)
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 7))
	var live []sandbox
	step := func(what string, f func()) {
		t.Logf("step: %s", what)
		f()
		checkOneCopy(t, secrets.Internal)
		rowsIntact(t)
	}
	for i := 0; i < 12; i++ {
		switch op := rng.IntN(7); {
		case op <= 1 || len(live) == 0:
			step("create", func() { live = append(live, create(t, "eu", map[string]any{"timeout": 600})) })
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
		}
	}
}

// checkOneCopy asks every host which sandboxes it runs.
func checkOneCopy(t *testing.T, key []byte) {
	t.Helper()
	where := map[string]int{}
	for _, h := range c.Hosts {
		req, _ := http.NewRequest("GET", "http://"+h.Addr+"/v2/sandboxes?state=running,paused&limit=1000", nil)
		clusterauth.Sign(req, key, c.Team, "", time.Now())
		resp, err := client.Do(req)
		if err != nil {
			continue // restarting: its sandboxes are checked next time
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var list []struct {
			ID string `json:"sandboxID"`
		}
		_ = json.Unmarshal(body, &list)
		for _, s := range list {
			if other, ok := where[s.ID]; ok {
				t.Fatalf("sandbox %s is live on hosts %d and %d", s.ID, other, h.N)
			}
			where[s.ID] = h.N
			if slot := decodeSlot(s.ID); slot != fmt.Sprint(h.N) {
				t.Errorf("sandbox %s (slot %s) lives on host %d and has not moved", s.ID, slot, h.N)
			}
		}
	}
}
