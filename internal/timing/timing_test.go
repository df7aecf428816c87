package timing

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestHeader(t *testing.T) {
	ctx, r := With(context.Background())
	Add(ctx, "netns", 1500*time.Microsecond)
	Add(ctx, "runsc", 80*time.Millisecond)
	Add(ctx, "netns", 500*time.Microsecond) // repeated names add up
	Add(context.Background(), "ignored", time.Second)
	got := r.Header(100 * time.Millisecond)
	if got != "netns;dur=2.00, runsc;dur=80.00, total;dur=100.00" {
		t.Fatalf("header %q", got)
	}
	if p := r.Phases(); p["netns"] != 2 || len(p) != 2 {
		t.Fatalf("phases %v", p)
	}
	if From(context.Background()) != nil || !strings.Contains(got, "total") {
		t.Fatal("no recorder expected")
	}
}
