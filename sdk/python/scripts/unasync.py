#!/usr/bin/env python3
"""Generate the sync client (src/cellfork/sandbox.py) from the async one
(src/cellfork/async_sandbox.py), as httpcore's unasync does: drop
``async``/``await`` and rename by the table below, so the twins cannot
drift. Going from async to sync is the direction that is mechanical.

    python3 sdk/python/scripts/unasync.py          # rewrite sandbox.py
    python3 sdk/python/scripts/unasync.py --check  # exit 1 if it is stale

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

# The generated module's docstring replaces the source's.
HEADER = '''"""Synchronous client: :class:`Sandbox`, a thin shell over
:mod:`cellfork._core`.

Generated from :mod:`cellfork.async_sandbox` by
``sdk/python/scripts/unasync.py``: edit that file, then run the script."""
'''

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
    (r"\bAsync(Sandbox|Commands|Files|CommandHandle)\b", r"\1"),
    (r"\bAsyncHTTP\b", "SyncHTTP"),
    (r"\bAsyncReader\b", "SyncReader"),
    (r"\bafire\b", "fire"),
    # Prose that differs.
    (r"\ban async context manager\b", "a context manager"),
    (r"^(\s*)Use it from one event loop\.$", r"\1Safe for use from several threads."),
    (r"^(\s*)Use it from one task\.$", r"\1Not safe for concurrent use."),
    (r"\bby a background task from the start\.$", "while :meth:`wait` runs."),
]
_SUBS = [(re.compile(p), r) for p, r in SUBS]


def unasync(source: str) -> str:
    """The sync twin of the async module's text."""
    body = _strip_docstring(source)
    lines = []
    for line in body.splitlines(keepends=True):
        for pattern, replacement in _SUBS:
            line = pattern.sub(replacement, line.rstrip("\n")) + ("\n" if line.endswith("\n") else "")
        lines.append(line)
    return HEADER + "".join(lines)


def _strip_docstring(source: str) -> str:
    match = re.match(r'\s*"""(.*?)"""\n', source, re.S)
    if not match:
        raise SystemExit(f"{SOURCE}: no module docstring to replace")
    return source[match.end():]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report whether sandbox.py is up to date")
    args = parser.parse_args()
    want = unasync(SOURCE.read_text())
    have = TARGET.read_text() if TARGET.exists() else ""
    if want == have:
        return 0
    if args.check:
        print(f"{TARGET} is stale: run {pathlib.Path(__file__).name} (and commit it)", file=sys.stderr)
        return 1
    TARGET.write_text(want)
    return 0


if __name__ == "__main__":
    sys.exit(main())
