package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

// benchForks: forks whose children do not all fit on the parent's host,
// through this build's gateway (children import the image from the
// parent's host) and, with -gateway-b, an older build's (children wait for
// the upload and import from the store), interleaved, against one cluster
// of this build's hosts with an S3 store (versitygw).
func benchForks(ctx context.Context, dir string) error {
	samples := *forkSamples
	if *quick {
		samples = 3
	}
	absBin, _ := filepath.Abs(*bin)
	var logs io.Writer
	if os.Getenv("CELLFORK_CLUSTER_LOGS") != "" {
		logs = os.Stderr
	}
	c, err := harness.Start(ctx, harness.Options{Dir: filepath.Join(dir, "forks"), Bin: absBin, TemplateDir: *tpl, S3: true, Log: logs})
	if err != nil {
		return err
	}
	defer c.Close()
	b := &bench{c: c}
	gateways := []struct{ name, url string }{{"this build", c.URL("eu")}}
	if *gwB != "" {
		abs, _ := filepath.Abs(*gwB)
		g, err := c.AddGateway("eu", harness.GatewayOptions{Bin: abs})
		if err != nil {
			return err
		}
		gateways = append(gateways, struct{ name, url string }{"-gateway-b", "http://" + g.Addr})
	}
	// fork(1) of a parent of 8 GiB beside another of 8 GiB: its host has
	// no room for a child, the child is made on the other host (the
	// transfer alone); fork(3) of one alone: one child on its host, two on
	// the other.
	for _, cfg := range []struct{ count int }{{1}, {3}} {
		if err := b.forks(gateways, cfg.count, samples); err != nil {
			return err
		}
	}
	return nil
}

// forks measures fork(count) of a parent of 8 GiB through each gateway,
// interleaved; for fork(1), with a sandbox of 8 GiB beside the parent.
func (b *bench) forks(gateways []struct{ name, url string }, count, samples int) error {
	key := map[string]string{"X-API-KEY": b.c.Key}
	create := func() (sbx, error) {
		st, body, _ := b.viaGateway("POST", "/v2/sandboxes", []byte(`{"templateID":"base","timeout":1200,"memoryMB":8192}`), key)
		var s sbx
		if st != 201 {
			return s, fmt.Errorf("creating a sandbox of 8 GiB: %d %s", st, body)
		}
		return s, json.Unmarshal(body, &s)
	}
	parent, err := create()
	if err != nil {
		return err
	}
	defer b.kill(parent)
	pslot := slotOf(parent.ID)
	if count == 1 {
		var others []sbx
		for tries := 0; ; tries++ {
			s, err := create()
			if err != nil {
				return err
			}
			if slotOf(s.ID) == pslot {
				defer b.kill(s)
				break
			}
			others = append(others, s)
			if tries == 3 {
				return fmt.Errorf("no sandbox placed beside the parent in 4 creates")
			}
		}
		for _, s := range others {
			b.kill(s)
		}
	}

	type sample struct{ wall, total, snapshot, manifest, export, peer float64 }
	got := make([][]sample, len(gateways))
	elsewhere := make([]int, len(gateways))
	for i := 0; i < samples; i++ {
		for gi, g := range gateways {
			time.Sleep(3 * time.Second) // the hosts' memory, as the gateways see it, after the last kills
			t0 := time.Now()
			st, body, h := b.send(g.url+"/sandboxes/"+parent.ID+"/fork", "POST", []byte(fmt.Sprintf(`{"count":%d,"timeout":120}`, count)), key, nil)
			wall := ms(time.Since(t0))
			if st != 201 {
				return fmt.Errorf("fork(%d) through %s: %d %s", count, g.name, st, body)
			}
			var res []struct {
				Sandbox *sbx `json:"sandbox"`
				Error   any  `json:"error"`
			}
			_ = json.Unmarshal(body, &res)
			for _, r := range res {
				if r.Sandbox == nil {
					return fmt.Errorf("fork(%d) through %s: a child failed: %s", count, g.name, body)
				}
				if slotOf(r.Sandbox.ID) != pslot {
					elsewhere[gi]++
				}
			}
			stv := h.Get("Server-Timing")
			got[gi] = append(got[gi], sample{wall, phase(stv, "total"), phase(stv, "snapshot"), phase(stv, "manifest"), phase(stv, "export"), phase(stv, "peer")})
			for _, r := range res {
				b.kill(*r.Sandbox)
			}
		}
	}
	fmt.Printf("### Fork beyond the parent's host: fork(%d) of a parent of 8 GiB (S3 store; load average now %s)\n\n", count, loadavg())
	fmt.Println("| gateway | n | children elsewhere | client wall p50 (ms) | server total p50 | snapshot p50 | manifest p50 | export (snapshot + upload waited) p50 | peer (children made) p50 |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|")
	for gi, g := range gateways {
		col := func(f func(sample) float64) string {
			var xs []float64
			for _, s := range got[gi] {
				if v := f(s); v >= 0 {
					xs = append(xs, v)
				}
			}
			if len(xs) == 0 {
				return "–"
			}
			return fmt.Sprintf("%.1f", pct(xs, .5))
		}
		fmt.Printf("| %s | %d | %d of %d | %s | %s | %s | %s | %s | %s |\n", g.name, len(got[gi]), elsewhere[gi], count*len(got[gi]),
			col(func(s sample) float64 { return s.wall }), col(func(s sample) float64 { return s.total }),
			col(func(s sample) float64 { return s.snapshot }), col(func(s sample) float64 { return s.manifest }),
			col(func(s sample) float64 { return s.export }), col(func(s sample) float64 { return s.peer }))
	}
	fmt.Println()
	for gi, g := range gateways {
		var walls []string
		for _, s := range got[gi] {
			walls = append(walls, fmt.Sprintf("%.0f", s.total))
		}
		fmt.Printf("Server totals in order, %s: %s\n", g.name, strings.Join(walls, " "))
	}
	fmt.Println()
	return nil
}

var forkSamples = flag.Int("fork-samples", 8, "forks per configuration and gateway")

func slotOf(id string) int {
	s, _ := ids.ParseSandbox(id)
	return s.Slot
}
