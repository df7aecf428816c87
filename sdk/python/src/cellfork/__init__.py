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
from ._template import (
    BuildInfo,
    BuildStatus,
    LogEntry,
    ReadyCmd,
    TemplateBuildError,
    TemplateInfo,
    wait_for_file,
    wait_for_port,
    wait_for_process,
    wait_for_timeout,
    wait_for_url,
)
from .async_sandbox import AsyncCommandHandle, AsyncCommands, AsyncFiles, AsyncSandbox
from .async_template import AsyncTemplate
from .sandbox import CommandHandle, Commands, Files, Sandbox
from .template import Template

__all__ = [
    "__version__",
    "Sandbox",
    "AsyncSandbox",
    "Template",
    "AsyncTemplate",
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
