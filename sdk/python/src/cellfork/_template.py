"""Custom templates, the part both twins share: the builder (E2B's
Template SDK names: ``from_image``, ``copy``, ``run_cmd``, ``set_start_cmd``
...), ready checks, packing a ``copy``'s files, and the request builders
and parsers of the daemon's template API (E2B's build API). No network I/O:
:mod:`cellfork.template` and :mod:`cellfork.async_template` send.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
import os
import shlex
import tarfile
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Mapping, Sequence

import httpx

from ._core import RequestSpec, _seg
from ._exceptions import CellforkError, ProtocolError

__all__ = [
    "TemplateBase",
    "ReadyCmd",
    "wait_for_port",
    "wait_for_url",
    "wait_for_process",
    "wait_for_file",
    "wait_for_timeout",
    "BuildInfo",
    "BuildStatus",
    "LogEntry",
    "TemplateInfo",
    "TemplateBuildError",
]

BASE_IMAGE = "e2bdev/base"  # E2B's base image: the daemon's built-in template


class TemplateBuildError(CellforkError):
    """A template build failed. ``step`` is the step that failed
    (``"base"``, ``"1"``... ``"N"`` in the order of the builder's calls,
    ``"finalize"`` for the start and ready commands); ``logs`` are its last
    log lines."""

    def __init__(self, message: str, *, step: str | None = None, logs: Sequence["LogEntry"] = ()) -> None:
        super().__init__(message)
        self.step = step
        self.logs = list(logs)


# --- ready checks (E2B's names and commands) --------------------------------


class ReadyCmd:
    """A shell command retried until it succeeds (the template is then
    ready and snapshotted with its start command running)."""

    def __init__(self, cmd: str) -> None:
        self._cmd = cmd

    def get_cmd(self) -> str:
        return self._cmd


def wait_for_port(port: int) -> ReadyCmd:
    """Ready once something listens on ``port`` (needs ``ss``: iproute2)."""
    return ReadyCmd(f'[ -n "$(ss -Htuln sport = :{int(port)})" ]')


def wait_for_url(url: str, status_code: int = 200) -> ReadyCmd:
    """Ready once ``url`` answers ``status_code`` (needs curl)."""
    return ReadyCmd(f'curl -s -o /dev/null -w "%{{http_code}}" {shlex.quote(url)} | grep -q "{int(status_code)}"')


def wait_for_process(process_name: str) -> ReadyCmd:
    """Ready once a process of that name runs (needs pgrep)."""
    return ReadyCmd(f"pgrep {shlex.quote(process_name)} > /dev/null")


def wait_for_file(filename: str) -> ReadyCmd:
    """Ready once the file exists."""
    return ReadyCmd(f"[ -f {shlex.quote(filename)} ]")


def wait_for_timeout(timeout: int) -> ReadyCmd:
    """Ready after ``timeout`` milliseconds (at least one second)."""
    return ReadyCmd(f"sleep {max(1, int(timeout) // 1000)}")


# --- models -------------------------------------------------------------------


@dataclass
class LogEntry:
    timestamp: datetime | None
    level: str
    message: str
    step: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "LogEntry":
        ts = data.get("timestamp")
        try:
            when = datetime.fromisoformat(str(ts).replace("Z", "+00:00")) if ts else None
        except ValueError:
            when = None
        return cls(when, str(data.get("level", "info")), str(data.get("message", "")), data.get("step"))

    def __str__(self) -> str:
        return self.message


@dataclass
class BuildInfo:
    """A build the daemon accepted."""

    template_id: str
    build_id: str
    name: str
    tags: list[str] = field(default_factory=list)


@dataclass
class BuildStatus:
    template_id: str
    build_id: str
    status: str  # waiting, building, ready, error
    log_entries: list[LogEntry]
    reason: str | None = None
    step: str | None = None

    @classmethod
    def from_json(cls, data: Any) -> "BuildStatus":
        if not isinstance(data, dict) or "status" not in data:
            raise ProtocolError(f"template build status: unexpected answer {data!r}")
        reason = data.get("reason") or {}
        return cls(
            template_id=str(data.get("templateID", "")),
            build_id=str(data.get("buildID", "")),
            status=str(data["status"]),
            log_entries=[LogEntry.from_json(e) for e in data.get("logEntries") or []],
            reason=reason.get("message"),
            step=reason.get("step"),
        )


@dataclass
class TemplateInfo:
    template_id: str
    names: list[str]
    build_id: str
    build_status: str
    cpu_count: int
    memory_mb: int
    disk_size_mb: int
    public: bool
    spawn_count: int

    @classmethod
    def from_json(cls, data: Any) -> "TemplateInfo":
        if not isinstance(data, dict):
            raise ProtocolError(f"template: unexpected answer {data!r}")
        return cls(
            template_id=str(data.get("templateID", "")),
            names=list(data.get("names") or data.get("aliases") or []),
            build_id=str(data.get("buildID", "")),
            build_status=str(data.get("buildStatus", "")),
            cpu_count=int(data.get("cpuCount") or 0),
            memory_mb=int(data.get("memoryMB") or 0),
            disk_size_mb=int(data.get("diskSizeMB") or 0),
            public=bool(data.get("public")),
            spawn_count=int(data.get("spawnCount") or 0),
        )


# --- the builder --------------------------------------------------------------


class TemplateBase:
    """A template definition, built with chained calls::

        t = (Template().from_python_image("3.12")
             .pip_install(["flask"])
             .copy("app.py", "/app/")
             .set_start_cmd("python /app/app.py", wait_for_port(8000)))

    ``file_context_path`` is where ``copy`` sources are taken from (default:
    the current directory). Every method returns the template.
    """

    def __init__(self, file_context_path: str | os.PathLike[str] | None = None,
                 file_ignore_patterns: Sequence[str] | None = None) -> None:
        self._context = os.fspath(file_context_path) if file_context_path is not None else "."
        self._ignore = list(file_ignore_patterns or [])
        self._from: dict[str, Any] = {"fromImage": BASE_IMAGE}
        self._steps: list[dict[str, Any]] = []
        self._copies: dict[int, str] = {}  # step index -> source pattern
        self._dockerfile: str | None = None
        self._start_cmd: str | None = None
        self._ready_cmd: str | None = None
        self._force = False
        self._force_next = False

    # bases
    def from_image(self, image: str, username: str | None = None, password: str | None = None):
        """Start from a container image (Docker Hub, or REGISTRY/REPO:TAG),
        with registry credentials if given."""
        if (username is None) != (password is None):
            raise ValueError("give both username and password, or neither")
        self._from = {"fromImage": image}
        if username is not None:
            self._from["fromImageRegistry"] = {"type": "registry", "username": username, "password": password}
        self._dockerfile = None
        return self

    def from_base_image(self):
        """Start from the daemon's built-in base template (E2B's base image)."""
        return self.from_image(BASE_IMAGE)

    def from_template(self, template: str):
        """Start from another template (its name, ``name:tag``, or ``base``)."""
        self._from = {"fromTemplate": template}
        self._dockerfile = None
        return self

    def from_debian_image(self, variant: str = "stable"):
        return self.from_image(f"debian:{variant}")

    def from_ubuntu_image(self, variant: str = "latest"):
        return self.from_image(f"ubuntu:{variant}")

    def from_python_image(self, version: str = "3"):
        return self.from_image(f"python:{version}")

    def from_node_image(self, variant: str = "lts"):
        return self.from_image(f"node:{variant}")

    def from_dockerfile(self, dockerfile_content_or_path: str):
        """Start from a Dockerfile (its text, or a path to it). The daemon
        parses it; its COPY sources come from ``file_context_path``."""
        text = dockerfile_content_or_path
        candidate = os.path.join(self._context, text) if not os.path.isabs(text) else text
        if "\n" not in text and os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as f:
                text = f.read()
        self._from = {}
        self._dockerfile = text
        return self

    # steps
    def _step(self, type_: str, args: list[str], **extra: Any):
        self._steps.append({"type": type_, "args": args, "force": self._force_next, **extra})
        return self

    def skip_cache(self):
        """Run this and every later step even if the cache has them."""
        self._force_next = True
        return self

    def run_cmd(self, command: str | Sequence[str], user: str | None = None):
        """Run a shell command (a list is joined with ``&&``), as ``user``."""
        cmd = command if isinstance(command, str) else " && ".join(command)
        return self._step("RUN", [cmd] + ([user] if user else []))

    def copy(self, src: str | Sequence[str], dest: str, user: str | None = None, mode: int | None = None,
             force_upload: bool | None = None):
        """Copy files from the context (glob patterns allowed) to ``dest``;
        a directory is merged into ``dest``, a path ending in ``/`` is a
        directory."""
        for s in [src] if isinstance(src, str) else list(src):
            s = os.fspath(s)
            if os.path.isabs(s) or ".." in s.replace("\\", "/").split("/"):
                raise ValueError(f"copy source {s!r} must be a relative path inside the context")
            self._copies[len(self._steps)] = s
            self._step("COPY", [s, os.fspath(dest), user or "", format(mode, "04o") if mode is not None else ""],
                       forceUpload=bool(force_upload))
        return self

    def remove(self, path: str | Sequence[str], force: bool = False, recursive: bool = False, user: str | None = None):
        paths = [path] if isinstance(path, str) else list(path)
        flags = (" -r" if recursive else "") + (" -f" if force else "")
        return self.run_cmd(f"rm{flags} " + " ".join(shlex.quote(p) for p in paths), user=user)

    def rename(self, src: str, dest: str, force: bool = False, user: str | None = None):
        return self.run_cmd(f"mv {shlex.quote(src)} {shlex.quote(dest)}" + (" -f" if force else ""), user=user)

    def make_dir(self, path: str | Sequence[str], mode: int | None = None, user: str | None = None):
        paths = [path] if isinstance(path, str) else list(path)
        m = f" -m {mode:04o}" if mode is not None else ""
        return self.run_cmd("mkdir -p" + m + " " + " ".join(shlex.quote(p) for p in paths), user=user)

    def make_symlink(self, src: str, dest: str, user: str | None = None, force: bool = False):
        return self.run_cmd(f"ln -s{'f' if force else ''} {shlex.quote(src)} {shlex.quote(dest)}", user=user)

    def set_workdir(self, workdir: str):
        return self._step("WORKDIR", [os.fspath(workdir)])

    def set_user(self, user: str):
        return self._step("USER", [user])

    def set_envs(self, envs: Mapping[str, str]):
        if not envs:
            return self
        return self._step("ENV", [x for k, v in envs.items() for x in (k, str(v))])

    def pip_install(self, packages: str | Sequence[str] | None = None, g: bool = True):
        pkgs = [packages] if isinstance(packages, str) else list(packages or [])
        return self.run_cmd("pip install " + ("" if g else "--user ") + (" ".join(pkgs) if pkgs else "."),
                            user="root" if g else None)

    def npm_install(self, packages: str | Sequence[str] | None = None, g: bool = False, dev: bool = False):
        pkgs = [packages] if isinstance(packages, str) else list(packages or [])
        return self.run_cmd(" ".join(["npm install"] + (["-g"] if g else []) + (["--save-dev"] if dev else []) + pkgs),
                            user="root" if g else None)

    def apt_install(self, packages: str | Sequence[str], no_install_recommends: bool = False):
        pkgs = [packages] if isinstance(packages, str) else list(packages)
        opt = "--no-install-recommends " if no_install_recommends else ""
        return self.run_cmd(["apt-get update",
                             f"DEBIAN_FRONTEND=noninteractive DEBCONF_NOWARNINGS=yes apt-get install -y {opt}{' '.join(pkgs)}"],
                            user="root")

    def git_clone(self, url: str, path: str | None = None, branch: str | None = None, depth: int | None = None,
                  user: str | None = None):
        args = ["git clone", shlex.quote(url)]
        if branch:
            args += [f"--branch {shlex.quote(branch)}", "--single-branch"]
        if depth:
            args.append(f"--depth {int(depth)}")
        if path:
            args.append(shlex.quote(path))
        return self.run_cmd(" ".join(args), user=user)

    def set_start_cmd(self, start_cmd: str, ready_cmd: str | ReadyCmd):
        """Leave ``start_cmd`` running in every sandbox of the template; the
        build waits until ``ready_cmd`` succeeds, then snapshots it."""
        self._start_cmd = start_cmd
        return self.set_ready_cmd(ready_cmd)

    def set_ready_cmd(self, ready_cmd: str | ReadyCmd):
        self._ready_cmd = ready_cmd.get_cmd() if isinstance(ready_cmd, ReadyCmd) else ready_cmd
        return self

    # serialization
    def to_dict(self) -> dict[str, Any]:
        """The build request (E2B's TemplateBuildStartV2), files hashes
        computed."""
        body: dict[str, Any] = dict(self._from)
        steps = []
        for i, st in enumerate(self._steps):
            st = {k: v for k, v in st.items() if k != "forceUpload"}
            if i in self._copies:
                st["filesHash"] = pack_files(self._context, self._copies[i], self._ignore)[1]
            steps.append(st)
        body["steps"] = steps
        body["force"] = self._force
        if self._dockerfile is not None:
            body["dockerfile"] = self._dockerfile
        if self._start_cmd is not None:
            body["startCmd"] = self._start_cmd
        if self._ready_cmd is not None:
            body["readyCmd"] = self._ready_cmd
        return body

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    # what a build uploads: (hash, tar bytes, force, is the Dockerfile's
    # context) per COPY, and the Dockerfile's build context
    def _uploads(self) -> list[tuple[str, bytes, bool, bool]]:
        out = []
        for i, pattern in self._copies.items():
            data, digest = pack_files(self._context, pattern, self._ignore)
            out.append((digest, data, bool(self._steps[i].get("forceUpload")), False))
        if self._dockerfile is not None and _dockerfile_copies(self._dockerfile):
            data, digest = pack_files(self._context, ".", self._ignore)
            out.append((digest, data, False, True))
        return out


def _dockerfile_copies(text: str) -> bool:
    return any(line.split()[0].upper() in ("COPY", "ADD") for line in text.splitlines() if line.split())


def pack_files(context: str, pattern: str, ignore: Sequence[str] = ()) -> tuple[bytes, str]:
    """A gzipped tar of the context files ``pattern`` matches (directories
    with what they hold), under their paths in the context; entries sorted
    and times zeroed, so the same files give the same hash. Returns the
    bytes and their SHA-256."""
    root = os.path.abspath(context)
    matches = sorted(glob.glob(os.path.join(root, pattern), recursive=True)) if pattern != "." else [root]
    if not matches:
        raise ValueError(f"no files match {pattern!r} in {root}")
    names: list[str] = []
    for m in matches:
        names.append(m)
        if os.path.isdir(m) and not os.path.islink(m):
            for dirpath, dirnames, filenames in os.walk(m):
                dirnames.sort()
                names += [os.path.join(dirpath, n) for n in sorted(dirnames + filenames)]
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        seen = set()
        for path in names:
            rel = os.path.relpath(path, root)
            if rel == "." or rel in seen or _ignored(rel, ignore):
                continue
            seen.add(rel)
            info = tar.gettarinfo(path, arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            if info.isreg():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
            elif info.isdir() or info.issym():
                tar.addfile(info)
    data = buf.getvalue()
    return data, hashlib.sha256(data).hexdigest()


def _ignored(rel: str, patterns: Sequence[str]) -> bool:
    import fnmatch

    parts = rel.replace(os.sep, "/")
    return any(fnmatch.fnmatch(parts, p) or parts.startswith(p.rstrip("/") + "/") for p in patterns)


# --- requests -------------------------------------------------------------------


class TemplateCore:
    """Request builders and parsers of the template API."""

    def __init__(self, api: Any) -> None:
        self.api = api  # an ApiCore: headers and timeouts

    def create_request(self, name: str, tags: Sequence[str] | None, cpu_count: int | None,
                       memory_mb: int | None, request_timeout: float | None) -> RequestSpec:
        body: dict[str, Any] = {"name": name}
        if tags:
            body["tags"] = list(tags)
        if cpu_count is not None:
            body["cpuCount"] = int(cpu_count)
        if memory_mb is not None:
            body["memoryMB"] = int(memory_mb)
        return RequestSpec("POST", "/v3/templates", self.api.control_headers(), json=body,
                           timeout=self.api.timeout(request_timeout))

    def file_link_request(self, template_id: str, digest: str, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("GET", f"/templates/{_seg(template_id)}/files/{digest}", self.api.control_headers(),
                           timeout=self.api.timeout(request_timeout), idempotent=True)

    def upload_request(self, url: str, data: bytes, request_timeout: float | None) -> RequestSpec:
        u = httpx.URL(url)
        path = u.raw_path.decode()
        return RequestSpec("PUT", path, {"Content-Type": "application/octet-stream"}, content=data,
                           timeout=self.api.timeout(request_timeout))

    def start_request(self, template_id: str, build_id: str, body: dict[str, Any],
                      request_timeout: float | None) -> RequestSpec:
        return RequestSpec("POST", f"/v2/templates/{_seg(template_id)}/builds/{_seg(build_id)}",
                           self.api.control_headers(), json=body, timeout=self.api.timeout(request_timeout))

    def status_request(self, template_id: str, build_id: str, offset: int, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("GET", f"/templates/{_seg(template_id)}/builds/{_seg(build_id)}/status",
                           self.api.control_headers(), params={"logsOffset": str(int(offset))},
                           timeout=self.api.timeout(request_timeout), idempotent=True)

    def exists_request(self, name: str, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("GET", f"/templates/aliases/{_seg(name)}", self.api.control_headers(),
                           timeout=self.api.timeout(request_timeout), idempotent=True, accept=frozenset({404}))

    def list_request(self, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("GET", "/v2/templates", self.api.control_headers(),
                           timeout=self.api.timeout(request_timeout), idempotent=True)

    def delete_request(self, template: str, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("DELETE", f"/templates/{_seg(template)}", self.api.control_headers(),
                           timeout=self.api.timeout(request_timeout), accept=frozenset({404}))

    def assign_tags_request(self, target: str, tags: Sequence[str], request_timeout: float | None) -> RequestSpec:
        return RequestSpec("POST", "/templates/tags", self.api.control_headers(),
                           json={"target": target, "tags": list(tags)}, timeout=self.api.timeout(request_timeout))

    def remove_tags_request(self, name: str, tags: Sequence[str], request_timeout: float | None) -> RequestSpec:
        return RequestSpec("DELETE", "/templates/tags", self.api.control_headers(),
                           json={"name": name, "tags": list(tags)}, timeout=self.api.timeout(request_timeout))

    def tags_request(self, template: str, request_timeout: float | None) -> RequestSpec:
        return RequestSpec("GET", f"/templates/{_seg(template)}/tags", self.api.control_headers(),
                           timeout=self.api.timeout(request_timeout), idempotent=True)


def parse_created(response: httpx.Response, name: str) -> BuildInfo:
    data = response.json()
    if not isinstance(data, dict) or not data.get("templateID") or not data.get("buildID"):
        raise ProtocolError(f"template create: unexpected answer {data!r}")
    return BuildInfo(str(data["templateID"]), str(data["buildID"]), name, list(data.get("tags") or []))


def parse_link(response: httpx.Response) -> tuple[bool, str | None]:
    data = response.json()
    if not isinstance(data, dict) or "present" not in data:
        raise ProtocolError(f"template file link: unexpected answer {data!r}")
    return bool(data["present"]), data.get("url")


def parse_exists(response: httpx.Response) -> bool:
    return response.status_code == 200


def parse_templates(response: httpx.Response) -> list[TemplateInfo]:
    data = response.json()
    if not isinstance(data, list):
        raise ProtocolError(f"template list: unexpected answer {data!r}")
    return [TemplateInfo.from_json(t) for t in data]


def parse_deleted(response: httpx.Response) -> bool:
    return response.status_code == 204


def parse_tags(response: httpx.Response) -> list[str]:
    data = response.json()
    if isinstance(data, dict):  # assign: {"tags": [...], "buildID": ...}
        return list(data.get("tags") or [])
    if not isinstance(data, list):
        raise ProtocolError(f"template tags: unexpected answer {data!r}")
    return [str(t.get("tag")) for t in data if isinstance(t, dict)]


def build_error(status: BuildStatus) -> TemplateBuildError:
    message = status.reason or "the template build failed"
    return TemplateBuildError(message, step=status.step, logs=status.log_entries[-20:])


BUILD_POLL_INTERVAL = 0.2  # seconds between build status polls
