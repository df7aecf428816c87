"""Fuzz the daemon from its OpenAPI description (schemathesis).

Every operation of ``internal/api/openapi.yaml`` gets requests generated
from its schema: the document's examples, boundary values, valid random
data and invalid data (wrong types, out-of-range numbers, malformed or
missing bodies, odd content types and methods). Every answer is checked
against the document by schemathesis's checks: no server error, a
documented status, content type, headers and body, invalid input refused
with a 4xx, valid input not refused, a method the path does not serve
answered 405, and auth enforced (a successful request is repeated without
the key or token and with a wrong one). A request that takes longer than
REQUEST_DEADLINE is a hang.

* test_control_plane: every control-plane operation, path ids as generated
  (so mostly 404s and 400s). Creates are few, and every sandbox one makes
  is killed at once.
* test_control_plane_live: the operations that take a sandbox id, on a
  live sandbox (kill excluded); what a call made (fork children,
  snapshots, a pause, a short timeout) is undone after it.
* test_envd, test_code_interpreter: the data plane, routed by
  ``E2b-Sandbox-Id`` to a live sandbox of its own each.

``CELLFORK_FUZZ_EXAMPLES`` (default 25) bounds the random examples per
operation, fewer for operations that start sandboxes. The run is
deterministic, so a failure reproduces, unless ``CELLFORK_FUZZ_SEED`` is
set (an integer, or ``random``). Each failure prints a curl command.
"""

from __future__ import annotations

import gzip
import json
import os
import pathlib
from typing import Any, Dict

import pytest

import schemathesis
from schemathesis import Config

from ._support import CODE_INTERPRETER_PORT, ENVD_PORT, Daemon, Live, deadline

ROOT = pathlib.Path(__file__).resolve().parents[2]
OPENAPI = ROOT / "internal" / "api" / "openapi.yaml"

DATA_PLANE_TAGS = ["envd", "envd-rpc", "code-interpreter"]
CREATES = ["createSandboxV2", "createSandbox"]
# Operations that start sandboxes: a create, fork children, a restore.
STARTS_SANDBOXES = CREATES + ["forkSandbox", "rollbackSandbox"]
MAX_CHILDREN = 2  # fork count on the live sandbox (larger counts: test_control_plane)

EXAMPLES = int(os.environ.get("CELLFORK_FUZZ_EXAMPLES", "25"))
FEW = max(3, EXAMPLES // 5)
SEED = os.environ.get("CELLFORK_FUZZ_SEED", "")
READ_TIMEOUT = 30  # seconds without a byte
REQUEST_DEADLINE = 90  # seconds for the whole answer (a start may wait for a slot)

# Statuses that are not a failure of the daemon, where the default (any
# 2xx-4xx) is too narrow.
PROXY_OK = ["2xx", "3xx", "4xx", "502"]  # 502: the proxy found a fuzzed port closed


def _config() -> Config:
    generation: Dict[str, Any] = {
        "mode": "all",
        "max-examples": EXAMPLES,
        # Unknown query parameters and headers are ignored on purpose (the
        # SDKs send more than cellfork reads).
        "allow-extra-parameters": False,
        "database": "none",  # no example database in the tree
        "no-shrink": True,  # bounded time; a failure prints its request as is
        "deterministic": not SEED,
    }
    data: Dict[str, Any] = {
        "request-timeout": READ_TIMEOUT,
        "generation": generation,
        "checks": {
            # 400 is also the documented answer to a schema-valid value past
            # a limit the daemon is started with (--max-timeout, --max-fork,
            # --max-cpus, --max-memory-mb) or one JSON Schema cannot state
            # (metadata key lengths, a fork child merged into itself).
            "positive_data_acceptance": {
                "expected-statuses": ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"],
            },
        },
        # The first entry that matches an operation wins.
        "operations": [
            {
                # 415: a Content-Type the method does not take (unary and
                # streaming methods take different ones). 504: Connect's
                # deadline_exceeded, the caller's own Connect-Timeout-Ms.
                "include-tag": "envd-rpc",
                "checks": {
                    "not_a_server_error": {"expected-statuses": PROXY_OK + ["504"]},
                    "positive_data_acceptance": {
                        "expected-statuses": ["2xx", "3xx", "400", "401", "403", "404", "409", "415", "429", "5xx"],
                    },
                },
            },
            {
                "include-tag": DATA_PLANE_TAGS,
                "checks": {"not_a_server_error": {"expected-statuses": PROXY_OK}},
            },
            {
                # Without E2b-Sandbox-Id the port header means nothing.
                # GET /metrics takes the API key (control plane) or an
                # access token (data plane): a wrong one of the two with
                # the other right is still let in (test_auth.py checks
                # each plane's refusals).
                "include-operation-id": ["health", "metrics"],
                "checks": {
                    "ignored_auth": {"enabled": False},
                    "negative_data_rejection": {"enabled": False},
                    "not_a_server_error": {"expected-statuses": PROXY_OK},
                },
            },
            {
                # DELETE /snapshots/{snapshotID} serves /snapshots/usage and
                # /snapshots/tree too (a snapshot of that name, made by an
                # older daemon), so Allow lists it; the same for DELETE
                # /sandboxes/{id} and /sandboxes/metrics, and the
                # /templates/{templateID} routes for /templates/usage and
                # /templates/tags (a template of that id).
                "include-operation-id": ["getSnapshotUsage", "getSnapshotTree", "getSandboxesMetrics",
                                         "getTemplateUsage", "assignTemplateTags", "deleteTemplateTags"],
                "checks": {"allow_header_conformance": {"enabled": False}},
            },
            {
                "include-operation-id": STARTS_SANDBOXES,
                "generation": {"max-examples": FEW},
                "phases": {"coverage": {"enabled": False}},
            },
        ],
    }
    if SEED and SEED != "random":
        data["seed"] = int(SEED)
    return Config.from_dict(data)


def _operation_id(operation) -> str:
    return operation.definition.raw.get("operationId", "")


def _tags(operation) -> list:
    return operation.tags or []


# Connect's binary bodies: the fuzzer sends random bytes (the envelope
# framing and protobuf decoding get them).
schemathesis.serializer.alias(
    ["application/proto", "application/connect+proto", "application/connect+json"], "application/octet-stream"
)


@schemathesis.deserializer("application/connect+json")
def _connect_stream(ctx, response) -> str:
    """A Connect stream's envelopes ([flags:1][length:4 BE][JSON]), the last
    one the end-of-stream envelope (flags & 2) with a JSON object. Returns
    the body as text, which the document types as a binary string."""
    data, i, ended = response.content, 0, False
    while i < len(data):
        if ended:
            raise ValueError(f"bytes after the end-of-stream envelope at {i}")
        if len(data) - i < 5:
            raise ValueError(f"truncated envelope header at {i}")
        flags, size = data[i], int.from_bytes(data[i + 1 : i + 5], "big")
        payload = data[i + 5 : i + 5 + size]
        if len(payload) != size:
            raise ValueError(f"envelope at {i} announces {size} bytes, has {len(payload)}")
        if flags & 1:
            payload = gzip.decompress(payload)
        message = json.loads(payload)
        ended = bool(flags & 2)
        if ended and not isinstance(message, dict):
            raise ValueError(f"end-of-stream envelope is not a JSON object: {message!r}")
        i += 5 + size
    if not ended:
        raise ValueError("the stream has no end-of-stream envelope")
    return data.decode("latin-1")


schema = schemathesis.openapi.from_path(OPENAPI, config=_config())


def _only(keep) -> Any:
    # Selection by exclusion: with [[operations]] in the config, schemathesis
    # 4.32 ORs an include() with the config's own catch-all selection.
    return schema.exclude(lambda ctx: not keep(ctx.operation))


def _control(op) -> bool:
    return not any(tag in DATA_PLANE_TAGS for tag in _tags(op))


# GET /metrics is both the daemon's (Prometheus) and, routed, envd's.
control = _only(lambda op: _control(op) or _operation_id(op) == "metrics")
control_live = _only(lambda op: _control(op) and "{id}" in op.path and _operation_id(op) != "killSandbox")
# /health belongs to both planes; with E2b-Sandbox-Id it is the agent's.
envd = _only(lambda op: _operation_id(op) == "health" or {"envd", "envd-rpc"} & set(_tags(op)))
code_interpreter = _only(lambda op: _operation_id(op) == "health" or "code-interpreter" in _tags(op))


def _undo(daemon: Daemon, case, response) -> None:
    """Kill the sandboxes and delete the snapshots a call made."""
    if response is None or response.status_code not in (200, 201, 202):
        return
    op = _operation_id(case.operation)
    try:
        body = response.json()
    except ValueError:
        return
    if op in CREATES and isinstance(body, dict) and body.get("sandboxID"):
        daemon.kill(body["sandboxID"])
    elif op == "forkSandbox" and isinstance(body, list):
        for child in body:
            if isinstance(child, dict) and isinstance(child.get("sandbox"), dict):
                daemon.kill(child["sandbox"].get("sandboxID", ""))
    elif op == "createSnapshot" and isinstance(body, dict) and body.get("snapshotID"):
        daemon.delete_snapshot(body["snapshotID"])
    elif op in ("createTemplateV3", "createTemplateV2") and isinstance(body, dict) and body.get("templateID"):
        daemon.delete_template(body["templateID"])


def _call_and_validate(case, daemon: Daemon, headers: Dict[str, str]):
    """case.call_and_validate, bounded in time, undoing what the call made."""
    kwargs = {"base_url": daemon.url, "headers": headers}
    response = None
    try:
        with deadline(REQUEST_DEADLINE, f"{case.method} {case.formatted_path}"):
            response = case.call(**kwargs)
            case.validate_response(response, headers=headers, transport_kwargs=kwargs)
    finally:
        _undo(daemon, case, response)
    return response


pytestmark = pytest.mark.timeout(900)


@control.parametrize()
def test_control_plane(case, daemon):
    _call_and_validate(case, daemon, {"X-API-KEY": daemon.key})


@control_live.parametrize()
def test_control_plane_live(case, daemon, live):
    case.path_parameters["id"] = live.id
    body = case.body
    if _operation_id(case.operation) == "forkSandbox" and isinstance(body, dict):
        count = body.get("count")
        if isinstance(count, int) and not isinstance(count, bool) and count > MAX_CHILDREN:
            body["count"] = MAX_CHILDREN  # each child is a gVisor sandbox
    try:
        _call_and_validate(case, daemon, {"X-API-KEY": daemon.key})
    finally:
        live.ensure()


def _data_plane(case, daemon: Daemon, sandbox: Live, port: int) -> None:
    case.headers = {**(case.headers or {}), "E2b-Sandbox-Id": sandbox.id}
    op = _operation_id(case.operation)
    if op == "health":
        case.headers["E2b-Sandbox-Port"] = str(port)  # other ports: the proxy's business
    response = _call_and_validate(case, daemon, {"X-Access-Token": sandbox.token})
    if response.status_code == 502 and case.headers.get("E2b-Sandbox-Port") == str(port):
        pytest.fail(f"port {port} of the live sandbox stopped answering: {response.text}")
    if op == "createContext" and response.status_code == 200:
        # Each context is a Python process; dozens would fill the sandbox.
        daemon.http.delete(f"/contexts/{response.json()['id']}", headers=sandbox.data_headers(port))


@envd.parametrize()
def test_envd(case, daemon, live_envd):
    _data_plane(case, daemon, live_envd, ENVD_PORT)


@code_interpreter.parametrize()
def test_code_interpreter(case, daemon, live_interpreter):
    _data_plane(case, daemon, live_interpreter, CODE_INTERPRETER_PORT)
