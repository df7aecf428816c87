"""The code interpreter's six languages through the sync e2b_code_interpreter
SDK: each language's contexts keep state, stream output, report errors in
E2B's shapes, see the sandbox's and the execution's environment variables
and their working directory, and are interrupted by a timeout without
losing their state (spec §5; E2B's kernels: IPython, ijavascript, IRkernel,
IJava, bash_kernel)."""

from __future__ import annotations

import threading
import time

import pytest

from e2b import InvalidArgumentException, SandboxException, TimeoutException
from e2b_code_interpreter import Sandbox

pytestmark = pytest.mark.timeout(180)

SANDBOX_ENVS = {"CF_LANG_ENV": "sandbox-level"}


@pytest.fixture(scope="module")
def ci(module_sandbox_factory) -> Sandbox:
    """One sandbox for the module; each test uses its language's default
    context (or contexts of its own)."""
    return module_sandbox_factory(Sandbox, envs=SANDBOX_ENVS, timeout=600)


# Per language: code that sets a variable to 40, code whose value is that
# variable plus 2, and how that value shows; code that prints "hello"; code
# that fails, with the error's name and value; code that shows the variable
# FOO (the sandbox's CF_LANG_ENV) and the working directory; and code that
# runs forever.
LANGS = {
    "python": dict(
        set="x = 40", get="x + 2", value="42",
        print="print('hello')", fail="1 / 0", error=("ZeroDivisionError", "division by zero"),
        env="import os; os.environ.get('FOO', 'unset')", sandbox_env="import os; os.environ['CF_LANG_ENV']",
        cwd="import os; os.getcwd()", forever="while True: pass",
        eprint="import sys; print('oops', file=sys.stderr)", exit="import os; os._exit(3)",
        live="import time; print('a', flush=True); time.sleep(2); print('b')",
    ),
    "javascript": dict(
        set="let x = 40", get="x + 2", value="42",
        print="console.log('hello')", fail="null.x", error=("TypeError", "Cannot read properties of null (reading 'x')"),
        env="process.env.FOO || 'unset'", sandbox_env="process.env.CF_LANG_ENV",
        cwd="process.cwd()", forever="while (true) {}",
        eprint="console.error('oops')", exit="process.exit(3)",
        live="console.log('a'); await new Promise(r => setTimeout(r, 2000)); console.log('b')",
    ),
    "typescript": dict(
        set="const x: number = 40", get="x + 2", value="42",
        print="const s: string = 'hello'; console.log(s)", fail="throw new RangeError('out')", error=("RangeError", "out"),
        env="process.env.FOO || 'unset'", sandbox_env="process.env.CF_LANG_ENV",
        cwd="process.cwd()", forever="while (true) {}",
        eprint="console.error('oops')", exit="process.exit(3)", live=None,
    ),
    "r": dict(
        set="x <- 40", get="x + 2", value="[1] 42",
        print='cat("hello\\n")', fail='stop("bad")', error=("ERROR", "Error: bad\n"),
        env='Sys.getenv("FOO", unset = "unset")', sandbox_env='Sys.getenv("CF_LANG_ENV")',
        cwd="getwd()", forever="while (TRUE) {}",
        # As IRkernel: an expression's output is sent when it ends.
        eprint='message("oops")', exit="quit(status = 3)", live='cat("a\\n")\nSys.sleep(2)\ncat("b\\n")',
    ),
    "java": dict(
        set="int x = 40;", get="x + 2", value="42",
        print='System.out.println("hello");', fail="int y = 1 / 0;", error=("java.lang.ArithmeticException", "/ by zero"),
        env='System.getProperty("FOO", "unset")', sandbox_env='System.getProperty("CF_LANG_ENV")',
        cwd='System.getProperty("user.dir")', forever="while (true) {}",
        eprint='System.err.println("oops");', exit="System.exit(3);",
        live='System.out.println("a"); Thread.sleep(2000); System.out.println("b");',
    ),
    "bash": dict(
        set="x=40", get="echo $((x + 2))", value=None,  # bash has no values: its output is stdout
        print="echo hello", fail="false", error=("", "1"),
        env="echo ${FOO:-unset}", sandbox_env="echo $CF_LANG_ENV",
        cwd="pwd", forever="sleep 1000",
        eprint="echo oops >&2", exit="exit 3", live="echo a; sleep 2; echo b",
    ),
}


def shown(ex, lang: str) -> str:
    """What an execution showed: its value, or for bash its output."""
    assert ex.error is None, (lang, ex.error)
    if LANGS[lang]["value"] is None:
        return "".join(ex.logs.stdout).strip()
    texts = [r.text for r in ex.results if r.text is not None]
    assert texts, (lang, ex)
    return texts[-1].strip()


def quoted(lang: str, s: str) -> str:
    """How a string value shows in lang (R prints its vectors)."""
    return f'[1] "{s}"' if lang == "r" else s


@pytest.mark.parametrize("lang", list(LANGS))
def test_state_and_values(ci, lang):
    c = LANGS[lang]
    assert ci.run_code(c["set"], language=lang).error is None
    assert shown(ci.run_code(c["get"], language=lang), lang) == (c["value"] or "42")
    # The aliases E2B's SDKs send reach the same default context.
    if lang in ("javascript", "typescript"):
        assert shown(ci.run_code(c["get"], language=lang[:1] + "s"), lang) == "42"


@pytest.mark.parametrize("lang", list(LANGS))
def test_streamed_output(ci, lang):
    out = []
    ex = ci.run_code(LANGS[lang]["print"], language=lang, on_stdout=out.append)
    assert ex.error is None, ex.error
    assert "".join(ex.logs.stdout) == "hello\n"
    assert "".join(m.line for m in out) == "hello\n"


@pytest.mark.parametrize("lang", list(LANGS))
def test_streamed_stderr(ci, lang):
    err = []
    ex = ci.run_code(LANGS[lang]["eprint"], language=lang, on_stderr=err.append)
    assert ex.error is None, ex.error
    assert "".join(ex.logs.stderr) == "oops\n" and "".join(m.line for m in err) == "oops\n"
    assert all(m.error for m in err)


@pytest.mark.parametrize("lang", [lang for lang in LANGS if LANGS[lang]["live"]])
def test_output_is_live(ci, lang):
    # Output comes as it is written, not when the cell ends.
    seen = []
    t0 = time.monotonic()
    ex = ci.run_code(LANGS[lang]["live"], language=lang, on_stdout=lambda m: seen.append((time.monotonic(), m.line)))
    end = time.monotonic()
    assert ex.error is None, ex.error
    assert "".join(line for _, line in seen) == "a\nb\n"
    first = next(t for t, line in seen if line.startswith("a"))
    assert end - first > 1.5, f"first output {first - t0:.2f}s after the start, {end - first:.2f}s before the end"


@pytest.mark.parametrize("lang", list(LANGS))
def test_kernel_death_restarts(ci, lang):
    # A cell that ends its kernel gets a clear error; the next execution
    # runs in a fresh kernel.
    c = LANGS[lang]
    ctx = ci.create_code_context(language=lang)
    try:
        assert ci.run_code(c["set"], context=ctx).error is None
        ex = ci.run_code(c["exit"], context=ctx)
        assert ex.error is not None and ex.error.name == "UnexpectedEndOfExecution", ex.error
        ex = ci.run_code(c["get"], context=ctx)
        assert ex.error is not None or "".join(ex.logs.stdout).strip() == "2"  # x is gone
        assert "".join(ci.run_code(c["print"], context=ctx).logs.stdout) == "hello\n"
    finally:
        ci.remove_code_context(ctx)


@pytest.mark.parametrize("lang", list(LANGS))
def test_errors(ci, lang):
    c = LANGS[lang]
    errors = []
    ex = ci.run_code(c["fail"], language=lang, on_error=errors.append)
    assert ex.error is not None
    assert (ex.error.name, ex.error.value) == c["error"]
    assert errors and errors[0].name == c["error"][0]
    # The kernel lives on.
    assert "".join(ci.run_code(c["print"], language=lang).logs.stdout) == "hello\n"


@pytest.mark.parametrize("lang", list(LANGS))
def test_env_vars(ci, lang):
    c = LANGS[lang]
    assert shown(ci.run_code(c["sandbox_env"], language=lang), lang) == quoted(lang, "sandbox-level")
    assert shown(ci.run_code(c["env"], language=lang, envs={"FOO": "bar"}), lang) == quoted(lang, "bar")
    # Only for that execution.
    assert shown(ci.run_code(c["env"], language=lang), lang) == quoted(lang, "unset")
    # An execution's value of a sandbox variable is undone too.
    ex = ci.run_code(c["sandbox_env"], language=lang, envs={"CF_LANG_ENV": "override"})
    assert shown(ex, lang) == quoted(lang, "override")
    assert shown(ci.run_code(c["sandbox_env"], language=lang), lang) == quoted(lang, "sandbox-level")


@pytest.mark.parametrize("lang", list(LANGS))
def test_cwd(ci, lang):
    c = LANGS[lang]
    assert shown(ci.run_code(c["cwd"], language=lang), lang) == quoted(lang, "/home/user")
    ctx = ci.create_code_context(language=lang, cwd="/tmp")
    try:
        assert ctx.language == lang and ctx.cwd == "/tmp"
        assert shown(ci.run_code(c["cwd"], context=ctx), lang) == quoted(lang, "/tmp")
        # A context of its own: the default context's variable is not there.
        ex = ci.run_code(c["get"], context=ctx)
        assert ex.error is not None or "".join(ex.logs.stdout).strip() == "2"
    finally:
        ci.remove_code_context(ctx)


@pytest.mark.parametrize("lang", list(LANGS))
def test_timeout_interrupts(make_sandbox, lang):
    c = LANGS[lang]
    sbx = make_sandbox(Sandbox)
    assert sbx.run_code(c["set"], language=lang, timeout=120).error is None
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.run_code(c["forever"], language=lang, timeout=3)
    assert time.monotonic() - t0 < 15
    # The cell was interrupted: the kernel answers again, with its state.
    assert shown(sbx.run_code(c["get"], language=lang, timeout=60), lang) == (c["value"] or "42")


def test_list_contexts_has_default_python_and_javascript(make_sandbox):
    sbx = make_sandbox(Sandbox)
    contexts = sbx.list_code_contexts()
    assert [c.language for c in contexts[:2]] == ["python", "javascript"]
    assert all(c.cwd == "/home/user" for c in contexts[:2])
    ctx = sbx.create_code_context(language="r")
    assert sbx.list_code_contexts()[-1].id == ctx.id


def test_contexts_of_a_language_are_independent(ci):
    a = ci.create_code_context(language="js")
    b = ci.create_code_context(language="javascript")
    try:
        assert a.language == b.language == "javascript"
        ci.run_code("var only_in_a = 1", context=a)
        ex = ci.run_code("typeof only_in_a", context=b)
        assert ex.text == "undefined"
    finally:
        ci.remove_code_context(a)
        ci.remove_code_context(b)


def test_javascript_imports_and_await(ci):
    ex = ci.run_code("import { readFileSync } from 'fs'\nconsole.log(typeof readFileSync)", language="js")
    assert ex.logs.stdout == ["function\n"]
    assert ci.run_code("await Promise.resolve('Hello World!')", language="js").text == "Hello World!"
    assert ci.run_code("(await import('path')).basename('/a/b')", language="js").text == "b"
    assert ci.run_code("import * as os from 'os'\ntypeof os.platform()", language="ts").text == "string"
    # Declarations may be repeated, as in a REPL.
    assert ci.run_code("const again = 1; const again2 = again", language="js").error is None
    assert ci.run_code("const again = 2; again", language="js").text == "2"


def test_java_println_writes_text_then_newline(ci):
    # As IJava: println's text and its line end are two stdout messages.
    ex = ci.run_code('System.out.println("Hello, World!")', language="java")
    assert ex.logs.stdout[0] == "Hello, World!"
    assert "".join(ex.logs.stdout) == "Hello, World!\n"


def test_unknown_language_and_bad_cwd(ci):
    # The code interpreter SDK raises SandboxException with the status for
    # a 400.
    with pytest.raises(SandboxException, match=r"^400 .*language \"cobol\" is not supported"):
        ci.run_code("1", language="cobol")
    with pytest.raises(SandboxException, match=r"^400 .*not supported"):
        ci.create_code_context(language="cobol")
    with pytest.raises(SandboxException, match=r"^400 .*does not exist"):
        ci.create_code_context(cwd="/no/such/dir")
    # Kernels run as the sandbox's user, who cannot enter /root (E2B's run
    # as root): a clear 400, not a 500.
    with pytest.raises(SandboxException, match=r"^400 .*permission denied"):
        ci.create_code_context(language="python", cwd="/root")
    # Passing a context and a language is refused by the SDK itself.
    with pytest.raises(InvalidArgumentException):
        ci.run_code("1", language="js", context=ci.list_code_contexts()[0])


def test_kill_during_silent_code_reports_the_kill(make_sandbox):
    # /execute sends its headers at once, so a sandbox killed while the
    # code prints nothing breaks a started stream, which the SDK reports as
    # a kill.
    sbx = make_sandbox(Sandbox)
    timer = threading.Timer(2.0, sbx.kill)
    timer.start()
    try:
        with pytest.raises(TimeoutException, match="sandbox was killed while the request was in progress"):
            sbx.run_code("import time; time.sleep(300)", timeout=120)
    finally:
        timer.cancel()
