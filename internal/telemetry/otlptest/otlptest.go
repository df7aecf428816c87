// Package otlptest is an in-process OTLP/HTTP trace receiver for tests:
// what a daemon or gateway with --tracing exports lands in a Collector,
// and a Tree checks the shape of one trace (who is whose parent, and
// that children lie within their parents in time).
package otlptest

import (
	"compress/gzip"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// Collector receives OTLP/HTTP (protobuf) exports at /v1/traces. Safe for
// concurrent use.
type Collector struct {
	mu    sync.Mutex
	spans []*tracepb.Span
}

// ServeHTTP takes one export.
func (c *Collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/traces" || r.Method != http.MethodPost {
		http.NotFound(w, r)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, r.Body, 64<<20)
	if r.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var req coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	c.mu.Lock()
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			c.spans = append(c.spans, ss.Spans...)
		}
	}
	c.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// Trace returns the spans of traceID (hex) received so far.
func (c *Collector) Trace(traceID string) []*tracepb.Span {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*tracepb.Span
	for _, s := range c.spans {
		if hex.EncodeToString(s.TraceId) == traceID {
			out = append(out, s)
		}
	}
	return out
}

// Count is how many spans were received.
func (c *Collector) Count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.spans)
}

// Traceparent starts a trace as a client would: a random trace id and the
// id of the client's own span, sampled.
func Traceparent() (header, traceID, parentID string) {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	traceID, parentID = hex.EncodeToString(b[:16]), hex.EncodeToString(b[16:])
	return "00-" + traceID + "-" + parentID + "-01", traceID, parentID
}

// Tree is one trace's spans by id, with their children.
type Tree struct {
	ByID     map[string]*tracepb.Span
	Children map[string][]*tracepb.Span // by the parent's id ("" for roots)
}

// NewTree indexes spans.
func NewTree(spans []*tracepb.Span) Tree {
	tr := Tree{ByID: map[string]*tracepb.Span{}, Children: map[string][]*tracepb.Span{}}
	for _, s := range spans {
		tr.ByID[ID(s)] = s
		p := hex.EncodeToString(s.ParentSpanId)
		tr.Children[p] = append(tr.Children[p], s)
	}
	return tr
}

// ID is a span's id in hex.
func ID(s *tracepb.Span) string { return hex.EncodeToString(s.SpanId) }

// ChildNames are the sorted names of the children of span id.
func (tr Tree) ChildNames(id string) []string {
	var names []string
	for _, s := range tr.Children[id] {
		names = append(names, s.Name)
	}
	sort.Strings(names)
	return names
}

// Child returns the child of span id named name, or nil.
func (tr Tree) Child(id, name string) *tracepb.Span {
	for _, s := range tr.Children[id] {
		if s.Name == name {
			return s
		}
	}
	return nil
}

// HasChildren reports whether span id has children of every name in want.
func (tr Tree) HasChildren(id string, want ...string) bool {
	for _, w := range want {
		if tr.Child(id, w) == nil {
			return false
		}
	}
	return true
}

// Slack is how far a span may stick out of its parent: clocks are read
// at slightly different points.
const Slack = time.Millisecond

// Nesting checks that every span but root descends from root and lies
// within its parent's interval, and returns what does not. A server span
// whose parent is a client span is the next process's answer to that
// call: it must start within the call, but it ends when its process has
// written the answer, which the caller may have read (and ended its
// call) a moment before, so its end is not compared.
func (tr Tree) Nesting(root *tracepb.Span) []string {
	var bad []string
	slack := uint64(Slack)
	for _, s := range tr.ByID {
		if s == root {
			continue
		}
		p, ok := tr.ByID[hex.EncodeToString(s.ParentSpanId)]
		if !ok {
			bad = append(bad, fmt.Sprintf("span %q has a parent outside the trace", s.Name))
			continue
		}
		if !tr.descends(s, root) {
			bad = append(bad, fmt.Sprintf("span %q does not descend from %q", s.Name, root.Name))
		}
		hop := s.Kind == tracepb.Span_SPAN_KIND_SERVER && p.Kind == tracepb.Span_SPAN_KIND_CLIENT
		switch {
		case s.StartTimeUnixNano+slack < p.StartTimeUnixNano:
			bad = append(bad, fmt.Sprintf("span %q starts at %d, before its parent %q at %d", s.Name, s.StartTimeUnixNano, p.Name, p.StartTimeUnixNano))
		case hop && s.StartTimeUnixNano > p.EndTimeUnixNano+slack:
			bad = append(bad, fmt.Sprintf("span %q starts at %d, after its parent %q ended at %d", s.Name, s.StartTimeUnixNano, p.Name, p.EndTimeUnixNano))
		case !hop && s.EndTimeUnixNano > p.EndTimeUnixNano+slack:
			bad = append(bad, fmt.Sprintf("span %q ends at %d, after its parent %q at %d", s.Name, s.EndTimeUnixNano, p.Name, p.EndTimeUnixNano))
		}
	}
	sort.Strings(bad)
	return bad
}

func (tr Tree) descends(s, root *tracepb.Span) bool {
	for range len(tr.ByID) {
		p, ok := tr.ByID[hex.EncodeToString(s.ParentSpanId)]
		if !ok {
			return false
		}
		if p == root {
			return true
		}
		s = p
	}
	return false
}

// Attr is a span's string attribute key ("" if it has none).
func Attr(s *tracepb.Span, key string) string {
	for _, a := range s.Attributes {
		if a.Key == key {
			return a.Value.GetStringValue()
		}
	}
	return ""
}
