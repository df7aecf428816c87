package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/template"
	"github.com/cellfork/cellfork/internal/timing"
)

// CreateRequest is what a caller may choose about a new sandbox. Zero values
// mean the defaults.
type CreateRequest struct {
	TemplateID string
	Timeout    time.Duration
	Metadata   map[string]string
	Envs       map[string]string
	CPUCount   int
	MemoryMB   int
}

// Limits on caller-supplied maps, so a request cannot bloat the store.
const (
	maxMapEntries = 128
	maxKeyLen     = 256
	maxValueLen   = 16 << 10
)

func validateMap(what string, m map[string]string, envStyle bool) error {
	if len(m) > maxMapEntries {
		return errdefs.New(errdefs.ErrInvalidArgument, "%s: at most %d entries", what, maxMapEntries)
	}
	for k, v := range m {
		switch {
		case k == "" || len(k) > maxKeyLen:
			return errdefs.New(errdefs.ErrInvalidArgument, "%s: keys must be 1-%d bytes", what, maxKeyLen)
		case len(v) > maxValueLen:
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: value longer than %d bytes", what, k, maxValueLen)
		case strings.ContainsRune(k, 0) || strings.ContainsRune(v, 0):
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: NUL bytes are not allowed", what, k)
		case envStyle && strings.ContainsRune(k, '='):
			return errdefs.New(errdefs.ErrInvalidArgument, "%s %q: names must not contain '='", what, k)
		}
	}
	return nil
}

// normalize fills defaults and rejects what is out of bounds.
func (m *Manager) normalize(req *CreateRequest) error {
	if req.Timeout == 0 {
		req.Timeout = m.cfg.DefaultTimeout
	}
	if err := m.checkTimeout(req.Timeout); err != nil {
		return err
	}
	if err := validateMap("metadata", req.Metadata, false); err != nil {
		return err
	}
	if err := validateMap("envVars", req.Envs, true); err != nil {
		return err
	}
	if req.CPUCount == 0 {
		req.CPUCount = m.cfg.DefaultLimits.CPUCount
	}
	if req.MemoryMB == 0 {
		req.MemoryMB = m.cfg.DefaultLimits.MemoryMB
	}
	if req.CPUCount < 1 || req.CPUCount > m.cfg.MaxLimits.CPUCount {
		return errdefs.New(errdefs.ErrInvalidArgument, "cpuCount must be between 1 and %d", m.cfg.MaxLimits.CPUCount)
	}
	if req.MemoryMB < 128 || req.MemoryMB > m.cfg.MaxLimits.MemoryMB {
		return errdefs.New(errdefs.ErrInvalidArgument, "memoryMB must be between 128 and %d", m.cfg.MaxLimits.MemoryMB)
	}
	return nil
}

// Create boots a new sandbox from a template and returns its record once
// its agent answers. On failure nothing of it is left behind.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ *sandbox.Sandbox, err error) {
	if err := m.normalize(&req); err != nil {
		return nil, err
	}
	name, err := template.Resolve(req.TemplateID)
	if err != nil {
		return nil, err
	}
	t0 := time.Now()
	rootfs, err := m.tpl.Rootfs(ctx, name, discard)
	if err != nil {
		return nil, err
	}
	timing.Since(ctx, "template", t0)

	now := time.Now().UTC()
	rec := &sandbox.Sandbox{
		ID: newID(), TemplateID: req.TemplateID, RuntimeID: randomHex(12),
		State: sandbox.StateRunning, StartedAt: now, EndAt: now.Add(req.Timeout),
		Metadata: orEmpty(req.Metadata), Envs: orEmpty(req.Envs),
		CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, DiskSizeMB: req.MemoryMB,
		AccessToken: randomHex(16), OnTimeout: "kill",
	}
	// The record goes first, so that a crash at any later step leaves
	// something the next start can account for and clean up.
	if err := m.st.Put(ctx, rec); err != nil {
		return nil, err
	}
	var n *netns.Network
	started := false
	defer func() {
		if err != nil {
			cctx := context.WithoutCancel(ctx)
			if !started {
				_ = m.rt.Destroy(cctx, rec.RuntimeID)
			}
			_ = m.teardown(cctx, rec, n, nil)
		}
	}()

	t1 := time.Now()
	n, err = netns.Create(netPrefix + rec.ID)
	if err != nil {
		return nil, err
	}
	timing.Since(ctx, "netns", t1)
	spec := sandbox.Spec{
		RuntimeID: rec.RuntimeID,
		BundleDir: m.bundleDir(rec.ID),
		Rootfs:    rootfs,
		Args:      []string{template.AgentDir + "/cellfork-agent"},
		Env:       agentEnv(m.cfg.MaxUploadBytes),
		NetnsPath: n.SandboxPath(),
		Limits:    sandbox.Limits{CPUCount: rec.CPUCount, MemoryMB: rec.MemoryMB, PidsMax: m.cfg.DefaultLimits.PidsMax},
	}
	if err := m.rt.Start(ctx, spec); err != nil {
		return nil, fmt.Errorf("starting sandbox %s: %w", rec.ID, err)
	}
	started = true
	l := &Live{rec: rec, net: n, transport: newTransport(n)}
	if err := m.initAgent(ctx, l); err != nil {
		return nil, fmt.Errorf("starting agent of sandbox %s: %w", rec.ID, err)
	}
	l.mu.Lock()
	m.armTimer(l, rec.ID)
	l.mu.Unlock()
	m.mu.Lock()
	m.live[rec.ID] = l
	m.mu.Unlock()
	m.log.Info("sandbox created", "sandbox.id", rec.ID, "template", req.TemplateID, "ms", time.Since(t0).Milliseconds())
	return cloneRecord(rec), nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

func agentEnv(maxUpload int64) []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		"LANG=C.UTF-8",
		fmt.Sprintf("CELLFORK_MAX_UPLOAD_BYTES=%d", maxUpload),
	}
}

// initAgent waits until the agent accepts connections, then hands it the
// sandbox's settings (POST /init, as E2B's orchestrator does with envd).
func (m *Manager) initAgent(ctx context.Context, l *Live) error {
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for delay := time.Millisecond; ; delay = min(2*delay, 20*time.Millisecond) {
		// A short per-attempt deadline: until gVisor owns the interface a
		// SYN can be dropped, and the kernel's retransmit takes a second.
		dctx, dcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		c, err := l.net.Dial(dctx, EnvdPort)
		dcancel()
		if err == nil {
			c.Close()
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("agent did not start: %w", err)
		}
		time.Sleep(delay)
	}
	timing.Since(ctx, "agent", t0)
	t1 := time.Now()
	defer timing.Since(ctx, "init", t1)
	return m.postInit(ctx, l.transport, l.rec.Envs)
}

func (m *Manager) postInit(ctx context.Context, tr http.RoundTripper, envs map[string]string) error {
	body, _ := json.Marshal(map[string]any{"envVars": envs, "defaultUser": "user"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://sandbox:%d/init", EnvdPort), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return fmt.Errorf("posting /init: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return errors.New("agent refused /init: " + resp.Status)
	}
	return nil
}
