"""The chunk bench's pack-file section, two builds side by side: the build
at a git revision (before) and the work tree's (after), run in turns, each
`go run ./bench/chunks -images DIR -only packs -runs 1` (its own S3 server,
exports and imports), N times each. Every import time of every run is
kept; the table gives the median, the range and the samples per image,
host and store (docs/benchmarks.md, "Pack files").

    flock /tmp/cellfork-heavy.lock python3 bench/chunks_ab.py --before main --images DIR --n 8

Run it from the work tree (the after build). The load average is printed
at the start, between runs and at the end.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile


def load():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def build(src, out):
    subprocess.run(["go", "build", "-o", out, "./bench/chunks"], cwd=src, check=True)


def rows(output):
    """The import table's rows: (image, host) -> {"loose": ms, "packs": ms, "phases": str}."""
    out, on = {}, False
    for line in output.splitlines():
        if line.startswith("### "):
            on = "import from S3" in line
            continue
        if not on or not line.startswith("| ") or line.startswith("| image"):
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        out[(c[0], c[1])] = {"loose": float(c[2]), "packs": float(c[4]), "phases": c[7]}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="git revision of the build before")
    ap.add_argument("--images", required=True, help="DIR with warm/, a/, b/ (go run ./bench/chunks -h)")
    ap.add_argument("--n", type=int, default=8, help="runs of each build")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="chunks-ab-")
    src = os.path.join(tmp, "before-src")
    os.mkdir(src)
    arch = subprocess.run(["git", "archive", args.before], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=arch, check=True)
    bins = {"before": os.path.join(tmp, "chunks-before"), "after": os.path.join(tmp, "chunks-after")}
    build(src, bins["before"])
    build(".", bins["after"])
    rev = subprocess.run(["git", "rev-parse", "--short", args.before], check=True, capture_output=True, text=True).stdout.strip()
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    print(f"before: {args.before} ({rev}); after: the work tree at {head}; {args.n} runs each, in turns")
    print(f"load average at start: {load()}")
    samples = {}  # (image, host, store, build) -> [ms]
    phases = {}  # (image, host, build) -> [str] (packs)
    for i in range(args.n):
        for name in (["before", "after"] if i % 2 == 0 else ["after", "before"]):
            r = subprocess.run([bins[name], "-images", args.images, "-only", "packs", "-runs", "1"],
                               capture_output=True, text=True)
            if r.returncode != 0:
                sys.exit(f"run {i + 1} {name} failed: {r.stdout[-2000:]}{r.stderr[-2000:]}")
            for (image, host), v in rows(r.stdout).items():
                for store in ("loose", "packs"):
                    samples.setdefault((image, host, store, name), []).append(v[store])
                phases.setdefault((image, host, name), []).append(v["phases"])
            print(f"run {i + 1} {name}: done, load {load()}", flush=True)
    print(f"load average at end: {load()}\n")
    print("| image | host | store | before: median (min–max) ms | after: median (min–max) ms | before, each run | after, each run |")
    print("|---|---|---|---:|---:|---|---|")
    keys = sorted({(k[0], k[1], k[2]) for k in samples}, key=lambda k: (k[0], ["cold", "warm image noted"].index(k[1]) if k[1] in ("cold", "warm image noted") else 2, k[2]))
    for image, host, store in keys:
        cells = []
        for name in ("before", "after"):
            s = samples.get((image, host, store, name))
            cells.append(f"{statistics.median(s):.1f} ({min(s):.1f}–{max(s):.1f})" if s else "")
        each = [", ".join(f"{x:.1f}" for x in samples.get((image, host, store, name), [])) for name in ("before", "after")]
        print(f"| {image} | {host} | {store} | {cells[0]} | {cells[1]} | {each[0]} | {each[1]} |")
    print("\npacks phases, each run (ms):\n")
    for (image, host, name), ps in sorted(phases.items()):
        for i, p in enumerate(ps):
            print(f"- {image}, {host}, {name} run {i + 1}: {p}")


if __name__ == "__main__":
    sys.exit(main())
