"""Noisy-neighbour bench: does one sandbox's abuse slow another's hot path?

A victim sandbox answers run_code('print(1)') in a loop, first alone, then
while a neighbour runs each attack: CPU spin on every core it may use,
memory filled to its limit over and over, a fork bomb, and disk writes as
fast as it can. The table gives the victim's latency and its p99 against
the quiet p99 (the target is at most 3x).

    scripts/bench.sh --suite noisy
"""

import argparse
import statistics
import time

from cellfork import Sandbox

ATTACKS = {
    "CPU spin (2 processes)": "for i in 1 2; do (while :; do :; done) & done; wait",
    "memory filled to the limit, repeatedly": (
        "python3 -c \"\nimport time\nwhile True:\n    try:\n        x = bytearray(900 << 20); del x\n"
        "    except MemoryError:\n        pass\n    time.sleep(0.05)\""
    ),
    "fork bomb": "b(){ b|b& }; b",
    "disk writes as fast as it can": "while :; do dd if=/dev/zero of=/home/user/f bs=1M count=300 2>/dev/null; rm -f /home/user/f; done",
}


def sample(sb, n):
    xs = []
    for _ in range(n):
        t0 = time.perf_counter()
        sb.run_code("print(1)")
        xs.append(1000 * (time.perf_counter() - t0))
    xs.sort()
    return xs


def p(xs, q):
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=300, help="run_code calls per row")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    n = 100 if args.quick else args.n
    victim = Sandbox.create(timeout=900)
    rows = []
    try:
        sample(victim, 20)  # warm
        quiet = sample(victim, n)
        rows.append(("quiet (no neighbour activity)", quiet))
        for name, cmd in ATTACKS.items():
            noisy = Sandbox.create(timeout=300)
            try:
                noisy.commands.run(cmd, background=True, timeout=0)
                time.sleep(2)  # let the attack ramp up
                rows.append((name, sample(victim, n)))
            finally:
                noisy.kill()
    finally:
        victim.kill()
    q99 = p(quiet, 0.99)
    print(f"noisy-neighbour bench — {time.strftime('%Y-%m-%d %H:%M')} — victim run_code('print(1)'), ms; target p99 <= 3x quiet\n")
    print("| neighbour | n | p50 | p95 | p99 | max | p99 vs quiet | target |")
    print("|---|---|---|---|---|---|---|---|")
    for name, xs in rows:
        ratio = p(xs, 0.99) / q99
        ok = "met" if ratio <= 3 else "MISSED"
        print(f"| {name} | {len(xs)} | {statistics.median(xs):.1f} | {p(xs, .95):.1f} | {p(xs, .99):.1f} | {xs[-1]:.1f} | {ratio:.2f}x | {ok} |")


if __name__ == "__main__":
    main()
