package metrics

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

var nameRE = regexp.MustCompile(`cellfork_[a-z_]+`)

// TestDocumented: docs/operations.md describes every metric, with its
// labels.
func TestDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range allDefs {
		i := strings.Index(string(doc), "`"+d.fqName()+"`")
		if i < 0 {
			t.Errorf("docs/operations.md does not describe %s", d.fqName())
			continue
		}
		line, _, _ := strings.Cut(string(doc[i:]), "\n")
		for _, l := range d.labels {
			if !strings.Contains(line, "`"+l+"`") {
				t.Errorf("docs/operations.md: the line of %s does not name its label %s", d.fqName(), l)
			}
		}
	}
}

// TestGrafana: the Grafana dashboard asks only for metrics that exist,
// and shows all but the few that are for debugging.
func TestGrafana(t *testing.T) {
	raw, err := os.ReadFile("../../deploy/grafana/cellfork.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash map[string]any
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/cellfork.json: %v", err)
	}
	known := map[string]bool{}
	for _, d := range allDefs {
		known[d.fqName()] = true
	}
	used := map[string]bool{}
	for _, n := range nameRE.FindAllString(string(raw), -1) {
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if base := strings.TrimSuffix(n, suffix); base != n && known[base] {
				n = base
			}
		}
		if !known[n] {
			t.Errorf("the dashboard uses %s, which cellfork does not export", n)
		}
		used[n] = true
	}
	for _, d := range allDefs {
		if n := d.fqName(); !used[n] && n != defScrape.fqName() {
			t.Errorf("the dashboard does not show %s", n)
		}
	}
}
