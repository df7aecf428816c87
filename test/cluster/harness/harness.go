// Package harness runs a cellfork cluster on one machine for tests and
// demos: a PostgreSQL server (initdb, pg_ctl), hosts each in its own
// network namespace behind a bridge, with its own data directory (the
// template directory shared), and a gateway per region. Hosts are entered
// with nsenter (network namespace only: `ip netns exec` would remount /sys
// and hide the cgroups runsc needs).
//
//	root netns: bridge <tag>b 10.77.N.1/24, PostgreSQL and the gateways on it
//	netns <tag>h1..: veth 10.77.N.11.., default route via the bridge
//	the hosts' chunk store: a directory, or versitygw (S3) on the bridge
//
// Host addresses stay out of 10.88/16 and 10.89/16 (the sandboxes').
package harness

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/chunkstore/chunkstoretest"
	"github.com/cellfork/cellfork/internal/clusterdb/pgtest"
)

// Options shape a cluster.
type Options struct {
	Dir          string   // everything the cluster writes
	Bin          string   // the cellfork binary (its agent beside it)
	TemplateDir  string   // shared by the hosts
	Regions      []string // default eu, us
	HostRegions  []string // one entry per host; default eu, eu, us
	HostFlags    []string // extra flags for every host
	GatewayFlags []string // extra flags for every gateway
	// S3 puts the hosts' shared chunk store in a bucket of a real S3
	// server (versitygw, on the bridge) instead of a shared directory.
	S3 bool
	// Traces, when set, receives the traces of every host and gateway:
	// they run with --tracing and export over OTLP/HTTP to it (served on
	// the bridge, where the hosts reach it). Only requests that come with
	// a sampled traceparent are traced (OTEL_TRACES_SAMPLER=
	// parentbased_always_off), so the rest of a suite costs nothing.
	Traces http.Handler
	Log    io.Writer
}

// Cluster is a running cluster.
type Cluster struct {
	opts     Options
	hostEnv  []string // every host's environment and extra flags (tracing)
	hostArgs []string
	tag      string
	subnet   string // "10.77.N"
	bridge   string
	PG       *pgtest.Server
	Hosts    []*Host
	Gateways map[string]*Proc // by region
	extra    []*Proc          // AddGateway's
	Key      string           // an API key of team "test"
	Team     string
	S3       *chunkstoretest.S3Server // the hosts' store, with Options.S3
	StoreDir string                   // where the store's objects are on disk
	Store    string                   // the hosts' --store
	cleanups []func()
}

// Proc is a daemon the harness runs.
type Proc struct {
	Name string
	Addr string
	args []string
	env  []string // added to the harness's environment
	log  *logBuffer
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// Host is one host of the cluster.
type Host struct {
	Proc
	N       int // its slot (the hosts Start makes: 1, 2, ... in order)
	Region  string
	NS      string
	DataDir string
	vethOut string // its veth's end on the bridge
}

type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
	out io.Writer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	if l.out != nil {
		l.out.Write(p)
	}
	return len(p), nil
}

// Requests counts the requests the process logged (-v).
func (p *Proc) Requests() int { return strings.Count(p.Logs(), "msg=request ") }

// Logs returns what the process printed.
func (p *Proc) Logs() string {
	p.log.mu.Lock()
	defer p.log.mu.Unlock()
	return p.log.buf.String()
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, out)
	}
	return nil
}

// Start brings a cluster up. Close takes it down, whatever Start did.
func Start(ctx context.Context, o Options) (c *Cluster, err error) {
	if len(o.Regions) == 0 {
		o.Regions = []string{"eu", "us"}
	}
	if len(o.HostRegions) == 0 {
		o.HostRegions = []string{"eu", "eu", "us"}
	}
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	c = &Cluster{opts: o, tag: "cft" + hex.EncodeToString(b), Gateways: map[string]*Proc{}, Team: "test"}
	c.subnet = freeSubnet(int(b[0]))
	c.bridge = c.tag + "b"
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	if err := c.network(); err != nil {
		return c, err
	}
	if c.PG, err = pgtest.Start(o.Dir, c.subnet+".1:0"); err != nil {
		return c, err
	}
	c.cleanups = append(c.cleanups, c.PG.Stop)
	// One chunk store for the cluster's hosts: images travel through it.
	c.StoreDir = filepath.Join(o.Dir, "store")
	c.Store = "file://" + c.StoreDir
	if o.S3 {
		if c.S3, err = chunkstoretest.NewS3ServerOn(filepath.Join(o.Dir, "s3"), c.subnet+".1"); err != nil {
			return c, err
		}
		c.cleanups = append(c.cleanups, c.S3.Close)
		bucket, err := c.S3.MakeBucket()
		if err != nil {
			return c, err
		}
		c.Store = "s3://" + bucket + "/cluster"
		c.StoreDir = filepath.Join(o.Dir, "s3", "data", bucket, "cluster") // versitygw's posix backend
	}
	var env, tracing []string
	if o.Traces != nil {
		ln, err := net.Listen("tcp", c.subnet+".1:0")
		if err != nil {
			return c, err
		}
		srv := &http.Server{Handler: o.Traces, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		c.cleanups = append(c.cleanups, func() { _ = srv.Close() })
		env = []string{"OTEL_EXPORTER_OTLP_ENDPOINT=http://" + ln.Addr().String(), "OTEL_TRACES_SAMPLER=parentbased_always_off",
			"OTEL_BSP_SCHEDULE_DELAY=100"}
		tracing = []string{"--tracing"}
	}
	gwAddr := map[string]string{}
	for _, r := range o.Regions {
		gwAddr[r] = net.JoinHostPort(c.subnet+".1", strconv.Itoa(freePort()))
	}
	for i, r := range o.Regions {
		if err := c.Admin(ctx, "region", "add", strconv.Itoa(i+1), r, "--gateway-url", "http://"+gwAddr[r], "--groups", "earth"); err != nil {
			return c, err
		}
	}
	if err := c.Admin(ctx, "team", "add", c.Team); err != nil {
		return c, err
	}
	key, err := c.AdminOut(ctx, "key", "create", c.Team, "harness")
	if err != nil {
		return c, err
	}
	c.Key = strings.TrimSpace(key)
	c.hostEnv, c.hostArgs = env, tracing
	for i, r := range o.HostRegions {
		h, err := c.addHost(i+1, r)
		if err != nil {
			return c, err
		}
		c.Hosts = append(c.Hosts, h)
	}
	// One host at a time: the first builds (or finds) the warm image the
	// others then share.
	for _, h := range c.Hosts {
		if err := h.Start(); err != nil {
			return c, err
		}
	}
	for _, r := range o.Regions {
		g := &Proc{Name: "gateway-" + r, Addr: gwAddr[r], log: &logBuffer{out: o.Log}}
		g.args = []string{o.Bin, "gateway", "--cluster", c.PG.URL, "--region", r, "--addr", gwAddr[r],
			"--state-dir", filepath.Join(o.Dir, "gw-"+r), "-v"}
		g.args = append(append(g.args, o.GatewayFlags...), tracing...)
		g.env = env
		if err := g.Start(); err != nil {
			return c, err
		}
		c.Gateways[r] = g
	}
	// Gateways route once they see the hosts' heartbeats.
	for _, r := range o.Regions {
		if err := c.waitHosts(ctx, r); err != nil {
			return c, err
		}
	}
	return c, nil
}

// freeSubnet picks a 10.77.N subnet no interface has (other clusters on
// the machine, say another test run's), starting from a random N.
func freeSubnet(start int) string {
	used := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				if ip := ipn.IP.To4(); ip != nil && ip[0] == 10 && ip[1] == 77 {
					used[fmt.Sprintf("10.77.%d", ip[2])] = true
				}
			}
		}
	}
	for i := range 250 {
		if s := fmt.Sprintf("10.77.%d", 1+(start+i)%250); !used[s] {
			return s
		}
	}
	return fmt.Sprintf("10.77.%d", 1+start%250)
}

func (c *Cluster) network() error {
	if err := run("ip", "link", "add", c.bridge, "type", "bridge"); err != nil {
		return err
	}
	c.cleanups = append(c.cleanups, func() { _ = run("ip", "link", "del", c.bridge) })
	if err := run("ip", "addr", "add", c.subnet+".1/24", "dev", c.bridge); err != nil {
		return err
	}
	return run("ip", "link", "set", c.bridge, "up")
}

func freePort() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (c *Cluster) addHost(n int, region string) (*Host, error) {
	h := &Host{N: n, Region: region, NS: fmt.Sprintf("%sh%d", c.tag, n), DataDir: filepath.Join(c.opts.Dir, fmt.Sprintf("h%d", n)),
		vethOut: fmt.Sprintf("%sv%d", c.tag, n)}
	h.Proc = Proc{Name: fmt.Sprintf("host%d", n), Addr: fmt.Sprintf("%s.%d:3000", c.subnet, 10+n), log: &logBuffer{out: c.opts.Log}}
	in := h.vethOut + "i"
	steps := [][]string{
		{"ip", "netns", "add", h.NS},
		{"ip", "link", "add", h.vethOut, "type", "veth", "peer", "name", in},
		{"ip", "link", "set", in, "netns", h.NS},
		{"ip", "link", "set", h.vethOut, "master", c.bridge, "up"},
		{"ip", "-n", h.NS, "addr", "add", fmt.Sprintf("%s.%d/24", c.subnet, 10+n), "dev", in},
		{"ip", "-n", h.NS, "link", "set", in, "up"},
		{"ip", "-n", h.NS, "link", "set", "lo", "up"},
		{"ip", "-n", h.NS, "route", "add", "default", "via", c.subnet + ".1"},
	}
	for i, s := range steps {
		if err := run(s[0], s[1:]...); err != nil {
			return nil, err
		}
		if i == 0 {
			c.cleanups = append(c.cleanups, func() { _ = run("ip", "netns", "del", h.NS) })
		}
	}
	args := []string{"nsenter", "--net=/run/netns/" + h.NS, "--", c.opts.Bin, "serve", "--cluster", c.PG.URL, "--region", region,
		"--addr", h.Addr, "--data-dir", h.DataDir, "--template-dir", c.opts.TemplateDir,
		"--pool-ready", "0", "--pool-shells", "0", "--standby-snapshots", "0", "-v", "--store", c.Store}
	h.args = append(append(args, c.opts.HostFlags...), c.hostArgs...)
	if c.S3 != nil {
		h.env = c.S3.Env()
	}
	h.env = append(h.env, c.hostEnv...)
	return h, nil
}

// AddHost adds a host of region to the running cluster with its own,
// empty template directory (as a new machine joining the cluster has),
// starts it and waits until the gateways route to it. It has the next
// slot.
func (c *Cluster) AddHost(ctx context.Context, region, templateDir string) (*Host, error) {
	h, err := c.addHost(len(c.Hosts)+1, region)
	if err != nil {
		return nil, err
	}
	for i := range h.args {
		if h.args[i] == "--template-dir" {
			h.args[i+1] = templateDir
		}
	}
	c.Hosts = append(c.Hosts, h)
	if err := h.Start(); err != nil {
		return h, err
	}
	// Its slot: registrations since the cluster started (a host that
	// registers again takes a number from the sequence too) may have
	// moved it past len(Hosts).
	if m := regexp.MustCompile(`msg="joined the cluster".* slot=(\d+)`).FindAllStringSubmatch(h.Logs(), -1); len(m) > 0 {
		h.N, _ = strconv.Atoi(m[len(m)-1][1])
	}
	return h, c.waitHosts(ctx, region)
}

// Opts returns the options the cluster was started with.
func (c *Cluster) Opts() Options { return c.opts }

// Start starts (or restarts) the process and waits until it answers.
func (p *Proc) Start() error {
	p.mu.Lock()
	p.cmd = exec.Command(p.args[0], p.args[1:]...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if len(p.env) > 0 {
		p.cmd.Env = append(os.Environ(), p.env...)
	}
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		p.mu.Unlock()
		return err
	}
	p.done = make(chan struct{})
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	go func() { _ = cmd.Wait(); close(done) }()
	deadline := time.Now().Add(10 * time.Minute) // a first start may build the template
	for time.Now().Before(deadline) {
		select {
		case <-done:
			return fmt.Errorf("%s exited: %s", p.Name, tail(p.Logs()))
		default:
		}
		if resp, err := http.Get("http://" + p.Addr + "/health"); err == nil {
			resp.Body.Close()
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up: %s", p.Name, tail(p.Logs()))
}

func tail(s string) string {
	if len(s) > 4000 {
		return s[len(s)-4000:]
	}
	return s
}

// Signal sends sig to the process and, for SIGKILL, waits for it.
func (p *Proc) Signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
}

// PID is the process's pid (0 if it does not run).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Running reports whether the process runs.
func (p *Proc) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// runsc is the runtime the hosts use.
const runsc = "/usr/local/lib/cellfork/runsc"

// Kill is a power loss: the daemon and every sandbox of the host die.
func (h *Host) Kill() {
	h.Signal(syscall.SIGKILL)
	root := filepath.Join(h.DataDir, "runsc")
	out, _ := exec.Command("pgrep", "-f", "--", "--root="+root).Output()
	for _, f := range strings.Fields(string(out)) {
		if pid, err := strconv.Atoi(f); err == nil {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Partition cuts the host off the network (it keeps running); Heal
// reconnects it.
func (h *Host) Partition() error { return run("ip", "link", "set", h.vethOut, "down") }

// Heal reconnects a partitioned host.
func (h *Host) Heal() error { return run("ip", "link", "set", h.vethOut, "up") }

// Admin runs `cellfork admin` against the cluster.
func (c *Cluster) Admin(ctx context.Context, args ...string) error {
	_, err := c.AdminOut(ctx, args...)
	return err
}

// AdminOut runs `cellfork admin` and returns what it printed.
func (c *Cluster) AdminOut(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, c.opts.Bin, append([]string{"admin", "--cluster", c.PG.URL}, args...)...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("cellfork admin %s: %w: %s", strings.Join(args, " "), err, errb.String())
	}
	return out.String(), nil
}

// URL is a region's gateway URL.
func (c *Cluster) URL(region string) string { return "http://" + c.Gateways[region].Addr }

// GatewayOptions shape a gateway AddGateway starts.
type GatewayOptions struct {
	Bin   string   // the cellfork binary (default: the cluster's)
	Env   []string // added to its environment
	Quiet bool     // without -v (every request logged)
}

// AddGateway starts another gateway of region beside its first, with the
// same flags but for o: benchmarks compare two builds or settings with
// it. Close stops it with the rest.
func (c *Cluster) AddGateway(region string, o GatewayOptions) (*Proc, error) {
	first, ok := c.Gateways[region]
	if !ok {
		return nil, fmt.Errorf("no gateway of region %s", region)
	}
	n := len(c.extra) + 1
	addr := net.JoinHostPort(c.subnet+".1", strconv.Itoa(freePort()))
	g := &Proc{Name: fmt.Sprintf("gateway-%s-%d", region, n), Addr: addr, env: append(append([]string(nil), first.env...), o.Env...),
		log: &logBuffer{out: c.opts.Log}}
	for i := 0; i < len(first.args); i++ {
		switch a := first.args[i]; {
		case i == 0 && o.Bin != "":
			g.args = append(g.args, o.Bin)
		case a == "-v" && o.Quiet:
		case a == "--addr":
			g.args = append(g.args, a, addr)
			i++
		case a == "--state-dir":
			g.args = append(g.args, a, filepath.Join(c.opts.Dir, fmt.Sprintf("gw-%s-%d", region, n)))
			i++
		default:
			g.args = append(g.args, a)
		}
	}
	c.extra = append(c.extra, g)
	if err := g.Start(); err != nil {
		return nil, err
	}
	return g, nil
}

// waitHosts waits until region's gateway sees its hosts.
func (c *Cluster) waitHosts(ctx context.Context, region string) error {
	want := 0
	for _, r := range c.opts.HostRegions {
		if r == region {
			want++
		}
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		out, err := c.AdminOut(ctx, "hosts")
		if err == nil && strings.Count(out, " active ") >= len(c.Hosts) {
			time.Sleep(1500 * time.Millisecond) // the gateways' next refresh
			return nil
		}
		time.Sleep(200 * time.Millisecond)
	}
	return errors.New("the hosts did not all register")
}

// Close takes the cluster down: sandboxes, hosts, gateways, the database,
// the network.
func (c *Cluster) Close() {
	for _, g := range c.Gateways {
		g.Signal(syscall.SIGTERM)
	}
	for _, g := range c.extra {
		g.Signal(syscall.SIGTERM)
	}
	for _, h := range c.Hosts {
		h.Kill()
		root := filepath.Join(h.DataDir, "runsc")
		out, _ := exec.Command(runsc, "--root", root, "list", "-q").Output()
		for _, id := range strings.Fields(string(out)) {
			if id != "ID" {
				_ = exec.Command(runsc, "--root", root, "delete", "-force", id).Run()
			}
		}
		for unmount(filepath.Join(root, "null-netns")) == nil {
		}
		prefix := "cf" + hashPrefix(h.DataDir) + "-"
		entries, _ := os.ReadDir("/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), prefix) {
				_ = run("ip", "netns", "del", e.Name())
			}
		}
	}
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		c.cleanups[i]()
	}
}
