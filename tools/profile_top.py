"""The top frames of a py-spy profile: where a process's samples went, by own time and by time under a frame.

    py-spy record --pid PID --duration 30 --rate 250 --format raw -o profile.txt
    python -m tools.profile_top profile.txt [--top 15] [--match services/] [--drop "Condition.wait"]

py-spy's raw format is one collapsed stack per line (`frame;frame;...;leaf COUNT`, root first). `self` counts
the samples whose leaf is the frame, `total` the samples with the frame anywhere on the stack (once per stack);
both as a share of all samples. `--match` keeps frames whose text contains one of the given substrings for the
`total` table (our own code, say), so a deep library stack does not hide which of our calls paid for it.
`--drop` removes the stacks whose innermost frame contains a substring: threads py-spy sampled while they waited
(an idle worker pool's `Condition.wait`), which are not CPU time.
"""

from __future__ import annotations

import argparse
import gzip
import re
from collections import Counter
from pathlib import Path

LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")


def read_stacks(path: Path, drop: list[str] | None = None) -> list[tuple[list[str], int]]:
    stacks = []
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    for line in text.splitlines():
        match = LINE.match(line.strip())
        if match:
            frames = match["stack"].split(";")
            if not drop or not any(d in frames[-1] for d in drop):
                stacks.append((frames, int(match["count"])))
    return stacks


def shares(stacks: list[tuple[list[str], int]], match: list[str] | None = None) -> tuple[Counter, Counter, int]:
    own: Counter = Counter()
    under: Counter = Counter()
    total = 0
    for frames, count in stacks:
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            if not match or any(m in frame for m in match):
                under[frame] += count
    return own, under, total


def table(title: str, counts: Counter, total: int, top: int) -> str:
    lines = [f"{title} ({total} samples)", f"{'share':>7}  frame"]
    lines += [f"{n / total:>7.1%}  {frame}" for frame, n in counts.most_common(top)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="py-spy `record --format raw` output (or it gzipped, .gz).")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--match", action="append", help="Substring a frame must hold for the `total` table.")
    parser.add_argument("--drop", action="append", help="Leave out stacks whose innermost frame holds this.")
    args = parser.parse_args(argv)
    own, under, total = shares(read_stacks(args.profile, args.drop), args.match)
    if not total:
        raise SystemExit(f"no samples in {args.profile}")
    print(table("self: samples whose innermost frame is", own, total, args.top))
    print()
    print(table("total: samples with the frame on the stack", under, total, args.top))


if __name__ == "__main__":
    main()
