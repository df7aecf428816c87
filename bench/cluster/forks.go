package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/test/cluster/harness"
)

// benchForks: fork(3) of a sandbox of 8 GiB whose host has room for one
// child, so two are made on the other host of eu, through this build's
// gateway (children import the image from the parent's host) and, with
// -gateway-b, an older build's (children wait for the upload and import
// from the store), interleaved, against one cluster of this build's hosts
// with an S3 store (versitygw).
func benchForks(ctx context.Context, dir string) error {
	samples := 8
	if *quick {
		samples = 3
	}
	absBin, _ := filepath.Abs(*bin)
	c, err := harness.Start(ctx, harness.Options{Dir: filepath.Join(dir, "forks"), Bin: absBin, TemplateDir: *tpl, S3: true})
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
	key := map[string]string{"X-API-KEY": c.Key}
	st, body, _ := b.viaGateway("POST", "/v2/sandboxes", []byte(`{"templateID":"base","timeout":1200,"memoryMB":8192}`), key)
	if st != 201 {
		return fmt.Errorf("creating the parent: %d %s", st, body)
	}
	var parent sbx
	_ = json.Unmarshal(body, &parent)
	defer b.kill(parent)
	pslot := slotOf(parent.ID)

	type sample struct{ wall, total, snapshot, manifest, export, peer float64 }
	got := make([][]sample, len(gateways))
	elsewhere := make([]int, len(gateways))
	for i := 0; i < samples; i++ {
		for gi, g := range gateways {
			time.Sleep(3 * time.Second) // the hosts' memory, as the gateways see it, after the last kills
			t0 := time.Now()
			st, body, h := b.send(g.url+"/sandboxes/"+parent.ID+"/fork", "POST", []byte(`{"count":3,"timeout":120}`), key, nil)
			wall := ms(time.Since(t0))
			if st != 201 {
				return fmt.Errorf("fork(3) through %s: %d %s", g.name, st, body)
			}
			var res []struct {
				Sandbox *sbx `json:"sandbox"`
				Error   any  `json:"error"`
			}
			_ = json.Unmarshal(body, &res)
			for _, r := range res {
				if r.Sandbox == nil {
					return fmt.Errorf("fork(3) through %s: a child failed: %s", g.name, body)
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
	fmt.Println("### Fork beyond the parent's host: fork(3), two children on the other host (S3 store)")
	fmt.Println()
	fmt.Println("| gateway | n | children elsewhere | client wall p50 (ms) | server total p50 | snapshot p50 | manifest p50 | export (upload waited) p50 | peer (children made) p50 |")
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
		fmt.Printf("| %s | %d | %d of %d | %s | %s | %s | %s | %s | %s |\n", g.name, len(got[gi]), elsewhere[gi], 3*len(got[gi]),
			col(func(s sample) float64 { return s.wall }), col(func(s sample) float64 { return s.total }),
			col(func(s sample) float64 { return s.snapshot }), col(func(s sample) float64 { return s.manifest }),
			col(func(s sample) float64 { return s.export }), col(func(s sample) float64 { return s.peer }))
	}
	fmt.Println()
	fmt.Println("Samples (wall ms) in order:", strings.TrimSpace(fmt.Sprint(got)))
	fmt.Println()
	return nil
}

func slotOf(id string) int {
	s, _ := ids.ParseSandbox(id)
	return s.Slot
}
