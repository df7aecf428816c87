package manager

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cellfork/cellfork/internal/box"
)

// tombstoneTTL is how long the reason a sandbox died is remembered.
const tombstoneTTL = time.Hour

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
	m.mu.Lock()
	m.tombs[l.rec.ID] = tomb{reason: reason, at: time.Now()}
	m.mu.Unlock()
	_ = m.teardown(context.Background(), l.rec, b)
}

// tomb remembers why a sandbox is gone.
type tomb struct {
	reason string
	at     time.Time
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

// diedMessage is the caller-facing message for a sandbox that died, or "".
func (m *Manager) diedMessage(id string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.tombs[id]
	if !ok {
		return ""
	}
	if time.Since(t.at) > tombstoneTTL {
		delete(m.tombs, id)
		return ""
	}
	return fmt.Sprintf("sandbox %q died at %s: %s", id, t.at.UTC().Format(time.RFC3339), t.reason)
}
