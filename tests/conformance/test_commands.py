"""envd process service through the sync SDK: commands.run (foreground and
background), list, kill, stdin, connect, and the PTY API (spec §4.3)."""

from __future__ import annotations

import threading
import time

import pytest

from e2b import (
    CommandExitException,
    CommandHandle,
    PtySize,
    Sandbox,
    SandboxException,
    TimeoutException,
)

from ._util import unique, wait_until

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def sbx(module_sandbox_factory) -> Sandbox:
    """One sandbox for the module: the tests only start their own processes
    and use their own paths."""
    return module_sandbox_factory()


# --- foreground --------------------------------------------------------------


def test_run_stdout_and_stderr(sbx):
    r = sbx.commands.run("echo out; echo err >&2; printf 'no newline'")
    assert r.exit_code == 0
    assert r.stdout == "out\nno newline"
    assert r.stderr == "err\n"
    assert r.error is None


def test_run_non_ascii_output(sbx):
    r = sbx.commands.run("printf 'h\\xc3\\xa9llo \\xe2\\x82\\xac\\n'")
    assert r.stdout == "héllo €\n"


def test_large_output(sbx):
    # ~3 MB of stdout across many stream envelopes.
    r = sbx.commands.run("head -c 2250000 /dev/zero | base64 -w 100", timeout=30)
    assert len(r.stdout) == 3_000_000 + 30_000
    assert set(r.stdout) == {"A", "\n"}


def test_stdin_closed_unless_requested(sbx):
    # Without stdin=True the command gets no open stdin: `cat` ends at once.
    t0 = time.monotonic()
    r = sbx.commands.run("cat; echo after-cat", timeout=10)
    assert r.stdout == "after-cat\n"
    assert time.monotonic() - t0 < 5


def test_nonzero_exit_raises_command_exit_exception(sbx):
    with pytest.raises(CommandExitException) as ei:
        sbx.commands.run("echo partial; echo boom >&2; exit 3")
    e = ei.value
    assert e.exit_code == 3
    assert e.stdout == "partial\n"
    assert e.stderr == "boom\n"


def test_envs(sbx):
    r = sbx.commands.run('echo "$CF_A:$CF_B"', envs={"CF_A": "1", "CF_B": "two words"})
    assert r.stdout == "1:two words\n"
    # Not leaked into the next command.
    assert sbx.commands.run('echo "[$CF_A]"').stdout == "[]\n"


def test_cwd(sbx):
    assert sbx.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"
    d = f"/tmp/{unique('cwd')}"
    sbx.files.make_dir(d)
    assert sbx.commands.run("pwd", cwd=d).stdout == f"{d}\n"


def test_relative_cwd_is_the_homes(sbx):
    # As E2B's envd: a relative cwd is relative to the user's home.
    d = unique("cwd")
    sbx.files.make_dir(f"{d}/sub")
    assert sbx.commands.run("pwd", cwd=d).stdout == f"/home/user/{d}\n"
    assert sbx.commands.run("pwd", cwd=f"{d}/sub/..").stdout == f"/home/user/{d}\n"
    h = sbx.commands.run("pwd", cwd=f"{d}/sub", background=True)
    assert h.wait().stdout == f"/home/user/{d}/sub\n"
    sbx.files.make_dir(d, user="root")
    assert sbx.commands.run("pwd", cwd=d, user="root").stdout == f"/root/{d}\n"
    # One that does not exist is refused, not run elsewhere.
    with pytest.raises(SandboxException) as e:
        sbx.commands.run("pwd", cwd=unique("missing"))
    assert not isinstance(e.value, CommandExitException)


def test_python_is_python3(sbx):
    # E2B's base template has `python` (tests and agents run `python -m ...`).
    py = sbx.commands.run("python --version").stdout
    assert py.startswith("Python 3.")
    assert py == sbx.commands.run("python3 --version").stdout


def test_default_user_is_user_with_home(sbx):
    r = sbx.commands.run('whoami; echo "$HOME"; pwd; id -u')
    lines = r.stdout.splitlines()
    assert lines[0] == "user"
    assert lines[1] == "/home/user"
    assert lines[2] == "/home/user"
    assert lines[3] != "0"


def test_root_user(sbx):
    r = sbx.commands.run('whoami; id -u; echo "$HOME"', user="root")
    assert r.stdout.splitlines() == ["root", "0", "/root"]
    # And explicitly the default user.
    assert sbx.commands.run("whoami", user="user").stdout == "user\n"


def test_command_timeout_raises_timeout_exception(sbx):
    t0 = time.monotonic()
    with pytest.raises(TimeoutException):
        sbx.commands.run("sleep 30", timeout=1)
    assert time.monotonic() - t0 < 10


def test_on_stdout_on_stderr_streamed_in_order(sbx):
    events = []  # (stream, text, monotonic time)
    t0 = time.monotonic()
    r = sbx.commands.run(
        "for i in 1 2 3; do echo out$i; sleep 0.3; echo err$i >&2; sleep 0.3; done",
        on_stdout=lambda s: events.append(("out", s, time.monotonic())),
        on_stderr=lambda s: events.append(("err", s, time.monotonic())),
    )
    t_end = time.monotonic()
    assert r.stdout == "out1\nout2\nout3\n"
    assert r.stderr == "err1\nerr2\nerr3\n"
    text = [(stream, s) for stream, s, _ in events]
    assert "".join(s for stream, s in text if stream == "out") == r.stdout
    assert "".join(s for stream, s in text if stream == "err") == r.stderr
    # Interleaving preserved: out1 err1 out2 err2 out3 err3.
    order = [s.strip() for _, s, _ in events]
    assert order == ["out1", "err1", "out2", "err2", "out3", "err3"], order
    # Streamed while running, not delivered in one go at the end.
    assert events[0][2] - t0 < (t_end - t0) - 1.0, "first output arrived only at the end"


def test_concurrent_commands(sbx):
    from concurrent.futures import ThreadPoolExecutor

    def run(i):
        return sbx.commands.run(f"sleep 0.3; echo cmd-{i}; echo err-{i} >&2").stdout

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=6) as pool:
        outs = list(pool.map(run, range(6)))
    assert outs == [f"cmd-{i}\n" for i in range(6)]
    assert time.monotonic() - t0 < 10


# --- background ----------------------------------------------------------------


def test_background_handle_wait(sbx):
    h = sbx.commands.run("sleep 0.5; echo done-bg", background=True)
    assert isinstance(h, CommandHandle)
    assert isinstance(h.pid, int) and h.pid > 0
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "done-bg\n"


def test_background_handle_kill(sbx):
    h = sbx.commands.run("sleep 60", background=True)
    assert h.kill() is True
    with pytest.raises(CommandExitException) as ei:
        h.wait()
    assert ei.value.exit_code != 0
    pids = [p.pid for p in sbx.commands.list()]
    assert h.pid not in pids


def test_commands_list_and_kill(sbx):
    marker = unique("listed")
    cmd = f"sleep 60 # {marker}"
    h = sbx.commands.run(cmd, background=True, envs={"CF_LISTED": marker}, cwd="/tmp")
    try:
        procs = {p.pid: p for p in sbx.commands.list()}
        assert h.pid in procs
        p = procs[h.pid]
        assert p.cmd == "/bin/bash"
        assert p.args == ["-l", "-c", cmd]
        assert p.envs.get("CF_LISTED") == marker
        assert p.cwd == "/tmp"
        assert sbx.commands.kill(h.pid) is True
        wait_until(lambda: h.pid not in [q.pid for q in sbx.commands.list()], timeout=5,
                   what="killed process to leave commands.list()")
    finally:
        sbx.commands.kill(h.pid)
    # Unknown pid: False (not_found), no exception.
    assert sbx.commands.kill(h.pid) is False
    assert sbx.commands.kill(999_999) is False


def test_send_stdin_and_close_stdin(sbx):
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.send_stdin(h.pid, "hello ")
    h.send_stdin(b"world\n")
    sbx.commands.close_stdin(h.pid)
    r = h.wait()
    assert r.exit_code == 0
    assert r.stdout == "hello world\n"


def test_handle_close_stdin(sbx):
    h = sbx.commands.run("wc -c", background=True, stdin=True)
    h.send_stdin("12345")
    h.close_stdin()
    assert h.wait().stdout.strip() == "5"


def test_stream_input(sbx):
    # Client-streaming StreamInput: chunks arrive in order.
    h = sbx.commands.run("cat", background=True, stdin=True)
    sbx.commands.stream_input(h.pid, iter(["one-", b"two-", "three\n"]))
    sbx.commands.close_stdin(h.pid)
    assert h.wait().stdout == "one-two-three\n"


def test_connect_to_running_background_command(sbx):
    h = sbx.commands.run(
        "echo first; sleep 1.5; echo second; exit 0", background=True
    )
    pid = h.pid
    h.disconnect()
    # The command keeps running without a client.
    assert pid in [p.pid for p in sbx.commands.list()]
    h2 = sbx.commands.connect(pid)
    assert h2.pid == pid
    r = h2.wait()
    assert r.exit_code == 0
    assert "second\n" in r.stdout


def test_connect_to_unknown_pid_fails(sbx):
    from e2b import NotFoundException

    # Connect with an unknown pid: not_found -> NotFoundException (spec §4.2).
    with pytest.raises(NotFoundException):
        sbx.commands.connect(999_999).wait()


# --- PTY --------------------------------------------------------------------------


class _PtyReader:
    """Collects PTY output of a sync handle on a thread."""

    def __init__(self, handle: CommandHandle):
        self.handle = handle
        self.buf = bytearray()
        self.result = None
        self.error = None
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        try:
            self.result = self.handle.wait(on_pty=lambda b: self.buf.extend(b))
        except Exception as e:  # noqa: BLE001 - inspected by the test
            self.error = e

    def text(self) -> str:
        return self.buf.decode("utf-8", "replace")

    def wait_for(self, needle: str, timeout: float = 10) -> str:
        return wait_until(lambda: needle in self.text() and self.text(), timeout=timeout,
                          what=f"{needle!r} in PTY output")

    def join(self, timeout: float = 10) -> None:
        self._t.join(timeout)
        assert not self._t.is_alive(), "PTY stream did not end"


def test_pty_create_send_stdin_resize_exit(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    assert h.pid > 0
    reader = _PtyReader(h)
    try:
        sbx.pty.send_stdin(h.pid, b"stty size; echo TERM=$TERM; tty\n")
        reader.wait_for("24 80")
        reader.wait_for("TERM=xterm-256color")  # SDK default PTY env
        reader.wait_for("/dev/pts/")
        sbx.pty.resize(h.pid, PtySize(rows=30, cols=100))
        sbx.pty.send_stdin(h.pid, b"stty size\n")
        reader.wait_for("30 100")
        sbx.pty.send_stdin(h.pid, b"exit 0\n")
        reader.join()
        assert reader.error is None, reader.error
        assert reader.result.exit_code == 0
    finally:
        sbx.pty.kill(h.pid)


def test_pty_user_cwd_envs(sbx):
    h = sbx.pty.create(PtySize(rows=10, cols=60), user="root", cwd="/tmp", envs={"CF_PTY": "pty-env"})
    reader = _PtyReader(h)
    try:
        sbx.pty.send_stdin(h.pid, b'echo "U=$(whoami) D=$(pwd) E=$CF_PTY"; exit\n')
        reader.wait_for("U=root D=/tmp E=pty-env")
        reader.join()
    finally:
        sbx.pty.kill(h.pid)


def test_pty_kill(sbx):
    h = sbx.pty.create(PtySize(rows=24, cols=80))
    reader = _PtyReader(h)
    assert h.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.pty.kill(h.pid) is True
    reader.join()
    # Killed: the stream ends with a non-zero exit.
    assert isinstance(reader.error, CommandExitException) or (
        reader.result is not None and reader.result.exit_code != 0
    ), (reader.error, reader.result)
    assert sbx.pty.kill(h.pid) is False
