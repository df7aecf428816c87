package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cellfork/cellfork/internal/envd/process"
	"github.com/cellfork/cellfork/internal/envd/process/processconnect"
)

// headerTransport adds the data-plane routing and auth headers.
type headerTransport struct {
	headers map[string]string
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	for k, v := range h.headers {
		r.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func envdHeaders(sb sandboxInfo) map[string]string {
	return map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": sb.EnvdAccessToken}
}

// run runs a shell command in the sandbox through envd's Start RPC and
// returns stdout, stderr and the exit code.
func run(t *testing.T, sb sandboxInfo, user, cmd string) (string, string, int) {
	t.Helper()
	h := envdHeaders(sb)
	if user != "" {
		h["Authorization"] = "Basic " + b64(user+":")
	}
	client := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{h}}, d.url, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream, err := client.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", cmd}},
	}))
	if err != nil {
		t.Fatalf("start %q: %v", cmd, err)
	}
	var stdout, stderr bytes.Buffer
	code := -1
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if data := ev.GetData(); data != nil {
			stdout.Write(data.GetStdout())
			stderr.Write(data.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			code = int(end.GetExitCode())
		}
	}
	if err := stream.Err(); err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return stdout.String(), stderr.String(), code
}

// dataCall makes a raw data-plane request.
func dataCall(t *testing.T, method, path string, headers map[string]string, body io.Reader) response {
	t.Helper()
	req, _ := http.NewRequest(method, d.url+path, body)
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return response{status: resp.StatusCode, header: resp.Header, body: raw}
}

// runCode executes Python in the sandbox's default context and returns the
// NDJSON events.
func runCode(t *testing.T, sb sandboxInfo, code string) []map[string]any {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"code": code, "context_id": nil, "language": nil, "env_vars": nil})
	h := map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49999",
		"X-Access-Token": sb.EnvdAccessToken, "Content-Type": "application/json"}
	r := dataCall(t, "POST", "/execute", h, bytes.NewReader(body))
	if r.status != 200 {
		t.Fatalf("execute: %d %s", r.status, r.body)
	}
	var events []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(r.body)), "\n") {
		var ev map[string]any
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("bad NDJSON line %q: %v", line, err)
		}
		events = append(events, ev)
	}
	return events
}

func stdoutOf(events []map[string]any) string {
	var b strings.Builder
	for _, ev := range events {
		if ev["type"] == "stdout" {
			fmt.Fprint(&b, ev["text"])
		}
	}
	return b.String()
}
