"""A docs page with one generated section between two markers, and the `--write` / `--check` command that keeps it
current (tools.settings_table and tools.perf_table)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def replace_section(page: str, begin: str, end: str, body: str, name: Path) -> str:
    """`page` with the text between `begin` and `end` replaced by `body`."""
    head, found, rest = page.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise SystemExit(f"{name}: markers not found ({begin!r} ... {end!r})")
    return f"{head}{begin}\n\n{body}\n{end}{tail}"


def run(argv: list[str] | None, doc: str, page_path: Path, shown: Path, module: str, table: Callable[[], str],
        render: Callable[[str], str]) -> int:  # fmt: skip
    """No flag: print the table; `--write`: rewrite the page; `--check`: exit 1 when the page is stale."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--write", action="store_true", help=f"Rewrite the table in {shown}.")
    group.add_argument("--check", action="store_true", help="Exit 1 when the page's table is stale.")
    args = parser.parse_args(argv)
    if not (args.write or args.check):
        print(table())
        return 0
    page = page_path.read_text()
    current = render(page)
    if args.write:
        page_path.write_text(current)
        return 0
    if current != page:
        print(f"{shown} is stale: run `python -m {module} --write`", file=sys.stderr)
        return 1
    return 0
