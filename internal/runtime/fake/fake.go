// Package fake is a machine in memory: a sandbox.Runtime, the
// sandbox.Networks its boxes join, and a box.Agent for the agents inside
// them, sharing one view of what runs. The manager's unit tests run on it
// without root in milliseconds; internal/runtime/runtimetest holds it to the
// same contract as gVisor.
//
// A box's "memory" is a string: Start sets it to "boot", Write changes it
// (as code run inside would), Checkpoint saves it in the image and Restore
// loads it, so tests can check that a restore has exactly its image's
// state.
package fake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cellfork/cellfork/internal/box"
	"github.com/cellfork/cellfork/internal/envd"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Host is the fake machine. Safe for concurrent use.
type Host struct {
	mu       sync.Mutex
	boxes    map[string]*container // runtime id -> container
	nets     map[string]*Net       // name -> network
	fail     map[string]error      // operation -> error it fails with
	inits    map[string][]envd.InitRequest
	restores int
}

type container struct {
	spec    sandbox.Spec
	state   string // created, running, paused, stopped
	memory  string
	pidsMax int
	// background: started with Spec.Background and not yet Foreground;
	// restoredInBackground: it was when its image was restored.
	background, restoredInBackground bool
	onExit                           []func()
}

// New returns an empty machine.
func New() *Host {
	return &Host{boxes: map[string]*container{}, nets: map[string]*Net{}, fail: map[string]error{}, inits: map[string][]envd.InitRequest{}}
}

var (
	_ sandbox.Runtime  = (*Host)(nil)
	_ sandbox.Networks = Networks{}
	_ box.Agent        = Agent{}
)

// Networks returns the machine's networks.
func (h *Host) Networks() Networks { return Networks{h} }

// Agent returns the client of the agents in the machine's boxes.
func (h *Host) Agent() Agent { return Agent{h} }

// Fail makes every call of op (a Runtime or Networks method name, e.g.
// "Restore", "Create", a Net's "SetPolicy", or an Agent's "Init") fail
// with err; nil clears it.
func (h *Host) Fail(op string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		delete(h.fail, op)
	} else {
		h.fail[op] = err
	}
}

func (h *Host) failing(op string) error {
	if err := h.fail[op]; err != nil {
		return fmt.Errorf("fake %s: %w", op, err)
	}
	return nil
}

// Write sets the memory of the running box rid (code ran inside).
func (h *Host) Write(rid, memory string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.boxes[rid]
	if c == nil || c.state != "running" {
		return fmt.Errorf("fake: %s is not running", rid)
	}
	c.memory = memory
	return nil
}

// Memory returns the memory of box rid ("" if it does not exist).
func (h *Host) Memory(rid string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.boxes[rid]; c != nil {
		return c.memory
	}
	return ""
}

// Inits returns the /init requests box rid got.
func (h *Host) Inits(rid string) []envd.InitRequest {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.inits[rid])
}

// Restores counts the restores done.
func (h *Host) Restores() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.restores
}

// Crash ends box rid as if it died on its own.
func (h *Host) Crash(rid string) {
	h.mu.Lock()
	c := h.boxes[rid]
	var fns []func()
	if c != nil {
		c.state, fns, c.onExit = "stopped", c.onExit, nil
	}
	h.mu.Unlock()
	for _, f := range fns {
		go f()
	}
}

// Leaks lists the runtimes and networks that exist.
func (h *Host) Leaks() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for rid := range h.boxes {
		out = append(out, "runtime "+rid)
	}
	for name := range h.nets {
		out = append(out, "network "+name)
	}
	slices.Sort(out)
	return out
}

// Runtime.

func (h *Host) add(s sandbox.Spec, state, memory string) error {
	if _, ok := h.boxes[s.RuntimeID]; ok {
		return fmt.Errorf("fake: runtime %s exists", s.RuntimeID)
	}
	if err := os.MkdirAll(s.BundleDir, 0o700); err != nil {
		return err
	}
	h.boxes[s.RuntimeID] = &container{spec: s, state: state, memory: memory, pidsMax: s.Limits.PidsMax, background: s.Background}
	return nil
}

// Start boots a box: its memory is "boot", or "boot+" the files of
// Spec.RootfsUpper.
func (h *Host) Start(_ context.Context, s sandbox.Spec) error {
	memory := "boot"
	if s.RootfsUpper != "" {
		files, err := os.ReadFile(s.RootfsUpper)
		if err != nil {
			return fmt.Errorf("fake start: %w", err)
		}
		memory = "boot+" + string(files)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Start"); err != nil {
		return err
	}
	return h.add(s, "running", memory)
}

// ExportRootfs writes the box's files: in the fake, its whole memory.
func (h *Host) ExportRootfs(_ context.Context, rid, path string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("ExportRootfs"); err != nil {
		return err
	}
	c := h.boxes[rid]
	if c == nil || (c.state != "running" && c.state != "paused") {
		return fmt.Errorf("fake export: %s is not running", rid)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.WriteString(c.memory)
	return err
}

// Prepare creates a box that runs nothing.
func (h *Host) Prepare(_ context.Context, s sandbox.Spec) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Prepare"); err != nil {
		return err
	}
	return h.add(s, "created", "")
}

// image is what a fake checkpoint holds.
type image struct {
	Rootfs string `json:"rootfs"`
	Memory string `json:"memory"`
}

// Restore starts a box from an image.
func (h *Host) Restore(_ context.Context, s sandbox.Spec, dir string, prepared bool) error {
	raw, err := os.ReadFile(filepath.Join(dir, "checkpoint.img"))
	if err != nil {
		return fmt.Errorf("fake restore: %w", err)
	}
	var img image
	if err := json.Unmarshal(raw, &img); err != nil {
		return fmt.Errorf("fake restore: %w", err)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Restore"); err != nil {
		return err
	}
	if img.Rootfs != s.Rootfs {
		return fmt.Errorf("fake restore: image of rootfs %s into %s", img.Rootfs, s.Rootfs)
	}
	h.restores++
	if prepared {
		c := h.boxes[s.RuntimeID]
		if c == nil || c.state != "created" {
			return fmt.Errorf("fake restore: %s is not prepared", s.RuntimeID)
		}
		c.state, c.memory, c.restoredInBackground = "running", img.Memory, c.background
		return nil
	}
	if err := h.add(s, "running", img.Memory); err != nil {
		return err
	}
	h.boxes[s.RuntimeID].restoredInBackground = s.Background
	return nil
}

// Checkpoint saves a box's memory into dir.
func (h *Host) Checkpoint(_ context.Context, rid, dir string, leaveRunning bool) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Checkpoint"); err != nil {
		return err
	}
	c := h.boxes[rid]
	if c == nil || (c.state != "running" && c.state != "paused") {
		return fmt.Errorf("fake checkpoint: %s is not running", rid)
	}
	raw, _ := json.Marshal(image{Rootfs: c.spec.Rootfs, Memory: c.memory})
	if err := os.WriteFile(filepath.Join(dir, "checkpoint.img"), raw, 0o600); err != nil {
		return err
	}
	if !leaveRunning {
		c.state = "stopped"
	}
	return nil
}

func (h *Host) setState(op, rid, from, to string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing(op); err != nil {
		return err
	}
	c := h.boxes[rid]
	if c == nil || c.state != from {
		return fmt.Errorf("fake %s: %s is not %s", op, rid, from)
	}
	c.state = to
	return nil
}

// Pause freezes a box.
func (h *Host) Pause(_ context.Context, rid string) error {
	return h.setState("Pause", rid, "running", "paused")
}

// Resume thaws a box.
func (h *Host) Resume(_ context.Context, rid string) error {
	return h.setState("Resume", rid, "paused", "running")
}

// Destroy removes a box; destroying one that does not exist is no error.
func (h *Host) Destroy(_ context.Context, rid string) error {
	h.mu.Lock()
	if err := h.failing("Destroy"); err != nil {
		h.mu.Unlock()
		return err
	}
	c := h.boxes[rid]
	delete(h.boxes, rid)
	delete(h.inits, rid)
	h.mu.Unlock()
	if c != nil {
		for _, f := range c.onExit {
			go f()
		}
	}
	return nil
}

// State returns a box's state, "" if it does not exist.
func (h *Host) State(_ context.Context, rid string) (string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if c := h.boxes[rid]; c != nil {
		return c.state, nil
	}
	return "", nil
}

// List returns every box's runtime id.
func (h *Host) List(context.Context) ([]string, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for rid := range h.boxes {
		out = append(out, rid)
	}
	slices.Sort(out)
	return out, nil
}

// Stats returns a fixed sample.
func (h *Host) Stats(_ context.Context, rid string) (sandbox.Stats, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.boxes[rid] == nil {
		return sandbox.Stats{}, fmt.Errorf("fake stats: no runtime %s", rid)
	}
	return sandbox.Stats{CPUUsage: time.Millisecond, MemoryBytes: 64 << 20}, nil
}

// SetPidsMax records the bound.
func (h *Host) SetPidsMax(_ context.Context, rid string, pidsMax int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("SetPidsMax"); err != nil {
		return err
	}
	c := h.boxes[rid]
	if c == nil {
		return fmt.Errorf("fake: no runtime %s", rid)
	}
	c.pidsMax = pidsMax
	return nil
}

// Foreground gives the box the normal CPU weight.
func (h *Host) Foreground(_ context.Context, rid string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Foreground"); err != nil {
		return err
	}
	c := h.boxes[rid]
	if c == nil {
		return fmt.Errorf("fake: no runtime %s", rid)
	}
	c.background = false
	return nil
}

// Background reports whether box rid runs at the background CPU weight,
// and whether it did when its image was restored.
func (h *Host) Background(rid string) (now, restored bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	c := h.boxes[rid]
	if c == nil {
		return false, false
	}
	return c.background, c.restoredInBackground
}

// Watch calls onExit once when the box with bundleDir ends.
func (h *Host) Watch(_ context.Context, bundleDir string, onExit func()) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.boxes {
		if c.spec.BundleDir == bundleDir {
			if c.state == "stopped" {
				go onExit()
			} else {
				c.onExit = append(c.onExit, onExit)
			}
			return nil
		}
	}
	go onExit() // gone already
	return nil
}

// Networks.

// Net is a fake network.
type Net struct {
	h      *Host
	name   string
	mu     sync.Mutex
	policy sandbox.Policy
	set    bool
}

// Networks are a Host's networks.
type Networks struct{ h *Host }

// Create makes a network.
func (ns Networks) Create(name string) (sandbox.Net, error) {
	h := ns.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.failing("Create"); err != nil {
		return nil, err
	}
	if _, ok := h.nets[name]; ok {
		return nil, fmt.Errorf("fake: network %s exists", name)
	}
	n := &Net{h: h, name: name}
	h.nets[name] = n
	return n, nil
}

// Open takes over an existing network.
func (ns Networks) Open(name string) (sandbox.Net, error) {
	h := ns.h
	h.mu.Lock()
	defer h.mu.Unlock()
	n := h.nets[name]
	if n == nil {
		return nil, fmt.Errorf("fake: no network %s", name)
	}
	return n, nil
}

// Remove deletes a network.
func (ns Networks) Remove(name string) error { return ns.h.removeNet(name) }

func (h *Host) removeNet(name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.nets, name)
	return nil
}

// List returns the networks' names starting with prefix.
func (ns Networks) List(prefix string) ([]string, error) {
	h := ns.h
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for name := range h.nets {
		if strings.HasPrefix(name, prefix) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out, nil
}

// SandboxPath names the network.
func (n *Net) SandboxPath() string { return "/fake/netns/" + n.name + "-s" }

// Dial has no data plane to reach.
func (n *Net) Dial(context.Context, int) (net.Conn, error) {
	return nil, errors.New("fake network: no data plane")
}

// SetPolicy records the policy.
func (n *Net) SetPolicy(p sandbox.Policy) error {
	n.h.mu.Lock()
	err := n.h.failing("SetPolicy")
	n.h.mu.Unlock()
	if err != nil {
		return err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.policy, n.set = p, true
	return nil
}

// Policy returns the policy set, and whether one was.
func (n *Net) Policy() (sandbox.Policy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.policy, n.set
}

// Denied counts nothing.
func (n *Net) Denied() (uint64, error) { return 0, nil }

// Close keeps the network.
func (n *Net) Close() {}

// Destroy removes the network.
func (n *Net) Destroy() error { return n.h.removeNet(n.name) }

// Agent is the agents inside a Host's boxes.
type Agent struct{ H *Host }

func (a Agent) running(op string, b *box.Box) error {
	a.H.mu.Lock()
	defer a.H.mu.Unlock()
	if err := a.H.failing(op); err != nil {
		return err
	}
	if c := a.H.boxes[b.RID]; c == nil || c.state != "running" {
		return fmt.Errorf("fake agent of %s does not answer", b.RID)
	}
	return nil
}

// WaitUp succeeds once the box runs.
func (a Agent) WaitUp(_ context.Context, b *box.Box) error { return a.running("WaitUp", b) }

// Init records the request.
func (a Agent) Init(_ context.Context, b *box.Box, req envd.InitRequest) error {
	if err := a.running("Init", b); err != nil {
		return err
	}
	a.H.mu.Lock()
	defer a.H.mu.Unlock()
	a.H.inits[b.RID] = append(a.H.inits[b.RID], req)
	return nil
}

// Health succeeds while the box runs.
func (a Agent) Health(_ context.Context, b *box.Box) error { return a.running("Health", b) }

// WaitReady succeeds while the box runs.
func (a Agent) WaitReady(_ context.Context, b *box.Box) error { return a.running("WaitReady", b) }
