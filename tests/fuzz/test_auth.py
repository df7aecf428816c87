"""Missing and wrong credentials on every operation of the OpenAPI document.

The control plane answers ``401`` with its error body before it looks at
the path; the data-plane proxy answers ``401`` with its own body before the
request reaches the sandbox. The daemon's API key is no access token.
(schemathesis's ``ignored_auth`` check in test_openapi.py repeats the
requests that succeeded without credentials; this covers every operation
whatever it would have answered.)
"""

from __future__ import annotations

import pathlib
import re
from typing import Dict, Iterator, Optional, Tuple

import httpx
import pytest
import yaml

from ._support import CODE_INTERPRETER_PORT, ENVD_PORT

OPENAPI = pathlib.Path(__file__).resolve().parents[2] / "internal" / "api" / "openapi.yaml"
PORTS = {"envd": ENVD_PORT, "envd-rpc": ENVD_PORT, "code-interpreter": CODE_INTERPRETER_PORT}

pytestmark = pytest.mark.timeout(120)


def _operations() -> Iterator[Tuple[str, str, dict]]:
    doc = yaml.safe_load(OPENAPI.read_text())
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method in ("get", "post", "put", "delete"):
                yield method.upper(), path, op


def _port(op: dict) -> Optional[int]:
    return next((PORTS[t] for t in op.get("tags", []) if t in PORTS), None)


CONTROL = [
    pytest.param(m, p, id=f"{m} {p}")
    for m, p, op in _operations()
    # GET /metrics is the daemon's too (without routing headers).
    if op.get("security") != [] and (_port(op) is None or op.get("operationId") == "metrics")
]
DATA = [pytest.param(m, p, _port(op), id=f"{m} {p}") for m, p, op in _operations() if _port(op) is not None]


def _url(path: str) -> str:
    return re.sub(r"\{[A-Za-z]+\}", "x", path)


def _send(daemon, method: str, path: str, headers: Dict[str, str]) -> httpx.Response:
    body = b"{}" if method in ("POST", "PUT") else None
    return httpx.request(method, daemon.url + _url(path), headers=headers, content=body, timeout=30)


def test_every_operation_is_covered():
    assert len(CONTROL) >= 20 and len(DATA) >= 10, (len(CONTROL), len(DATA))


@pytest.mark.parametrize("method,path", CONTROL)
@pytest.mark.parametrize("key", ["missing", "wrong", "empty"])
def test_control_plane_refuses(daemon, method, path, key):
    headers = {"missing": {}, "wrong": {"X-API-KEY": daemon.key + "x"}, "empty": {"X-API-KEY": ""}}[key]
    r = _send(daemon, method, path, {**headers, "Content-Type": "application/json"})
    assert r.status_code == 401, r.text
    body = r.json()
    assert body["code"] == 401 and body["message"] and body["requestId"] == r.headers["X-Request-Id"], body


@pytest.mark.parametrize("method,path,port", DATA)
@pytest.mark.parametrize("token", ["missing", "wrong", "wrong traffic token", "API key"])
def test_data_plane_refuses(daemon, live_envd, method, path, port, token):
    headers = {"E2b-Sandbox-Id": live_envd.id, "E2b-Sandbox-Port": str(port), "Content-Type": "application/json"}
    wrong = "0" * len(live_envd.token)
    headers.update(
        {
            "missing": {},
            "wrong": {"X-Access-Token": wrong},
            "wrong traffic token": {"E2b-Traffic-Access-Token": wrong},
            "API key": {"X-API-KEY": daemon.key},
        }[token]
    )
    r = _send(daemon, method, path, headers)
    assert r.status_code == 401, r.text
    body = r.json()
    assert body["code"] == 401 and body["sandboxId"] == live_envd.id and body["requestId"] == r.headers["X-Request-Id"]
