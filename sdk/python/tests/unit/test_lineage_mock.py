"""The lineage operations of both twins against the in-memory fake daemon:
what goes on the wire and what comes back."""

import json

import httpx
import pytest

from cellfork import (
    AsyncSandbox,
    CellforkError,
    ConflictError,
    NotFoundError,
    ProtocolError,
    RateLimitError,
    Sandbox,
    SandboxNotFoundError,
    SnapshotInfo,
)

from .fake_daemon import API_KEY, FakeDaemon


@pytest.fixture
def daemon():
    return FakeDaemon()


def _kw(daemon):
    return {"base_url": "http://fake", "api_key": API_KEY, "transport": httpx.MockTransport(daemon)}


def _bodies(daemon, path):
    return [json.loads(r.content) for r in daemon.requests if r.url.path == path and r.content]


# --- sync --------------------------------------------------------------------


def test_sync_snapshot_and_create_from_it(daemon):
    sb = Sandbox.create(**_kw(daemon))
    assert sb.boot_mode == "pool"
    snap = sb.snapshot("v1")
    assert isinstance(snap, SnapshotInfo)
    assert (snap.id, snap.names, snap.sandbox_id, snap.parent_id) == ("snap1", ["v1"], "sbx1", None)
    assert snap.created_at is not None and snap.size_bytes == 0
    second = sb.snapshot()
    assert second.parent_id == "snap1" and second.names == []
    assert _bodies(daemon, "/sandboxes/sbx1/snapshots") == [{"name": "v1"}, {}]
    with pytest.raises(ConflictError):
        sb.snapshot("v1")
    for ref in (snap, "snap1", "v1"):
        restored = Sandbox.create(snapshot=ref, **_kw(daemon))
        assert restored.boot_mode == "restore"
        expected = ref if isinstance(ref, str) else "snap1"
        assert json.loads(daemon.requests[-1].content)["templateID"] == expected
        info = restored.get_info()
        assert info.snapshot_id == "snap1" and info.boot_mode == "restore"
        restored.close()
    with pytest.raises(SandboxNotFoundError):
        Sandbox.connect("nope", **_kw(daemon)).snapshot()


def test_sync_fork_returns_sandboxes_and_errors_per_child(daemon):
    parent = Sandbox.create(**_kw(daemon))
    daemon.fork_failures[1] = {"code": 429, "message": "too many starts"}
    children = parent.fork(3, timeout=90)
    assert _bodies(daemon, "/sandboxes/sbx1/fork") == [{"count": 3, "timeout": 90}]
    assert isinstance(children[1], RateLimitError) and children[1].message == "too many starts"
    good = [children[0], children[2]]
    assert all(isinstance(c, Sandbox) for c in good)
    assert [c.sandbox_id for c in good] == ["sbx2", "sbx3"]
    for child in good:
        assert child.boot_mode == "fork"
        assert child.get_info().parent_sandbox_id == "sbx1"
        # Each child has its own connection pool; closing one leaves the rest.
        assert child._http is not parent._http
    good[0].close()
    assert good[1].get_info().sandbox_id == "sbx3"
    assert parent.fork()[0].sandbox_id == "sbx4"
    assert _bodies(daemon, "/sandboxes/sbx1/fork")[-1] == {"count": 1}
    with pytest.raises(ValueError):
        parent.fork(0)


def test_sync_pause_connect_resume(daemon):
    sb = Sandbox.create(**_kw(daemon))
    assert sb.pause() is True
    assert sb.get_info().state == "paused"
    assert sb.pause() is False  # already paused
    resumed = Sandbox.connect(sb.sandbox_id, **_kw(daemon))
    assert sb.get_info().state == "running"
    assert sb.pause(spill=True) is True
    assert daemon.sandboxes["sbx1"]["spilled"] is True
    assert sb.pause(spill=True) is True  # already paused: moved to disk (again)
    assert _bodies(daemon, "/sandboxes/sbx1/pause") == [{}, {}, {"spill": True}, {"spill": True}]
    resumed.close()
    sb.kill()
    with pytest.raises(SandboxNotFoundError):
        sb.pause()


def test_sync_rollback(daemon):
    sb = Sandbox.create(**_kw(daemon))
    first = sb.snapshot("first")
    sb.snapshot()
    assert sb.rollback(first) is None
    assert _bodies(daemon, "/sandboxes/sbx1/rollback") == [{"snapshotID": "snap1"}]
    assert sb.sandbox_id == "sbx1" and sb.get_info().snapshot_id == "snap1"
    sb.rollback("first")
    with pytest.raises(NotFoundError) as info:
        sb.rollback("nope")
    assert not isinstance(info.value, SandboxNotFoundError)  # the snapshot is missing


def test_sync_merge(daemon):
    parent = Sandbox.create(**_kw(daemon))
    stranger = Sandbox.create(**_kw(daemon))
    child, other = parent.fork(2)
    assert parent.merge(child) is None
    assert _bodies(daemon, "/sandboxes/sbx1/merge") == [{"sandboxID": child.sandbox_id}]
    assert child.kill() is False  # its id went away
    assert other.get_info().sandbox_id == other.sandbox_id
    parent.merge(other.sandbox_id)
    with pytest.raises(ConflictError):
        parent.merge(stranger)
    with pytest.raises(NotFoundError):
        parent.merge("gone")


def test_sync_snapshot_listing_tree_and_delete(daemon):
    a = Sandbox.create(**_kw(daemon))
    s1 = a.snapshot("root")
    s2 = a.snapshot()
    b = Sandbox.create(snapshot=s1, **_kw(daemon))
    s3 = b.snapshot()
    s4 = a.snapshot("tip")
    s5 = Sandbox.create(**_kw(daemon)).snapshot()  # another tree
    kw = _kw(daemon)
    everything = Sandbox.list_snapshots(**kw)
    assert [s.id for s in everything] == [s.id for s in (s1, s2, s3, s4, s5)]
    # Pages of two, following X-Next-Token.
    assert sum(1 for r in daemon.requests if r.url.path == "/snapshots") == 3
    assert [s.id for s in Sandbox.list_snapshots(sandbox_id=b.sandbox_id, **kw)] == [s3.id]
    assert [s.id for s in Sandbox.list_snapshots(name="tip", **kw)] == [s4.id]
    assert len(Sandbox.list_snapshots(limit=3, **kw)) == 3
    assert Sandbox.get_snapshot("tip", **kw).id == s4.id
    assert Sandbox.get_snapshot(s2, **kw).parent_id == s1.id
    with pytest.raises(NotFoundError):
        Sandbox.get_snapshot("nope", **kw)

    roots = Sandbox.snapshot_tree(**kw)
    assert [r.id for r in roots] == [s1.id, s5.id]
    assert [c.id for c in roots[0].children] == [s2.id, s3.id]
    assert [c.id for c in roots[0].children[0].children] == [s4.id]

    assert Sandbox.delete_snapshot(s2, **kw) is True
    assert daemon.requests[-1].method == "DELETE" and daemon.requests[-1].url.path == "/snapshots/snap2"
    assert Sandbox.delete_snapshot(s2.id, **kw) is False
    roots = Sandbox.snapshot_tree(**kw)
    assert [c.id for c in roots[0].children] == [s3.id, s4.id]  # s4 moved up


def test_sync_list_snapshots_stops_on_a_repeated_token(daemon):
    page = httpx.Response(200, json=[], headers={"X-Next-Token": "same"})
    daemon.queued = [page, page]
    with pytest.raises(ProtocolError):
        Sandbox.list_snapshots(**_kw(daemon))


# --- async -------------------------------------------------------------------


async def test_async_lineage(daemon):
    kw = _kw(daemon)
    sb = await AsyncSandbox.create(**kw)
    assert sb.boot_mode == "pool"
    snap = await sb.snapshot("v1")
    assert snap.id == "snap1"
    restored = await AsyncSandbox.create(snapshot=snap, **kw)
    assert restored.boot_mode == "restore"
    assert json.loads(daemon.requests[-1].content)["templateID"] == "snap1"

    daemon.fork_failures[0] = {"code": 404, "message": "image gone"}
    failed, child = await sb.fork(2)
    assert isinstance(failed, NotFoundError) and isinstance(failed, CellforkError)
    assert isinstance(child, AsyncSandbox) and child.boot_mode == "fork"
    assert (await child.get_info()).parent_sandbox_id == sb.sandbox_id

    assert await sb.pause() is True
    assert await sb.pause() is False
    assert (await sb.get_info()).state == "paused"
    again = await AsyncSandbox.connect(sb.sandbox_id, **kw)
    assert (await again.get_info()).state == "running"
    assert await sb.pause(spill=True) is True
    await AsyncSandbox.connect(sb.sandbox_id, **kw)

    await sb.snapshot()
    await sb.rollback("v1")
    assert (await sb.get_info()).snapshot_id == "snap1"
    await sb.merge(child)
    assert await child.kill() is False

    assert [s.id for s in await AsyncSandbox.list_snapshots(**kw)] == ["snap1", "snap2"]
    assert (await AsyncSandbox.get_snapshot("v1", **kw)).id == "snap1"
    roots = await AsyncSandbox.snapshot_tree(**kw)
    assert [n.id for n in roots[0].walk()] == ["snap1", "snap2"]
    assert await AsyncSandbox.delete_snapshot("snap2", **kw) is True
    assert await AsyncSandbox.delete_snapshot("snap2", **kw) is False
    for s in (sb, restored, child, again):
        await s.close()
