"""E2B control-plane behaviours cellfork matches (issue: E2B's own suites
green): list order, set_timeout(0), metrics as history, filesystem-only
pause and reboot-resume, boot ids. Through the official ``e2b`` SDK only."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import httpx
import pytest

from e2b import Sandbox, SandboxQuery, ServiceBusyException, SandboxNotFoundException

from ._util import unique, wait_until

BOOT_ID = "/proc/sys/kernel/random/boot_id"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def test_list_is_newest_first_by_default(make_sandbox):
    group = {"cf-newest": unique("n")}
    first = make_sandbox(metadata=group)
    time.sleep(0.05)
    second = make_sandbox(metadata=group)
    page = Sandbox.list(query=SandboxQuery(metadata=group), limit=1).next_items()
    assert [s.sandbox_id for s in page] == [second.sandbox_id], "the first page of one must be the newest"
    assert first.sandbox_id != second.sandbox_id


def test_set_timeout_zero_expires_now(make_sandbox):
    sbx = make_sandbox()
    sbx.set_timeout(0)
    wait_until(lambda: not sbx.is_running(), timeout=10, interval=0.2, what="the sandbox to expire")
    with pytest.raises(SandboxNotFoundException):
        Sandbox.get_info(sbx.sandbox_id)


def test_metrics_are_a_history_selected_by_time_range(make_sandbox):
    start = _now()
    sbx = make_sandbox()
    metrics = wait_until(lambda: sbx.get_metrics(start=start - timedelta(seconds=1), end=_now()),
                         timeout=15, interval=0.5, what="a sample in the range")
    for m in metrics:
        assert start.timestamp() - 10 <= m.timestamp.timestamp() <= _now().timestamp() + 10
    assert sbx.get_metrics(start=start - timedelta(hours=1), end=start - timedelta(minutes=30)) == []
    time.sleep(6)  # past a 5 s bucket: the history grows
    assert len(sbx.get_metrics()) >= 2


def _read(sbx, path):
    return sbx.commands.run(f"cat {path}").stdout.strip()


def test_pause_filesystem_only_reboots_from_files(make_sandbox):
    sbx = make_sandbox()
    boot = _read(sbx, BOOT_ID)
    sbx.files.write("/home/user/kept.txt", "kept")
    sbx.commands.run("sleep 4242", background=True)
    assert sbx.pause(mode="filesystem") is True
    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.state.value == "paused"
    raw = httpx.get(f"{_api()}/sandboxes/{sbx.sandbox_id}", headers=_key()).json()
    assert raw["pauseMode"] == "filesystem"
    # Traffic never reboots it (E2B: auto-resume refuses such a sandbox).
    assert sbx.pause() is False
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert _read(resumed, "/home/user/kept.txt") == "kept", "its files came back"
    assert _read(resumed, BOOT_ID) != boot, "it booted afresh"
    out = resumed.commands.run("ps -eo args | grep -c '[s]leep 4242' || true").stdout.strip()
    assert out == "0", "its processes did not come back"
    assert resumed.commands.run("echo alive").stdout == "alive\n"


def test_memory_pause_resumed_by_reboot(make_sandbox):
    sbx = make_sandbox()
    boot = _read(sbx, BOOT_ID)
    sbx.files.write("/home/user/kept.txt", "kept")
    assert sbx.pause() is True
    raw = httpx.get(f"{_api()}/sandboxes/{sbx.sandbox_id}", headers=_key()).json()
    assert raw["pauseMode"] == "full"
    resumed = Sandbox.connect(sbx.sandbox_id, on_resume="reboot")
    assert _read(resumed, "/home/user/kept.txt") == "kept"
    assert _read(resumed, BOOT_ID) != boot


def test_memory_pause_keeps_the_boot_id(make_sandbox):
    sbx = make_sandbox()
    boot = _read(sbx, BOOT_ID)
    sbx.pause()
    assert _read(Sandbox.connect(sbx.sandbox_id), BOOT_ID) == boot


def test_auto_pause_filesystem_only_on_timeout(make_sandbox):
    sbx = make_sandbox(timeout=3, lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}})
    boot = _read(sbx, BOOT_ID)
    sbx.files.write("/home/user/kept.txt", "kept")
    wait_until(lambda: Sandbox.get_info(sbx.sandbox_id).state.value == "paused", timeout=20, interval=0.5,
               what="the timeout to pause it")
    resumed = Sandbox.connect(sbx.sandbox_id)
    assert _read(resumed, "/home/user/kept.txt") == "kept"
    assert _read(resumed, BOOT_ID) != boot


def test_auto_resume_with_filesystem_auto_pause_is_refused(e2b_env, run_tag):
    from e2b import InvalidArgumentException, SandboxException

    with pytest.raises((InvalidArgumentException, SandboxException)):
        Sandbox.create(timeout=30, metadata={"cellfork-conformance": run_tag},
                       lifecycle={"on_timeout": {"action": "pause", "mode": "filesystem"}, "auto_resume": True})


def test_strict_pause_of_a_healthy_sandbox(make_sandbox):
    sbx = make_sandbox()
    assert sbx.pause(strict=True) is True
    assert Sandbox.connect(sbx.sandbox_id).is_running()


def _api():
    import os

    return os.environ["E2B_API_URL"].rstrip("/")


def _key():
    import os

    return {"X-API-KEY": os.environ["E2B_API_KEY"]}


# ServiceBusyException is what the SDK raises for 503 (a filesystem-only
# pause of a sandbox whose agent does not answer); imported to keep the name
# checked against the SDK.
assert ServiceBusyException
