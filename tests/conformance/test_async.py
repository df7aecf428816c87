"""The main flows again through the async SDKs (e2b.AsyncSandbox and
e2b_code_interpreter.AsyncSandbox). The async SDK differs on the wire in
places: directory watching uses the WatchDir stream (spec §8.13), stdin can
be streamed over StreamInput, and PTY output is consumed in the background.

Explicit asyncio markers: the runner has no pytest config, so pytest-asyncio
runs in strict mode."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import datetime, timezone

import pytest

from e2b import (
    AsyncSandbox,
    AuthenticationException,
    CommandExitException,
    FileNotFoundException,
    FilesystemEventType,
    FileType,
    PtySize,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    TimeoutException,
)
from e2b_code_interpreter import AsyncSandbox as AsyncCodeInterpreterSandbox

from ._util import unique

pytestmark = [pytest.mark.timeout(90), pytest.mark.asyncio]

UNKNOWN_ID = "cfnosuchsandbox" + uuid.uuid4().hex[:8]


async def _wait_for(predicate, timeout: float, what: str, interval: float = 0.1):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


# --- control plane ----------------------------------------------------------------


async def test_async_lifecycle(make_async_sandbox, run_tag):
    group = {"cf-async-group": unique("ag")}
    sbx = await make_async_sandbox(AsyncSandbox, timeout=100, metadata=group, envs={"CF_ASYNC": "yes"})
    assert await sbx.is_running() is True

    info = await sbx.get_info()
    assert info.sandbox_id == sbx.sandbox_id
    assert info.template_id == "base"
    assert info.state == SandboxState.RUNNING
    assert info.metadata == {**run_tag, **group}
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert 95 <= lifetime <= 105

    await sbx.set_timeout(200)
    remaining = ((await AsyncSandbox.get_info(sbx.sandbox_id)).end_at - datetime.now(timezone.utc)).total_seconds()
    assert 190 <= remaining <= 205

    other = await AsyncSandbox.connect(sbx.sandbox_id)
    assert other.sandbox_id == sbx.sandbox_id
    assert (await other.commands.run("echo $CF_ASYNC")).stdout == "yes\n"

    paginator = AsyncSandbox.list(query=SandboxQuery(metadata=group, state=[SandboxState.RUNNING]), limit=5)
    items = await paginator.next_items()
    assert [s.sandbox_id for s in items] == [sbx.sandbox_id]
    assert not paginator.has_next

    metrics = await sbx.get_metrics()
    assert isinstance(metrics, list)
    for m in metrics:
        assert m.cpu_count >= 1 and m.mem_total > 0

    assert await sbx.kill() is True
    assert await AsyncSandbox.kill(sbx.sandbox_id) is False
    assert await sbx.is_running() is False
    with pytest.raises(SandboxNotFoundException):
        await sbx.get_info()


async def test_async_paginator_limit(make_async_sandbox):
    group = {"cf-async-page": unique("ap")}
    ids = {(await make_async_sandbox(AsyncSandbox, metadata=group)).sandbox_id for _ in range(3)}
    paginator = AsyncSandbox.list(query=SandboxQuery(metadata=group), limit=2)
    seen = []
    pages = 0
    while paginator.has_next:
        page = await paginator.next_items()
        assert len(page) <= 2
        seen += [s.sandbox_id for s in page]
        pages += 1
    assert pages == 2
    assert sorted(seen) == sorted(ids)


async def test_async_short_timeout_kills(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox, timeout=2)
    deadline = time.monotonic() + 15
    while await sbx.is_running():
        assert time.monotonic() < deadline, "sandbox still running 15s after a 2s timeout"
        await asyncio.sleep(0.25)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(sbx.sandbox_id)


async def test_async_error_mapping(make_async_sandbox, run_tag):
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.create(metadata=run_tag, timeout=30, api_key="definitely-not-a-valid-key")
    with pytest.raises(AuthenticationException):
        await AsyncSandbox.list(api_key="definitely-not-a-valid-key").next_items()
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.connect(UNKNOWN_ID)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.get_info(UNKNOWN_ID)
    with pytest.raises(SandboxNotFoundException):
        await AsyncSandbox.set_timeout(UNKNOWN_ID, 30)
    assert await AsyncSandbox.kill(UNKNOWN_ID) is False


# --- commands ---------------------------------------------------------------------------


async def test_async_commands(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)

    r = await sbx.commands.run("echo out; echo err >&2")
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 0)

    with pytest.raises(CommandExitException) as ei:
        await sbx.commands.run("echo bad >&2; exit 4")
    assert ei.value.exit_code == 4 and ei.value.stderr == "bad\n"

    r = await sbx.commands.run('whoami; echo "$HOME"; pwd')
    assert r.stdout == "user\n/home/user\n/home/user\n"
    r = await sbx.commands.run("whoami; pwd", user="root", cwd="/tmp", envs={"X": "1"})
    assert r.stdout == "root\n/tmp\n"
    assert (await sbx.commands.run("echo $CF_E", envs={"CF_E": "env!"})).stdout == "env!\n"

    with pytest.raises(TimeoutException):
        await sbx.commands.run("sleep 30", timeout=1)

    # Callbacks, sync and async ones, in order.
    events = []

    async def on_err(s):
        events.append(("err", s.strip()))

    await sbx.commands.run(
        "for i in 1 2; do echo o$i; sleep 0.2; echo e$i >&2; sleep 0.2; done",
        on_stdout=lambda s: events.append(("out", s.strip())),
        on_stderr=on_err,
    )
    assert events == [("out", "o1"), ("err", "e1"), ("out", "o2"), ("err", "e2")]


async def test_async_background_stdin_connect(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)

    # Background + wait.
    h = await sbx.commands.run("sleep 0.3; echo bg", background=True)
    assert h.pid > 0
    assert (await h.wait()).stdout == "bg\n"

    # Background + kill.
    h = await sbx.commands.run("sleep 60", background=True)
    assert h.pid in [p.pid for p in await sbx.commands.list()]
    assert await h.kill() is True
    with pytest.raises(CommandExitException):
        await h.wait()
    assert await sbx.commands.kill(h.pid) is False

    # stdin: send_stdin + close_stdin.
    h = await sbx.commands.run("cat", background=True, stdin=True)
    await sbx.commands.send_stdin(h.pid, "via send_stdin\n")
    await h.send_stdin(b"via handle\n")
    await sbx.commands.close_stdin(h.pid)
    assert (await h.wait()).stdout == "via send_stdin\nvia handle\n"

    # stdin streamed over StreamInput.
    h = await sbx.commands.run("cat", background=True, stdin=True)
    async with sbx.commands.stream_input(h.pid) as inp:
        await inp.send("a-")
        await inp.send(b"b-")
        await inp.send("c\n")
    await sbx.commands.close_stdin(h.pid)
    assert (await h.wait()).stdout == "a-b-c\n"

    # Disconnect and reconnect to a running command.
    h = await sbx.commands.run("echo one; sleep 1; echo two", background=True)
    pid = h.pid
    await h.disconnect()
    h2 = await sbx.commands.connect(pid)
    r = await h2.wait()
    assert r.exit_code == 0 and "two\n" in r.stdout


async def test_async_pty(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)
    out = bytearray()
    h = await sbx.pty.create(PtySize(rows=24, cols=80), on_data=out.extend, envs={"CF_PTY": "async-pty"})
    try:
        await sbx.pty.send_stdin(h.pid, b"stty size; echo $CF_PTY\n")
        await _wait_for(lambda: b"24 80" in out and b"async-pty" in out, 10, "PTY output")
        await sbx.pty.resize(h.pid, PtySize(rows=40, cols=120))
        await sbx.pty.send_stdin(h.pid, b"stty size\n")
        await _wait_for(lambda: b"40 120" in out, 10, "resized PTY size")
        assert await sbx.pty.kill(h.pid) is True
        with pytest.raises(CommandExitException):
            await h.wait()
    finally:
        await sbx.pty.kill(h.pid)


# --- files --------------------------------------------------------------------------------


async def test_async_files(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)
    d = f"/home/user/{unique('afs')}"
    assert await sbx.files.make_dir(d) is True
    assert await sbx.files.make_dir(d) is False

    info = await sbx.files.write(f"{d}/a.txt", "async text")
    assert info.path == f"{d}/a.txt" and info.type == FileType.FILE
    assert await sbx.files.read(f"{d}/a.txt") == "async text"

    data = bytes(range(256)) * 1000
    await sbx.files.write(f"{d}/b.bin", data)
    assert bytes(await sbx.files.read(f"{d}/b.bin", format="bytes")) == data
    chunks = []
    async with await sbx.files.read(f"{d}/b.bin", format="stream") as stream:
        async for chunk in stream:
            chunks.append(bytes(chunk))
    assert b"".join(chunks) == data

    await sbx.files.write(f"{d}/oct.bin", data, use_octet_stream=True)
    assert bytes(await sbx.files.read(f"{d}/oct.bin", format="bytes")) == data
    await sbx.files.write(f"{d}/gz.txt", "zip " * 1000, gzip=True)
    assert await sbx.files.read(f"{d}/gz.txt", gzip=True) == "zip " * 1000

    infos = await sbx.files.write_files(
        [{"path": f"{d}/m/1.txt", "data": "1"}, {"path": f"{d}/m/2.txt", "data": b"2"}]
    )
    assert [i.name for i in infos] == ["1.txt", "2.txt"]

    info = await sbx.files.write(f"{d}/meta.txt", "m", metadata={"Kind": "async"})
    assert info.metadata == {"kind": "async"}

    assert await sbx.files.exists(f"{d}/a.txt") is True
    assert await sbx.files.exists(f"{d}/zzz") is False
    st = await sbx.files.get_info(f"{d}/a.txt")
    assert (st.name, st.size, st.owner, st.type) == ("a.txt", 10, "user", FileType.FILE)

    names = sorted(e.name for e in await sbx.files.list(d))
    assert names == ["a.txt", "b.bin", "gz.txt", "m", "meta.txt", "oct.bin"]
    deep = [e.path for e in await sbx.files.list(d, depth=2)]
    assert f"{d}/m/2.txt" in deep

    moved = await sbx.files.rename(f"{d}/a.txt", f"{d}/renamed.txt")
    assert moved.path == f"{d}/renamed.txt"
    await sbx.files.remove(f"{d}/renamed.txt")
    assert await sbx.files.exists(f"{d}/renamed.txt") is False

    with pytest.raises(FileNotFoundException):
        await sbx.files.read(f"{d}/renamed.txt")
    with pytest.raises(FileNotFoundException):
        await sbx.files.get_info(f"{d}/renamed.txt")


async def test_async_watch_dir_stream(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)
    d = f"/home/user/{unique('aw')}"
    await sbx.files.make_dir(f"{d}/sub")
    events = []
    exits = []
    handle = await sbx.files.watch_dir(
        d, on_event=events.append, on_exit=exits.append, recursive=True, include_entry=True
    )
    try:
        await sbx.files.write(f"{d}/new.txt", "x")
        await sbx.files.write(f"{d}/sub/nested.txt", "y")
        await sbx.files.remove(f"{d}/new.txt")

        def seen(t, name):
            return any(e.type == t and e.name == name for e in events)

        await _wait_for(
            lambda: seen(FilesystemEventType.CREATE, "new.txt")
            and seen(FilesystemEventType.CREATE, "sub/nested.txt")
            and seen(FilesystemEventType.REMOVE, "new.txt"),
            10,
            "streamed watch events",
        )
        created = [e for e in events if e.type == FilesystemEventType.CREATE and e.name == "sub/nested.txt"]
        assert created[0].entry is not None and created[0].entry.path == f"{d}/sub/nested.txt"
    finally:
        await handle.stop()
    await _wait_for(lambda: exits, 5, "on_exit after stop()")
    assert exits == [None]


# --- code interpreter ---------------------------------------------------------------------


async def test_async_code_interpreter(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncCodeInterpreterSandbox, envs={"CF_CI_ENV": "ci-async"})
    info = await sbx.get_info()
    assert "code-interpreter-v1" in (info.template_id, info.name)

    await sbx.run_code("cf_a = 20")
    ex = await sbx.run_code("cf_a + 22")
    assert ex.text == "42" and ex.error is None
    first = ex.execution_count

    lines = []
    ex = await sbx.run_code("import os\nprint(os.environ['CF_CI_ENV'])\nprint(os.environ.get('CF_CALL'))",
                            on_stdout=lambda m: lines.append(m.line), envs={"CF_CALL": "per-call"})
    assert "".join(lines) == "ci-async\nper-call\n"
    assert ex.logs.stdout == lines
    assert ex.execution_count == first + 1

    ex = await sbx.run_code("raise ValueError('bad value')")
    assert ex.error.name == "ValueError" and ex.error.value == "bad value"
    assert "ValueError" in ex.error.traceback

    ex = await sbx.run_code("import pandas as pd\npd.DataFrame({'c': [1, 2]})")
    assert ex.results and "<table" in (ex.results[0].html or "")

    ctx = await sbx.create_code_context(cwd="/tmp")
    try:
        assert ctx.cwd == "/tmp" and ctx.language == "python"
        assert ctx.id in [c.id for c in await sbx.list_code_contexts()]
        await sbx.run_code("cf_ctx_only = 1", context=ctx)
        assert (await sbx.run_code("'cf_ctx_only' in globals()")).text == "False"
        assert (await sbx.run_code("cf_ctx_only", context=ctx)).text == "1"
        await sbx.restart_code_context(ctx)
        assert (await sbx.run_code("'cf_ctx_only' in globals()", context=ctx)).text == "False"
    finally:
        await sbx.remove_code_context(ctx)
    assert ctx.id not in [c.id for c in await sbx.list_code_contexts()]

    with pytest.raises(TimeoutException):
        await sbx.run_code("while True:\n    pass", timeout=2)
    assert (await sbx.run_code("cf_a", timeout=20)).text == "20"
