#!/usr/bin/env python3
"""Generate the blocking client and its tests from their one async source (as httpcore does).

``sandbox_client/_async/*.py`` is written by hand; each file is rewritten line by line with
:data:`RULES` into ``sandbox_client/_sync/`` (and ``tests/client/_async/`` into
``tests/client/_sync/``). A generated file starts with a line saying so and is never edited by
hand: edit the async source and run this script. ``__init__.py`` files are written by hand on
both sides (their docstrings say which side they are).

    hack/unasync.py            write the generated files
    hack/unasync.py --check    regenerate in memory; exit 1 when a generated file differs from
                               the one checked in, a generated file has no source left, or a
                               rule matched nothing (a rule nobody needs is a rule to delete)

What the two libraries do differently is not a rule: it lives in ``sandbox_client/_kube.py``,
written in both flavours side by side, so the rules stay this small table.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (source directory, generated directory), relative to the repository root.
TREES = [
    ("sandbox_client/_async", "sandbox_client/_sync"),
    ("tests/client/_async", "tests/client/_sync"),
]

# (pattern, replacement), applied in this order to every line.
RULES: list[tuple[str, str]] = [
    # coroutines become functions
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\baclosing\b", "closing"),
    # an async name becomes its blocking twin: AsyncKube -> Kube, async_files_for -> files_for
    (r"\bAsync([A-Z]\w*)", r"\1"),
    (r"\basync_([a-z]\w*)", r"\1"),
    # the library, the package and the public face
    (r"\bkubernetes_asyncio\b", "kubernetes"),
    (r"\bsandbox_client\.aio\b", "sandbox_client.client"),
    # tests: the async test runner's marker
    (r"\bpytest\.mark\.anyio, ", ""),
]

HEADER = "# Generated from {source} by hack/unasync.py: do not edit.\n"


def unasync(text: str, used: set[str]) -> str:
    """``text`` with every rule applied; the patterns that matched are added to ``used``."""
    out = []
    for line in text.splitlines(keepends=True):
        for pattern, replacement in RULES:
            line, count = re.subn(pattern, replacement, line)
            if count:
                used.add(pattern)
        out.append(line)
    return "".join(out)


def generated(used: set[str]) -> dict[Path, str]:
    """Every generated file (absolute path) and the text it must have."""
    files = {}
    for source_dir, target_dir in TREES:
        for source in sorted((ROOT / source_dir).glob("*.py")):
            if source.name == "__init__.py":
                continue
            relative = source.relative_to(ROOT).as_posix()
            text = HEADER.format(source=relative) + unasync(source.read_text(), used)
            files[ROOT / target_dir / source.name] = text
    return files


def stale(files: dict[Path, str]) -> list[Path]:
    """Generated files whose source is gone."""
    found = []
    for _, target_dir in TREES:
        for target in sorted((ROOT / target_dir).glob("*.py")):
            if target.name != "__init__.py" and target not in files:
                found.append(target)
    return found


def main(argv: list[str] | None = None) -> int:
    """Write the generated files, or with ``--check`` only compare them; the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    used: set[str] = set()
    files = generated(used)
    problems = []
    for path, text in files.items():
        name = path.relative_to(ROOT).as_posix()
        current = path.read_text() if path.exists() else None
        if current == text:
            continue
        if args.check:
            problems.append(f"{name} is not what hack/unasync.py generates: run hack/unasync.py")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {name}")
    for path in stale(files):
        problems.append(f"{path.relative_to(ROOT).as_posix()} has no async source: delete it")
    for pattern, _ in RULES:
        if pattern not in used:
            problems.append(f"rule {pattern!r} matched nothing: delete it")
    for problem in problems:
        print(f"unasync: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
