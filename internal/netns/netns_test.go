package netns

import (
	"context"
	"os"
	"testing"
	"time"
)

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("netns tests need root (they create network namespaces)")
	}
}

func TestCreateDestroy(t *testing.T) {
	requireRoot(t)
	n, err := Create("cftest-a", nil)
	if err != nil {
		t.Fatal(err)
	}
	names, err := List("cftest-")
	if err != nil || len(names) != 1 || names[0] != "cftest-a" {
		t.Fatalf("List = %v, %v", names, err)
	}
	if _, err := os.Stat(n.SandboxPath()); err != nil {
		t.Fatal(err)
	}
	// Nothing listens in the sandbox namespace yet: the host kernel answers
	// with a reset, so the dial fails fast rather than hanging.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if c, err := n.Dial(ctx, 49983); err == nil {
		c.Close()
		t.Fatal("dial succeeded with nothing listening")
	} else if ctx.Err() != nil {
		t.Fatalf("dial hung: %v", err)
	}
	if err := n.Destroy(); err != nil {
		t.Fatal(err)
	}
	if names, _ := List("cftest-"); len(names) != 0 {
		t.Fatalf("left behind: %v", names)
	}
	if err := Remove("cftest-a"); err != nil {
		t.Fatalf("second remove: %v", err)
	}
}

func TestCreateRejectsBadName(t *testing.T) {
	if _, err := Create("a/b", nil); err == nil {
		t.Fatal("want error")
	}
}
