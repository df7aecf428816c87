package main

import (
	"context"
	"crypto"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/cellfork/cellfork/internal/clusterauth"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/gateway"
	"github.com/cellfork/cellfork/internal/ids"
	"github.com/cellfork/cellfork/internal/metrics"
	"github.com/cellfork/cellfork/internal/placement"
	"github.com/cellfork/cellfork/internal/telemetry"
)

// gatewayCmd is `cellfork gateway`: the E2B API of a cluster's region.
func gatewayCmd(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	addr := fs.String("addr", envOr("CELLFORK_ADDR", "127.0.0.1:3000"), "listen address (env CELLFORK_ADDR)")
	url := fs.String("cluster", os.Getenv("CELLFORK_CLUSTER"), "the cluster's PostgreSQL URL (env CELLFORK_CLUSTER)")
	region := fs.String("region", os.Getenv("CELLFORK_REGION"), "the region this gateway serves")
	stateDir := fs.String("state-dir", envOr("CELLFORK_STATE_DIR", "/var/lib/cellfork-gateway"), "where the gateway keeps its cache (to start while PostgreSQL is down)")
	memMB := fs.Int64("default-memory-mb", 1024, "memory placement counts for a create that does not say (the hosts' --default-memory-mb)")
	var jwtKeys []crypto.PublicKey
	fs.Func("jwt-public-key", "a PEM Ed25519 or ECDSA P-256 public key bearer tokens may be signed with (repeatable)", func(p string) error {
		k, err := gateway.LoadJWTKey(p)
		if err == nil {
			jwtKeys = append(jwtKeys, k)
		}
		return err
	})
	metricsAddr := fs.String("metrics-addr", os.Getenv("CELLFORK_METRICS_ADDR"), "serve the gateway's Prometheus metrics at GET /metrics, without a key, on this address (env CELLFORK_METRICS_ADDR)")
	tracing := fs.Bool("tracing", os.Getenv("CELLFORK_TRACING") == "1", "export OpenTelemetry traces over OTLP/HTTP (OTEL_* honoured; env CELLFORK_TRACING=1)")
	verbose := fs.Bool("v", false, "log every request")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *url == "" || *region == "" {
		return fatalf("gateway: --cluster and --region are required")
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := os.MkdirAll(*stateDir, 0o700); err != nil {
		return fatalf("%v", err)
	}
	tr, err := telemetry.New(ctx, telemetry.Config{Enabled: *tracing, Service: "cellfork-gateway", Version: buildVersion()})
	if err != nil {
		return fatalf("%v", err)
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = tr.Shutdown(sctx)
	}()
	reg, gm := metrics.NewGatewayRegistry(buildVersion())
	g := gateway.New(gateway.Config{URL: *url, Region: *region, StateDir: *stateDir, JWTKeys: jwtKeys,
		DefaultMemoryMB: *memMB, Log: log, Metrics: gm, Tracing: tr})
	if *metricsAddr != "" {
		mln, err := net.Listen("tcp", *metricsAddr)
		if err != nil {
			return fatalf("listening on --metrics-addr %s: %v", *metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", metrics.Handler(reg))
		msrv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = msrv.Serve(mln) }()
		defer msrv.Close()
		fmt.Fprintf(os.Stderr, "cellfork: gateway metrics on http://%s/metrics\n", mln.Addr())
	}
	if err := g.Start(ctx); err != nil {
		return fatalf("%v", err)
	}
	defer g.Close()
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return fatalf("listening on %s: %v", *addr, err)
	}
	srv := &http.Server{Handler: g, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute, MaxHeaderBytes: 64 << 10,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	fmt.Fprintf(os.Stderr, "cellfork: gateway of region %s listening on http://%s\n", *region, ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fatalf("%v", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(sctx)
	return 0
}

const adminUsage = `usage: cellfork admin [--cluster URL] COMMAND
  init                                  create the schema and the cluster's keys
  region add ID NAME [--groups a,b] [--gateway-url URL] [--domain D]
  regions
  team add ID [--max-sandboxes N] [--regions a,b] [--default-region R]
  teams
  key create TEAM NAME [--regions a,b]  print a new API key (shown once)
  key revoke TEAM NAME
  keys
  hosts
  sandboxes SLOT                        the sandbox rows a host holds (every team)
  cordon SLOT | drain SLOT [--wait] [--timeout D] | activate SLOT
                                        drain: no new sandboxes; --wait: until its running ones end
  evacuate SLOT [--running]             hand a cordoned or draining host's paused sandboxes to other
                                        hosts (their images are in the chunk store); each resumes there;
                                        --running: checkpoint its running ones too, move and resume them
  rotate-token-key                      new sandbox tokens from a new key (the previous one still checks)
`

// adminCmd is `cellfork admin`: a cluster's hosts, regions, teams and
// keys.
func adminCmd(ctx context.Context, args []string, out io.Writer) int {
	fs := flag.NewFlagSet("admin", flag.ContinueOnError)
	url := fs.String("cluster", os.Getenv("CELLFORK_CLUSTER"), "the cluster's PostgreSQL URL (env CELLFORK_CLUSTER)")
	asJSON := fs.Bool("json", false, "print JSON")
	fs.Usage = func() { fmt.Fprint(os.Stderr, adminUsage) }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	rest := fs.Args()
	if len(rest) == 0 || *url == "" {
		fs.Usage()
		return 2
	}
	db, err := clusterdb.Open(ctx, *url)
	if err != nil {
		return fatalf("%v", err)
	}
	defer db.Close()
	if err := admin(ctx, db, rest, out, *asJSON); err != nil {
		if errors.Is(err, errUsage) {
			fmt.Fprint(os.Stderr, adminUsage)
			return 2
		}
		return fatalf("%v", err)
	}
	return 0
}

var errUsage = errors.New("usage")

func admin(ctx context.Context, db *clusterdb.DB, args []string, out io.Writer, asJSON bool) error {
	sub := flag.NewFlagSet(args[0], flag.ContinueOnError)
	groups := sub.String("groups", "", "comma-separated groups (country, continent) of a region")
	gwURL := sub.String("gateway-url", "", "how other regions reach this region's gateways")
	domain := sub.String("domain", "", "the region's sandbox domain ({port}-{id}.DOMAIN)")
	maxSB := sub.Int("max-sandboxes", 0, "running sandboxes the team may have (0: no bound)")
	regions := sub.String("regions", "", "comma-separated regions or groups allowed (empty: all)")
	defRegion := sub.String("default-region", "", "where the team's creates go unless they say")
	pos := func(from int) ([]string, error) {
		var p []string
		rest := args[from:]
		for len(rest) > 0 {
			if strings.HasPrefix(rest[0], "-") {
				if err := sub.Parse(rest); err != nil {
					return nil, err
				}
				rest = sub.Args()
				continue
			}
			p, rest = append(p, rest[0]), rest[1:]
		}
		return p, nil
	}
	list := func(s string) []string {
		if s == "" {
			return []string{}
		}
		return strings.Split(s, ",")
	}
	show := func(v any, table func(w *tabwriter.Writer)) error {
		if asJSON {
			return json.NewEncoder(out).Encode(v)
		}
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		table(w)
		return w.Flush()
	}
	switch args[0] {
	case "init":
		_, err := db.EnsureSecrets(ctx, ids.RandomKey)
		if err == nil {
			fmt.Fprintf(out, "cluster database ready (schema version %d)\n", clusterdb.SchemaVersion())
		}
		return err
	case "region":
		p, err := pos(1)
		if err != nil || len(args) < 2 || args[1] != "add" || len(p) != 3 {
			return errUsage
		}
		id, err := strconv.Atoi(p[1])
		if err != nil || id < 0 || id >= ids.MaxRegions {
			return fmt.Errorf("a region id is a number from 0 to %d", ids.MaxRegions-1)
		}
		return db.PutRegion(ctx, clusterdb.Region{ID: id, Name: p[2], Groups: list(*groups), GatewayURL: *gwURL, Domain: *domain})
	case "regions":
		rs, err := db.Regions(ctx)
		if err != nil {
			return err
		}
		return show(rs, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "ID\tNAME\tGROUPS\tGATEWAY\tDOMAIN")
			for _, r := range rs {
				fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", r.ID, r.Name, strings.Join(r.Groups, ","), r.GatewayURL, r.Domain)
			}
		})
	case "team":
		p, err := pos(1)
		if err != nil || len(args) < 2 || args[1] != "add" || len(p) != 2 {
			return errUsage
		}
		return db.PutTeam(ctx, clusterdb.Team{ID: p[1], Name: p[1], MaxSandboxes: *maxSB, Regions: list(*regions), DefaultRegion: *defRegion})
	case "teams":
		ts, err := db.Teams(ctx)
		if err != nil {
			return err
		}
		return show(ts, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "TEAM\tRUNNING\tMAX\tREGIONS\tDEFAULT REGION")
			for _, t := range ts {
				fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%s\n", t.ID, t.Running, t.MaxSandboxes, strings.Join(t.Regions, ","), t.DefaultRegion)
			}
		})
	case "key":
		p, err := pos(1)
		if err != nil || len(args) < 2 || len(p) != 3 {
			return errUsage
		}
		switch p[0] {
		case "create":
			b := make([]byte, 20)
			_, _ = rand.Read(b)
			key := "e2b_" + hex.EncodeToString(b) // the shape E2B's SDKs check
			if err := db.AddKey(ctx, key, p[1], p[2], list(*regions)); err != nil {
				return err
			}
			fmt.Fprintln(out, key)
			return nil
		case "revoke":
			return db.RevokeKey(ctx, p[1], p[2])
		}
		return errUsage
	case "keys":
		ks, err := db.Keys(ctx)
		if err != nil {
			return err
		}
		return show(ks, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "TEAM\tNAME\tREGIONS\tREVOKED")
			for _, k := range ks {
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\n", k.Team, k.Name, strings.Join(k.Regions, ","), k.Revoked)
			}
		})
	case "sandboxes":
		if len(args) != 2 {
			return errUsage
		}
		slot, err := strconv.Atoi(args[1])
		if err != nil {
			return errUsage
		}
		sbs, err := db.HostSandboxes(ctx, slot)
		if err != nil {
			return err
		}
		return show(sbs, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "ID\tTEAM\tSTATE\tHOME\tHOST\tGENERATION\tTEMPLATE\tSTARTED")
			for _, s := range sbs {
				fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%d\t%d\t%s\t%s ago\n", s.ID, s.Team, s.State, s.HomeSlot, s.HostSlot, s.Generation,
					s.TemplateID, time.Since(s.StartedAt).Round(time.Second))
			}
		})
	case "hosts":
		hs, err := db.Hosts(ctx, time.Time{})
		if err != nil {
			return err
		}
		return show(hs, func(w *tabwriter.Writer) {
			fmt.Fprintln(w, "SLOT\tNAME\tREGION\tADDR\tSTATE\tMEM USED/TOTAL MB\tSANDBOXES\tHEARTBEAT")
			for _, h := range hs {
				fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%d/%d\t%d\t%s ago\n", h.Slot, h.Name, h.Region, h.Addr, h.State,
					h.MemAllocMB, h.MemTotalMB, h.Capacity.Sandboxes, time.Since(h.HeartbeatAt).Round(time.Second))
			}
		})
	case "cordon", "drain", "activate":
		sub := flag.NewFlagSet(args[0], flag.ContinueOnError)
		wait := sub.Bool("wait", false, "drain: wait until the host's running sandboxes have ended")
		timeout := sub.Duration("timeout", 0, "drain --wait: give up after this long (0: never)")
		if len(args) < 2 {
			return errUsage
		}
		slot, err := strconv.Atoi(args[1])
		if err != nil || sub.Parse(args[2:]) != nil || sub.NArg() != 0 || (*wait && args[0] != "drain") {
			return errUsage
		}
		state := map[string]string{"cordon": "cordoned", "drain": "draining", "activate": "active"}[args[0]]
		if err := db.SetHostState(ctx, slot, state); err != nil {
			return err
		}
		if *wait {
			return waitDrained(ctx, db, slot, *timeout, out)
		}
		return nil
	case "evacuate":
		sub := flag.NewFlagSet(args[0], flag.ContinueOnError)
		running := sub.Bool("running", false, "also checkpoint the host's running sandboxes and move them (each resumes on its new host)")
		if len(args) < 2 {
			return errUsage
		}
		slot, err := strconv.Atoi(args[1])
		if err != nil || sub.Parse(args[2:]) != nil || sub.NArg() != 0 {
			return errUsage
		}
		return evacuate(ctx, db, slot, *running, out)
	case "rotate-token-key":
		return db.RotateTokenKey(ctx, ids.RandomKey())
	}
	return errUsage
}

// evacuate hands the paused sandboxes of host slot (cordoned, draining or
// lost) whose images are in the chunk store to other hosts of its region,
// one at a time, as a resume of one would (clusterdb.Move); the new host
// imports one when it is first used. With running, it first checkpoints
// each running sandbox of a live host (a pause to disk, uploaded), moves
// it, and resumes it on its new host. It says what moved where and what
// stays, and why.
func evacuate(ctx context.Context, db *clusterdb.DB, slot int, running bool, out io.Writer) error {
	hosts, err := db.Hosts(ctx, time.Time{})
	if err != nil {
		return err
	}
	var from *clusterdb.Host
	for i := range hosts {
		if hosts[i].Slot == slot {
			from = &hosts[i]
		}
	}
	if from == nil {
		return fmt.Errorf("no host with slot %d", slot)
	}
	if from.State == "active" {
		return fmt.Errorf("host %d is active: cordon or drain it first (it would take new sandboxes)", slot)
	}
	if running && (from.State == "lost" || from.Silent()) {
		state := from.State
		if state != "lost" {
			state += " and not heartbeating"
		}
		return fmt.Errorf("host %d is %s: its running sandboxes cannot be checkpointed (its paused ones move without --running)", slot, state)
	}
	sbs, err := db.HostSandboxes(ctx, slot)
	if err != nil {
		return err
	}
	e := evacuation{db: db, from: *from, table: placement.NewTable(hosts, time.Now()),
		rng: mrand.New(mrand.NewPCG(mrand.Uint64(), mrand.Uint64())), out: out}
	if running {
		secrets, err := db.EnsureSecrets(ctx, ids.RandomKey)
		if err != nil {
			return err
		}
		e.key = secrets.Internal
	}
	for _, s := range sbs {
		switch {
		case s.State == "paused":
			if s.StoreRoot == "" {
				e.stays(s.ID, "its image is not in the chunk store yet (paused in memory, or uploading); evacuate again later")
				continue
			}
			if to, ok := e.move(ctx, s); ok {
				fmt.Fprintf(out, "%s -> host %d\n", s.ID, to.Slot)
				e.moved++
			}
		case s.State == "running" && running:
			e.checkpointAndMove(ctx, s)
		case s.State == "running":
			e.running++
		}
	}
	fmt.Fprintf(out, "host %d: %d sandboxes moved, %d stay", slot, e.moved, e.stay)
	if e.running > 0 {
		fmt.Fprintf(out, " (and %d running: --running checkpoints and moves them)", e.running)
	}
	fmt.Fprintln(out)
	return nil
}

// evacuation is one run of evacuate.
type evacuation struct {
	db                   *clusterdb.DB
	from                 clusterdb.Host
	table                *placement.Table
	rng                  *mrand.Rand
	key                  []byte // signs calls to hosts (--running)
	out                  io.Writer
	moved, stay, running int
}

func (e *evacuation) stays(id, why string) {
	fmt.Fprintf(e.out, "%s stays: %s\n", id, why)
	e.stay++
}

// move hands paused sandbox s's row to another host; false (and said why)
// if it stays.
func (e *evacuation) move(ctx context.Context, s clusterdb.Sandbox) (clusterdb.Host, bool) {
	req := placement.Request{Region: s.Region, MemoryMB: int64(s.MemoryMB), Versions: []string{"runsc=" + s.Runtime}, Exclude: map[int]bool{e.from.Slot: true}}
	cands, why := e.table.Choose(req, e.rng)
	for _, h := range cands {
		err := e.db.Move(ctx, s.ID, e.from.Slot, s.Generation, h.Slot, placement.Reserve)
		switch {
		case errors.Is(err, clusterdb.ErrNoCapacity):
			continue
		case errors.Is(err, clusterdb.ErrStale):
			e.stays(s.ID, "it changed meanwhile (resumed or killed)")
		case err != nil:
			e.stays(s.ID, err.Error())
		default:
			return h, true
		}
		return clusterdb.Host{}, false
	}
	e.stays(s.ID, fmt.Sprintf("no other host can take it (%s)", why))
	return clusterdb.Host{}, false
}

// checkpointAndMove pauses running sandbox s to disk on its host, waits
// for its image to reach the chunk store, moves it and resumes it on its
// new host, with the time it had left. If it cannot move, it is resumed
// where it was.
func (e *evacuation) checkpointAndMove(ctx context.Context, s clusterdb.Sandbox) {
	t0 := time.Now()
	call := func(h clusterdb.Host, method, path string, body any) error {
		b, _ := json.Marshal(body)
		status, answer, err := clusterauth.Call(ctx, http.DefaultTransport, e.key, s.Team, method, "http://"+h.Addr+path, b)
		if err == nil && status/100 != 2 {
			var m struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal(answer, &m)
			err = fmt.Errorf("host %d answered %d: %s", h.Slot, status, m.Message)
		}
		return err
	}
	left := max(int(time.Until(s.EndAt).Seconds()), 60)
	resume := map[string]any{"timeout": left}
	if err := call(e.from, http.MethodPost, "/sandboxes/"+s.ID+"/pause", map[string]any{"spill": true}); err != nil {
		e.stays(s.ID, "checkpointing it failed: "+err.Error())
		return
	}
	var row clusterdb.Sandbox
	deadline := time.Now().Add(5 * time.Minute)
	for {
		var err error
		row, err = e.db.GetSandbox(ctx, s.ID)
		if err == nil && row.State == "paused" && row.StoreRoot != "" {
			break
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			e.stays(s.ID, "its checkpoint did not reach the chunk store within 5 minutes; it stays paused on its host")
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	to, ok := e.move(ctx, row)
	if !ok {
		if err := call(e.from, http.MethodPost, "/sandboxes/"+s.ID+"/connect", resume); err != nil {
			fmt.Fprintf(e.out, "%s: resuming it on its host failed (%v); it stays paused there\n", s.ID, err)
		}
		return
	}
	e.moved++
	if err := call(to, http.MethodPost, "/sandboxes/"+s.ID+"/connect", resume); err != nil {
		fmt.Fprintf(e.out, "%s -> host %d, paused (resuming it there failed: %v; a connect resumes it)\n", s.ID, to.Slot, err)
		return
	}
	fmt.Fprintf(e.out, "%s -> host %d, running again after %v\n", s.ID, to.Slot, time.Since(t0).Round(time.Millisecond))
}

// waitDrained waits until host slot runs no sandbox (paused ones stay on
// it: evacuate moves them), saying every few seconds how
// many are left.
func waitDrained(ctx context.Context, db *clusterdb.DB, slot int, timeout time.Duration, out io.Writer) error {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	last := -1
	for {
		sbs, err := db.HostSandboxes(ctx, slot)
		if err != nil && ctx.Err() == nil {
			return err
		}
		running := 0
		var left []string
		for _, s := range sbs {
			if s.State == "running" || s.State == "creating" {
				running++
				left = append(left, s.ID+" ("+s.State+")")
			}
		}
		if err == nil && running == 0 {
			fmt.Fprintf(out, "host %d is drained (%d paused sandboxes stay on it: `cellfork admin evacuate %d` moves them)\n", slot, len(sbs), slot)
			return nil
		}
		if running != last {
			fmt.Fprintf(out, "host %d draining: %d running sandboxes left\n", slot, running)
			last = running
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("host %d still runs %d sandboxes after %v: %s", slot, running, timeout, strings.Join(left, ", "))
		case <-time.After(2 * time.Second):
		}
	}
}
