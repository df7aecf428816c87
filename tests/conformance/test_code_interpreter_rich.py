"""IPython semantics, rich results and charts through the e2b_code_interpreter
SDK, as E2B's Python kernel (IPython with E2B's formatters) gives them:
indented cells, `!cmd`, %magics, IPython.display, objects' _repr_*_ methods,
PIL images, a DataFrame's `data`, JSON for lists and dicts, and matplotlib
figures with their structured `chart` (spec §5)."""

from __future__ import annotations

import base64
import json

import pytest

from e2b_code_interpreter import Sandbox
from e2b_code_interpreter.charts import (
    BarChart,
    BoxAndWhiskerChart,
    ChartType,
    LineChart,
    PieChart,
    ScatterChart,
    SuperChart,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def ci(module_sandbox_factory) -> Sandbox:
    return module_sandbox_factory(Sandbox, timeout=600)


@pytest.fixture(params=["python", "ipython"])
def ctx(request, ci):
    """A fresh Python context, run as plain Python until IPython is needed
    (the kernel's default) or as IPython from the start: results must not
    depend on which."""
    c = ci.create_code_context()
    if request.param == "ipython":
        ok(ci.run_code("get_ipython()", context=c))
    yield c
    ci.remove_code_context(c)


def ok(ex):
    assert ex.error is None, (ex.error.name, ex.error.value, ex.error.traceback)
    return ex


def is_png(b64: str) -> bool:
    return base64.b64decode(b64).startswith(b"\x89PNG\r\n\x1a\n")


# --- IPython ---------------------------------------------------------------------


def test_indented_cell(ci):
    # IPython removes the first line's indentation from the cell (LLMs send
    # code indented like this).
    ex = ok(ci.run_code("\n    a = 20\n    if a:\n        b = a + 1\n    b * 2\n"))
    assert ex.text == "42"


def test_shell_escape(ci):
    ex = ok(ci.run_code("!pwd"))
    assert "".join(ex.logs.stdout) == "/home/user\n"
    ex = ok(ci.run_code("files = !ls /\n'etc' in files"))
    assert ex.text == "True"
    ex = ci.run_code("!exit 3\n_exit_code")
    assert ex.text == "3"


def test_magics(ci):
    ctx = ci.create_code_context()
    try:
        ok(ci.run_code("%cd /tmp", context=ctx))
        assert ok(ci.run_code("import os; os.getcwd()", context=ctx)).text == "/tmp"
        ok(ci.run_code("%env CF_MAGIC=on", context=ctx))
        assert ok(ci.run_code("os.environ['CF_MAGIC']", context=ctx)).text == "on"
        ex = ok(ci.run_code("%time t = sum(range(10))", context=ctx))
        assert "Wall time" in "".join(ex.logs.stdout)
        assert ok(ci.run_code("%%bash\necho from bash", context=ctx)).logs.stdout == ["from bash\n"]
        assert ok(ci.run_code("get_ipython().run_line_magic('env', 'CF_M2=x')", context=ctx)).error is None
        # IPython's error shapes.
        ex = ci.run_code("1 / 0", context=ctx)
        assert (ex.error.name, ex.error.value) == ("ZeroDivisionError", "division by zero")
        assert "ZeroDivisionError" in ex.error.traceback
    finally:
        ci.remove_code_context(ctx)


def test_ipython_display_raw(ci):
    ex = ok(ci.run_code("from IPython.display import display\n"
                        "display({'text/latex': r'\\text{CustomReprObject}'}, raw=True)"))
    assert [list(r.formats()) for r in ex.results] == [["latex"]]
    ex = ok(ci.run_code("from IPython.display import HTML, Markdown\n"
                        "display(HTML('<b>x</b>'))\nMarkdown('# t')"))
    assert ex.results[0].html == "<b>x</b>" and ex.results[0].is_main_result is False
    assert ex.results[1].markdown == "# t" and ex.results[1].is_main_result is True


REPRS = '''
class AllReprs:
    def _repr_html_(self): return '<i>h</i>'
    def _repr_markdown_(self): return '**m**'
    def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
    def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n'
    def _repr_jpeg_(self): return b'\\xff\\xd8\\xff'
    def _repr_pdf_(self): return b'%PDF-1.4'
    def _repr_latex_(self): return r'$\\alpha$'
    def _repr_json_(self): return {'k': [1, 2]}
    def _repr_javascript_(self): return 'console.log(1)'
    def __repr__(self): return 'AllReprs()'
'''


def test_repr_methods(ci, ctx):
    ok(ci.run_code(REPRS, context=ctx))
    (r,) = ok(ci.run_code("AllReprs()", context=ctx)).results
    assert r.text == "AllReprs()"
    assert r.html == "<i>h</i>" and r.markdown == "**m**" and r.latex == "$\\alpha$"
    assert r.svg.startswith("<svg") and r.javascript == "console.log(1)"
    assert base64.b64decode(r.png) == b"\x89PNG\r\n\x1a\n"
    assert base64.b64decode(r.jpeg) == b"\xff\xd8\xff"
    assert base64.b64decode(r.pdf) == b"%PDF-1.4"
    assert r.json == {"k": [1, 2]}
    # display() gives the same, as a display result.
    ex = ok(ci.run_code("display(AllReprs())", context=ctx))
    assert ex.results[0].is_main_result is False and ex.results[0].latex == "$\\alpha$"


def test_json_for_lists_and_dicts(ci, ctx):
    # E2B's kernel adds JSON (numpy values and non-string keys included).
    r = ok(ci.run_code("import numpy as np\n{'a': np.arange(3), 1: [1.5, None]}", context=ctx)).results[0]
    assert r.json == {"a": [0, 1, 2], "1": [1.5, None]}
    assert ok(ci.run_code("'a string'", context=ctx)).results[0].json is None


def test_dataframe_data(ci, ctx):
    ex = ok(ci.run_code("""
        import pandas as pd
        pd.DataFrame({"a": [1, 2, 3], "when": pd.to_datetime(["2024-01-01", "2024-01-02", "2024-01-03"])})
    """, context=ctx))
    r = ex.results[0]
    assert r.data == {"a": [1, 2, 3], "when": ["2024-01-01T00:00:00", "2024-01-02T00:00:00", "2024-01-03T00:00:00"]}
    assert "<table" in r.html and "when" in r.text
    assert "data" in r.formats()


IMAGE = """
    import numpy
    from PIL import Image
    imarray = numpy.random.rand(16, 16, 3) * 255
    image = Image.fromarray(imarray.astype('uint8')).convert('RGBA')
"""


@pytest.mark.parametrize("how", ["image.show()", "image.save('cf-test.png')", "image"])
def test_pil_images(ci, ctx, how):
    ex = ok(ci.run_code(IMAGE + "    " + how + "\n", context=ctx))
    assert len(ex.results) == 1 and is_png(ex.results[0].png)
    assert ex.results[0].is_main_result is (how == "image")


# --- charts ------------------------------------------------------------------------


def chart_of(ci, code):
    ex = ok(ci.run_code(code))
    figures = [r for r in ex.results if r.png]
    assert len(figures) == 1, ex.results
    r = figures[0]
    assert is_png(r.png) and r.text.startswith("<Figure")
    assert not r.extra
    return r.chart


def test_line_chart(ci):
    chart = chart_of(ci, """
import datetime
import matplotlib.pyplot as plt
import numpy as np
dates = [datetime.date(2023, 9, 1) + datetime.timedelta(days=i) for i in range(30)]
plt.figure(figsize=(10, 6))
plt.plot(dates, np.sin(np.linspace(0, 6, 30)), label='sin(x)')
plt.plot(dates, np.cos(np.linspace(0, 6, 30)), label='cos(x)')
plt.xlabel('Time (s)')
plt.ylabel('Amplitude (Hz)')
plt.title('Plot of sin(x) and cos(x)')
plt.show()
""")
    assert isinstance(chart, LineChart) and chart.type == ChartType.LINE
    assert chart.title == "Plot of sin(x) and cos(x)"
    assert (chart.x_label, chart.y_label, chart.x_unit, chart.y_unit) == ("Time (s)", "Amplitude (Hz)", "s", "Hz")
    assert (chart.x_scale, chart.y_scale) == ("datetime", "linear")
    assert [e.label for e in chart.elements] == ["sin(x)", "cos(x)"]
    assert len(chart.elements[0].points) == 30
    assert chart.elements[0].points[0][0].startswith("2023-09-01")


def test_log_and_categorical_scales(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
import numpy as np
plt.plot(np.linspace(1, 10, 10), np.exp(np.linspace(1, 10, 10)), label='exp')
plt.yscale('log')
plt.show()
""")
    assert isinstance(chart, LineChart) and chart.y_scale == "log"
    chart = chart_of(ci, "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], ['A', 'B', 'C'])\nplt.show()")
    assert isinstance(chart, LineChart) and (chart.x_scale, chart.y_scale) == ("linear", "categorical")


def test_scatter_chart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
import numpy as np
plt.xlabel("A")
plt.ylabel("B")
plt.scatter(np.random.rand(5), np.random.rand(5), c='blue', label='Dataset 1')
plt.scatter(np.random.rand(10), np.random.rand(10), c='red', label='Dataset 2')
plt.show()
""")
    assert isinstance(chart, ScatterChart) and chart.type == ChartType.SCATTER
    assert (chart.title, chart.x_label, chart.y_label) == (None, "A", "B")
    assert [(e.label, len(e.points)) for e in chart.elements] == [("Dataset 1", 5), ("Dataset 2", 10)]


def test_bar_chart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
plt.bar(['A', 'B', 'C'], [100, 200, 300], label='Books Sold')
plt.xlabel('Authors')
plt.ylabel('Number of Books Sold')
plt.title('Book Sales by Authors')
plt.show()
""")
    assert isinstance(chart, BarChart) and chart.type == ChartType.BAR
    assert chart.title == "Book Sales by Authors"
    assert [(b.label, b.value, b.group) for b in chart.elements] == [
        ("A", 100, "Books Sold"), ("B", 200, "Books Sold"), ("C", 300, "Books Sold")]


def test_pie_chart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.pie([90, 10], labels=["No", "Yes"], startangle=90)
plt.title('Will it rain?')
plt.show()
""")
    assert isinstance(chart, PieChart) and chart.title == "Will it rain?"
    assert [(e.label, e.angle, e.radius) for e in chart.elements] == [("No", 324, 1), ("Yes", 36, 1)]


def test_box_and_whisker_chart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
data = {'Class A': [85, 90, 78, 92, 88], 'Class B': [95, 89, 76, 91, 84, 87], 'Class C': [75, 82, 88, 79, 86]}
fig, ax = plt.subplots()
ax.set_title('Exam Scores Distribution')
ax.set_xlabel('Class')
ax.set_ylabel('Score')
ax.boxplot(data.values(), labels=data.keys(), patch_artist=True)
plt.show()
""")
    assert isinstance(chart, BoxAndWhiskerChart) and chart.type == ChartType.BOX_AND_WHISKER
    assert [b.label for b in chart.elements] == ["Class A", "Class B", "Class C"]
    assert [b.median for b in chart.elements] == [88, 88, 82]
    assert [b.outliers for b in chart.elements] == [[], [76], []]
    assert [(b.min, b.max) for b in chart.elements] == [(78, 92), (84, 95), (75, 88)]


def test_superchart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
import numpy as np
fig, axs = plt.subplots(1, 2)
fig.suptitle('Multiple Charts Example')
axs[0].plot(np.linspace(0, 10, 100), np.sin(np.linspace(0, 10, 100)))
axs[0].set_title('Sine Wave')
axs[1].scatter(np.random.rand(5), np.random.rand(5))
axs[1].set_title('Scatter Plot')
plt.show()
""")
    assert isinstance(chart, SuperChart) and chart.type == ChartType.SUPERCHART
    assert chart.title == "Multiple Charts Example"
    assert [type(c) for c in chart.elements] == [LineChart, ScatterChart]
    assert [c.title for c in chart.elements] == ["Sine Wave", "Scatter Plot"]


def test_unknown_chart(ci):
    chart = chart_of(ci, """
import matplotlib.pyplot as plt
fig, ax = plt.subplots()
ax.add_artist(plt.Circle((0, 0), 1, fill=False))
plt.title('Two Concentric Circles')
plt.show()
""")
    assert chart.type == ChartType.UNKNOWN and chart.title == "Two Concentric Circles"
    assert chart.elements == []


def test_chart_serializes(ci):
    ex = ok(ci.run_code("import matplotlib.pyplot as plt\nplt.scatter([1, 2], [3, 4])\nplt.show()"))
    assert json.loads(ex.to_json())["results"][0]["chart"]["type"] == "scatter"


def test_figure_shown_once_and_value_after(ci, ctx):
    # plt.show() displays the figure (a display result); the cell's last
    # expression is its main result.
    ex = ok(ci.run_code("import matplotlib.pyplot as plt\nfig = plt.figure()\nplt.plot([1, 2])\nplt.show()\n7", context=ctx))
    assert [(bool(r.png), r.is_main_result) for r in ex.results] == [(True, False), (False, True)]
    # A figure that is the cell's value is shown once, as the main result.
    ex = ok(ci.run_code("fig, ax = plt.subplots()\nax.plot([3, 1])\nfig", context=ctx))
    assert [(bool(r.png), r.is_main_result) for r in ex.results] == [(True, True)]
    assert ex.results[0].chart.type == ChartType.LINE
    # So with matplotlib's inline backend, which shows the figures a cell
    # drew when it ends.
    ok(ci.run_code("%matplotlib inline", context=ctx))
    ex = ok(ci.run_code("fig, ax = plt.subplots()\nax.bar(['a'], [1])\nfig", context=ctx))
    assert [(bool(r.png), r.is_main_result) for r in ex.results] == [(True, True)]
    ex = ok(ci.run_code("plt.plot([1, 2])\nplt.show()\n7", context=ctx))
    assert [(bool(r.png), r.is_main_result) for r in ex.results] == [(True, False), (False, True)]
