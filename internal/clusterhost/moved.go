package clusterhost

import (
	"context"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Copies of sandboxes that moved away. A paused sandbox whose image is in
// the chunk store can be moved off a host that is up (an operator's
// evacuate of a cordoned host, a resume through a gateway while its host
// drains): its row then names another host, and this host's copy must
// go, not wait for a write of its row that may never come. The host
// follows the database's cellfork_moved notifications (as the gateways
// do) and syncs the row of each local sandbox one names: the write finds
// the row moved on or ended (ErrStale), and the copy is dropped
// (Host.Drop). Notifications sent while it did not listen are lost, so
// each reconnect asks which local sandboxes' rows name another host.

// listenLoop follows cellfork_moved until ctx ends.
func (m *Member) listenLoop(ctx context.Context) {
	first := true
	for ctx.Err() == nil {
		err := m.listenOnce(ctx, first)
		if ctx.Err() != nil {
			return
		}
		first = false
		m.log.Debug("moved-sandbox listener reconnecting", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// listenOnce listens until the connection fails. The first connect needs
// no check: Start marked every local sandbox.
func (m *Member) listenOnce(ctx context.Context, first bool) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	conn, err := pgx.Connect(cctx, m.cfg.URL)
	cancel()
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "LISTEN cellfork_moved"); err != nil {
		return err
	}
	if !first {
		if err := m.markMovedAway(ctx); err != nil {
			return err
		}
	}
	for {
		n, err := conn.WaitForNotification(ctx)
		if err != nil {
			return err
		}
		// "id:slot": moved to slot, or (a moved sandbox's row deleted)
		// its home slot. A local copy's row is written again either way:
		// for a sandbox that is this host's, that changes nothing.
		id, _, ok := strings.Cut(n.Payload, ":")
		if !ok {
			continue
		}
		if _, err := m.local.Get(ctx, id); err == nil {
			m.mark(m.dirty, id)
		}
	}
}

// markMovedAway marks the local sandboxes whose rows name another host.
func (m *Member) markMovedAway(ctx context.Context) error {
	if m.db == nil {
		return errNoDB
	}
	recs, err := m.local.List(ctx)
	if err != nil {
		return err
	}
	ids := make([]string, len(recs))
	for i, r := range recs {
		ids[i] = r.ID
	}
	away, err := m.db.AwayFrom(ctx, m.Slot(), ids)
	if err != nil {
		return err
	}
	for _, id := range away {
		m.mark(m.dirty, id)
	}
	return nil
}
