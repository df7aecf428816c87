"""The first run_code in a sandbox from the warm pool: two daemons side by
side (two runsc builds, two daemon or agent builds), sample by sample
alternating.

Per sample and side: both pools full, a create of the default template
(which must be a pool hit: other samples are dropped and counted), a pause
of GAP seconds, then run_code('print(1)'); then the sandbox is killed. Per
sample it records the client's wall time of the run_code, the CPU the new
sandbox's cgroup used during it (cpuacct.usage: sentry, gofer, stubs), the
CPU every box of the host used meanwhile (the cellfork cgroup: the refill
that the take started is in it), and the host's busy CPU time
(/proc/stat). Several gaps are measured in the same run, the sides
alternating within each. --op exec measures the first commands.run('true')
instead (through the cellfork SDK: envd's process service, which the
agent's spare login shell serves), --op both a run_code and, right after
its answer, a commands.run('true') (the exec row).

    bench/firstrc.py [--n 10] [--gaps 0,0.5,2] [--op run_code|exec|both] A=URL,KEY,DATA_DIR,READY B=URL,KEY,DATA_DIR,READY

READY is the side's --pool-ready (what "pool full" means for it). Start
both daemons first, each with its own data directory and port. An optional
fifth field, LOGDIR, is the side's sentry debug-log directory (runsc
wrapped with --debug-log=LOGDIR/runsc.%ID%.%COMMAND%.%TIMESTAMP%.txt): lines
"cellfork-cf: k=v ..." that a diagnostic runsc build logs (cumulative
counters) are then read back and their change during each run_code
printed per sample.
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
from cellfork import Sandbox  # noqa: E402

CGROUP = "/sys/fs/cgroup/cpuacct/cellfork"


def cg_ms(path):
    try:
        return int(open(os.path.join(path, "cpuacct.usage")).read()) / 1e6
    except (OSError, ValueError):
        return float("nan")


def host_busy_ms():
    """Busy CPU time of the host (all CPUs), from /proc/stat."""
    f = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    idle = f[3] + f[4]
    return (sum(f[:8]) - idle) * 1000 / os.sysconf("SC_CLK_TCK")


def faults(cg):
    """Host page faults (minor + major) so far of the sentry and of its stubs
    (the processes that run the application), from /proc/PID/stat of the
    processes in the box's cgroup; gone processes are not counted."""
    sentry = stubs = 0
    try:
        pids = open(os.path.join(cg, "cgroup.procs")).read().split()
    except OSError:
        return float("nan"), float("nan")
    for pid in pids:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        n = int(f[7]) + int(f[9])  # minflt, majflt
        if b"boot" in cmd:
            sentry += n
        elif not cmd:
            stubs += n
    return sentry, stubs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="samples per side and gap")
    ap.add_argument("--gaps", default="0,0.5,2", help="seconds between the create's answer and the run_code")
    ap.add_argument("--op", choices=["run_code", "exec", "both"], default="run_code",
                    help="what is timed after the create: run_code('print(1)'), commands.run('true'), or both in turn")
    ap.add_argument("sides", nargs=2, help="NAME=URL,KEY,DATA_DIR,READY")
    args = ap.parse_args()
    gaps = [float(g) for g in args.gaps.split(",")]
    sides = [fork.side(a, spans=[], missed=0,
                       rows={g: {"rc": [], "cpu": [], "boxes": [], "host": [], "create": [], "server": [], "init": [], "fsentry": [], "fstubs": [], "exec": []} for g in gaps})
             for a in args.sides]
    for s in sides:
        s["logdir"] = (s["more"] or [None])[0]

    load0, t_start = os.getloadavg(), time.time()
    for g in gaps:
        i = 0
        while i < args.n:
            for s in (sides if i % 2 == 0 else sides[::-1]):
                for _ in range(5):  # a sample is a pool hit
                    fork.fill(sides)
                    fork.use(s)
                    api = s["api"]
                    st = {}
                    if args.op == "run_code":
                        sb, st, wall = api.create()
                        mode = sb.get("bootMode")
                    else:
                        t0 = time.perf_counter()
                        sdk = Sandbox.create(timeout=1800, base_url=s["url"], api_key=s["key"])
                        wall, mode = ms(t0), sdk.boot_mode
                        sb = {"sandboxID": sdk.sandbox_id, "envdAccessToken": sdk._core.created.access_token}
                    if mode == "pool":
                        break
                    s["missed"] += 1
                    api.kill(sb)
                    if args.op != "run_code":
                        sdk.close()
                else:
                    raise SystemExit(f"{s['name']}: five creates in a row were not pool hits")
                rid = fork.rid_of(sb)
                cg = os.path.join(CGROUP, rid)
                time.sleep(g)
                fs0 = faults(cg)
                c0, b0, h0 = cg_ms(cg), cg_ms(CGROUP), host_busy_ms()
                t0 = time.perf_counter()
                if args.op == "exec":
                    sdk.commands.run("true")
                else:
                    api.run_code(sb, "print(1)", "1")
                rc = ms(t0)
                s["spans"].append((g, rid, time.time() - rc / 1000, time.time()))
                c1, b1, h1 = cg_ms(cg), cg_ms(CGROUP), host_busy_ms()
                fs1 = faults(cg)
                if args.op == "both":
                    t1 = time.perf_counter()
                    sdk.commands.run("true")
                    s["rows"][g]["exec"].append(ms(t1))
                r = s["rows"][g]
                r["rc"].append(rc)
                r["cpu"].append(c1 - c0)
                r["boxes"].append(b1 - b0)
                r["host"].append(h1 - h0)
                r["create"].append(wall)
                if st:
                    r["server"].append(st["total"])
                    r["init"].append(st.get("init", 0.0))
                r["fsentry"].append(fs1[0] - fs0[0])
                r["fstubs"].append(fs1[1] - fs0[1])
                api.kill(sb)
                if args.op != "run_code":
                    sdk.close()
            i += 1
        fork.log(f"gap {g} s done, load {os.getloadavg()[0]:.1f}")
    load1 = os.getloadavg()
    print(f"first run_code after a pool hit — {time.strftime('%Y-%m-%d %H:%M')} — load average "
          f"{load0[0]:.1f} {load0[1]:.1f} {load0[2]:.1f} at start / {load1[0]:.1f} {load1[1]:.1f} {load1[2]:.1f} at end, "
          f"{time.time() - t_start:.0f} s, n = {args.n} per side and gap, sides alternating; ms "
          f"(creates that were not pool hits, dropped: " + ", ".join(f"{s['name']} {s['missed']}" for s in sides) + ")\n")
    print("| row | gap (s) | " + " | ".join(f"{s['name']} p50 (min–max)" for s in sides) + " | ratio |\n|---|---|---|---|---|")
    first = "commands.run('true')" if args.op == "exec" else "run_code('print(1)')"
    titles = (("rc", f"{first} (client wall)"), ("cpu", "· the sandbox's CPU meanwhile (cgroup)"),
              ("boxes", "· every box's CPU meanwhile (refill included)"), ("host", "· host busy CPU meanwhile (/proc/stat)"),
              ("fsentry", "· host page faults of the sentry meanwhile (count)"),
              ("fstubs", "· host page faults of its stubs meanwhile (count)"),
              ("create", "create before it (client wall)"),
              ("server", "· its server total (Server-Timing)"), ("init", "· its `init` phase (the agent's /init)"))
    if args.op == "both":
        titles += (("exec", "commands.run('true') right after that run_code (client wall)"),)
    for g in gaps:
        for key, title in titles:
            meds, cells = [], []
            if not all(s["rows"][g][key] for s in sides):
                continue  # commands.run: no Server-Timing
            for s in sides:
                v = s["rows"][g][key]
                meds.append(statistics.median(v))
                cells.append(f"{meds[-1]:.1f} ({min(v):.1f}–{max(v):.1f})")
            ratio = f"{meds[1] / meds[0]:.2f}x" if meds[0] else ""
            print(f"| {title} | {g:g} | " + " | ".join(cells) + f" | {ratio} |")
    for s in sides:
        if s["logdir"]:
            print(f"\n{s['name']}: sentry counters' change during each run_code (cellfork-cf lines)\n")
            for g, rid, a, b in s["spans"]:
                print(f"- gap {g:g}: " + cf_delta(s["logdir"], rid, a, b))
    return 0


def cf_delta(logdir, rid, a, b):
    """The change of the cellfork-cf counters between times a and b (the last
    line before each; the sentry logs every 20 ms while they change)."""
    import glob
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import runsc_ab
    lines = []
    for f in glob.glob(os.path.join(logdir, f"runsc.{rid}.*")):
        for line in open(f, errors="replace"):
            if "cellfork-cf:" in line and (t := runsc_ab.line_time(line)) is not None:
                lines.append((t, line.split("cellfork-cf:", 1)[1].strip()))
    lines.sort()

    def at(t):
        got = ""
        for lt, txt in lines:
            if lt <= t:
                got = txt
        return dict(kv.split("=", 1) for kv in got.split()) if got else {}
    x, y = at(a), at(b + 0.03)
    out = []
    for k in ("faults", "writes", "faultms", "cowimg", "cowmf", "own", "newpma", "mapcalls", "mapMB"):
        if k in y:
            out.append(f"{k} {float(y[k]) - float(x.get(k, 0)):g}")
    byx = {n: v for n, v in (p.split(":", 1) for p in x.get("byname", "").split(",") if ":" in p)}
    for p in y.get("byname", "").split(","):
        if ":" in p:
            n, v = p.split(":", 1)
            f1, w1, m1 = (float(z) for z in v.split("/"))
            f0, w0, m0 = (float(z) for z in byx.get(n, "0/0/0").split("/"))
            if f1 != f0:
                out.append(f"{n} {f1 - f0:g}/{w1 - w0:g}/{m1 - m0:.2f}ms")
    return ", ".join(out) or "(no lines)"


if __name__ == "__main__":
    sys.exit(main())
