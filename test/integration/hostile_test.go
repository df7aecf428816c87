package integration

import (
	"strings"
	"testing"
	"time"
)

// TestMemoryBombIsContained: a sandbox that exceeds its memory limit dies
// alone; the daemon notices at once, frees it, and says why; a neighbour
// keeps answering.
func TestMemoryBombIsContained(t *testing.T) {
	neighbour := create(t, nil)
	bomb := create(t, map[string]any{"memoryMB": 256})
	rid := runtimeID(t, bomb.SandboxID)
	done := make(chan struct{})
	go func() {
		defer close(done)
		body := `{"code":"x = bytearray(1 << 30)","context_id":null,"language":null,"env_vars":null}`
		h := map[string]string{"E2b-Sandbox-Id": bomb.SandboxID, "E2b-Sandbox-Port": "49999", "X-Access-Token": bomb.EnvdAccessToken}
		dataCall(t, "POST", "/execute", h, strings.NewReader(body))
	}()
	eventually(t, 30*time.Second, "the daemon to report the sandbox dead", func() bool {
		r := call(t, "GET", "/sandboxes/"+bomb.SandboxID, nil)
		return r.status == 404 && strings.Contains(r.errMessage(), "memory limit")
	})
	<-done
	r := dataCall(t, "GET", "/health", map[string]string{"E2b-Sandbox-Id": bomb.SandboxID, "E2b-Sandbox-Port": "49983"}, nil)
	if r.status != 502 || !strings.Contains(r.errMessage(), "was not found") || !strings.Contains(r.errMessage(), "memory limit") {
		t.Errorf("data plane after the death: %d %s", r.status, r.body)
	}
	if got := stdoutOf(runCode(t, neighbour, "print('fine')")); got != "fine\n" {
		t.Errorf("neighbour: %q", got)
	}
	eventually(t, 10*time.Second, "the dead sandbox's resources to be freed", func() bool { return len(leftovers(t, rid)) == 0 })
}
