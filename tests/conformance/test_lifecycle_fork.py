"""Snapshots, fork, pause/connect and lifecycle through the official SDKs
(spec §2.3, §2.4.7): create_snapshot, list_snapshots (paginator),
delete_snapshot (DELETE /templates/{id}), Sandbox.create(<snapshot id>),
fork(count=) with per-child results, pause() / connect() with 409 and
200/201, get_info().state == "paused", and lifecycle on_timeout="pause";
then the async twins.

"Exact" state = a REPL variable (code interpreter), a file, and a
background process that is still running under the same pid.

Every test deletes the snapshots it made and kills the sandboxes it made,
fork children included."""

from __future__ import annotations

import asyncio
import time
from typing import Any, List

import pytest

from e2b import (
    AsyncSandbox as AsyncE2BSandbox,
    AsyncSnapshotPaginator,
    CommandExitException,
    InvalidArgumentException,
    Sandbox as E2BSandbox,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
    SnapshotInfo,
    SnapshotPaginator,
)
from e2b_code_interpreter import AsyncSandbox, Sandbox

from ._util import unique, wait_until

pytestmark = pytest.mark.timeout(120)

STATE_FILE = "/home/user/cf-state.txt"


# --- fixtures and helpers ------------------------------------------------------


@pytest.fixture
def cleanup(e2b_env, leak_check):
    """``cleanup.snapshot(info)`` / ``cleanup.sandbox(sbx)`` register what a
    test made; at teardown snapshots are deleted and sandboxes killed (by id,
    so async ones need no event loop), whatever happened."""

    class Registry:
        def __init__(self) -> None:
            self.snapshots: List[str] = []
            self.sandboxes: List[str] = []

        def snapshot(self, info: Any) -> Any:
            self.snapshots.append(info.snapshot_id)
            return info

        def sandbox(self, sbx: Any) -> Any:
            if not isinstance(sbx, Exception):
                self.sandboxes.append(sbx.sandbox_id)
            return sbx

    reg = Registry()
    try:
        yield reg
    finally:
        for sandbox_id in reg.sandboxes:
            try:
                E2BSandbox.kill(sandbox_id)
            except Exception:
                pass
        for snapshot_id in reg.snapshots:
            try:
                E2BSandbox.delete_snapshot(snapshot_id)
            except Exception:
                pass


@pytest.fixture(scope="module")
def stateful(module_sandbox_factory):
    """A code-interpreter sandbox holding known state, shared by the tests
    that only read it (snapshots and forks do not change their source)."""
    sbx = module_sandbox_factory(Sandbox)
    pid = set_state(sbx, "source")
    return sbx, pid


def set_state(sbx: Any, value: str) -> int:
    """REPL variable, file and background process; returns the pid."""
    ex = sbx.run_code(f"cf_x = {value!r}")
    assert ex.error is None, ex.error
    sbx.files.write(STATE_FILE, value)
    handle = sbx.commands.run("sleep 1000", background=True, timeout=0)
    handle.disconnect()  # the process keeps running
    return handle.pid


def proc_cmdline(sbx: Any, pid: int):
    try:
        out = sbx.commands.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout.strip()
    except CommandExitException:
        return None
    return out


def assert_state(sbx: Any, pid: int, value: str) -> None:
    # A str result is shown without quotes, as upstream's code interpreter does.
    assert sbx.run_code("cf_x").text == value, sbx.sandbox_id
    assert sbx.files.read(STATE_FILE) == value, sbx.sandbox_id
    cmd = proc_cmdline(sbx, pid)
    assert cmd is not None and "sleep 1000" in cmd, (sbx.sandbox_id, pid, cmd)


def all_pages(paginator: SnapshotPaginator) -> List[SnapshotInfo]:
    items: List[SnapshotInfo] = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def snapshot_ids(**kwargs: Any) -> List[str]:
    return [s.snapshot_id for s in all_pages(E2BSandbox.list_snapshots(**kwargs))]


# --- create_snapshot ------------------------------------------------------------


def test_create_snapshot(stateful, cleanup):
    sbx, pid = stateful
    snap = cleanup.snapshot(sbx.create_snapshot())
    assert isinstance(snap, SnapshotInfo)
    assert isinstance(snap.snapshot_id, str) and snap.snapshot_id
    assert snap.names == []
    # The source keeps running, unchanged.
    assert sbx.get_info().state == SandboxState.RUNNING
    assert_state(sbx, pid, "source")


def test_create_snapshot_with_name(stateful, cleanup):
    sbx, _ = stateful
    name = unique("cf-snap")
    snap = cleanup.snapshot(sbx.create_snapshot(name=name))
    assert name in snap.names
    assert snapshot_ids(name=name) == [snap.snapshot_id]
    # The static variant takes the sandbox id.
    other = cleanup.snapshot(E2BSandbox.create_snapshot(sbx.sandbox_id))
    assert other.snapshot_id != snap.snapshot_id and other.names == []


def test_create_snapshot_with_an_existing_name_reuses_it(stateful, cleanup):
    # SDK 2.63.0 create_snapshot(name=): "If a snapshot template with this
    # name already exists, a new build will be assigned to the existing
    # template instead of creating a new one." The name then starts the
    # newest state.
    sbx, _ = stateful
    name = unique("cf-snap-again")
    first = cleanup.snapshot(sbx.create_snapshot(name=name))
    sbx.run_code("cf_again = 'second'")
    try:
        second = cleanup.snapshot(sbx.create_snapshot(name=name))
        assert name in second.names
        restored = cleanup.sandbox(Sandbox.create(name, timeout=60, metadata=_tag(sbx)))
        assert restored.run_code("cf_again").text == "second"
    finally:
        sbx.run_code("del cf_again")
    assert first.snapshot_id


def test_create_snapshot_of_unknown_sandbox():
    with pytest.raises(SandboxNotFoundException):
        E2BSandbox.create_snapshot("cfnosuchsandbox" + unique("x")[-6:])


# --- Sandbox.create(<snapshot>) --------------------------------------------------


def test_create_from_snapshot_restores_exact_state(stateful, cleanup):
    sbx, pid = stateful
    name = unique("cf-restore")
    snap = cleanup.snapshot(sbx.create_snapshot(name=name))
    for template in (snap.snapshot_id, name):
        restored = cleanup.sandbox(Sandbox.create(template, timeout=60, metadata=_tag(sbx)))
        assert restored.sandbox_id != sbx.sandbox_id
        assert restored.get_info().state == SandboxState.RUNNING
        assert_state(restored, pid, "source")
        # It is its own sandbox: changing it leaves the source alone.
        restored.run_code("cf_x = 'restored'")
        restored.files.write(STATE_FILE, "restored")
        assert restored.commands.kill(pid) is True
    assert_state(sbx, pid, "source")


# --- list_snapshots ---------------------------------------------------------------


def test_list_snapshots_paginates_and_filters(stateful, make_sandbox, cleanup):
    sbx, _ = stateful
    mine = [cleanup.snapshot(sbx.create_snapshot()).snapshot_id for _ in range(3)]
    elsewhere = make_sandbox()
    theirs = cleanup.snapshot(elsewhere.create_snapshot()).snapshot_id

    # Static variant filtered by sandbox, one per page, following X-Next-Token.
    paginator = E2BSandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
    assert isinstance(paginator, SnapshotPaginator)
    pages = []
    while paginator.has_next:
        pages.append(paginator.next_items())
    assert all(len(page) <= 1 for page in pages)
    listed = [s.snapshot_id for page in pages for s in page]
    assert len(listed) == len(set(listed))
    assert [i for i in listed if i in mine] == mine  # oldest first
    assert theirs not in listed
    assert paginator.has_next is False and not paginator.next_token
    with pytest.raises(Exception):
        paginator.next_items()

    # The instance variant lists this sandbox's snapshots only.
    own = [s.snapshot_id for s in all_pages(sbx.list_snapshots())]
    assert set(mine) <= set(own) and theirs not in own
    assert [s.snapshot_id for s in all_pages(elsewhere.list_snapshots())] == [theirs]
    # Unfiltered: everything.
    every = snapshot_ids()
    assert set(mine) | {theirs} <= set(every)
    assert snapshot_ids(sandbox_id="cfnosuchsandbox") == []


def test_list_snapshots_name_filter_also_matches_the_id(stateful, cleanup):
    # SDK 2.63.0 list_snapshots(name=): "Filter snapshots by name or ID".
    sbx, _ = stateful
    named = cleanup.snapshot(sbx.create_snapshot(name=unique("cf-by-id")))
    unnamed = cleanup.snapshot(sbx.create_snapshot())
    assert snapshot_ids(name=named.snapshot_id) == [named.snapshot_id]
    assert snapshot_ids(name=unnamed.snapshot_id) == [unnamed.snapshot_id]


# --- delete_snapshot --------------------------------------------------------------


def test_delete_snapshot_true_then_false(stateful, cleanup):
    sbx, _ = stateful
    snap = cleanup.snapshot(sbx.create_snapshot(name=unique("cf-del")))
    restored = cleanup.sandbox(Sandbox.create(snap.snapshot_id, timeout=60, metadata=_tag(sbx)))

    assert E2BSandbox.delete_snapshot(snap.snapshot_id) is True
    assert E2BSandbox.delete_snapshot(snap.snapshot_id) is False
    assert snap.snapshot_id not in snapshot_ids(sandbox_id=sbx.sandbox_id)
    assert snapshot_ids(name=snap.names[0]) == []
    with pytest.raises(SandboxException) as ei:
        Sandbox.create(snap.snapshot_id, timeout=30, metadata=_tag(sbx))
    assert ei.value.status_code in (400, 404)
    # A sandbox started from it keeps working.
    assert restored.run_code("cf_x").text == "source"


def test_delete_unknown_snapshot_is_false(e2b_env):
    assert E2BSandbox.delete_snapshot("cf-no-such-snapshot-" + unique("x")[-6:]) is False
    # The SDK percent-encodes the id (spec §2.3): '/' and ':' must not break routing.
    assert E2BSandbox.delete_snapshot("cf-team/no-such:tag") is False


# --- fork ------------------------------------------------------------------------


def test_fork_count_three_independent_children(stateful, cleanup):
    sbx, pid = stateful
    children = [cleanup.sandbox(c) for c in sbx.fork(count=3, timeout=90)]
    assert len(children) == 3
    errors = [c for c in children if isinstance(c, Exception)]
    assert not errors, errors
    assert all(isinstance(c, Sandbox) for c in children)  # the caller's class
    ids = {c.sandbox_id for c in children}
    assert len(ids) == 3 and sbx.sandbox_id not in ids
    for child in children:
        info = child.get_info()
        assert info.state == SandboxState.RUNNING
        assert info.metadata == sbx.get_info().metadata
        assert 80 <= (info.end_at - info.started_at).total_seconds() <= 100
        assert_state(child, pid, "source")

    for i, child in enumerate(children):
        child.run_code(f"cf_x = 'child{i}'")
        child.files.write(STATE_FILE, f"child{i}")
    assert children[0].commands.kill(pid) is True
    assert proc_cmdline(children[0], pid) is None
    for i, child in enumerate(children[1:], start=1):
        assert_state(child, pid, f"child{i}")
    assert_state(sbx, pid, "source")


def test_fork_static_variant_and_default_count(stateful, cleanup):
    sbx, pid = stateful
    results = [cleanup.sandbox(c) for c in Sandbox.fork(sbx.sandbox_id)]
    assert len(results) == 1 and isinstance(results[0], Sandbox), results
    assert_state(results[0], pid, "source")


def test_fork_errors(e2b_env):
    with pytest.raises(SandboxNotFoundException):
        E2BSandbox.fork("cfnosuchsandbox" + unique("x")[-6:])
    for bad in (0, 21):  # checked by the SDK before any request
        with pytest.raises(InvalidArgumentException):
            E2BSandbox.fork("cfnosuchsandbox", count=bad)


# --- pause / connect -------------------------------------------------------------


def test_pause_then_connect_resumes_exact_state(make_sandbox):
    sbx = make_sandbox(Sandbox)
    pid = set_state(sbx, "paused once")

    assert sbx.pause() is True
    assert sbx.pause() is False  # 409: already paused
    assert E2BSandbox.pause(sbx.sandbox_id) is False
    info = sbx.get_info()
    assert info.state == SandboxState.PAUSED
    paused = [s.sandbox_id for s in all_sandbox_pages(SandboxState.PAUSED)]
    assert sbx.sandbox_id in paused

    same = Sandbox.connect(sbx.sandbox_id)  # 201: resumed
    assert same.sandbox_id == sbx.sandbox_id
    assert sbx.get_info().state == SandboxState.RUNNING
    assert_state(same, pid, "paused once")
    # connect on a running sandbox is a plain 200 and changes nothing.
    assert Sandbox.connect(sbx.sandbox_id).sandbox_id == sbx.sandbox_id
    assert_state(sbx, pid, "paused once")

    # Again with the static pause and the instance connect.
    assert E2BSandbox.pause(sbx.sandbox_id) is True
    assert sbx.get_info().state == SandboxState.PAUSED
    assert sbx.connect() is sbx
    assert sbx.get_info().state == SandboxState.RUNNING
    assert_state(sbx, pid, "paused once")


def test_pause_and_connect_unknown_sandbox(e2b_env):
    missing = "cfnosuchsandbox" + unique("x")[-6:]
    with pytest.raises(SandboxNotFoundException):
        E2BSandbox.pause(missing)
    with pytest.raises(SandboxNotFoundException):
        E2BSandbox.connect(missing)


def all_sandbox_pages(state: SandboxState):
    paginator = E2BSandbox.list(query=SandboxQuery(state=[state]))
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


# --- lifecycle: pause on timeout --------------------------------------------------


def test_lifecycle_on_timeout_pause(make_sandbox):
    sbx = make_sandbox(Sandbox, timeout=5, lifecycle={"on_timeout": "pause"})
    created = time.monotonic()
    sbx.files.write(STATE_FILE, "auto-paused")
    handle = sbx.commands.run("sleep 1000", background=True, timeout=0)
    handle.disconnect()
    info = sbx.get_info()
    assert info.lifecycle is not None and info.lifecycle["on_timeout"] == "pause"
    assert time.monotonic() - created < 4, "setup took too long to observe the timeout"

    # At the timeout it pauses instead of dying, and stays paused.
    wait_until(lambda: sbx.get_info().state == SandboxState.PAUSED, timeout=20,
               what="the sandbox to pause at its timeout")
    time.sleep(1)
    assert sbx.get_info().state == SandboxState.PAUSED

    sbx.connect(timeout=60)
    assert sbx.get_info().state == SandboxState.RUNNING
    assert sbx.files.read(STATE_FILE) == "auto-paused"
    cmd = proc_cmdline(sbx, handle.pid)
    assert cmd is not None and "sleep 1000" in cmd


def test_lifecycle_auto_resume_wakes_on_traffic(make_sandbox):
    sbx = make_sandbox(Sandbox, timeout=120, lifecycle={"on_timeout": "pause", "auto_resume": True})
    assert sbx.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
    sbx.run_code("cf_woken = 'yes'")
    assert sbx.pause() is True
    assert sbx.get_info().state == SandboxState.PAUSED
    # The SDK's health check does not wake it; a request with its token does.
    assert sbx.is_running() is False
    assert sbx.get_info().state == SandboxState.PAUSED
    assert sbx.run_code("cf_woken").text == "yes"
    assert sbx.get_info().state == SandboxState.RUNNING

    other = make_sandbox(Sandbox, timeout=120, lifecycle={"on_timeout": "pause"})
    assert other.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": False}
    other.pause()
    with pytest.raises(Exception):
        other.files.read("/etc/hostname")
    assert other.get_info().state == SandboxState.PAUSED


def test_auto_resume_needs_pause_on_timeout(e2b_env):
    # The SDK refuses it before sending; the daemon does too (tests/fuzz, api.md).
    with pytest.raises(Exception):
        Sandbox.create(timeout=30, lifecycle={"on_timeout": "kill", "auto_resume": True})


def test_lifecycle_default_is_kill(stateful):
    # (That such a sandbox really dies: test_sandbox_lifecycle.py.)
    sbx, _ = stateful
    lifecycle = sbx.get_info().lifecycle
    assert lifecycle is not None and lifecycle["on_timeout"] == "kill"


def _tag(sbx: Any) -> dict:
    """The run's metadata tag (from the source sandbox), for leak checking."""
    return dict(sbx.get_info().metadata)


# --- async twins ------------------------------------------------------------------


async def _async_state(sbx: Any, pid: int, value: str) -> None:
    assert (await sbx.run_code("cf_x")).text == value
    assert await sbx.files.read(STATE_FILE) == value
    out = (await sbx.commands.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline")).stdout
    assert "sleep 1000" in out


async def _async_set_state(sbx: Any, value: str) -> int:
    assert (await sbx.run_code(f"cf_x = {value!r}")).error is None
    await sbx.files.write(STATE_FILE, value)
    handle = await sbx.commands.run("sleep 1000", background=True, timeout=0)
    await handle.disconnect()
    return handle.pid


@pytest.mark.asyncio
async def test_async_snapshot_and_create_from_it(make_async_sandbox, cleanup):
    sbx = await make_async_sandbox(AsyncSandbox)
    pid = await _async_set_state(sbx, "async")
    name = unique("cf-async-snap")
    snap = cleanup.snapshot(await sbx.create_snapshot(name=name))
    assert isinstance(snap, SnapshotInfo) and name in snap.names

    paginator = AsyncE2BSandbox.list_snapshots(sandbox_id=sbx.sandbox_id, limit=1)
    assert isinstance(paginator, AsyncSnapshotPaginator)
    listed = []
    while paginator.has_next:
        listed.extend(await paginator.next_items())
    assert [s.snapshot_id for s in listed] == [snap.snapshot_id]

    restored = cleanup.sandbox(await AsyncSandbox.create(snap.snapshot_id, timeout=60,
                                                         metadata=(await sbx.get_info()).metadata))
    await _async_state(restored, pid, "async")

    assert await AsyncE2BSandbox.delete_snapshot(snap.snapshot_id) is True
    assert await AsyncE2BSandbox.delete_snapshot(snap.snapshot_id) is False


@pytest.mark.asyncio
async def test_async_fork(make_async_sandbox, cleanup):
    sbx = await make_async_sandbox(AsyncSandbox)
    pid = await _async_set_state(sbx, "async parent")
    children = [cleanup.sandbox(c) for c in await sbx.fork(count=2)]
    assert len(children) == 2
    assert all(isinstance(c, AsyncSandbox) for c in children), children
    assert len({c.sandbox_id for c in children} | {sbx.sandbox_id}) == 3
    await asyncio.gather(*(_async_state(c, pid, "async parent") for c in children))
    await children[0].run_code("cf_x = 'async child'")
    await _async_state(children[1], pid, "async parent")
    await _async_state(sbx, pid, "async parent")


@pytest.mark.asyncio
async def test_async_pause_and_connect(make_async_sandbox):
    sbx = await make_async_sandbox(AsyncSandbox)
    pid = await _async_set_state(sbx, "async paused")
    assert await sbx.pause() is True
    assert await sbx.pause() is False
    assert (await sbx.get_info()).state == SandboxState.PAUSED
    same = await AsyncSandbox.connect(sbx.sandbox_id)
    assert same.sandbox_id == sbx.sandbox_id
    assert (await sbx.get_info()).state == SandboxState.RUNNING
    await _async_state(same, pid, "async paused")

    assert await AsyncE2BSandbox.pause(sbx.sandbox_id) is True
    assert await sbx.connect() is sbx
    await _async_state(sbx, pid, "async paused")


# --- E2B's identity variables ------------------------------------------------------


IDENTITY = 'echo "$E2B_SANDBOX $E2B_SANDBOX_ID $E2B_TEMPLATE_ID"; cat /run/e2b/.E2B_SANDBOX_ID'


def test_identity_variables_name_each_sandbox(make_sandbox, cleanup):
    """E2B sets E2B_SANDBOX, E2B_SANDBOX_ID, E2B_TEAM_ID and E2B_TEMPLATE_ID
    for commands and code, and keeps them as dot files in /run/e2b; a fork
    child is another sandbox and says so."""
    sbx = make_sandbox(cls=Sandbox, envs={"E2B_TEAM_ID": "mine"})
    sid, tpl = sbx.sandbox_id, sbx.get_info().template_id
    assert sbx.commands.run(IDENTITY).stdout == f"true {sid} {tpl}\n{sid}"
    assert sbx.commands.run("echo $E2B_TEAM_ID", user="root").stdout == "mine\n"  # the create's envs win
    code = "import os; print(os.environ['E2B_SANDBOX_ID'])"
    assert sbx.run_code(code).logs.stdout == [f"{sid}\n"]

    child = cleanup.sandbox(sbx.fork(count=1, timeout=90)[0])
    assert isinstance(child, Sandbox)
    cid = child.sandbox_id
    assert child.commands.run(IDENTITY).stdout == f"true {cid} {tpl}\n{cid}"
    assert child.run_code(code).logs.stdout == [f"{cid}\n"]
    assert sbx.commands.run(IDENTITY).stdout == f"true {sid} {tpl}\n{sid}"
