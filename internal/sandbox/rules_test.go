package sandbox

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/cellfork/cellfork/internal/errdefs"
)

func TestParseRules(t *testing.T) {
	n := Network{Rules: map[string]Transform{
		"API.Example.com":   {Headers: map[string]string{"authorization": "Bearer s3cret", "X-Team": "a"}},
		"*.example.com":     {Headers: map[string]string{"X-Wild": "1"}},
		"*.sub.example.com": {Headers: map[string]string{"X-Sub": "1"}},
		"nothing.example":   {},
	}}
	p, err := ParsePolicy(n)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]map[string]string{
		"api.example.com":   {"Authorization": "Bearer s3cret", "X-Team": "a"},
		"*.example.com":     {"X-Wild": "1"},
		"*.sub.example.com": {"X-Sub": "1"},
	}
	if !reflect.DeepEqual(p.Transforms, want) {
		t.Fatalf("Transforms = %v, want %v", p.Transforms, want)
	}
	for name, want := range map[string]string{
		"api.example.com":   "X-Team",
		"www.example.com":   "X-Wild",
		"a.sub.example.com": "X-Sub", // the longest wildcard wins
		"example.com":       "",      // a wildcard covers subdomains only
		"nothing.example":   "",      // no header: nothing to do
		"other.test":        "",
	} {
		h := p.TransformFor(name)
		if _, ok := h[want]; want != "" && !ok || want == "" && h != nil {
			t.Errorf("TransformFor(%q) = %v, want the rule with %q", name, h, want)
		}
	}
	if p, err := ParsePolicy(DefaultNetwork); err != nil || p.Transforms != nil {
		t.Errorf("no rules: %v, %v", p.Transforms, err)
	}

	// Clone copies the rules deeply.
	c := n.Clone()
	c.Rules["*.example.com"].Headers["X-Wild"] = "2"
	if n.Rules["*.example.com"].Headers["X-Wild"] != "1" {
		t.Error("Clone shares the rules' headers")
	}

	many := func(k int, f func(i int) (string, string)) map[string]string {
		m := map[string]string{}
		for i := range k {
			a, b := f(i)
			m[a] = b
		}
		return m
	}
	secret := "sk-live-do-not-print"
	for what, rules := range map[string]map[string]Transform{
		"too many domains": func() map[string]Transform {
			m := map[string]Transform{}
			for i := range 11 {
				m[strings.Repeat("a", i+1)+".example"] = Transform{}
			}
			return m
		}(),
		"not a domain":     {"not a domain": {}},
		"bare wildcard":    {"*": {}},
		"an address":       {"1.2.3.4:80": {}},
		"an IP":            {"1.2.3.4": {}},
		"same domain":      {"a.example": {}, "A.example.": {}},
		"too many headers": {"a.example": {Headers: many(21, func(i int) (string, string) { return "X-H" + strings.Repeat("x", i), "v" })}},
		"bad header name":  {"a.example": {Headers: map[string]string{"X Bad": "v"}}},
		"empty name":       {"a.example": {Headers: map[string]string{"": "v"}}},
		"long name":        {"a.example": {Headers: map[string]string{strings.Repeat("x", 65): "v"}}},
		"framing header":   {"a.example": {Headers: map[string]string{"content-length": "1"}}},
		"host header":      {"a.example": {Headers: map[string]string{"Host": "b.example"}}},
		"twice":            {"a.example": {Headers: map[string]string{"X-A": "1", "x-a": "2"}}},
		"control char":     {"a.example": {Headers: map[string]string{"X-A": secret + "\r\nX-B: 1"}}},
		"long value":       {"a.example": {Headers: map[string]string{"X-A": secret + strings.Repeat("v", 2048)}}},
		"e2b secret":       {"a.example": {Headers: map[string]string{"X-A": "Bearer ${e2b.secrets.KEY}" + secret}}},
		"e2b identity":     {"a.example": {Headers: map[string]string{"X-A": "${e2b.identity.tokens.aws}"}}},
		"redaction marker": {"a.example": {Headers: map[string]string{"X-A": RedactedValue}}},
	} {
		_, err := ParsePolicy(Network{Rules: rules})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || errdefs.UserMessage(err) == "" {
			t.Errorf("%s: %v", what, err)
			continue
		}
		if strings.Contains(err.Error(), secret) {
			t.Errorf("%s: the error quotes the header value: %v", what, err)
		}
	}
}

func TestMaskRequestHost(t *testing.T) {
	for _, ok := range []string{"", "example.com", "${PORT}-app.example.com", "localhost:${PORT}", "app.example.com:8080", "10.0.0.1", "[::1]:80"} {
		if _, err := ParsePolicy(Network{MaskRequestHost: ok}); err != nil {
			t.Errorf("%q refused: %v", ok, err)
		}
	}
	for _, bad := range []string{"exa mple.com", "a.example/path", "bücher.example", "a.example:0", "a.example:x", "a:b:c", ":80",
		"a.example\r\nX-Injected: 1", strings.Repeat("a", 256)} {
		if _, err := ParsePolicy(Network{MaskRequestHost: bad}); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%q accepted: %v", bad, err)
		}
	}
	n := Network{MaskRequestHost: "${PORT}-app.example.com:${PORT}"}
	if got := n.MaskedHost(3000); got != "3000-app.example.com:3000" {
		t.Errorf("MaskedHost = %q", got)
	}
}
