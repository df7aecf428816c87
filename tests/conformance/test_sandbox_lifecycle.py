"""Control plane through the sync SDK: create, connect, get_info, list,
set_timeout, get_metrics, kill, is_running, and the error mapping
(spec §2, §2.2, §2.4)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest
from packaging.version import Version

from e2b import (
    AuthenticationException,
    Sandbox,
    SandboxInfo,
    SandboxMetrics,
    SandboxException,
    SandboxNotFoundException,
    SandboxQuery,
    SandboxState,
)
from e2b_code_interpreter import Sandbox as CodeInterpreterSandbox

from ._util import unique, wait_until

pytestmark = pytest.mark.timeout(60)

# An id no server has handed out (lower-case alphanumerics, like real ones).
UNKNOWN_ID = "cfnosuchsandbox" + uuid.uuid4().hex[:8]


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _list_all(query: SandboxQuery, limit=None):
    paginator = Sandbox.list(query=query, limit=limit)
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


# --- create -------------------------------------------------------------


def test_create_default_template_is_base(make_sandbox):
    sbx = make_sandbox()
    assert isinstance(sbx.sandbox_id, str) and sbx.sandbox_id
    info = sbx.get_info()
    assert info.template_id == "base"
    assert sbx.commands.run("echo hi").stdout == "hi\n"


def test_create_explicit_base_template(make_sandbox):
    sbx = make_sandbox(Sandbox, "base")
    assert sbx.get_info().template_id == "base"


def test_code_interpreter_default_template(make_sandbox):
    sbx = make_sandbox(CodeInterpreterSandbox)
    info = sbx.get_info()
    # The code-interpreter SDK asks for "code-interpreter-v1" (spec §2.4.1).
    assert "code-interpreter-v1" in (info.template_id, info.name)
    assert sbx.run_code("1+1").text == "2"


def test_create_unknown_template_is_a_typed_error(e2b_env, run_tag):
    # Error bodies must be JSON {"code": int, "message": str} so the SDK can
    # raise its typed exception (spec §2.2) instead of crashing on the body.
    name = "cf-no-such-template-" + uuid.uuid4().hex[:6]
    with pytest.raises(SandboxException) as ei:
        Sandbox.create(name, metadata=run_tag, timeout=30)
    assert name in str(ei.value)
    assert ei.value.status_code in (400, 404)


def test_create_timeout_sets_end_at(make_sandbox):
    sbx = make_sandbox(timeout=123)
    info = sbx.get_info()
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert 118 <= lifetime <= 128, (info.started_at, info.end_at)


def test_create_without_timeout_uses_default_300s(make_sandbox):
    sbx = make_sandbox(timeout=None)  # no "timeout" key in the create body
    info = sbx.get_info()
    lifetime = (info.end_at - info.started_at).total_seconds()
    assert 295 <= lifetime <= 305, (info.started_at, info.end_at)


def test_create_metadata_round_trips(make_sandbox, run_tag):
    meta = {"purpose": "conformance", "n": "42"}
    sbx = make_sandbox(metadata=meta)
    info = sbx.get_info()
    assert info.metadata == {**run_tag, **meta}


def test_create_envs_visible_to_commands(make_sandbox):
    sbx = make_sandbox(envs={"CF_SANDBOX_ENV": "from-create", "CF_OTHER": "x y"})
    out = sbx.commands.run('echo "$CF_SANDBOX_ENV|$CF_OTHER"').stdout
    assert out == "from-create|x y\n"
    # Per-command envs are added on top of (and override) sandbox envs.
    out = sbx.commands.run('echo "$CF_SANDBOX_ENV|$CF_OTHER"', envs={"CF_OTHER": "cmd"}).stdout
    assert out == "from-create|cmd\n"


# --- get_info / is_running / connect ---------------------------------------


def test_get_info_fields(make_sandbox, run_tag):
    before = _now() - timedelta(seconds=5)
    sbx = make_sandbox(timeout=150)
    info = sbx.get_info()
    assert isinstance(info, SandboxInfo)
    assert info.sandbox_id == sbx.sandbox_id
    assert info.state == SandboxState.RUNNING
    assert info.metadata == run_tag
    assert before <= info.started_at <= _now() + timedelta(seconds=5)
    assert info.end_at > _now()
    assert info.cpu_count >= 1
    assert info.memory_mb > 0
    assert Version(info.envd_version) >= Version("0.1.0")
    # The class-method form reads the same sandbox.
    info2 = Sandbox.get_info(sbx.sandbox_id)
    assert info2.sandbox_id == sbx.sandbox_id
    assert info2.started_at == info.started_at


def test_is_running_and_connect(make_sandbox):
    sbx = make_sandbox()
    assert sbx.is_running() is True

    other = Sandbox.connect(sbx.sandbox_id)
    assert other.sandbox_id == sbx.sandbox_id
    # The connected instance talks to the same sandbox.
    sbx.files.write("/tmp/connect-marker", "same sandbox")
    assert other.files.read("/tmp/connect-marker") == "same sandbox"
    assert other.commands.run("cat /tmp/connect-marker").stdout == "same sandbox"
    assert other.is_running() is True

    # Instance connect() on a running sandbox returns a usable instance too.
    again = sbx.connect()
    assert again.sandbox_id == sbx.sandbox_id
    assert again.commands.run("echo again").stdout == "again\n"


def test_connect_with_timeout_extends_lifetime(make_sandbox):
    sbx = make_sandbox(timeout=30)
    Sandbox.connect(sbx.sandbox_id, timeout=200)
    info = sbx.get_info()
    remaining = (info.end_at - _now()).total_seconds()
    assert 150 <= remaining <= 210, info.end_at


def test_connect_with_shorter_timeout_does_not_shorten(make_sandbox):
    # SDK 2.63.0 documents connect(timeout=...): "For running sandboxes, the
    # timeout will update only if the new timeout is longer than the existing
    # one."
    sbx = make_sandbox(timeout=200)
    end_before = sbx.get_info().end_at
    Sandbox.connect(sbx.sandbox_id, timeout=20)
    end_after = sbx.get_info().end_at
    assert end_after >= end_before - timedelta(seconds=1), (end_before, end_after)


# --- list -------------------------------------------------------------------


def test_list_paginates_with_limit_and_next_items(make_sandbox):
    group = {"cf-list-group": unique("grp")}
    ids = {make_sandbox(metadata=group).sandbox_id for _ in range(3)}

    paginator = Sandbox.list(query=SandboxQuery(metadata=group), limit=2)
    assert paginator.has_next
    page1 = paginator.next_items()
    assert len(page1) == 2
    assert paginator.has_next, "a third sandbox matches, so there must be a next page"
    assert paginator.next_token
    page2 = paginator.next_items()
    assert len(page2) == 1
    assert not paginator.has_next
    seen = [s.sandbox_id for s in page1 + page2]
    assert sorted(seen) == sorted(ids), "pages must cover every match exactly once"
    for item in page1 + page2:
        assert isinstance(item, SandboxInfo)
        assert item.state == SandboxState.RUNNING
        assert item.metadata.get("cf-list-group") == group["cf-list-group"]
        assert item.template_id == "base"
        assert item.started_at <= item.end_at

    # Resuming from a token (a new paginator built with next_token) works too.
    p = Sandbox.list(query=SandboxQuery(metadata=group), limit=1)
    first = p.next_items()
    rest = _list_all_from(group, p.next_token)
    assert sorted(s.sandbox_id for s in first + rest) == sorted(ids)


def _list_all_from(group, token):
    paginator = Sandbox.list(query=SandboxQuery(metadata=group), limit=1, next_token=token)
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def test_list_filters_by_metadata_and_state(make_sandbox):
    group = {"cf-filter": unique("f")}
    sbx = make_sandbox(metadata=group)
    make_sandbox(metadata={"cf-filter": unique("other")})

    found = _list_all(SandboxQuery(metadata=group))
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]

    running = _list_all(SandboxQuery(metadata=group, state=[SandboxState.RUNNING]))
    assert [s.sandbox_id for s in running] == [sbx.sandbox_id]

    paused = _list_all(SandboxQuery(metadata=group, state=[SandboxState.PAUSED]))
    assert paused == []

    both = _list_all(SandboxQuery(metadata=group, state=[SandboxState.RUNNING, SandboxState.PAUSED]))
    assert [s.sandbox_id for s in both] == [sbx.sandbox_id]

    nothing = _list_all(SandboxQuery(metadata={"cf-filter": unique("none")}))
    assert nothing == []


def test_list_order_started_after_and_template(make_sandbox):
    group = {"cf-order": unique("o")}
    since = _now() - timedelta(seconds=2)
    first = make_sandbox(metadata=group)
    time.sleep(0.05)
    second = make_sandbox(metadata=group)
    q = SandboxQuery(metadata=group)

    asc = [s.sandbox_id for s in _list_all_ordered(q, "asc")]
    desc = [s.sandbox_id for s in _list_all_ordered(q, "desc")]
    assert asc == [first.sandbox_id, second.sandbox_id]
    assert desc == [second.sandbox_id, first.sandbox_id]

    after = _list_all(SandboxQuery(metadata=group, started_after=since))
    assert sorted(s.sandbox_id for s in after) == sorted([first.sandbox_id, second.sandbox_id])
    later = _list_all(SandboxQuery(metadata=group, started_after=_now() + timedelta(minutes=5)))
    assert later == []

    assert len(_list_all(SandboxQuery(metadata=group, template="base"))) == 2
    assert _list_all(SandboxQuery(metadata=group, template="code-interpreter-v1")) == []


def _list_all_ordered(query, order):
    paginator = Sandbox.list(query=query, order=order, limit=1)
    items = []
    while paginator.has_next:
        items.extend(paginator.next_items())
    return items


def test_list_metadata_filter_with_special_characters(make_sandbox):
    # The SDK percent-encodes keys and values before urlencoding the filter
    # (spec §2.4.5: "keys/values individually percent-encoded first"), so the
    # server must decode them once more, as upstream does (a space arrives as
    # "%20", "@" as "%40" after the usual query decoding).
    value = f"ada lovelace {uuid.uuid4().hex[:6]}@example.com/x"
    sbx = make_sandbox(metadata={"cf-owner": value})
    found = _list_all(SandboxQuery(metadata={"cf-owner": value}))
    assert [s.sandbox_id for s in found] == [sbx.sandbox_id]


# --- set_timeout / lifetime ---------------------------------------------------


def test_set_timeout_moves_end_at(make_sandbox):
    sbx = make_sandbox(timeout=60)
    sbx.set_timeout(240)
    info = sbx.get_info()
    remaining = (info.end_at - _now()).total_seconds()
    assert 230 <= remaining <= 245, info.end_at
    # Class-method form.
    Sandbox.set_timeout(sbx.sandbox_id, 90)
    remaining = (sbx.get_info().end_at - _now()).total_seconds()
    assert 80 <= remaining <= 95
    assert sbx.is_running()


def test_short_timeout_really_kills_the_sandbox(make_sandbox):
    by_create = make_sandbox(timeout=2)
    by_set = make_sandbox()
    by_set.set_timeout(2)
    t0 = time.monotonic()
    for sbx in (by_create, by_set):
        wait_until(lambda: not sbx.is_running(), timeout=15, interval=0.25,
                   what=f"sandbox {sbx.sandbox_id} to stop after its timeout")
        with pytest.raises(SandboxNotFoundException):
            Sandbox.get_info(sbx.sandbox_id)
    assert time.monotonic() - t0 < 15
    # Gone for good: kill reports it did not exist.
    assert Sandbox.kill(by_create.sandbox_id) is False


# --- metrics ----------------------------------------------------------------------


def test_get_metrics(make_sandbox):
    sbx = make_sandbox()
    metrics = wait_until(lambda: sbx.get_metrics(), timeout=15, interval=1, what="a metrics sample")
    assert isinstance(metrics, list)
    for m in metrics:
        assert isinstance(m, SandboxMetrics)
        assert m.cpu_count >= 1
        assert 0 <= m.cpu_used_pct
        assert m.mem_total > 0 and 0 <= m.mem_used <= m.mem_total
        assert m.disk_total > 0 and 0 <= m.disk_used <= m.disk_total
        assert isinstance(m.timestamp, datetime)
    # start/end window (Unix seconds on the wire) is accepted.
    windowed = Sandbox.get_metrics(sbx.sandbox_id, start=_now() - timedelta(minutes=5), end=_now() + timedelta(minutes=1))
    assert isinstance(windowed, list)


# --- kill -------------------------------------------------------------------------


def test_kill_returns_true_then_false(make_sandbox):
    sbx = make_sandbox()
    assert sbx.kill() is True
    assert sbx.kill() is False
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert sbx.is_running() is False
    with pytest.raises(SandboxNotFoundException):
        sbx.get_info()


def test_kill_classmethod(make_sandbox):
    sbx = make_sandbox()
    assert Sandbox.kill(sbx.sandbox_id) is True
    assert Sandbox.kill(sbx.sandbox_id) is False
    assert Sandbox.kill(UNKNOWN_ID) is False


# --- error mapping -------------------------------------------------------------------


def test_wrong_api_key_raises_authentication_exception(make_sandbox, run_tag):
    sbx = make_sandbox()
    bad = {"api_key": "definitely-not-a-valid-key"}
    with pytest.raises(AuthenticationException):
        # (tagged, so the leak check would catch a server that accepted it)
        Sandbox.create(metadata=run_tag, timeout=30, **bad)
    with pytest.raises(AuthenticationException):
        Sandbox.list(**bad).next_items()
    with pytest.raises(AuthenticationException):
        Sandbox.get_info(sbx.sandbox_id, **bad)
    with pytest.raises(AuthenticationException):
        Sandbox.connect(sbx.sandbox_id, **bad)
    with pytest.raises(AuthenticationException):
        Sandbox.set_timeout(sbx.sandbox_id, 60, **bad)
    with pytest.raises(AuthenticationException):
        Sandbox.kill(sbx.sandbox_id, **bad)
    # And nothing happened to the sandbox.
    assert sbx.is_running()


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda: Sandbox.connect(UNKNOWN_ID), id="connect"),
        pytest.param(lambda: Sandbox.get_info(UNKNOWN_ID), id="get_info"),
        pytest.param(lambda: Sandbox.set_timeout(UNKNOWN_ID, 60), id="set_timeout"),
        pytest.param(lambda: Sandbox.get_metrics(UNKNOWN_ID), id="get_metrics"),
    ],
)
def test_unknown_sandbox_raises_not_found(e2b_env, call):
    with pytest.raises(SandboxNotFoundException):
        call()
