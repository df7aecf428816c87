package codeinterp

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// The kernels of the languages other than Python (kernel.js, kernel.R,
// kernel.java, kernel.sh) speak this protocol with the agent:
//
//	fd 3 (in)   one command per execution: a line "<id> <nenv> <ntmp>\n",
//	            then 1 + 2*nenv + 2*ntmp fields, each "<byte length>\n"
//	            followed by that many bytes: the code, nenv name/value pairs
//	            of the sandbox's variables (sent when they changed, to be
//	            kept) and ntmp pairs of the execution's own variables (to be
//	            undone when it ends).
//	fd 4 (out)  events, one JSON object per line, "type" first: the E2B wire
//	            forms (stdout, stderr, result, error, number_of_executions),
//	            {"type":"ready"} once when the kernel takes commands and
//	            {"type":"done","id":n} after each command.
//	fd 1, 2     read by the agent: before "ready" the kernel's diagnostics,
//	            afterwards the running execution's stdout and stderr (the
//	            cell's own output, or its child processes'). After each cell
//	            the kernel writes the value of $CELLFORK_MARK to both, before
//	            "done": the agent ends the execution once it has read both
//	            marks, so all the cell's output is in it. (The mark is random
//	            per kernel; a cell that writes it itself can only cut its
//	            own output short.)
//	SIGINT      interrupts the running cell; ignored between cells.
//
// Python's kernel.py captures its own fd 1 and 2 and speaks JSON commands
// (see kernel.py).

// markTimeout bounds the wait for the marks after "done": only a broken
// kernel never writes them.
const markTimeout = 5 * time.Second

// Internal lines on an execution's channel: a stream's mark. Event lines
// all start with '{'.
var (
	markStdout = []byte("\x00mark stdout\n")
	markStderr = []byte("\x00mark stderr\n")
)

func newMark() string {
	var b [12]byte
	rand.Read(b[:])
	return "\x1ecellfork:" + hex.EncodeToString(b[:]) + "\x1e"
}

// frameCommand encodes an execution for a foreign kernel.
func frameCommand(id uint64, code string, env, tmp map[string]string) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%d %d %d\n", id, len(env), len(tmp))
	field := func(s string) {
		b.WriteString(strconv.Itoa(len(s)))
		b.WriteByte('\n')
		b.WriteString(s)
	}
	field(code)
	for _, m := range []map[string]string{env, tmp} {
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			field(k)
			field(m[k])
		}
	}
	return b.Bytes()
}

// outputLine encodes a stdout or stderr event read from a kernel's fd.
func outputLine(stream string, text []byte, now time.Time) []byte {
	t, _ := json.Marshal(string(text))
	line := make([]byte, 0, len(t)+80)
	line = append(line, `{"type":"`...)
	line = append(line, stream...)
	line = append(line, `","text":`...)
	line = append(line, t...)
	line = append(line, `,"timestamp":"`...)
	line = now.UTC().AppendFormat(line, "2006-01-02T15:04:05.000000Z")
	return append(line, "\"}\n"...)
}

// splitter cuts one output stream of a foreign kernel into text and marks.
// It holds back bytes that may be the start of a mark or of a UTF-8
// character until the next read says what they are. Not safe for
// concurrent use.
type splitter struct {
	mark  []byte
	carry []byte
}

// feed takes the next bytes read and calls text and mark in stream order.
func (s *splitter) feed(data []byte, text func([]byte), mark func()) {
	data = append(s.carry, data...)
	s.carry = nil
	for {
		i := bytes.Index(data, s.mark)
		if i < 0 {
			break
		}
		if i > 0 {
			text(data[:i])
		}
		mark()
		data = data[i+len(s.mark):]
	}
	keep := holdBack(data, s.mark)
	if n := len(data) - keep; n > 0 {
		text(data[:n])
	}
	if keep > 0 {
		s.carry = append([]byte(nil), data[len(data)-keep:]...)
	}
}

// flush returns what was held back (the stream ended).
func (s *splitter) flush() []byte {
	c := s.carry
	s.carry = nil
	return c
}

// holdBack returns how many bytes at the end of data must wait: a proper
// prefix of mark, or an incomplete UTF-8 character.
func holdBack(data, mark []byte) int {
	for n := min(len(mark)-1, len(data)); n > 0; n-- {
		if bytes.HasPrefix(mark, data[len(data)-n:]) {
			return n
		}
	}
	// An incomplete character: a start byte within the last 3 bytes
	// whose sequence runs past the end.
	for n := 1; n <= 3 && n <= len(data); n++ {
		c := data[len(data)-n]
		if c < 0x80 {
			return 0
		}
		if utf8.RuneStart(c) {
			if !utf8.FullRune(data[len(data)-n:]) {
				return n
			}
			return 0
		}
	}
	return 0
}

// readOutput forwards a foreign kernel's fd 1 or 2: diagnostics before the
// kernel is ready, then output of the running execution (dropped between
// executions).
func (k *kernel) readOutput(r *os.File, stream string, mark []byte) {
	defer r.Close()
	markLine := markStdout
	if stream == "stderr" {
		markLine = markStderr
	}
	sp := splitter{mark: mark}
	buf := make([]byte, 32<<10)
	text := func(b []byte) {
		if !k.isReady() {
			for _, l := range bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n")) {
				k.diag.add(string(l))
				k.log.Warn("kernel diagnostic output", "line", string(l))
			}
			return
		}
		if !k.deliver(outputLine(stream, b, time.Now())) {
			k.log.Debug("dropping kernel output between executions", "stream", stream, "bytes", len(b))
		}
	}
	mk := func() { k.deliver(markLine) }
	for {
		n, err := r.Read(buf)
		if n > 0 {
			sp.feed(buf[:n], text, mk)
		}
		if err != nil {
			if rest := sp.flush(); len(rest) > 0 {
				text(rest)
			}
			return
		}
	}
}
