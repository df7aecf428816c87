package integration

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"time"
)

// The suite records every attack it runs, so that docs/security.md is its
// output (make security-report), not a claim written beside it.
var findings struct {
	sync.Mutex
	list []finding
}

type finding struct {
	area, attack, want, got string
	ok                      bool
}

// record notes an attack and what happened; ok says whether the outcome
// was the required one.
func record(area, attack, want, got string, ok bool) {
	findings.Lock()
	defer findings.Unlock()
	findings.list = append(findings.list, finding{area, attack, want, strings.TrimSpace(got), ok})
}

const threatModel = `# Security

This file is written by the test suite (` + "`make security-report`" + `, which
runs ` + "`test/integration`" + ` with real gVisor sandboxes); every row below is an attack
the suite ran on %s, with the outcome it required and the one it got.

## Threat model

- **Untrusted code inside a sandbox** (the normal case: an agent runs
  code nobody has read) wants out: the host, the daemon, other sandboxes,
  the cloud metadata service, the host's networks; or wants to take the
  host or its neighbours down by exhausting CPU, memory, processes, file
  descriptors or disk. It may run as the sandbox's ` + "`user`" + ` or as root
  inside the sandbox (` + "`user`" + ` may ` + "`sudo`" + `, as in E2B: root in the
  sandbox is no host privilege, and has no CAP_SYS_RESOURCE to lift the
  sandbox's limits).
- **Untrusted callers of the API** send malformed, oversized or hostile
  input, wrong or missing keys and tokens, slow or idle connections.
- **Crashes** (the daemon or runsc killed mid-operation) must not leave
  half-made sandboxes, corrupt snapshots, or damaged parents.

Boundaries: each sandbox is a gVisor sandbox (user-space kernel, systrap)
with its own network namespace pair; its only ways out are the daemon's
proxy (inbound) and, outbound, a per-sandbox nftables policy plus the
resolver and domain-rule proxy the daemon runs in the sandbox's router
namespace (they apply the same policy). The proxy also applies network
rules: for a ruled host it terminates TLS with a certificate of the
daemon's CA (which only sandboxes with rules trust; its key never leaves
the data directory), verifies the real host by name and adds the rule's
headers, whose values stay in the daemon (never in the sandbox, its
logs or the API's answers). The daemon
authenticates the control plane with API keys and the data plane with a
per-sandbox access token. Known limits are listed at the end.

Besides the attacks below, ` + "`make test`" + ` fuzzes every operation of the
OpenAPI description (` + "`internal/api/openapi.yaml`" + `) with schemathesis
(` + "`tests/fuzz`" + `): generated valid and invalid requests on both planes, each
answer checked against the document (no server error, no undocumented
status or body, invalid input refused with a 4xx, a missing or wrong key or
token refused with 401, no request left hanging), and no sandbox or
snapshot left behind.

## Attacks tried

| area | attack | required | observed | result |
|---|---|---|---|---|
`

const knownLimits = `
## Known limits

- Root inside a sandbox can SIGKILL the agent (gVisor does not shield a
  namespace's init): it ends its own sandbox, which the daemon notices at
  once and reports; nothing else is affected.
- A sandbox that exceeds its memory limit is ended whole by the host's OOM
  killer (gVisor has no in-sandbox OOM killer); the daemon reports
  "it exceeded its memory limit". The root filesystem (/tmp included) and
  /dev/shm live in sandbox memory: with a disk size (plus half of it for
  /dev/shm) above the memory limit, filling them ends the sandbox the same
  way instead of failing with ENOSPC.
- Domain rules hold for HTTP on port 80 (Host) and TLS on port 443 (SNI),
  as in E2B; other ports, and QUIC (UDP), follow the address rules only.
  The proxy connects to what an allowed name resolves to, but that server
  may serve other names too (domain fronting on a shared CDN).
- Network rules keep a header's value out of the sandbox, not out of the
  ruled host's answers: a host that echoes request headers back (an echo
  service, an error page quoting them) hands the value to the sandbox.
  Code in a sandbox with a rule can use the secret against the ruled host
  (that is the point) without reading it. HTTP/3 (QUIC, UDP) to a ruled
  host is not transformed; it follows the address rules.
- Sandboxes restored from one image (the template's warm image, a
  snapshot, a fork) share its pages read-only until they write them: one
  can neither change nor see another's writes, but page-cache timing
  (whether a page of the image is resident) is observable across them, as
  for any file two processes map. An image is shared only by the sandboxes
  restored from it (a template's warm image, one snapshot, one fork). The
  host's memory cgroups charge a shared page to the sandbox that first
  read it.
`

// writeSecurityReport writes the report if CELLFORK_SECURITY_REPORT names
// a file.
func writeSecurityReport() error {
	path := os.Getenv("CELLFORK_SECURITY_REPORT")
	if path == "" {
		return nil
	}
	findings.Lock()
	defer findings.Unlock()
	list := append([]finding(nil), findings.list...)
	sort.SliceStable(list, func(i, j int) bool { return list[i].area < list[j].area })
	var b strings.Builder
	fmt.Fprintf(&b, threatModel, time.Now().UTC().Format("2006-01-02"))
	passed := 0
	for _, f := range list {
		res := "FAIL"
		if f.ok {
			res, passed = "pass", passed+1
		}
		got := strings.ReplaceAll(f.got, "|", "\\|")
		got = strings.ReplaceAll(got, "\n", " ")
		if len(got) > 120 {
			got = got[:117] + "..."
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", f.area, f.attack, f.want, got, res)
	}
	fmt.Fprintf(&b, "\n%d of %d attacks had the required outcome.\n", passed, len(list))
	b.WriteString(knownLimits)
	return os.WriteFile(path, []byte(b.String()), 0o644)
}
