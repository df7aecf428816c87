"""cellfork benchmark: prints Markdown tables (n, min, p50, p95, mean in ms).

Measures, against a running daemon (CELLFORK_URL, CELLFORK_API_KEY):
  create (client wall and server-side total from Server-Timing, plus phases),
  hot run_code('print(1)'), exec('true') (back to back and 30 ms apart),
  create + run_code + kill;
and in the same run the raw gVisor equivalents (`runsc run`, `runsc exec`)
on the same rootfs, so our overhead shows as a ratio. Needs root.

    scripts/bench.sh --suite core [--quick]   # starts a throwaway daemon, runs this
"""

import argparse
import glob
import json
import os
import statistics
import subprocess
import tempfile
import time
import uuid

import httpx

from cellfork import Sandbox

RUNSC = os.environ.get("CELLFORK_RUNSC", "/usr/local/lib/cellfork/runsc")
URL = os.environ["CELLFORK_URL"]
KEY = os.environ["CELLFORK_API_KEY"]

# Published figures of the systems we measure ourselves against
# (../shared/research/anchors.md).
SEEDS = {
    "create": "Podflare pool hit 7-11 ms; CubeSandbox 67 ms p50 (serial)",
    "run_code": "Podflare hot run_code 3-5 ms (hostd-local)",
    "exec": "-",
    "cycle": "-",
}


def stats(xs):
    xs = sorted(xs)
    p = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
    return len(xs), xs[0], statistics.median(xs), p(0.95), statistics.mean(xs)


def row(name, xs, seed="", ratio=""):
    n, lo, p50, p95, mean = stats(xs)
    return f"| {name} | {n} | {lo:.1f} | {p50:.1f} | {p95:.1f} | {mean:.1f} | {ratio} | {seed} |"


HEADER = "| operation | n | min | p50 | p95 | mean | vs raw runsc (p50) | published figure |\n|---|---|---|---|---|---|---|---|"


def server_timing(h):
    out = {}
    for part in h.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur)
    return out


def bench_create(client, n):
    wall, server, phases = [], [], {}
    for _ in range(n):
        t0 = time.perf_counter()
        r = client.post("/v2/sandboxes", json={"templateID": "base", "timeout": 120})
        wall.append(1000 * (time.perf_counter() - t0))
        r.raise_for_status()
        st = server_timing(r.headers["server-timing"])
        server.append(st.pop("total"))
        for k, v in st.items():
            phases.setdefault(k, []).append(v)
        client.delete(f"/sandboxes/{r.json()['sandboxID']}")
    return wall, server, phases


def wait_pool_full(client, timeout=60):
    """Let background refills finish, so hot paths are measured on a quiet box."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        pool = client.get("/health").json().get("pool", {})
        if pool.get("ready", {}).get("base", 0) >= 2 and pool.get("shells", 0) >= 2:
            return
        time.sleep(0.5)


def timed(fn, n, warm=3, gap=0.0):
    """Time n calls of fn (after warm untimed ones), gap seconds apart."""
    for _ in range(warm):
        fn()
    xs = []
    for _ in range(n):
        time.sleep(gap)
        t0 = time.perf_counter()
        fn()
        xs.append(1000 * (time.perf_counter() - t0))
    return xs


def cycle(n):
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb = Sandbox.create(timeout=120)
        sb.run_code("print(1)")
        sb.kill()
        xs.append(1000 * (time.perf_counter() - t0))
    return xs


class RawRunsc:
    """The same work straight through runsc, no daemon: the floor we add to."""

    def __init__(self, rootfs):
        self.tmp = tempfile.mkdtemp(prefix="cellfork-bench-")
        self.root = os.path.join(self.tmp, "runsc")
        self.rootfs = rootfs

    def runsc(self, *args, **kw):
        return subprocess.run([RUNSC, f"--root={self.root}", "--platform=systrap", "--network=none",
                               "--overlay2=root:memory", *args], check=True, capture_output=True, **kw)

    def bundle(self, argv):
        b = os.path.join(self.tmp, uuid.uuid4().hex)
        os.makedirs(b)
        spec = {"ociVersion": "1.0.0", "root": {"path": self.rootfs}, "hostname": "sandbox",
                "process": {"args": argv, "cwd": "/", "env": ["PATH=/usr/bin:/bin"]},
                "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
                "linux": {"namespaces": [{"type": t} for t in ("pid", "ipc", "uts", "mount", "network")]}}
        json.dump(spec, open(os.path.join(b, "config.json"), "w"))
        return b

    def run_detached(self):
        cid = uuid.uuid4().hex[:24]
        b = self.bundle(["/bin/sleep", "infinity"])
        with open(os.path.join(b, "out"), "w") as out:
            t0 = time.perf_counter()
            subprocess.run([RUNSC, f"--root={self.root}", "--platform=systrap", "--network=none",
                            "--overlay2=root:memory", "run", "--detach", f"--bundle={b}", cid],
                           check=True, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
            return cid, 1000 * (time.perf_counter() - t0)

    def delete(self, cid):
        self.runsc("delete", "--force", cid)

    def close(self):
        subprocess.run(["umount", "-l", os.path.join(self.root, "null-netns")], capture_output=True)
        subprocess.run(["rm", "-rf", self.tmp])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100, help="samples for the hot paths")
    ap.add_argument("--n-create", type=int, default=20, help="samples for create")
    ap.add_argument("--quick", action="store_true", help="fewer samples (--n 20 --n-create 5)")
    args = ap.parse_args()
    if args.quick:
        args.n, args.n_create = min(args.n, 20), min(args.n_create, 5)
    rootfs = sorted(glob.glob(os.path.join(os.environ.get("DATA_DIR", "/var/lib/cellfork"), "templates/base/*/rootfs")))[-1]

    raw = RawRunsc(rootfs)
    try:
        raw_create = []
        for _ in range(args.n_create):
            cid, ms = raw.run_detached()
            raw_create.append(ms)
            raw.delete(cid)
        cid, _ = raw.run_detached()
        raw_exec = timed(lambda: raw.runsc("exec", cid, "/bin/true"), min(args.n, 30))
        raw_py = timed(lambda: raw.runsc("exec", cid, "/usr/bin/python3", "-c", "print(1)"), min(args.n, 10), warm=1)
        raw.delete(cid)
    finally:
        raw.close()

    with httpx.Client(base_url=URL, headers={"X-API-KEY": KEY}, timeout=60) as client:
        wall, server, phases = bench_create(client, args.n_create)
        sb = Sandbox.create(timeout=600)
        wait_pool_full(client)  # the sandbox just taken is being replaced
    with sb:
        run_code = timed(lambda: sb.run_code("print(1)"), args.n)
        exec_true = timed(lambda: sb.commands.run("true"), args.n)
        # An agent thinks between commands: the agent's spare login shell
        # (zygote) is ready again by the next one.
        exec_spaced = timed(lambda: sb.commands.run("true"), args.n, gap=0.03)
    cyc = cycle(max(5, args.n_create // 2))

    med = lambda xs: statistics.median(xs)
    print(f"cellfork bench — {time.strftime('%Y-%m-%d %H:%M')} — {os.cpu_count()} CPUs, loopback client, times in ms\n")
    print(HEADER)
    print(row("create (client wall)", wall, SEEDS["create"], f"{med(wall) / med(raw_create):.2f}x `runsc run`"))
    print(row("create (server, Server-Timing total)", server, "", f"{med(server) / med(raw_create):.2f}x `runsc run`"))
    print(row("hot run_code('print(1)')", run_code, SEEDS["run_code"], f"{med(run_code) / med(raw_py):.2f}x `runsc exec python3 -c`"))
    print(row("exec('true')", exec_true, SEEDS["exec"], f"{med(exec_true) / med(raw_exec):.2f}x `runsc exec /bin/true`"))
    print(row("exec('true'), 30 ms apart", exec_spaced, SEEDS["exec"], f"{med(exec_spaced) / med(raw_exec):.2f}x `runsc exec /bin/true`"))
    print(row("create + run_code + kill", cyc, SEEDS["cycle"], ""))
    print(row("raw `runsc run --detach` (sleep)", raw_create))
    print(row("raw `runsc exec /bin/true`", raw_exec))
    print(row("raw `runsc exec python3 -c print(1)`", raw_py))
    print("\nWhere create's server-side time goes (Server-Timing phases):\n")
    print("| phase | n | min | p50 | p95 | mean | | |\n|---|---|---|---|---|---|---|---|")
    for k, v in phases.items():
        print(row(k, v))


if __name__ == "__main__":
    main()
