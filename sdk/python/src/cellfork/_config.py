"""Client configuration: where the daemon is, how to authenticate, timeouts.

Values come from keyword arguments first, then the environment
(``CELLFORK_URL``, ``CELLFORK_API_KEY``), then the defaults below.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx

DEFAULT_URL = "http://127.0.0.1:3000"
DEFAULT_REQUEST_TIMEOUT = 60.0  # seconds, control plane and unary RPCs
DEFAULT_MAX_RETRIES = 2  # extra attempts for idempotent control-plane GETs
DEFAULT_SANDBOX_TIMEOUT = 300  # seconds a new sandbox lives
DEFAULT_COMMAND_TIMEOUT = 60.0  # seconds, commands.run deadline
DEFAULT_RUN_CODE_TIMEOUT = 300.0  # seconds, run_code deadline

ENVD_PORT = 49983
CODE_INTERPRETER_PORT = 49999

Transport = httpx.BaseTransport | httpx.AsyncBaseTransport


@dataclass(frozen=True)
class Config:
    """Resolved connection settings shared by a sandbox and its sub-APIs."""

    base_url: str
    api_key: str | None
    request_timeout: float | None
    max_retries: int
    transport: Transport | None = None


def resolve_config(
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    request_timeout: float | None = None,
    max_retries: int | None = None,
    transport: Transport | None = None,
) -> Config:
    """Merge keyword arguments over the environment and the defaults."""
    url = base_url or os.environ.get("CELLFORK_URL") or DEFAULT_URL
    key = api_key if api_key is not None else os.environ.get("CELLFORK_API_KEY")
    return Config(
        base_url=url.rstrip("/"),
        api_key=key or None,
        request_timeout=normalize_timeout(request_timeout, DEFAULT_REQUEST_TIMEOUT),
        max_retries=DEFAULT_MAX_RETRIES if max_retries is None else max(0, max_retries),
        transport=transport,
    )


def normalize_timeout(value: float | None, default: float | None) -> float | None:
    """None means the default; 0 means no limit (returned as None)."""
    if value is None:
        return default
    if value == 0:
        return None
    if value < 0:
        raise ValueError(f"timeout must be >= 0, got {value}")
    return float(value)
