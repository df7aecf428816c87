"""Rich results and IPython of the cellfork Python kernel (kernel.py loads
this module beside it as _cellfork_rich).

Results are mime bundles, as Jupyter's: an object's _repr_*_ methods, a PNG
for matplotlib figures with the structured chart E2B extracts (e2b/chart,
from the e2b_charts package), a DataFrame's columns (e2b/data) and JSON for
lists and dicts, as E2B's kernel adds them.

IPython is loaded only when a cell needs it, so a kernel that runs plain
Python pays neither its start-up time nor its memory: a cell with IPython
syntax (`!cmd`, `%magic`, `obj?`), `import IPython` (or a module that
imports it) or a call of get_ipython(). From then on the kernel runs every
cell through IPython's InteractiveShell, whose display publisher and
display hook send results here and whose tracebacks are sent as errors.
"""

import base64
import io
import json
import re
import sys
import types

emit = None  # set by kernel.py: sends an event after the output before it
SHOWN = set()  # ids of the figures the running cell has displayed

_MIME_KEYS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
    ("_repr_pdf_", "application/pdf"),
    ("_repr_latex_", "text/latex"),
    ("_repr_json_", "application/json"),
    ("_repr_javascript_", "application/javascript"),
)
_BINARY = ("image/png", "image/jpeg", "application/pdf")
_PLAIN = frozenset((int, float, complex, bool, str, bytes, tuple, set, frozenset, range))
_OBJECT_KEYS = ("json", "data", "chart")
_encode = json.JSONEncoder(separators=(",", ":")).encode


def _method(obj, name):
    """A formatter method of obj, distrusting objects that claim every name."""
    try:
        method = getattr(obj, name, None)
        if not callable(method):
            return None
        if callable(getattr(obj, "_cellfork_canary_method_should_not_exist_", None)):
            return None
        return method
    except Exception:
        return None


def _call_repr(method, *args, **kwargs):
    try:
        data = method(*args, **kwargs)
    except Exception as exc:
        sys.stderr.write("display formatter %s failed: %r\n" % (getattr(method, "__name__", "?"), exc))
        return None
    if isinstance(data, tuple) and len(data) == 2:
        data = data[0]  # (data, metadata)
    return data


# ---- what E2B's kernel adds to Jupyter's formats --------------------------------


def is_figure(obj):
    figure = sys.modules.get("matplotlib.figure")
    return figure is not None and isinstance(obj, figure.Figure)


def figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def e2b_chart(fig):
    """The structured chart of a figure (E2B's result.chart), or None."""
    if not is_figure(fig):
        return None
    try:
        from matplotlib.figure import Figure

        if not hasattr(Figure, "get_suptitle"):  # matplotlib < 3.8
            Figure.get_suptitle = lambda self: self._suptitle.get_text() if self._suptitle is not None else ""
        from e2b_charts import chart_figure_to_dict

        return chart_figure_to_dict(fig) or None
    except Exception:
        return None  # as E2B: no chart rather than no figure


def e2b_data(obj):
    """A DataFrame's columns (E2B's result.data), or None."""
    pandas = sys.modules.get("pandas")
    if pandas is None or not isinstance(obj, pandas.DataFrame):
        return None
    try:
        data = obj.to_dict(orient="list")
        for key, column in data.items():
            data[key] = [v.isoformat() if isinstance(v, pandas.Timestamp) else v for v in column]
        return json.loads(json.dumps(data, default=_json_default, allow_nan=False))
    except Exception:
        return None


def e2b_json(obj):
    """A list or dict as JSON (E2B's kernel adds it, with numpy values and
    non-string keys), or None."""
    if not isinstance(obj, (list, dict)):
        return None
    try:
        return json.loads(json.dumps(obj, default=_json_default, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return None


def _json_default(o):
    if hasattr(o, "tolist") and callable(o.tolist):  # numpy arrays and scalars
        return o.tolist()
    if hasattr(o, "isoformat") and callable(o.isoformat):  # dates and times
        return o.isoformat()
    raise TypeError(type(o).__name__)


def mimebundle(obj):
    """Jupyter's formats of obj, as IPython's display formatter finds them."""
    if type(obj) in _PLAIN:
        return {"text/plain": repr(obj)}
    bundle = {}
    if not isinstance(obj, type):
        method = _method(obj, "_repr_mimebundle_")
        if method is not None:
            data = _call_repr(method, include=None, exclude=None)
            if isinstance(data, dict):
                bundle.update(data)
        for attr, mime in _REPR_METHODS:
            if mime not in bundle:
                method = _method(obj, attr)
                data = None if method is None else _call_repr(method)
                if data is not None:
                    bundle[mime] = data
        if is_figure(obj):
            if "image/png" not in bundle:
                bundle["image/png"] = figure_png(obj)
            chart = e2b_chart(obj)
            if chart:
                bundle["e2b/chart"] = chart
        for mime, extract in (("e2b/data", e2b_data), ("application/json", e2b_json)):
            if mime not in bundle:
                data = extract(obj)
                if data is not None:
                    bundle[mime] = data
    if "text/plain" not in bundle:
        bundle["text/plain"] = repr(obj)
    return bundle


def _jsonable(data):
    try:
        _encode(data)
        return True
    except (TypeError, ValueError):
        return False


def result_event(bundle, main):
    event = {"type": "result"}
    extra = {}
    for mime, data in bundle.items():
        if data is None:
            continue
        if mime in _BINARY and isinstance(data, (bytes, bytearray)):
            data = base64.b64encode(data).decode()
        key = _MIME_KEYS.get(mime)
        if key is None:
            if _jsonable(data):
                extra[mime] = data
        elif key in _OBJECT_KEYS:
            if _jsonable(data):
                event[key] = data
        else:
            if not isinstance(data, str):
                data = str(data)
            if key == "text" and len(data) >= 2 and data[0] == data[-1] and data[0] in "'\"":
                data = data[1:-1]  # as upstream: a string shows without quotes
            event[key] = data
    if extra:
        event["extra"] = extra
    event["is_main_result"] = main
    return event


def show(obj, main):
    """Sends obj as a result: the cell's value (main) or a display."""
    if is_figure(obj):
        SHOWN.add(id(obj))
    emit(result_event(mimebundle(obj), main))


def display(*objs, include=None, exclude=None, metadata=None, raw=False, **kwargs):
    """Shows objects as results of the running cell, like IPython's display
    (raw: objs are mime bundles already)."""
    for obj in objs:
        if raw and isinstance(obj, dict):
            bundle = dict(obj)
        else:
            if is_figure(obj):
                SHOWN.add(id(obj))
            bundle = mimebundle(obj)
        if include is not None:
            bundle = {k: v for k, v in bundle.items() if k in include}
        if exclude is not None:
            bundle = {k: v for k, v in bundle.items() if k not in exclude}
        emit(result_event(bundle, False))


def flush_figures():
    """Displays the pyplot figures still open after a cell, then closes them."""
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    try:
        for num in plt.get_fignums():
            fig = plt.figure(num)
            if id(fig) not in SHOWN:
                show(fig, False)
    finally:
        plt.close("all")
        SHOWN.clear()


def _pyplot_show(*args, **kwargs):
    flush_figures()


def _pil_show(image, *args, **kwargs):
    display(image)


def _pil_patch(module):
    """As E2B's kernel: Image.show() and Image.save(path) display the image."""
    module.Image.show = _pil_show
    original_save = module.Image.save

    def save(image, fp, format=None, **params):
        if isinstance(fp, str):
            display(image)
        return original_save(image, fp, format, **params)

    save.__doc__ = original_save.__doc__
    module.Image.save = save


class ImportHook:
    """Patches modules as they load: plt.show() displays the figures (the
    Agg backend cannot show them), PIL images display themselves, and
    importing IPython makes the kernel an IPython one."""

    busy = False
    patches = {
        "matplotlib.pyplot": lambda m: setattr(m, "show", _pyplot_show),
        "PIL.Image": _pil_patch,
        "IPython": lambda m: shell(),
    }

    def find_spec(self, name, path=None, target=None):
        patch = self.patches.get(name)
        if patch is None or self.busy:
            return None
        import importlib.util

        self.busy = True
        try:
            spec = importlib.util.find_spec(name)
        finally:
            self.busy = False
        if spec is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


# ---- IPython ---------------------------------------------------------------------

_IPYTHON_LINE = re.compile(r"^\s*(?:[!%]|[\w.\[\]'\"]+\s*=\s*[!%])|\?\s*$", re.M)


def ipython_syntax(code):
    """Whether code may be IPython's rather than Python's (checked after
    Python refused it)."""
    return _IPYTHON_LINE.search(code) is not None


def clean_cell(code):
    """IPython's first transformations: leading blank lines go, and the
    first line's indentation is removed from every line that has it."""
    lines = code.splitlines(True)
    for i, line in enumerate(lines):
        if line.strip():
            lines = lines[i:]
            break
    else:
        return code
    indent = re.match(r"[ \t]+", lines[0])
    if indent is None:
        return "".join(lines)
    prefix = indent.group(0)
    return "".join(line[len(prefix):] if line.startswith(prefix) else line for line in lines)


_shell = [None]  # the InteractiveShell, once made
_making = [False]


def active():
    return _shell[0] is not None


def shell():
    """The kernel's InteractiveShell, made on first use."""
    if _shell[0] is not None or _making[0]:
        return _shell[0]
    _making[0] = True
    try:
        _shell[0] = _make_shell()
    finally:
        _making[0] = False
    return _shell[0]


def wants_ipython(code):
    """Whether a cell calls get_ipython(), which only IPython defines. (It
    is no builtin before that: libraries such as pandas call it to find out
    whether they run in a notebook.)"""
    return "get_ipython" in code


def _make_shell():
    # A kernel completes nothing: jedi is not worth its import.
    blocked = "jedi" not in sys.modules
    if blocked:
        sys.modules["jedi"] = None
    try:
        from IPython.core.displayhook import DisplayHook
        from IPython.core.displaypub import DisplayPublisher
        from IPython.core.formatters import BaseFormatter, JSONFormatter
        from IPython.core.interactiveshell import InteractiveShell
        from traitlets import ObjectName, Unicode
        from traitlets.config import Config
    finally:
        if blocked and sys.modules.get("jedi", 0) is None:
            del sys.modules["jedi"]

    class Hook(DisplayHook):
        def __call__(self, result=None):
            figure = result is not None and is_figure(result)
            if figure:
                SHOWN.add(id(result))
            super().__call__(result)
            plt = sys.modules.get("matplotlib.pyplot")
            if figure and plt is not None:
                # Shown as the cell's value: closed, so that the inline
                # backend (`%matplotlib inline`) does not show it again.
                plt.close(result)

        def write_output_prompt(self):
            pass

        def write_format_data(self, format_dict, md_dict=None):
            emit(result_event(format_dict, True))

        def finish_displayhook(self):
            pass

    class Publisher(DisplayPublisher):
        def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kwargs):
            emit(result_event(data, False))

        def clear_output(self, wait=False):
            pass

    def formatter(mime, extract):
        class Formatter(BaseFormatter):
            format_type = Unicode(mime)
            print_method = ObjectName("_repr_" + mime.replace("/", "_") + "_")
            _return_type = (dict, str)

            def __call__(self, obj):
                data = extract(obj)
                return data if data is not None else super().__call__(obj)

        return Formatter

    class JSON(JSONFormatter):
        def __call__(self, obj):
            data = e2b_json(obj)
            return data if data is not None else super().__call__(obj)

    config = Config()
    config.HistoryManager.enabled = False  # no sqlite file, no thread
    config.InteractiveShell.colors = "NoColor"
    main = sys.modules["__main__"]
    ip = InteractiveShell.instance(
        config=config, user_module=main, displayhook_class=Hook, display_pub_class=Publisher
    )
    formatters = ip.display_formatter.formatters
    formatters["e2b/data"] = formatter("e2b/data", e2b_data)(parent=ip.display_formatter)
    formatters["e2b/chart"] = formatter("e2b/chart", e2b_chart)(parent=ip.display_formatter)
    formatters["application/json"] = JSON(parent=ip.display_formatter)
    formatters["image/png"].for_type_by_name("matplotlib.figure", "Figure", figure_png)

    def showtraceback(self, etype, evalue, stb):
        try:
            value = str(evalue)
        except Exception:
            value = "<unprintable %s>" % etype.__name__
        emit({"type": "error", "name": etype.__name__, "value": value, "traceback": "\n".join(stb)})

    ip._showtraceback = types.MethodType(showtraceback, ip)
    # `!cmd` writes to the kernel's fd 1 and 2 (captured, in order), not
    # through a pseudo-terminal, which would turn every "\n" into "\r\n".
    ip.system = ip.system_raw
    # `%matplotlib inline` (and `%pylab`) ask for a GUI event loop; a kernel
    # has none to run, as ipykernel's has none for inline.
    ip.enable_gui = lambda gui=None: None
    return ip


def run_ipython(code):
    """Runs a cell through IPython; its errors are sent by showtraceback."""
    ip = shell()
    ip.run_cell(code, store_history=True)
    flush_figures()
