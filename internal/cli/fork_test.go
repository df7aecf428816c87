package cli

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/cellfork/cellfork/internal/api/apitypes"
)

func TestFork(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "fork", "sbx1", "-n", "3", "--timeout", "60")
	if code != 0 || out != "child1\nchild2\nchild3\n" || errOut != "" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	r := d.last("POST", "/sandboxes/sbx1/fork")
	if r.Body != `{"count":3,"timeout":60}` || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("body %s", r.Body)
	}

	code, out, _ = d.run(context.Background(), "", "fork", "sbx1")
	if code != 0 || out != "child1\n" {
		t.Errorf("default: code %d stdout %q", code, out)
	}
	if r := d.last("POST", "/sandboxes/sbx1/fork"); r.Body != `{"count":1}` {
		t.Errorf("default body %s", r.Body)
	}

	code, out, _ = d.run(context.Background(), "", "--json", "fork", "--count=2", "sbx1")
	var res []apitypes.ForkResult
	if err := json.Unmarshal([]byte(out), &res); code != 0 || err != nil || len(res) != 2 || res[1].Sandbox.SandboxID != "child2" {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
}

func TestForkPartialFailure(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "fork", "-n", "3", "partial")
	if code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if out != "child1\nchild3\n" {
		t.Errorf("stdout %q", out)
	}
	if errOut != "cellfork: fork child 2 of 3 failed: no capacity for another sandbox (503)\n" {
		t.Errorf("stderr %q", errOut)
	}

	code, out, errOut = d.run(context.Background(), "", "fork", "-n", "2", "--json", "partial")
	var res []apitypes.ForkResult
	if err := json.Unmarshal([]byte(out), &res); code != 1 || err != nil || len(res) != 2 || res[1].Error == nil || res[1].Error.Code != 503 {
		t.Errorf("--json: code %d out %q err %v", code, out, err)
	}
	if errOut == "" {
		t.Error("--json: failed child not reported on stderr")
	}

	code, out, errOut = d.run(context.Background(), "", "fork", "missing")
	if code != 1 || out != "" || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("missing parent: code %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestRollbackAndMerge(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "rollback", "sbx1", "ready")
	if code != 0 || out != "sbx1\n" {
		t.Errorf("rollback: code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/sandboxes/sbx1/rollback"); r.Body != `{"snapshotID":"ready"}` {
		t.Errorf("rollback body %s", r.Body)
	}

	code, out, errOut = d.run(context.Background(), "", "merge", "parent1", "child1")
	if code != 0 || out != "parent1\n" {
		t.Errorf("merge: code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/sandboxes/parent1/merge"); r.Body != `{"sandboxID":"child1"}` {
		t.Errorf("merge body %s", r.Body)
	}

	code, out, _ = d.run(context.Background(), "", "merge", "--json", "parent1", "child1")
	var sb map[string]any
	if err := json.Unmarshal([]byte(out), &sb); code != 0 || err != nil || sb["sandboxID"] != "parent1" || sb["bootMode"] != "restore" {
		t.Errorf("merge --json: code %d out %q err %v", code, out, err)
	}

	code, _, errOut = d.run(context.Background(), "", "rollback", "missing", "snapA")
	if code != 1 || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("rollback missing: code %d stderr %q", code, errOut)
	}
}

func TestPause(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "pause", "sbx1")
	if code != 0 || out != "sbx1\n" {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/sandboxes/sbx1/pause"); r.Body != `{}` {
		t.Errorf("body %s", r.Body)
	}

	code, out, _ = d.run(context.Background(), "", "pause", "--spill", "--json", "sbx1")
	if code != 0 || out != "{\n  \"sandboxID\": \"sbx1\",\n  \"paused\": true,\n  \"spill\": true\n}\n" {
		t.Errorf("--spill --json: code %d stdout %q", code, out)
	}
	if r := d.last("POST", "/sandboxes/sbx1/pause"); r.Body != `{"spill":true}` {
		t.Errorf("--spill body %s", r.Body)
	}

	code, out, errOut = d.run(context.Background(), "", "pause", "paused")
	if code != 1 || out != "" || errOut != "cellfork: sandbox \"paused\" is already paused (request req-POST)\n" {
		t.Errorf("already paused: code %d stdout %q stderr %q", code, out, errOut)
	}
}

func TestResume(t *testing.T) {
	d := newFakeDaemon(t)
	code, out, errOut := d.run(context.Background(), "", "resume", "paused", "--timeout", "120")
	if code != 0 || out != "paused\n" || errOut != "" {
		t.Errorf("resumed: code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/v2/sandboxes/paused/connect"); r.Body != `{"timeout":120}` {
		t.Errorf("body %s", r.Body)
	}

	code, out, errOut = d.run(context.Background(), "", "resume", "sbx1")
	if code != 0 || out != "sbx1\n" || errOut != "cellfork: sandbox sbx1 was already running\n" {
		t.Errorf("running: code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/v2/sandboxes/sbx1/connect"); r.Body != `{}` {
		t.Errorf("default body %s", r.Body)
	}

	for id, want := range map[string]bool{"paused": true, "sbx1": false} {
		code, out, _ = d.run(context.Background(), "", "resume", "--json", id)
		var sb struct {
			SandboxID string `json:"sandboxID"`
			Resumed   *bool  `json:"resumed"`
		}
		if err := json.Unmarshal([]byte(out), &sb); code != 0 || err != nil || sb.SandboxID != id || sb.Resumed == nil || *sb.Resumed != want {
			t.Errorf("--json %s: code %d out %q err %v", id, code, out, err)
		}
	}

	code, _, errOut = d.run(context.Background(), "", "resume", "missing")
	if code != 1 || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("missing: code %d stderr %q", code, errOut)
	}
}
