"""runsc profile: where a restore's CPU goes, from the sentry's own CPU
profile and its per-type decode stats.

One runsc build (a build directory from scripts/build-runsc.sh) boots a
parent from the daemon's bundle (the template rootfs, the agent, the
template's pre-imports, as bench/runsc_ab.py does) and checkpoints it: a
warm image. Then n times: a pre-created container (`runsc create`, with
`--profile --profile-cpu`), a restore of that image (or, with --diff, of a
diff image: a leave-running checkpoint of a restored, used sandbox), its
agent's TCP port, its first run_code (unless --no-exec), and the container's
init killed so that the sentry exits and writes its profile. The profiles
(one per sandbox, its whole life) are merged into one (`go tool pprof
-proto`), and the sentry's "Kernel load stats" (time and count per type of
the kernel-state decode) are summed over the samples. With --checkpoints K,
each restored sandbox is also checkpointed K times (leave-running, after
its first run_code): the encode's timings are printed and the profile's
top is also focused on the save (state.Save, Kernel.SaveTo).

    scripts/bench.sh --suite profile --build <build dir> [--n 20] [--diff] [--checkpoints K] [--out DIR]

The build's CPU profile rate is Go's default 100 Hz unless the build says
otherwise (a 40 ms decode is 4 samples at 100 Hz: use n >= 20, or a build
with a higher rate). Output: DIR/merged.pb.gz, DIR/decode-stats.txt, the
top of the profile focused on the decode (state.Load) and on the whole
restore (Kernel.LoadFrom), and the sentry's timing lines per sample.
Needs root and a daemon (bench.sh starts one).
"""

import argparse
import glob
import os
import re
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fork  # noqa: E402
import runsc_ab  # noqa: E402
from fork import log, pool_state, wait_pool, daemon_flags  # noqa: E402

STAT_ROW = re.compile(r"^\s*([0-9.]+(?:µs|ms|s|ns|m)|[0-9.]+m[0-9.]+s)\s*\|\s*(\d+)\s*\|\s*\S+\s*\|\s*(\S.*)$")
TIMES = [
    ("kernel-state encode", re.compile(r"Kernel save took \[" + runsc_ab.DUR)),
    ("whole save", re.compile(r"Overall save took \[" + runsc_ab.DUR)),
    ("kernel-state decode", re.compile(r"Kernel load took \[" + runsc_ab.DUR)),
    ("whole kernel load", re.compile(r"Overall load took \[" + runsc_ab.DUR)),
    ("CPUID load", re.compile(r"CPUID load took \[" + runsc_ab.DUR)),
]


def dur_ms(s):
    if s.endswith("ns"):
        return float(s[:-2]) / 1e6
    return runsc_ab.to_ms(s)


def decode_stats(files):
    """{type: [total ms, count]} from the last "Kernel load stats" table in files."""
    got = {}
    for f in files:
        lines = open(f, errors="replace").read().split("\n")
        for i, line in enumerate(lines):
            if "Kernel load stats:" not in line:
                continue
            got = {}
            for row in lines[i + 1:]:
                m = STAT_ROW.match(row)
                if m:
                    got[m.group(3).strip()] = [dur_ms(m.group(1)), int(m.group(2))]
                elif row.startswith(("I", "W", "D", "E")) and re.match(r"^[IWDE]\d{4} ", row):
                    break
    return got


def sandbox_pid(side, cid):
    """The pid of the container's sandbox process (`runsc state`), or None."""
    st = subprocess.run([side.bin, f"--root={side.raw.root}", *fork.FLAGS, "state", cid],
                        capture_output=True, text=True)
    m = re.search(r'"pid":\s*(\d+)', st.stdout)
    return int(m.group(1)) if m else None


def kill_and_wait(side, cid, timeout=30):
    """Kills the container's init so that the sandbox exits cleanly (its
    profile is written on exit), and waits for the sandbox process to go."""
    pid = sandbox_pid(side, cid)
    subprocess.run([side.bin, f"--root={side.raw.root}", *fork.FLAGS, "kill", cid, "KILL"], capture_output=True)
    deadline = time.time() + timeout
    while pid and time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", required=True, help="a build directory (scripts/build-runsc.sh) or a runsc binary")
    ap.add_argument("--n", type=int, default=20, help="restores to profile")
    ap.add_argument("--diff", action="store_true", help="restore a diff image (a checkpoint of a restored, used sandbox)")
    ap.add_argument("--no-exec", action="store_true", help="no run_code after the restore")
    ap.add_argument("--out", default="/tmp/cellfork-profile", help="where the merged profile and stats go")
    ap.add_argument("--no-profile", action="store_true", help="no CPU profile (only the sentry's timings and decode stats)")
    ap.add_argument("--checkpoints", type=int, default=0, help="after each restore and its first run_code, this many "
                    "leave-running checkpoints of it (the profile then also shows the save: Kernel.SaveTo)")
    ap.add_argument("--attach", default="", help="a command run beside each restore, from just before it to after its "
                    "first run_code, then stopped with SIGINT; {pid} is the sandbox process, {out} the output directory, "
                    "{cid} the container (e.g. 'perf record -g -p {pid} -o {out}/perf.{cid}.data')")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for f in glob.glob(os.path.join(args.out, "cpu.*")):
        os.remove(f)
    side = runsc_ab.Side("P", args.build, "", False)
    if not args.no_profile:
        side.raw.extra += ["--profile", f"--profile-cpu={args.out}/cpu.%ID%.pprof"]
    wait_pool(ready=1, shells=0)
    if flags := daemon_flags():
        fork.FLAGS[:] = flags
    src = (pool_state()[0] or [None])[0]
    if src is None:
        raise SystemExit("the daemon has no ready sandbox to take a bundle from")
    load0, t_start = os.getloadavg()[0], time.time()
    times, stats, samples = {k: [] for k, _ in TIMES}, {}, []
    try:
        log(f"booting parent {side.label()}")
        runsc_ab.boot_parent(side, src)
        _, image = runsc_ab.raw_checkpoint(side, side.parent)
        if args.diff:
            child = side.raw.setup(side.spec, prepared=False)
            side.raw.restore(child, image)
            runsc_ab.first_exec(side, child)
            _, image = runsc_ab.raw_checkpoint(side, child)
            side.raw.delete(child)
        log(f"image {image}: {fork.dir_mb(image):.1f} MB")
        for i in range(args.n):
            cid = side.raw.setup(side.spec, prepared=True)
            try:
                b = side.raw.live[cid][1]
                att = None
                if args.attach:
                    att = subprocess.Popen(args.attach.format(pid=sandbox_pid(side, cid), out=args.out, cid=cid),
                                           shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                    time.sleep(0.5)  # attached
                with open(os.path.join(b, "console.log"), "a") as out:
                    side.raw.runsc(side.raw.root, "restore", "--detach", f"--image-path={image}", f"--bundle={b}", cid,
                                   out=out, log_to=os.path.join(b, "runsc.log"))
                side.raw.check(cid)
                if not args.no_exec:
                    runsc_ab.first_exec(side, cid)
                for _ in range(args.checkpoints):
                    t, img = runsc_ab.raw_checkpoint(side, cid)
                    times.setdefault("checkpoint (runsc command)", []).append(t)
                    subprocess.run(["rm", "-rf", img])
                if att:
                    att.send_signal(signal.SIGINT)
                    att.wait(timeout=60)
                time.sleep(0.3)
                files = runsc_ab.logs_of(side, cid)
                for name, rx in TIMES:
                    for f in files:
                        ms = [runsc_ab.to_ms(m.group(1)) for m in rx.finditer(open(f, errors="replace").read())]
                        if ms:
                            times[name] += ms
                            break
                for typ, (ms_, n) in decode_stats(files).items():
                    s = stats.setdefault(typ, [0.0, 0])
                    s[0] += ms_
                    s[1] += n
                kill_and_wait(side, cid)
            finally:
                side.raw.delete(cid)
            prof = os.path.join(args.out, f"cpu.{cid}.pprof")
            if os.path.exists(prof) and os.path.getsize(prof) > 0:
                samples.append(prof)
            log(f"restore {i + 1}/{args.n} done")
    finally:
        side.raw.close()
    n = max(1, len(times["kernel-state decode"]))
    print(f"runsc profile — {time.strftime('%Y-%m-%d %H:%M')} — {os.cpu_count()} CPUs, load average {load0:.1f} at start / "
          f"{os.getloadavg()[0]:.1f} at end, {time.time() - t_start:.0f} s; {side.build}; "
          f"{'diff image' if args.diff else 'warm image'}, {len(samples)} profiles\n")
    for name in times:
        xs = times[name]
        if xs:
            print(f"- {name}: p50 {statistics.median(xs):.1f} ms, min {min(xs):.1f}, max {max(xs):.1f} (n = {len(xs)})")
    total = sum(v[0] for v in stats.values())
    with open(os.path.join(args.out, "decode-stats.txt"), "w") as out:
        out.write(f"{'ms/restore':>10} {'share':>6} {'count/restore':>13}  type\n")
        for typ, (ms_, c) in sorted(stats.items(), key=lambda kv: -kv[1][0]):
            out.write(f"{ms_ / n:10.2f} {100 * ms_ / total:5.1f}% {c / n:13.0f}  {typ}\n")
    print(f"\nKernel load stats, mean per restore (all {len(stats)} types in {args.out}/decode-stats.txt):\n")
    print("```")
    print("\n".join(open(os.path.join(args.out, "decode-stats.txt")).read().split("\n")[:26]))
    print("```")
    if samples:
        merged = os.path.join(args.out, "merged.pb.gz")
        with open(merged, "wb") as out:
            subprocess.run(["go", "tool", "pprof", "-proto", side.bin, *samples], stdout=out,
                           stderr=subprocess.DEVNULL, check=True)
        for focus in ("state.Load$", "Kernel..LoadFrom$") + (("state.Save$", "Kernel..SaveTo$") if args.checkpoints else ()):
            top = subprocess.run(["go", "tool", "pprof", "-top", "-nodecount=30", f"-focus={focus}", side.bin, merged],
                                 capture_output=True, text=True).stdout
            print(f"\nCPU profile focused on {focus} ({len(samples)} restores merged):\n\n```\n{top.strip()}\n```")
    return 0


if __name__ == "__main__":
    sys.exit(main())
