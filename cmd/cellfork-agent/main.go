// Command cellfork-agent runs inside every sandbox: envd (processes, files)
// on :49983 and the code interpreter on :49999. It is static (CGO_ENABLED=0)
// and must not link daemon, runtime or store code (deps_test.go).
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/cellfork/cellfork/internal/agent"
	"github.com/cellfork/cellfork/internal/agent/codeinterp"
	"github.com/cellfork/cellfork/internal/agent/envd"
	wire "github.com/cellfork/cellfork/internal/envd"
)

// daemonAddr is where the daemon's connections come from: the sandbox's
// gateway (its router namespace). Only it may POST /init.
var daemonAddr = netip.MustParseAddr("10.88.0.1")

func main() {
	envdAddr := flag.String("envd-addr", fmt.Sprintf(":%d", wire.Port), "envd listen address")
	codeAddr := flag.String("code-addr", fmt.Sprintf(":%d", wire.CodeInterpreterPort), "code interpreter listen address")
	kernels := flag.String("kernels", "", "directory of the code interpreter's kernels, kernel.py and the others (default: beside this executable)")
	flag.Parse()
	if *kernels == "" {
		exe, err := os.Executable()
		if err != nil {
			log.Fatal(err)
		}
		*kernels = filepath.Dir(exe)
	}
	if err := agent.DropResourceCapFromChildren(); err != nil {
		log.Fatal(err) // what it runs would get the capability
	}

	if os.Getpid() == 1 {
		go agent.ReapOrphans() // orphans become ours: reap their zombies
	}
	s := agent.NewSettings()
	ci := codeinterp.New(s, *kernels)
	ready, startErr := make(chan struct{}), error(nil)
	go func() {
		// Template build steps run with the code interpreter off: nothing
		// they do needs it, and its kernel would cost every step a Python
		// start.
		if os.Getenv("CELLFORK_CODE_CONTEXT") != "off" {
			if startErr = ci.StartDefault(); startErr != nil {
				log.Printf("starting default code context: %v", startErr)
			}
		}
		close(ready)
	}()
	// GET /ready answers once the default code context (and the template's
	// pre-imports) is up: the daemon waits on it before taking a template's
	// warm snapshot.
	code := http.NewServeMux()
	code.Handle("/", ci.Handler())
	code.HandleFunc("GET /ready", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-ready:
			if startErr != nil {
				http.Error(w, startErr.Error(), http.StatusServiceUnavailable)
				return
			}
			w.WriteHeader(http.StatusNoContent)
		case <-r.Context().Done():
		}
	})
	// Both ports' requests count as activity: the spare shell envd starts
	// after /init waits for them to go quiet.
	act := agent.NewActivity()
	errc := make(chan error, 2)
	for addr, h := range map[string]http.Handler{*envdAddr: envd.New(s, daemonAddr, act), *codeAddr: act.Wrap(code)} {
		srv := &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 30 * time.Second}
		go func() { errc <- srv.ListenAndServe() }()
	}
	log.Fatal(<-errc)
}
