package manager

import (
	"context"
	"errors"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

// Each operation accepts the phases it names and refuses the others with
// one error style: NotFound once gone, AlreadyExists for pausing a paused
// sandbox (E2B's 409), FailedPrecondition otherwise.
func TestStateMachine(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	sn := func(id string) string {
		s, err := e.m.Snapshot(ctx, id, "")
		if err != nil {
			t.Fatal(err)
		}
		return s.ID
	}
	ops := map[string]func(id, snap string) error{
		"snapshot": func(id, _ string) error { _, err := e.m.Snapshot(ctx, id, ""); return err },
		"fork":     func(id, _ string) error { _, err := e.m.Fork(ctx, id, 1, 0); return err },
		"rollback": func(id, s string) error { _, err := e.m.Rollback(ctx, id, s); return err },
		"pause":    func(id, _ string) error { return e.m.Pause(ctx, id, sandbox.PauseRequest{}) },
		"spill":    func(id, _ string) error { return e.m.Pause(ctx, id, sandbox.PauseRequest{Spill: true}) },
	}
	want := map[string]map[phase]error{ // nil: accepted
		"snapshot": {running: nil, frozen: errdefs.ErrFailedPrecondition, spilled: errdefs.ErrFailedPrecondition, dead: errdefs.ErrNotFound},
		"fork":     {running: nil, frozen: errdefs.ErrFailedPrecondition, spilled: errdefs.ErrFailedPrecondition, dead: errdefs.ErrNotFound},
		"rollback": {running: nil, frozen: errdefs.ErrFailedPrecondition, spilled: errdefs.ErrFailedPrecondition, dead: errdefs.ErrNotFound},
		"pause":    {running: nil, frozen: errdefs.ErrAlreadyExists, spilled: errdefs.ErrAlreadyExists, dead: errdefs.ErrNotFound},
		"spill":    {running: nil, frozen: nil, spilled: nil, dead: errdefs.ErrNotFound},
	}
	into := func(p phase) (string, string) {
		sb := e.create(sandbox.CreateRequest{})
		s := sn(sb.ID)
		switch p {
		case frozen:
			_ = e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{})
		case spilled:
			_ = e.m.Pause(ctx, sb.ID, sandbox.PauseRequest{Spill: true})
		case dead:
			_ = e.m.Kill(ctx, sb.ID)
		}
		return sb.ID, s
	}
	for name, op := range ops {
		for p, wantErr := range want[name] {
			id, s := into(p)
			err := op(id, s)
			if wantErr == nil && err != nil || wantErr != nil && !errors.Is(err, wantErr) {
				t.Errorf("%s in phase %s: %v, want %v", name, p, err, wantErr)
			}
			if err != nil && errdefs.UserMessage(err) == "" {
				t.Errorf("%s in phase %s: no message for the caller: %v", name, p, err)
			}
		}
	}
}
