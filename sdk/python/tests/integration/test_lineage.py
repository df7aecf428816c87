"""Lineage against the real daemon: snapshots, create-from-snapshot, fork,
rollback, pause/resume (from memory and from disk), merge, the snapshot
tree and deleting snapshots.

"Exact" means the whole state comes along: a variable in the code
interpreter's REPL, a file, and a background process (same pid, still
running)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from cellfork import (
    AsyncSandbox,
    CellforkError,
    CommandExitError,
    ConflictError,
    NotFoundError,
    Sandbox,
    SandboxNotFoundError,
    SnapshotInfo,
    SnapshotNode,
)

pytestmark = pytest.mark.integration

STATE_FILE = "/home/user/state.txt"


@pytest.fixture
def made(client_kwargs: dict[str, Any], no_leaked_sandboxes):
    """Collects sandboxes (killed) and snapshots (deleted) made by a test."""
    sandboxes: list[Any] = []
    snapshots: list[str] = []

    def keep(*objs: Any) -> Any:
        for obj in objs:
            if isinstance(obj, SnapshotInfo):
                snapshots.append(obj.id)
            elif isinstance(obj, (Sandbox, AsyncSandbox)):
                sandboxes.append(obj)
        return objs[0] if len(objs) == 1 else objs

    yield keep
    errors = []
    for sb in sandboxes:
        try:  # async ones by id, as the test's event loop may be gone
            Sandbox.connect(sb.sandbox_id, **client_kwargs).kill()
        except SandboxNotFoundError:
            pass  # killed or merged by the test
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
    for snap_id in snapshots:
        try:
            Sandbox.delete_snapshot(snap_id, **client_kwargs)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    assert not errors, errors


@pytest.fixture
def make(client_kwargs, run_tag, made):
    def create(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("timeout", 180)
        kwargs["metadata"] = {**run_tag, **(kwargs.get("metadata") or {})}
        return made(Sandbox.create(**client_kwargs, **kwargs))

    return create


def set_state(sb: Sandbox, value: str) -> int:
    """Put ``value`` in the REPL and in a file; start a background process.
    Returns its pid."""
    assert sb.run_code(f"x = {value!r}").error is None
    sb.files.write(STATE_FILE, value)
    handle = sb.commands.run("sleep 1000", background=True, timeout=0)
    handle.close()  # stop reading its output; the process keeps running
    return handle.pid


def get_state(sb: Sandbox, pid: int) -> tuple[str | None, str | None, str | None]:
    """(REPL x, file contents, command line of ``pid`` or None if gone)."""
    ex = sb.run_code("x")
    x = None if ex.error else ex.text
    content = sb.files.read(STATE_FILE) if sb.files.exists(STATE_FILE) else None
    try:
        cmd = sb.commands.run(f"tr '\\0' ' ' < /proc/{pid}/cmdline").stdout.strip()
    except CommandExitError:
        cmd = None
    return x, content, cmd


def assert_state(sb: Sandbox, pid: int, value: str) -> None:
    x, content, cmd = get_state(sb, pid)
    # A str result shows without quotes (as upstream).
    assert (x, content) == (value, value), sb.sandbox_id
    assert cmd is not None and "sleep 1000" in cmd, (sb.sandbox_id, cmd)


def unique_name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


# --- snapshot -> create(snapshot=) ---------------------------------------------


def test_snapshot_then_create_restores_exact_state(make, made):
    src = make()
    pid = set_state(src, "original")
    name = unique_name("sdk-exact")
    snap = made(src.snapshot(name))
    assert isinstance(snap, SnapshotInfo)
    assert snap.id and snap.names == [name]
    assert snap.sandbox_id == src.sandbox_id and snap.template_id == "base"
    assert snap.size_bytes and snap.size_bytes > 0 and snap.created_at is not None

    # The source keeps running, unchanged, and may move on.
    assert_state(src, pid, "original")
    src.run_code("x = 'moved on'")

    for ref in (snap, snap.id, name):
        restored = make(snapshot=ref)
        assert restored.sandbox_id != src.sandbox_id
        # The first restores; a later one may resume the standby the first
        # left (the daemon's --standby-snapshots).
        assert restored.boot_mode in ("restore", "standby")
        assert_state(restored, pid, "original")
        info = restored.get_info()
        assert info.snapshot_id == snap.id and info.state == "running"


# --- fork ----------------------------------------------------------------------


def test_fork_three_independent_children(make, made):
    parent = make()
    pid = set_state(parent, "parent")
    children = made(*parent.fork(3, timeout=120))
    assert len(children) == 3
    assert all(isinstance(c, Sandbox) for c in children), children
    ids = {c.sandbox_id for c in children}
    assert len(ids) == 3 and parent.sandbox_id not in ids
    for child in children:
        assert child.boot_mode == "fork"
        assert child.get_info().parent_sandbox_id == parent.sandbox_id
        assert_state(child, pid, "parent")

    # Each goes its own way.
    for i, child in enumerate(children):
        child.run_code(f"x = 'child{i}'")
        child.files.write(STATE_FILE, f"child{i}")
    assert children[0].commands.kill(pid) is True
    parent.run_code("x = 'parent2'")

    x, content, cmd = get_state(children[0], pid)
    assert (x, content, cmd) == ("child0", "child0", None)
    for i, child in enumerate(children[1:], start=1):
        assert_state(child, pid, f"child{i}")
    assert get_state(parent, pid)[0] == "parent2"
    assert get_state(parent, pid)[1] == "parent"
    assert get_state(parent, pid)[2] is not None


def test_fork_of_a_missing_sandbox(client_kwargs, make):
    sb = make()
    sb.kill()
    with pytest.raises(SandboxNotFoundError):
        sb.fork()


# --- rollback ------------------------------------------------------------------


def test_rollback_restores_state_in_place(make, made):
    sb = make()
    pid = set_state(sb, "checkpoint")
    name = unique_name("sdk-rb")
    snap = made(sb.snapshot(name))

    sb.run_code("x = 'changed'")
    sb.files.write(STATE_FILE, "changed")
    sb.commands.kill(pid)
    assert get_state(sb, pid) == ("changed", "changed", None)

    sb.rollback(snap)
    assert sb.sandbox_id == sb.get_info().sandbox_id
    assert_state(sb, pid, "checkpoint")
    assert sb.get_info().snapshot_id == snap.id

    # Again, by name, after changing things once more.
    sb.run_code("x = 'changed again'")
    sb.rollback(name)
    assert_state(sb, pid, "checkpoint")


def test_rollback_errors(make, made):
    a, b = make(), make()
    snap_b = made(b.snapshot())
    with pytest.raises(ConflictError):  # not in a's tree
        a.rollback(snap_b)
    with pytest.raises(NotFoundError) as info:
        a.rollback("no-such-snapshot-" + uuid.uuid4().hex[:6])
    assert info.value.status_code == 404
    assert a.run_code("1 + 1").text == "2"  # a failed rollback changes nothing


# --- pause / resume ------------------------------------------------------------


@pytest.mark.parametrize("how", ["memory", "spill", "spill-later"])
def test_pause_and_resume_keep_state(make, client_kwargs, how):
    # memory: resumed at once (before the daemon's --spill-after);
    # spill: pause(spill=True) writes it to disk before returning;
    # spill-later: a sandbox paused earlier is moved to disk by pause(spill=True).
    sb = make()
    pid = set_state(sb, "before pause")
    assert sb.pause(spill=how == "spill") is True
    assert sb.pause() is False  # already paused
    if how == "spill-later":
        assert sb.pause(spill=True) is True
    assert sb.get_info().state == "paused"
    listed = {s.sandbox_id: s for s in Sandbox.list(state=["paused"], **client_kwargs)}
    assert sb.sandbox_id in listed

    resumed = Sandbox.connect(sb.sandbox_id, **client_kwargs)
    try:
        assert resumed.sandbox_id == sb.sandbox_id
        assert sb.get_info().state == "running"
        assert_state(resumed, pid, "before pause")
        assert_state(sb, pid, "before pause")  # the old object works too
    finally:
        resumed.close()


# --- merge ---------------------------------------------------------------------


def test_merge_child_into_parent(make, made, client_kwargs):
    parent = make()
    pid = set_state(parent, "parent")
    child, other = made(*parent.fork(2))
    child.run_code("x = 'merged'")
    child.files.write(STATE_FILE, "merged")
    other.run_code("x = 'other'")

    parent.merge(child)
    assert_state(parent, pid, "merged")
    assert parent.get_info().sandbox_id == parent.sandbox_id
    with pytest.raises(SandboxNotFoundError):
        child.get_info()
    assert child.kill() is False
    # The other child is untouched.
    assert get_state(other, pid)[:2] == ("other", "parent")

    stranger = make()
    with pytest.raises(ConflictError):
        parent.merge(stranger)
    with pytest.raises(NotFoundError):
        parent.merge(child)  # gone


# --- snapshot tree, listing, delete -------------------------------------------


def test_snapshot_tree_and_listing(make, made, client_kwargs):
    a = make()
    s1 = made(a.snapshot(unique_name("sdk-root")))
    b = make(snapshot=s1)
    s2 = made(b.snapshot())
    s3 = made(a.snapshot())
    (fork_child,) = a.fork()
    made(fork_child)
    s4 = made(fork_child.snapshot())

    assert (s1.parent_id, s2.parent_id, s3.parent_id, s4.parent_id) == (None, s1.id, s1.id, s3.id)

    listed = Sandbox.list_snapshots(**client_kwargs)
    pos = {s.id: i for i, s in enumerate(listed)}
    assert pos[s1.id] < pos[s2.id] < pos[s3.id] < pos[s4.id]  # oldest first
    assert [s.id for s in Sandbox.list_snapshots(sandbox_id=b.sandbox_id, **client_kwargs)] == [s2.id]
    assert [s.id for s in Sandbox.list_snapshots(sandbox_id=a.sandbox_id, **client_kwargs)] == [s1.id, s3.id]
    assert [s.id for s in Sandbox.list_snapshots(name=s1.names[0], **client_kwargs)] == [s1.id]
    assert len(Sandbox.list_snapshots(limit=2, **client_kwargs)) == 2
    got = Sandbox.get_snapshot(s1.names[0], **client_kwargs)
    assert got == s1

    roots = Sandbox.snapshot_tree(**client_kwargs)
    (root,) = [r for r in roots if r.id == s1.id]
    assert isinstance(root, SnapshotNode)
    assert [c.id for c in root.children] == [s2.id, s3.id]
    assert [c.id for c in root.children[1].children] == [s4.id]
    assert [n.id for n in root.walk()] == [s1.id, s2.id, s3.id, s4.id]


def test_delete_snapshot(make, made, client_kwargs):
    sb = make()
    s1 = made(sb.snapshot())
    s2 = made(sb.snapshot())
    assert s2.parent_id == s1.id
    restored = make(snapshot=s1)  # a sandbox started from it keeps running

    assert Sandbox.delete_snapshot(s1, **client_kwargs) is True
    assert Sandbox.delete_snapshot(s1.id, **client_kwargs) is False
    with pytest.raises(NotFoundError):
        Sandbox.get_snapshot(s1.id, **client_kwargs)
    assert Sandbox.get_snapshot(s2.id, **client_kwargs).parent_id is None  # moved up
    assert s1.id not in {s.id for s in Sandbox.list_snapshots(**client_kwargs)}
    with pytest.raises(CellforkError) as info:
        make(snapshot=s1.id)
    assert info.value.status_code == 404
    assert restored.run_code("1 + 1").text == "2"


# --- async twin ----------------------------------------------------------------


async def test_async_lineage(client_kwargs, run_tag, made):
    sb = made(await AsyncSandbox.create(timeout=180, metadata=run_tag, **client_kwargs))
    await sb.run_code("x = 'async'")
    snap = made(await sb.snapshot())
    restored = made(await AsyncSandbox.create(snapshot=snap, timeout=180, metadata=run_tag, **client_kwargs))
    assert (await restored.run_code("x")).text == "async"

    (child,) = await sb.fork()
    made(child)
    assert isinstance(child, AsyncSandbox) and child.boot_mode == "fork"
    assert (await child.run_code("x")).text == "async"

    assert await sb.pause() is True
    assert await sb.pause() is False
    assert (await sb.get_info()).state == "paused"
    again = await AsyncSandbox.connect(sb.sandbox_id, **client_kwargs)
    assert (await again.run_code("x")).text == "async"
    await again.close()

    await sb.run_code("x = 'later'")
    await sb.rollback(snap)
    assert (await sb.run_code("x")).text == "async"
    await child.run_code("x = 'child'")
    await sb.merge(child)
    assert (await sb.run_code("x")).text == "child"

    assert snap.id in {s.id for s in await AsyncSandbox.list_snapshots(**client_kwargs)}
    roots = await AsyncSandbox.snapshot_tree(**client_kwargs)
    assert snap.id in {n.id for r in roots for n in r.walk()}
    assert await AsyncSandbox.delete_snapshot(snap, **client_kwargs) is True
    assert await AsyncSandbox.delete_snapshot(snap, **client_kwargs) is False
    for s in (sb, restored, child):
        await s.close()


def test_fork_and_rollback_keep_every_language_kernel(make, made):
    # Kernels of the other languages are processes like the rest: a fork
    # child and a rollback get their state too.
    sb = make()
    cells = {
        "javascript": ("let cf_v = 'js-state'", "cf_v"),
        "r": ("cf_v <- 'r-state'", "cat(cf_v)"),
        "bash": ("CF_V=bash-state", "echo -n $CF_V"),
    }

    def shown(s: Sandbox, lang: str) -> str:
        ex = s.run_code(cells[lang][1], language=lang, timeout=120)
        assert ex.error is None, (lang, ex.error)
        return ex.text if ex.text is not None else "".join(ex.logs.stdout)

    for lang, (set_code, _) in cells.items():
        assert sb.run_code(set_code, language=lang, timeout=120).error is None
    snap = made(sb.snapshot())
    child = made(sb.fork(1, timeout=120)[0])
    for lang in cells:
        assert shown(child, lang) == f"{'js' if lang == 'javascript' else lang}-state"
    sb.run_code("cf_v = 'changed'", language="javascript")
    sb.rollback(snap)
    assert shown(sb, "javascript") == "js-state"
