"""An in-memory stand-in for the cellfork daemon, served through
``httpx.MockTransport``. It speaks just enough of the wire protocol (see
/work/shared/spec/e2b-compat.md) to drive the SDK's I/O layers in unit
tests; the real daemon is exercised by tests/integration."""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Iterator

import httpx

# The create body's limit keys (cellfork extensions).
LIMITS = ("cpuCount", "memoryMB", "diskSizeMB", "pidsMax", "openFiles")

API_KEY = "test-key"
TOKEN = "envd-token"


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    payload = json.dumps(message).encode()
    return struct.pack(">BI", flags, len(payload)) + payload


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


class ChunkedStream(httpx.SyncByteStream, httpx.AsyncByteStream):
    """A response body delivered in the given chunks (sync and async)."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    def __iter__(self) -> Iterator[bytes]:
        yield from self.chunks

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk


@dataclass
class Command:
    """Scripted result of a command line."""

    stdout: str = ""
    stderr: str = ""
    exit_code: int = 0
    end: bool = True  # send the end event
    error: dict[str, str] | None = None  # Connect error in end-of-stream


@dataclass
class FakeDaemon:
    requests: list[httpx.Request] = field(default_factory=list)
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    commands: dict[str, Command] = field(default_factory=dict)
    executions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    # Canned answers returned (in order) before normal handling.
    queued: list[httpx.Response] = field(default_factory=list)
    pids: set[int] = field(default_factory=set)
    page_size: int = 2
    chunk_size: int | None = None  # split streamed bodies into chunks of this size
    counter: int = 0
    # Lineage: snapshots by id (insertion order = creation order), and the
    # indexes of fork children that fail (with this error body).
    snapshots: dict[str, dict[str, Any]] = field(default_factory=dict)
    fork_failures: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.queued:
            return self.queued.pop(0)
        port = request.headers.get("e2b-sandbox-port")
        if port is None:
            return self.control(request)
        sandbox_id = request.headers.get("e2b-sandbox-id")
        if sandbox_id not in self.sandboxes:
            return _json(502, {"code": 502, "message": "The sandbox was not found"})
        if request.headers.get("x-access-token") != TOKEN:
            return _json(401, {"code": 401, "message": "bad access token"})
        if port == "49983":
            return self.envd(request)
        if port == "49999":
            return self.interpreter(request)
        return _json(400, {"code": 400, "message": "bad port"})

    # --- control plane ---

    def control(self, request: httpx.Request) -> httpx.Response:
        if request.headers.get("x-api-key") != API_KEY:
            return _json(401, {"code": 401, "message": "invalid API key"})
        parts = request.url.path.strip("/").split("/")
        method = request.method
        if method == "POST" and parts == ["v2", "sandboxes"]:
            body = json.loads(request.content)
            snap = self._find_snapshot(body["templateID"])
            limits = {k: body[k] for k in LIMITS if k in body}
            if any(not isinstance(v, int) or v <= 0 for v in limits.values()):
                return _json(400, {"code": 400, "message": "limits must be positive integers"})
            sid = self._new_sandbox(body["templateID"], body["metadata"], body.get("timeout"),
                                    "restore" if snap else "pool")
            self.sandboxes[sid]["limits"] = limits
            if snap:
                self.sandboxes[sid]["base"] = snap["snapshotID"]
            return _json(201, self._sandbox(sid))
        if method == "POST" and parts[:2] == ["v2", "sandboxes"] and parts[3:] == ["connect"]:
            if parts[2] not in self.sandboxes:
                return _json(404, {"code": 404, "message": f"sandbox {parts[2]} not found"})
            sb = self.sandboxes[parts[2]]
            resumed, sb["paused"] = sb.get("paused", False), False
            return _json(201 if resumed else 200, self._sandbox(parts[2]))
        if parts[0] == "snapshots":
            return self.snapshot_endpoints(request, parts)
        if method == "GET" and parts == ["v2", "sandboxes"]:
            ids = sorted(self.sandboxes)
            start = int(request.url.params.get("nextToken") or 0)
            page = ids[start : start + self.page_size]
            headers = {}
            if start + self.page_size < len(ids):
                headers["X-Next-Token"] = str(start + self.page_size)
            return _json(200, [self._detail(s) for s in page], headers)
        if parts[0] == "sandboxes" and len(parts) >= 2:
            sid = parts[1]
            if sid not in self.sandboxes:
                return _json(404, {"code": 404, "message": f"sandbox {sid} not found"})
            if method == "GET" and len(parts) == 2:
                return _json(200, self._detail(sid))
            if method == "DELETE" and len(parts) == 2:
                del self.sandboxes[sid]
                return httpx.Response(204)
            if method == "POST" and parts[2:] == ["timeout"]:
                self.sandboxes[sid]["timeout"] = json.loads(request.content)["timeout"]
                return httpx.Response(204)
            if method == "POST" and len(parts) == 3:
                return self.lineage(sid, parts[2], json.loads(request.content or b"{}"))
        return _json(404, {"code": 404, "message": "no route"})

    def _new_sandbox(self, template: str, metadata: dict[str, str], timeout: Any,
                     boot_mode: str, parent: str | None = None) -> str:
        self.counter += 1
        sid = f"sbx{self.counter}"
        self.sandboxes[sid] = {"templateID": template, "metadata": metadata, "timeout": timeout,
                               "bootMode": boot_mode, "parent": parent, "paused": False}
        return sid

    def _find_snapshot(self, id_or_name: str) -> dict[str, Any] | None:
        for snap in self.snapshots.values():
            if id_or_name == snap["snapshotID"] or id_or_name in snap["names"]:
                return snap
        return None

    def lineage(self, sid: str, action: str, body: dict[str, Any]) -> httpx.Response:
        sb = self.sandboxes[sid]
        if action == "pause":
            if body.get("spill"):  # moves a paused sandbox to disk too
                sb["paused"] = sb["spilled"] = True
                return httpx.Response(204)
            if sb["paused"]:
                return _json(409, {"code": 409, "message": f"sandbox {sid} is already paused"})
            sb["paused"], sb["spilled"] = True, False
            return httpx.Response(204)
        if action == "snapshots":
            name = body.get("name")
            if name and self._find_snapshot(name):
                return _json(409, {"code": 409, "message": f"a snapshot named {name} exists"})
            snap_id = f"snap{len(self.snapshots) + 1}"
            self.snapshots[snap_id] = {
                "snapshotID": snap_id, "names": [name] if name else [],
                "parentID": sb.get("base"), "sandboxID": sid, "templateID": sb["templateID"],
                "sizeBytes": 1000 * len(self.snapshots),
                "createdAt": f"2026-01-02T03:04:{len(self.snapshots):02d}.5Z",
            }
            sb["base"] = snap_id
            return _json(201, self.snapshots[snap_id])
        if action == "fork":
            out: list[dict[str, Any]] = []
            for i in range(body.get("count", 1)):
                if i in self.fork_failures:
                    out.append({"error": self.fork_failures[i]})
                    continue
                child = self._new_sandbox(sb["templateID"], sb["metadata"], body.get("timeout"),
                                          "fork", parent=sid)
                self.sandboxes[child]["base"] = sb.get("base")
                out.append({"sandbox": self._sandbox(child)})
            return _json(201, out)
        if action == "rollback":
            snap = self._find_snapshot(body["snapshotID"])
            if snap is None:
                return _json(404, {"code": 404, "message": f"snapshot {body['snapshotID']} not found"})
            sb["base"] = snap["snapshotID"]
            return _json(200, self._sandbox(sid))
        if action == "merge":
            child = body["sandboxID"]
            if child not in self.sandboxes:
                return _json(404, {"code": 404, "message": f"sandbox {child} not found"})
            if self.sandboxes[child]["parent"] != sid:
                return _json(409, {"code": 409, "message": f"{child} is not a fork child of {sid}"})
            sb["base"] = self.sandboxes.pop(child).get("base")
            return _json(200, self._sandbox(sid))
        return _json(404, {"code": 404, "message": "no route"})

    def snapshot_endpoints(self, request: httpx.Request, parts: list[str]) -> httpx.Response:
        if request.method == "GET" and len(parts) == 1:
            q = request.url.params
            snaps = [s for s in self.snapshots.values()
                     if ("sandboxID" not in q or s["sandboxID"] == q["sandboxID"])
                     and ("name" not in q or q["name"] in s["names"])]
            start = int(q.get("nextToken") or 0)
            size = int(q.get("limit") or self.page_size)
            headers = {}
            if start + size < len(snaps):
                headers["X-Next-Token"] = str(start + size)
            return _json(200, snaps[start : start + size], headers)
        if request.method == "GET" and parts[1:] == ["tree"]:
            # The fake's snapshots are never orphaned or cyclic: nest by parent.
            def node(snap: dict[str, Any]) -> dict[str, Any]:
                kids = [s for s in self.snapshots.values() if s["parentID"] == snap["snapshotID"]]
                return {**snap, "children": [node(k) for k in kids]}
            return _json(200, [node(s) for s in self.snapshots.values() if s["parentID"] is None])
        snap = self._find_snapshot(parts[1]) if len(parts) == 2 else None
        if snap is None:
            return _json(404, {"code": 404, "message": f"snapshot {parts[-1]} not found"})
        if request.method == "GET":
            return _json(200, snap)
        if request.method == "DELETE":
            for other in self.snapshots.values():
                if other["parentID"] == snap["snapshotID"]:
                    other["parentID"] = snap["parentID"]
            del self.snapshots[snap["snapshotID"]]
            return httpx.Response(204)
        return _json(404, {"code": 404, "message": "no route"})

    def _sandbox(self, sid: str) -> dict[str, Any]:
        sb = self.sandboxes[sid]
        return {"templateID": sb["templateID"], "sandboxID": sid,
                "clientID": "local", "envdVersion": "0.6.13", "envdAccessToken": TOKEN,
                "domain": None, "bootMode": sb.get("bootMode")}

    def _detail(self, sid: str) -> dict[str, Any]:
        sb = self.sandboxes[sid]
        detail = self._sandbox(sid) | {
            "startedAt": "2026-01-02T03:04:05.123456789Z", "endAt": "2026-01-02T03:09:05Z",
            "cpuCount": 2, "memoryMB": 512, "diskSizeMB": 1024, "pidsMax": 512, "openFiles": 65536,
            "state": "paused" if sb.get("paused") else "running",
            "metadata": sb["metadata"],
            "lifecycle": {"autoResume": False, "onTimeout": "kill"},
        }
        detail |= sb.get("limits") or {}
        if sb.get("parent"):
            detail["parentSandboxID"] = sb["parent"]
        if sb.get("base"):
            detail["snapshotID"] = sb["base"]
        return detail

    # --- envd ---

    def envd(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(204)
        if path == "/files":
            return self.files_endpoint(request)
        if path == "/process.Process/Start":
            return self.start(request)
        if path == "/process.Process/SendSignal":
            pid = json.loads(request.content)["process"]["pid"]
            if pid not in self.pids:
                return _json(404, {"code": "not_found", "message": f"process {pid} not found"})
            self.pids.discard(pid)
            return _json(200, {})
        body = json.loads(request.content)
        p = body.get("path", "")
        if path == "/filesystem.Filesystem/Stat":
            if p not in self.files:
                return _json(404, {"code": "not_found", "message": "path not found"})
            return _json(200, {"entry": {"name": p.rsplit("/", 1)[-1], "path": p, "type": "FILE_TYPE_FILE"}})
        if path == "/filesystem.Filesystem/ListDir":
            prefix = p.rstrip("/") + "/"
            entries = [
                {"name": f[len(prefix):], "path": f, "type": "FILE_TYPE_FILE",
                 "size": str(len(c)), "modifiedTime": "2026-01-02T03:04:05Z"}
                for f, c in sorted(self.files.items()) if f.startswith(prefix)
            ]
            entries.append({"name": "weird", "path": prefix + "weird"})  # unspecified type: dropped
            return _json(200, {"entries": entries})
        if path == "/filesystem.Filesystem/Remove":
            if self.files.pop(p, None) is None:
                return _json(404, {"code": "not_found", "message": "path not found"})
            return _json(200, {})
        if path == "/filesystem.Filesystem/MakeDir":
            if p in self.files:
                return _json(409, {"code": "already_exists", "message": "exists"})
            self.files[p] = b""
            return _json(200, {"entry": {"name": p, "path": p, "type": "FILE_TYPE_DIRECTORY"}})
        return _json(404, {"code": "unimplemented", "message": path})

    def files_endpoint(self, request: httpx.Request) -> httpx.Response:
        path = request.url.params["path"]
        if request.method == "GET":
            if path not in self.files:
                return _json(404, {"code": 404, "message": f"file {path} not found"})
            return httpx.Response(200, content=self.files[path])
        content_type = request.headers["content-type"]
        assert content_type.startswith("multipart/form-data")
        # Minimal multipart parse: one part, named "file".
        boundary = content_type.split("boundary=")[1].encode()
        part = request.content.split(b"--" + boundary)[1]
        head, _, data = part.partition(b"\r\n\r\n")
        assert b'name="file"' in head, head
        self.files[path] = data[: -len(b"\r\n")]
        return _json(200, [{"name": path.rsplit("/", 1)[-1], "type": "file", "path": path}])

    def start(self, request: httpx.Request) -> httpx.Response:
        assert request.headers["content-type"] == "application/connect+json"
        flags, length = struct.unpack(">BI", request.content[:5])
        message = json.loads(request.content[5 : 5 + length])
        cmd = message["process"]["args"][-1]
        script = self.commands.get(cmd, Command())
        pid = 1000 + len(self.pids) + 1
        self.pids.add(pid)
        body = envelope({"event": {"start": {"pid": pid}}})
        if script.stdout:
            body += envelope({"event": {"data": {"stdout": b64(script.stdout)}}})
        if script.stderr:
            body += envelope({"event": {"data": {"stderr": b64(script.stderr)}}})
        body += envelope({"event": {"keepalive": {}}})
        if script.end:
            end: dict[str, Any] = {"exited": True, "status": f"exit status {script.exit_code}"}
            if script.exit_code:
                end["exitCode"] = script.exit_code
            body += envelope({"event": {"end": end}})
        body += envelope({"error": script.error} if script.error else {}, flags=2)
        return self._stream(body, "application/connect+json")

    # --- code interpreter ---

    def interpreter(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/execute":
            body = json.loads(request.content)
            assert set(body) == {"code", "context_id", "language", "env_vars"}
            events = self.executions.get(body["code"], [])
            lines = b"".join(json.dumps(e).encode() + b"\n" for e in events)
            return self._stream(lines, "application/x-ndjson")
        if request.url.path == "/contexts" and request.method == "POST":
            return _json(200, {"id": "ctx1", "language": "python", "cwd": "/home/user"})
        if request.url.path == "/contexts" and request.method == "GET":
            return _json(200, [{"id": "ctx1", "language": "python", "cwd": "/home/user"}])
        if request.url.path.startswith("/contexts/"):
            return httpx.Response(204)
        return _json(404, {"code": 404, "message": "no route"})

    def _stream(self, body: bytes, content_type: str) -> httpx.Response:
        size = self.chunk_size or len(body) or 1
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        return httpx.Response(200, headers={"content-type": content_type},
                              stream=ChunkedStream(chunks))


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> httpx.Response:
    h = {"X-Request-Id": f"req-{status}"} | (headers or {})
    return httpx.Response(status, json=body, headers=h)
