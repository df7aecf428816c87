package manager

import (
	"bufio"
	"context"
	"os"
	"path/filepath"
	"strings"

	"github.com/cellfork/cellfork/internal/box"
)

// How a sandbox ends: killed, dropped, or dead on its own.

// Kill destroys a sandbox and everything it holds.
func (m *Manager) Kill(ctx context.Context, id string) error {
	l, err := m.begin(ctx, id, "killing it", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	l.leaveDisk()
	b := m.forget(l)
	return m.teardown(context.WithoutCancel(ctx), l.rec, b)
}

// Drop kills a sandbox this host must not run any longer (a cluster host's
// copy of a sandbox that moved on, or over its team's bound), and
// remembers why, for the id's later callers.
func (m *Manager) Drop(ctx context.Context, id, why string) {
	l, err := m.begin(context.Background(), id, "dropping it", running, frozen, spilled)
	if err != nil {
		return
	}
	defer l.op.Unlock()
	l.leaveDisk()
	b := m.forget(l)
	m.bury(id, "dropped: "+why)
	m.log.Warn("sandbox dropped", "sandbox.id", id, "why", why)
	_ = m.teardown(context.WithoutCancel(ctx), l.rec, b)
}

// watchBox arranges for the sandbox to be torn down, and its death
// remembered, if b exits while it is the sandbox's running box (a box the
// daemon destroys or freezes itself is not, by then). Caller holds l.op.
func (m *Manager) watchBox(l *Live, b *box.Box) {
	if err := m.boxes.Watch(context.Background(), b, func() { m.boxExited(l, b) }); err != nil {
		m.log.Warn("cannot watch sandbox process", "sandbox.id", l.rec.ID, "err", err)
	}
}

func (m *Manager) boxExited(l *Live, b *box.Box) {
	reason := deathReason(b.RID)
	l.op.Lock()
	defer l.op.Unlock()
	if l.box != b || l.phase != running {
		return // killed, swapped out, or frozen/spilled by us
	}
	m.log.Error("sandbox died", "sandbox.id", l.rec.ID, "runtime.id", b.RID, "reason", reason)
	m.forget(l)
	m.bury(l.rec.ID, reason)
	_ = m.teardown(context.Background(), l.rec, b)
}

// deathReason reads the sandbox's cgroup: a memory-limit kill is the usual
// cause of a sandbox dying on its own.
func deathReason(rid string) string {
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/memory/cellfork", rid, "memory.oom_control"), // v1
		filepath.Join("/sys/fs/cgroup/cellfork", rid, "memory.events"),             // v2
	} {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			k, v, _ := strings.Cut(sc.Text(), " ")
			if k == "oom_kill" && v != "0" {
				f.Close()
				return "it exceeded its memory limit"
			}
		}
		f.Close()
	}
	return "its gVisor sandbox exited unexpectedly"
}
