package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

const sampleStream = `{"type":"stdout","text":"hello\n","timestamp":"2026-08-22T10:00:00Z"}
{"type":"keepalive"}

{"type":"stderr","text":"warn\n","timestamp":"2026-08-22T10:00:00Z"}
{"type":"result","text":"<Figure>","is_main_result":false,"png":"iVBOR"}
{"type":"result","text":"2","is_main_result":true}
{"type":"number_of_executions","execution_count":1}
{"type":"end_of_execution"}
`

func TestRenderExecution(t *testing.T) {
	tests := []struct {
		name       string
		stream     string
		wantOut    string
		wantErr    string
		wantFailed bool
	}{
		{name: "ok", stream: sampleStream, wantOut: "hello\n2\n", wantErr: "warn\n"},
		{name: "no trailing newline", stream: `{"type":"result","text":"'x'\n","is_main_result":true}`, wantOut: "'x'\n"},
		{
			name:       "error with traceback string",
			stream:     `{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback:\n  1/0\nZeroDivisionError: division by zero"}` + "\n",
			wantErr:    "Traceback:\n  1/0\nZeroDivisionError: division by zero\n",
			wantFailed: true,
		},
		{
			name:       "error with traceback lines",
			stream:     `{"type":"error","name":"E","value":"v","traceback":["a","b"]}`,
			wantErr:    "a\nb\n",
			wantFailed: true,
		},
		{name: "error without traceback", stream: `{"type":"error","name":"E","value":"v","traceback":""}`, wantErr: "E: v\n", wantFailed: true},
		{name: "lost kernel", stream: `{"type":"unexpected_end_of_execution"}`, wantErr: "cellfork: the code interpreter ended the execution unexpectedly\n", wantFailed: true},
		{name: "unknown types ignored", stream: `{"type":"something_new","text":"x"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			failed, err := renderExecution(strings.NewReader(tt.stream), &out, &errOut, false)
			if err != nil {
				t.Fatal(err)
			}
			if out.String() != tt.wantOut || errOut.String() != tt.wantErr || failed != tt.wantFailed {
				t.Errorf("got stdout %q stderr %q failed %v, want %q %q %v", out.String(), errOut.String(), failed, tt.wantOut, tt.wantErr, tt.wantFailed)
			}
		})
	}
}

func TestRenderExecutionJSON(t *testing.T) {
	var out, errOut bytes.Buffer
	failed, err := renderExecution(strings.NewReader(sampleStream), &out, &errOut, true)
	if err != nil || failed || errOut.Len() != 0 {
		t.Fatalf("err %v failed %v stderr %q", err, failed, errOut.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if len(lines) != 6 { // keepalive and the blank line dropped
		t.Fatalf("got %d lines:\n%s", len(lines), out.String())
	}
	for _, l := range lines {
		if !json.Valid([]byte(l)) || strings.Contains(l, "keepalive") {
			t.Errorf("bad line %q", l)
		}
	}
	if lines[3] != `{"type":"result","text":"2","is_main_result":true}` {
		t.Errorf("line copied inexactly: %q", lines[3])
	}
}

func TestRenderExecutionBadLine(t *testing.T) {
	var out bytes.Buffer
	_, err := renderExecution(strings.NewReader("{\"type\":\"stdout\",\"text\":\"a\"}\nnot json\n"), &out, &out, false)
	if err == nil || !strings.Contains(err.Error(), "decoding execution event") || out.String() != "a" {
		t.Errorf("err %v out %q", err, out.String())
	}
}

func TestRunCode(t *testing.T) {
	d := newFakeDaemon(t)
	d.execute = sampleStream
	code, out, errOut := d.run(context.Background(), "", "run-code", "sbx1", "1+1")
	if code != 0 || out != "hello\n2\n" || errOut != "warn\n" {
		t.Fatalf("code %d stdout %q stderr %q", code, out, errOut)
	}
	r := d.last("POST", "/execute")
	if r.Body != `{"code":"1+1","context_id":null,"language":null,"env_vars":null}` {
		t.Errorf("body %s", r.Body)
	}
	if r.Header.Get("E2b-Sandbox-Id") != "sbx1" || r.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", r.Header)
	}
}

func TestRunCodeStdinAndOptions(t *testing.T) {
	d := newFakeDaemon(t)
	d.execute = `{"type":"error","name":"NameError","value":"x","traceback":"NameError: x"}` + "\n"
	code, out, errOut := d.run(context.Background(), "print(x)\n", "run-code", "--language", "python", "--env", "K=V", "sbx1", "-")
	if code != 1 || out != "" || errOut != "NameError: x\n" {
		t.Errorf("code %d stdout %q stderr %q", code, out, errOut)
	}
	if r := d.last("POST", "/execute"); r.Body != `{"code":"print(x)\n","context_id":null,"language":"python","env_vars":{"K":"V"}}` {
		t.Errorf("body %s", r.Body)
	}
	d.run(context.Background(), "", "run-code", "--context", "ctx1", "sbx1", "1")
	if r := d.last("POST", "/execute"); r.Body != `{"code":"1","context_id":"ctx1","language":null,"env_vars":null}` {
		t.Errorf("body %s", r.Body)
	}
}

func TestRunCodeJSONAndErrors(t *testing.T) {
	d := newFakeDaemon(t)
	d.execute = sampleStream
	code, out, _ := d.run(context.Background(), "", "--json", "run-code", "sbx1", "1+1")
	if code != 0 || strings.Count(out, "\n") != 6 || strings.Contains(out, "hello\n2") {
		t.Errorf("--json: code %d out %q", code, out)
	}
	code, _, errOut := d.run(context.Background(), "", "run-code", "nokernel", "1")
	if code != 1 || errOut != "cellfork: 404 Not Found: Context not found (request req-POST)\n" {
		t.Errorf("404: code %d stderr %q", code, errOut)
	}
	code, _, errOut = d.run(context.Background(), "", "run-code", "missing", "1")
	if code != 1 || errOut != "cellfork: sandbox missing not found (request req-POST)\n" {
		t.Errorf("missing: code %d stderr %q", code, errOut)
	}
}
