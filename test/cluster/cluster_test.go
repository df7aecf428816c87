package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/cellfork/cellfork/internal/clusterdb"
	"github.com/cellfork/cellfork/internal/template"
)

// TestCluster runs the cluster's tests in order: the later ones break the
// cluster (and mend it).
func TestCluster(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"routes", testRoutes},
		{"template-artifact", testTemplateArtifact},
		{"traces", testTraces},
		{"auth", testAuthAtTheEdge},
		{"placement", testPlacementSaysWhy},
		{"sdk", testSDKConformance},
		{"database-outage", testDatabaseOutage},
		{"gateway-restart-without-database", testGatewayRestartWithoutDatabase},
		{"create-fails-over", testCreateFailsOver},
		{"drain-waits", testDrainWaits},
		{"partition", testPartitionAndHeal},
		{"never-two-copies", testNeverTwoCopies},
		{"snapshot-travels", testSnapshotTravels},
		{"paused-moves", testPausedMoves},
		{"evacuate", testEvacuate},
		{"fork-overflows", testForkOverflows},
		{"fork-peer-unreachable", testForkPeerUnreachable},
		{"templates-travel", testTemplatesTravel},
		{"store-outage", testStoreOutage},
		{"store-collects", testStoreCollects},
		{"host-killed", testHostKilled},
		{"new-host", testNewHostPulls},
	} {
		if !t.Run(tc.name, tc.f) && tc.name == "routes" {
			return // nothing else can work
		}
	}
}

// testRoutes: creates land in the region asked for, requests for another
// region's sandbox are forwarded once, and every answer names the
// gateway's route phase.
func testRoutes(t *testing.T) {
	eu := create(t, "eu", nil)
	us := create(t, "us", nil)
	if eu.ID[1:3] == us.ID[1:3] {
		t.Fatalf("eu and us sandboxes in one region: %s %s", eu.ID, us.ID)
	}
	for _, sb := range []sandbox{eu, us} {
		for _, via := range []string{"eu", "us"} {
			if out, status := runCode(t, via, sb, "print(6*7)"); out != "42\n" {
				t.Errorf("%s through %s: %d %q", sb.ID, via, status, out)
			}
		}
	}
	r := do(t, "eu", "GET", "/sandboxes/"+us.ID, nil, nil)
	if r.status != 200 || !strings.Contains(r.header.Get("Server-Timing"), "route;dur=") {
		t.Errorf("get through the other region: %d %s %v", r.status, r.body, r.header.Get("Server-Timing"))
	}
	// The list is the team's, across hosts and regions, newest first.
	var list []map[string]any
	do(t, "eu", "GET", "/v2/sandboxes", nil, nil).json(t, &list)
	if len(list) != 2 || list[0]["sandboxID"] != us.ID || list[1]["sandboxID"] != eu.ID {
		t.Errorf("the team's list: %v", list)
	}
	// A create asked of another region goes there.
	r = do(t, "eu", "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 60}, map[string]string{"X-Cellfork-Region": "us"})
	var other sandbox
	r.json(t, &other)
	if r.status != 201 || other.ID[1:3] != us.ID[1:3] {
		t.Errorf("create asked for us: %d %s", r.status, r.body)
	}
	do(t, "us", "DELETE", "/sandboxes/"+other.ID, nil, nil)

	// A create the host refuses (400) leaves no reservation behind: no
	// row in "creating", no memory or team slot held.
	if r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": -5}, nil); r.status != 400 {
		t.Errorf("a create with a negative timeout: %d %s", r.status, r.body)
	}
	for _, h := range c.Hosts {
		if rows, err := c.AdminOut(context.Background(), "sandboxes", fmt.Sprint(h.N)); err != nil || strings.Contains(rows, "creating") {
			t.Errorf("host %d after a refused create: %v\n%s", h.N, err, rows)
		}
	}

	// The dashboard: its page without a key, the cluster's hosts with one.
	if r := do(t, "eu", "GET", "/dashboard/", nil, map[string]string{"X-API-KEY": ""}); r.status != 200 || !strings.Contains(string(r.body), "<html") {
		t.Errorf("the gateway's dashboard: %d %.200s", r.status, r.body)
	}
	if r := do(t, "eu", "GET", "/hosts", nil, map[string]string{"X-API-KEY": ""}); r.status != 401 {
		t.Errorf("/hosts without a key: %d", r.status)
	}
	var hosts []map[string]any
	do(t, "eu", "GET", "/hosts", nil, nil).json(t, &hosts)
	if len(hosts) != len(c.Hosts) {
		t.Errorf("/hosts: %v", hosts)
	}
	for _, h := range hosts {
		if h["state"] != "active" || (h["region"] != "eu" && h["region"] != "us") || h["addr"] != nil {
			t.Errorf("/hosts entry: %v", h)
		}
	}
}

// testAuthAtTheEdge: wrong, revoked and expired keys and tokens, tokens
// of another sandbox, ids with a bad check character, forbidden regions:
// all refused at the gateway, and no host sees any of them.
func testAuthAtTheEdge(t *testing.T) {
	sb := create(t, "eu", nil)
	other := create(t, "eu", nil)
	ctx := context.Background()
	if err := c.Admin(ctx, "team", "add", "closed", "--regions", "us"); err != nil {
		t.Fatal(err)
	}
	key, err := c.AdminOut(ctx, "key", "create", "test", "doomed")
	if err != nil {
		t.Fatal(err)
	}
	doomed := strings.TrimSpace(key)
	closedKey, _ := c.AdminOut(ctx, "key", "create", "closed", "k")
	if r := do(t, "eu", "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": doomed}); r.status != 200 {
		t.Fatalf("a fresh key: %d", r.status)
	}
	if err := c.Admin(ctx, "key", "revoke", "test", "doomed"); err != nil {
		t.Fatal(err)
	}
	bad := sb.ID[:19] + map[bool]string{true: "1", false: "0"}[sb.ID[19] == '0']
	expired := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"team": "test", "exp": time.Now().Add(-time.Minute).Unix()})
	expiredTok, _ := expired.SignedString(edKey)
	wrongKey := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"team": "test", "exp": time.Now().Add(time.Minute).Unix()})
	otherEC, _ := ecdsaKey()
	wrongTok, _ := wrongKey.SignedString(otherEC)
	goodED, _ := jwt.NewWithClaims(jwt.SigningMethodEdDSA, jwt.MapClaims{"team": "test", "exp": time.Now().Add(time.Minute).Unix()}).SignedString(edKey)
	goodEC, _ := jwt.NewWithClaims(jwt.SigningMethodES256, jwt.MapClaims{"team": "test", "exp": time.Now().Add(time.Minute).Unix()}).SignedString(ecKey)

	before := hostRequests()
	dp := func(id, token string) map[string]string {
		return map[string]string{"E2b-Sandbox-Id": id, "E2b-Sandbox-Port": "49999", "X-Access-Token": token, "X-API-KEY": ""}
	}
	for _, tc := range []struct {
		name         string
		method, path string
		headers      map[string]string
		want         int
	}{
		{"no key", "GET", "/v2/sandboxes", map[string]string{"X-API-KEY": ""}, 401},
		{"wrong key", "GET", "/v2/sandboxes", map[string]string{"X-API-KEY": "e2b_0000"}, 401},
		{"wrong key on a sandbox", "DELETE", "/sandboxes/" + sb.ID, map[string]string{"X-API-KEY": "e2b_0000"}, 401},
		{"expired token", "GET", "/sandboxes/" + sb.ID, map[string]string{"X-API-KEY": "", "Authorization": "Bearer " + expiredTok}, 401},
		{"token signed by another key", "GET", "/sandboxes/" + sb.ID, map[string]string{"X-API-KEY": "", "Authorization": "Bearer " + wrongTok}, 401},
		{"token of another sandbox", "POST", "/execute", dp(sb.ID, other.Token), 401},
		{"no token", "POST", "/execute", dp(sb.ID, ""), 401},
		{"bad check character, data plane", "POST", "/execute", dp(bad, sb.Token), 502},
		{"bad check character, control plane", "GET", "/sandboxes/" + bad, nil, 404},
		{"malformed id", "GET", "/sandboxes/../../etc", nil, 404},
		{"forbidden region", "POST", "/v2/sandboxes", map[string]string{"X-API-KEY": strings.TrimSpace(closedKey), "X-Cellfork-Region": "eu"}, 403},
		{"a host's internal merge call", "POST", "/sandboxes/" + sb.ID + "/assume?parent=" + other.ID, nil, 404},
	} {
		r := do(t, "eu", tc.method, tc.path, map[string]any{"templateID": "base", "code": "1"}, tc.headers)
		if r.status != tc.want {
			t.Errorf("%s: %d %s, want %d", tc.name, r.status, r.body, tc.want)
		}
	}
	// Revocation takes effect within seconds (NOTIFY, else the cache's TTL).
	eventually(t, 10*time.Second, "the revoked key to be refused", func() bool {
		return do(t, "eu", "GET", "/v2/sandboxes", nil, map[string]string{"X-API-KEY": doomed}).status == 401
	})
	if after := hostRequests(); after != before {
		t.Errorf("refused requests reached hosts: %d requests before, %d after", before, after)
	}
	for _, tok := range []string{goodED, goodEC} {
		if r := do(t, "eu", "GET", "/sandboxes/"+sb.ID, nil, map[string]string{"X-API-KEY": "", "Authorization": "Bearer " + tok}); r.status != 200 {
			t.Errorf("a valid token: %d %s", r.status, r.body)
		}
	}
	// Another team's sandbox is not there for this one.
	if r := do(t, "eu", "GET", "/sandboxes/"+sb.ID, nil, map[string]string{"X-API-KEY": strings.TrimSpace(closedKey)}); r.status != 404 {
		t.Errorf("another team's sandbox: %d %s", r.status, r.body)
	}
}

func hostRequests() int {
	n := 0
	for _, h := range c.Hosts {
		n += h.Requests()
	}
	return n
}

// testPlacementSaysWhy: with no host to take a sandbox, the create says
// why, per reason; a team at its limit gets 429.
func testPlacementSaysWhy(t *testing.T) {
	ctx := context.Background()
	for _, h := range c.Hosts[:2] {
		if err := c.Admin(ctx, "drain", fmt.Sprint(h.N)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(1500 * time.Millisecond) // the gateways' next look at the hosts
	r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, map[string]string{"X-Cellfork-Region": "eu"})
	if r.status != 503 || !strings.Contains(string(r.body), "2 hosts draining") || r.header.Get("Retry-After") != "" {
		t.Errorf("all eu hosts draining: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	// Not pinned: it fails over to us.
	r = do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 60}, nil)
	var sb sandbox
	r.json(t, &sb)
	if r.status != 201 || sb.ID[1:3] != "02" {
		t.Errorf("failover to us: %d %s", r.status, r.body)
	}
	do(t, "us", "DELETE", "/sandboxes/"+sb.ID, nil, nil)
	for _, h := range c.Hosts[:2] {
		if err := c.Admin(ctx, "activate", fmt.Sprint(h.N)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Admin(ctx, "team", "add", "small", "--max-sandboxes", "1"); err != nil {
		t.Fatal(err)
	}
	key, _ := c.AdminOut(ctx, "key", "create", "small", "k")
	h := map[string]string{"X-API-KEY": strings.TrimSpace(key)}
	time.Sleep(1500 * time.Millisecond)
	r = do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "timeout": 60}, h)
	if r.status != 201 {
		t.Fatalf("first of a team of one: %d %s", r.status, r.body)
	}
	r.json(t, &sb)
	defer do(t, "eu", "DELETE", "/sandboxes/"+sb.ID, nil, h)
	if r := do(t, "eu", "POST", "/v2/sandboxes", map[string]any{"templateID": "base"}, h); r.status != 429 || !strings.Contains(string(r.body), "limit of 1") {
		t.Errorf("second of a team of one: %d %s", r.status, r.body)
	}
}

// testSDKConformance runs the E2B SDK conformance suite (tests/conformance)
// against a gateway.
func testSDKConformance(t *testing.T) {
	url := c.URL("eu")
	// The code interpreter's other languages and rich outputs take the
	// same path through a gateway as the Python REPL's tests, and the
	// single-host run covers them (their kernels' starts are minutes of
	// this suite's CPU).
	conf := filepath.Join(repoRoot, "tests", "conformance")
	cmd := exec.Command(filepath.Join(repoRoot, ".venv", "bin", "pytest"), "-q", "-p", "no:cacheprovider", "-x",
		"--ignore", filepath.Join(conf, "test_code_interpreter_languages.py"),
		"--ignore", filepath.Join(conf, "test_code_interpreter_rich.py"), conf)
	cmd.Dir = repoRoot
	cmd.Env = append(os.Environ(), "E2B_API_URL="+url, "E2B_SANDBOX_URL="+url, "E2B_API_KEY="+c.Key,
		"CELLFORK_URL="+url, "CELLFORK_API_KEY="+c.Key, "CELLFORK_CLUSTER_TEST=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the E2B conformance suite through a gateway: %v\n%s", err, tailOf(string(out), 6000))
	}
	t.Logf("conformance through the gateway: %s", lastLine(string(out)))
}

func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// testTemplateArtifact: one host published the built-in template's root
// file system, and every host runs on those bytes at the same path, with
// the artifact in the runtime identity rows and placement match on.
func testTemplateArtifact(t *testing.T) {
	ctx := context.Background()
	db := openDB(t)
	defer db.Close()
	def, err := template.Hash("base")
	if err != nil {
		t.Fatal(err)
	}
	root, err := db.BuiltinRoot(ctx, "base", def)
	if err != nil || len(root) != 64 {
		t.Fatalf("the built-in template's artifact: %q, %v", root, err)
	}
	if fi, err := os.Stat(filepath.Join(c.Opts().TemplateDir, "base", def, root[:16], "rootfs", "usr", "bin", "python3")); err != nil || fi.Size() == 0 {
		t.Fatalf("the artifact's rootfs: %v", err)
	}
	hosts, err := db.Hosts(ctx, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hosts {
		if !strings.HasSuffix(h.Versions["runsc"], "+base."+root[:16]) {
			t.Errorf("host %d runs %q, not on the artifact %s", h.Slot, h.Versions["runsc"], root[:16])
		}
	}
	published := 0
	for _, h := range c.Hosts {
		published += strings.Count(h.Logs(), "publishing its root file system")
	}
	if published != 1 {
		t.Errorf("the artifact was published %d times, not once", published)
	}
}

// testNewHostPulls: a machine that joins the cluster with an empty
// template directory pulls the built-in template's root file system and
// warm image from the cluster instead of building them (it could not:
// debootstrap has no network here), then runs sandboxes from that image
// and restores a snapshot another host took.
func testNewHostPulls(t *testing.T) {
	ctx := context.Background()
	src := create(t, "eu", nil)
	if out, status := runCode(t, "eu", src, `x = "taken on another host"; print(len(x))`); out != "21\n" {
		t.Fatalf("setting state up: %d %q", status, out)
	}
	r := do(t, "eu", "POST", "/sandboxes/"+src.ID+"/snapshots", nil, nil)
	var sn struct {
		ID string `json:"snapshotID"`
	}
	if r.status != 201 {
		t.Fatalf("snapshot: %d %s", r.status, r.body)
	}
	r.json(t, &sn)
	waitUploaded(t, sn.ID)

	t0 := time.Now()
	h, err := c.AddHost(ctx, "eu", filepath.Join(c.Opts().Dir, "new-host-templates"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("the new host joined in %v", time.Since(t0).Round(time.Millisecond))
	logs := h.Logs()
	for _, want := range []string{"pulling its root file system", "warm image pulled from the cluster"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the new host's log does not say %q", want)
		}
	}
	for _, not := range []string{"building rootfs", "building warm image", "publishing its root file system"} {
		if strings.Contains(logs, not) {
			t.Errorf("the new host's log says %q", not)
		}
	}
	// Only the new host takes creates.
	for _, o := range c.Hosts {
		if o != h && o.Region == "eu" {
			if err := c.Admin(ctx, "cordon", fmt.Sprint(o.N)); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if err := c.Admin(ctx, "activate", fmt.Sprint(o.N)); err != nil {
					t.Error(err)
				}
			}()
		}
	}
	time.Sleep(1500 * time.Millisecond) // the gateways' next refresh
	sb := create(t, "eu", nil)
	if hostOf(t, sb) != h {
		t.Fatalf("created on host %d, not the new one", hostOf(t, sb).N)
	}
	if out, status := runCode(t, "eu", sb, "print(6*7)"); out != "42\n" {
		t.Errorf("run_code on the new host: %d %q", status, out)
	}
	from := create(t, "eu", map[string]any{"templateID": sn.ID})
	if hostOf(t, from) != h {
		t.Fatalf("the snapshot's sandbox is on host %d, not the new one", hostOf(t, from).N)
	}
	if out, status := runCode(t, "eu", from, "print(x)"); out != "taken on another host\n" {
		t.Errorf("the snapshot's state on the new host: %d %q", status, out)
	}
}

// openDB connects to the cluster's database, as a host does; the caller
// closes it.
func openDB(t *testing.T) *clusterdb.DB {
	t.Helper()
	db, err := clusterdb.Open(context.Background(), c.PG.URL)
	if err != nil {
		t.Fatal(err)
	}
	return db
}
