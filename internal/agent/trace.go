package agent

import (
	"maps"
	"net/http"
	"regexp"
)

// traceparentRE is a W3C Trace Context traceparent of version 00 (or a
// later version, read as 00 as the specification says): version, trace id,
// parent id, flags.
var traceparentRE = regexp.MustCompile(`^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$`)

// WithTraceEnv returns envs plus TRACEPARENT and TRACESTATE from the
// request's trace context (the OpenTelemetry convention for passing a
// trace to a process), so that code run for a traced request can continue
// its trace. Variables the caller set win; a malformed header is ignored.
// The agent records no spans itself (the daemon does, around its calls):
// an exporter would double its size and could not reach a collector from
// inside the sandbox anyway.
func WithTraceEnv(h http.Header, envs map[string]string) map[string]string {
	tp := h.Get("Traceparent")
	if !traceparentRE.MatchString(tp) || tp[:2] == "ff" {
		return envs
	}
	out := maps.Clone(envs)
	if out == nil {
		out = map[string]string{}
	}
	if _, ok := out["TRACEPARENT"]; !ok {
		out["TRACEPARENT"] = tp
		if ts := h.Get("Tracestate"); ts != "" && len(ts) <= 512 {
			out["TRACESTATE"] = ts
		} else {
			delete(out, "TRACESTATE")
		}
	}
	return out
}
