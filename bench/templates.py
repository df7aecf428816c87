"""cellfork template benchmark: prints Markdown tables (n, min, p50, p95,
mean; seconds for builds, ms for creates).

Against a running daemon (CELLFORK_URL, CELLFORK_API_KEY), with cellfork's
SDK:
  build a small template (the built-in base, a COPY, three RUNs, a start
  command serving HTTP with a port ready check) cold (every step run:
  `skip_cache`) and with a warm cache (only the last step changed);
  then create sandboxes from it and from `base`, each followed by its first
  request (a command; for the template, also a GET to its server), so a
  custom template's create and first answer sit beside the built-in one's.

    scripts/bench.sh --suite templates [--quick]
"""

import argparse
import os
import statistics
import tempfile
import time
import uuid

import httpx

from cellfork import Sandbox, Template, wait_for_port

URL = os.environ["CELLFORK_URL"]
KEY = os.environ["CELLFORK_API_KEY"]


def stats(xs):
    xs = sorted(xs)
    p = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]
    return len(xs), xs[0], statistics.median(xs), p(0.95), statistics.mean(xs)


def row(name, xs, unit_scale=1.0):
    n, lo, p50, p95, mean = stats([x * unit_scale for x in xs])
    return f"| {name} | {n} | {lo:.2f} | {p50:.2f} | {p95:.2f} | {mean:.2f} |"


def template(ctx, last):
    return (
        Template(file_context_path=ctx)
        .from_base_image()
        .copy("site", "/srv/site")
        .run_cmd("echo one > /srv/one")
        .run_cmd("mkdir -p /srv/data && seq 1 1000 > /srv/data/numbers")
        .run_cmd(last)
        .set_start_cmd("python3 -m http.server 8000 --directory /srv/site", wait_for_port(8000))
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--builds", type=int, default=3)
    ap.add_argument("--creates", type=int, default=20)
    a = ap.parse_args()
    builds = 1 if a.quick else a.builds
    creates = 5 if a.quick else a.creates
    kw = {"base_url": URL, "api_key": KEY}
    name = f"bench-{uuid.uuid4().hex[:6]}"
    ctx = tempfile.mkdtemp()
    os.makedirs(os.path.join(ctx, "site"))
    with open(os.path.join(ctx, "site", "index.html"), "w") as f:
        f.write("bench")
    cold, warm = [], []
    try:
        for i in range(builds):
            t0 = time.monotonic()
            Template.build(template(ctx, f"echo {uuid.uuid4().hex} > /srv/last"), name, skip_cache=True, **kw)
            cold.append(time.monotonic() - t0)
            t0 = time.monotonic()
            Template.build(template(ctx, f"echo {uuid.uuid4().hex} > /srv/last"), name, **kw)
            warm.append(time.monotonic() - t0)
        time.sleep(3)  # the pool fills with the newest build
        series = {}
        for tpl in ("base", name):
            creates_ms, first_ms, http_ms = [], [], []
            for _ in range(creates):
                t0 = time.monotonic()
                sb = Sandbox.create(template=tpl, **kw)
                t1 = time.monotonic()
                sb.commands.run("true")
                t2 = time.monotonic()
                if tpl != "base":
                    r = httpx.get(f"{URL}/index.html", headers={"E2b-Sandbox-Id": sb.sandbox_id, "E2b-Sandbox-Port": "8000"})
                    assert r.status_code == 200, r.status_code
                    http_ms.append((time.monotonic() - t2) * 1000)
                creates_ms.append((t1 - t0) * 1000)
                first_ms.append((t2 - t1) * 1000)
                sb.kill()
                sb.close()
                time.sleep(0.5)  # let the pool refill, as between real requests
            series[tpl] = (creates_ms, first_ms, http_ms)
    finally:
        Template.delete(name, **kw)
    print("### Template builds (s)\n")
    print("| build | n | min | p50 | p95 | mean |\n|---|---|---|---|---|---|")
    print(row("cold (every step run: skip_cache)", cold))
    print(row("warm cache (last of 4 steps changed)", warm))
    print("\n### Create from a custom template beside `base` (ms)\n")
    print("| operation | n | min | p50 | p95 | mean |\n|---|---|---|---|---|---|")
    for tpl, label in (("base", "base"), (name, "custom template")):
        c, f, h = series[tpl]
        print(row(f"create ({label})", c))
        print(row(f"first command after create ({label})", f))
        if h:
            print(row(f"first GET to its start command's server ({label})", h))


if __name__ == "__main__":
    main()
