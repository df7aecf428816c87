"""The sync modules are generated from their async twins
(scripts/unasync.py): the committed sandbox.py and template.py must be
exactly what the script makes."""

import importlib.util
import pathlib
import re

import pytest

from cellfork import CellforkError
from cellfork._transport import SyncReader

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "unasync.py"


def _script():
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sync_modules_are_generated_from_their_async_twins():
    unasync = _script()
    assert [t.name for _, t, _ in unasync.PAIRS] == ["sandbox.py", "template.py"]
    for source, target, header in unasync.PAIRS:
        want = unasync.unasync(source.read_text(), header)
        assert target.read_text() == want, f"{target.name} is stale: run python3 sdk/python/scripts/unasync.py"


def test_generated_code_is_sync():
    unasync = _script()
    for source, target, header in unasync.PAIRS:
        text = unasync.unasync(source.read_text(), header)
        compile(text, target.name, "exec")
        for word in ("async", "await", "Async", "asyncio", "afire", "aclose", "aiter_bytes", "event loop"):
            assert not re.search(rf"\b{word}\b", text.replace("cellfork." + source.stem, "")), (target.name, word)


def test_sync_reader_runs_once_and_keeps_the_outcome():
    calls = []
    reader = SyncReader(lambda: calls.append(1) or len(calls))
    assert calls == []  # nothing runs before result()
    assert reader.result() == 1 and reader.result() == 1 and calls == [1]

    def boom():
        calls.append(2)
        raise ValueError("x")

    failing = SyncReader(boom)
    for _ in range(2):
        with pytest.raises(ValueError):
            failing.result()
    assert calls == [1, 2]

    cancelled = SyncReader(boom)
    cancelled.cancel()
    with pytest.raises(CellforkError):
        cancelled.result()
    assert calls == [1, 2]
