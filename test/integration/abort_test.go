package integration

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// TestKilledSandboxResetsItsStreams: a stream cut short because its
// sandbox was killed ends with a connection reset, not a clean close in
// the middle of the chunked body: clients (the E2B SDKs) take a reset for
// the dropped connection it is and then find the sandbox gone.
func TestKilledSandboxResetsItsStreams(t *testing.T) {
	sb := create(t, nil)
	client := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{envdHeaders(sb)}}, d.url, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "sleep 60"}},
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	if !stream.Receive() || stream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("no start event: %v", stream.Err())
	}
	if r := call(t, "DELETE", "/sandboxes/"+sb.SandboxID, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill: %d %s", r.status, r.body)
	}
	for stream.Receive() {
	}
	err = stream.Err()
	ok := errors.Is(err, syscall.ECONNRESET)
	record("data plane", "a stream whose sandbox is killed", "connection reset", fmt.Sprint(err), ok)
	if !ok {
		t.Fatalf("stream ended with %v, want a connection reset", err)
	}
}
