package cli

import (
	"io"
	"strings"
	"testing"
)

// FuzzShellQuote checks that every quoted word reads back as the input under
// bash's rules for unquoted safe words and single-quoted strings.
func FuzzShellQuote(f *testing.F) {
	for _, s := range []string{"", "a", "it's", "''", "a b", "$x", "\x00", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q := shellQuote(s)
		if got, ok := unquoteWord(q); !ok || got != s {
			t.Fatalf("shellQuote(%q) = %q, reads back as %q (ok %v)", s, q, got, ok)
		}
	})
}

// unquoteWord parses one bash word made of safe characters, '...' strings
// and \' escapes, the only forms shellQuote emits.
func unquoteWord(w string) (string, bool) {
	var b strings.Builder
	for i := 0; i < len(w); {
		switch {
		case w[i] == '\'':
			j := strings.IndexByte(w[i+1:], '\'')
			if j < 0 {
				return "", false
			}
			b.WriteString(w[i+1 : i+1+j])
			i += j + 2
		case strings.HasPrefix(w[i:], `\'`):
			b.WriteByte('\'')
			i += 2
		case w[i] < 0x80 && isShellSafe(rune(w[i])):
			b.WriteByte(w[i])
			i++
		default:
			return "", false
		}
	}
	return b.String(), true
}

// FuzzRenderExecution feeds arbitrary streams to the NDJSON renderer: it
// may return an error but must not panic, in either mode.
func FuzzRenderExecution(f *testing.F) {
	f.Add(sampleStream)
	f.Add(`{"type":"error","traceback":["a",1]}`)
	f.Add(`{"type":"result","text":null,"is_main_result":"yes"}`)
	f.Fuzz(func(t *testing.T, s string) {
		_, _ = renderExecution(strings.NewReader(s), io.Discard, io.Discard, false)
		_, _ = renderExecution(strings.NewReader(s), io.Discard, io.Discard, true)
	})
}
