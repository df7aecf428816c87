"""Sandbox and AsyncSandbox are twins: same public methods, same
signatures; the async side is async wherever the sync side does I/O."""

import inspect

import pytest

from cellfork import (
    AsyncCommandHandle,
    AsyncCommands,
    AsyncFiles,
    AsyncSandbox,
    AsyncTemplate,
    CommandHandle,
    Commands,
    Files,
    Sandbox,
    Template,
)

PAIRS = [
    (Sandbox, AsyncSandbox),
    (Commands, AsyncCommands),
    (Files, AsyncFiles),
    (CommandHandle, AsyncCommandHandle),
]

# Sync-only dunders and their async counterparts.
CONTEXT_MANAGERS = {"__enter__": "__aenter__", "__exit__": "__aexit__"}


def _public(cls):
    return {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if not name.startswith("_")
    }


def _params(func):
    sig = inspect.signature(func)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=lambda c: c.__name__)
def test_same_public_names(sync_cls, async_cls):
    assert sorted(_public(sync_cls)) == sorted(_public(async_cls))


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=lambda c: c.__name__)
def test_same_signatures_and_async_where_sync_does_io(sync_cls, async_cls):
    sync_members, async_members = _public(sync_cls), _public(async_cls)
    for name, s in sync_members.items():
        a = async_members[name]
        assert type(s) is type(a), f"{name}: {type(s).__name__} vs {type(a).__name__}"
        if isinstance(s, property):
            continue
        s_fn = s.__func__ if isinstance(s, (classmethod, staticmethod)) else s
        a_fn = a.__func__ if isinstance(a, (classmethod, staticmethod)) else a
        assert _params(s_fn) == _params(a_fn), name
        assert not inspect.iscoroutinefunction(s_fn), name
        assert inspect.iscoroutinefunction(a_fn), f"{async_cls.__name__}.{name} must be async"


@pytest.mark.parametrize("sync_cls,async_cls", PAIRS, ids=lambda c: c.__name__)
def test_context_managers_match(sync_cls, async_cls):
    for s_name, a_name in CONTEXT_MANAGERS.items():
        assert hasattr(sync_cls, s_name) == hasattr(async_cls, a_name)



def test_templates_are_twins():
    """Template and AsyncTemplate share the builder (sync in both) and have
    the same class methods, async where the sync side does I/O."""
    assert sorted(_public(Template)) == sorted(_public(AsyncTemplate))
    for name in vars(Template):
        if name.startswith("_"):
            continue
        s, a = inspect.getattr_static(Template, name), inspect.getattr_static(AsyncTemplate, name)
        assert type(s) is type(a), name
        s_fn, a_fn = s.__func__, a.__func__
        assert _params(s_fn) == _params(a_fn), name
        assert not inspect.iscoroutinefunction(s_fn), name
        assert inspect.iscoroutinefunction(a_fn), f"AsyncTemplate.{name} must be async"
    assert set(vars(Template)) - {"__doc__", "__module__", "__qualname__", "__firstlineno__", "__static_attributes__"} == \
        set(vars(AsyncTemplate)) - {"__doc__", "__module__", "__qualname__", "__firstlineno__", "__static_attributes__"}
