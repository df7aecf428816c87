"""Creates in a row, as a user's loop does them: two daemons side by side,
round by round alternating. Per round and side: both pools full, then N
creates of the default template one after the other (each a new sandbox,
none killed until the loop ends), each answered and then asked
run_code('print(1)'); the client's wall time of each create, of each
create + first run_code, and how each create was served (its bootMode:
`pool` or a restore of its own). Then the sandboxes are killed, the pools
refill, and the same side makes N creates with nothing between them
(`creates only`).

    bench/burst.py [--n 10] [--rounds 6] A=URL,KEY,DATA_DIR,READY B=URL,KEY,DATA_DIR,READY

READY is the side's --pool-ready (what "pool full" means for it). Start
both daemons first, each with its own data directory and port.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=10, help="creates in a row")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("sides", nargs=2, help="NAME=URL,KEY,DATA_DIR,READY")
    args = ap.parse_args()
    sides = [fork.side(a, create=[], first=[], server=[], only=[], modes={}, only_modes={}) for a in args.sides]

    load0, t_start = os.getloadavg()[0], time.time()
    for i in range(args.rounds):
        for s in (sides if i % 2 == 0 else sides[::-1]):
            fork.fill(sides)
            fork.use(s)
            api, made = s["api"], []
            for _ in range(args.n):
                t0 = time.perf_counter()
                sb, st, wall = api.create()
                api.run_code(sb, "print(1)", "1")
                s["first"].append(ms(t0))
                s["create"].append(wall)
                s["server"].append(st["total"])
                mode = sb.get("bootMode", "?")
                s["modes"][mode] = s["modes"].get(mode, 0) + 1
                made.append(sb)
            api.kill_all(made)
            fork.fill(sides)
            fork.use(s)
            made = []
            for _ in range(args.n):
                sb, st, wall = api.create()
                s["only"].append(wall)
                mode = sb.get("bootMode", "?")
                s["only_modes"][mode] = s["only_modes"].get(mode, 0) + 1
                made.append(sb)
            api.kill_all(made)
        fork.log(f"round {i + 1}/{args.rounds} done, load {os.getloadavg()[0]:.1f}")
    print(f"{args.n} creates in a row — {time.strftime('%Y-%m-%d %H:%M')} — load average {load0:.1f} at start / "
          f"{os.getloadavg()[0]:.1f} at end, {time.time() - t_start:.0f} s, {args.rounds} rounds per side, "
          f"sides alternating; ms\n")
    print("| row | " + " | ".join(f"{s['name']} p50 (p95, n)" for s in sides) + " | ratio |\n|---|---|---|---|")
    for key, title in (("create", "create (client wall)"), ("server", "create (server total)"),
                       ("first", "create + first run_code (client wall)"),
                       ("only", "creates only, nothing between (client wall)")):
        meds, cells = [], []
        for s in sides:
            v = sorted(s[key])
            meds.append(statistics.median(v))
            cells.append(f"{meds[-1]:.1f} ({v[int(0.95 * (len(v) - 1))]:.1f}, {len(v)})")
        print(f"| {title} | " + " | ".join(cells) + f" | {meds[1] / meds[0]:.2f}x |")
    for key, title in (("modes", "boot modes, with run_code"), ("only_modes", "boot modes, creates only")):
        print(f"| {title} | " + " | ".join(", ".join(f"{k} {v}" for k, v in sorted(s[key].items()))
                                           for s in sides) + " | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
