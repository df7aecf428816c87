"""Code interpreter against the real daemon."""

import base64
import time

import pytest

from cellfork import Execution, ExecutionError, NotFoundError, Result, TimeoutError

pytestmark = pytest.mark.integration


def test_expression_value_and_state(sandbox):
    first = sandbox.run_code("cf_x = 41")
    assert first.text is None and first.error is None
    ex = sandbox.run_code("cf_x + 1")
    assert isinstance(ex, Execution)
    assert ex.text == "42"
    assert [r.is_main_result for r in ex.results] == [True]
    assert ex.execution_count is not None and first.execution_count is not None
    assert ex.execution_count > first.execution_count


def test_callbacks_stream_in_order(sandbox):
    events = []
    t0 = time.monotonic()

    def note(kind):
        return lambda item: events.append((kind, item, time.monotonic() - t0))

    ex = sandbox.run_code(
        "import sys, time\n"
        "print('first', flush=True)\n"
        "time.sleep(1.5)\n"
        "print('second', flush=True)\n"
        "'done'",
        on_stdout=note("stdout"),
        on_result=note("result"),
    )
    returned = time.monotonic() - t0
    kinds = [(k, x if isinstance(x, str) else x.text) for k, x, _ in events]
    assert kinds == [("stdout", "first\n"), ("stdout", "second\n"), ("result", "'done'")] or \
        kinds == [("stdout", "first\n"), ("stdout", "second\n"), ("result", "done")]
    # "first" arrived while the code was still sleeping, not at the end.
    assert events[0][2] < returned - 1.0, (events, returned)
    assert ex.logs.stdout == ["first\n", "second\n"]


def test_stderr(sandbox):
    seen = []
    ex = sandbox.run_code("import sys; print('oops', file=sys.stderr)", on_stderr=seen.append)
    assert "".join(ex.logs.stderr) == "oops\n"
    assert "".join(seen) == "oops\n"
    assert ex.error is None


def test_error_is_returned_not_raised(sandbox):
    seen = []
    ex = sandbox.run_code("print('before')\n1 / 0", on_error=seen.append)
    assert isinstance(ex.error, ExecutionError)
    assert ex.error.name == "ZeroDivisionError"
    assert "division by zero" in ex.error.value
    assert "ZeroDivisionError" in ex.error.traceback
    assert seen == [ex.error]
    assert ex.logs.stdout == ["before\n"]
    # The kernel survives the error.
    assert sandbox.run_code("2 * 3").text == "6"


def test_dataframe_has_html(sandbox):
    ex = sandbox.run_code("import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})")
    assert ex.error is None, ex.error
    main = [r for r in ex.results if r.is_main_result]
    assert len(main) == 1
    assert main[0].html and "<table" in main[0].html
    assert main[0].text and "a" in main[0].text


def test_matplotlib_figure_is_a_png_result(sandbox):
    results = []
    ex = sandbox.run_code(
        "import matplotlib.pyplot as plt\n"
        "plt.plot([1, 2, 3], [1, 4, 9])\n"
        "plt.show()",
        on_result=results.append,
    )
    assert ex.error is None, ex.error
    pngs = [r for r in ex.results if r.png]
    assert len(pngs) == 1
    assert isinstance(pngs[0], Result) and not pngs[0].is_main_result
    assert base64.b64decode(pngs[0].png).startswith(b"\x89PNG\r\n\x1a\n")
    assert results == ex.results


def test_envs_apply_to_one_execution(sandbox):
    ex = sandbox.run_code("import os; print(os.environ.get('CF_RUN_ENV'))", envs={"CF_RUN_ENV": "yes"})
    assert ex.logs.stdout == ["yes\n"]


def test_contexts_are_isolated(sandbox):
    ctx = sandbox.create_code_context()
    try:
        assert ctx.id in {c.id for c in sandbox.list_code_contexts()}
        sandbox.run_code("cf_ctx_only = 5", context=ctx)
        assert sandbox.run_code("cf_ctx_only", context=ctx).text == "5"
        ex = sandbox.run_code("cf_ctx_only")
        assert ex.error is not None and ex.error.name == "NameError"
    finally:
        sandbox.remove_code_context(ctx)
    with pytest.raises(NotFoundError):
        sandbox.run_code("1", context=ctx)


def test_timeout(sandbox):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        sandbox.run_code("import time; time.sleep(8)", timeout=1)
    assert time.monotonic() - t0 < 20


def test_languages(sandbox):
    # language= picks that language's default context, as in E2B's SDK.
    assert sandbox.run_code("1 + 1", language="js").text == "2"
    assert "".join(sandbox.run_code("echo $((6 * 7))", language="bash").logs.stdout) == "42\n"
    ctx = sandbox.create_code_context(language="typescript")
    try:
        assert ctx.language == "typescript"
        assert sandbox.run_code("const n: number = 41; n + 1", context=ctx).text == "42"
    finally:
        sandbox.remove_code_context(ctx)
    languages = [c.language for c in sandbox.list_code_contexts()]
    assert languages[:2] == ["python", "javascript"] and "bash" in languages
