"""Sandbox lifecycle against the real daemon: create, info, list, connect,
set_timeout, kill."""

from datetime import datetime, timezone

import pytest

from cellfork import AuthenticationError, Sandbox, SandboxNotFoundError

from .helpers import poll

pytestmark = pytest.mark.integration


def test_create_info_and_list(new_sandbox, client_kwargs, run_tag):
    sb = new_sandbox(metadata={"purpose": "lifecycle"})
    assert sb.sandbox_id
    assert sb.is_running()
    info = sb.get_info()
    assert info.sandbox_id == sb.sandbox_id
    assert info.state == "running"
    assert info.template_id
    assert info.metadata.get("purpose") == "lifecycle"
    assert info.started_at is not None and info.end_at is not None

    listed = {s.sandbox_id: s for s in Sandbox.list(**client_kwargs)}
    assert sb.sandbox_id in listed
    assert listed[sb.sandbox_id].metadata.get("purpose") == "lifecycle"
    filtered = Sandbox.list(metadata={"purpose": "lifecycle", **run_tag}, **client_kwargs)
    assert [s.sandbox_id for s in filtered] == [sb.sandbox_id]


def test_create_envs_reach_commands_and_code(new_sandbox):
    sb = new_sandbox(envs={"CF_SANDBOX_ENV": "from-create"})
    assert sb.commands.run("echo $CF_SANDBOX_ENV").stdout == "from-create\n"
    ex = sb.run_code("import os; print(os.environ.get('CF_SANDBOX_ENV'))")
    assert ex.logs.stdout == ["from-create\n"]


def test_set_timeout_moves_end(new_sandbox):
    sb = new_sandbox(timeout=60)
    sb.set_timeout(600)
    left = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    assert 500 < left <= 610, left
    sb.set_timeout(100)
    left = (sb.get_info().end_at - datetime.now(timezone.utc)).total_seconds()
    assert 40 < left <= 110, left


def test_connect_reaches_the_same_sandbox(new_sandbox, client_kwargs):
    sb = new_sandbox()
    sb.files.write("/tmp/marker", "connected")
    other = Sandbox.connect(sb.sandbox_id, **client_kwargs)
    try:
        assert other.sandbox_id == sb.sandbox_id
        assert other.commands.run("cat /tmp/marker").stdout == "connected"
        assert other.run_code("1 + 1").text == "2"
    finally:
        other.close()


def test_kill(new_sandbox, client_kwargs):
    sb = new_sandbox()
    assert sb.kill() is True
    assert poll(lambda: not sb.is_running())
    with pytest.raises(SandboxNotFoundError) as info:
        sb.get_info()
    assert info.value.status_code == 404
    assert sb.kill() is False
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect(sb.sandbox_id, **client_kwargs)
    assert sb.sandbox_id not in {s.sandbox_id for s in Sandbox.list(**client_kwargs)}


def test_context_manager_kills_on_exit(client_kwargs, run_tag, no_leaked_sandboxes):
    with Sandbox.create(timeout=120, metadata=run_tag, **client_kwargs) as sb:
        assert sb.is_running()
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect(sb.sandbox_id, **client_kwargs)


def test_unknown_sandbox(client_kwargs):
    with pytest.raises(SandboxNotFoundError) as info:
        Sandbox.connect("no-such-sandbox", **client_kwargs)
    assert info.value.status_code == 404
    assert info.value.request_id  # the daemon tags every answer


def test_wrong_api_key(cellfork_url):
    with pytest.raises(AuthenticationError) as info:
        Sandbox.create(base_url=cellfork_url, api_key="definitely-wrong")
    assert info.value.status_code == 401
    with pytest.raises(AuthenticationError):
        Sandbox.list(base_url=cellfork_url, api_key="definitely-wrong")
