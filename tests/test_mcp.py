"""`cellfork mcp` driven by the official MCP Python SDK (``mcp`` on PyPI), as
any MCP client would: over stdio (the server is a child process with the
API key in its environment) and over streamable HTTP (each client sends its
own key). The server talks to the real test daemon that scripts/test.sh
starts (CELLFORK_URL, CELLFORK_API_KEY)."""

from __future__ import annotations

import asyncio
import base64
import os
import pathlib
import socket
import subprocess
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

import httpx
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

REPO = pathlib.Path(__file__).resolve().parent.parent
CELLFORK = str(REPO / "bin" / "cellfork")
TOOLS = {"create_sandbox", "run_code", "run_command", "read_file", "write_file", "list_files",
         "snapshot", "fork", "rollback", "pause", "kill", "list_sandboxes"}


def _env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(f"{name} is not set: these tests need a running daemon (scripts/test.sh exports it)", pytrace=False)
    return value


@pytest.fixture(scope="module")
def daemon() -> tuple[str, str]:
    return _env("CELLFORK_URL"), _env("CELLFORK_API_KEY")


def text_of(result: Any) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def call(session: ClientSession, tool: str, **args: Any) -> Any:
    result = await session.call_tool(tool, args)
    assert not result.is_error, f"{tool} failed: {text_of(result)}"
    return result


async def exercise(session: ClientSession, snapshots: list[str]) -> None:
    """Every tool and the file resource, on one sandbox and its fork. The
    snapshots it takes are added to snapshots, for the caller to delete."""
    await session.initialize()
    tools = {t.name for t in (await session.list_tools()).tools}
    assert TOOLS <= tools, f"missing tools: {TOOLS - tools}"
    templates = (await session.list_resource_templates()).resource_templates
    assert any("{sandbox_id}" in t.uri_template for t in templates)

    created = (await call(session, "create_sandbox", template="base", timeout_seconds=120)).structured_content
    sid = created["sandbox_id"]
    try:
        # The interpreter keeps state; the main result comes back as text.
        await call(session, "run_code", sandbox_id=sid, code="x = 41")
        assert text_of(await call(session, "run_code", sandbox_id=sid, code="print('out'); x + 1")) == "out\n\n42"
        # A plot is image content (a PNG).
        plot = await call(session, "run_code", sandbox_id=sid,
                          code="import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
        images = [c for c in plot.content if c.type == "image"]
        assert images and images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG")
        # An exception is a tool error with the traceback.
        err = await session.call_tool("run_code", {"sandbox_id": sid, "code": "1/0"})
        assert err.is_error and "ZeroDivisionError" in text_of(err)

        cmd = await session.call_tool("run_command", {"sandbox_id": sid, "command": "echo hi; echo oops >&2; exit 3"})
        assert cmd.is_error and cmd.structured_content == {"stdout": "hi\n", "stderr": "oops\n", "exit_code": 3}
        who = await call(session, "run_command", sandbox_id=sid, command="whoami", user="root")
        assert who.structured_content["stdout"] == "root\n"

        await call(session, "write_file", sandbox_id=sid, path="/home/user/notes/a.txt", content="hello\n")
        assert text_of(await call(session, "read_file", sandbox_id=sid, path="/home/user/notes/a.txt")) == "hello\n"
        listing = (await call(session, "list_files", sandbox_id=sid, path="/home/user/notes")).structured_content
        assert [e["name"] for e in listing["entries"]] == ["a.txt"]
        res = await session.read_resource(f"cellfork://sandboxes/{sid}/files/home/user/notes/a.txt")
        assert res.contents[0].text == "hello\n"
        missing = await session.call_tool("read_file", {"sandbox_id": sid, "path": "/nope"})
        assert missing.is_error

        # Snapshot, change, roll back: the change is gone.
        snap = (await call(session, "snapshot", sandbox_id=sid, name=f"mcp-{sid}")).structured_content
        snapshots.append(snap["snapshot_id"])
        await call(session, "run_code", sandbox_id=sid, code="x = 0")
        await call(session, "rollback", sandbox_id=sid, snapshot_id=snap["snapshot_id"])
        assert text_of(await call(session, "run_code", sandbox_id=sid, code="x")) == "41"

        forked = (await call(session, "fork", sandbox_id=sid, count=1)).structured_content
        assert len(forked["sandbox_ids"]) == 1
        child = forked["sandbox_ids"][0]
        assert text_of(await call(session, "run_code", sandbox_id=child, code="x")) == "41"
        listed = (await call(session, "list_sandboxes")).structured_content["sandboxes"]
        assert {sid, child} <= {s["sandbox_id"] for s in listed}
        await call(session, "kill", sandbox_id=child)

        # A paused sandbox is resumed by the next call on it.
        await call(session, "pause", sandbox_id=sid)
        assert text_of(await call(session, "run_code", sandbox_id=sid, code="x")) == "41"
    finally:
        await session.call_tool("kill", {"sandbox_id": sid})
    gone = await session.call_tool("run_code", {"sandbox_id": sid, "code": "1"})
    assert gone.is_error and "not found" in text_of(gone)


@pytest.mark.timeout(180)
def test_stdio(daemon: tuple[str, str]) -> None:
    url, key = daemon

    snapshots: list[str] = []

    async def main() -> None:
        params = StdioServerParameters(command=CELLFORK, args=["mcp"], env={"CELLFORK_URL": url, "CELLFORK_API_KEY": key})
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await exercise(session, snapshots)

    try:
        asyncio.run(main())
    finally:
        delete_snapshots(url, key, snapshots)


def delete_snapshots(url: str, key: str, ids: list[str]) -> None:
    for sid in ids:
        httpx.delete(f"{url}/snapshots/{sid}", headers={"X-API-KEY": key}, timeout=30)


def test_stdio_needs_a_key(daemon: tuple[str, str]) -> None:
    url, _ = daemon
    env = {k: v for k, v in os.environ.items() if k != "CELLFORK_API_KEY"}
    p = subprocess.run([CELLFORK, "mcp", "--url", url], env=env, input=b"", capture_output=True, timeout=30)
    assert p.returncode == 1 and b"no API key" in p.stderr


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def http_server(daemon: tuple[str, str]) -> AsyncIterator[str]:
    url, _ = daemon
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "CELLFORK_API_KEY"}  # clients bring their keys
    proc = subprocess.Popen([CELLFORK, "mcp", "--url", url, "--http", f"127.0.0.1:{port}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            break
        except OSError:
            time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail(f"cellfork mcp --http did not listen: {proc.stderr.read().decode()}")
    yield f"http://127.0.0.1:{port}/mcp"
    proc.terminate()
    proc.wait(timeout=10)


@asynccontextmanager
async def http_session(endpoint: str, headers: dict[str, str]) -> AsyncIterator[ClientSession]:
    async with create_mcp_http_client(headers=headers) as client:
        async with streamable_http_client(endpoint, http_client=client) as (read, write):
            async with ClientSession(read, write) as session:
                yield session


@pytest.mark.timeout(180)
def test_streamable_http(daemon: tuple[str, str], http_server: str) -> None:
    url, key = daemon
    snapshots: list[str] = []

    async def main() -> None:
        async with http_session(http_server, {"Authorization": f"Bearer {key}"}) as session:
            await exercise(session, snapshots)

    try:
        asyncio.run(main())
    finally:
        delete_snapshots(url, key, snapshots)


@pytest.mark.timeout(120)
def test_streamable_http_auth_and_egress(daemon: tuple[str, str], http_server: str) -> None:
    url, key = daemon
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"X-API-KEY": "wrong"}):
        r = httpx.post(http_server, json=init, headers={**accept, **headers}, timeout=30)
        assert r.status_code == 401, (headers, r.status_code, r.text)

    async def main() -> None:
        # X-API-KEY works as the daemon's own header; egress rules reach the daemon.
        async with http_session(http_server, {"X-API-KEY": key}) as session:
            await session.initialize()
            created = (await call(session, "create_sandbox", allow_internet=False,
                                  allow_out=["1.1.1.1"], deny_out=["0.0.0.0/0"])).structured_content
            sid = created["sandbox_id"]
            try:
                detail = httpx.get(f"{url}/sandboxes/{sid}", headers={"X-API-KEY": key}, timeout=30).json()
                assert detail["allowInternetAccess"] is False
                assert detail["network"]["allowOut"] == ["1.1.1.1"] and detail["network"]["denyOut"] == ["0.0.0.0/0"]
            finally:
                await call(session, "kill", sandbox_id=sid)

    asyncio.run(main())
