package integration

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// seenLimits is what a sandbox's processes see of its limits.
type seenLimits struct {
	procs, files  string // soft/hard, as ulimit prints them
	diskMB, shmMB int
	memKB         int // MemTotal
}

func seen(t *testing.T, sb sandboxInfo, user string) seenLimits {
	t.Helper()
	out, errOut, code := run(t, sb, user, `echo "$(ulimit -u)/$(ulimit -Hu) $(ulimit -n)/$(ulimit -Hn)" `+
		`$(df -m --output=size / | tail -1) $(df -m --output=size /dev/shm | tail -1) $(awk '/MemTotal/ {print $2}' /proc/meminfo)`)
	f := strings.Fields(out)
	if code != 0 || len(f) != 5 {
		t.Fatalf("reading limits as %q: %q %q %d", user, out, errOut, code)
	}
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	return seenLimits{procs: f[0], files: f[1], diskMB: atoi(f[2]), shmMB: atoi(f[3]), memKB: atoi(f[4])}
}

// kernelLimits are the limits of the REPL's kernel, a process that was
// running before the sandbox was handed out.
func kernelLimits(t *testing.T, sb sandboxInfo) string {
	t.Helper()
	return strings.TrimSpace(stdoutOf(runCode(t, sb, "import resource as r\nprint(r.getrlimit(r.RLIMIT_NPROC), r.getrlimit(r.RLIMIT_NOFILE))")))
}

// cgroup reads a host cgroup (v1) file of a sandbox's gVisor sandbox.
func cgroup(t *testing.T, sandboxID, controller, file string) string {
	t.Helper()
	p := filepath.Join("/sys/fs/cgroup", controller, "cellfork", runtimeID(t, sandboxID), file)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Skipf("no cgroup v1 file %s: %v", p, err)
	}
	return strings.TrimSpace(string(b))
}

// waitPool waits until the pool holds a ready sandbox of the base template.
func waitPool(t *testing.T) {
	t.Helper()
	eventually(t, 60*time.Second, "a ready sandbox in the pool", func() bool {
		r := call(t, "GET", "/health", nil)
		var h struct {
			Pool struct {
				Ready map[string]int `json:"ready"`
			} `json:"pool"`
		}
		r.json(t, &h)
		return h.Pool.Ready["base"] > 0
	})
}

func createMode(t *testing.T, body map[string]any) (sandboxInfo, string) {
	t.Helper()
	sb := create(t, body)
	mode, _ := info(t, sb.SandboxID)["bootMode"].(string)
	return sb, mode
}

// reported checks what GET /sandboxes/{id} says of the sandbox's limits.
func reported(t *testing.T, id string, want map[string]int) {
	t.Helper()
	got := info(t, id)
	for k, v := range want {
		if n, _ := got[k].(float64); int(n) != v {
			t.Errorf("GET /sandboxes/%s: %s = %v, want %d", id, k, got[k], v)
		}
	}
}

// TestLimitsOverrides: each limit a create asks for is what the sandbox
// gets, on whichever path starts it, and GET reports it.
func TestLimitsOverrides(t *testing.T) {
	t.Run("fewer processes and open files: from the pool", func(t *testing.T) {
		waitPool(t)
		sb, mode := createMode(t, map[string]any{"pidsMax": 100, "openFiles": 1000})
		if mode != "pool" {
			t.Errorf("bootMode %q, want pool (the pool's sandboxes can be lowered)", mode)
		}
		for _, user := range []string{"", "root"} {
			if s := seen(t, sb, user); s.procs != "100/100" || s.files != "1000/1000" {
				t.Errorf("as %q: processes %s, open files %s; want 100/100, 1000/1000", user, s.procs, s.files)
			}
		}
		if got := kernelLimits(t, sb); got != "(100, 100) (1000, 1000)" {
			t.Errorf("the REPL kernel (running before the hand-off) has %s", got)
		}
		if got := cgroup(t, sb.SandboxID, "pids", "pids.max"); got != strconv.Itoa(4*100+1024) {
			t.Errorf("host pids.max %s", got)
		}
		reported(t, sb.SandboxID, map[string]int{"pidsMax": 100, "openFiles": 1000, "cpuCount": 1, "memoryMB": 1024, "diskSizeMB": 512})
		out, _, _ := run(t, sb, "", `for i in $(seq 150); do sleep 10 & done 2>&1 | grep -c -m1 "Resource temporarily unavailable"; pkill sleep; true`)
		if strings.TrimSpace(out) != "1" {
			t.Errorf("150 processes under pidsMax 100: %q", out)
		}
		ev := runCode(t, sb, "import errno\nfs = []\ntry:\n    while True: fs.append(open('/dev/null'))\nexcept OSError as e: print(errno.errorcode[e.errno], 900 < len(fs) < 1000)\nfor f in fs: f.close()")
		if got := stdoutOf(ev); got != "EMFILE True\n" {
			t.Errorf("opening files under openFiles 1000: %q %v", got, ev)
		}
	})

	t.Run("more processes than the template's: restored", func(t *testing.T) {
		waitPool(t)
		sb, mode := createMode(t, map[string]any{"pidsMax": 2048})
		if mode != "restore" {
			t.Errorf("bootMode %q, want restore (a pool sandbox's limits cannot be raised)", mode)
		}
		if s := seen(t, sb, ""); s.procs != "2048/2048" || s.files != "65536/65536" {
			t.Errorf("processes %s, open files %s", s.procs, s.files)
		}
		if got := kernelLimits(t, sb); got != "(2048, 2048) (65536, 65536)" {
			t.Errorf("the REPL kernel has %s", got)
		}
		if got := cgroup(t, sb.SandboxID, "pids", "pids.max"); got != strconv.Itoa(4*2048+1024) {
			t.Errorf("host pids.max %s", got)
		}
	})

	t.Run("CPUs and memory: restored at that size", func(t *testing.T) {
		cpus := min(2, runtime.NumCPU())
		sb, mode := createMode(t, map[string]any{"cpuCount": cpus, "memoryMB": 512})
		if mode != "restore" {
			t.Errorf("bootMode %q, want restore", mode)
		}
		if s := seen(t, sb, ""); s.memKB != 512<<10 || s.diskMB != 512 {
			t.Errorf("MemTotal %d kB, disk %d MiB", s.memKB, s.diskMB)
		}
		if got := cgroup(t, sb.SandboxID, "cpu", "cpu.cfs_quota_us"); got != strconv.Itoa(cpus*100000) {
			t.Errorf("host CPU quota %s for %d CPUs", got, cpus)
		}
		if got := cgroup(t, sb.SandboxID, "memory", "memory.limit_in_bytes"); got != strconv.Itoa(512<<20) {
			t.Errorf("host memory limit %s", got)
		}
		reported(t, sb.SandboxID, map[string]int{"cpuCount": cpus, "memoryMB": 512})
		if got := stdoutOf(runCode(t, sb, "import pandas\nprint('ok')")); got != "ok\n" {
			t.Errorf("REPL: %q", got)
		}
	})

	t.Run("disk: booted at that size, full is ENOSPC", func(t *testing.T) {
		sb, mode := createMode(t, map[string]any{"diskSizeMB": 64})
		if mode != "boot" {
			t.Errorf("bootMode %q, want boot (the disk size is frozen in the template's image)", mode)
		}
		if s := seen(t, sb, ""); s.diskMB != 64 || s.shmMB != 32 || s.procs != "512/512" {
			t.Errorf("disk %d MiB, /dev/shm %d MiB, processes %s", s.diskMB, s.shmMB, s.procs)
		}
		reported(t, sb.SandboxID, map[string]int{"diskSizeMB": 64})
		for _, dir := range []string{"/home/user", "/tmp", "/dev/shm"} {
			out, _, _ := run(t, sb, "", "dd if=/dev/zero of="+dir+"/fill bs=1M count=200 2>&1 | grep -c 'No space left on device'; rm -f "+dir+"/fill")
			if strings.TrimSpace(out) != "1" {
				t.Errorf("filling %s past a 64 MiB disk: %q", dir, out)
			}
		}
		if got := kernelLimits(t, sb); got != "(512, 512) (65536, 65536)" {
			t.Errorf("the REPL kernel of a booted sandbox has %s", got)
		}
	})
}

// TestLimitsRefused: a limit past the daemon's bounds, zero or negative
// is a 400 naming it, never clamped.
func TestLimitsRefused(t *testing.T) {
	cases := []struct {
		body map[string]any
		want string
	}{
		{map[string]any{"cpuCount": runtime.NumCPU() + 1}, fmt.Sprintf("cpuCount must be between 1 and %d", runtime.NumCPU())},
		{map[string]any{"memoryMB": 8193}, "memoryMB must be between 128 and 8192"},
		{map[string]any{"diskSizeMB": 4097}, "diskSizeMB must be between 16 and 4096"},
		{map[string]any{"pidsMax": 4097}, "pidsMax must be between 16 and 4096"},
		{map[string]any{"openFiles": 1<<20 + 1}, "openFiles must be between 256 and 1048576"},
		{map[string]any{"openFiles": 255}, "openFiles must be between 256"},
		{map[string]any{"cpuCount": 0}, "cpuCount must be a positive integer"},
		{map[string]any{"diskSizeMB": -1}, "diskSizeMB must be a positive integer"},
	}
	for _, c := range cases {
		c.body["templateID"] = "base"
		r := call(t, "POST", "/v2/sandboxes", c.body)
		if r.status != http.StatusBadRequest || !strings.Contains(r.errMessage(), c.want) {
			t.Errorf("%v: %d %s, want 400 %q", c.body, r.status, r.body, c.want)
			if r.status == http.StatusCreated {
				var sb sandboxInfo
				r.json(t, &sb)
				killQuietly(sb.SandboxID)
			}
		}
	}
	record("API clients", "limits past the operator's maximums, zero or negative", "400 naming the limit", fmt.Sprintf("%d cases", len(cases)), !t.Failed())
}

// TestLimitsFromSnapshot: a sandbox from a snapshot keeps the snapshot's
// limits unless the create lowers them; its processes, those left running
// included, get the lower ones; raising them or another disk size is 400.
func TestLimitsFromSnapshot(t *testing.T) {
	src := create(t, nil)
	run(t, src, "", "nohup sleep 600 >/dev/null 2>&1 &")
	snap := snapshotOf(t, src.SandboxID, "")
	for body, want := range map[string]string{
		`{"pidsMax":513}`:     "pidsMax must be at most 512",
		`{"openFiles":70000}`: "openFiles must be at most 65536",
		`{"diskSizeMB":256}`:  "diskSizeMB must be 512",
	} {
		r := call(t, "POST", "/v2/sandboxes", strings.Replace(body, "{", `{"templateID":"`+snap+`",`, 1))
		if r.status != http.StatusBadRequest || !strings.Contains(r.errMessage(), want) {
			t.Errorf("%s from a snapshot: %d %s", body, r.status, r.body)
		}
	}
	// The snapshot's own limits: its processes have them already (the
	// hand-off does not apply them again).
	same := create(t, map[string]any{"templateID": snap})
	reported(t, same.SandboxID, map[string]int{"pidsMax": 512, "openFiles": 65536, "diskSizeMB": 512})
	processLimits(t, "from the snapshot", same, "512/512", "65536/65536")
	sb := create(t, map[string]any{"templateID": snap, "pidsMax": 64, "openFiles": 512})
	processLimits(t, "from the snapshot, lowered", sb, "64/64", "512/512")
	reported(t, sb.SandboxID, map[string]int{"pidsMax": 64, "openFiles": 512})
	// A fork's children keep the parent's lowered limits.
	child := forkN(t, sb, 1)[0]
	processLimits(t, "a fork's child", child, "64/64", "512/512")
	reported(t, child.SandboxID, map[string]int{"pidsMax": 64, "openFiles": 512})
}

// processLimits checks the process and open-file limits (soft/hard) of
// sb's new processes, its REPL kernel and the sleep left running in it.
func processLimits(t *testing.T, what string, sb sandboxInfo, procs, files string) {
	t.Helper()
	if s := seen(t, sb, ""); s.procs != procs || s.files != files {
		t.Errorf("%s: processes %s, open files %s; want %s, %s", what, s.procs, s.files, procs, files)
	}
	p, f := strings.Split(procs, "/"), strings.Split(files, "/")
	if got, want := kernelLimits(t, sb), fmt.Sprintf("(%s, %s) (%s, %s)", p[0], p[1], f[0], f[1]); got != want {
		t.Errorf("%s: the REPL kernel has %s, want %s", what, got, want)
	}
	out, _, _ := run(t, sb, "", `grep -E "processes|open files" /proc/$(pgrep -o sleep)/limits | awk '{print $(NF-2) "/" $(NF-1)}' | tr '\n' ' '`)
	if got := strings.TrimSpace(out); got != procs+" "+files {
		t.Errorf("%s: a process left running in the snapshot has %q, want %q", what, got, procs+" "+files)
	}
}

// TestLimitsTemplateDefaults: a template's values (here the operator's,
// --template-limits) are its sandboxes' defaults, served from the pool; a
// create may still ask for others.
func TestLimitsTemplateDefaults(t *testing.T) {
	withDaemon(t, []string{"--template-limits", "base:memoryMB=768,diskSizeMB=96", "--template-limits", "code-interpreter-v1:pidsMax=200,openFiles=3000",
		"--pool-ready", "1", "--pool-shells", "0"}, func() {
		var ids []string
		defer func() {
			for _, id := range ids {
				killQuietly(id)
			}
		}()
		waitPool(t)
		r := call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base"})
		var sb sandboxInfo
		r.json(t, &sb)
		ids = append(ids, sb.SandboxID)
		if r.status != http.StatusCreated {
			t.Fatalf("create: %d %s", r.status, r.body)
		}
		if mode := info(t, sb.SandboxID)["bootMode"]; mode != "pool" {
			t.Errorf("bootMode %v, want pool (the pool holds the template's defaults)", mode)
		}
		reported(t, sb.SandboxID, map[string]int{"cpuCount": 1, "memoryMB": 768, "diskSizeMB": 96, "pidsMax": 200, "openFiles": 3000})
		if s := seen(t, sb, ""); s.procs != "200/200" || s.files != "3000/3000" || s.diskMB != 96 || s.shmMB != 48 || s.memKB != 768<<10 {
			t.Errorf("inside: %+v", s)
		}
		r = call(t, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "memoryMB": 1024, "pidsMax": 300})
		r.json(t, &sb)
		ids = append(ids, sb.SandboxID)
		if r.status != http.StatusCreated {
			t.Fatalf("create with overrides: %d %s", r.status, r.body)
		}
		reported(t, sb.SandboxID, map[string]int{"memoryMB": 1024, "diskSizeMB": 96, "pidsMax": 300, "openFiles": 3000})
		if s := seen(t, sb, ""); s.procs != "300/300" || s.diskMB != 96 || s.memKB != 1024<<10 {
			t.Errorf("inside, with overrides: %+v", s)
		}
	})
}
