// Command demo brings up a local three-host, two-region cellfork cluster
// (`make cluster-demo`) and keeps it up until interrupted: PostgreSQL, two
// hosts in region eu and one in us, each in its own network namespace, and
// a gateway per region. It prints the environment the E2B SDKs need.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/cellfork/cellfork/test/cluster/harness"
)

func main() {
	bin := flag.String("bin", "bin/cellfork", "the cellfork binary")
	tpl := flag.String("template-dir", "/var/lib/cellfork/templates", "the template directory the hosts share")
	verbose := flag.Bool("v", false, "show the daemons' logs")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "cellfork-cluster-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer os.RemoveAll(dir)
	absBin, _ := filepath.Abs(*bin)
	opts := harness.Options{Dir: dir, Bin: absBin, TemplateDir: *tpl}
	if *verbose {
		opts.Log = os.Stderr
	}
	fmt.Fprintln(os.Stderr, "starting PostgreSQL, 3 hosts and 2 gateways (the first start may build the template)...")
	c, err := harness.Start(ctx, opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "cluster-demo:", err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Printf(`
cluster up: region eu (hosts 1, 2) at %s, region us (host 3) at %s

  export E2B_API_URL=%[1]s E2B_SANDBOX_URL=%[1]s E2B_API_KEY=%[3]s
  python -c 'from e2b_code_interpreter import Sandbox; print(Sandbox.create().run_code("1+1").text)'

  bin/cellfork admin --cluster '%[4]s' hosts

Ctrl-C takes it down.
`, c.URL("eu"), c.URL("us"), c.Key, c.PG.URL)
	<-ctx.Done()
}
