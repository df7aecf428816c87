"""Plain data returned by the SDK, and their parsers from wire JSON."""

from __future__ import annotations

import json as _json
import re
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Iterator, Union

from ._exceptions import ProtocolError

__all__ = [
    "SandboxInfo",
    "SnapshotInfo",
    "SnapshotNode",
    "SnapshotRef",
    "Result",
    "Logs",
    "ExecutionError",
    "Execution",
    "Context",
    "CommandResult",
    "FileType",
    "WriteInfo",
    "EntryInfo",
]


@dataclass
class SandboxInfo:
    """A sandbox as described by ``get_info()`` and ``Sandbox.list()``."""

    sandbox_id: str
    template_id: str
    state: str | None = None
    alias: str | None = None
    started_at: datetime | None = None
    end_at: datetime | None = None
    cpu_count: int | None = None
    memory_mb: int | None = None
    disk_size_mb: int | None = None
    envd_version: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)
    # Lineage (cellfork extensions to E2B's SandboxDetail; None when the
    # daemon does not say, e.g. in ``Sandbox.list()``):
    #: how the sandbox started: "pool", "standby", "restore", "boot" or "fork"
    boot_mode: str | None = None
    #: the sandbox this one was forked from
    parent_sandbox_id: str | None = None
    #: the snapshot its state last came from (created from, rolled back to,
    #: or last taken of it)
    snapshot_id: str | None = None
    #: what happens at the timeout: "kill" or "pause"
    on_timeout: str | None = None
    #: processes per user and open files per process inside the sandbox
    #: (cellfork extensions; None when the daemon does not say)
    pids_max: int | None = None
    open_files: int | None = None

    @classmethod
    def from_json(cls, data: Any) -> "SandboxInfo":
        obj = _require_object(data, "sandbox")
        return cls(
            sandbox_id=_require_str(obj, "sandboxID"),
            template_id=str(obj.get("templateID") or ""),
            state=obj.get("state"),
            alias=obj.get("alias"),
            started_at=parse_time(obj.get("startedAt")),
            end_at=parse_time(obj.get("endAt")),
            cpu_count=obj.get("cpuCount"),
            memory_mb=obj.get("memoryMB"),
            disk_size_mb=obj.get("diskSizeMB"),
            envd_version=obj.get("envdVersion"),
            metadata=dict(obj.get("metadata") or {}),
            boot_mode=obj.get("bootMode") or None,
            parent_sandbox_id=obj.get("parentSandboxID") or None,
            snapshot_id=obj.get("snapshotID") or None,
            on_timeout=_lifecycle_on_timeout(obj.get("lifecycle")),
            pids_max=obj.get("pidsMax"),
            open_files=obj.get("openFiles"),
        )


@dataclass
class NetworkStatus:
    """A sandbox's egress policy, and how many connection attempts it
    refused (``sb.network()``)."""

    allow_internet_access: bool
    allow_out: list[str] = field(default_factory=list)
    deny_out: list[str] = field(default_factory=list)
    allow_public_traffic: bool = True
    denied_connections: int = 0

    @classmethod
    def from_json(cls, data: Any) -> "NetworkStatus":
        obj = _require_object(data, "network status")
        net = obj.get("network") or {}
        return cls(
            allow_internet_access=bool(obj.get("allowInternetAccess")),
            allow_out=list(net.get("allowOut") or []),
            deny_out=list(net.get("denyOut") or []),
            allow_public_traffic=bool(net.get("allowPublicTraffic", True)),
            denied_connections=int(obj.get("deniedConnections") or 0),
        )


@dataclass
class SnapshotInfo:
    """A saved sandbox state (memory, processes, files). Start sandboxes
    from it with ``Sandbox.create(snapshot=...)`` or roll a sandbox of its
    tree back to it with ``sb.rollback(...)``."""

    id: str
    names: list[str] = field(default_factory=list)
    #: the snapshot the source sandbox's state came from (None for a root)
    parent_id: str | None = None
    #: the sandbox it was taken of
    sandbox_id: str | None = None
    template_id: str | None = None
    size_bytes: int | None = None
    created_at: datetime | None = None
    # The upload fields change after the snapshot is taken (the daemon
    # uploads in the background), so they are not part of equality: two
    # reads of one snapshot are equal.
    #: where its image is in the daemon's chunk store: "uploading",
    #: "uploaded" or "failed" (None: the daemon has no store)
    upload_state: str | None = field(default=None, compare=False)
    #: the root hash of its image's manifest in the chunk store, once uploaded
    store_root: str | None = field(default=None, compare=False)
    #: why the upload failed, when upload_state is "failed"
    upload_error: str | None = field(default=None, compare=False)

    @property
    def snapshot_id(self) -> str:
        """The id, by the E2B SDK's name for it (``SnapshotInfo.snapshot_id``)."""
        return self.id

    @classmethod
    def from_json(cls, data: Any) -> "SnapshotInfo":
        obj = _require_object(data, "snapshot")
        size = obj.get("sizeBytes")
        return cls(
            id=_require_str(obj, "snapshotID"),
            names=[str(n) for n in (obj.get("names") or [])],
            parent_id=obj.get("parentID") or None,
            sandbox_id=obj.get("sandboxID") or None,
            template_id=obj.get("templateID") or None,
            size_bytes=int(size) if isinstance(size, (int, float)) else None,
            created_at=parse_time(obj.get("createdAt")),
            upload_state=obj.get("uploadState") or None,
            store_root=obj.get("storeRoot") or None,
            upload_error=obj.get("uploadError") or None,
        )


@dataclass
class SnapshotNode:
    """One snapshot in the tree returned by ``Sandbox.snapshot_tree()``
    (the daemon's ``GET /snapshots/tree``), with the snapshots whose parent
    it is, oldest first."""

    snapshot: SnapshotInfo
    children: list["SnapshotNode"] = field(default_factory=list)

    @property
    def id(self) -> str:
        return self.snapshot.id

    @classmethod
    def from_json(cls, data: Any) -> "SnapshotNode":
        obj = _require_object(data, "snapshot tree node")
        children = obj.get("children") or []
        if not isinstance(children, list):
            raise ProtocolError("snapshot tree: children must be a JSON array")
        return cls(SnapshotInfo.from_json(obj), [cls.from_json(child) for child in children])

    def walk(self) -> Iterator["SnapshotNode"]:
        """This node and all its descendants, depth first, parents first."""
        stack = [self]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))


#: A snapshot given by id, by name, or as the SDK returned it.
SnapshotRef = Union[str, SnapshotInfo, SnapshotNode]


def _lifecycle_on_timeout(value: Any) -> str | None:
    if isinstance(value, dict) and isinstance(value.get("onTimeout"), str):
        return value["onTimeout"]
    return None


@dataclass
class Result:
    """One rich output of a code cell. ``is_main_result`` marks the value of
    the cell's last expression; other results come from ``display()`` calls
    (e.g. a matplotlib figure). Image fields hold base64 strings."""

    text: str | None = None
    html: str | None = None
    markdown: str | None = None
    svg: str | None = None
    png: str | None = None
    jpeg: str | None = None
    pdf: str | None = None
    latex: str | None = None
    json: dict[str, Any] | None = None
    javascript: str | None = None
    data: dict[str, Any] | None = None
    chart: dict[str, Any] | None = None
    is_main_result: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    _FORMATS = (
        "text", "html", "markdown", "svg", "png", "jpeg", "pdf",
        "latex", "json", "javascript", "data", "chart",
    )

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Result":
        known = {k: data[k] for k in cls._FORMATS if data.get(k) is not None}
        return cls(
            **known,
            is_main_result=bool(data.get("is_main_result", False)),
            extra=dict(data.get("extra") or {}),
        )

    def formats(self) -> list[str]:
        """Names of the formats this result carries, e.g. ``["text", "png"]``."""
        present = [f for f in self._FORMATS if getattr(self, f) is not None]
        return present + list(self.extra)


@dataclass
class Logs:
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """An exception raised by the executed code (not by the SDK)."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    """Everything one ``run_code`` call produced."""

    results: list[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: ExecutionError | None = None
    execution_count: int | None = None

    @property
    def text(self) -> str | None:
        """Text of the main result (the cell's last expression), if any."""
        for result in self.results:
            if result.is_main_result:
                return result.text
        return None


@dataclass
class Context:
    """A code-interpreter context: an isolated kernel state."""

    id: str
    language: str | None = None
    cwd: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> "Context":
        obj = _require_object(data, "context")
        return cls(id=_require_str(obj, "id"), language=obj.get("language"), cwd=obj.get("cwd"))


@dataclass
class CommandResult:
    stdout: str
    stderr: str
    exit_code: int
    error: str | None = None


class FileType(str, Enum):
    FILE = "file"
    DIR = "dir"


_ENTRY_TYPES = {
    "file": FileType.FILE,
    "dir": FileType.DIR,
    "FILE_TYPE_FILE": FileType.FILE,
    "FILE_TYPE_DIRECTORY": FileType.DIR,
    1: FileType.FILE,
    2: FileType.DIR,
}


@dataclass
class WriteInfo:
    """A file written by ``files.write``."""

    name: str
    path: str
    type: FileType | None = None

    @classmethod
    def from_json(cls, data: Any) -> "WriteInfo":
        obj = _require_object(data, "file entry")
        return cls(
            name=str(obj.get("name") or ""),
            path=_require_str(obj, "path"),
            type=_ENTRY_TYPES.get(obj.get("type")),
        )


@dataclass
class EntryInfo(WriteInfo):
    """A filesystem entry as returned by ``files.list``."""

    size: int = 0
    mode: int = 0
    permissions: str = ""
    owner: str = ""
    group: str = ""
    modified_time: datetime | None = None
    symlink_target: str | None = None
    is_symlink: bool = False
    metadata: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> "EntryInfo":
        obj = _require_object(data, "file entry")
        return cls(
            name=str(obj.get("name") or ""),
            path=_require_str(obj, "path"),
            type=_ENTRY_TYPES.get(obj.get("type")),
            size=int(obj.get("size") or 0),
            mode=int(obj.get("mode") or 0),
            permissions=str(obj.get("permissions") or ""),
            owner=str(obj.get("owner") or ""),
            group=str(obj.get("group") or ""),
            modified_time=parse_time(obj.get("modifiedTime")),
            symlink_target=obj.get("symlinkTarget"),
            is_symlink=bool(obj.get("isSymlink", False)),
            metadata=dict(obj.get("metadata") or {}),
        )


# --- helpers ---------------------------------------------------------------

_FRACTION = re.compile(r"(\.\d{6})\d+")


def parse_time(value: Any) -> datetime | None:
    """Parse an RFC 3339 timestamp (any fraction length, ``Z`` or offset)."""
    if not isinstance(value, str) or not value:
        return None
    text = _FRACTION.sub(r"\1", value.strip())
    if text.endswith(("Z", "z")):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def parse_json_body(body: bytes, what: str) -> Any:
    try:
        return _json.loads(body)
    except ValueError:
        raise ProtocolError(f"{what}: response is not JSON: {body[:200]!r}") from None


def _require_object(data: Any, what: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ProtocolError(f"expected a JSON object for {what}, got {type(data).__name__}")
    return data


def _require_str(obj: dict[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise ProtocolError(f"response is missing {key!r}")
    return value
