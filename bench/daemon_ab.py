"""Two daemons side by side (say, two runsc builds or two daemon builds),
sample by sample alternating, on the restore paths that answer a request:
a create from a fresh snapshot (no standby), fork(1) and fork(5), each new
sandbox answering run_code. Per sample: the Server-Timing phases, the first
run_code after the answer, and the new sandbox's CPU (its cgroup's
cpuacct.usage from its shell's creation to its first run_code answered),
which the machine's load moves far less than the wall times.

    bench/daemon_ab.py [--n 12] [--busy | --commands | --wake] [--code CODE] A=URL,KEY,DATA_DIR[,READY] B=...

READY is the side's --pool-ready (2 by default): each sample waits until
both pools hold their ready sandboxes and all their shells.

--code sets each new sandbox's first run_code (it must print 42; the
parent holds x = 41). `import gc; gc.collect(); print(x + 1)` makes it
write memory all over the restored heap (the collector writes every
tracked object's header): copy-on-write faults of the image's pages.

--busy measures instead what the pool's refills take from running
sandboxes: a CPU-bound run_code (BUSY_CODE) in two sandboxes at once (one
per CPU of this machine) while the pool is full, then again right after as
many pool hits as the pool holds ready sandboxes (their refills, and the
shells' those restores took, start then), and how long the pool takes to
be full again.

--commands measures instead what processes cost inside a running sandbox:
fork(2) and exit in a Python loop, posix_spawn of /bin/true, a bash loop
of `sleep 0` (fork and exec), and how late a background command of the E2B
SDK (`sleep 1 && echo $EPOCHREALTIME > f`, as E2B's "pause and resume a
sandbox with completed long running process" test runs) writes its file
after 1 s past the SDK's return.

--wake measures instead the wake of a sandbox suspended in the chunk
store: a pool hit, 1 s, a pause with spill, its upload awaited (a single
host then drops `paused/<id>`), 1 s, and the connect that imports and
restores it.

Start both daemons first, each with its own data directory and port (and
`--standby-snapshots 0`, so that no standby answers a create), e.g. with
CELLFORK_RUNSC pointing at a build of scripts/build-runsc.sh. Before each
sample both pools are full, so that no refill competes with it.
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("CELLFORK_URL", "unset")
os.environ.setdefault("CELLFORK_API_KEY", "unset")
os.environ.setdefault("CELLFORK_DATA_DIR", "/nonexistent")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fork  # noqa: E402
from fork import ms  # noqa: E402

CPU = "child CPU, shell creation to first run_code (cgroup)"


def cpu_ms(sb):
    rid = fork.rid_of(sb)
    return int(open(f"/sys/fs/cgroup/cpuacct/cellfork/{rid}/cpuacct.usage").read()) / 1e6


def wake(s, quiet):
    """One wake of a sandbox suspended in the chunk store: its connect's phases."""
    api = s["api"]
    quiet(s)
    c = api.create()[0]
    time.sleep(1)
    api.call("POST", f"/sandboxes/{c['sandboxID']}/pause", {"spill": True})
    img, t0 = os.path.join(s["data"], "paused", c["sandboxID"]), time.time()
    while os.path.exists(img):
        if time.time() - t0 > 30:
            raise SystemExit(f"{s['name']}: the paused image of {c['sandboxID']} was not uploaded in 30 s")
        time.sleep(0.05)
    time.sleep(1)
    _, st, wall = api.call("POST", f"/sandboxes/{c['sandboxID']}/connect", {"timeout": 300})
    st["connect (client)"] = wall
    api.kill(c)
    return st


PROC_CODE = """
import os, subprocess, time
def per(f, n):
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) * 1e3 / n
def fork():
    p = os.fork()
    if p == 0:
        os._exit(0)
    os.waitpid(p, 0)
def spawn():
    os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], {}), 0)
# timed inside bash, so that its own start is not in it
a, b = map(float, subprocess.check_output(["bash", "-c", "n=$(seq 20); a=$EPOCHREALTIME; for i in $n; do sleep 0; done; echo $a $EPOCHREALTIME"]).split())
print(per(fork, 20), per(spawn, 20), (b - a) * 1e3 / 20)
"""


def commands(s, quiet):
    """Processes inside the side's running sandbox: fork, spawn, a bash
    fork and exec; and a background command's lateness through envd."""
    from e2b import Sandbox
    api, sb, st = s["api"], s["sb"], {}
    quiet(s)
    fk, sp, sh = (float(v) for v in api.run_code(sb, PROC_CODE).split())
    st["fork(2) and exit, Python (per process)"], st["posix_spawn /bin/true"], st["bash: sleep 0 (fork and exec)"] = fk, sp, sh
    e = Sandbox.connect(sb["sandboxID"], api_key=s["key"], api_url=s["url"], sandbox_url=s["url"])
    e.commands.run("sleep 1 && echo $EPOCHREALTIME > /tmp/late", background=True)
    t = time.time()
    time.sleep(1.5)
    st["background `sleep 1 && echo`: its write after 1 s past the return"] = (float(e.files.read("/tmp/late")) - t) * 1e3 - 1000
    return st


BUSY_CODE = "print(sum(i * i for i in range(1_500_000)) > 0)"


def busy(s, quiet):
    """Two running sandboxes' CPU-bound run_code with the pool full, then
    right after the pool's ready sandboxes were taken; and the refill's
    time."""
    api, sbs, st = s["api"], s["busy"], {}
    quiet(s)
    t0 = time.perf_counter()
    api.run_all(sbs, BUSY_CODE, "True")
    st["CPU-bound run_code in 2 sandboxes, the pool full (client)"] = ms(t0)
    quiet(s)
    hits = [api.create()[0] for _ in range(s["ready"])]
    t0 = time.perf_counter()
    api.run_all(sbs, BUSY_CODE, "True")
    st[f"the same right after {len(hits)} pool hits (client)"] = ms(t0)
    quiet(s)
    st["pool full again, from the hits' end (client)"] = ms(t0)
    for h in hits:
        api.kill(h)
    return st


# The flags that measure something else instead, in the order that picks
# one when several are given: each one's function and its table's title.
MODES = {
    "wake": (wake, "wake from the chunk store"),
    "busy": (busy, "a running sandbox while the pool refills"),
    "commands": (commands, "processes inside a running sandbox"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=12, help="rounds (fork(5) runs in every other one)")
    ap.add_argument("--busy", action="store_true", help="what the pool's refills take from a running sandbox instead")
    ap.add_argument("--commands", action="store_true", help="processes inside a running sandbox instead")
    ap.add_argument("--wake", action="store_true", help="the wake of a sandbox suspended in the chunk store instead")
    ap.add_argument("--code", default="print(x + 1)", help="each new sandbox's first run_code; must print 42")
    ap.add_argument("sides", nargs=2, help="NAME=URL,KEY,DATA_DIR[,READY]")
    args = ap.parse_args()
    # The one measurement other than the restore paths, if a flag asks for it.
    mode = next((m for m in MODES if getattr(args, m)), None)
    sides = [fork.side(a, rows={k: [] for k in ("snap", "fork1", "fork5", *MODES)}) for a in args.sides]
    for s in sides:
        s["ready"] = 2 if s["ready"] is None else s["ready"]

    def quiet(side, ready=None):
        """Waits until the other side's pool is full and this side's holds
        its shells and its ready (or the given number of ready) sandboxes."""
        for o in sides:
            if o is not side:
                fork.use(o)
                fork.wait_pool(ready=o["ready"])
        fork.use(side)
        fork.wait_pool(ready=side["ready"] if ready is None else ready)

    for s in sides:
        quiet(s)
        s["sb"] = s["api"].create()[0]
        s["api"].run_code(s["sb"], "x = 41")
        if args.busy:
            quiet(s)
            s["busy"] = [s["sb"], s["api"].create()[0]]
    load0, t_start = os.getloadavg()[0], time.time()
    for i in range(args.n):
        for s in (sides if i % 2 == 0 else sides[::-1]):
            api, sb = s["api"], s["sb"]
            fork.use(s)
            if mode:
                s["rows"][mode].append(MODES[mode][0](s, quiet))
                continue
            fid = api.call("POST", f"/sandboxes/{sb['sandboxID']}/snapshots", {})[0]["snapshotID"]
            quiet(s, ready=0)
            t0 = time.perf_counter()
            c, st, _ = api.create(fid)
            t1 = time.perf_counter()
            api.run_code(c, args.code, "42")
            st["first run_code (client)"], st["until it answers (client)"] = ms(t1), ms(t0)
            st[CPU] = cpu_ms(c)
            s["rows"]["snap"].append(st)
            api.kill(c)
            api.call("DELETE", f"/snapshots/{fid}")
            for k in (1, 5) if i % 2 == 0 else (1,):
                quiet(s)
                t0 = time.perf_counter()
                res, st, _ = api.call("POST", f"/sandboxes/{sb['sandboxID']}/fork", {"count": k, "timeout": 1800})
                kids = [r["sandbox"] for r in res]
                api.owned.update(kd["sandboxID"] for kd in kids)
                t1 = time.perf_counter()
                api.run_all(kids, args.code, "42")
                st["first run_code (client)"], st["until all answer (client)"] = ms(t1), ms(t0)
                st[CPU + ", mean"] = sum(cpu_ms(kd) for kd in kids) / len(kids)
                s["rows"][f"fork{k}"].append(st)
                api.kill_all(kids)
        fork.log(f"round {i + 1}/{args.n} done, load {os.getloadavg()[0]:.1f}")
    for s in sides:
        fork.use(s)
        for sb in s.get("busy", [s["sb"]]):
            s["api"].kill(sb)
    print(f"daemon A/B — {time.strftime('%Y-%m-%d %H:%M')} — load average {load0:.1f} at start / "
          f"{os.getloadavg()[0]:.1f} at end, {time.time() - t_start:.0f} s; p50 in ms, sides alternating\n")
    ops = ((mode, MODES[mode][1]),) if mode else (
        ("snap", "create from a fresh snapshot"), ("fork1", "fork(1)"), ("fork5", "fork(5)"))
    for op, title in ops:
        keys = []
        for s in sides:
            for st in s["rows"][op]:
                keys += [k for k in st if k not in keys]
        print(f"| {title} | " + " | ".join(f"{s['name']} (n)" for s in sides) + " | ratio |\n|---|---|---|---|")
        for k in keys:
            meds, cells = [], []
            for s in sides:
                v = [st[k] for st in s["rows"][op] if k in st]
                meds.append(statistics.median(v) if v else None)
                cells.append(f"{meds[-1]:.1f} ({len(v)})" if v else "-")
            r = f"{meds[1] / meds[0]:.2f}x" if meds[0] and meds[1] is not None else ""
            print(f"| {k} | " + " | ".join(cells) + f" | {r} |")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
