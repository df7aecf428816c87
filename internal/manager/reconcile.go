package manager

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/netns"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Reconcile makes the daemon's view match reality after a start: it adopts
// sandboxes that are recorded and still running, and removes whatever it
// cannot account for (records without a sandbox, runsc containers, network
// namespaces and bundle directories without a record).
func (m *Manager) Reconcile(ctx context.Context) error {
	recs, err := m.st.List(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}    // sandbox ids kept
	knownRID := map[string]bool{} // runtime ids kept
	for _, rec := range recs {
		if m.adopt(ctx, rec) {
			known[rec.ID] = true
			knownRID[rec.RuntimeID] = true
			continue
		}
		m.log.Warn("removing sandbox that did not survive", "sandbox.id", rec.ID)
		_ = m.teardown(ctx, rec, nil, nil)
	}
	var errs []error
	rids, err := m.rt.List(ctx)
	if err != nil {
		errs = append(errs, err)
	}
	for _, rid := range rids {
		if !knownRID[rid] {
			m.log.Warn("removing unknown runsc container", "runtime.id", rid)
			errs = append(errs, m.rt.Destroy(ctx, rid))
		}
	}
	names, err := netns.List(netPrefix)
	errs = append(errs, err)
	for _, name := range names {
		if !known[strings.TrimPrefix(name, netPrefix)] {
			m.log.Warn("removing unknown network namespace", "netns", name)
			errs = append(errs, netns.Remove(name))
		}
	}
	entries, _ := os.ReadDir(filepath.Join(m.cfg.DataDir, "sandboxes"))
	for _, e := range entries {
		if !known[e.Name()] {
			errs = append(errs, os.RemoveAll(filepath.Join(m.cfg.DataDir, "sandboxes", e.Name())))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("reconciling: %w", err)
	}
	return nil
}

// adopt takes over a recorded sandbox that is still running.
func (m *Manager) adopt(ctx context.Context, rec *sandbox.Sandbox) bool {
	if rec.State != sandbox.StateRunning {
		return false
	}
	running, err := m.rt.Running(ctx, rec.RuntimeID)
	if err != nil || !running {
		return false
	}
	n, err := netns.Open(netPrefix + rec.ID)
	if err != nil {
		return false
	}
	l := &Live{rec: rec, net: n, transport: newTransport(n)}
	// The agent must still answer, or the sandbox is of no use.
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := n.Dial(cctx, EnvdPort)
	if err != nil {
		n.Close()
		return false
	}
	c.Close()
	l.mu.Lock()
	m.armTimer(l, rec.ID) // already expired: fires at once and kills it
	l.mu.Unlock()
	m.mu.Lock()
	m.live[rec.ID] = l
	m.mu.Unlock()
	m.log.Info("adopted running sandbox", "sandbox.id", rec.ID)
	return true
}
