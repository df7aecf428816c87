"""The sync and async twins end to end against an in-memory fake daemon
(httpx.MockTransport): wire requests, response handling, errors, retries."""

import base64
import json

import httpx
import pytest

from cellfork import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncSandbox,
    AuthenticationError,
    CellforkError,
    CommandExitError,
    CommandHandle,
    Commands,
    Files,
    InvalidArgumentError,
    NotFoundError,
    ProtocolError,
    Sandbox,
    SandboxNotFoundError,
    SandboxUnavailableError,
    ServiceBusyError,
    TimeoutError,
)

from .fake_daemon import API_KEY, Command, FakeDaemon


@pytest.fixture
def daemon():
    d = FakeDaemon()
    d.commands["echo hi"] = Command(stdout="hi\n")
    d.commands["exit 3"] = Command(stdout="partial", stderr="bad\n", exit_code=3)
    d.commands["no end"] = Command(end=False)
    d.commands["slow"] = Command(error={"code": "deadline_exceeded", "message": "deadline"})
    d.executions["1+1"] = [
        {"type": "stdout", "text": "hello\n"},
        {"type": "keepalive"},
        {"type": "result", "text": "2", "is_main_result": True},
        {"type": "number_of_executions", "execution_count": 1},
        {"type": "end_of_execution"},
    ]
    d.executions["1/0"] = [
        {"type": "error", "name": "ZeroDivisionError", "value": "division by zero",
         "traceback": "tb"},
        {"type": "end_of_execution"},
    ]
    return d


def _kw(daemon, sync=True):
    transport = httpx.MockTransport(daemon)
    return {"base_url": "http://fake", "api_key": API_KEY, "transport": transport}


# --- sync --------------------------------------------------------------------


def test_sync_lifecycle(daemon):
    with Sandbox.create(timeout=120, metadata={"k": "v"}, envs={"A": "1"}, **_kw(daemon)) as sb:
        assert isinstance(sb.commands, Commands) and isinstance(sb.files, Files)
        create = daemon.requests[0]
        assert create.headers["x-api-key"] == API_KEY
        assert json.loads(create.content) == {
            "templateID": "base", "timeout": 120, "metadata": {"k": "v"}, "envVars": {"A": "1"}}
        assert sb.sandbox_id == "sbx1"
        assert sb.is_running()
        info = sb.get_info()
        assert (info.sandbox_id, info.state, info.memory_mb) == ("sbx1", "running", 512)
        assert info.started_at.year == 2026 and info.metadata == {"k": "v"}
        sb.set_timeout(600)
        assert daemon.sandboxes["sbx1"]["timeout"] == 600
        other = Sandbox.connect(sb.sandbox_id, **_kw(daemon))
        assert other.commands.run("echo hi").stdout == "hi\n"
        other.close()
    assert daemon.requests[-1].method == "DELETE"
    assert "sbx1" not in daemon.sandboxes


def test_sync_create_with_limits(daemon):
    with Sandbox.create(cpu_count=1, disk_size_mb=256, pids_max=100, open_files=1000, **_kw(daemon)) as sb:
        assert json.loads(daemon.requests[0].content) == {
            "templateID": "base", "timeout": 300, "metadata": {}, "envVars": {},
            "cpuCount": 1, "diskSizeMB": 256, "pidsMax": 100, "openFiles": 1000}
        info = sb.get_info()
        assert (info.cpu_count, info.memory_mb, info.disk_size_mb, info.pids_max, info.open_files) == (
            1, 512, 256, 100, 1000)
    with pytest.raises(InvalidArgumentError) as err:
        Sandbox.create(pids_max=0, **_kw(daemon))
    assert err.value.status_code == 400


async def test_async_create_with_limits(daemon):
    sb = await AsyncSandbox.create(memory_mb=2048, open_files=4096, **_kw(daemon))
    try:
        info = await sb.get_info()
        assert (info.memory_mb, info.open_files, info.pids_max) == (2048, 4096, 512)
    finally:
        await sb.kill()
        await sb.close()


def test_sync_kill_twice_and_missing_sandbox(daemon):
    sb = Sandbox.create(**_kw(daemon))
    assert sb.kill() is True
    assert sb.kill() is False
    with pytest.raises(SandboxNotFoundError) as info:
        sb.get_info()
    assert info.value.status_code == 404 and info.value.request_id == "req-404"
    with pytest.raises(SandboxNotFoundError):
        sb.set_timeout(10)
    assert sb.is_running() is False
    with pytest.raises(SandboxUnavailableError):
        sb.commands.run("echo hi")
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect("nope", **_kw(daemon))
    sb.close()


def test_sync_bad_api_key(daemon):
    with pytest.raises(AuthenticationError) as info:
        Sandbox.create(**(_kw(daemon) | {"api_key": "wrong"}))
    assert info.value.status_code == 401 and info.value.message == "invalid API key"


def test_sync_list_follows_pages(daemon):
    sbs = [Sandbox.create(**_kw(daemon)) for _ in range(5)]
    listed = Sandbox.list(**_kw(daemon))
    assert sorted(s.sandbox_id for s in listed) == sorted(s.sandbox_id for s in sbs)
    assert sum(1 for r in daemon.requests if r.url.path == "/v2/sandboxes"
               and r.method == "GET") == 3


def test_sync_run_code(daemon):
    daemon.chunk_size = 3
    sb = Sandbox.create(**_kw(daemon))
    seen = []
    ex = sb.run_code("1+1", on_stdout=lambda t: seen.append(("out", t)),
                     on_result=lambda r: seen.append(("res", r.text)))
    assert seen == [("out", "hello\n"), ("res", "2")]
    assert ex.text == "2" and ex.logs.stdout == ["hello\n"] and ex.execution_count == 1
    req = [r for r in daemon.requests if r.url.path == "/execute"][0]
    assert req.headers["e2b-sandbox-port"] == "49999"
    assert req.headers["x-access-token"] == "envd-token"
    errors = []
    ex = sb.run_code("1/0", on_error=errors.append)
    assert ex.error.name == "ZeroDivisionError" and errors == [ex.error]
    with pytest.raises(ProtocolError):
        sb.run_code("unknown code")  # stream without end_of_execution
    ctx = sb.create_code_context(cwd="/tmp")
    assert ctx.id == "ctx1" and [c.id for c in sb.list_code_contexts()] == ["ctx1"]
    sb.run_code("1+1", context=ctx)
    sb.restart_code_context(ctx)
    sb.remove_code_context("ctx1")


def test_sync_commands(daemon):
    daemon.chunk_size = 4
    sb = Sandbox.create(**_kw(daemon))
    out = []
    result = sb.commands.run("echo hi", envs={"A": "1"}, cwd="/tmp", user="root",
                             on_stdout=out.append)
    assert (result.stdout, result.exit_code) == ("hi\n", 0) and "".join(out) == "hi\n"
    start = [r for r in daemon.requests if r.url.path == "/process.Process/Start"][0]
    assert start.headers["authorization"] == "Basic " + base64.b64encode(b"root:").decode()
    assert start.headers["connect-timeout-ms"] == "60000"
    with pytest.raises(CommandExitError) as info:
        sb.commands.run("exit 3")
    assert (info.value.exit_code, info.value.stdout, info.value.stderr) == (3, "partial", "bad\n")
    with pytest.raises(ProtocolError):
        sb.commands.run("no end")
    with pytest.raises(TimeoutError):
        sb.commands.run("slow", timeout=1)


def test_sync_background_and_kill(daemon):
    sb = Sandbox.create(**_kw(daemon))
    with sb.commands.run("echo hi", background=True) as handle:
        assert isinstance(handle, CommandHandle) and handle.pid > 1000
        assert handle.kill() is True
        assert handle.kill() is False  # already gone
        assert handle.wait().stdout == "hi\n"
        assert handle.wait().stdout == "hi\n"  # idempotent
    assert sb.commands.kill(99999) is False


def test_sync_files(daemon):
    sb = Sandbox.create(**_kw(daemon))
    info = sb.files.write("/home/user/a.txt", "héllo")
    assert (info.name, info.path, info.type.value) == ("a.txt", "/home/user/a.txt", "file")
    assert sb.files.read("/home/user/a.txt") == "héllo"
    sb.files.write("/home/user/b.bin", b"\x00\xff")
    assert sb.files.read("/home/user/b.bin", format="bytes") == b"\x00\xff"
    names = [e.name for e in sb.files.list("/home/user")]
    assert names == ["a.txt", "b.bin"]
    assert sb.files.list("/home/user")[0].size == len("héllo".encode())
    assert sb.files.exists("/home/user/a.txt")
    sb.files.remove("/home/user/a.txt")
    assert not sb.files.exists("/home/user/a.txt")
    with pytest.raises(NotFoundError) as info:
        sb.files.read("/home/user/a.txt")
    assert info.value.status_code == 404
    with pytest.raises(NotFoundError) as info:
        sb.files.remove("/nope")
    assert info.value.code == "not_found"
    assert sb.files.make_dir("/home/user/d") is True
    assert sb.files.make_dir("/home/user/d") is False


def test_sync_retries_idempotent_gets_only(daemon):
    sb = Sandbox.create(**_kw(daemon))
    busy = httpx.Response(503, json={"code": 503, "message": "busy"},
                          headers={"Retry-After": "0", "Should-Retry": "false"})
    daemon.queued = [busy, busy]
    assert sb.get_info().sandbox_id == "sbx1"
    daemon.queued = [busy, busy, busy]
    with pytest.raises(ServiceBusyError) as info:
        sb.get_info()
    assert info.value.retry_after == 0
    daemon.queued = [busy]
    with pytest.raises(ServiceBusyError):
        sb.set_timeout(5)  # POST: not retried
    assert daemon.queued == []


def test_sync_transport_error_is_typed():
    def refuse(request):
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(Exception) as info:
        Sandbox.create(base_url="http://x", api_key="k", transport=httpx.MockTransport(refuse))
    assert type(info.value).__name__ == "APIConnectionError"


def test_sync_rejects_async_transport(daemon):
    class AsyncOnly(httpx.AsyncBaseTransport):
        pass

    with pytest.raises(TypeError):
        Sandbox.create(base_url="http://x", transport=AsyncOnly())


# --- async -------------------------------------------------------------------


async def test_async_lifecycle_and_data_plane(daemon):
    daemon.chunk_size = 5
    async with await AsyncSandbox.create(**_kw(daemon)) as sb:
        assert isinstance(sb.commands, AsyncCommands) and isinstance(sb.files, AsyncFiles)
        assert await sb.is_running()
        assert (await sb.get_info()).state == "running"
        await sb.set_timeout(30)

        seen = []

        async def on_out(text):  # coroutine callbacks are awaited
            seen.append(text)

        ex = await sb.run_code("1+1", on_stdout=on_out)
        assert ex.text == "2" and seen == ["hello\n"]

        res = await sb.commands.run("echo hi", on_stdout=seen.append)
        assert res.stdout == "hi\n" and seen[-1] == "hi\n"
        with pytest.raises(CommandExitError):
            await sb.commands.run("exit 3")
        handle = await sb.commands.run("echo hi", background=True)
        assert isinstance(handle, AsyncCommandHandle)
        assert await handle.kill() is True
        assert (await handle.wait()).stdout == "hi\n"
        await handle.close()

        await sb.files.write("/home/user/x.txt", "x")
        assert await sb.files.read("/home/user/x.txt") == "x"
        assert [e.name for e in await sb.files.list("/home/user")] == ["x.txt"]
        assert await sb.files.exists("/home/user/x.txt")
        await sb.files.remove("/home/user/x.txt")
        with pytest.raises(NotFoundError):
            await sb.files.read("/home/user/x.txt")

        again = await AsyncSandbox.connect(sb.sandbox_id, **_kw(daemon))
        assert [s.sandbox_id for s in await AsyncSandbox.list(**_kw(daemon))] == [sb.sandbox_id]
        await again.close()
    assert daemon.sandboxes == {}


async def test_async_errors(daemon):
    with pytest.raises(SandboxNotFoundError):
        await AsyncSandbox.connect("nope", **_kw(daemon))
    sb = await AsyncSandbox.create(**_kw(daemon))
    busy = httpx.Response(429, json={"code": 429, "message": "slow"}, headers={"Retry-After": "0"})
    daemon.queued = [busy]
    assert (await sb.get_info()).sandbox_id == sb.sandbox_id
    with pytest.raises(TimeoutError):
        await sb.commands.run("slow")
    assert await sb.kill() is True
    await sb.close()


# --- edge cases ----------------------------------------------------------------


class _StallingStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """Sends one line, then times out like a silent server."""

    def __iter__(self):
        yield b'{"type":"stdout","text":"x"}\n'
        raise httpx.ReadTimeout("silent")

    async def __aiter__(self):
        yield b'{"type":"stdout","text":"x"}\n'
        raise httpx.ReadTimeout("silent")


def _stalling(daemon):
    def handler(request):
        if request.url.path == "/execute":
            return httpx.Response(200, stream=_StallingStream())
        return daemon(request)
    return handler


def test_sync_run_code_read_timeout_is_a_timeout_error(daemon):
    sb = Sandbox.create(**(_kw(daemon) | {"transport": httpx.MockTransport(_stalling(daemon))}))
    out = []
    with pytest.raises(TimeoutError, match="code execution exceeded 2 s"):
        sb.run_code("x", timeout=2, on_stdout=out.append)
    assert out == ["x"]


async def test_async_run_code_read_timeout_is_a_timeout_error(daemon):
    sb = await AsyncSandbox.create(**(_kw(daemon) | {"transport": httpx.MockTransport(_stalling(daemon))}))
    with pytest.raises(TimeoutError, match="code execution exceeded 2 s"):
        await sb.run_code("x", timeout=2)
    await sb.close()


def test_sync_closed_sandbox_says_so(daemon):
    with Sandbox.create(**_kw(daemon)) as sb:
        pass
    for call in (sb.is_running, lambda: sb.commands.run("echo hi"), lambda: sb.run_code("1+1")):
        with pytest.raises(CellforkError, match="closed"):
            call()


async def test_async_closed_sandbox_says_so(daemon):
    async with await AsyncSandbox.create(**_kw(daemon)) as sb:
        pass
    with pytest.raises(CellforkError, match="closed"):
        await sb.commands.run("echo hi")
    with pytest.raises(CellforkError, match="closed"):
        await sb.get_info()


def test_request_timeout_is_passed_per_call(daemon):
    seen = []

    def handler(request):
        seen.append(request.extensions.get("timeout"))
        return daemon(request)

    sb = Sandbox.create(**(_kw(daemon) | {"transport": httpx.MockTransport(handler)}))
    sb.get_info(request_timeout=3)
    sb.files.exists("/x", request_timeout=4)
    assert seen[-2]["read"] == 3 and seen[-1]["read"] == 4
    exists = daemon.requests[-1]
    assert exists.headers["connect-timeout-ms"] == "4000"
