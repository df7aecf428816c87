package clusterhost

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/cellfork/cellfork/internal/api"
	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
	"github.com/cellfork/cellfork/internal/store"
)

// syncLoop writes the marked sandboxes' and snapshots' rows, retrying
// while the database does not answer.
func (m *Member) syncLoop(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
		case <-time.After(time.Second):
		}
		if m.db == nil {
			continue
		}
		if err := m.flush(ctx); err != nil {
			m.healthy.Store(false)
			if ctx.Err() == nil {
				m.log.Debug("cluster sync deferred", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
			continue
		}
		m.healthy.Store(true)
		backoff = 100 * time.Millisecond
		if m.recheck.CompareAndSwap(true, false) {
			go m.host.RecheckRoots(ctx)
		}
	}
}

// take removes and returns the marked ids of set.
func (m *Member) take(set map[string]bool) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(set))
	for id := range set {
		out = append(out, id)
		delete(set, id)
	}
	return out
}

// flush syncs what is marked; what fails for want of the database is
// marked again.
func (m *Member) flush(ctx context.Context) error {
	var firstErr error
	for _, id := range m.take(m.dirty) {
		if err := m.syncSandbox(ctx, id); err != nil && !errors.As(err, new(dropped)) {
			m.mark(m.dirty, id)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	for _, id := range m.take(m.snaps) {
		if err := m.syncSnapshot(ctx, id); err != nil {
			m.mark(m.snaps, id)
			if firstErr == nil {
				firstErr = err
			}
		}
	}
	return firstErr
}

// lockSync takes the right to write rows, or gives up when ctx is done.
func (m *Member) lockSync(ctx context.Context) (unlock func(), err error) {
	select {
	case m.syncing <- struct{}{}:
		return func() { <-m.syncing }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (m *Member) syncSandbox(ctx context.Context, id string) error {
	unlock, err := m.lockSync(ctx)
	if err != nil {
		return err
	}
	then, err := m.writeSandboxRow(ctx, id)
	unlock()
	if then != nil {
		// Not while holding the right to write rows (it writes the row
		// again), nor in this goroutine: a Put's caller may hold the
		// sandbox, which the host's side takes.
		go then(context.WithoutCancel(ctx))
	}
	return err
}

// dropped is a row write's answer that this host must drop its copy of
// the sandbox, which is not the database failing: the operation whose
// write found it fails with it (a user error of its class), and the sync
// loop moves on.
type dropped struct{ error }

func (d dropped) Unwrap() error { return d.error }

// writeSandboxRow writes sandbox id's row from its local record; then is
// what the host must do about the row written (nil: nothing): drop its
// copy (it moved on, or its team is over its limit; err is then a
// dropped), or its paused image's copy on the disk, once the row names
// the image's root in the chunk store (the cluster's collection keeps it
// from then on). Caller holds the right to write rows (lockSync).
func (m *Member) writeSandboxRow(ctx context.Context, id string) (then func(context.Context), err error) {
	slot := m.Slot()
	rec, err := m.local.Get(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return nil, m.db.Forget(ctx, id, slot)
	}
	if err != nil {
		return nil, err
	}
	row := clusterdb.Sandbox{ID: rec.ID, Team: rec.Team, Region: m.region(), HostSlot: slot, State: string(rec.State),
		MemoryMB: rec.MemoryMB, TemplateID: rec.TemplateID, StartedAt: rec.StartedAt, EndAt: rec.EndAt,
		Metadata: rec.Metadata, Doc: api.ListedDoc(rec), Runtime: m.cfg.Runtime}
	if rec.State == sandbox.StatePaused {
		row.StoreRoot = rec.PausedRoot
	}
	if row.Record, err = store.EncodeSandbox(rec); err != nil {
		return nil, err
	}
	drop := func(class error, why string) (func(context.Context), error) {
		return func(ctx context.Context) { m.host.Drop(ctx, id, why) },
			dropped{errdefs.New(class, "sandbox %q cannot go on on this host: %s", id, why)}
	}
	switch err := m.db.Sync(ctx, row); {
	case errors.Is(err, clusterdb.ErrStale):
		// Another host runs it now (or it ended there): this copy must
		// never answer again.
		return drop(errdefs.ErrNotFound, "it moved to another host")
	case errors.Is(err, clusterdb.ErrTeamLimit):
		return drop(errdefs.ErrLimitReached, "its team is at its limit of running sandboxes")
	case errors.Is(err, clusterdb.ErrNoTeam):
		return drop(errdefs.ErrNotFound, "its team does not exist")
	case err != nil:
		return nil, err
	}
	if root := row.StoreRoot; root != "" && rec.PausedImage != "" {
		return func(ctx context.Context) { m.host.Published(ctx, id, root) }, nil
	}
	return nil, nil
}

func (m *Member) region() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.st.Region
}

func (m *Member) syncSnapshot(ctx context.Context, id string) error {
	unlock, err := m.lockSync(ctx)
	if err != nil {
		return err
	}
	defer unlock()
	sn, err := m.local.GetSnapshot(ctx, id)
	if errors.Is(err, errdefs.ErrNotFound) {
		return m.db.ForgetSnapshot(ctx, id)
	}
	if err != nil {
		return err
	}
	row := clusterdb.Snapshot{ID: sn.ID, Team: sn.Team, Region: m.region(), HostSlot: m.Slot(),
		SandboxID: sn.SandboxID, Names: sn.Names, CreatedAt: sn.CreatedAt, Doc: api.SnapshotDoc(sn), Runtime: sn.Runtime}
	if sn.Upload == sandbox.UploadDone {
		row.StoreRoot = sn.StoreRoot
	}
	if row.Record, err = store.EncodeSnapshot(sn); err != nil {
		return err
	}
	return m.db.SyncSnapshot(ctx, row)
}

// heartbeatLoop renews the lease and reports the host's capacity. A host
// declared lost (fenced) registers again, under a new epoch, and syncs
// everything: what moved on meanwhile is dropped.
func (m *Member) heartbeatLoop(ctx context.Context) {
	t := time.NewTicker(m.cfg.Heartbeat)
	defer t.Stop()
	var lastWarn time.Time
	for {
		err := m.beat(ctx)
		switch {
		case errors.Is(err, clusterdb.ErrFenced):
			m.log.Warn("this host was declared lost; registering again")
			if err = m.register(ctx); err == nil {
				m.markAll(ctx)
				err = m.beat(ctx)
			}
		case errors.Is(err, errNoDB):
			if err = m.register(ctx); err == nil {
				m.markAll(ctx)
			}
		}
		if err != nil && ctx.Err() == nil && time.Since(lastWarn) > time.Minute {
			m.log.Warn("cluster heartbeat failed; sandboxes keep running", "err", err)
			lastWarn = time.Now()
		}
		if err == nil {
			m.pruneTombstones(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// tombstoneAge is how long an ended sandbox's id stays known (a host away
// longer must not come back with it: it is declared lost long before).
const tombstoneAge = 30 * 24 * time.Hour

// pruneTombstones forgets old tombstones, one host an hour.
func (m *Member) pruneTombstones(ctx context.Context) {
	if time.Since(m.pruned) < time.Hour {
		return
	}
	m.pruned = time.Now()
	if ok, err := m.db.ClaimJob(ctx, "tombstones", m.Slot(), time.Hour); err == nil && ok {
		if err := m.db.PruneTombstones(ctx, tombstoneAge); err != nil {
			m.log.Debug("pruning tombstones", "err", err)
		}
	}
}

func (m *Member) beat(ctx context.Context) error {
	if m.db == nil {
		return errNoDB
	}
	sandboxes, memMB, starting := m.host.Usage()
	ps := m.host.PoolStats()
	standbys := []string{}
	for id, ready := range ps.Standbys {
		if ready > 0 {
			standbys = append(standbys, id)
		}
	}
	m.mu.Lock()
	h := clusterdb.Host{Slot: m.st.Slot, Epoch: m.st.Epoch}
	m.mu.Unlock()
	h.CPUs = runtime.NumCPU()
	h.MemTotalMB = memTotalMB()
	h.MemAllocMB = memMB
	h.DiskFreeMB = diskFreeMB(m.cfg.DataDir)
	h.StartQueue = starting
	h.Versions = m.versions()
	h.CPUFeatures = cpuFeatures()
	h.Capacity = clusterdb.Capacity{Ready: ps.Ready, Standbys: standbys, Sandboxes: sandboxes, Pending: starting}
	hctx, cancel := context.WithTimeout(ctx, m.cfg.Heartbeat)
	defer cancel()
	return m.db.Heartbeat(hctx, h, m.cfg.TTL)
}

func memTotalMB() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kb int64
		if n, _ := fmt.Sscanf(sc.Text(), "MemTotal: %d kB", &kb); n == 1 {
			return kb >> 10
		}
	}
	return 0
}

func diskFreeMB(dir string) int64 {
	var fs syscall.Statfs_t
	if syscall.Statfs(dir, &fs) != nil {
		return 0
	}
	return int64(fs.Bavail) * fs.Bsize >> 20
}

var cachedFeatures []string

// cpuFeatures are the CPU's flags (a checkpoint restores only where the
// CPU has the features it was taken with).
func cpuFeatures() []string {
	if cachedFeatures != nil {
		return cachedFeatures
	}
	b, _ := os.ReadFile("/proc/cpuinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "flags" {
			cachedFeatures = strings.Fields(v)
			break
		}
	}
	if cachedFeatures == nil {
		cachedFeatures = []string{}
	}
	return cachedFeatures
}

// versions are what an image depends on: the runtime's build (which
// alone restores the images it wrote) and the agent's protocol.
func (m *Member) versions() map[string]string {
	out := map[string]string{"envd": api.EnvdVersion}
	if m.cfg.Runtime != "" {
		out["runsc"] = m.cfg.Runtime
	}
	return out
}
