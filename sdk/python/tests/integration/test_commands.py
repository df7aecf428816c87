"""Commands against the real daemon."""

import time

import pytest

from cellfork import CommandExitError, CommandHandle, CommandResult, TimeoutError

pytestmark = pytest.mark.integration


def test_stdout_and_exit_code_zero(sandbox):
    result = sandbox.commands.run("echo hello")
    assert isinstance(result, CommandResult)
    assert (result.stdout, result.stderr, result.exit_code) == ("hello\n", "", 0)


def test_non_zero_exit_raises_with_result(sandbox):
    with pytest.raises(CommandExitError) as info:
        sandbox.commands.run("echo out; echo err >&2; exit 3")
    err = info.value
    assert err.exit_code == 3
    assert err.stdout == "out\n" and err.stderr == "err\n"
    assert err.result.exit_code == 3


def test_stderr(sandbox):
    result = sandbox.commands.run("echo to-stderr >&2")
    assert result.stderr == "to-stderr\n" and result.stdout == ""


def test_envs(sandbox):
    result = sandbox.commands.run('echo "$CF_A-$CF_B"', envs={"CF_A": "one", "CF_B": "two"})
    assert result.stdout == "one-two\n"


def test_cwd(sandbox):
    assert sandbox.commands.run("pwd", cwd="/tmp").stdout == "/tmp\n"


def test_default_user_and_home(sandbox):
    assert sandbox.commands.run("whoami").stdout == "user\n"
    assert sandbox.commands.run("pwd").stdout == "/home/user\n"


def test_root_user(sandbox):
    assert sandbox.commands.run("whoami", user="root").stdout == "root\n"
    assert sandbox.commands.run("id -u", user="root").stdout == "0\n"
    assert sandbox.commands.run("id -u", user="user").stdout == "1000\n"


def test_output_streams_to_callbacks(sandbox):
    events = []
    t0 = time.monotonic()
    result = sandbox.commands.run(
        "echo a; sleep 1.5; echo b >&2; echo c",
        on_stdout=lambda s: events.append(("out", s, time.monotonic() - t0)),
        on_stderr=lambda s: events.append(("err", s, time.monotonic() - t0)),
    )
    returned = time.monotonic() - t0
    assert "".join(s for k, s, _ in events if k == "out") == "a\nc\n" == result.stdout
    assert "".join(s for k, s, _ in events if k == "err") == "b\n" == result.stderr
    assert events[0][:2] == ("out", "a\n")
    assert events[0][2] < returned - 1.0  # streamed, not delivered at the end


def test_background_wait(sandbox):
    handle = sandbox.commands.run("sleep 1; echo done", background=True)
    assert isinstance(handle, CommandHandle) and handle.pid > 0
    result = handle.wait()
    assert result.stdout == "done\n" and result.exit_code == 0


def test_background_kill(sandbox):
    t0 = time.monotonic()
    with sandbox.commands.run("sleep 60", background=True) as handle:
        assert handle.pid > 0
        assert handle.kill() is True
        with pytest.raises(CommandExitError) as info:
            handle.wait()
    assert info.value.exit_code != 0
    assert time.monotonic() - t0 < 15
    assert sandbox.commands.kill(handle.pid) is False


def test_kill_unknown_pid(sandbox):
    assert sandbox.commands.kill(999_999) is False


def test_timeout(sandbox):
    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        sandbox.commands.run("sleep 30", timeout=2)
    assert time.monotonic() - t0 < 15
