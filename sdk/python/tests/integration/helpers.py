from __future__ import annotations

import time
from typing import Callable


def poll(check: Callable[[], bool], timeout: float = 15.0, interval: float = 0.2) -> bool:
    """Wait until ``check()`` is true or ``timeout`` passes (no blind sleeps)."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
