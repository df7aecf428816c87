"""Code interpreter languages: what a kernel costs. Prints a Markdown table.

For each language, in fresh sandboxes (--n of them): the first run_code of
the language (its default context's kernel starts), a hot run_code in it,
a create_code_context of the language (another kernel, the runtime's files
now cached), and the resident memory of the kernel process (ps inside the
sandbox, as gVisor accounts it). For Python, the first cell that loads
IPython (`!true`) and what it adds, and a hot run_code through IPython. Against a running daemon
(E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY):

    scripts/bench.sh --suite languages [--quick]
"""

import argparse
import statistics
import time

from e2b_code_interpreter import Sandbox

# (language, code of a hot cell, command-line mark of its kernel for ps)
LANGS = [
    ("python", "1 + 1", "kernel.py"),
    ("javascript", "1 + 1", "kernel.js"),
    ("typescript", "const a: number = 1; a + 1", "kernel.js typescript"),
    ("r", "1 + 1", "kernel.R"),
    ("java", "1 + 1", "kernel"),
    ("bash", "echo 2", "kernel.sh"),
]


def ms(t0):
    return 1000 * (time.perf_counter() - t0)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return ms(t0), out


def kernel_rss_mb(sb, mark):
    """RSS of the newest process whose command line ends with mark."""
    ps = sb.commands.run("ps -eo rss=,args=", user="root").stdout
    rss = [int(line.split(None, 1)[0]) for line in ps.splitlines()
           if line.strip() and line.split(None, 1)[1].rstrip().endswith(mark)]
    return rss[-1] / 1024 if rss else float("nan")


def check(ex, lang):
    assert ex.error is None, (lang, ex.error)


def measure(lang, code, mark, n):
    first, hot, ctx, rss = [], [], [], []
    for _ in range(n):
        sb = Sandbox.create(timeout=300)
        try:
            d, ex = timed(lambda: sb.run_code(code, language=lang, timeout=180))
            check(ex, lang)
            first.append(d)
            samples = []
            for _ in range(5):
                d, ex = timed(lambda: sb.run_code(code, language=lang, timeout=60))
                check(ex, lang)
                samples.append(d)
            hot.append(statistics.median(samples))
            rss.append(kernel_rss_mb(sb, mark))
            d, c = timed(lambda: sb.create_code_context(language=lang, request_timeout=180))
            ctx.append(d)
        finally:
            sb.kill()
    return first, hot, ctx, rss


def measure_ipython(n):
    """In a new context: a kernel restored from the warm image counts only
    the pages touched since the restore."""
    load, hot, rss_before, rss_after = [], [], [], []
    for _ in range(n):
        sb = Sandbox.create(timeout=300)
        try:
            ctx = sb.create_code_context(request_timeout=180)
            check(sb.run_code("import numpy, pandas, matplotlib.pyplot", context=ctx), "python")
            rss_before.append(kernel_rss_mb(sb, "kernel.py"))
            d, ex = timed(lambda: sb.run_code("!true", context=ctx, timeout=180))
            check(ex, "python")
            load.append(d)
            samples = []
            for _ in range(5):
                d, ex = timed(lambda: sb.run_code("1 + 1", context=ctx))
                samples.append(d)
            hot.append(statistics.median(samples))
            rss_after.append(kernel_rss_mb(sb, "kernel.py"))
        finally:
            sb.kill()
    return load, hot, rss_before, rss_after


def p50(xs):
    return statistics.median(xs)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3, help="sandboxes per language")
    ap.add_argument("--quick", action="store_true", help="one sandbox per language")
    args = ap.parse_args()
    n = 1 if args.quick else args.n
    print(f"Code interpreter kernels (p50 of {n} sandboxes; ms, MB)\n")
    print("| language | first run_code (kernel start) | hot run_code | create_code_context | kernel RSS |")
    print("|---|---|---|---|---|")
    for lang, code, mark in LANGS:
        first, hot, ctx, rss = measure(lang, code, mark, n)
        note = " (warm image)" if lang == "python" else ""
        print(f"| {lang} | {p50(first):.0f}{note} | {p50(hot):.1f} | {p50(ctx):.0f} | {p50(rss):.0f} |")
    load, hot, before, after = measure_ipython(n)
    print()
    print("| Python kernel (a new context, numpy, pandas, pyplot imported) | ms | RSS MB |")
    print("|---|---|---|")
    print(f"| plain Python | - | {p50(before):.0f} |")
    print(f"| first cell that needs IPython (`!true`): IPython loads | {p50(load):.0f} | {p50(after):.0f} |")
    print(f"| hot run_code through IPython | {p50(hot):.1f} | - |")
    print()
    print("The warm image's Python kernel was restored, so its RSS counts only the pages touched since.")


if __name__ == "__main__":
    main()
