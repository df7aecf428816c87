"""Drives a code interpreter at argv[1] with the official e2b-code-interpreter
SDK and prints a JSON report (used by TestOfficialSDK)."""

import json
import sys
import time

from e2b import ConnectionConfig
from e2b_code_interpreter import Sandbox
from packaging.version import Version

report = {}
config = ConnectionConfig(sandbox_url=sys.argv[1], api_key="e2b_test")
sbx = Sandbox(
    sandbox_id="sbx-test",
    envd_version=Version("0.4.0"),
    envd_access_token=None,
    sandbox_domain=None,
    connection_config=config,
)

sbx.run_code("x = 41")
live = []
ex = sbx.run_code(
    "import sys\nprint('hello')\nsys.stderr.write('oops\\n')\nx + 1",
    on_stdout=lambda m: live.append(m.line),
)
report["text"] = ex.text
report["stdout"] = ex.logs.stdout
report["stderr"] = ex.logs.stderr
report["live"] = live
report["count"] = ex.execution_count

ex = sbx.run_code("1/0")
report["error"] = [ex.error.name, ex.error.value, "ZeroDivisionError" in ex.error.traceback]

ex = sbx.run_code("import os\nos.environ.get('ONLY')", envs={"ONLY": "yes"})
report["env"] = ex.text

ctx = sbx.create_code_context()
sbx.run_code("x = 'ctx'", context=ctx)
report["ctx_x"] = sbx.run_code("x", context=ctx).text
report["contexts"] = len(sbx.list_code_contexts())
sbx.restart_code_context(ctx)
report["after_restart"] = sbx.run_code("'x' in globals()", context=ctx).text
sbx.remove_code_context(ctx)

try:
    sbx.run_code("x", language="javascript")
except Exception as e:  # SandboxException
    report["bad_language"] = type(e).__name__

start = time.monotonic()
try:
    sbx.run_code("import time\ntime.sleep(30)", timeout=1)
    report["timeout"] = "no exception"
except Exception as e:
    report["timeout"] = type(e).__name__
report["timeout_seconds"] = time.monotonic() - start
start = time.monotonic()
report["after_timeout"] = sbx.run_code("x").text
report["after_timeout_seconds"] = time.monotonic() - start

print(json.dumps(report))
