"""cellfork: Python SDK for the cellfork sandbox daemon (E2B wire protocol).

    from cellfork import Sandbox

    with Sandbox.create() as sb:
        print(sb.run_code("1 + 1").text)             # "2"
        print(sb.commands.run("echo hi").stdout)      # "hi\\n"

Configuration: ``CELLFORK_URL`` (default http://127.0.0.1:3000) and
``CELLFORK_API_KEY``, or the ``base_url=`` / ``api_key=`` keyword arguments.
"""

from ._exceptions import (
    APIConnectionError,
    AuthenticationError,
    CellforkError,
    CommandExitError,
    ConflictError,
    InternalServerError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ProtocolError,
    RateLimitError,
    SandboxNotFoundError,
    SandboxUnavailableError,
    ServiceBusyError,
    TimeoutError,
)
from ._models import (
    CommandResult,
    Context,
    EntryInfo,
    Execution,
    ExecutionError,
    FileType,
    Logs,
    Result,
    NetworkStatus,
    SandboxInfo,
    SnapshotInfo,
    SnapshotNode,
    SnapshotRef,
    WriteInfo,
)
from ._version import __version__
from .async_sandbox import AsyncCommandHandle, AsyncCommands, AsyncFiles, AsyncSandbox
from .sandbox import CommandHandle, Commands, Files, Sandbox

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Commands",
    "AsyncCommands",
    "Files",
    "AsyncFiles",
    "CommandHandle",
    "AsyncCommandHandle",
    "CommandResult",
    "Context",
    "EntryInfo",
    "Execution",
    "ExecutionError",
    "FileType",
    "Logs",
    "Result",
    "NetworkStatus",
    "SandboxInfo",
    "SnapshotInfo",
    "SnapshotNode",
    "SnapshotRef",
    "WriteInfo",
    "CellforkError",
    "APIConnectionError",
    "ProtocolError",
    "AuthenticationError",
    "PermissionDeniedError",
    "NotFoundError",
    "SandboxNotFoundError",
    "InvalidArgumentError",
    "ConflictError",
    "RateLimitError",
    "ServiceBusyError",
    "SandboxUnavailableError",
    "InternalServerError",
    "TimeoutError",
    "CommandExitError",
]
