package store

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/cellfork/cellfork/internal/errdefs"
	"github.com/cellfork/cellfork/internal/sandbox"
)

func TestPutGetListDelete(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "state.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := &sandbox.Sandbox{ID: "abc", TemplateID: "base", State: sandbox.StateRunning,
		StartedAt: time.Now().UTC().Truncate(time.Second), Metadata: map[string]string{"k": "v"}}
	if err := s.Put(ctx, sb); err != nil {
		t.Fatal(err)
	}
	sb.State = sandbox.StatePaused
	if err := s.Put(ctx, sb); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(path) // survives reopening
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, "abc")
	if err != nil || got.State != sandbox.StatePaused || got.Metadata["k"] != "v" || !got.StartedAt.Equal(sb.StartedAt) {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	all, err := s.List(ctx)
	if err != nil || len(all) != 1 {
		t.Fatalf("List = %v, %v", all, err)
	}
	if err := s.Delete(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "abc"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Get after delete: %v", err)
	}
	if err := s.Delete(ctx, "abc"); err != nil {
		t.Fatalf("second delete: %v", err)
	}
}
