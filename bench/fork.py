"""cellfork fork-first benchmark: one Markdown table per operation.

Operations: memory per idle sandbox (density), create from the warm pool,
snapshot vs dirty memory (0-500 MB), create from a snapshot at concurrency
1/10/20, snapshots through the chunk store (upload, then a create that
imports the image), fork(n) for n = 1/5/10/20, rollback, pause/resume (in memory,
spilled to disk, and from the chunk store once the disk's copy is dropped); and, only with --ops scale, ready sandboxes per host
(10 to 200 sandboxes, PSS and host memory, extrapolated). Every row sits beside the seeds' published figure, our
target, and the same work done with raw `runsc` in the same run.

Methods
-------
* Runs against the throwaway daemon scripts/bench.sh starts (CELLFORK_URL,
  CELLFORK_API_KEY, CELLFORK_DATA_DIR = its --data-dir). Needs root.
* Server side: every timed request's Server-Timing header; "total" is the
  handler's time, the other entries are its phases. Phases nest (checkpoint
  sits inside spill) and may be absent (netns appears only when no prepared
  shell was free: its n says how often that happened). The manager sums a
  repeated phase name, so fork's child phases (queue, netns, restore, agent,
  init) are divided by n here: mean per child, which ran concurrently.
* Client side (loopback, httpx, one shared keep-alive client): wall time of
  the request, and where the issue says so, wall time from the request until
  every new sandbox answered run_code over the data plane (POST /execute).
* Raw runsc, same run, with the global flags read off the daemon's own
  runsc-sandbox processes: `checkpoint --leave-running --compression=none`,
  `pause`, `resume` act on the daemon's container (runtime id from
  <data-dir>/state.db); `restore --detach` restores the daemon's image (or the
  raw checkpoint) into a new container in a separate runsc root: a copy of the
  source bundle's config.json with its own cgroupsPath and a fresh netns pair
  set up like internal/netns (veth cf0 10.88.0.1/30 <-> eth0 10.88.0.2/30, MAC
  02:cf:00:00:00:02, default route). "pre-created" = `runsc create` first,
  untimed, as the daemon's shells. Raw times are runsc's process time (blocking
  wait); netns, bundles, deletes are untimed and removed again. One restored
  container per batch must accept TCP on the agent port.
* Ratio = cellfork p50 / raw p50. Targets are judged on p50 (fork(5): client
  wall until all five answer run_code).
* Density: PSS (/proc/PID/smaps_rollup) summed over the processes whose
  command line holds the runtime id (runsc sandbox + gofer) and their
  children (the sentry's systrap stubs, which map the application memory). Pooled boxes are
  containers in the daemon's runsc root no sandbox record points to (running
  = ready, created = prepared shell).
* Snapshot vs dirty memory: one sandbox (memoryMB 2048) dirties N MB in its
  REPL (bytearray of 0xa5 bytes, replacing the previous one), then alternates
  daemon snapshots (deleted again) and raw checkpoints of its container.
* Between samples the bench waits for the pool (2 ready, and every shell the daemon keeps)
  to refill, so each sample sees the daemon's steady state.

Run time on the 2-vCPU box: about 2.5 min (whole suite, core included),
--quick about 1.5 min; more when the box is busy.

    scripts/bench.sh --suite fork [--quick] [--ops pool,fork,...]
"""

import argparse
import concurrent.futures as cf
import contextlib
import glob
import hashlib
import json
import os
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import httpx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import server_timing, stats  # noqa: E402

RUNSC = os.environ.get("CELLFORK_RUNSC", "/usr/local/lib/cellfork/runsc")
URL = os.environ["CELLFORK_URL"]
KEY = os.environ["CELLFORK_API_KEY"]
DATA = os.environ["CELLFORK_DATA_DIR"]
ROOT = os.path.join(DATA, "runsc")
# The daemon's global runsc flags (internal/runtime/gvisor/gvisor.go); main
# replaces them with those read off the daemon's own sandbox processes.
FLAGS = ["--platform=systrap", "--network=sandbox", "--overlay2=root:memory",
         "--host-settings=ignore", "--restore-spec-validation=warning"]

SEEDS = {
    "pool": "Podflare pool hit 7-11 ms",
    "snap0": "CubeSandbox snapshot 41 ms",
    "restore": "CubeSandbox create-from-snapshot 67 ms; PandaStack restore 179 ms",
    "fork1": "Podflare fork 24 ms (warm); CubeSandbox clone 271 ms",
    "fork5": "Podflare fork(n=5) 101 ms",
    "rollback": "CubeSandbox rollback 90 ms",
    "pause": "CubeSandbox pause 371 ms",
    "resume": "CubeSandbox resume 19 ms",
}

ms = lambda t0: 1000 * (time.perf_counter() - t0)
med = statistics.median


def log(*a):
    print("[fork-bench]", *a, file=sys.stderr, flush=True)


DaemonError = RuntimeError  # the daemon misbehaved


# --- tables -----------------------------------------------------------------

class Table:
    HEAD = ("| operation | n | min | p50 | p95 | mean | vs raw runsc (p50) | seeds' figure | target (p50) |\n"
            "|---|---|---|---|---|---|---|---|---|")

    def __init__(self, title, note=""):
        self.title, self.note, self.rows = title, note, []

    def add(self, name, xs, raw=None, seed="", target=None, unit="ms"):
        xs = [x for x in xs if x is not None]
        if not xs:
            self.rows.append(f"| {name} | 0 | - | - | - | - | | {seed} | |")
            return
        n, lo, p50, p95, mean = stats(xs)
        ratio = f"{p50 / med(raw):.2f}x" if raw and med(raw) else ""
        tgt = "" if target is None else f"<= {target} {unit}: {'met' if p50 <= target else 'MISSED'}"
        self.rows.append(f"| {name} | {n} | {lo:.1f} | {p50:.1f} | {p95:.1f} | {mean:.1f} | {ratio} | {seed} | {tgt} |")

    def phases(self, sts, per=None, skip=("total",), indent="  · ", gap=True):
        """One row per Server-Timing phase over the samples sts; per[i]
        divides sample i's value (fork: mean per child). gap: the phases are
        sequential, so also show the time none of them covers."""
        names = []
        for st in sts:
            names += [k for k in st if k not in skip and k not in names]
        for k in names:
            vals = [st[k] / (per[i] if per and k in CHILD_PHASES else 1)
                    for i, st in enumerate(sts) if k in st]
            self.add(indent + k + (" (per child)" if per and k in CHILD_PHASES else ""), vals)
        if gap:
            self.add(indent + "(in no phase: total - phases)", [2 * st["total"] - sum(st.values()) for st in sts])

    def render(self):
        return "\n".join([f"### {self.title}\n", self.note + "\n", self.HEAD, *self.rows, ""])


CHILD_PHASES = {"queue", "netns", "restore", "agent", "init", "runsc-create", "bundle"}


# --- the daemon's API ---------------------------------------------------------

class Api:
    def __init__(self):
        self.c = httpx.Client(base_url=URL, headers={"X-API-KEY": KEY}, timeout=300,
                              limits=httpx.Limits(max_connections=200, max_keepalive_connections=64))
        self.owned = set()

    def call(self, method, path, body=None):
        t0 = time.perf_counter()
        r = self.c.request(method, path, **({} if body is None else {"json": body}))
        wall = ms(t0)
        if r.status_code // 100 != 2:
            raise DaemonError(f"{method} {path} -> {r.status_code}: {r.text[:400]}")
        return (r.json() if r.content else None), server_timing(r.headers.get("server-timing", "")), wall

    def create(self, template="base", **kw):
        sb, st, wall = self.call("POST", "/v2/sandboxes", {"templateID": template, "timeout": 1800, **kw})
        self.owned.add(sb["sandboxID"])
        return sb, st, wall

    def kill(self, sb):
        self.call("DELETE", f"/sandboxes/{sb['sandboxID']}")
        self.owned.discard(sb["sandboxID"])

    def kill_all(self, sbs):
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(self.kill, sbs))

    def run_code(self, sb, code, expect=None):
        """Runs code in the sandbox's REPL; returns its stdout."""
        r = self.c.post("/execute", json={"code": code}, timeout=300, headers={
            "E2b-Sandbox-Id": sb["sandboxID"], "E2b-Sandbox-Port": "49999",
            "X-Access-Token": sb["envdAccessToken"]})
        if r.status_code != 200:
            raise DaemonError(f"run_code in {sb['sandboxID']} -> {r.status_code}: {r.text[:300]}")
        out, events = "", [json.loads(x) for x in r.text.splitlines() if x.strip()]
        for e in events:
            if e.get("type") == "error":
                raise DaemonError(f"run_code in {sb['sandboxID']}: {e.get('name')}: {e.get('value')}")
            if e.get("type") == "stdout":
                out += e.get("text", "")
        if expect is not None and out.strip() != expect:
            raise DaemonError(f"run_code in {sb['sandboxID']}: got {out!r}, want {expect!r}")
        return out

    def run_all(self, sbs, code, expect=None):
        with cf.ThreadPoolExecutor(max(1, len(sbs))) as ex:
            list(ex.map(lambda s: self.run_code(s, code, expect), sbs))


# --- the daemon's state, read from outside ------------------------------------

def records():
    """RuntimeID -> sandbox id, from the daemon's store."""
    with contextlib.closing(sqlite3.connect(f"file:{DATA}/state.db?mode=ro", uri=True, timeout=10)) as db:
        docs = [json.loads(d) for (d,) in db.execute("SELECT doc FROM sandboxes")]
    return {d["RuntimeID"]: d["ID"] for d in docs if d.get("RuntimeID")}


def rid_of(sb):
    for rid, sid in records().items():
        if sid == sb["sandboxID"]:
            return rid
    raise DaemonError(f"sandbox {sb['sandboxID']} has no record in state.db")


def containers(root=ROOT):
    p = subprocess.run([RUNSC, f"--root={root}", *FLAGS, "list", "--format=json"],
                       capture_output=True, text=True, check=True)
    return json.loads(p.stdout or "null") or []


def pool_state():
    recs = records()
    free = [c for c in containers() if c["id"] not in recs]
    return ([c["id"] for c in free if c["status"] == "running"],
            [c["id"] for c in free if c["status"] == "created"])


STUCK = []  # pool refills that timed out: later waits are short


def health_pool():
    """(ready sandboxes over all templates, prepared shells, {snapshot id: standby ready}) from /health."""
    p = httpx.get(URL + "/health", timeout=10).json().get("pool", {})
    return sum(p.get("ready", {}).values()), p.get("shells", 0), p.get("standbys", {})


def shell_target():
    """The daemon's --pool-shells (GET /host)."""
    return httpx.get(URL + "/host", headers={"X-API-Key": KEY}, timeout=10).json()["pool"]["shellTarget"]


def wait_pool(ready=2, shells=None, standby=None):
    """Waits until the pool holds that many ready sandboxes and shells (by
    default all the shells the daemon keeps, so that no refill of one runs
    beside the sample), and the snapshot's standby."""
    if shells is None:
        shells = shell_target()
    t0, timeout = time.time(), 3 if STUCK else 20
    while time.time() - t0 < timeout:
        r, s, sb = health_pool()
        if r >= ready and s >= shells and (standby is None or sb.get(standby) == 1):
            time.sleep(0.05)  # the refill that just finished hands back its slot
            return True
        time.sleep(0.05)
    STUCK.append(f"{r} ready + {s} shells + standbys {sb} after {timeout} s, wanted {ready} + {shells} + {standby}")
    log("pool did not refill: " + STUCK[-1])
    return False


# Two daemons side by side (bench/firstrc.py, burst.py, daemon_ab.py): each
# side is named on the command line as NAME=URL,KEY,DATA_DIR[,READY[,...]]
# and this module's state (URL, KEY, DATA, ROOT) points at one at a time.

def side(arg, **fields):
    """A side from NAME=URL,KEY,DATA_DIR[,READY[,MORE...]] (READY: its
    --pool-ready, what "pool full" means for it), with its Api and fields."""
    name, rest = arg.split("=", 1)
    url, key, data, *more = rest.split(",")
    s = dict(name=name, url=url, key=key, data=data, ready=int(more[0]) if more else None, more=more[1:], **fields)
    use(s)
    s["api"] = Api()
    return s


def use(side):
    """Points this module's state (the daemon's URL, key, data) at a side."""
    global URL, KEY, DATA, ROOT
    URL, KEY, DATA = side["url"], side["key"], side["data"]
    ROOT = os.path.join(DATA, "runsc")


def fill(sides):
    """Waits until every side's pool holds its READY sandboxes."""
    for s in sides:
        use(s)
        wait_pool(ready=s["ready"], shells=0)


def pss_mb(rids, fields=("Pss:",)):
    """PSS (MB) summed over the processes whose command line holds each id,
    and their children (the sentry's systrap stubs, which have no command
    line of their own: they map the sandbox's application memory)."""
    out = {r: 0 for r in rids}
    owner, parent = {}, {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
            parent[pid] = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        hit = [r for r in rids if r in cmd]
        if hit:
            owner[pid] = hit[0]
    for pid, ppid in parent.items():
        if pid not in owner and ppid in owner:
            owner[pid] = owner[ppid]
    for pid, rid in owner.items():
        try:
            for line in open(f"/proc/{pid}/smaps_rollup"):
                if line.startswith(fields):
                    out[rid] += int(line.split()[1]) / 1024
        except OSError:
            continue
    return out


def uss_mb(rids):
    """Memory (MB) only each sandbox's processes hold: their private pages
    (USS), what destroying the sandbox gives back."""
    return pss_mb(rids, fields=("Private_Clean:", "Private_Dirty:"))


# --- raw runsc ------------------------------------------------------------------

def sh(*args, input=None):
    p = subprocess.run(args, input=input, capture_output=True, text=True)
    if p.returncode:
        raise RuntimeError(f"{' '.join(args)}: {p.stderr.strip()}")


class Raw:
    """The same work straight through runsc: the floor our overhead sits on."""

    def __init__(self, runsc=None, flags=()):
        """runsc: the binary (default the daemon's); flags: global flags
        added to the daemon's (bench/runsc_ab.py: --debug-log)."""
        self.bin, self.extra = runsc or RUNSC, list(flags)
        self.tmp = tempfile.mkdtemp(prefix="bench-raw-", dir=DATA)  # same disk as the daemon's images
        self.root = os.path.join(self.tmp, "runsc")
        os.makedirs(self.root)
        self.live = {}  # cid -> (netns name, bundle dir)

    def runsc(self, root, *args, out=None, log_to=None):
        cmd = [self.bin, f"--root={root}", *FLAGS, *self.extra] + ([f"--log={log_to}"] if log_to else []) + list(args)
        t0 = time.perf_counter()
        # A detached sandbox keeps the stdio it is given: a file, never a pipe.
        io = dict(capture_output=True, text=True) if out is None else dict(stdout=out, stderr=out)
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, **io)
        t = ms(t0)
        if p.returncode:
            err = p.stderr if out is None else (open(log_to).read() if os.path.exists(log_to) else "")
            raise RuntimeError(f"runsc {args[0]} failed: {err.strip()[-800:]}")
        return t

    def checkpoint(self, rid):
        img = tempfile.mkdtemp(prefix="img-", dir=self.tmp)
        t = self.runsc(ROOT, "checkpoint", "--leave-running", "--compression=none", f"--image-path={img}", rid)
        return t, img

    def pause(self, rid, verb="pause"):
        return self.runsc(ROOT, verb, rid)

    def setup(self, src, prepared):
        """A new container's netns and bundle (src: a runtime id or its
        config.json), created with `runsc create` if prepared. Untimed."""
        cid = uuid.uuid4().hex[:24]
        ns = "cfbench-" + cid[:12]  # never a daemon's "cf<6 hex>-" prefix
        sh("ip", "netns", "add", ns + "-r")
        sh("ip", "netns", "add", ns + "-s")
        b = os.path.join(self.tmp, "b-" + cid)
        self.live[cid] = (ns, b)
        sh("ip", "-n", ns + "-r", "link", "add", "cf0", "type", "veth", "peer", "name", "eth0",
           "address", "02:cf:00:00:00:02", "netns", ns + "-s")
        sh("ip", "-n", ns + "-r", "-batch", "-", input="link set lo up\naddr add 10.88.0.1/30 dev cf0\nlink set cf0 up\n")
        sh("ip", "-n", ns + "-s", "-batch", "-", input="link set lo up\naddr add 10.88.0.2/30 dev eth0\n"
                                                        "link set eth0 up\nroute add default via 10.88.0.1\n")
        spec = json.loads(json.dumps(spec_of(src)))
        spec["linux"]["cgroupsPath"] = f"/cellfork-bench/{cid}"
        for n in spec["linux"]["namespaces"]:
            if n["type"] == "network":
                n["path"] = f"/run/netns/{ns}-s"
        os.makedirs(b)
        json.dump(spec, open(os.path.join(b, "config.json"), "w"))
        if prepared:
            self.create(cid)
        return cid

    def create(self, cid):
        """`runsc create` of container cid set up by setup; its time."""
        b = self.live[cid][1]
        with open(os.path.join(b, "console.log"), "a") as out:
            return self.runsc(self.root, "create", f"--bundle={b}", cid, out=out, log_to=os.path.join(b, "runsc.log"))

    def restore(self, cid, image):
        b = self.live[cid][1]
        with open(os.path.join(b, "console.log"), "a") as out:
            return self.runsc(self.root, "restore", "--detach", f"--image-path={image}", f"--bundle={b}", cid,
                              out=out, log_to=os.path.join(b, "runsc.log"))

    def restores(self, src_rid, image, n, prepared=False, parallel=False):
        """n restores of image into new containers; returns (per-restore ms,
        wall ms). All are checked for life, then deleted."""
        cids = [self.setup(src_rid, prepared) for _ in range(n)]
        try:
            t0 = time.perf_counter()
            if parallel:
                with cf.ThreadPoolExecutor(n) as ex:
                    xs = list(ex.map(lambda c: self.restore(c, image), cids))
            else:
                xs = [self.restore(c, image) for c in cids]
            wall = ms(t0)
            self.check(cids[0])
            return xs, wall
        finally:
            self.delete_all(cids)

    def check(self, cid):
        ns = self.live[cid][0]
        sh("ip", "netns", "exec", ns + "-r", sys.executable, "-c",
           "import socket; socket.create_connection(('10.88.0.2', 49983), 5).close()")

    def delete(self, cid):
        ns, b = self.live.pop(cid)
        subprocess.run([self.bin, f"--root={self.root}", *FLAGS, "delete", "--force", cid], capture_output=True)
        rmdirs(f"cellfork-bench/{cid}")
        for s in ("-r", "-s"):
            subprocess.run(["ip", "netns", "del", ns + s], capture_output=True)
        shutil.rmtree(b, ignore_errors=True)

    def delete_all(self, cids):
        with cf.ThreadPoolExecutor(8) as ex:
            list(ex.map(self.delete, cids))

    def close(self):
        self.delete_all(list(self.live))
        rmdirs("cellfork-bench")
        subprocess.run(["umount", "-l", os.path.join(self.root, "null-netns")], capture_output=True)
        shutil.rmtree(self.tmp, ignore_errors=True)


def rmdirs(cgroup):
    """Removes the cgroup under every v1 controller (or the v2 root)."""
    for p in glob.glob(f"/sys/fs/cgroup/*/{cgroup}") + glob.glob(f"/sys/fs/cgroup/{cgroup}"):
        with contextlib.suppress(OSError):
            os.rmdir(p)


def spec_of(src):
    """A box's OCI config (src: runtime id, or the config itself)."""
    return src if isinstance(src, dict) else json.load(open(os.path.join(DATA, "runtimes", src, "config.json")))


def warm_image(src):
    """The warm image the pool restores: warm-* beside the box's rootfs."""
    rootfs = spec_of(src)["root"]["path"]
    imgs = [d for d in glob.glob(os.path.join(os.path.dirname(rootfs), "warm-*"))
            if ".tmp-" not in d and os.path.exists(os.path.join(d, "checkpoint.img"))]
    if not imgs:
        raise DaemonError(f"no warm image beside {rootfs}")
    return max(imgs, key=os.path.getmtime)


def rm(path):
    shutil.rmtree(path, ignore_errors=True)


def dir_mb(path):
    return sum(os.path.getsize(f) for f in glob.glob(os.path.join(path, "*"))) / 2**20


# --- the operations -------------------------------------------------------------

def op_density(api, raw, C):
    t = Table("Memory per idle sandbox (density)",
              "PSS in MB of the runsc sandbox + gofer processes of one sandbox (not ms). "
              "Raw: the warm image restored with plain `runsc restore`.")
    wait_pool()
    time.sleep(1)  # let the last refill settle
    ready, shells = pool_state()
    src = spec_of(ready[0])
    pr, ps = pss_mb(ready), pss_mb(shells)
    ur = uss_mb(ready)
    sbs = [api.create()[0] for _ in range(C["density"])]
    api.run_all(sbs, "print(1)", "1")
    time.sleep(2)
    pc = pss_mb([rid_of(s) for s in sbs])
    api.kill_all(sbs)
    cid = raw.setup(src, prepared=False)
    try:
        raw.restore(cid, warm_image(src))
        raw.check(cid)
        time.sleep(2)
        prw = list(pss_mb([cid]).values())
    finally:
        raw.delete(cid)
    t.add("idle pooled sandbox, ready (warm image restored, agent up)", list(pr.values()), prw, target=40, unit="MB")
    t.add("  · of which its own pages (USS: what destroying it frees)", list(ur.values()), unit="MB")
    t.add("idle prepared shell (`runsc create`, nothing restored)", list(ps.values()))
    t.add("idle created sandbox (after one run_code)", list(pc.values()), prw)
    t.add("raw: warm image restored by `runsc restore`", prw)
    return [t]


def meminfo_mb(key):
    for line in open("/proc/meminfo"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def op_scale(api, raw, C):
    """Ready sandboxes one host holds: N sandboxes created and used once
    (each answered run_code), then PSS per sandbox and the host memory they
    took, at each step up to the largest; extrapolated to this host."""
    steps = C["scale"]
    total = meminfo_mb("MemTotal")
    rows, sbs = [], []
    wait_pool()
    time.sleep(1)
    avail0 = meminfo_mb("MemAvailable")
    try:
        for target in steps:
            while len(sbs) < target:
                sb = api.create(timeout=3600)[0]
                sbs.append(sb)
                api.run_code(sb, "print(1)", "1")
            time.sleep(3)  # background loads and refills settle
            rids = [rid_of(s) for s in sbs]
            pss = list(pss_mb(rids).values())
            uss = list(uss_mb(rids).values())
            used = avail0 - meminfo_mb("MemAvailable")
            rows.append((target, med(pss), med(uss), sum(pss), used))
            log(f"scale: {target} sandboxes, PSS p50 {med(pss):.1f} MB, sum {sum(pss):.0f} MB, host memory used {used:.0f} MB")
    finally:
        api.kill_all(sbs)
    head = ("### Ready sandboxes per host (density at scale)\n\n"
            f"N sandboxes created one after another (default template, default limits), each answered run_code once; "
            f"then PSS of each (runsc sandbox + gofer processes, /proc/PID/smaps_rollup) and the host memory they took "
            f"(drop of MemAvailable since before the first; includes the daemon's pool refills and whatever else ran). "
            f"Extrapolated: 90% of this host's {total / 1024:.1f} GiB divided by the memory per sandbox at the largest N.\n\n"
            "| sandboxes | PSS per sandbox, p50 (MB) | USS (own pages) per sandbox, p50 (MB) | PSS, all (MB) | host memory used (MB) | per sandbox (MB) | sandboxes in 90% of the host (extrapolated) |\n"
            "|---|---|---|---|---|---|---|")
    lines = [head]
    for n, p50, u50, psum, used in rows:
        per = max(used, psum) / n
        lines.append(f"| {n} | {p50:.1f} | {u50:.1f} | {psum:.0f} | {used:.0f} | {per:.1f} | {int(0.9 * total / per)} |")
    return [Rendered("\n".join(lines) + "\n")]


class Rendered:
    """A table rendered already."""

    def __init__(self, text):
        self.text = text

    def render(self):
        return self.text


def op_pool(api, raw, C):
    t = Table("Create from the warm pool (pool hit)",
              "POST /v2/sandboxes {templateID: base}, default limits, after the pool refilled. "
              "Ratio: against restoring the warm image with raw `runsc restore`, the work the pool moves off the request.")
    walls, totals, sts, rc, modes = [], [], [], [], {}
    for _ in range(C["pool"]):
        wait_pool(ready=2, shells=0)
        t0 = time.perf_counter()
        sb, st, wall = api.create()
        api.run_code(sb, "print(1)", "1")
        first = ms(t0)
        modes[sb.get("bootMode")] = modes.get(sb.get("bootMode"), 0) + 1
        if sb.get("bootMode") == "pool":
            walls.append(wall)
            totals.append(st["total"])
            sts.append(st)
            rc.append(first)
        src = spec_of(rid_of(sb))
        api.kill(sb)
    t.note += f" Boot modes seen: {modes} (only pool hits are in the rows)."
    xs, _ = raw.restores(src, warm_image(src), C["raw"])
    t.add("pool hit (server total)", totals, xs, SEEDS["pool"], target=5)
    t.phases(sts)
    t.add("pool hit (client wall)", walls, xs)
    t.add("pool hit + first run_code answered (client wall)", rc)
    t.add("raw `runsc restore` of the warm image (new container)", xs)
    return [t]


def op_dirty(api, raw, C):
    t = Table("Snapshot vs dirty memory",
              "POST /sandboxes/{id}/snapshots of one sandbox (memoryMB 2048) whose REPL holds an N MB bytearray "
              "of 0xa5; the sandbox keeps running. Raw: `runsc checkpoint --leave-running --compression=none` "
              "of the same container to the same disk.")
    sb = api.create(memoryMB=2048)[0]
    rid = rid_of(sb)
    try:
        for n in C["dirty"]:
            api.run_code(sb, f"x = None\nx = bytearray(b'\\xa5') * ({n} << 20)\nprint(len(x) >> 20)", str(n))
            time.sleep(0.2)
            totals, sts, sizes, rxs, rsizes = [], [], [], [], []
            for i in range(C["dirty_n"] if n <= 100 else C["dirty_n_big"]):
                if i % 2:  # alternate who goes first: first touch of fresh guest memory, writeback
                    rxs.append(raw_ckpt(raw, rid, rsizes))
                sn, st, _ = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
                totals.append(st["total"])
                sts.append(st)
                sizes.append(sn["sizeBytes"] / 2**20)
                api.call("DELETE", f"/snapshots/{sn['snapshotID']}")
                if not i % 2:
                    rxs.append(raw_ckpt(raw, rid, rsizes))
            tgt = dict(seed=SEEDS["snap0"], target=40) if n == 0 else {}
            t.add(f"snapshot, {n} MB dirty (server total; image {med(sizes):.0f} MB)", totals, rxs, **tgt)
            t.phases(sts)
            t.add(f"raw checkpoint, {n} MB dirty (image {med(rsizes):.0f} MB)", rxs)
        api.run_code(sb, "x = None")
    finally:
        api.kill(sb)
    return [t]


def raw_ckpt(raw, rid, sizes):
    r, img = raw.checkpoint(rid)
    sizes.append(dir_mb(img))
    rm(img)
    return r


def make_parent(api):
    """An idle Python sandbox with state (x = 41) and a snapshot of it."""
    sb = api.create()[0]
    api.run_code(sb, "x = 41")
    sn = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})[0]
    return sb, sn


def op_restore(api, raw, C, parent):
    sb, sn = parent
    sid, prid, image = sn["snapshotID"], rid_of(sb), os.path.join(DATA, "snapshots", sn["snapshotID"])
    t = Table("Create from a snapshot",
              "POST /v2/sandboxes {templateID: <snapshot id>}. Pool empty (bootMode restore): each sample and "
              "each burst uses a snapshot taken just before (not timed) and deleted after, so no standby of it "
              "exists. Standby (bootMode standby): the same snapshot again, once its standby is frozen and ready "
              "(`--standby-snapshots`). Concurrency c: c requests at once; every new sandbox must answer run_code. "
              "c=1 waits for the pool to refill between samples.")
    out = []

    def fresh_snapshot():
        return api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})[0]["snapshotID"]

    def create_one(snapshot_id, mode, standby=None):
        """One create from the snapshot, timed until it answers run_code: (server timing, client wall)."""
        wait_pool(ready=0, standby=standby)
        t0 = time.perf_counter()
        s, st, _ = api.create(snapshot_id)
        api.run_code(s, "print(x + 1)", "42")
        wall = ms(t0)
        if s.get("bootMode") != mode:
            raise DaemonError(f"create from snapshot: bootMode {s.get('bootMode')}, want {mode}")
        api.kill(s)
        return st, wall

    one_st, one_rc = [], []
    for _ in range(C["restore1"]):
        fid = fresh_snapshot()
        st, wall = create_one(fid, "restore")
        one_st.append(st)
        one_rc.append(wall)
        api.call("DELETE", f"/snapshots/{fid}")
    one = [st["total"] for st in one_st]
    api.kill(api.create(sid)[0])  # a first use: the snapshot gets its standby
    stb_st, stb_rc = [], []
    for _ in range(C["restore1"]):
        st, wall = create_one(sid, "standby", standby=sid)
        stb_st.append(st)
        stb_rc.append(wall)
    stb = [st["total"] for st in stb_st]
    fresh, _ = raw.restores(prid, image, C["raw"])
    pre, _ = raw.restores(prid, image, C["raw"], prepared=True)
    t.add("c=1 (server total)", one, pre, SEEDS["restore"], target=80)
    t.phases(one_st)
    t.add("c=1 + first run_code answered (client wall)", one_rc, fresh)
    t.add("c=1, standby ready (server total)", stb, pre, target=80)
    t.phases(stb_st)
    t.add("c=1, standby ready + first run_code answered (client wall)", stb_rc, fresh)
    t.add("raw `runsc restore` into a pre-created container (c=1)", pre)
    t.add("raw `runsc restore` into a new container (c=1)", fresh)
    for c in C["conc"]:
        totals, sts, walls, alls = [], [], [], []
        for _ in range(C["bursts"]):
            fid = fresh_snapshot()
            wait_pool()
            t0 = time.perf_counter()
            with cf.ThreadPoolExecutor(c) as ex:
                res = list(ex.map(lambda _: api.create(fid), range(c)))
            walls.append(ms(t0))
            api.run_all([r[0] for r in res], "print(x + 1)", "42")
            alls.append(ms(t0))
            totals += [r[1]["total"] for r in res]
            sts += [r[1] for r in res]
            api.kill_all([r[0] for r in res])
            api.call("DELETE", f"/snapshots/{fid}")
        rx, rwall = raw.restores(prid, image, c, parallel=True)
        t.add(f"c={c}, per request (server total)", totals, rx)
        t.phases(sts)
        t.add(f"c={c}, whole burst until all answer run_code (client wall)", alls, [rwall])
        t.add(f"raw: {c} parallel `runsc restore` into new containers, per restore", rx)
        t.add(f"raw: {c} parallel `runsc restore`, whole burst", [rwall])
    out.append(t)
    return out


def op_store(api, raw, C, parent):
    """Snapshot images through the chunk store (--store, default file://<data-dir>/store)."""
    sb, sn = parent
    t = Table("Snapshots through the chunk store",
              "The daemon's default store (file://<data-dir>/store). Each sample: a snapshot of the parent "
              "(server total), then GET /snapshots/{id} every 5 ms until uploadState is uploaded (client wall "
              "from the snapshot's answer: the background export, off the request path); then its image "
              "directory is removed (a host that lost it) and a sandbox is created from it (bootMode restore, "
              "pool empty): the import (Server-Timing import, every chunk verified) before the usual restore, "
              "until it answers run_code. The parent's first snapshot (not timed) uploaded the template's "
              "pages already, so each sample uploads only what the sandbox changed.")

    def uploaded(snapshot_id, limit=120):
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < limit:
            doc = api.call("GET", f"/snapshots/{snapshot_id}")[0]
            state = doc.get("uploadState")
            if state == "uploaded":
                return ms(t0)
            if state in (None, "failed"):
                raise DaemonError(f"snapshot {snapshot_id}: uploadState {state} ({doc.get('uploadError')})")
            time.sleep(0.005)
        raise DaemonError(f"snapshot {snapshot_id} not uploaded within {limit} s")

    uploaded(sn["snapshotID"])
    snap_tot, ups, sts, walls = [], [], [], []
    for i in range(C["restore1"]):
        api.run_code(sb, f"y = {i}")
        doc, st, _ = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})
        snap_tot.append(st["total"])
        ups.append(uploaded(doc["snapshotID"]))
        shutil.rmtree(os.path.join(DATA, "snapshots", doc["snapshotID"]))
        wait_pool(ready=0)
        t0 = time.perf_counter()
        s, st, _ = api.create(doc["snapshotID"])
        api.run_code(s, "print(x + 1)", "42")
        walls.append(ms(t0))
        if s.get("bootMode") != "restore" or "import" not in st:
            raise DaemonError(f"create from an imported snapshot: bootMode {s.get('bootMode')}, phases {st}")
        sts.append(st)
        api.kill(s)
        api.call("DELETE", f"/snapshots/{doc['snapshotID']}")
    t.add("snapshot (server total)", snap_tot)
    t.add("upload, until uploaded (client wall from the answer)", ups)
    t.add("create from it, image imported (server total)", [st["total"] for st in sts])
    nested = {k for st in sts for k in st if k.startswith("import.")}  # inside "import"
    t.phases([{k: v for k, v in st.items() if k not in nested} for st in sts])
    t.phases(sts, skip=tuple({k for st in sts for k in st} - nested), indent="  · import: ", gap=False)
    t.add("create from it + first run_code answered (client wall)", walls)
    return [t, suspended(api, C["restore1"])]


def gone(paths, limit):
    """Waits up to limit seconds until none of paths exists; says whether."""
    deadline = time.time() + limit
    while any(os.path.exists(p) for p in paths):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def tree_bytes(path):
    """Bytes of the regular files under path (hard links counted once)."""
    seen, n = set(), 0
    for d, _, files in os.walk(path):
        for f in files:
            st = os.lstat(os.path.join(d, f))
            if st.st_nlink > 1 and (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            n += st.st_size
    return n


def suspended(api, n):
    """n sandboxes, each with a small change of its own, paused to disk: what
    each costs once its image is in the chunk store and its disk copy gone,
    and waking each one until it answers run_code."""
    t = Table("Suspended sandboxes in the chunk store",
              f"{n} sandboxes from the pool, each after `y = i` in its REPL, paused with spill; once every image "
              "is uploaded and its paused/<id> directory gone (a single host drops the disk's copy), the store's "
              "growth (bytes of its files, hard links once) per sandbox, in MB (not ms); then each is woken: POST "
              "/v2/sandboxes/{id}/connect (the import, every chunk verified, then the restore) and run_code('print(y)').")
    store = os.path.join(DATA, "store")
    before = tree_bytes(store)
    sbs = []
    try:
        for i in range(n):
            wait_pool(ready=1, shells=0)
            sb = api.create()[0]
            sbs.append(sb)
            api.run_code(sb, f"y = {i}")
            api.call("POST", f"/sandboxes/{sb['sandboxID']}/pause", {"spill": True})
        dropped = gone([os.path.join(DATA, "paused", sb["sandboxID"]) for sb in sbs], 60)
        if not dropped:
            t.note += " This build keeps the disk's copy (before the drop): the wake restores it from there."
        grown = (tree_bytes(store) - before) / 2**20
        t.add("store's growth per suspended sandbox (MB)", [grown / n], unit="MB")
        t.add("their disk copies (paused/<id>, MB)", [sum(tree_bytes(os.path.join(DATA, "paused", sb["sandboxID"])) for sb in sbs) / 2**20], unit="MB")
        wake, sts = [], []
        for i, sb in enumerate(sbs):
            wait_pool(ready=0)
            t0 = time.perf_counter()
            _, st, _ = api.call("POST", f"/v2/sandboxes/{sb['sandboxID']}/connect", {})
            api.run_code(sb, "print(y)", str(i))
            wake.append(ms(t0))
            if dropped and "import" not in st:
                raise DaemonError(f"a suspended sandbox woke without an import: phases {st}")
            sts.append(st)
        t.add("wake (server total)", [st["total"] for st in sts])
        nested = {k for st in sts for k in st if k.startswith("import.")}
        t.phases([{k: v for k, v in st.items() if k not in nested} for st in sts])
        t.add("wake + run_code answered (client wall)", wake, seed="Tensorlake wake + command 80 ms p50")
    finally:
        for sb in sbs:
            api.kill(sb)
    return t


def op_fork(api, raw, C, parent):
    sb, _ = parent
    prid = rid_of(sb)
    t = Table("Fork",
              "POST /sandboxes/{id}/fork {count: n} of an idle Python sandbox (x = 41); every child must answer "
              "run_code('print(x + 1)') = 42. Raw: `runsc checkpoint --leave-running` + n parallel "
              "`runsc restore` into new containers (wall). Child phases are means per child; fork records no queue "
              "phase, so children minus a child's phases is mostly waiting for one of the start slots.")
    for n in C["fork"]:
        totals, sts, walls, alls, errs = [], [], [], [], 0
        for _ in range(C["fork_reps"][n]):
            wait_pool()
            t0 = time.perf_counter()
            res, st, wall = api.call("POST", f"/sandboxes/{sb['sandboxID']}/fork", {"count": n, "timeout": 1800})
            kids = [r["sandbox"] for r in res if r.get("sandbox")]
            errs += sum(1 for r in res if r.get("error"))
            for k in kids:
                api.owned.add(k["sandboxID"])
            api.run_all(kids, "print(x + 1)", "42")
            alls.append(ms(t0))
            totals.append(st["total"])
            sts.append(st)
            walls.append(wall)
            api.kill_all(kids)
        if errs:
            log(f"fork({n}): {errs} children failed")
        rawfork = []
        for _ in range(C["raw_fork"] if n <= 5 else 1):
            ck, img = raw.checkpoint(prid)
            try:
                rawfork.append(ck + raw.restores(prid, img, n, parallel=True)[1])
            finally:
                rm(img)
        seed = SEEDS.get(f"fork{n}", "")
        t.add(f"fork({n}) (server total)" + (f", {errs} failed children" if errs else ""), totals, rawfork, seed,
              target=80 if n == 1 else None)
        t.phases(sts, per=[n] * len(sts), gap=False)
        t.add(f"fork({n}) until all {n} answer run_code (client wall)", alls, rawfork,
              target=250 if n == 5 else None)
        t.add(f"raw fork({n}): checkpoint + {n} parallel restore{'s' * (n > 1)} (last: checkpoint {ck:.0f} ms)", rawfork)
    return [t]


def op_rollback(api, raw, C, parent):
    t = Table("Rollback",
              "POST /sandboxes/{id}/rollback {snapshotID} after the REPL changed x; the sandbox keeps its id. "
              "Client wall runs until run_code shows the snapshot's x again. No standby: each sample rolls back to "
              "a snapshot taken just before (not timed), so the daemon restores it into a prepared shell and "
              "deletes the old box async. Standby: the same snapshot every time, once its frozen standby is ready "
              "(an agent returning to one state, with think time between). Raw: `runsc restore` of the same image "
              "into a pre-created container.")
    sb = api.create()[0]
    try:
        api.run_code(sb, "x = 1")
        sn = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})[0]

        def sample(snapshot_id, standby):
            api.run_code(sb, "x = 2")
            wait_pool(ready=0, standby=snapshot_id if standby else None)
            t0 = time.perf_counter()
            _, st, _ = api.call("POST", f"/sandboxes/{sb['sandboxID']}/rollback", {"snapshotID": snapshot_id})
            api.run_code(sb, "print(x)", "1")
            return st, ms(t0)

        totals, sts, alls = [], [], []
        for _ in range(C["rollback"]):
            api.run_code(sb, "x = 1")
            fid = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})[0]["snapshotID"]
            st, wall = sample(fid, False)
            totals.append(st["total"])
            sts.append(st)
            alls.append(wall)
            api.call("DELETE", f"/snapshots/{fid}")
        s_totals, s_sts, s_alls = [], [], []
        sample(sn["snapshotID"], False)  # a first use: the snapshot gets its standby
        for _ in range(C["rollback"]):
            st, wall = sample(sn["snapshotID"], True)
            s_totals.append(st["total"])
            s_sts.append(st)
            s_alls.append(wall)
        image = os.path.join(DATA, "snapshots", sn["snapshotID"])
        pre, _ = raw.restores(rid_of(sb), image, C["raw"], prepared=True)
        t.add("rollback, no standby (server total)", totals, pre, SEEDS["rollback"], target=80)
        t.phases(sts)
        t.add("rollback, no standby + first run_code answered (client wall)", alls, pre)
        t.add("rollback onto a standby (server total)", s_totals, pre, SEEDS["rollback"], target=80)
        t.phases(s_sts)
        t.add("rollback onto a standby + first run_code answered (client wall)", s_alls, pre)
        t.add("raw `runsc restore` into a pre-created container", pre)
        api.call("DELETE", f"/snapshots/{sn['snapshotID']}")
    finally:
        api.kill(sb)
    return [t]


def op_pause(api, raw, C):
    t = Table("Pause / resume",
              "POST /sandboxes/{id}/pause (freeze: memory stays) or pause {spill: true} (state written to disk, "
              "memory freed); POST /v2/sandboxes/{id}/connect resumes. Raw: `runsc pause`/`resume` of the same "
              "container; for spill `runsc checkpoint --leave-running` of it, for resume from disk `runsc restore` of "
              "that image into a pre-created container.")
    sb = api.create()[0]
    path = f"/sandboxes/{sb['sandboxID']}"

    def resume(totals, sts, walls):
        """A timed connect, until the sandbox answers run_code."""
        t0 = time.perf_counter()
        _, st, _ = api.call("POST", f"/v2{path}/connect", {})
        api.run_code(sb, "print(x)", "7")
        walls.append(ms(t0))
        totals.append(st["total"])
        sts.append(st)

    try:
        api.run_code(sb, "x = 7")
        fz, fz_st, rm_, rm_st, rm_rc = [], [], [], [], []
        for _ in range(C["pause"]):
            _, st, _ = api.call("POST", path + "/pause", {})
            fz.append(st["total"])
            fz_st.append(st)
            if api.call("GET", path)[0].get("state") != "paused":
                raise DaemonError("sandbox not paused after pause")
            resume(rm_, rm_st, rm_rc)
        rid = rid_of(sb)
        rp, rr = zip(*[(raw.pause(rid), raw.pause(rid, "resume")) for _ in range(C["pause"])])
        api.run_code(sb, "print(x)", "7")
        sp, sp_st, rd, rd_st, rd_rc = [], [], [], [], []
        for _ in range(C["spill"]):
            wait_pool(ready=0)
            _, st, _ = api.call("POST", path + "/pause", {"spill": True})
            sp.append(st["total"])
            sp_st.append(st)
            resume(rd, rd_st, rd_rc)
        # Once its image is in the chunk store the disk's copy goes (a
        # single host): the resume imports it.
        rs, rs_st, rs_rc = [], [], []
        for _ in range(C["spill"]):
            wait_pool(ready=0)
            api.call("POST", path + "/pause", {"spill": True})
            if not gone([os.path.join(DATA, "paused", sb["sandboxID"])], 20):
                log("the spilled image stays on the disk (a build before the drop): no resume from the store")
                api.call("POST", f"/v2{path}/connect", {})
                break
            resume(rs, rs_st, rs_rc)
        rid = rid_of(sb)
        ck, pre = [], []
        for _ in range(C["spill"]):
            c, img = raw.checkpoint(rid)
            ck.append(c)
            pre += raw.restores(rid, img, 1, prepared=True)[0]
            rm(img)
        t.add("pause, freeze (server total)", fz, rp, SEEDS["pause"], target=10)
        t.phases(fz_st)
        t.add("resume from memory (server total)", rm_, rr, SEEDS["resume"], target=10)
        t.phases(rm_st)
        t.add("resume from memory + first run_code answered (client wall)", rm_rc, rr)
        t.add("pause + spill to disk (server total)", sp, ck)
        t.phases(sp_st, skip=("total", "spill"), gap=False)
        t.add("  · spill (checkpoint + bookkeeping)", [s.get("spill") for s in sp_st], ck, target=60)
        t.add("resume from disk (server total)", rd, pre, target=120)
        t.phases(rd_st)
        t.add("resume from disk + first run_code answered (client wall)", rd_rc, pre)
        t.add("resume from the chunk store, its disk copy dropped (server total)", rs, pre, target=60)
        t.phases(rs_st)
        t.add("resume from the chunk store + first run_code answered (client wall)", rs_rc, pre)
        t.add("raw `runsc pause`", rp)
        t.add("raw `runsc resume`", rr)
        t.add("raw `runsc checkpoint --leave-running` (spill's work)", ck)
        t.add("raw `runsc restore` into a pre-created container (resume from disk's work)", pre)
    finally:
        api.kill(sb)
    return [t]


# --- leak check, main -------------------------------------------------------------

def leak_check(api):
    """After everything we made is gone: what the daemon still holds."""
    time.sleep(2)  # async destroys (rollback's old boxes) finish
    recs = records()
    cs = containers()
    ready, shells = pool_state()
    other = [c["id"] for c in cs if c["id"] not in recs and c["id"] not in ready + shells]
    netns = os.listdir("/run/netns")
    mine = "cf" + hashlib.sha256(DATA.encode()).hexdigest()[:6] + "-"  # internal/manager: netPrefix
    dirs = {d: os.listdir(os.path.join(DATA, d)) for d in ("forks", "paused", "snapshots", "runtimes")
            if os.path.isdir(os.path.join(DATA, d))}
    snaps = api.call("GET", "/snapshots")[0]
    lines = [f"- runsc containers: {len(cs)} ({len(ready)} ready, {len(shells)} shells, {len(recs)} with a record,"
             f" {len(other)} other: {' '.join(c['id'] + '=' + c['status'] for c in cs if c['id'] in other)})",
             f"- sandbox records left: {len(recs)}; snapshot records left: {len(snaps)}; data dirs: " +
             ", ".join(f"{d}/ {len(v)}" for d, v in dirs.items()),
             f"- network namespaces: the daemon's {len([n for n in netns if n.startswith(mine)])} "
             f"(2 per container), the bench's raw ones {len([n for n in netns if n.startswith('cfbench-')])}"]
    if STUCK:
        lines.append(f"- the pool failed to refill {len(STUCK)} times: {STUCK[0]}")
    errs = [x for x in open(os.environ.get("CELLFORK_DAEMON_LOG", os.devnull)) if "level=ERROR" in x]
    kinds = {e.split(" msg=")[-1].split(" err=")[0]: e.strip() for e in reversed(errs)}  # first of each
    lines.append(f"- daemon log: {len(errs)} ERROR lines" + "".join(f"\n  - {k}: `{v[:400]}`" for k, v in kinds.items()))
    return lines


def counts(quick):
    return dict(dirty=[0, 50, 100, 200, 500], conc=[10, 20], fork=[1, 5, 10, 20],
                scale=[10, 50] if quick else [10, 50, 100, 200], **(
        dict(density=2, pool=5, raw=3, dirty_n=2, dirty_n_big=2, restore1=3, bursts=1,
             fork_reps={1: 3, 5: 2, 10: 1, 20: 1}, raw_fork=1, rollback=3, pause=3, spill=2) if quick else
        dict(density=3, pool=40, raw=10, dirty_n=8, dirty_n_big=4, restore1=20, bursts=2,
             fork_reps={1: 15, 5: 6, 10: 3, 20: 2}, raw_fork=3, rollback=20, pause=20, spill=8)))


def daemon_flags():
    """The global flags the daemon gives runsc, read off one of its sandbox
    processes (`runsc-sandbox FLAGS boot ...`), so raw runsc gets the same."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().decode().split("\0")
        except OSError:
            continue
        if argv[0] == "runsc-sandbox" and f"--root={ROOT}" in argv and "boot" in argv:
            return [a for a in argv[1:argv.index("boot")] if not a.startswith(("--root=", "--log=", "--log-fd="))]


OPS = ["density", "pool", "dirty", "restore", "store", "fork", "rollback", "pause", "scale"]
DEFAULT_OPS = OPS[:-1]  # scale (up to 200 sandboxes, minutes) only when asked


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer samples (~2 minutes)")
    ap.add_argument("--ops", default=",".join(DEFAULT_OPS), help="comma-separated subset of " + ",".join(OPS))
    args = ap.parse_args()
    ops = args.ops.split(",")
    if bad := set(ops) - set(OPS):
        ap.error(f"unknown ops {bad}")
    C = counts(args.quick)
    api, raw = Api(), Raw()
    wait_pool()
    if flags := daemon_flags():
        FLAGS[:] = flags
    else:
        log("could not read the daemon's runsc flags; using the built-in copy " + " ".join(FLAGS))
    t_start, load0 = time.time(), os.getloadavg()[0]
    tables, failures, parent = [], [], None
    try:
        for op in ops:
            log(f"{op} ...")
            t0 = time.time()
            try:
                if op in ("restore", "store", "fork", "rollback") and parent is None:
                    parent = make_parent(api)
                fn = globals()["op_" + op]
                tables += fn(api, raw, C, parent) if op in ("restore", "store", "fork", "rollback") else fn(api, raw, C)
            except Exception as e:  # report and go on with the next operation
                failures.append(f"- {op}: {type(e).__name__}: {e}")
                log(f"{op} FAILED: {e}")
            log(f"{op} done in {time.time() - t0:.0f}s")
    finally:
        if parent:
            api.call("DELETE", f"/snapshots/{parent[1]['snapshotID']}")
        for sid in list(api.owned):
            try:
                api.kill({"sandboxID": sid})
            except Exception as e:
                failures.append(f"- cleanup of {sid}: {e}")
        raw.close()
    leaks = leak_check(api)
    print(f"cellfork fork-first bench — {time.strftime('%Y-%m-%d %H:%M')} — {os.cpu_count()} CPUs, "
          f"load average {load0:.1f} at start / {os.getloadavg()[0]:.1f} at end, "
          f"{'quick' if args.quick else 'full'} run in {time.time() - t_start:.0f} s; times in ms, loopback client; "
          f"runsc global flags (the daemon's): `{' '.join(FLAGS)}`\n")
    for t in tables:
        print(t.render())
    print("### State after the run\n\n" + "\n".join(leaks))
    if failures:
        print("\n### Failures\n\n" + "\n".join(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
