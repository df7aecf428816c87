"""The shared non-I/O core of :class:`~cellfork.Sandbox` and
:class:`~cellfork.AsyncSandbox`.

Every operation is split in three steps, and only the middle one differs
between the twins:

1. a ``*_request`` builder here returns a :class:`RequestSpec` (method, path,
   headers, body, timeout, retry and error-mapping policy);
2. the twin sends it (``httpx.Client`` or ``httpx.AsyncClient``), retrying
   per :class:`RetryPolicy`, and turns non-2xx answers into exceptions with
   :func:`check_response`;
3. a ``parse_*`` function here turns the response into SDK objects.

To add an operation: add its builder and parser here, then a one-line
method to each twin; ``tests/unit/test_parity.py`` fails until both twins
have it with the same signature.
"""

from __future__ import annotations

import base64
import random
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence
from urllib.parse import quote, urlencode

import httpx

from ._config import CODE_INTERPRETER_PORT, ENVD_PORT, Config
from ._envelope import encode_envelope
from ._exceptions import (
    CellforkError,
    InvalidArgumentError,
    ProtocolError,
    error_from_response,
    error_from_status,
    parse_retry_after,
)
from ._models import (
    Context,
    EntryInfo,
    NetworkStatus,
    SandboxInfo,
    SnapshotInfo,
    SnapshotNode,
    SnapshotRef,
    WriteInfo,
    parse_json_body,
)
from ._version import __version__

USER_AGENT = f"cellfork-python/{__version__}"
CONNECT_STREAM_CONTENT_TYPE = "application/connect+json"
KEEPALIVE_PING_INTERVAL = "50"  # seconds; envd sends keepalives this often
STREAM_READ_SLACK = 10.0  # seconds a stream read may exceed its deadline
MAX_RETRY_AFTER = 60.0  # longer Retry-After answers are raised, not waited out
RETRY_STATUSES = frozenset({429, 503})


@dataclass
class RequestSpec:
    """Everything needed to send one HTTP request, minus the client."""

    method: str
    path: str
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] | None = None
    json: Any = None
    content: bytes | None = None
    files: dict[str, Any] | None = None
    timeout: httpx.Timeout | None = None
    # Safe to send again: retried on 429/503 and on connection failures.
    idempotent: bool = False
    # A 404 means "no such sandbox" (SandboxNotFoundError).
    sandbox_lookup: bool = False
    # Non-2xx statuses that are answers, not errors (e.g. 404 on kill).
    accept: frozenset[int] = frozenset()

    def httpx_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"headers": self.headers, "timeout": self.timeout}
        if self.params is not None:
            kwargs["params"] = self.params
        if self.json is not None:
            kwargs["json"] = self.json
        if self.content is not None:
            kwargs["content"] = self.content
        if self.files is not None:
            kwargs["files"] = self.files
        return kwargs


def check_response(spec: RequestSpec, response: httpx.Response) -> None:
    """Raise the typed error for a non-2xx answer. The body must be read."""
    status = response.status_code
    if 200 <= status < 300 or status in spec.accept:
        return
    raise error_from_response(
        status,
        response.content,
        response.headers,
        sandbox_lookup=spec.sandbox_lookup,
        reason=response.reason_phrase,
    )


def request_id(response: httpx.Response) -> str | None:
    return response.headers.get("x-request-id")


# --- retries ---------------------------------------------------------------


@dataclass
class RetryPolicy:
    """Retries of idempotent requests with jittered exponential backoff
    that honours ``Retry-After``. Pure: the twins do the sleeping.

    Only requests marked idempotent (control-plane GETs) are retried, on
    429/503 and on failures to connect. The ``Should-Retry`` header is not
    consulted: the daemon sends ``Should-Retry: false`` on every 429/503 to
    stop the E2B SDKs from repeating non-idempotent calls, which this SDK
    never retries anyway.
    """

    max_retries: int
    base_delay: float = 0.5
    max_delay: float = 8.0
    rand: Any = random.random

    def retry_after_response(self, spec: RequestSpec, attempt: int, response: httpx.Response) -> float | None:
        """Seconds to wait before retrying, or None to give up."""
        if not spec.idempotent or attempt >= self.max_retries:
            return None
        if response.status_code not in RETRY_STATUSES:
            return None
        retry_after = parse_retry_after(response.headers.get("retry-after"))
        if retry_after is not None and retry_after > MAX_RETRY_AFTER:
            return None
        return self.delay(attempt, retry_after)

    def retry_after_error(self, spec: RequestSpec, attempt: int, exc: Exception) -> float | None:
        """Seconds to wait after a transport error, or None to give up.
        Only failures before the request reached the server are retried."""
        if not spec.idempotent or attempt >= self.max_retries:
            return None
        if not isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            return None
        return self.delay(attempt, None)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            # At least what the server asked for, plus up to 10% jitter so
            # that many clients told the same value do not return together.
            return retry_after * (1 + 0.1 * self.rand())
        backoff = min(self.max_delay, self.base_delay * 2**attempt)
        return backoff * (0.75 + 0.25 * self.rand())


# --- control plane ---------------------------------------------------------


@dataclass(frozen=True)
class CreatedSandbox:
    """What the create/connect answer tells the SDK about a sandbox."""

    sandbox_id: str
    template_id: str
    envd_version: str | None
    access_token: str | None
    traffic_access_token: str | None
    # How the sandbox started: "pool", "standby", "restore", "boot" or "fork" (ours).
    boot_mode: str | None = None


@dataclass(frozen=True)
class Limits:
    """The limits a create asks for (None: the template's or snapshot's)."""

    cpu_count: int | None = None
    memory_mb: int | None = None
    disk_size_mb: int | None = None
    pids_max: int | None = None
    open_files: int | None = None

    def to_json(self) -> dict[str, int]:
        """The create body's keys for the limits that are set. Validation
        (bounds, zero) is the daemon's, which answers 400 naming the key."""
        keys = {"cpu_count": "cpuCount", "memory_mb": "memoryMB", "disk_size_mb": "diskSizeMB",
                "pids_max": "pidsMax", "open_files": "openFiles"}
        out: dict[str, int] = {}
        for attr, key in keys.items():
            value = getattr(self, attr)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{attr} must be an int, not {value!r}")
            out[key] = value
        return out


@dataclass(frozen=True)
class Network:
    """An egress policy (E2B's ``network``). None leaves the daemon's
    default: internet on, no rules, ports public."""

    allow_internet_access: bool | None = None
    #: IPv4 addresses, CIDRs and domain names ("example.com",
    #: "*.example.com"); an allow wins over a deny
    allow_out: Sequence[str] | None = None
    #: IPv4 addresses and CIDRs; "0.0.0.0/0" denies all but allow_out
    deny_out: Sequence[str] | None = None
    #: False: the sandbox's ports need its traffic access token (create only)
    allow_public_traffic: bool | None = None

    def to_json(self) -> dict[str, Any]:
        """The create body's keys for what is set (the daemon validates)."""
        out: dict[str, Any] = {}
        if self.allow_internet_access is not None:
            out["allow_internet_access"] = bool(self.allow_internet_access)
        net: dict[str, Any] = {}
        for attr, key in (("allow_out", "allowOut"), ("deny_out", "denyOut")):
            value = getattr(self, attr)
            if value is not None:
                if isinstance(value, str):
                    raise TypeError(f"{attr} must be a list of strings, not a string")
                net[key] = [str(v) for v in value]
        if self.allow_public_traffic is not None:
            net["allowPublicTraffic"] = bool(self.allow_public_traffic)
        if net:
            out["network"] = net
        return out


def snapshot_id_of(snapshot: SnapshotRef) -> str:
    """The id (or name) to send for a snapshot argument."""
    if isinstance(snapshot, SnapshotNode):
        snapshot = snapshot.snapshot
    if isinstance(snapshot, SnapshotInfo):
        return snapshot.id
    if isinstance(snapshot, str) and snapshot:
        return snapshot
    raise TypeError(
        f"snapshot must be a non-empty id or name, a SnapshotInfo or a SnapshotNode, not {snapshot!r}"
    )


class ApiCore:
    """Request builders and parsers for the control plane (``X-API-KEY``)."""

    def __init__(self, config: Config) -> None:
        self.config = config

    def timeout(self, request_timeout: float | None = None) -> httpx.Timeout:
        return httpx.Timeout(_pick_timeout(request_timeout, self.config.request_timeout))

    def control_headers(self) -> dict[str, str]:
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if self.config.api_key:
            headers["X-API-KEY"] = self.config.api_key
        return headers

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(max_retries=self.config.max_retries)

    def create_request(
        self,
        template: str,
        timeout: int | None,
        envs: Mapping[str, str] | None,
        metadata: Mapping[str, str] | None,
        snapshot: SnapshotRef | None,
        request_timeout: float | None,
        limits: Limits | None = None,
        network: Network | None = None,
    ) -> RequestSpec:
        body: dict[str, Any] = {
            # A snapshot is addressed like a template (as in E2B).
            "templateID": template if snapshot is None else snapshot_id_of(snapshot),
            "metadata": dict(metadata or {}),
            "envVars": dict(envs or {}),
        }
        if timeout is not None:
            body["timeout"] = int(timeout)
        if limits is not None:
            body.update(limits.to_json())
        if network is not None:
            body.update(network.to_json())
        return RequestSpec(
            "POST", "/v2/sandboxes", self.control_headers(), json=body,
            timeout=self.timeout(request_timeout),
        )

    def connect_request(
        self, sandbox_id: str, timeout: int | None, request_timeout: float | None
    ) -> RequestSpec:
        body: dict[str, Any] = {} if timeout is None else {"timeout": int(timeout)}
        return RequestSpec(
            "POST", f"/v2/sandboxes/{_seg(sandbox_id)}/connect", self.control_headers(),
            json=body, timeout=self.timeout(request_timeout), sandbox_lookup=True,
        )

    def list_request(
        self,
        metadata: Mapping[str, str] | None,
        state: list[str] | None,
        limit: int | None,
        next_token: str | None,
        request_timeout: float | None,
    ) -> RequestSpec:
        params: dict[str, str] = {}
        if metadata:
            # As the E2B SDK does: quote each key and value, then urlencode
            # the pairs; the server unescapes once more after parsing.
            params["metadata"] = urlencode({quote(k, safe=""): quote(v, safe="") for k, v in metadata.items()})
        if state:
            params["state"] = ",".join(state)
        if limit is not None:
            params["limit"] = str(limit)
        if next_token:
            params["nextToken"] = next_token
        return RequestSpec(
            "GET", "/v2/sandboxes", self.control_headers(), params=params,
            timeout=self.timeout(request_timeout), idempotent=True,
        )

    def list_snapshots_request(
        self,
        sandbox_id: str | None,
        name: str | None,
        limit: int | None,
        next_token: str | None,
        request_timeout: float | None,
    ) -> RequestSpec:
        params: dict[str, str] = {}
        if sandbox_id:
            params["sandboxID"] = sandbox_id
        if name:
            params["name"] = name
        if limit is not None:
            params["limit"] = str(limit)
        if next_token:
            params["nextToken"] = next_token
        return RequestSpec(
            "GET", "/snapshots", self.control_headers(), params=params,
            timeout=self.timeout(request_timeout), idempotent=True,
        )

    def snapshot_tree_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "GET", "/snapshots/tree", self.control_headers(),
            timeout=self.timeout(request_timeout), idempotent=True,
        )

    def get_snapshot_request(
        self, snapshot: SnapshotRef, request_timeout: float | None
    ) -> RequestSpec:
        return RequestSpec(
            "GET", f"/snapshots/{_seg(snapshot_id_of(snapshot))}", self.control_headers(),
            timeout=self.timeout(request_timeout), idempotent=True,
        )

    def delete_snapshot_request(
        self, snapshot: SnapshotRef, request_timeout: float | None
    ) -> RequestSpec:
        return RequestSpec(
            "DELETE", f"/snapshots/{_seg(snapshot_id_of(snapshot))}", self.control_headers(),
            timeout=self.timeout(request_timeout), accept=frozenset({404}),
        )


def parse_created(response: httpx.Response) -> CreatedSandbox:
    data = parse_json_body(response.content, "sandbox")
    info = SandboxInfo.from_json(data)
    return _created_from(data, info)


def _created_from(data: dict[str, Any], info: SandboxInfo) -> CreatedSandbox:
    return CreatedSandbox(
        sandbox_id=info.sandbox_id,
        template_id=info.template_id,
        envd_version=info.envd_version,
        access_token=data.get("envdAccessToken") or None,
        traffic_access_token=data.get("trafficAccessToken") or None,
        boot_mode=data.get("bootMode") or None,
    )


def parse_snapshot(response: httpx.Response) -> SnapshotInfo:
    return SnapshotInfo.from_json(parse_json_body(response.content, "snapshot"))


def parse_snapshots(response: httpx.Response) -> tuple[list[SnapshotInfo], str | None]:
    data = parse_json_body(response.content, "snapshot list")
    if not isinstance(data, list):
        raise ProtocolError("snapshot list: expected a JSON array")
    return [SnapshotInfo.from_json(item) for item in data], response.headers.get("x-next-token") or None


def parse_snapshot_tree(response: httpx.Response) -> list[SnapshotNode]:
    data = parse_json_body(response.content, "snapshot tree")
    if not isinstance(data, list):
        raise ProtocolError("snapshot tree: expected a JSON array")
    return [SnapshotNode.from_json(item) for item in data]


def parse_fork(response: httpx.Response) -> list[CreatedSandbox | CellforkError]:
    """One entry per child: the child, or the error that child failed with
    (E2B's ``SandboxForkResult``). A failed child does not fail the others."""
    data = parse_json_body(response.content, "fork")
    if not isinstance(data, list):
        raise ProtocolError("fork: expected a JSON array")
    rid = request_id(response)
    out: list[CreatedSandbox | CellforkError] = []
    for item in data:
        if not isinstance(item, dict):
            out.append(ProtocolError("fork: expected a JSON object per child", request_id=rid))
            continue
        sandbox, error = item.get("sandbox"), item.get("error")
        if isinstance(error, dict):
            code, message = error.get("code"), error.get("message")
            status = code if isinstance(code, int) else 500
            out.append(error_from_status(status, str(message or ""), request_id=rid))
        elif isinstance(sandbox, dict):
            try:
                out.append(_created_from(sandbox, SandboxInfo.from_json(sandbox)))
            except ProtocolError as exc:
                exc.request_id = rid
                out.append(exc)
        else:
            out.append(ProtocolError("fork: a child has neither sandbox nor error", request_id=rid))
    return out


def parse_paused(response: httpx.Response) -> bool:
    """False for the accepted 409 of pause (it was paused already)."""
    return response.status_code != 409


def parse_list(response: httpx.Response) -> tuple[list[SandboxInfo], str | None]:
    data = parse_json_body(response.content, "sandbox list")
    if not isinstance(data, list):
        raise ProtocolError("sandbox list: expected a JSON array")
    return [SandboxInfo.from_json(item) for item in data], response.headers.get("x-next-token") or None


def parse_network(response: httpx.Response) -> NetworkStatus:
    return NetworkStatus.from_json(parse_json_body(response.content, "network status"))


def parse_info(response: httpx.Response) -> SandboxInfo:
    return SandboxInfo.from_json(parse_json_body(response.content, "sandbox"))


# --- one sandbox: control plane and data plane -----------------------------


class SandboxCore(ApiCore):
    """Builders for one sandbox. Data-plane requests go to the same base
    URL, routed by ``E2b-Sandbox-Id`` / ``E2b-Sandbox-Port`` and
    authenticated with the sandbox's ``X-Access-Token``."""

    def __init__(self, config: Config, created: CreatedSandbox) -> None:
        super().__init__(config)
        self.created = created
        self.sandbox_id = created.sandbox_id

    # control plane

    def info_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "GET", f"/sandboxes/{_seg(self.sandbox_id)}", self.control_headers(),
            timeout=self.timeout(request_timeout), idempotent=True, sandbox_lookup=True,
        )

    def kill_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "DELETE", f"/sandboxes/{_seg(self.sandbox_id)}", self.control_headers(),
            timeout=self.timeout(request_timeout), accept=frozenset({404}),
        )

    def set_timeout_request(self, seconds: int, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/timeout", self.control_headers(),
            json={"timeout": int(seconds)}, timeout=self.timeout(request_timeout),
            sandbox_lookup=True,
        )

    def update_network_request(self, network: Network, request_timeout: float | None) -> RequestSpec:
        body = network.to_json()
        body.update(body.pop("network", {}))
        body.pop("allowPublicTraffic", None)  # set at create only
        return RequestSpec(
            "PUT", f"/sandboxes/{_seg(self.sandbox_id)}/network", self.control_headers(),
            json=body, timeout=self.timeout(request_timeout), sandbox_lookup=True,
        )

    def network_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "GET", f"/sandboxes/{_seg(self.sandbox_id)}/network", self.control_headers(),
            timeout=self.timeout(request_timeout), sandbox_lookup=True,
        )

    # --- lineage -----------------------------------------------------------
    # Snapshots, forks, rollback, pause and merge (cellfork's fork-first
    # features; snapshot, fork and pause are E2B endpoints, rollback and
    # merge ours). ``Sandbox.create(snapshot=...)`` starts a sandbox from a
    # snapshot by passing it as the templateID, as E2B does.

    def adopt(self, created: CreatedSandbox) -> None:
        """Take the daemon's new description of this same sandbox (after a
        rollback or merge: same id, new state)."""
        if created.sandbox_id != self.sandbox_id:
            raise ProtocolError(
                f"the daemon answered for sandbox {created.sandbox_id!r}, not {self.sandbox_id!r}"
            )
        self.created = created

    def snapshot_request(self, name: str | None, request_timeout: float | None) -> RequestSpec:
        body: dict[str, Any] = {} if name is None else {"name": name}
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/snapshots", self.control_headers(),
            json=body, timeout=self.timeout(request_timeout), sandbox_lookup=True,
        )

    def fork_request(self, n: int, timeout: int | None, request_timeout: float | None) -> RequestSpec:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, not {n!r}")
        body: dict[str, Any] = {"count": n}
        if timeout is not None:
            body["timeout"] = int(timeout)
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/fork", self.control_headers(),
            json=body, timeout=self.timeout(request_timeout), sandbox_lookup=True,
        )

    def rollback_request(
        self, snapshot: SnapshotRef, request_timeout: float | None
    ) -> RequestSpec:
        # Not a sandbox lookup: a 404 may name the snapshot instead.
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/rollback", self.control_headers(),
            json={"snapshotID": snapshot_id_of(snapshot)}, timeout=self.timeout(request_timeout),
        )

    def pause_request(self, spill: bool, request_timeout: float | None) -> RequestSpec:
        body: dict[str, Any] = {"spill": True} if spill else {}
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/pause", self.control_headers(),
            json=body, timeout=self.timeout(request_timeout), sandbox_lookup=True,
            accept=frozenset({409}),
        )

    def merge_request(self, child_id: str, request_timeout: float | None) -> RequestSpec:
        if not isinstance(child_id, str) or not child_id:
            raise TypeError(f"child must be a sandbox or a non-empty sandbox id, not {child_id!r}")
        # Not a sandbox lookup: a 404 may name either sandbox.
        return RequestSpec(
            "POST", f"/sandboxes/{_seg(self.sandbox_id)}/merge", self.control_headers(),
            json={"sandboxID": child_id}, timeout=self.timeout(request_timeout),
        )

    # data plane: shared headers

    def data_headers(self, port: int) -> dict[str, str]:
        headers = {
            "User-Agent": USER_AGENT,
            "E2b-Sandbox-Id": self.sandbox_id,
            "E2b-Sandbox-Port": str(port),
        }
        if self.created.access_token:
            headers["X-Access-Token"] = self.created.access_token
        return headers

    def health_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "GET", "/health", self.data_headers(ENVD_PORT),
            timeout=self.timeout(request_timeout if request_timeout is not None else 5),
            accept=frozenset({404, 502}),
        )

    # envd: Connect RPC

    def rpc_request(
        self, method: str, message: dict[str, Any], user: str | None, request_timeout: float | None
    ) -> RequestSpec:
        """A unary Connect call, e.g. ``method="filesystem.Filesystem/Stat"``."""
        timeout = _pick_timeout(request_timeout, self.config.request_timeout)
        headers = self.data_headers(ENVD_PORT) | {
            "Content-Type": "application/json",
            "Connect-Protocol-Version": "1",
        }
        if timeout is not None:
            headers["Connect-Timeout-Ms"] = str(int(timeout * 1000))
        headers |= _user_header(user)
        return RequestSpec(
            "POST", f"/{method}", headers, json=message, timeout=httpx.Timeout(timeout),
        )

    def stream_request(
        self,
        method: str,
        message: dict[str, Any],
        user: str | None,
        deadline: float | None,
        request_timeout: float | None,
    ) -> RequestSpec:
        """A server-streaming Connect call; ``deadline`` (s) bounds the whole
        stream and is enforced by the server (``Connect-Timeout-Ms``)."""
        rt = _pick_timeout(request_timeout, self.config.request_timeout)
        headers = self.data_headers(ENVD_PORT) | {
            "Content-Type": CONNECT_STREAM_CONTENT_TYPE,
            "Connect-Protocol-Version": "1",
            "Connect-Content-Encoding": "identity",
            "Connect-Accept-Encoding": "identity",
            "Keepalive-Ping-Interval": KEEPALIVE_PING_INTERVAL,
        }
        if deadline is not None:
            headers["Connect-Timeout-Ms"] = str(int(deadline * 1000))
        headers |= _user_header(user)
        # The server sends keepalives while the command is quiet, so reads
        # wait at most the keepalive interval; the deadline is the server's.
        read = float(KEEPALIVE_PING_INTERVAL) + STREAM_READ_SLACK
        if deadline is not None:
            read = min(read, deadline + STREAM_READ_SLACK)
        return RequestSpec(
            "POST", f"/{method}", headers, content=encode_envelope(message),
            timeout=httpx.Timeout(rt, read=read),
        )

    def process_start_request(
        self,
        cmd: str,
        envs: Mapping[str, str] | None,
        cwd: str | None,
        user: str | None,
        timeout: float | None,
        request_timeout: float | None,
    ) -> RequestSpec:
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", cmd]}
        if envs:
            process["envs"] = dict(envs)
        if cwd:
            process["cwd"] = cwd
        return self.stream_request(
            "process.Process/Start", {"process": process, "stdin": False},
            user, timeout, request_timeout,
        )

    def kill_process_request(self, pid: int, request_timeout: float | None) -> RequestSpec:
        spec = self.rpc_request(
            "process.Process/SendSignal",
            {"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"}, None, request_timeout,
        )
        spec.accept = frozenset({404})  # no such process -> False
        return spec

    def exists_request(self, path: str, user: str | None, request_timeout: float | None) -> RequestSpec:
        spec = self.rpc_request("filesystem.Filesystem/Stat", {"path": path}, user, request_timeout)
        spec.accept = frozenset({404})  # -> False
        return spec

    def list_dir_request(
        self, path: str, depth: int, user: str | None, request_timeout: float | None
    ) -> RequestSpec:
        return self.rpc_request(
            "filesystem.Filesystem/ListDir", {"path": path, "depth": depth}, user, request_timeout
        )

    def make_dir_request(self, path: str, user: str | None, request_timeout: float | None) -> RequestSpec:
        spec = self.rpc_request("filesystem.Filesystem/MakeDir", {"path": path}, user, request_timeout)
        spec.accept = frozenset({409})  # already exists -> False
        return spec

    def remove_request(self, path: str, user: str | None, request_timeout: float | None) -> RequestSpec:
        return self.rpc_request("filesystem.Filesystem/Remove", {"path": path}, user, request_timeout)

    # envd: /files

    def read_file_request(
        self, path: str, format: str, user: str | None, request_timeout: float | None
    ) -> RequestSpec:
        if format not in ("text", "bytes"):
            raise ValueError(f"format must be 'text' or 'bytes', not {format!r}")
        return RequestSpec(
            "GET", "/files", self.data_headers(ENVD_PORT), params=_file_params(path, user),
            timeout=self.timeout(request_timeout),
        )

    def write_file_request(
        self, path: str, data: str | bytes, user: str | None, request_timeout: float | None
    ) -> RequestSpec:
        if isinstance(data, str):
            content, ctype = data.encode(), "text/plain"
        elif isinstance(data, (bytes, bytearray, memoryview)):
            content, ctype = bytes(data), "application/octet-stream"
        else:
            raise TypeError(f"files.write data must be str or bytes, not {type(data).__name__}")
        return RequestSpec(
            "POST", "/files", self.data_headers(ENVD_PORT), params=_file_params(path, user),
            files={"file": (path, content, ctype)}, timeout=self.timeout(request_timeout),
        )

    # code interpreter

    def execute_request(
        self,
        code: str,
        context: Context | str | None,
        envs: Mapping[str, str] | None,
        timeout: float | None,
        request_timeout: float | None,
        language: str | None = None,
    ) -> RequestSpec:
        if context is not None and language:
            raise InvalidArgumentError("give a context or a language, not both")
        context_id = context.id if isinstance(context, Context) else context
        body = {
            "code": code,
            "context_id": context_id,
            "language": language or None,
            "env_vars": dict(envs) if envs else None,
        }
        rt = _pick_timeout(request_timeout, self.config.request_timeout)
        # The server writes a keepalive line every few seconds, and the twins
        # check the deadline after each line; a read that waits longer than
        # the whole deadline has certainly overrun it.
        return RequestSpec(
            "POST", "/execute", self.data_headers(CODE_INTERPRETER_PORT), json=body,
            timeout=httpx.Timeout(rt, read=timeout),
        )

    def create_context_request(
        self, cwd: str | None, language: str | None, request_timeout: float | None
    ) -> RequestSpec:
        body = {k: v for k, v in (("cwd", cwd), ("language", language)) if v is not None}
        return RequestSpec(
            "POST", "/contexts", self.data_headers(CODE_INTERPRETER_PORT), json=body,
            timeout=self.timeout(request_timeout),
        )

    def list_contexts_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec(
            "GET", "/contexts", self.data_headers(CODE_INTERPRETER_PORT),
            timeout=self.timeout(request_timeout),
        )

    def context_request(
        self, method: str, context: Context | str, action: str, request_timeout: float | None
    ) -> RequestSpec:
        """``DELETE /contexts/{id}`` or ``POST /contexts/{id}/restart``."""
        context_id = context.id if isinstance(context, Context) else context
        path = f"/contexts/{_seg(context_id)}" + (f"/{action}" if action else "")
        return RequestSpec(
            method, path, self.data_headers(CODE_INTERPRETER_PORT),
            timeout=self.timeout(request_timeout),
        )


# --- data-plane parsers ----------------------------------------------------


def parse_found(response: httpx.Response) -> bool:
    """False for the accepted 404 of kill / kill_process / exists."""
    return response.status_code != 404


def parse_dir_created(response: httpx.Response) -> bool:
    """False for the accepted 409 (already exists) of make_dir."""
    return response.status_code != 409


def parse_healthy(response: httpx.Response) -> bool:
    """False for the accepted 404/502 of the health check (sandbox gone)."""
    return 200 <= response.status_code < 300


def parse_rpc(response: httpx.Response, what: str) -> dict[str, Any]:
    data = parse_json_body(response.content, what) if response.content else {}
    if not isinstance(data, dict):
        raise ProtocolError(f"{what}: expected a JSON object")
    return data


def parse_entries(response: httpx.Response) -> list[EntryInfo]:
    entries = parse_rpc(response, "list directory").get("entries") or []
    out = []
    for item in entries:
        entry = EntryInfo.from_json(item)
        if entry.type is not None or entry.is_symlink:
            out.append(entry)
    return out


def parse_read(response: httpx.Response, format: str) -> str | bytes:
    if format == "bytes":
        return response.content
    return response.content.decode("utf-8", errors="replace")


def parse_write(response: httpx.Response) -> WriteInfo:
    data = parse_json_body(response.content, "write file")
    if not isinstance(data, list) or not data:
        raise ProtocolError("write file: expected a non-empty JSON array")
    return WriteInfo.from_json(data[0])


def parse_contexts(response: httpx.Response) -> list[Context]:
    data = parse_json_body(response.content, "contexts")
    if not isinstance(data, list):
        raise ProtocolError("contexts: expected a JSON array")
    return [Context.from_json(item) for item in data]


def check_stream_content_type(response: httpx.Response) -> None:
    ctype = response.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != CONNECT_STREAM_CONTENT_TYPE:
        raise ProtocolError(f"unexpected content type for a Connect stream: {ctype!r}")


# --- helpers ---------------------------------------------------------------


def _pick_timeout(value: float | None, default: float | None) -> float | None:
    """Per-call timeout: None = the client's default, 0 = no limit."""
    if value is None:
        return default
    return None if value == 0 else float(value)


def _user_header(user: str | None) -> dict[str, str]:
    if not user:
        return {}
    token = base64.b64encode(f"{user}:".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _file_params(path: str, user: str | None) -> dict[str, str]:
    params = {"path": path}
    if user:
        params["username"] = user
    return params


def _seg(value: str) -> str:
    """Percent-encode one path segment."""
    return quote(value, safe="")
