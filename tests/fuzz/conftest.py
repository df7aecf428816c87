"""Fixtures of the API fuzz tests (tests/fuzz): the daemon under test and
live sandboxes to aim requests at, made with the shared
``module_sandbox_factory`` (tests/conftest.py) against the daemon that
``scripts/test.sh`` starts."""

from __future__ import annotations

import pytest

from ._support import Daemon, Live


@pytest.fixture(scope="module")
def daemon(e2b_env):
    """The daemon. Fails the module if sandboxes or snapshots that were not
    there before it started are left at its end (and removes them)."""
    d = Daemon(e2b_env["E2B_API_URL"], e2b_env["E2B_API_KEY"])
    sandboxes_before, snapshots_before = set(d.sandboxes()), set(d.snapshots())
    yield d
    leaked = [s for s in d.sandboxes() if s not in sandboxes_before]
    leaked_snapshots = [s for s in d.snapshots() if s not in snapshots_before]
    for s in leaked:
        d.kill(s)
    for s in leaked_snapshots:
        d.delete_snapshot(s)
    d.http.close()
    assert not leaked and not leaked_snapshots, (
        f"left behind by the fuzzing: sandboxes {leaked}, snapshots {leaked_snapshots}"
    )


@pytest.fixture(scope="module")
def live(daemon, module_sandbox_factory):
    """Target of the control-plane operations that take a sandbox id."""
    return Live(daemon, module_sandbox_factory)


@pytest.fixture(scope="module")
def live_envd(daemon, module_sandbox_factory):
    """Target of the envd operations (files, processes, /init)."""
    return Live(daemon, module_sandbox_factory)


@pytest.fixture(scope="module")
def live_interpreter(daemon, module_sandbox_factory):
    """Target of the code-interpreter operations."""
    return Live(daemon, module_sandbox_factory)
