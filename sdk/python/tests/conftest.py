"""Fixtures for the integration tests, which drive a REAL cellfork daemon.

The daemon is found through ``CELLFORK_URL`` and ``CELLFORK_API_KEY``
(``make test`` starts one and exports both). When they are missing, the
tests that need them fail; they are never skipped. Unit tests
(tests/unit) use none of these fixtures and need no daemon.
"""

from __future__ import annotations

import os
import uuid
from typing import Any

import pytest

from cellfork import AsyncSandbox, Sandbox

# Sandboxes made by tests live at most this long, so a crashed run cannot
# leave them behind for long.
SANDBOX_TIMEOUT = 180


def _require_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: integration tests need a running cellfork daemon "
            "(`make test` starts one and exports CELLFORK_URL and CELLFORK_API_KEY)",
            pytrace=False,
        )
    return value


@pytest.fixture(scope="session")
def cellfork_url() -> str:
    return _require_env("CELLFORK_URL")


@pytest.fixture(scope="session")
def cellfork_api_key() -> str:
    return _require_env("CELLFORK_API_KEY")


@pytest.fixture(scope="session")
def client_kwargs(cellfork_url: str, cellfork_api_key: str) -> dict[str, Any]:
    """Keyword arguments that point Sandbox/AsyncSandbox at the daemon."""
    return {"base_url": cellfork_url, "api_key": cellfork_api_key}


@pytest.fixture(scope="session")
def run_tag() -> dict[str, str]:
    """Metadata put on every sandbox this test run creates."""
    return {"cellfork-sdk-python-test": uuid.uuid4().hex[:12]}


@pytest.fixture(scope="session")
def no_leaked_sandboxes(client_kwargs: dict[str, Any], run_tag: dict[str, str]):
    """After the run, no sandbox created by it may still exist."""
    yield
    key, value = next(iter(run_tag.items()))
    leaked = [s for s in Sandbox.list(**client_kwargs) if s.metadata.get(key) == value]
    for info in leaked:  # clean up, then report
        try:
            Sandbox.connect(info.sandbox_id, **client_kwargs).kill()
        except Exception:
            pass
    assert not leaked, f"sandboxes leaked by the tests: {[s.sandbox_id for s in leaked]}"


@pytest.fixture
def new_sandbox(client_kwargs: dict[str, Any], run_tag: dict[str, str], no_leaked_sandboxes):
    """Factory for sandboxes killed at the end of the test."""
    made: list[Sandbox] = []

    def make(**kwargs: Any) -> Sandbox:
        kwargs.setdefault("timeout", SANDBOX_TIMEOUT)
        kwargs["metadata"] = {**run_tag, **(kwargs.get("metadata") or {})}
        sb = Sandbox.create(**client_kwargs, **kwargs)
        made.append(sb)
        return sb

    yield make
    for sb in made:
        sb.kill()
        sb.close()


@pytest.fixture(scope="module")
def sandbox(client_kwargs: dict[str, Any], run_tag: dict[str, str], no_leaked_sandboxes):
    """One sandbox shared by the tests of a module (they must not depend on
    each other's state)."""
    sb = Sandbox.create(timeout=SANDBOX_TIMEOUT, metadata=run_tag, **client_kwargs)
    yield sb
    sb.kill()
    sb.close()


@pytest.fixture
async def async_sandbox(client_kwargs: dict[str, Any], run_tag: dict[str, str], no_leaked_sandboxes):
    sb = await AsyncSandbox.create(timeout=SANDBOX_TIMEOUT, metadata=run_tag, **client_kwargs)
    yield sb
    await sb.kill()
    await sb.close()

