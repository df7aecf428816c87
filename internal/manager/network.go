package manager

import (
	"context"

	"github.com/cellfork/cellfork/internal/cleanup"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Network returns the sandbox's policy and its denied-connection count.
func (m *Manager) Network(ctx context.Context, id string) (sandbox.NetworkStatus, error) {
	l, err := m.lookup(ctx, id)
	if err != nil {
		return sandbox.NetworkStatus{}, err
	}
	l.mu.Lock()
	st, b := sandbox.NetworkStatus{Policy: l.rec.Network.Clone()}, l.box
	l.mu.Unlock()
	if b != nil {
		st.Denied, _ = b.Net.Denied()
	}
	return st, nil
}

// UpdateNetwork replaces the sandbox's network policy, at once if it runs
// (or is frozen), else when it resumes.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, n sandbox.Network) error {
	if _, err := sandbox.ParsePolicy(n); err != nil {
		return err
	}
	l, err := m.begin(ctx, id, "changing its network", running, frozen, spilled)
	if err != nil {
		return err
	}
	defer l.op.Unlock()
	if l.phase == running {
		// Before the network terminates TLS with the CA (a frozen box is
		// told when it resumes, one on disk at its hand-off).
		if err := m.boxes.Trust(ctx, l.box, n); err != nil {
			return err
		}
	}
	old := l.rec.Network
	var cu cleanup.Cleanup
	defer cu.Clean()
	if l.box != nil {
		if err := m.boxes.SetPolicy(l.box, n); err != nil {
			return err
		}
		cu.Add(func() { _ = m.boxes.SetPolicy(l.box, old) })
	}
	l.update(func() { l.rec.Network = n.Clone() })
	cu.Add(func() { l.update(func() { l.rec.Network = old }) })
	if err := m.put(ctx, l.rec); err != nil {
		return err
	}
	cu.Release()
	return nil
}
