"""Small helpers shared by the conformance tests (no fixtures here)."""

from __future__ import annotations

import os
import time
import uuid
from typing import Callable, Optional, TypeVar

T = TypeVar("T")


def unique(prefix: str = "cf") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(
    check: Callable[[], Optional[T]],
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``check`` until it returns a truthy value; fail after ``timeout`` s.

    Exceptions raised by ``check`` count as "not yet" but the last one is
    reported if the deadline passes.
    """
    deadline = time.monotonic() + timeout
    last_exc: Optional[BaseException] = None
    last_value: Optional[T] = None
    while True:
        try:
            last_value = check()
            if last_value:
                return last_value
        except Exception as e:  # noqa: BLE001 - reported below
            last_exc = e
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_exc!r}" if last_exc else f"; last value: {last_value!r}"
            raise AssertionError(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(interval)


def routing_headers(sandbox_id: str, port: int) -> dict:
    """The E2B edge routing headers (spec §1.4) the SDK sends on data-plane
    calls; needed for URLs the SDK hands out (download_url, upload_url,
    get_host) when E2B_SANDBOX_URL is a single host."""
    return {"E2b-Sandbox-Id": sandbox_id, "E2b-Sandbox-Port": str(port)}


#: The suite runs through a cluster gateway (test/cluster sets this), not
#: against one daemon.
CLUSTER = os.environ.get("CELLFORK_CLUSTER_TEST") == "1"
