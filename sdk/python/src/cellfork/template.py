"""Synchronous custom templates: :class:`Template`, a thin shell over
:mod:`cellfork._template`.

Generated from :mod:`cellfork.async_template` by
``sdk/python/scripts/unasync.py``: edit that file, then run the script."""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from ._config import Transport, resolve_config
from ._core import ApiCore
from ._template import (
    BUILD_POLL_INTERVAL,
    BuildInfo,
    BuildStatus,
    LogEntry,
    TemplateBase,
    TemplateCore,
    TemplateInfo,
    build_error,
    parse_created,
    parse_deleted,
    parse_exists,
    parse_link,
    parse_tags,
    parse_templates,
)
from ._transport import SyncHTTP

__all__ = ["Template"]


class Template(TemplateBase):
    """A custom template: build its definition with the chained methods of
    :class:`cellfork._template.TemplateBase` (E2B's Template SDK names),
    then send it with :meth:`build`. The class methods take the connection
    settings ``base_url``, ``api_key``, ``request_timeout``,
    ``max_retries`` and ``transport``, as :class:`cellfork.Sandbox` does.
    """

    @staticmethod
    def _open(base_url, api_key, request_timeout, max_retries, transport) -> tuple[TemplateCore, SyncHTTP]:
        config = resolve_config(base_url=base_url, api_key=api_key, request_timeout=request_timeout,
                                max_retries=max_retries, transport=transport)
        api = ApiCore(config)
        return TemplateCore(api), SyncHTTP(config, api.retry_policy())

    @classmethod
    def build(
        cls,
        template: TemplateBase,
        name: str,
        *,
        tags: Sequence[str] | None = None,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        skip_cache: bool = False,
        on_build_logs: Callable[[LogEntry], Any] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> BuildInfo:
        """Build ``template`` as ``name`` (or ``name:tag``) and wait until it
        is ready; ``on_build_logs`` gets each log entry. Raises
        :class:`cellfork.TemplateBuildError` (with the failing ``step``) when
        the build fails."""
        info = cls.build_in_background(
            template, name, tags=tags, cpu_count=cpu_count, memory_mb=memory_mb, skip_cache=skip_cache,
            base_url=base_url, api_key=api_key, request_timeout=request_timeout, max_retries=max_retries,
            transport=transport)
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            offset = 0
            while True:
                status = BuildStatus.from_json(((http.request(
                    core.status_request(info.template_id, info.build_id, offset, request_timeout))).json()))
                for entry in status.log_entries:
                    if on_build_logs is not None:
                        on_build_logs(entry)
                offset += len(status.log_entries)
                if not status.log_entries and status.status not in ("building", "waiting"):
                    if status.status == "ready":
                        return info
                    raise build_error(status)
                time.sleep(BUILD_POLL_INTERVAL)
        finally:
            http.close()

    @classmethod
    def build_in_background(
        cls,
        template: TemplateBase,
        name: str,
        *,
        tags: Sequence[str] | None = None,
        cpu_count: int | None = None,
        memory_mb: int | None = None,
        skip_cache: bool = False,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> BuildInfo:
        """Start a build of ``template`` as ``name`` and return at once;
        follow it with :meth:`get_build_status`."""
        body = template.to_dict()
        if skip_cache:
            body["force"] = True
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            info = parse_created(http.request(
                core.create_request(name, tags, cpu_count, memory_mb, request_timeout)), name)
            for digest, data, force, is_context in template._uploads():
                present, url = parse_link(http.request(
                    core.file_link_request(info.template_id, digest, request_timeout)))
                if (force or not present) and url:
                    http.request(core.upload_request(url, data, request_timeout))
                if is_context:
                    body["dockerfileContext"] = digest
            http.request(core.start_request(info.template_id, info.build_id, body, request_timeout))
            return info
        finally:
            http.close()

    @classmethod
    def get_build_status(
        cls,
        build_info: BuildInfo,
        logs_offset: int = 0,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> BuildStatus:
        """A build's status and its log entries from ``logs_offset``."""
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return BuildStatus.from_json((http.request(
                core.status_request(build_info.template_id, build_info.build_id, logs_offset, request_timeout))).json())
        finally:
            http.close()

    @classmethod
    def exists(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> bool:
        """Whether a template has this name (built-in ones included)."""
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_exists(http.request(core.exists_request(name, request_timeout)))
        finally:
            http.close()

    @classmethod
    def list(
        cls,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[TemplateInfo]:
        """Every template: the built-in ones, then the custom ones."""
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_templates(http.request(core.list_request(request_timeout)))
        finally:
            http.close()

    @classmethod
    def delete(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> bool:
        """Delete a custom template; False if there was none of that name.
        Sandboxes created from it keep running."""
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_deleted(http.request(core.delete_request(name, request_timeout)))
        finally:
            http.close()

    @classmethod
    def assign_tags(
        cls,
        target_name: str,
        tags: str | Sequence[str],
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[str]:
        """Point ``tags`` at the build ``target_name`` (``name:tag``) names."""
        tags = [tags] if isinstance(tags, str) else list(tags)
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_tags(http.request(core.assign_tags_request(target_name, tags, request_timeout)))
        finally:
            http.close()

    @classmethod
    def remove_tags(
        cls,
        name: str,
        tags: str | Sequence[str],
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> None:
        """Remove tags from template ``name``."""
        tags = [tags] if isinstance(tags, str) else list(tags)
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            http.request(core.remove_tags_request(name, tags, request_timeout))
        finally:
            http.close()

    @classmethod
    def get_tags(
        cls,
        name: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        request_timeout: float | None = None,
        max_retries: int | None = None,
        transport: Transport | None = None,
    ) -> list[str]:
        """A template's tags."""
        core, http = cls._open(base_url, api_key, request_timeout, max_retries, transport)
        try:
            return parse_tags(http.request(core.tags_request(name, request_timeout)))
        finally:
            http.close()
