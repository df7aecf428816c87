// Command cellfork is the cellfork daemon (`cellfork serve`), the template
// builder (`cellfork template build`), the MCP server (`cellfork mcp`) and
// the CLI client (every other command, see `cellfork help`).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/cellfork/cellfork/internal/cli"
	"github.com/cellfork/cellfork/internal/mcpserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	args := os.Args[1:]
	if len(args) > 0 {
		switch args[0] {
		case "serve":
			os.Exit(serve(ctx, args[1:]))
		case "template":
			if builtinBuild(args[1:]) {
				os.Exit(templateCmd(ctx, args[1:]))
			}
		case "gateway":
			os.Exit(gatewayCmd(ctx, args[1:]))
		case "admin":
			os.Exit(adminCmd(ctx, args[1:], os.Stdout))
		case "mcp":
			os.Exit(mcpserver.Main(ctx, args[1:], os.Stderr, buildVersion()))
		}
	}
	os.Exit(cli.Main(ctx, args, os.Stdout, os.Stderr))
}

func fatalf(format string, args ...any) int {
	fmt.Fprintf(os.Stderr, "cellfork: "+format+"\n", args...)
	return 1
}

// buildVersion is the module version this binary was built from.
func buildVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "unknown"
}
