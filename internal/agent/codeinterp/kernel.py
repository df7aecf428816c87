"""Stateful Python kernel of the cellfork code interpreter.

One process per code context, started and driven by the Go package
internal/agent/codeinterp (installed in sandboxes beside the agent, /opt/cellfork/<version>/kernel.py).

Protocol, one JSON object per line in each direction:
  fd 3 (in)   commands: {"id": n, "code": str, "env": {..}?, "tmp_env": {..}?}
              env is the sandbox-wide environment (kept), tmp_env the
              execution's own variables (restored when it ends).
  fd 4 (out)  events, compact, "type" always the first key: stdout, stderr,
              result, error and number_of_executions in the E2B wire form (the
              agent forwards them verbatim), {"type":"ready"} once when the
              kernel can take commands and {"type":"done","id":n} after each.
              A cell's first output is written at once; output within
              COALESCE_SECONDS of a write is merged into the next one.
  fd 1/2      the agent's log at start. They are re-pointed at pipes that a
              thread here reads, so output written at the C level (os.system,
              subprocesses, extensions) reaches the client as stdout/stderr,
              in order with print().
SIGINT interrupts the running cell (KeyboardInterrupt) and is ignored between
cells; the agent sends it to the kernel's process group.
CELLFORK_PREIMPORT="numpy,pandas,matplotlib.pyplot" imports those modules
before "ready", so a warm template pays for them once.

Cells run as plain Python (with IPython's handling of an indented cell)
until one needs IPython; results are formatted as Jupyter's, with E2B's
additions: see kernel_rich.py, loaded from beside this file.
"""

import ast
import base64
import builtins
import codecs
import faulthandler
import gc
import io
import json
import linecache
import os
import select
import signal
import sys
import threading
import time
import traceback
import types
from json.encoder import encode_basestring_ascii as _json_str

CMD_FD, EVT_FD = 3, 4
PARTIAL_FLUSH_SECONDS = 0.05  # an unterminated line is sent after this long
COALESCE_SECONDS = 0.002  # output this soon after a write waits for the next
CO_COROUTINE = 0x0080
TLA_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT

_lock = threading.RLock()  # guards fd 4, the output buffers and the capture pipes
_encode = json.JSONEncoder(separators=(",", ":")).encode
_diag = None  # the agent's log (the original stderr)


class _State:
    """Process-wide flags. SIGINT is honoured only while user code runs and
    never in the middle of writing an event (critical > 0 defers it)."""

    interruptible = False
    critical = 0
    pending = False
    emitting = False  # an event line is being written (lock held)
    forked = False  # this is a child forked by user code: no protocol here
    deferred = False  # the outbox waits for the capture thread to write it
    last_write = 0.0  # monotonic time of the last write to fd 4
    count = 0  # execution_count
    loop = None  # asyncio loop for cells with top-level await


_MAIN = threading.get_ident()
_rich = None  # kernel_rich.py, loaded by main
_OWN_FILES = {__file__}  # frames of these files are left out of tracebacks


def _on_sigint(signum, frame):
    if not _State.interruptible:
        return
    if _State.critical:
        _State.pending = True
        return
    raise KeyboardInterrupt


def _enter():
    if threading.get_ident() == _MAIN:
        _State.critical += 1
    _lock.acquire()


def _leave():
    _lock.release()
    if threading.get_ident() == _MAIN:
        _State.critical -= 1
        if _State.critical == 0 and _State.pending:
            _State.pending = False
            if _State.interruptible:
                raise KeyboardInterrupt


_second = [0, ""]  # the formatted second _now last used


def _now():
    t = time.time()
    sec = int(t)
    if sec != _second[0]:
        _second[0], _second[1] = sec, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(sec))
    return "%s.%06dZ" % (_second[1], int((t - sec) * 1e6))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_outbox = []  # events for the next write to fd 4 (lock held): str or [name, [text], ts]


def _queue(event):
    """Adds an event to the next write; the caller holds _lock."""
    _outbox.append(_encode(event))


def _queue_output(name, text):
    """Adds stdout/stderr text to the next write, merged with the text just
    before it of the same stream."""
    last = _outbox[-1] if _outbox else None
    if type(last) is list and last[0] == name:
        last[1].append(text)
    else:
        _outbox.append([name, [text], _now()])


def _encoded(item):
    if type(item) is str:
        return item
    name, texts, ts = item  # formatted by hand: the hot path
    return '{"type":"%s","text":%s,"timestamp":"%s"}' % (name, _json_str("".join(texts)), ts)


def _send(event):
    """Writes the queued events and this one; the caller holds _lock."""
    _outbox.append(_encode(event))
    _write_outbox()


def _write_outbox():
    if _State.emitting or not _outbox:
        return  # empty, or a finalizer ran in the middle of a write
    data = ("\n".join(map(_encoded, _outbox)) + "\n").encode()
    _outbox.clear()
    _State.emitting = True
    try:
        _write_all(EVT_FD, data)
    except OSError:
        _real_exit(0)  # the agent is gone
    finally:
        _State.emitting = False
        _State.deferred = False
        _State.last_write = time.monotonic()


_real_exit = os._exit


def _exit(status):
    """os._exit that first sends the output still waiting in the outbox."""
    if not _State.forked:
        try:
            with _lock:
                _flush_locked()
                _write_outbox()
        except BaseException:
            pass
    _real_exit(status)


def _write_soon(now=None):
    """Writes the outbox now, or, right after another write, lets the
    capture thread write it COALESCE_SECONDS later: a burst of prints
    becomes a few large writes instead of one per line."""
    if not _outbox:
        return
    if now is None:
        now = time.monotonic()
    if now - _State.last_write >= COALESCE_SECONDS:
        _write_outbox()
    elif not _State.deferred:
        _State.deferred = True
        if threading.get_ident() != _CAPTURE_THREAD[0]:
            _wake()


def _emit(event):
    """Sends an event after all output written before it."""
    _enter()
    try:
        if not _State.emitting:
            _flush_locked()
        _send(event)
    finally:
        _leave()


# ---- output ---------------------------------------------------------------


class _Capture:
    """The read end of a pipe installed as fd 1 or 2."""

    def __init__(self, name, fd):
        self.name = name
        self.fd = fd
        self.decoder = codecs.getincrementaldecoder("utf-8")("replace")


_CAPTURES = {}  # read fd -> _Capture
_CAPTURE_FDS = []
_OUTS = []  # the two _Out streams
_WAKE = [-1, -1]  # self-pipe that wakes the capture thread


def _drain_locked():
    """Queues whatever C-level output is waiting in the capture pipes."""
    ready = select.select(_CAPTURE_FDS, (), (), 0)[0]
    for fd in ready:
        cap = _CAPTURES[fd]
        chunks = []
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            chunks.append(chunk)
            if len(chunk) < 65536:
                break
        text = cap.decoder.decode(b"".join(chunks))
        if text:
            _queue_output(cap.name, text)


def _flush_locked():
    _drain_locked()
    for out in _OUTS:
        out.send_locked()


class _RawOut:
    """sys.stdout.buffer: bytes go to the fd, like C-level output."""

    def __init__(self, fd):
        self._fd = fd

    def write(self, data):
        _write_all(self._fd, bytes(data))
        return len(data)

    def flush(self):
        pass

    def fileno(self):
        return self._fd


class _Out(io.TextIOBase):
    """sys.stdout / sys.stderr: complete lines are sent at once, a partial
    line after PARTIAL_FLUSH_SECONDS (or before any later event)."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name, fd):
        self._name = name
        self._fd = fd
        self._parts = []
        self.since = None  # monotonic time of the oldest unsent partial line
        self.buffer = _RawOut(fd)

    def writable(self):
        return True

    def isatty(self):
        return False

    def fileno(self):
        return self._fd

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not " + type(s).__name__)
        if not s:
            return 0
        if _State.forked:
            _write_all(self._fd, s.encode("utf-8", "replace"))
            return len(s)
        _enter()
        try:
            self._parts.append(s)
            if _State.emitting:
                pass  # written by a finalizer in the middle of an event
            elif "\n" in s:
                _drain_locked()
                self.send_locked()
                _write_soon()
            elif self.since is None:
                self.since = time.monotonic()
                _wake()
        finally:
            _leave()
        return len(s)

    def flush(self):
        if _State.forked:
            return
        _enter()
        try:
            if not _State.emitting:
                _drain_locked()
                self.send_locked()
                _write_soon()
        finally:
            _leave()

    def send_locked(self):
        if self._parts:
            text = "".join(self._parts)
            self._parts.clear()
            self.since = None
            _queue_output(self._name, text)


def _wake():
    try:
        os.write(_WAKE[1], b"x")
    except OSError:
        pass  # full: the thread is awake anyway


_CAPTURE_THREAD = [None]


def _capture_loop():
    """Forwards C-level output as it comes, and sends partial lines and
    deferred writes when they are due."""
    _CAPTURE_THREAD[0] = threading.get_ident()
    fds = _CAPTURE_FDS + [_WAKE[0]]
    while True:
        ready = select.select(fds, (), (), _next_deadline())[0]
        if _WAKE[0] in ready:
            try:
                os.read(_WAKE[0], 4096)
            except BlockingIOError:
                pass
        with _lock:
            if _State.emitting:
                continue
            _drain_locked()
            now = time.monotonic()
            for out in _OUTS:
                if out.since is not None and now - out.since >= PARTIAL_FLUSH_SECONDS:
                    out.send_locked()
            _write_soon(now)


def _next_deadline():
    """Seconds until the capture thread has something to send, or None."""
    due = [o.since + PARTIAL_FLUSH_SECONDS for o in _OUTS if o.since is not None]
    if _State.deferred:
        due.append(_State.last_write + COALESCE_SECONDS)
    return max(0.0, min(due) - time.monotonic()) if due else None


_builtin_print = builtins.print


def _print(*args, sep=" ", end="\n", file=None, flush=False):
    """print() that hands a whole line to our streams in one write, so a
    line is one stdout event (the builtin writes each piece separately)."""
    if file is None:
        file = sys.stdout
    if type(file) is not _Out or not isinstance(sep or "", str) or not isinstance(end or "", str):
        return _builtin_print(*args, sep=sep, end=end, file=file, flush=flush)
    file.write((" " if sep is None else sep).join(map(str, args)) + ("\n" if end is None else end))
    if flush:
        file.flush()


_print.__name__ = _print.__qualname__ = "print"
_print.__doc__ = _builtin_print.__doc__


def _setup_output():
    for fd, name in ((1, "stdout"), (2, "stderr")):
        r, w = os.pipe()
        os.dup2(w, fd)  # inheritable: children write here
        os.close(w)
        os.set_blocking(r, False)
        _CAPTURES[r] = _Capture(name, r)
        _CAPTURE_FDS.append(r)
    _WAKE[0], _WAKE[1] = os.pipe()
    os.set_blocking(_WAKE[0], False)
    os.set_blocking(_WAKE[1], False)
    _OUTS.extend([_Out("stdout", 1), _Out("stderr", 2)])
    sys.stdout, sys.stderr = _OUTS
    builtins.print = _print


# ---- execution ---------------------------------------------------------------


def _silenced(code, node):
    """Whether the last expression is followed by ';' (IPython: no output)."""
    lines = code.split("\n")
    rest = lines[node.end_lineno - 1].encode()[node.end_col_offset:].decode("utf-8", "ignore")
    rest = "\n".join([rest] + lines[node.end_lineno:])
    return rest.lstrip().startswith(";")


def _run_code(code_obj, ns):
    if code_obj.co_flags & CO_COROUTINE:
        import asyncio

        if _State.loop is None:
            _State.loop = asyncio.new_event_loop()
        return _State.loop.run_until_complete(eval(code_obj, ns))
    return eval(code_obj, ns)


def _compile(code, filename):
    """Returns (statements, last expression) code objects, either may be None.
    A cell that is one expression compiles directly (twice as fast)."""
    try:
        return None, compile(code, filename, "eval", TLA_FLAGS, dont_inherit=True)
    except SyntaxError:
        pass
    tree = compile(code, filename, "exec", ast.PyCF_ONLY_AST | TLA_FLAGS, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr) and not _silenced(code, tree.body[-1]):
        expr = ast.Expression(tree.body.pop().value)
        last = compile(expr, filename, "eval", TLA_FLAGS, dont_inherit=True)
    body = compile(tree, filename, "exec", TLA_FLAGS, dont_inherit=True) if tree.body else None
    return body, last


def _run_cell(code, n, ns):
    """Runs a cell as plain Python, or through IPython once the kernel
    needs it (see kernel_rich.py)."""
    code = _rich.clean_cell(code)
    if _rich.active() or _rich.wants_ipython(code):
        return _rich.run_ipython(code)
    filename = "<cell-%d>" % n
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        body, last = _compile(code, filename)
    except SyntaxError:
        if not _rich.ipython_syntax(code):
            raise
        return _rich.run_ipython(code)
    if body is not None:
        _run_code(body, ns)
    if last is not None:
        value = _run_code(last, ns)
        if value is not None:
            ns["_"] = value
            _rich.show(value, True)
    _rich.flush_figures()


def _error_event(exc):
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next  # hide the kernel's own frames
    try:
        value = str(exc)
    except Exception:
        value = "<unprintable %s>" % type(exc).__name__
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return {"type": "error", "name": type(exc).__name__, "value": value, "traceback": text}


def _push_env(env):
    if not env:
        return None
    saved = {}
    try:
        for key, value in env.items():
            saved[key] = os.environ.get(key)
            os.environ[key] = value
    except BaseException:
        _pop_env(saved)  # all or nothing
        raise
    return saved


def _pop_env(saved):
    for key, value in (saved or {}).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _execute(req, ns):
    _State.count += 1
    with _lock:
        # Sent before the cell runs: the agent's proof that the kernel took
        # the command (one that died before saying so ran nothing, and the
        # agent runs the command again on a fresh kernel).
        _outbox.append('{"type":"number_of_executions","execution_count":%d}' % _State.count)
        _write_outbox()
    _State.last_write = 0.0  # a cell's first output is sent at once
    saved = None
    _State.pending = False
    try:
        # A variable os.environ refuses is the cell's error, not the kernel's.
        if req.get("env"):
            os.environ.update(req["env"])
        saved = _push_env(req.get("tmp_env"))
        _State.interruptible = True
        _run_cell(req.get("code", ""), _State.count, ns)
        _State.interruptible = False
    except BaseException as exc:  # KeyboardInterrupt and SystemExit end the cell too
        _State.interruptible = False
        try:
            _emit(_error_event(exc))
        except Exception as err:
            _emit({"type": "error", "name": type(exc).__name__, "value": "", "traceback": repr(err)})
    finally:
        _State.interruptible = False
        _State.pending = False
        _pop_env(saved)
        _emit({"type": "done", "id": req.get("id")})


# ---- start ---------------------------------------------------------------------


def _after_fork_in_child():
    _State.forked = True
    _State.interruptible = False
    for fd in (CMD_FD, EVT_FD):
        try:
            os.close(fd)
        except OSError:
            pass


def _setup_namespace():
    sys.modules["_cellfork_kernel"] = sys.modules["__main__"]  # keep our globals alive
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    sys.modules["__main__"] = main
    builtins.display = _rich.display
    sys.argv = [""]
    sys.path[0] = ""  # import from the working directory, as in a notebook
    return main.__dict__


def _preimport():
    import importlib

    names = os.environ.pop("CELLFORK_PREIMPORT", "")
    for name in filter(None, (n.strip() for n in names.split(","))):
        try:
            importlib.import_module(name)
        except Exception as exc:
            _diag.write("kernel: pre-importing %s: %r\n" % (name, exc))


def _load_rich():
    """Loads kernel_rich.py from beside this file."""
    global _rich
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "kernel_rich.py")
    spec = importlib.util.spec_from_file_location("_cellfork_rich", path)
    _rich = importlib.util.module_from_spec(spec)
    sys.modules["_cellfork_rich"] = _rich
    spec.loader.exec_module(_rich)
    _rich.emit = _emit
    _OWN_FILES.add(path)


def main():
    global _diag
    _load_rich()
    for fd in (CMD_FD, EVT_FD):
        os.set_inheritable(fd, False)
        os.set_blocking(fd, True)
    _diag = os.fdopen(os.dup(2), "w", buffering=1)
    faulthandler.enable(_diag)
    ns = _setup_namespace()
    _setup_output()
    signal.signal(signal.SIGINT, _on_sigint)
    os._exit = _exit
    os.register_at_fork(after_in_child=_after_fork_in_child)
    sys.meta_path.insert(0, _rich.ImportHook())
    threading.Thread(target=_capture_loop, name="cellfork-capture", daemon=True).start()
    _preimport()
    # Everything alive now (the interpreter's and the pre-imported modules'
    # objects) lives as long as the kernel: out of the collector's sight,
    # a collection after a restore does not write each object's header, so
    # it does not copy the image's pages the sandbox never otherwise writes
    # (CPython's advice for fork without exec).
    gc.collect()
    gc.freeze()
    _emit({"type": "ready", "pid": os.getpid()})
    commands = os.fdopen(CMD_FD, "rb")
    while True:
        line = commands.readline()
        if not line:
            return
        try:
            req = json.loads(line)
        except ValueError as exc:
            _diag.write("kernel: bad command: %r\n" % exc)
            continue
        _execute(req, ns)


if __name__ == "__main__":
    try:
        main()
    except BaseException:
        # Exit at once: interpreter shutdown can deadlock on _lock, held by
        # the capture thread, and the agent would wait for the exit forever.
        traceback.print_exc(file=_diag or sys.__stderr__)
        _real_exit(1)
    _real_exit(0)
