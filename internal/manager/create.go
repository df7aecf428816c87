package manager

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
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
	// Limits the caller asks for; zero fields take the source's (the
	// template's defaults, or the snapshot's).
	Limits    sandbox.Limits
	OnTimeout string // "kill" (default) or "pause"
	// AutoResume: traffic to the paused sandbox resumes it (needs OnTimeout
	// "pause", as in E2B).
	AutoResume bool
	// Network is the policy; nil means the snapshot's, or the default.
	Network *sandbox.Network
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

// normalize fills defaults and rejects what is out of bounds (limits aside:
// see createLimits).
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
	if req.OnTimeout == "" {
		req.OnTimeout = "kill"
	}
	if req.AutoResume && req.OnTimeout != "pause" {
		return errdefs.New(errdefs.ErrInvalidArgument, "autoResume needs autoPause: only a sandbox that pauses on timeout can resume on traffic")
	}
	if req.Network != nil {
		if _, err := policyOf(*req.Network); err != nil {
			return err
		}
	}
	return nil
}

// source is what a new sandbox starts from: a built-in template (its warm
// image, or a boot if it has none) or a snapshot.
type source struct {
	template string // built-in template name; "" for a snapshot
	snapshot *sandbox.Snapshot
	rootfs   string
	image    string // checkpoint to restore; "" = boot
	// limits are the source's: the template's defaults (its warm image's
	// disk size among them), or the snapshot's.
	limits sandbox.Limits
}

// resolve maps a template id to a source: built-in names and aliases
// first, then snapshot ids and names.
func (m *Manager) resolve(ctx context.Context, id string) (source, error) {
	if name, err := template.Resolve(id); err == nil {
		rootfs, err := m.tpl.Rootfs(ctx, name, io.Discard)
		if err != nil {
			return source{}, err
		}
		src := source{template: name, rootfs: rootfs, limits: m.templateLimits(name)}
		if w, ok := m.pool.warmImage(name); ok && w.rootfs == rootfs {
			src.image = w.image
		}
		return src, nil
	}
	sn, err := m.findSnapshot(ctx, id)
	if err != nil {
		return source{}, errdefs.New(errdefs.ErrNotFound, "template or snapshot %q not found (built-in templates: base, code-interpreter-v1)", id)
	}
	return source{snapshot: sn, rootfs: sn.Rootfs, image: sn.Image, limits: m.cfg.DefaultLimits.Over(sn.Limits())}, nil
}

// Create starts a new sandbox from a template or snapshot and returns its
// record once its agent answers. It takes a ready sandbox from the pool
// when it can, else restores the image, else boots; rec.BootMode says
// which. On failure nothing of it is left behind.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ *sandbox.Sandbox, err error) {
	t0 := time.Now()
	src, err := m.resolve(ctx, req.TemplateID)
	if err != nil {
		return nil, err
	}
	if sn := src.snapshot; sn != nil {
		envs := maps.Clone(sn.Envs)
		if envs == nil {
			envs = map[string]string{}
		}
		maps.Copy(envs, req.Envs)
		req.Envs = envs
	}
	if err := m.normalize(&req); err != nil {
		return nil, err
	}
	limits, err := m.createLimits(src, req.Limits)
	if err != nil {
		return nil, err
	}
	timing.Since(ctx, "resolve", t0)
	now := time.Now().UTC()
	rec := &sandbox.Sandbox{
		ID: newID(), TemplateID: req.TemplateID,
		State: sandbox.StateRunning, StartedAt: now, EndAt: now.Add(req.Timeout),
		Metadata: orEmpty(req.Metadata), Envs: orEmpty(req.Envs),
		AccessToken: randomHex(16), OnTimeout: req.OnTimeout, AutoResume: req.AutoResume, Rootfs: src.rootfs,
	}
	rec.SetLimits(limits)
	rec.Network = sandbox.DefaultNetwork
	if src.snapshot != nil {
		rec.BaseSnapshot, rec.Network = src.snapshot.ID, cloneNetwork(src.snapshot.Network)
	}
	if req.Network != nil {
		rec.Network = cloneNetwork(*req.Network)
	}
	b, mode, err := m.startBox(ctx, src, limits)
	if err != nil {
		return nil, err
	}
	rec.RuntimeID, rec.BootMode = b.rid, mode
	if err := m.adoptNew(ctx, rec, b, req.Envs); err != nil {
		return nil, err
	}
	if src.snapshot != nil {
		m.pool.useStandby(src.snapshot, limits)
	}
	m.log.Info("sandbox created", "sandbox.id", rec.ID, "template", req.TemplateID, "mode", mode, "ms", time.Since(t0).Milliseconds())
	return cloneRecord(rec), nil
}

// startBox gets a running box for src with limits: from the pool, by
// restore, or by boot (see limits.go for which limit allows which).
func (m *Manager) startBox(ctx context.Context, src source, limits sandbox.Limits) (*box, string, error) {
	if src.image != "" && limits.DiskMB != src.limits.DiskMB {
		src.image = "" // a template's warm image has its disk size: boot one of the size asked for
	}
	if src.template != "" && src.image != "" && sameSize(limits, src.limits) && rlimitsFit(src.limits, limits) {
		if b := m.pool.takeReady(src.template); b != nil {
			if err := m.fitPids(ctx, b, limits); err != nil {
				m.destroyBox(context.WithoutCancel(ctx), b)
				return nil, "", err
			}
			return b, "pool", nil
		}
	}
	if src.snapshot != nil {
		if b := m.resumeStandby(ctx, src.snapshot.ID, limits); b != nil {
			return b, "standby", nil
		}
	}
	t0 := time.Now()
	release, err := m.adm.acquire(ctx)
	if err != nil {
		return nil, "", err
	}
	defer release()
	timing.Since(ctx, "queue", t0)
	if src.image != "" {
		m.images.acquire(src.image)
		defer m.images.release(src.image)
		b, err := m.restoreBox(ctx, src.image, src.rootfs, limits)
		return b, "restore", err
	}
	b, err := m.bootBox(ctx, src.rootfs, limits)
	return b, "boot", err
}

// adoptNew hands a running box its sandbox: the record is stored, the agent
// initialized (env vars, default user), the timer armed. On failure the box
// is destroyed and nothing is left.
func (m *Manager) adoptNew(ctx context.Context, rec *sandbox.Sandbox, b *box, envs map[string]string) error {
	t0 := time.Now()
	err := m.applyPolicy(b, rec.Network)
	timing.Since(ctx, "policy", t0)
	if err == nil {
		t := time.Now()
		err = m.st.Put(ctx, rec)
		timing.Since(ctx, "store", t)
	}
	t0 = time.Now()
	if err == nil {
		err = m.applyRlimits(ctx, b, sandboxEnvs(rec, envs), rec.Limits())
	}
	if err != nil {
		cctx := context.WithoutCancel(ctx)
		m.destroyBox(cctx, b)
		_ = m.st.Delete(cctx, rec.ID)
		return fmt.Errorf("initializing sandbox %s: %w", rec.ID, err)
	}
	timing.Since(ctx, "init", t0)
	m.register(&Live{rec: rec, box: b})
	return nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return maps.Clone(m)
}

// sandboxEnvs is what the agent of rec's box gets as environment
// variables at hand-off: E2B's identity variables (E2B_SANDBOX,
// E2B_SANDBOX_ID, E2B_TEMPLATE_ID, E2B_TEAM_ID; the agent also writes them
// to /run/e2b/.NAME), then envs, which win. A box restored from another
// sandbox's state carries that sandbox's values until it gets these.
func sandboxEnvs(rec *sandbox.Sandbox, envs map[string]string) map[string]string {
	out := map[string]string{
		"E2B_SANDBOX":     "true",
		"E2B_SANDBOX_ID":  rec.ID,
		"E2B_TEMPLATE_ID": rec.TemplateID,
		"E2B_TEAM_ID":     "cellfork", // one team per daemon, as clientID
	}
	maps.Copy(out, envs)
	return out
}

// postInit hands the agent the sandbox's settings (POST /init, as E2B's
// orchestrator does with envd), this daemon's upload limit and, unless
// limits is nil, the sandbox's process limits to apply.
func (m *Manager) postInit(ctx context.Context, tr http.RoundTripper, envs map[string]string, limits *sandbox.Limits) error {
	init := map[string]any{"envVars": envs, "defaultUser": "user", "maxUploadBytes": m.cfg.MaxUploadBytes}
	if limits != nil {
		init["pidsMax"], init["openFiles"] = limits.PidsMax, limits.OpenFiles
	}
	body, _ := json.Marshal(init)
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
