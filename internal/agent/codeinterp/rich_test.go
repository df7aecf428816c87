package codeinterp

import (
	"encoding/base64"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// scientificPython returns a python with numpy, pandas and matplotlib:
// $CELLFORK_TEST_PYTHON, a venv at /tmp/cellfork-ci-venv, or the host's.
// Create the venv with:
//
//	python3 -m venv /tmp/cellfork-ci-venv && /tmp/cellfork-ci-venv/bin/pip install numpy pandas matplotlib
func scientificPython(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("CELLFORK_TEST_PYTHON"), "/tmp/cellfork-ci-venv/bin/python", hostPython(t)} {
		if p != "" && exec.Command(p, "-c", "import numpy, pandas, matplotlib").Run() == nil {
			return p
		}
	}
	t.Skip("no python with numpy, pandas and matplotlib (set CELLFORK_TEST_PYTHON or create /tmp/cellfork-ci-venv)")
	return ""
}

func TestDataFrame(t *testing.T) {
	h := newHarness(t, scientificPython(t), nil)
	o := h.run("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
	noError(t, o)
	if len(o.results) != 1 {
		t.Fatalf("results = %v", o.results)
	}
	r := o.results[0]
	if !strings.Contains(r.str("html"), "<table") || !strings.Contains(r.str("text"), "a  b") {
		t.Errorf("DataFrame result = %v", r)
	}
}

func TestMatplotlib(t *testing.T) {
	h := newHarness(t, scientificPython(t), nil)
	o := h.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nprint('plotted')")
	noError(t, o)
	if len(o.results) != 1 || o.results[0]["is_main_result"] != false {
		t.Fatalf("results = %v", o.results)
	}
	checkPNG(t, o.results[0])
	if o := h.run("plt.get_fignums()"); o.text() != "[]" {
		t.Errorf("figures left open after the cell: %s", o.text())
	}

	o = h.run("plt.figure()\nplt.bar(['a', 'b'], [1, 2])\nplt.show()\nprint('after show')")
	noError(t, o)
	if len(o.results) != 1 || o.stderr != "" || o.stdout != "after show\n" {
		t.Errorf("plt.show(): results %d, stderr %q, stdout %q", len(o.results), o.stderr, o.stdout)
	}

	o = h.run("fig, ax = plt.subplots()\nax.plot([3, 1])\nfig")
	noError(t, o)
	if len(o.results) != 1 || o.results[0]["is_main_result"] != true {
		t.Fatalf("a figure as the last expression is shown once: %v", o.results)
	}
	checkPNG(t, o.results[0])
}

func checkPNG(t *testing.T, r event) {
	t.Helper()
	png, err := base64.StdEncoding.DecodeString(r.str("png"))
	if err != nil || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("result has no PNG: %.200v", r)
	}
	if !strings.HasPrefix(r.str("text"), "<Figure size") {
		t.Errorf("figure text = %q", r.str("text"))
	}
}

func TestPreimport(t *testing.T) {
	h := newHarness(t, "", map[string]string{PreimportEnv: "colorsys, no_such_module_x"})
	o := h.run("import sys, os\n('colorsys' in sys.modules, os.environ.get('" + PreimportEnv + "'))")
	if o.text() != "(True, None)" {
		t.Errorf("preimport: %q %v", o.text(), o.err)
	}
}

// TestPreimportedFrozen: what the kernel holds once it has pre-imported is
// frozen out of the collector's sight (a collection after a restore would
// otherwise write every object's header, copying the image's pages), and
// the user's own garbage cycles are still collected.
func TestPreimportedFrozen(t *testing.T) {
	h := newHarness(t, "", map[string]string{PreimportEnv: "colorsys"})
	o := h.run("import gc, weakref\nclass C: pass\nc = C(); c.me = c; r = weakref.ref(c); del c\ngc.collect()\n(gc.get_freeze_count() > 1000, r() is None)")
	if o.text() != "(True, True)" {
		t.Errorf("frozen and collected: %q %v", o.text(), o.err)
	}
}
