package codeinterp

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// BenchmarkPrint is the hot round trip of run_code("print(1)") through the
// HTTP handler (loopback HTTP included).
//
//	go test -run '^$' -bench Print -benchtime 2000x ./internal/agent/codeinterp/
func BenchmarkPrint(b *testing.B) {
	h := newHarness(b, "", nil)
	h.run("0") // start the kernel
	body := []byte(`{"code":"print(1)","context_id":null,"language":null,"env_vars":null}`)
	client := &http.Client{}
	b.ResetTimer()
	for b.Loop() {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", h.srv.URL+"/execute", bytes.NewReader(body))
		resp, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if !bytes.Contains(out, []byte(`"text":"1\n"`)) || !bytes.HasSuffix(out, endLine) {
			b.Fatalf("unexpected stream %s", out)
		}
	}
}

// BenchmarkHealth is the HTTP floor of BenchmarkPrint: same client and
// server, no kernel.
func BenchmarkHealth(b *testing.B) {
	h := newHarness(b, "", nil)
	client := &http.Client{}
	for b.Loop() {
		resp, err := client.Get(h.srv.URL + "/health")
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// BenchmarkKernelRun is agent+kernel time of print(1) without HTTP: the
// command goes down the pipe, the events come back and are written to a
// recorder.
func BenchmarkKernelRun(b *testing.B) {
	h := newHarness(b, "", nil)
	c, err := h.ip.defaultContext(Python)
	if err != nil {
		b.Fatal(err)
	}
	k, err := c.kernel(context.Background(), h.ip.spawnSpec)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		rec := httptest.NewRecorder()
		out := newNDJSON(rec, h.ip.log)
		cmd, _ := k.command("print(1)", nil, nil)
		k.run(context.Background(), cmd, out, h.ip.timing)
		if !bytes.Contains(rec.Body.Bytes(), []byte(`"text":"1\n"`)) {
			b.Fatalf("unexpected stream %s", rec.Body.Bytes())
		}
	}
}
