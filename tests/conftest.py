"""Shared fixtures for the E2B SDK conformance suite (tests/conformance).

The suite drives a REAL cellfork daemon only through the official, unmodified
``e2b`` and ``e2b_code_interpreter`` SDKs, configured the way the compatibility
spec (§7.1) recommends: through the environment, with

    E2B_API_URL      = the daemon URL   (control plane)
    E2B_SANDBOX_URL  = the daemon URL   (envd + code interpreter, routed by
                                         the E2b-Sandbox-Id/-Port headers)
    E2B_API_KEY      = a key the daemon accepts

``scripts/test.sh`` exports these (plus CELLFORK_URL/CELLFORK_API_KEY). When
any is missing the fixtures FAIL; they never skip.

Every sandbox a test creates carries the run's metadata tag and is killed by
the fixture that made it; a session-wide check fails the run if a tagged
sandbox is still alive at the end (and kills it).
"""

from __future__ import annotations

import os
import uuid
from typing import Any, Callable, Dict, List

import pytest

REQUIRED_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")

# Sandboxes made by the suite live at most this long, so a crashed run cannot
# leave them behind for long.
SANDBOX_TIMEOUT = 180

# Metadata key put on every sandbox the suite creates.
TAG_KEY = "cellfork-conformance"


def pytest_configure(config: pytest.Config) -> None:
    # Harmless when pytest-timeout is installed (it registers the marker too);
    # keeps the marker known when it is not.
    config.addinivalue_line("markers", "timeout(seconds): per-test time bound (pytest-timeout)")


def _require_env(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        pytest.fail(
            f"{name} is not set: the E2B conformance tests need a running cellfork daemon "
            "and E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY pointing at it "
            "(scripts/test.sh exports them)",
            pytrace=False,
        )
    return value


@pytest.fixture(scope="session")
def e2b_env() -> Dict[str, str]:
    """The E2B SDK environment; fails (never skips) when incomplete."""
    env = {name: _require_env(name) for name in REQUIRED_ENV}
    env["E2B_API_URL"] = env["E2B_API_URL"].rstrip("/")
    env["E2B_SANDBOX_URL"] = env["E2B_SANDBOX_URL"].rstrip("/")
    return env


@pytest.fixture(scope="session")
def sandbox_url(e2b_env: Dict[str, str]) -> str:
    return e2b_env["E2B_SANDBOX_URL"]


@pytest.fixture(scope="session")
def run_tag() -> Dict[str, str]:
    """Metadata put on every sandbox this run creates."""
    return {TAG_KEY: uuid.uuid4().hex[:12]}


def _kill_quietly(sbx: Any) -> None:
    try:
        sbx.kill()
    except Exception:
        pass


@pytest.fixture(scope="session")
def leak_check(e2b_env: Dict[str, str], run_tag: Dict[str, str]):
    """After the run, no sandbox created by it may still be alive."""
    yield
    from e2b import Sandbox

    leaked: List[str] = []
    paginator = Sandbox.list()
    while paginator.has_next:
        for info in paginator.next_items():
            if (info.metadata or {}).get(TAG_KEY) == run_tag[TAG_KEY]:
                leaked.append(info.sandbox_id)
    for sandbox_id in leaked:  # clean up, then report
        try:
            Sandbox.kill(sandbox_id)
        except Exception:
            pass
    assert not leaked, f"sandboxes leaked by the conformance tests: {leaked}"


def _create_kwargs(run_tag: Dict[str, str], kwargs: Dict[str, Any]) -> Dict[str, Any]:
    kwargs = dict(kwargs)
    kwargs.setdefault("timeout", SANDBOX_TIMEOUT)
    kwargs["metadata"] = {**run_tag, **(kwargs.get("metadata") or {})}
    return kwargs


def _sandbox_factory(run_tag: Dict[str, str]):
    """Yields ``make(cls=e2b.Sandbox, **create_kwargs)``; every sandbox it
    made is killed when the generator closes, whatever happened."""
    from e2b import Sandbox

    made: List[Any] = []

    def make(cls: Any = Sandbox, *args: Any, **kwargs: Any) -> Any:
        sbx = cls.create(*args, **_create_kwargs(run_tag, kwargs))
        made.append(sbx)
        return sbx

    try:
        yield make
    finally:
        for sbx in made:
            _kill_quietly(sbx)


@pytest.fixture
def make_sandbox(e2b_env, run_tag, leak_check):
    """Factory: ``make_sandbox(cls=e2b.Sandbox, **create_kwargs)``.

    Every sandbox it makes is killed when the test ends, whatever happened.
    """
    yield from _sandbox_factory(run_tag)


@pytest.fixture
def make_async_sandbox(e2b_env, run_tag, leak_check):
    """Async twin of make_sandbox: ``await make(cls=e2b.AsyncSandbox, ...)``.

    The sandboxes are killed synchronously (by id) at teardown, so the fixture
    does not depend on the test's event loop still running.
    """
    from e2b import AsyncSandbox, Sandbox

    made: List[str] = []

    async def make(cls: Any = AsyncSandbox, *args: Any, **kwargs: Any) -> Any:
        sbx = await cls.create(*args, **_create_kwargs(run_tag, kwargs))
        made.append(sbx.sandbox_id)
        return sbx

    try:
        yield make
    finally:
        for sandbox_id in made:
            try:
                Sandbox.kill(sandbox_id)
            except Exception:
                pass


@pytest.fixture(scope="module")
def module_sandbox_factory(e2b_env, run_tag, leak_check):
    """Module-scoped factory, for sandboxes shared by read-mostly tests."""
    yield from _sandbox_factory(run_tag)
