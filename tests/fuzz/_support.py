"""Helpers of the API fuzz tests: the daemon under test, live sandboxes to
aim requests at, and a deadline for a whole request."""

from __future__ import annotations

import signal
import time
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional

import httpx

ENVD_PORT = 49983
CODE_INTERPRETER_PORT = 49999

# A live sandbox lives this long; ensure() renews it after every call.
LIVE_TIMEOUT = 600


class Hang(Exception):
    """A request got no complete answer in time."""


@contextmanager
def deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise Hang in the test if the block takes longer than ``seconds``.

    A read timeout alone misses a stream that sends a keepalive every few
    seconds and never ends. Keeps any timer already set (pytest-timeout).
    """

    def expired(signum: int, frame: Any) -> None:
        raise Hang(f"no complete answer within {seconds:.0f} s: {what}")

    start = time.monotonic()
    previous = signal.signal(signal.SIGALRM, expired)
    outer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if outer:
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - start), 0.001))


class Daemon:
    """The daemon under test, with a plain client for set-up and clean-up."""

    def __init__(self, url: str, key: str) -> None:
        self.url = url
        self.key = key
        self.http = httpx.Client(base_url=url, headers={"X-API-KEY": key}, timeout=60)

    def sandboxes(self) -> List[str]:
        r = self.http.get("/v2/sandboxes", params={"limit": 1000})
        r.raise_for_status()
        return [s["sandboxID"] for s in r.json()]

    def snapshots(self) -> List[str]:
        r = self.http.get("/snapshots", params={"limit": 1000})
        r.raise_for_status()
        return [s["snapshotID"] for s in r.json()]

    def detail(self, sandbox_id: str) -> Optional[Dict[str, Any]]:
        r = self.http.get(f"/sandboxes/{sandbox_id}")
        return r.json() if r.status_code == 200 else None

    def kill(self, sandbox_id: str) -> None:
        self.http.delete(f"/sandboxes/{sandbox_id}")

    def delete_snapshot(self, snapshot_id: str) -> None:
        self.http.delete(f"/snapshots/{snapshot_id}")

    def delete_template(self, template_id: str) -> None:
        self.http.delete(f"/templates/{template_id}")


class Live:
    """A live sandbox for the fuzzer to aim at."""

    def __init__(self, daemon: Daemon, make: Callable[..., Any]) -> None:
        self.daemon = daemon
        self.make = make
        self.id = ""
        self.token = ""
        self.renew()

    def renew(self) -> None:
        sbx = self.make(timeout=LIVE_TIMEOUT)
        self.id = sbx.sandbox_id
        self.token = self.daemon.detail(self.id)["envdAccessToken"]

    def ensure(self) -> None:
        """Undo a pause or a short timeout; a new sandbox if it is gone."""
        info = self.daemon.detail(self.id)
        if info is None:
            self.renew()
            return
        if info["state"] == "paused":
            self.daemon.http.post(f"/sandboxes/{self.id}/connect", json={})
        self.daemon.http.post(f"/sandboxes/{self.id}/timeout", json={"timeout": LIVE_TIMEOUT})

    def data_headers(self, port: int) -> Dict[str, str]:
        return {"E2b-Sandbox-Id": self.id, "E2b-Sandbox-Port": str(port), "X-Access-Token": self.token}
