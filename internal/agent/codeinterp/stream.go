package codeinterp

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
)

var (
	keepaliveLine = []byte(`{"type":"keepalive"}` + "\n")
	endLine       = []byte(`{"type":"end_of_execution"}` + "\n")
)

// ndjson writes the /execute response: one JSON object per line, each
// flushed at once so the SDK's callbacks fire live. Once the client is gone
// it discards. Not safe for concurrent use.
type ndjson struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	log     *slog.Logger
	dropped bool
}

func newNDJSON(w http.ResponseWriter, log *slog.Logger) *ndjson {
	return &ndjson{w: w, rc: http.NewResponseController(w), log: log}
}

// write sends one complete line (ending in '\n') now.
func (s *ndjson) write(line []byte) {
	s.add(line)
	s.flush()
}

// add buffers a line; flush sends it.
func (s *ndjson) add(line []byte) {
	if s.dropped {
		return
	}
	if _, err := s.w.Write(line); err != nil {
		s.dropped = true
	}
}

func (s *ndjson) flush() {
	if s.dropped {
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.dropped = true
	}
}

// event buffers a kernel event line. Anything that is not a JSON object
// with a leading "type" (the kernel writes nothing else; user code could
// scribble on its fds) is dropped: a stray or blank line crashes the SDK.
func (s *ndjson) event(line []byte) {
	if !bytes.HasPrefix(line, eventType) || len(line) < 2 || line[len(line)-2] != '}' {
		s.log.Warn("dropping malformed kernel event", "bytes", len(line))
		return
	}
	s.add(line)
}

// discard drops everything from now on (the client went away).
func (s *ndjson) discard() { s.dropped = true }

// errorLine encodes an `error` event.
func errorLine(name, value, traceback string) []byte {
	b, _ := json.Marshal(struct {
		Type      string `json:"type"`
		Name      string `json:"name"`
		Value     string `json:"value"`
		Traceback string `json:"traceback"`
	}{"error", name, value, traceback})
	return append(b, '\n')
}
