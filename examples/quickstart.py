"""cellfork quickstart: a sandbox, a shell command, a file, stateful Python.

Run with the daemon up (`make demo` does all of this):
    CELLFORK_URL=http://127.0.0.1:3000 CELLFORK_API_KEY=... python examples/quickstart.py
"""

import time

from cellfork import Sandbox


def timed(label, fn):
    t0 = time.perf_counter()
    out = fn()
    print(f"  {label:<34} {1000 * (time.perf_counter() - t0):7.1f} ms")
    return out


print("cellfork quickstart")
sb = timed("create sandbox", lambda: Sandbox.create(timeout=300, metadata={"example": "quickstart"}))
with sb:
    print(f"  sandbox id: {sb.sandbox_id}")
    r = timed("commands.run('uname -sr; whoami')", lambda: sb.commands.run("uname -sr; whoami"))
    print("    ->", r.stdout.strip().replace("\n", " | "))

    timed("files.write(/home/user/data.csv)", lambda: sb.files.write("/home/user/data.csv", "x,y\n1,2\n3,4\n5,6\n"))
    timed("run_code(import pandas)", lambda: sb.run_code("import pandas as pd"))
    ex = timed("run_code(read_csv + sum)", lambda: sb.run_code("df = pd.read_csv('data.csv'); df.y.sum()"))
    print("    -> df.y.sum() =", ex.text)
    ex = timed("run_code(df.describe())  # state kept", lambda: sb.run_code("df.describe()"))
    print("    -> rich result formats:", ", ".join(f for f in ("text", "html") if getattr(ex.results[0], f, None)))
    ex = timed("run_code('print(1)')  # hot", lambda: sb.run_code("print(1)"))
    print("    -> stdout:", ex.logs.stdout)
    ex = sb.run_code("1/0")
    print(f"  errors come back typed: {ex.error.name}: {ex.error.value}")
print("  sandbox killed (context manager)")
