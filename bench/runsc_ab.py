"""runsc A/B: two runsc builds (or restore flags, or host huge-page settings)
doing the same work side by side, in one run, with the sentry's own
timeline of where the milliseconds went.

Each side is a runsc build directory (scripts/build-runsc.sh prints one),
optional extra `runsc restore` flags, and whether the host lets the sentry
back its memory with huge pages (shmem THP). For each side the bench boots
a parent from the daemon's own bundle (the template rootfs, the agent, the
template's pre-imports: what the daemon's warm image freezes), waits until
its code context is ready, and checkpoints it: that side's warm image. Then,
alternating A and B sample by sample so that both see the same machine:

* restore: the side's image restored into a pre-created container (`runsc
  create` first, untimed, as the daemon's prepared shells), timed to the end
  of `runsc restore`, then the agent must accept TCP;
* fork: n parallel restores into new containers (wall);
* checkpoint: `runsc checkpoint --leave-running` of a sandbox restored
  from the image and used once (a snapshot's, fork's or spill's work: what
  the daemon checkpoints is always restored), and the image's own size;
* pss: PSS of a restored, idle sandbox (sentry + gofer), 2 s after restore;
* create (not by default): `runsc create` of a new container (a prepared
  shell's making; the network namespace before it untimed), its cgroup's
  CPU 1 s later (sentry, gofer, prewarmer), and steps of the sentry's boot
  timer, which it logs once started (the side's image is restored into
  the shell after, untimed): from its start to its parent's
  notification, and the steps that once waited on threads (the bounding
  set, the fd table) or allocated (the trace points);
* pooled (not by default): what a sandbox from the daemon's warm pool
  does: the side's image restored into a pre-created container and handed
  off (POST /init), left idle for --idle seconds, then its first run_code
  `print(1)`, timed, with the sandbox cgroup's CPU during it. The image's
  first restore, before the samples, is a warm-up that hands off and runs
  code within the 5 s in which the sentry records the image's working set
  (0008), as the daemon's warm-up of each new warm image does;
* diff (not by default): a leave-running checkpoint of the restored child
  (a diff image, referencing the side's image; untimed), restored into a
  pre-created container, then its first run_code: what create from a
  snapshot, fork, rollback and resume from disk restore, each the first
  restore of its image.
* diffinit (not by default): the same diff image restored, then what the
  daemon does with it: the hand-off (`POST /init`, timed: the daemon's
  `init` phase) and the first run_code (timed). The image's first restore,
  before the samples, is the warm-up of `pooled`, so that the child whose
  checkpoint is the diff image was restored as the daemon's pool restores
  (premap, 0013).

Every runsc call logs to a debug-log directory; the tables take their
phases from the sentry's log lines (kernel-state decode, page loading,
zero scan, kernel save...), and one restore timeline per side (gVisor's
"Timer for Restore" table) is printed as is.

    scripts/bench.sh --suite runsc --a <build dir> --b <build dir> [--b-flags=--background] [--thp b] [--n 10]

Needs root and a daemon (bench.sh starts one: CELLFORK_URL, CELLFORK_DATA_DIR).
Huge pages: --thp a|b sets /sys/kernel/mm/transparent_hugepage/shmem_enabled
to "advise" and defrag to "defer" while that side's sandboxes start, and puts
the host's settings back after each (gVisor uses huge pages only if both
allow it: runsc/boot/loader.go createMemoryFile).
"""

import argparse
import concurrent.futures as cf
import contextlib
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fork  # noqa: E402
from fork import Raw, Table, ms, dir_mb, rm, wait_pool, daemon_flags, pool_state, spec_of, log  # noqa: E402

THP = "/sys/kernel/mm/transparent_hugepage/"


class Side:
    def __init__(self, name, build, flags, thp):
        self.name, self.thp = name, thp
        self.bin = os.path.join(build, "runsc") if os.path.isdir(build) else build
        out = subprocess.run([self.bin, "--version"], capture_output=True, text=True, check=True).stdout
        self.build = out.split("\n")[0].removeprefix("runsc version ")
        self.flags = flags.split() if flags else []
        # CELLFORK_AB_KEEP_LOGS=DIR keeps the sentry logs there after the run.
        self.logs = os.path.join(os.environ.get("CELLFORK_AB_KEEP_LOGS") or fork.DATA, f"ab-logs-{name}")
        os.makedirs(self.logs, exist_ok=True)
        self.raw = Raw(self.bin, [f"--debug-log={self.logs}/runsc.%ID%.%COMMAND%.%TIMESTAMP%.txt"])
        self.parent = self.image = self.spec = self.child = None

    def label(self):
        extra = " ".join(self.flags) + (" +THP" if self.thp else "")
        return f"{self.name}: {self.build.split('+')[-1]}{' ' + extra if extra else ''}"


@contextlib.contextmanager
def thp(on):
    """Host shmem THP as gVisor wants it for huge pages, for the block."""
    if not on:
        yield
        return
    old = {f: open(THP + f).read().split("[")[1].split("]")[0] for f in ("shmem_enabled", "defrag")}
    try:
        open(THP + "shmem_enabled", "w").write("advise")
        open(THP + "defrag", "w").write("defer")
        yield
    finally:
        for f, v in old.items():
            open(THP + f, "w").write(v)


def netns_run(raw, cid, code):
    """Runs Python code in the container's router namespace (it reaches the sandbox at 10.88.0.2)."""
    ns = raw.live[cid][0]
    return subprocess.run(["ip", "netns", "exec", ns + "-r", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=300)


def boot_parent(side, src):
    """Boots the side's parent from the daemon's bundle with the template's
    pre-imports and waits for its default code context."""
    spec = json.loads(json.dumps(spec_of(src)))
    env = [e for e in spec["process"]["env"] if not e.startswith("CELLFORK_PREIMPORT=")]
    spec["process"]["env"] = env + ["CELLFORK_PREIMPORT=numpy,pandas,matplotlib"]
    with thp(side.thp):
        cid = side.raw.setup(spec, prepared=False)
        b = side.raw.live[cid][1]
        with open(os.path.join(b, "console.log"), "a") as out:
            side.raw.runsc(side.raw.root, "run", "--detach", f"--bundle={b}", cid, out=out,
                           log_to=os.path.join(b, "runsc.log"))
    p = netns_run(side.raw, cid, """
import http.client, json, time
t0 = time.time()
while True:
    try:
        c = http.client.HTTPConnection('10.88.0.2', 49983, timeout=5)
        c.request('POST', '/init', json.dumps({'envVars': {}, 'defaultUser': 'user'}), {'Content-Type': 'application/json'})
        assert c.getresponse().status // 100 == 2
        break
    except OSError:
        if time.time() - t0 > 60: raise
        time.sleep(0.1)
c = http.client.HTTPConnection('10.88.0.2', 49999, timeout=180)
c.request('GET', '/ready')
print(c.getresponse().status)
""")
    if p.returncode or p.stdout.strip() != "204":
        raise RuntimeError(f"{side.name}: parent not ready: {p.stdout} {p.stderr[-800:]}")
    side.parent, side.spec = cid, spec


# --- the sentry's log ----------------------------------------------------------

TS = re.compile(r"^[IWDE](\d{4} \d\d:\d\d:\d\d\.\d{6})")
DUR = r"([0-9.]+(?:µs|ms|s|m))"
# (name, regex, what to take: a duration in the line)
PHASES_RESTORE = [
    ("kernel-state decode (Kernel load took)", re.compile(r"Kernel load took \[" + DUR)),
    ("whole kernel load, with VFS and network (Overall load took)", re.compile(r"Overall load took \[" + DUR)),
    ("page loading (async, total)", re.compile(r"Async page loading completed in " + DUR)),
    ("page metadata loaded in", re.compile(r"loaded metadata in " + DUR)),
    ("premap, after the restore reported success (0013, 0014)", re.compile(r"Premapped \d+ pmas for \d+ recorded fault ranges in " + DUR)),
]
PREMAPPED = re.compile(r"Premapped (\d+) pmas for")
PHASES_SAVE = [
    ("stop time (Stopping time for save took)", re.compile(r"Stopping time for save took \[" + DUR)),
    ("evictions (Evictions for save took)", re.compile(r"Evictions for save took \[" + DUR)),
    ("drop host-file mappings (Invalidating unsavable mappings took)", re.compile(r"Invalidating unsavable mappings took \[" + DUR)),
    ("prepare filesystems (Preparing filesystems for save took)", re.compile(r"Preparing filesystems for save took \[" + DUR)),
    ("  gofer: evict cached dentries", re.compile(r"evicting cached dentries took \[" + DUR)),
    ("  gofer: flush files", re.compile(r"flushing written files \[" + DUR)),
    ("zero scan (save scanning took)", re.compile(r"save scanning took " + DUR)),
    ("kernel-state encode (Kernel save took)", re.compile(r"Kernel save took \[" + DUR)),
    ("page writes (async, total)", re.compile(r"Async page saving completed in " + DUR)),
    ("whole save (Overall save took)", re.compile(r"Overall save took \[" + DUR)),
]
ADOPTED = re.compile(r"Image \S+: (\d+) bytes of memory mapped copy-on-write")


def to_ms(s):
    for unit, f in (("µs", 1e-3), ("ms", 1.0), ("m", 60e3), ("s", 1e3)):
        if s.endswith(unit):
            return float(s[: -len(unit)]) * f
    return float(s)


def logs_of(side, cid, kinds=("boot",)):
    """The side's debug logs of container cid's runsc commands of the given kinds."""
    return [f for f in glob.glob(os.path.join(side.logs, f"runsc.{cid}.*"))
            if any(f".{k}." in os.path.basename(f) for k in kinds)]


def line_time(line):
    """The wall-clock time of a log line (glog prefix: I1124 11:07:54.885514), or None."""
    m = TS.match(line)
    if not m:
        return None
    g = m.group(1)  # MMDD HH:MM:SS.ffffff
    return time.mktime(time.strptime(time.strftime("%Y") + g[:13], "%Y%m%d %H:%M:%S")) + float(g[13:])


def phases_in(files, phases, since=0.0):
    """The phases' durations in the files' lines logged at or after since."""
    got = {}
    for f in files:
        for line in open(f, errors="replace"):
            if since and (lt := line_time(line)) is not None and lt < since:
                continue
            for name, rx in phases:
                m = rx.search(line)
                if m and name not in got:
                    got[name] = to_ms(m.group(1))
            if (m := ADOPTED.search(line)) and phases is PHASES_RESTORE:
                got["memory mapped from the image, not loaded (MB)"] = int(m.group(1)) / 2**20
            if (m := PREMAPPED.search(line)) and phases is PHASES_RESTORE:
                got["pmas premapped"] = int(m.group(1))
    return got


FIRST_EXEC = """
import http.client, json, time
t0 = time.perf_counter()
c = http.client.HTTPConnection('10.88.0.2', 49999, timeout=60)
c.request('POST', '/execute', json.dumps({'code': 'x = sum(range(1000)); print(x)'}), {'Content-Type': 'application/json'})
body = c.getresponse().read().decode()
assert '499500' in body, body
print((time.perf_counter() - t0) * 1000)
"""


INIT = """
import http.client, json
c = http.client.HTTPConnection('10.88.0.2', 49983, timeout=30)
c.request('POST', '/init', json.dumps({'envVars': {}, 'defaultUser': 'user', 'defaultWorkdir': '/home/user'}),
          {'Content-Type': 'application/json'})
r = c.getresponse()
assert r.status // 100 == 2, r.status
"""


def hand_off(side, cid):
    """POST /init to a restored sandbox's agent, as the daemon's hand-off;
    its time inside the router netns (ms). The modules are imported before
    the clock starts: the import of http.client alone took about 40 ms on
    the host."""
    p = netns_run(side.raw, cid, "import time, http.client, json\nt0 = time.perf_counter()\n" + INIT
                  + "print((time.perf_counter() - t0) * 1000)\n")
    if p.returncode:
        raise RuntimeError(f"{side.name}: /init failed: {p.stderr[-500:]}")
    return float(p.stdout.strip())


def first_exec(side, cid, code=None):
    """Time of the first run_code of a restored sandbox (its REPL's first
    touches of memory after the restore), measured inside its router netns."""
    src = FIRST_EXEC
    if code is not None:
        src = src.replace("'x = sum(range(1000)); print(x)'", repr(code)).replace("'499500'", "''")
    p = netns_run(side.raw, cid, src)
    if p.returncode:
        raise RuntimeError(f"{side.name}: first run_code failed: {p.stderr[-500:]}")
    return float(p.stdout.strip())


def restore_timer(files):
    """gVisor's restore timeline table, as logged (the last one)."""
    for f in files:
        text = open(f, errors="replace").read()
        end = text.rfind("---- End of Restore timing information ----")
        if end < 0:
            continue
        start = max(text.rfind("\nI", 0, end), 0)
        body = text[start:end].strip()
        return body.split("] ", 1)[-1] if "] " in body.split("\n", 1)[0] else body
    return ""


def gomaxprocs(files):
    vals = []
    for f in files:
        vals += [int(x) for x in re.findall(r"GOMAXPROCS to (\d+)", open(f, errors="replace").read())]
    return max(vals) if vals else None


# --- operations -------------------------------------------------------------------

def restore_into(side, cid, image, flags=()):
    """Restores image into the pre-created container cid: the restore's
    time and the container's CPU before it."""
    b = side.raw.live[cid][1]
    cpu0 = cpu_ms(cid)
    with open(os.path.join(b, "console.log"), "a") as out:
        t = side.raw.runsc(side.raw.root, "restore", "--detach", *side.flags, *flags,
                           f"--image-path={image}", f"--bundle={b}", cid, out=out,
                           log_to=os.path.join(b, "runsc.log"))
    side.raw.check(cid)
    return t, cpu0


def one_restore(side, flags=(), image=None):
    """One timed restore of the side's image (or of image) into a pre-created container."""
    with thp(side.thp):
        cid = side.raw.setup(side.spec, prepared=True)
    try:
        t, cpu0 = restore_into(side, cid, image or side.image, flags)
        fe = first_exec(side, cid)
        cpu1 = cpu_ms(cid)
        time.sleep(0.5)  # background page loading finishes, the timer logs
        files = logs_of(side, cid)
        ph = phases_in(files, PHASES_RESTORE)
        dec, whole = PHASES_RESTORE[0][0], PHASES_RESTORE[1][0]
        if dec in ph and whole in ph:
            ph["VFS and network restore (whole kernel load minus decode)"] = ph[whole] - ph[dec]
        ph["first run_code after the restore (ms)"] = fe
        if cpu0 is not None and cpu1 is not None:
            ph["sandbox CPU, restore + first run_code (ms)"] = cpu1 - cpu0
        return t, ph, files, cid
    except BaseException:
        side.raw.delete(cid)
        raise


BOOT_STEPS = ("bounding set trimmed on all threads", "host FD table grown", "seccheck initialized",
              "systrap source process created")
BOOT_STEP = re.compile(r"├─ (.+?): ([0-9][0-9 .]*(?:µs|ms|s))$")


def boot_steps(files):
    """The sentry's boot timer ("Timer for runsc boot"): BOOT_STEPS' times,
    and the sum of its steps up to "notifying parent" (ms)."""
    got, total = {}, 0.0
    for f in files:
        for line in open(f, errors="replace"):
            if not (m := BOOT_STEP.search(line.rstrip())):
                continue
            name, t = m.group(1), to_ms(m.group(2).replace(" ", ""))
            total += t
            if name in BOOT_STEPS:
                got[f"boot: {name}"] = t
            if name == "notifying parent":
                got["boot: its start to the parent's notification"] = total
                return got
    return got


def one_create(side):
    """`runsc create` of a new container: its time, its cgroup's CPU 1 s
    later, and the sentry's boot steps."""
    cid = side.raw.setup(side.spec, prepared=False)
    try:
        with thp(side.thp):
            t = side.raw.create(cid)
        time.sleep(1)
        c = cpu_ms(cid)
        # The sentry logs its boot timer once it starts: restore the side's
        # image into the shell (untimed).
        restore_into(side, cid, side.image)
        time.sleep(0.5)  # the timer is logged once the kernel runs
        ph = boot_steps(logs_of(side, cid))
        if c is not None:
            ph["its cgroup's CPU 1 s after (sentry, gofer; ms)"] = c
        return t, ph
    finally:
        side.raw.delete(cid)


def cpu_ms(cid):
    """CPU time (ms) the container's cgroup has used (sentry, gofer, stubs;
    Raw.setup's cgroupsPath), or None. Less sensitive to the machine's load
    than wall time."""
    try:
        return int(open(f"/sys/fs/cgroup/cpuacct/cellfork-bench/{cid}/cpuacct.usage").read()) / 1e6
    except (OSError, ValueError):
        return None


def fork_n(side, n):
    with thp(side.thp):
        cids = [side.raw.setup(side.spec, prepared=False) for _ in range(n)]
    try:
        t0 = time.perf_counter()
        with cf.ThreadPoolExecutor(n) as ex:
            list(ex.map(lambda c: side.raw.restore(c, side.image), cids))
        wall = ms(t0)
        side.raw.check(cids[0])
        return wall
    finally:
        side.raw.delete_all(cids)


def raw_checkpoint(side, cid):
    """`runsc checkpoint --leave-running` of a container in the side's own root."""
    img = tempfile.mkdtemp(prefix="img-", dir=side.raw.tmp)
    t = side.raw.runsc(side.raw.root, "checkpoint", "--leave-running", "--compression=none", f"--image-path={img}", cid)
    return t, img


def checkpoint(side):
    """A leave-running checkpoint of the side's restored child; its own size."""
    t0 = time.time()
    t, img = raw_checkpoint(side, side.child)
    size = sum(os.path.getsize(f) for f in glob.glob(os.path.join(img, "*"))
               if not os.path.basename(f).startswith("base-")) / 2**20
    rm(img)
    time.sleep(0.2)
    return t, size, phases_in(logs_of(side, side.child), PHASES_SAVE, since=t0 - 0.5)


def diff_restore(side):
    """A diff image restored: a leave-running checkpoint of the side's
    restored, used child (it references the side's image: what create from
    a snapshot, fork, rollback and resume from disk restore, each for the
    first time), restored into a pre-created container, then its first
    run_code. The checkpoint is not timed."""
    _, img = raw_checkpoint(side, side.child)
    try:
        t, ph, _, cid = one_restore(side, image=img)
        side.raw.delete(cid)
        return t, ph
    finally:
        rm(img)


def diff_init(side):
    """A diff image (as diff_restore's) restored into a pre-created
    container (timed), handed off (/init, timed) and its first run_code
    (timed), with the sandbox's CPU from the restore to the end of it."""
    _, img = raw_checkpoint(side, side.child)
    try:
        with thp(side.thp):
            cid = side.raw.setup(side.spec, prepared=True)
        try:
            t, cpu0 = restore_into(side, cid, img)
            ini = hand_off(side, cid)
            fe = first_exec(side, cid)
            cpu1 = cpu_ms(cid)
            ph = {"/init right after the restore (ms)": ini, "first run_code after /init (ms)": fe,
                  "/init + first run_code (ms)": ini + fe}
            if cpu0 is not None and cpu1 is not None:
                ph["sandbox CPU, restore + /init + first run_code (ms)"] = cpu1 - cpu0
            time.sleep(0.2)  # the sentry logs its premap
            logged = phases_in(logs_of(side, cid), PHASES_RESTORE)
            for k in (PHASES_RESTORE[-1][0], "pmas premapped"):
                if k in logged:
                    ph[k] = logged[k]
            return t, ph
        finally:
            side.raw.delete(cid)
    finally:
        rm(img)


def warm_up(side):
    """The image's first restore, as the daemon's warm-up: handed off and
    running code within the sentry's working-set window (0008), then gone."""
    cid = side.raw.setup(side.spec, prepared=True)
    try:
        side.raw.restore(cid, side.image)
        side.raw.check(cid)
        hand_off(side, cid)
        first_exec(side, cid, "print(sum(range(10)))")
        time.sleep(5.5)
    finally:
        side.raw.delete(cid)


def pooled(side, idle):
    """A pooled sandbox's first run_code: restored (untimed), handed off,
    idle for idle seconds, then print(1); its time, the sandbox's CPU during
    it, and the sentry's diagnostic counters, if its build logs them."""
    with thp(side.thp):
        cid = side.raw.setup(side.spec, prepared=True)
    try:
        side.raw.restore(cid, side.image)
        side.raw.check(cid)
        hand_off(side, cid)
        time.sleep(idle)
        cpu0, t0 = cpu_ms(cid), time.time()
        fe = first_exec(side, cid, "print(1)")
        cpu1, t1 = cpu_ms(cid), time.time()
        ph = {"first run_code of a pooled sandbox (ms)": fe}
        if cpu0 is not None and cpu1 is not None:
            ph["sandbox CPU during it (ms)"] = cpu1 - cpu0
        time.sleep(0.1)
        ph.update(cf_counters(side.logs, cid, t0, t1))
        return fe, ph
    finally:
        side.raw.delete(cid)


CF = re.compile(r"cellfork-cf: (.*)$")


def cf_counters(logdir, cid, a, b):
    """The change between times a and b of the counters a diagnostic sentry
    build logs ("cellfork-cf: k=v ...", cumulative, every 20 ms while they
    change); empty for other builds."""
    lines = []
    for f in glob.glob(os.path.join(logdir, f"runsc.{cid}.*")):
        for line in open(f, errors="replace"):
            if (m := CF.search(line)) and (t := line_time(line)) is not None:
                lines.append((t, dict(kv.split("=", 1) for kv in m.group(1).split())))
    lines.sort(key=lambda x: x[0])

    def at(t):
        got = {}
        for lt, kv in lines:
            if lt <= t:
                got = kv
        return got
    x, y = at(a), at(b + 0.03)
    out = {}
    for k, v in y.items():
        if k == "byname":
            old = dict(p.split(":", 1) for p in x.get("byname", "").split(",") if ":" in p)
            for p in v.split(","):
                if ":" in p:
                    n, c = p.split(":", 1)
                    f1, w1, m1 = (float(z) for z in c.split("/"))
                    f0, w0, m0 = (float(z) for z in old.get(n, "0/0/0").split("/"))
                    out[f"sentry faults of {n}"] = f1 - f0
                    out[f"  their time in the sentry, {n} (ms)"] = m1 - m0
        else:
            out[f"sentry {k}"] = float(v) - float(x.get(k, 0))
    return out


def pss(side):
    cid = side.raw.setup(side.spec, prepared=False)
    try:
        with thp(side.thp):
            side.raw.restore(cid, side.image)
        side.raw.check(cid)
        time.sleep(2)
        return fork.pss_mb([cid])[cid], fork.uss_mb([cid])[cid]
    finally:
        side.raw.delete(cid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--a", required=True, help="side A: a build directory (scripts/build-runsc.sh) or a runsc binary")
    ap.add_argument("--b", required=True, help="side B, likewise")
    ap.add_argument("--a-flags", default="", help="extra `runsc restore` flags of side A")
    ap.add_argument("--b-flags", default="", help="extra `runsc restore` flags of side B")
    ap.add_argument("--thp", choices=["a", "b", "both", "none"], default="none", help="which side runs with host shmem huge pages")
    ap.add_argument("--n", type=int, default=10, help="samples per side and operation")
    ap.add_argument("--fork", type=int, default=5, help="parallel restores in the fork row")
    ap.add_argument("--ops", default="restore,fork,checkpoint,pss", help="comma-separated subset of restore,fork,checkpoint,pss,diff,pooled,diffinit,create")
    ap.add_argument("--idle", type=float, default=2.0, help="seconds a pooled sandbox idles after its hand-off")
    args = ap.parse_args()
    ops = args.ops.split(",")
    sides = [Side("A", args.a, args.a_flags, args.thp in ("a", "both")),
             Side("B", args.b, args.b_flags, args.thp in ("b", "both"))]
    wait_pool(ready=1, shells=0)
    if flags := daemon_flags():
        fork.FLAGS[:] = flags
    src = (pool_state()[0] or [None])[0]
    if src is None:
        raise SystemExit("the daemon has no ready sandbox to take a bundle from")
    t_start, load0 = time.time(), os.getloadavg()[0]
    res = {s.name: {"create": [], "cphase": [], "restore": [], "rphase": [], "diff": [], "dphase": [], "fork": [], "ckpt": [], "size": [], "sphase": [], "pss": [], "uss": [], "pooled": [], "pphase": [], "dinit": [], "diphase": []} for s in sides}
    timers, procs = {}, {}
    try:
        for s in sides:
            log(f"booting parent {s.label()}")
            boot_parent(s, src)
            t, img = raw_checkpoint(s, s.parent)
            s.image = img
            log(f"{s.name}: image {dir_mb(img):.0f} MB")
            if "pooled" in ops or "diffinit" in ops:
                warm_up(s)
            if "checkpoint" in ops or "diff" in ops or "diffinit" in ops:
                # The sandbox the checkpoint samples save: restored, used.
                with thp(s.thp):
                    s.child = s.raw.setup(s.spec, prepared=False)
                s.raw.restore(s.child, s.image)
                if "diffinit" in ops:
                    hand_off(s, s.child)  # as the daemon's sandboxes that are snapshotted
                first_exec(s, s.child)
        for i in range(args.n):
            order = sides if i % 2 == 0 else sides[::-1]
            for s in order:
                r = res[s.name]
                if "create" in ops:
                    t, ph = one_create(s)
                    r["create"].append(t)
                    r["cphase"].append(ph)
                if "restore" in ops:
                    t, ph, files, cid = one_restore(s)
                    r["restore"].append(t)
                    r["rphase"].append(ph)
                    if i == args.n // 2:
                        timers[s.name] = restore_timer(files)
                        procs[s.name] = gomaxprocs(files)
                    s.raw.delete(cid)
                if "diff" in ops:
                    t, ph = diff_restore(s)
                    r["diff"].append(t)
                    r["dphase"].append(ph)
                if "diffinit" in ops:
                    t, ph = diff_init(s)
                    r["dinit"].append(t)
                    r["diphase"].append(ph)
                if "pooled" in ops:
                    t, ph = pooled(s, args.idle)
                    r["pooled"].append(t)
                    r["pphase"].append(ph)
                if "checkpoint" in ops:
                    t, size, ph = checkpoint(s)
                    r["ckpt"].append(t)
                    r["size"].append(size)
                    r["sphase"].append(ph)
                if "fork" in ops and i < max(2, args.n // 3):
                    r["fork"].append(fork_n(s, args.fork))
                if "pss" in ops and i < 3:
                    p, u = pss(s)
                    r["pss"].append(p)
                    r["uss"].append(u)
            log(f"round {i + 1}/{args.n} done")
    finally:
        for s in sides:
            s.raw.close()
    print(f"runsc A/B — {time.strftime('%Y-%m-%d %H:%M')} — {os.cpu_count()} CPUs, load average {load0:.1f} at start / "
          f"{os.getloadavg()[0]:.1f} at end, {time.time() - t_start:.0f} s; times in ms, A and B alternating sample by sample\n")
    for s in sides:
        print(f"- {s.label()}  (`{s.build}`{', restore flags ' + ' '.join(s.flags) if s.flags else ''})")
    print()
    t = Table("Side by side", "Ratio: B p50 / A p50.")
    a, b = res["A"], res["B"]

    def pair(name, key, unit="ms"):
        if a[key] or b[key]:
            t.add(f"A: {name}", a[key], unit=unit)
            t.add(f"B: {name}", b[key], a[key] or None, unit=unit)

    def phase_pair(key, phases):
        names = [n for n, _ in phases] + sorted({k for r in (a[key] + b[key]) for k in r} - {n for n, _ in phases})
        for name in names:
            xa = [p[name] for p in a[key] if name in p]
            xb = [p[name] for p in b[key] if name in p]
            if xa or xb:
                t.add(f"  · A: {name}", xa)
                t.add(f"  · B: {name}", xb, xa or None)

    pair("`runsc create` of a new container (a prepared shell)", "create")
    phase_pair("cphase", [])
    pair("`runsc restore` into a pre-created container", "restore")
    phase_pair("rphase", PHASES_RESTORE)
    pair("`runsc restore` of a diff image (a checkpoint of a restored sandbox) into a pre-created container", "diff")
    phase_pair("dphase", PHASES_RESTORE)
    pair("`runsc restore` of a diff image, then /init and its first run_code", "dinit")
    phase_pair("diphase", [])
    pair(f"first run_code of a pooled sandbox (restored, handed off, idle {args.idle:g} s)", "pooled")
    phase_pair("pphase", [])
    pair(f"{args.fork} parallel `runsc restore` into new containers (wall)", "fork")
    pair("`runsc checkpoint --leave-running` of a restored sandbox", "ckpt")
    phase_pair("sphase", PHASES_SAVE)
    pair("checkpoint's own size, without the images it references (MB)", "size", unit="MB")
    pair("PSS of a restored idle sandbox (MB; sentry, gofer, stubs)", "pss", unit="MB")
    pair("  its own pages, USS (MB)", "uss", unit="MB")
    print(t.render())
    for s in sides:
        if s.name in timers:
            print(f"#### {s.label()}: one restore's timeline (sentry log; GOMAXPROCS peaked at {procs.get(s.name)})\n")
            print("```\n" + (timers[s.name] or "(no 'Timer for Restore' in the sentry log)") + "\n```\n")
    for s in sides:
        if not os.environ.get("CELLFORK_AB_KEEP_LOGS"):
            shutil.rmtree(s.logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
