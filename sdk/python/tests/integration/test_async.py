"""The async twin's main flows against the real daemon."""

import asyncio

import pytest

from cellfork import (
    AsyncSandbox,
    CommandExitError,
    NotFoundError,
    SandboxNotFoundError,
)

pytestmark = pytest.mark.integration


async def test_lifecycle(client_kwargs, run_tag, no_leaked_sandboxes):
    async with await AsyncSandbox.create(timeout=120, metadata=run_tag, **client_kwargs) as sb:
        assert await sb.is_running()
        info = await sb.get_info()
        assert info.sandbox_id == sb.sandbox_id and info.state == "running"
        assert sb.sandbox_id in {s.sandbox_id for s in await AsyncSandbox.list(**client_kwargs)}
        await sb.set_timeout(300)
        other = await AsyncSandbox.connect(sb.sandbox_id, **client_kwargs)
        assert (await other.commands.run("echo via-connect")).stdout == "via-connect\n"
        await other.close()
    with pytest.raises(SandboxNotFoundError):
        await AsyncSandbox.connect(sb.sandbox_id, **client_kwargs)


async def test_run_code(async_sandbox):
    seen = []

    async def on_stdout(text):
        seen.append(text)

    await async_sandbox.run_code("cf_y = 20")
    ex = await async_sandbox.run_code("print('hi')\ncf_y + 1", on_stdout=on_stdout)
    assert ex.text == "21" and seen == ["hi\n"]
    ex = await async_sandbox.run_code("1/0")
    assert ex.error is not None and ex.error.name == "ZeroDivisionError"


async def test_commands(async_sandbox):
    out = []
    res = await async_sandbox.commands.run("echo one; echo two", on_stdout=out.append)
    assert res.stdout == "one\ntwo\n" == "".join(out)
    assert (await async_sandbox.commands.run("whoami", user="root")).stdout == "root\n"
    with pytest.raises(CommandExitError) as info:
        await async_sandbox.commands.run("exit 7")
    assert info.value.exit_code == 7


async def test_background_commands_run_concurrently(async_sandbox):
    handle = await async_sandbox.commands.run("sleep 60", background=True)
    quick = await async_sandbox.commands.run("sleep 1; echo quick", background=True)
    assert (await quick.wait()).stdout == "quick\n"
    assert await handle.kill() is True
    with pytest.raises(CommandExitError):
        await asyncio.wait_for(handle.wait(), timeout=15)


async def test_files(async_sandbox):
    path = "/home/user/async-test/f.txt"
    await async_sandbox.files.write(path, "async")
    assert await async_sandbox.files.read(path) == "async"
    assert [e.name for e in await async_sandbox.files.list("/home/user/async-test")] == ["f.txt"]
    assert await async_sandbox.files.exists(path)
    await async_sandbox.files.remove(path)
    assert not await async_sandbox.files.exists(path)
    with pytest.raises(NotFoundError):
        await async_sandbox.files.read(path)
