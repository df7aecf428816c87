#!/usr/bin/env python3
"""Generate the sync modules (src/cellfork/sandbox.py, template.py) from
their async twins (async_sandbox.py, async_template.py), as httpcore's
unasync does: drop ``async``/``await`` and rename by the table below, so
the twins cannot drift. Going from async to sync is the direction that is
mechanical.

    python3 sdk/python/scripts/unasync.py          # rewrite the sync modules
    python3 sdk/python/scripts/unasync.py --check  # exit 1 if one is stale

Standard library only (scripts/check-generated.sh runs it with the
system's python3; tests/unit/test_unasync.py runs --check's logic too).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "src" / "cellfork"
SOURCE = PACKAGE / "async_sandbox.py"
TARGET = PACKAGE / "sandbox.py"

# (async source, sync target, the docstring that replaces the source's).
PAIRS = [
    (
        SOURCE,
        TARGET,
        '''"""Synchronous client: :class:`Sandbox`, a thin shell over
:mod:`cellfork._core`.

Generated from :mod:`cellfork.async_sandbox` by
``sdk/python/scripts/unasync.py``: edit that file, then run the script."""
''',
    ),
    (
        PACKAGE / "async_template.py",
        PACKAGE / "template.py",
        '''"""Synchronous custom templates: :class:`Template`, a thin shell over
:mod:`cellfork._template`.

Generated from :mod:`cellfork.async_template` by
``sdk/python/scripts/unasync.py``: edit that file, then run the script."""
''',
    ),
]
HEADER = PAIRS[0][2]

# (pattern, replacement), applied in order to every line. Keywords and
# names match whole words only.
SUBS = [
    # Keywords.
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    # Protocols and httpx's async methods.
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baiter_bytes\b", "iter_bytes"),
    (r"\baclose\b", "close"),
    (r"\banext\b", "next"),
    # Our async names and their sync twins.
    (r"\bAsync(Sandbox|Commands|Files|CommandHandle|Template)\b", r"\1"),
    (r"\bAsyncHTTP\b", "SyncHTTP"),
    (r"\bAsyncReader\b", "SyncReader"),
    (r"\bafire\b", "fire"),
    (r"^import asyncio$", "import time"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    # Prose that differs.
    (r"\ban async context manager\b", "a context manager"),
    (r"^(\s*)Use it from one event loop\.$", r"\1Safe for use from several threads."),
    (r"^(\s*)Use it from one task\.$", r"\1Not safe for concurrent use."),
    (r"\bby a background task from the start\.$", "while :meth:`wait` runs."),
]
_SUBS = [(re.compile(p), r) for p, r in SUBS]


def unasync(source: str, header: str = HEADER) -> str:
    """The sync twin of the async module's text, under header."""
    body = _strip_docstring(source)
    lines = []
    for line in body.splitlines(keepends=True):
        for pattern, replacement in _SUBS:
            line = pattern.sub(replacement, line.rstrip("\n")) + ("\n" if line.endswith("\n") else "")
        lines.append(line)
    return header + "".join(lines)


def _strip_docstring(source: str) -> str:
    match = re.match(r'\s*"""(.*?)"""\n', source, re.S)
    if not match:
        raise SystemExit("an async module without a docstring to replace")
    return source[match.end():]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether the sync modules are up to date")
    args = parser.parse_args()
    stale = 0
    for source, target, header in PAIRS:
        want = unasync(source.read_text(), header)
        have = target.read_text() if target.exists() else ""
        if want == have:
            continue
        if args.check:
            print(f"{target} is stale: run {pathlib.Path(__file__).name} (and commit it)", file=sys.stderr)
            stale = 1
        else:
            target.write_text(want)
    return stale


if __name__ == "__main__":
    sys.exit(main())
