package agent

import (
	"net/http"
	"testing"
)

func TestWithTraceEnv(t *testing.T) {
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	h := http.Header{}
	h.Set("traceparent", tp)
	h.Set("tracestate", "congo=t61rcWkgMzE")
	got := WithTraceEnv(h, map[string]string{"A": "1"})
	if got["TRACEPARENT"] != tp || got["TRACESTATE"] != "congo=t61rcWkgMzE" || got["A"] != "1" {
		t.Fatalf("got %v", got)
	}
	// The caller's own wins; the input is not changed.
	in := map[string]string{"TRACEPARENT": "mine"}
	if got := WithTraceEnv(h, in); got["TRACEPARENT"] != "mine" || got["TRACESTATE"] != "" {
		t.Fatalf("caller's TRACEPARENT overridden: %v", got)
	}
	for _, bad := range []string{"", "00-xyz", "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01", tp + "\n"} {
		h.Set("traceparent", bad)
		if got := WithTraceEnv(h, nil); got["TRACEPARENT"] != "" {
			t.Errorf("traceparent %q accepted: %v", bad, got)
		}
	}
}
