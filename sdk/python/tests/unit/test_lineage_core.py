"""The lineage part of the pure core: snapshot, fork, rollback, pause,
merge and the snapshot listing/tree (request builders, parsers, models)."""

from datetime import datetime, timezone

import httpx
import pytest

from cellfork import (
    CellforkError,
    InvalidArgumentError,
    NotFoundError,
    ProtocolError,
    RateLimitError,
    SandboxInfo,
    SnapshotInfo,
    SnapshotNode,
)
from cellfork._config import resolve_config
from cellfork._core import (
    ApiCore,
    CreatedSandbox,
    SandboxCore,
    parse_created,
    parse_fork,
    parse_paused,
    parse_snapshot,
    parse_snapshot_tree,
    parse_snapshots,
    snapshot_id_of,
)


def _core():
    config = resolve_config(base_url="http://d:1/", api_key="k")
    return SandboxCore(config, CreatedSandbox("sbx1", "base", "0.6.13", "tok", None, "pool"))


def _api():
    return ApiCore(resolve_config(base_url="http://d:1", api_key="k"))


def _json(status, body, **headers):
    return httpx.Response(status, json=body, headers={"X-Request-Id": "rid"} | headers)


SNAP = {
    "snapshotID": "snapA", "names": ["first"], "parentID": None, "sandboxID": "sbx1",
    "templateID": "base", "sizeBytes": 65203119, "createdAt": "2026-11-21T06:26:13.59691464Z",
}


def _snap(id, parent=None, second=0, **kw):
    return SnapshotInfo(id=id, parent_id=parent,
                        created_at=datetime(2026, 1, 1, 0, 0, second, tzinfo=timezone.utc), **kw)


# --- models ----------------------------------------------------------------


def test_snapshot_info_from_json():
    s = SnapshotInfo.from_json(SNAP)
    assert (s.id, s.names, s.parent_id, s.sandbox_id, s.template_id, s.size_bytes) == (
        "snapA", ["first"], None, "sbx1", "base", 65203119)
    assert s.created_at == datetime(2026, 11, 21, 6, 26, 13, 596914, tzinfo=timezone.utc)
    # E2B's SnapshotInfo has only the two required keys.
    bare = SnapshotInfo.from_json({"snapshotID": "x", "names": []})
    assert (bare.id, bare.parent_id, bare.size_bytes, bare.created_at) == ("x", None, None, None)
    assert (s.upload_state, s.store_root, bare.upload_state) == (None, None, None)
    up = SnapshotInfo.from_json(SNAP | {"uploadState": "uploaded", "storeRoot": "ab" * 32})
    assert (up.upload_state, up.store_root, up.upload_error) == ("uploaded", "ab" * 32, None)
    failed = SnapshotInfo.from_json(SNAP | {"uploadState": "failed", "uploadError": "its image is corrupt"})
    assert (failed.upload_state, failed.upload_error) == ("failed", "its image is corrupt")
    assert up == SnapshotInfo.from_json(SNAP)  # the same snapshot, read twice
    with pytest.raises(ProtocolError):
        SnapshotInfo.from_json({"names": []})
    with pytest.raises(ProtocolError):
        SnapshotInfo.from_json([SNAP])


def test_sandbox_info_lineage_fields():
    info = SandboxInfo.from_json({
        "sandboxID": "c1", "templateID": "base", "state": "paused", "bootMode": "fork",
        "parentSandboxID": "p1", "snapshotID": "snapA",
        "lifecycle": {"autoResume": False, "onTimeout": "pause"},
    })
    assert (info.state, info.boot_mode, info.parent_sandbox_id, info.snapshot_id, info.on_timeout) == (
        "paused", "fork", "p1", "snapA", "pause")
    plain = SandboxInfo.from_json({"sandboxID": "s", "templateID": "base"})
    assert (plain.boot_mode, plain.parent_sandbox_id, plain.snapshot_id, plain.on_timeout) == (
        None, None, None, None)


def test_snapshot_id_of_accepts_ids_names_infos_and_nodes():
    info = _snap("snapA")
    assert snapshot_id_of("snapA") == "snapA"
    assert snapshot_id_of("my-name") == "my-name"
    assert snapshot_id_of(info) == "snapA"
    assert snapshot_id_of(SnapshotNode(info)) == "snapA"
    for bad in ("", None, 5, SandboxInfo("s", "base")):
        with pytest.raises(TypeError):
            snapshot_id_of(bad)


def test_snapshot_info_answers_to_e2b_snapshot_id():
    # The E2B SDK's SnapshotInfo calls it snapshot_id; ours is id.
    s = SnapshotInfo.from_json(SNAP)
    assert s.snapshot_id == s.id == "snapA"
    assert _snap("x").snapshot_id == "x"


# --- snapshot tree (built by the daemon: GET /snapshots/tree) ---------------


def _node(id, parent=None, *children):
    return {**SNAP, "snapshotID": id, "parentID": parent, "children": list(children)}


def test_snapshot_tree_parsed_as_served():
    #  a ── b ── d
    #   └── c
    #  e (its parent was deleted)
    body = [_node("a", None, _node("b", "a", _node("d", "b")), _node("c", "a")), _node("e", "gone")]
    roots = parse_snapshot_tree(_json(200, body))
    assert [r.id for r in roots] == ["a", "e"]
    a = roots[0]
    assert [c.id for c in a.children] == ["b", "c"]
    assert [c.id for c in a.children[0].children] == ["d"]
    assert [n.id for n in a.walk()] == ["a", "b", "d", "c"]
    assert roots[1].snapshot.parent_id == "gone" and roots[1].children == []
    assert a.snapshot.size_bytes == SNAP["sizeBytes"]
    assert parse_snapshot_tree(_json(200, [])) == []
    # A leaf may leave children out.
    assert parse_snapshot_tree(_json(200, [{**SNAP, "snapshotID": "z"}]))[0].children == []


def test_snapshot_tree_rejects_other_shapes():
    for bad in ({"a": 1}, [1], [{**SNAP, "children": {"x": 1}}], [{"names": [], "children": []}]):
        with pytest.raises(ProtocolError):
            parse_snapshot_tree(_json(200, bad))


def test_snapshot_tree_request():
    spec = _api().snapshot_tree_request(None)
    assert (spec.method, spec.path, spec.idempotent) == ("GET", "/snapshots/tree", True)


# --- request builders ------------------------------------------------------


def test_create_from_snapshot_sends_it_as_template_id():
    api = _api()
    for ref in ("snapA", _snap("snapA"), SnapshotNode(_snap("snapA"))):
        assert api.create_request("base", None, None, None, ref, None).json["templateID"] == "snapA"
    assert api.create_request("base", None, None, None, None, None).json["templateID"] == "base"


def test_snapshot_request():
    core = _core()
    spec = core.snapshot_request(None, None)
    assert (spec.method, spec.path, spec.json) == ("POST", "/sandboxes/sbx1/snapshots", {})
    assert spec.sandbox_lookup and not spec.idempotent
    assert spec.headers["X-API-KEY"] == "k"
    assert core.snapshot_request("v1", 5).json == {"name": "v1"}


def test_fork_request():
    core = _core()
    spec = core.fork_request(1, None, None)
    assert (spec.method, spec.path, spec.json) == ("POST", "/sandboxes/sbx1/fork", {"count": 1})
    assert spec.sandbox_lookup and not spec.idempotent
    assert core.fork_request(3, 120, None).json == {"count": 3, "timeout": 120}
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError):
            core.fork_request(bad, None, None)


def test_rollback_request():
    core = _core()
    spec = core.rollback_request(_snap("snapA"), None)
    assert (spec.method, spec.path, spec.json) == (
        "POST", "/sandboxes/sbx1/rollback", {"snapshotID": "snapA"})
    # A 404 may be about the snapshot, so it is not "sandbox not found".
    assert not spec.sandbox_lookup and not spec.idempotent
    assert core.rollback_request("by-name", None).json == {"snapshotID": "by-name"}


def test_pause_request():
    core = _core()
    spec = core.pause_request(False, None)
    assert (spec.method, spec.path, spec.json) == ("POST", "/sandboxes/sbx1/pause", {})
    assert spec.accept == {409} and spec.sandbox_lookup
    assert core.pause_request(True, None).json == {"spill": True}
    assert parse_paused(httpx.Response(204)) is True
    assert parse_paused(_json(409, {"code": 409, "message": "already paused"})) is False


def test_merge_request():
    core = _core()
    spec = core.merge_request("child1", None)
    assert (spec.method, spec.path, spec.json) == (
        "POST", "/sandboxes/sbx1/merge", {"sandboxID": "child1"})
    assert not spec.sandbox_lookup
    for bad in ("", None, 3):
        with pytest.raises(TypeError):
            core.merge_request(bad, None)


def test_snapshot_listing_requests():
    api = _api()
    spec = api.list_snapshots_request(None, None, None, None, None)
    assert (spec.method, spec.path, spec.params, spec.idempotent) == ("GET", "/snapshots", {}, True)
    spec = api.list_snapshots_request("sbx1", "v1", 10, "tok", None)
    assert spec.params == {"sandboxID": "sbx1", "name": "v1", "limit": "10", "nextToken": "tok"}
    get = api.get_snapshot_request("a/b", None)
    assert (get.method, get.path, get.idempotent) == ("GET", "/snapshots/a%2Fb", True)
    delete = api.delete_snapshot_request(_snap("snapA"), None)
    assert (delete.method, delete.path, delete.accept) == ("DELETE", "/snapshots/snapA", {404})
    assert not delete.idempotent


# --- parsers ---------------------------------------------------------------


def test_parse_snapshot_and_list():
    assert parse_snapshot(_json(201, SNAP)).id == "snapA"
    page, token = parse_snapshots(_json(200, [SNAP, SNAP | {"snapshotID": "snapB"}],
                                        **{"X-Next-Token": "n2"}))
    assert [s.id for s in page] == ["snapA", "snapB"] and token == "n2"
    assert parse_snapshots(_json(200, []))[1] is None
    assert parse_snapshots(_json(200, [], **{"X-Next-Token": ""}))[1] is None
    with pytest.raises(ProtocolError):
        parse_snapshots(_json(200, {"snapshots": []}))


def test_parse_created_keeps_boot_mode():
    body = {"sandboxID": "s", "templateID": "base", "envdVersion": "0.6.13",
            "envdAccessToken": "t", "bootMode": "restore"}
    created = parse_created(_json(201, body))
    assert (created.boot_mode, created.access_token) == ("restore", "t")
    del body["bootMode"]
    assert parse_created(_json(201, body)).boot_mode is None


def test_parse_fork_per_child_results():
    child = {"sandboxID": "c1", "templateID": "base", "envdVersion": "0.6.13",
             "envdAccessToken": "t1", "bootMode": "fork"}
    results = parse_fork(_json(201, [
        {"sandbox": child},
        {"error": {"code": 429, "message": "too many starts"}},
        {"error": {"code": 404, "message": "image gone"}},
        {"error": {"code": 400, "message": "bad"}},
        {"error": {"code": "weird"}},
        {},
        {"sandbox": {"templateID": "base"}},
        "junk",
    ]))
    assert isinstance(results[0], CreatedSandbox)
    assert (results[0].sandbox_id, results[0].access_token, results[0].boot_mode) == ("c1", "t1", "fork")
    assert isinstance(results[1], RateLimitError) and results[1].status_code == 429
    assert results[1].message == "too many starts" and results[1].request_id == "rid"
    assert isinstance(results[2], NotFoundError) and results[2].status_code == 404
    assert isinstance(results[3], InvalidArgumentError)
    assert isinstance(results[4], CellforkError) and results[4].status_code == 500
    for bad in results[5:]:
        assert isinstance(bad, ProtocolError) and bad.request_id == "rid"
    with pytest.raises(ProtocolError):
        parse_fork(_json(201, {"sandbox": child}))


def test_adopt_only_the_same_sandbox():
    core = _core()
    core.adopt(CreatedSandbox("sbx1", "base", "0.6.13", "tok2", None, "restore"))
    assert core.created.access_token == "tok2"
    assert core.data_headers(49983)["X-Access-Token"] == "tok2"
    with pytest.raises(ProtocolError):
        core.adopt(CreatedSandbox("other", "base", "0.6.13", "tok", None))
    assert core.sandbox_id == "sbx1"

