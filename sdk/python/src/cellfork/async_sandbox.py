"""Asynchronous client: :class:`AsyncSandbox`, a thin shell over
:mod:`cellfork._core`. Callbacks may be plain functions or coroutine
functions.

Its sync twin, :mod:`cellfork.sandbox`, is generated from this file by
``sdk/python/scripts/unasync.py`` (which drops ``async``/``await`` and
renames by a table): edit this file, then run the script."""

from __future__ import annotations

import time
from typing import Any, Callable, Literal, Mapping, Sequence, overload

from ._config import (
    DEFAULT_COMMAND_TIMEOUT,
    DEFAULT_RUN_CODE_TIMEOUT,
    DEFAULT_SANDBOX_TIMEOUT,
    Transport,
    normalize_timeout,
    resolve_config,
)
from ._core import (
    ApiCore,
    Limits,
    Network,
    RequestSpec,
    SandboxCore,
    check_stream_content_type,
    parse_contexts,
    parse_created,
    parse_dir_created,
    parse_entries,
    parse_fork,
    parse_found,
    parse_healthy,
    parse_network,
    parse_info,
    parse_list,
    parse_paused,
    parse_read,
    parse_rpc,
    parse_snapshot,
    parse_snapshot_tree,
    parse_snapshots,
    parse_write,
    request_id,
)
from ._envelope import EnvelopeDecoder, raise_for_end_stream
from ._exceptions import CellforkError, CommandExitError, ProtocolError, TimeoutError
from ._models import (
    CommandResult,
    Context,
    EntryInfo,
    Execution,
    ExecutionError,
    NetworkStatus,
    Result,
    SandboxInfo,
    SnapshotInfo,
    SnapshotNode,
    SnapshotRef,
    WriteInfo,
)
from ._ndjson import NDJSONDecoder
from ._streams import ExecutionAccumulator, ProcessAccumulator
from ._transport import AsyncHTTP, AsyncReader, afire, translating

__all__ = ["AsyncSandbox", "AsyncCommands", "AsyncFiles", "AsyncCommandHandle"]


class AsyncSandbox:
    """A running sandbox. Obtain one with :meth:`create` or :meth:`connect`.

    Used as an async context manager, the sandbox is killed on exit.
    Use it from one event loop.
    """

    def __init__(self, core: SandboxCore, http: AsyncHTTP) -> None:
        self._core = core
        self._http = http
        self.commands = AsyncCommands(self)
        self.files = AsyncFiles(self)

    @property
    def sandbox_id(self) -> str:
        return self._core.sandbox_id

    @property
    def boot_mode(self) -> str | None:
        """How the daemon started this sandbox: ``"pool"`` (a ready one
        was handed out), ``"standby"`` (a snapshot's frozen standby was
        resumed), ``"restore"`` (from a snapshot or warm image), ``"boot"``
        or ``"fork"``; None if it did not say."""
        return self._core.created.boot_mode

    def __repr__(self) -> str:
        return f"AsyncSandbox(sandbox_id={self.sandbox_id!r})"

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        try:
            await self.kill()
        finally:
            await self.close()

    # --- lifecycle ---------------------------------------------------------

    @classmethod
    async def create(
        cls,
        template: str = "base",
        timeout: int | None = DEFAULT_SANDBOX_TIMEOUT,
        envs: Mapping[str, str] | None = None,
        metadata: Mapping[str, str] | None = None,
        snapshot: SnapshotRef | None = None,
        *,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        disk_size_mb: int | None = None,
        pids_max: int | None = None,
        open_files: int | None = None,
        allow_internet_access: bool | None = None,
        allow_out: Sequence[str] | None = None,
        deny_out: Sequence[str] | None = None,
        allow_public_traffic: bool | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> "AsyncSandbox":
        """Start a sandbox from ``template`` (or from ``snapshot``: an id,
        a name or a :class:`SnapshotInfo`, restoring its exact state: memory,
        processes, files) that lives ``timeout`` seconds unless extended
        with :meth:`set_timeout`.

        Limits (cellfork extensions; None = the template's default, or the
        snapshot's): ``cpu_count`` CPUs, ``memory_mb`` memory,
        ``disk_size_mb`` writable disk (``/tmp`` included; writes past it
        fail with ENOSPC), ``pids_max`` processes per user, ``open_files``
        open files per process. A value past the daemon's bounds raises
        :class:`InvalidArgumentError`; a sandbox from a snapshot keeps its
        disk size and at most its process and open-file limits.
        :meth:`get_info` reports the values in force.

        Egress (E2B's ``allow_internet_access`` and ``network``):
        ``allow_out`` IPv4 addresses, CIDRs and domain names
        (``"example.com"``, ``"*.example.com"``; held on HTTP Host and TLS
        SNI), ``deny_out`` addresses and CIDRs (``"0.0.0.0/0"``: all but
        ``allow_out``); an allow wins over a deny. ``allow_public_traffic=
        False`` puts the sandbox's ports behind its traffic token."""
        config = resolve_config(base_url=base_url, api_key=api_key, request_timeout=request_timeout,
                                max_retries=max_retries, transport=transport)
        api = ApiCore(config)
        limits = Limits(cpu_count=cpu_count, memory_mb=memory_mb, disk_size_mb=disk_size_mb,
                        pids_max=pids_max, open_files=open_files)
        network = Network(allow_internet_access=allow_internet_access, allow_out=allow_out,
                          deny_out=deny_out, allow_public_traffic=allow_public_traffic)
        spec = api.create_request(template, timeout, envs, metadata, snapshot, request_timeout, limits, network)
        return await cls._open(api, spec)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        *,
        timeout: int | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> "AsyncSandbox":
        """Attach to an existing sandbox (resuming it if it is paused).
        Raises :class:`SandboxNotFoundError` if there is none."""
        config = resolve_config(base_url=base_url, api_key=api_key, request_timeout=request_timeout,
                                max_retries=max_retries, transport=transport)
        api = ApiCore(config)
        return await cls._open(api, api.connect_request(sandbox_id, timeout, request_timeout))

    @classmethod
    async def _open(cls, api: ApiCore, spec: RequestSpec) -> "AsyncSandbox":
        http = AsyncHTTP(api.config, api.retry_policy())
        try:
            created = parse_created(await http.request(spec))
        except BaseException:
            await http.close()
            raise
        return cls(SandboxCore(api.config, created), http)

    @classmethod
    async def list(
        cls,
        *,
        metadata: Mapping[str, str] | None = None,
        state: list[str] | None = None,
        limit: int | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[SandboxInfo]:
        """All sandboxes visible to the API key (following pagination),
        optionally filtered by metadata and state (``"running"``, ``"paused"``)."""
        config = resolve_config(base_url=base_url, api_key=api_key, request_timeout=request_timeout,
                                max_retries=max_retries, transport=transport)
        api = ApiCore(config)
        http = AsyncHTTP(config, api.retry_policy())
        out: list[SandboxInfo] = []
        token: str | None = None
        try:
            while True:
                spec = api.list_request(metadata, state, limit, token, request_timeout)
                page, token = parse_list(await http.request(spec))
                out += page
                if not token or (limit is not None and len(out) >= limit):
                    return out if limit is None else out[:limit]
        finally:
            await http.close()

    @classmethod
    def _api(
        cls,
        base_url: str | None,
        api_key: str | None,
        request_timeout: float | None,
        max_retries: int | None,
        transport: Transport | None,
    ) -> tuple[ApiCore, AsyncHTTP]:
        config = resolve_config(base_url=base_url, api_key=api_key, request_timeout=request_timeout,
                                max_retries=max_retries, transport=transport)
        api = ApiCore(config)
        return api, AsyncHTTP(config, api.retry_policy())

    @classmethod
    async def list_snapshots(
        cls,
        sandbox_id: str | None = None,
        name: str | None = None,
        *,
        limit: int | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[SnapshotInfo]:
        """All snapshots (following pagination), oldest first, optionally
        only those taken of ``sandbox_id`` or carrying ``name``; at most
        ``limit``."""
        api, http = cls._api(base_url, api_key, request_timeout, max_retries, transport)
        out: list[SnapshotInfo] = []
        token: str | None = None
        seen: set[str] = set()
        try:
            while True:
                spec = api.list_snapshots_request(sandbox_id, name, limit, token, request_timeout)
                page, token = parse_snapshots(await http.request(spec))
                out += page
                if not token or (limit is not None and len(out) >= limit):
                    return out if limit is None else out[:limit]
                if token in seen:
                    raise ProtocolError(f"snapshot list: the daemon repeated page token {token!r}")
                seen.add(token)
        finally:
            await http.close()

    @classmethod
    async def get_snapshot(
        cls,
        snapshot: SnapshotRef,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> SnapshotInfo:
        """One snapshot, by id or name. Raises :class:`NotFoundError` if
        there is none."""
        api, http = cls._api(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_snapshot(await http.request(api.get_snapshot_request(snapshot, request_timeout)))
        finally:
            await http.close()

    @classmethod
    async def delete_snapshot(
        cls,
        snapshot: SnapshotRef,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> bool:
        """Delete a snapshot (by id or name). Returns False if there was
        none. Its children in the tree move up to its parent; sandboxes
        started from it keep running."""
        api, http = cls._api(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_found(await http.request(api.delete_snapshot_request(snapshot, request_timeout)))
        finally:
            await http.close()

    @classmethod
    async def snapshot_tree(
        cls,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[SnapshotNode]:
        """Every snapshot, arranged in trees by parent (the daemon's
        ``GET /snapshots/tree``): the roots, each with its ``children``
        (oldest first). A root whose parent is gone keeps its ``parent_id``."""
        api, http = cls._api(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_snapshot_tree(await http.request(api.snapshot_tree_request(request_timeout)))
        finally:
            await http.close()

    async def kill(self, *, request_timeout: float | None = None) -> bool:
        """Kill the sandbox. Returns False if it was already gone."""
        return parse_found(await self._http.request(self._core.kill_request(request_timeout)))

    async def set_timeout(self, seconds: int, *, request_timeout: float | None = None) -> None:
        """Make the sandbox live ``seconds`` from now."""
        await self._http.request(self._core.set_timeout_request(seconds, request_timeout))

    async def update_network(
        self,
        *,
        allow_internet_access: bool = True,
        allow_out: Sequence[str] | None = None,
        deny_out: Sequence[str] | None = None,
        request_timeout: float | None = None,
    ) -> None:
        """Replace the sandbox's egress policy at once (what is not given is
        cleared, as E2B's ``update_network`` does); it applies to a running
        or paused sandbox and follows it through snapshot, fork and pause."""
        net = Network(allow_internet_access=allow_internet_access, allow_out=allow_out or [], deny_out=deny_out or [])
        await self._http.request(self._core.update_network_request(net, request_timeout))

    async def network(self, *, request_timeout: float | None = None) -> NetworkStatus:
        """The egress policy and how many connection attempts it refused."""
        return parse_network(await self._http.request(self._core.network_request(request_timeout)))

    async def get_info(self, *, request_timeout: float | None = None) -> SandboxInfo:
        return parse_info(await self._http.request(self._core.info_request(request_timeout)))

    async def is_running(self, *, request_timeout: float | None = None) -> bool:
        """True if the sandbox answers its health check."""
        return parse_healthy(await self._http.request(self._core.health_request(request_timeout)))

    # --- lineage -----------------------------------------------------------

    async def snapshot(self, name: str | None = None, *, request_timeout: float | None = None) -> SnapshotInfo:
        """Save the sandbox's whole state (memory, processes, files) as a
        new snapshot; the sandbox keeps running. ``name`` must be unique."""
        return parse_snapshot(await self._http.request(self._core.snapshot_request(name, request_timeout)))

    async def fork(
        self, n: int = 1, timeout: int | None = None, *, request_timeout: float | None = None
    ) -> "list[AsyncSandbox | CellforkError]":
        """Make ``n`` independent copies of the sandbox as it is now (the
        sandbox keeps running), each living ``timeout`` seconds (default:
        the daemon's). One entry per child: a sandbox, or the exception that
        child failed with (returned, not raised); the others still start."""
        spec = self._core.fork_request(n, timeout, request_timeout)
        results = parse_fork(await self._http.request(spec))
        config = self._core.config
        out: "list[AsyncSandbox | CellforkError]" = []
        for res in results:
            if isinstance(res, CellforkError):
                out.append(res)
            else:
                http = AsyncHTTP(config, self._core.retry_policy())
                out.append(type(self)(SandboxCore(config, res), http))
        return out

    async def rollback(self, snapshot: SnapshotRef, *, request_timeout: float | None = None) -> None:
        """Put the sandbox back to ``snapshot`` (id, name or
        :class:`SnapshotInfo`) in place: same id and address, the
        snapshot's memory, processes and files. The snapshot must be in this
        sandbox's tree. A failed rollback leaves the sandbox as it was."""
        created = parse_created(await self._http.request(self._core.rollback_request(snapshot, request_timeout)))
        self._core.adopt(created)

    async def pause(self, spill: bool = False, *, request_timeout: float | None = None) -> bool:
        """Freeze the sandbox: its processes stop and its timeout no longer
        runs; :meth:`connect` resumes it exactly. After a while the daemon
        moves a paused sandbox to disk; ``spill=True`` does so now, freeing
        its memory (also for a sandbox paused earlier). Returns False if it
        was already paused and there was nothing to do (always True with
        ``spill=True``)."""
        return parse_paused(await self._http.request(self._core.pause_request(spill, request_timeout)))

    async def merge(self, child: "AsyncSandbox | str", *, request_timeout: float | None = None) -> None:
        """Make a fork child's state this sandbox's, keeping this sandbox's
        id and address. The child's id goes away (its ``kill()`` then
        returns False); other children are untouched."""
        child_id = getattr(child, "sandbox_id", child)
        created = parse_created(await self._http.request(self._core.merge_request(child_id, request_timeout)))
        self._core.adopt(created)

    async def close(self) -> None:
        """Release the HTTP connections (the sandbox keeps running)."""
        await self._http.close()

    # --- code interpreter --------------------------------------------------

    async def run_code(
        self,
        code: str,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        on_result: Callable[[Result], Any] | None = None,
        on_error: Callable[[ExecutionError], Any] | None = None,
        envs: Mapping[str, str] | None = None,
        timeout: float | None = None,
        context: Context | str | None = None,
        *,
        language: str | None = None,
        request_timeout: float | None = None,
    ) -> Execution:
        """Run ``code`` in the sandbox's Python kernel, in the default context
        of ``language`` (python, javascript, typescript, r, java, bash), or in
        ``context`` (not both).

        Callbacks fire as output streams in. An exception in the code is
        returned as ``Execution.error``, not raised. ``timeout`` bounds the
        whole execution (default 300 s, 0 = none).
        """
        deadline_s = normalize_timeout(timeout, DEFAULT_RUN_CODE_TIMEOUT)
        spec = self._core.execute_request(code, context, envs, deadline_s, request_timeout, language)
        acc = ExecutionAccumulator(on_stdout=on_stdout, on_stderr=on_stderr,
                                   on_result=on_result, on_error=on_error)
        decoder = NDJSONDecoder()
        deadline = None if deadline_s is None else time.monotonic() + deadline_s
        overrun = f"code execution exceeded {deadline_s:g} s"
        async with self._http.stream(spec) as response:
            with translating(overrun):
                async for chunk in response.aiter_bytes():
                    for event in decoder.feed(chunk):
                        await afire(acc.handle(event))
                    if deadline is not None and time.monotonic() > deadline:
                        raise TimeoutError(overrun, request_id=request_id(response))
            for event in decoder.close():
                await afire(acc.handle(event))
        return acc.finish()

    async def create_code_context(
        self, cwd: str | None = None, language: str | None = None, *,
        request_timeout: float | None = None,
    ) -> Context:
        spec = self._core.create_context_request(cwd, language, request_timeout)
        return Context.from_json(parse_rpc(await self._http.request(spec), "context"))

    async def list_code_contexts(self, *, request_timeout: float | None = None) -> list[Context]:
        return parse_contexts(await self._http.request(self._core.list_contexts_request(request_timeout)))

    async def restart_code_context(
        self, context: Context | str, *, request_timeout: float | None = None
    ) -> None:
        await self._http.request(self._core.context_request("POST", context, "restart", request_timeout))

    async def remove_code_context(
        self, context: Context | str, *, request_timeout: float | None = None
    ) -> None:
        await self._http.request(self._core.context_request("DELETE", context, "", request_timeout))


class AsyncCommandHandle:
    """A command started with ``commands.run(..., background=True)``.

    Its output is read, firing callbacks, by a background task from the start.
    Used as an async context manager, the output stream is closed on exit.
    Use it from one task.
    """

    def __init__(
        self, sandbox: AsyncSandbox, response: Any,
        on_stdout: Callable[[str], Any] | None, on_stderr: Callable[[str], Any] | None,
    ) -> None:
        self._sandbox = sandbox
        self._response = response
        self._request_id = request_id(response)
        self._acc = ProcessAccumulator(on_stdout=on_stdout, on_stderr=on_stderr)
        self._decoder = EnvelopeDecoder()
        self._chunks = response.aiter_bytes()
        self._reader: AsyncReader[CommandResult] | None = None

    @classmethod
    async def _start(
        cls, sandbox: AsyncSandbox, spec: RequestSpec,
        on_stdout: Callable[[str], Any] | None, on_stderr: Callable[[str], Any] | None,
    ) -> "AsyncCommandHandle":
        handle = cls(sandbox, await sandbox._http.open_stream(spec), on_stdout, on_stderr)
        try:
            check_stream_content_type(handle._response)
            while not handle._acc.started:
                if not await handle._pump():
                    raise ProtocolError("process stream ended before the start event")
        except BaseException:
            await handle.close()
            raise
        return handle

    @property
    def pid(self) -> int:
        assert self._acc.pid is not None
        return self._acc.pid

    async def __aenter__(self) -> "AsyncCommandHandle":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _pump(self) -> bool:
        """Read one chunk and handle its messages; False at end of stream."""
        with translating():
            chunk = await anext(self._chunks, None)
        if chunk is None:
            self._decoder.close()
            return False
        for envelope in self._decoder.feed(chunk):
            if envelope.end_stream:
                raise_for_end_stream(envelope, request_id=self._request_id)
            else:
                await afire(self._acc.handle(envelope.message))
        return True

    async def _read_rest(self) -> CommandResult:
        try:
            while await self._pump():
                pass
            result, calls = self._acc.finish()
            await afire(calls)
            return result
        finally:
            await self._response.aclose()

    def _start_reader(self) -> None:
        if self._reader is None:
            self._reader = AsyncReader(self._read_rest)

    async def wait(self) -> CommandResult:
        """Wait for the command to end. Raises :class:`CommandExitError` on a
        non-zero exit code and :class:`TimeoutError` past its deadline."""
        self._start_reader()
        assert self._reader is not None
        result = await self._reader.result()
        if result.exit_code != 0:
            raise CommandExitError(result, request_id=self._request_id)
        return result

    async def kill(self, *, request_timeout: float | None = None) -> bool:
        """Send SIGKILL. Returns False if the process was already gone."""
        return await self._sandbox.commands.kill(self.pid, request_timeout=request_timeout)

    async def close(self) -> None:
        """Stop reading output (the process is not killed)."""
        if self._reader is not None:
            await self._reader.cancel()
        await self._response.aclose()


class AsyncCommands:
    """``sandbox.commands``: run shell commands with ``/bin/bash -l -c``."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @overload
    async def run(
        self, cmd: str, background: Literal[False] = False, envs: Mapping[str, str] | None = None,
        cwd: str | None = None, user: str | None = None, timeout: float | None = ...,
        on_stdout: Callable[[str], Any] | None = None, on_stderr: Callable[[str], Any] | None = None,
        *, request_timeout: float | None = None,
    ) -> CommandResult: ...

    @overload
    async def run(
        self, cmd: str, background: Literal[True], envs: Mapping[str, str] | None = None,
        cwd: str | None = None, user: str | None = None, timeout: float | None = ...,
        on_stdout: Callable[[str], Any] | None = None, on_stderr: Callable[[str], Any] | None = None,
        *, request_timeout: float | None = None,
    ) -> AsyncCommandHandle: ...

    async def run(
        self,
        cmd: str,
        background: bool = False,
        envs: Mapping[str, str] | None = None,
        cwd: str | None = None,
        user: str | None = None,
        timeout: float | None = DEFAULT_COMMAND_TIMEOUT,
        on_stdout: Callable[[str], Any] | None = None,
        on_stderr: Callable[[str], Any] | None = None,
        *,
        request_timeout: float | None = None,
    ) -> CommandResult | AsyncCommandHandle:
        """Run ``cmd`` as ``user`` (default: the sandbox's default user) in
        ``cwd``. ``timeout`` (s, 0 = none) bounds the command's whole run.
        Returns the result, or with ``background=True`` a handle as soon as
        the process has started (``timeout`` still applies to it: pass 0 for
        a long-running background process)."""
        deadline = normalize_timeout(timeout, None)
        spec = self._sandbox._core.process_start_request(cmd, envs, cwd, user, deadline, request_timeout)
        handle = await AsyncCommandHandle._start(self._sandbox, spec, on_stdout, on_stderr)
        if background:
            handle._start_reader()
            return handle
        return await handle.wait()

    async def kill(self, pid: int, *, request_timeout: float | None = None) -> bool:
        """SIGKILL process ``pid``. Returns False if there is no such process."""
        spec = self._sandbox._core.kill_process_request(pid, request_timeout)
        return parse_found(await self._sandbox._http.request(spec))


class AsyncFiles:
    """``sandbox.files``: read and write the sandbox's filesystem."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sandbox = sandbox

    @overload
    async def read(
        self, path: str, format: Literal["text"] = "text", user: str | None = None,
        *, request_timeout: float | None = None,
    ) -> str: ...

    @overload
    async def read(
        self, path: str, format: Literal["bytes"], user: str | None = None,
        *, request_timeout: float | None = None,
    ) -> bytes: ...

    async def read(
        self, path: str, format: Literal["text", "bytes"] = "text", user: str | None = None,
        *, request_timeout: float | None = None,
    ) -> str | bytes:
        """Read a file as text (UTF-8) or bytes. Raises :class:`NotFoundError`
        if it does not exist."""
        spec = self._sandbox._core.read_file_request(path, format, user, request_timeout)
        return parse_read(await self._sandbox._http.request(spec), format)

    async def write(
        self, path: str, data: str | bytes, user: str | None = None,
        *, request_timeout: float | None = None,
    ) -> WriteInfo:
        """Write (create or overwrite) a file, creating parent directories."""
        spec = self._sandbox._core.write_file_request(path, data, user, request_timeout)
        return parse_write(await self._sandbox._http.request(spec))

    async def list(
        self, path: str, depth: int = 1, user: str | None = None,
        *, request_timeout: float | None = None,
    ) -> list[EntryInfo]:
        """Entries of directory ``path`` down to ``depth`` levels."""
        spec = self._sandbox._core.list_dir_request(path, depth, user, request_timeout)
        return parse_entries(await self._sandbox._http.request(spec))

    async def exists(
        self, path: str, user: str | None = None, *, request_timeout: float | None = None
    ) -> bool:
        spec = self._sandbox._core.exists_request(path, user, request_timeout)
        return parse_found(await self._sandbox._http.request(spec))

    async def remove(
        self, path: str, user: str | None = None, *, request_timeout: float | None = None
    ) -> None:
        """Remove a file or a directory tree. A path that does not exist is
        not an error (as E2B's envd)."""
        await self._sandbox._http.request(self._sandbox._core.remove_request(path, user, request_timeout))

    async def make_dir(
        self, path: str, user: str | None = None, *, request_timeout: float | None = None
    ) -> bool:
        """Create a directory (and parents). Returns False if it existed."""
        spec = self._sandbox._core.make_dir_request(path, user, request_timeout)
        return parse_dir_created(await self._sandbox._http.request(spec))

