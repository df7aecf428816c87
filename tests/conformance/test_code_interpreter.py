"""Code interpreter (port 49999) through the sync e2b_code_interpreter SDK:
run_code results, logs, errors, rich outputs, env vars, timeouts and code
contexts (spec §5)."""

from __future__ import annotations

import base64
import time

import pytest

from e2b import NotFoundException, TimeoutException
from e2b_code_interpreter import Context, Execution, OutputMessage, Sandbox

from ._util import unique

pytestmark = pytest.mark.timeout(90)

SANDBOX_ENVS = {"CF_SBX_ENV": "sandbox-level", "CF_OVERRIDDEN": "global-value"}


@pytest.fixture(scope="module")
def ci(module_sandbox_factory) -> Sandbox:
    """One code-interpreter sandbox for the module. Tests that share the
    default context use variable names of their own."""
    sbx = module_sandbox_factory(Sandbox, envs=SANDBOX_ENVS)
    sbx.run_code("None")  # warm the default kernel once
    return sbx


def test_last_expression_is_main_result(ci):
    ex = ci.run_code("1 + 1")
    assert isinstance(ex, Execution)
    assert ex.error is None
    assert ex.text == "2"
    assert len(ex.results) == 1
    assert ex.results[0].is_main_result is True
    assert ex.results[0].text == "2"


def test_no_result_for_statement(ci):
    ex = ci.run_code("_cf_unused = 5")
    assert ex.error is None
    assert ex.results == []
    assert ex.text is None


def test_string_result_quotes_stripped(ci):
    # Upstream strips the surrounding quotes of a text/plain string repr.
    assert ci.run_code("'abc'").text == "abc"


def test_state_across_calls(ci):
    ci.run_code("cf_state_x = 41")
    ci.run_code("def cf_inc(v):\n    return v + 1")
    assert ci.run_code("cf_inc(cf_state_x)").text == "42"
    ci.run_code("import json as cf_json")
    assert ci.run_code("cf_json.dumps([1])").text == "[1]"


def test_logs_stdout_stderr(ci):
    ex = ci.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nprint('again')")
    assert ex.error is None
    assert "".join(ex.logs.stdout) == "to out\nagain\n"
    assert "".join(ex.logs.stderr) == "to err\n"


def test_on_stdout_on_stderr_callbacks(ci):
    out, err, results = [], [], []
    ex = ci.run_code(
        "import sys, time\nfor i in range(3):\n    print(f'line {i}', flush=True)\n    time.sleep(0.2)\n"
        "print('oops', file=sys.stderr)\n7 * 6",
        on_stdout=out.append,
        on_stderr=err.append,
        on_result=results.append,
    )
    assert all(isinstance(m, OutputMessage) for m in out + err)
    assert "".join(m.line for m in out) == "line 0\nline 1\nline 2\n"
    assert [m.error for m in out] == [False] * len(out)
    assert "".join(m.line for m in err) == "oops\n"
    assert all(m.error for m in err)
    assert [r.text for r in results] == ["42"]
    assert ex.text == "42"


def test_error_name_value_traceback(ci):
    errors = []
    ex = ci.run_code("cf_ok = 1\n1 / 0", on_error=errors.append)
    assert ex.error is not None
    assert ex.error.name == "ZeroDivisionError"
    assert ex.error.value == "division by zero"
    assert "ZeroDivisionError" in ex.error.traceback
    assert errors and errors[0].name == "ZeroDivisionError"
    assert ex.results == []
    # run_code reports errors, it does not raise; the kernel keeps going.
    assert ci.run_code("cf_ok").text == "1"
    ex = ci.run_code("undefined_name_cf")
    assert ex.error.name == "NameError"
    ex = ci.run_code("def broken(:\n  pass")
    assert ex.error.name == "SyntaxError"


def test_execution_count_increases(ci):
    a = ci.run_code("1").execution_count
    b = ci.run_code("2").execution_count
    assert isinstance(a, int) and isinstance(b, int)
    assert b == a + 1


def test_dataframe_has_html_result(ci):
    ex = ci.run_code(
        "import pandas as pd\npd.DataFrame({'name': ['a', 'b'], 'value': [1, 2]})"
    )
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].html and "<table" in main[0].html
    assert "value" in main[0].html
    assert "name" in (main[0].text or "")
    assert "html" in list(main[0].formats())


def test_matplotlib_figure_is_png_result(ci):
    ex = ci.run_code(
        "import matplotlib\nimport matplotlib.pyplot as plt\n"
        "fig = plt.figure()\nplt.plot([1, 2, 3], [3, 1, 2])\nplt.title('cf')\nplt.show()"
    )
    assert ex.error is None, ex.error
    pngs = [r for r in ex.results if r.png]
    assert len(pngs) == 1
    assert pngs[0].is_main_result is False  # display_data, not execute_result
    raw = base64.b64decode(pngs[0].png)
    assert raw.startswith(b"\x89PNG\r\n\x1a\n")


RICH_CLASS = """
class CfRich:
    def _repr_html_(self): return '<b>bold</b>'
    def _repr_markdown_(self): return '# title'
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
    def _repr_json_(self): return {'a': 1}
    def _repr_latex_(self): return r'$x^2$'
    def __repr__(self): return 'CfRich()'
"""


def test_rich_mime_mapping(ci):
    # Jupyter's rich display protocol -> the Result fields of spec §5.
    assert ci.run_code(RICH_CLASS).error is None
    ex = ci.run_code("CfRich()")
    assert ex.error is None, ex.error
    (r,) = ex.results
    assert r.is_main_result is True
    assert r.text == "CfRich()"
    assert r.html == "<b>bold</b>"
    assert r.markdown == "# title"
    assert r.svg == '<svg xmlns="http://www.w3.org/2000/svg"></svg>'
    assert r.json == {"a": 1}
    assert r.latex == "$x^2$"
    assert set(r.formats()) >= {"text", "html", "markdown", "svg", "json", "latex"}


def test_display_gives_non_main_results(ci):
    assert ci.run_code(RICH_CLASS).error is None
    # `display` is a builtin in Jupyter kernels.
    ex = ci.run_code("display(CfRich())\ndisplay(CfRich())\n'done'")
    assert ex.error is None, ex.error
    shown = [r for r in ex.results if not r.is_main_result]
    assert len(shown) == 2 and all(r.html == "<b>bold</b>" for r in shown)
    assert ex.text == "done"


def test_sandbox_envs_visible_to_run_code(ci):
    ex = ci.run_code("import os\nprint(os.environ.get('CF_SBX_ENV'))")
    assert ex.logs.stdout == ["sandbox-level\n"]


def test_per_call_envs(ci):
    code = "import os\nprint(os.environ.get('CF_CALL_ENV'), os.environ.get('CF_OVERRIDDEN'))"
    ex = ci.run_code(code, envs={"CF_CALL_ENV": "call-value", "CF_OVERRIDDEN": "call-override"})
    assert ex.error is None, ex.error
    assert "".join(ex.logs.stdout) == "call-value call-override\n"
    # Per-call only: afterwards the variable is gone and the override undone
    # (upstream resets to the sandbox-level value).
    ex = ci.run_code(code)
    assert "".join(ex.logs.stdout) == "None global-value\n"


def test_language_python_explicit(ci):
    assert ci.run_code("3 * 3", language="python").text == "9"


def test_timeout_interrupts_without_losing_state(make_sandbox):
    sbx = make_sandbox(Sandbox)
    assert sbx.run_code("cf_keep = 7").error is None
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code("while True:\n    pass", timeout=2)
    assert time.monotonic() - t0 < 10
    # The loop was interrupted: the kernel answers again, with its state.
    ex = sbx.run_code("cf_keep", timeout=20)
    assert ex.error is None, ex.error
    assert ex.text == "7"
    assert sbx.run_code("cf_keep + 1", timeout=20).text == "8"


def test_concurrent_run_code(ci):
    # Concurrent executions, in one context and across contexts, each get
    # their own output (upstream serialises executions per context).
    from concurrent.futures import ThreadPoolExecutor

    ctx = ci.create_code_context()
    try:
        def run(i):
            context = ctx if i % 2 else None
            ex = ci.run_code(f"import time\ntime.sleep(0.2)\nprint('p{i}')\n{i} * 100", context=context)
            return ex.text, "".join(ex.logs.stdout), ex.error

        with ThreadPoolExecutor(max_workers=4) as pool:
            results = list(pool.map(run, range(4)))
        assert results == [(str(i * 100), f"p{i}\n", None) for i in range(4)]
    finally:
        ci.remove_code_context(ctx)


# --- contexts -------------------------------------------------------------------


def test_create_and_list_contexts(ci):
    ctx = ci.create_code_context()
    try:
        assert isinstance(ctx, Context)
        assert ctx.id
        assert ctx.language == "python"
        assert ctx.cwd == "/home/user"
        ids = [c.id for c in ci.list_code_contexts()]
        assert ctx.id in ids
    finally:
        ci.remove_code_context(ctx)


def test_context_cwd(ci):
    ctx = ci.create_code_context(cwd="/tmp")
    try:
        assert ctx.cwd == "/tmp"
        assert ci.run_code("import os\nos.getcwd()", context=ctx).text == "/tmp"
    finally:
        ci.remove_code_context(ctx.id)


def test_context_isolation(ci):
    a = ci.create_code_context(language="python")
    b = ci.create_code_context()
    try:
        name = unique("iso").replace("-", "_")
        assert ci.run_code(f"{name} = 'in a'", context=a).error is None
        assert ci.run_code(f"{name}", context=a).text == "in a"
        assert ci.run_code(f"'{name}' in globals()", context=b).text == "False"
        assert ci.run_code(f"'{name}' in globals()").text == "False"  # default context
        # Each context counts its own executions.
        assert ci.run_code("1", context=b).execution_count is not None
    finally:
        ci.remove_code_context(a)
        ci.remove_code_context(b)


def test_restart_context_clears_state(ci):
    ctx = ci.create_code_context()
    try:
        ci.run_code("cf_before_restart = 1", context=ctx)
        ci.restart_code_context(ctx)
        ex = ci.run_code("'cf_before_restart' in globals()", context=ctx)
        assert ex.error is None, ex.error
        assert ex.text == "False"
        assert ci.run_code("2 + 2", context=ctx).text == "4"
    finally:
        ci.remove_code_context(ctx)


def test_remove_context(ci):
    ctx = ci.create_code_context()
    ci.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in ci.list_code_contexts()]
    # Unknown context: 404 -> NotFoundException (spec §5).
    with pytest.raises(NotFoundException):
        ci.run_code("1", context=ctx)
