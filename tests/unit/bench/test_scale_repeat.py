"""bench/scale.py's --repeat and --json wiring: every size x engine row runs once a repeat, each exact/edge ratio
gets its median and spread, and the JSON holds what tools/perf_table.py reads. The rows are fakes (no index built,
no process started)."""

from __future__ import annotations

import itertools
import json

from bench import scale
from tools.perf_table import HEADLINES


def test_scale_repeats_every_row_and_writes_the_ratios(tmp_path, monkeypatch, capsys):
    calls = itertools.count()
    made = []

    def fake_row(engine: str, n: int, queries: int, seed: int) -> dict:
        index = next(calls)
        made.append((engine, n, queries, seed))
        p50 = 2.0 if engine == "edge" else 4.0 + index  # exact gets slower each call: a spread to summarize
        return {"engine": engine, "n": n, "ingest_s": 1.0, "p50_ms": p50, "p99_ms": 2 * p50, "qps": 1000 / p50,
                "memory_mb": 10.0, "peak_mb": 20.0, "disk_mb": 5.0, "recall10": 1.0, "wall_s": 0.1}  # fmt: skip

    monkeypatch.setattr(scale, "run_row", fake_row)
    monkeypatch.setattr(scale, "plot", lambda rows, out: out.write_text(json.dumps(rows)))
    out, record = tmp_path / "scale-rows.json", tmp_path / "bench" / "scale.json"
    argv = ["--sizes", "1000", "1000000", "--engines", "edge", "exact", "--queries", "7", "--repeat", "2",
            "--json", str(record), "--out", str(out)]  # fmt: skip
    scale.main(argv)

    assert made == [(e, n, 7, 0) for _ in range(2) for n in (1000, 1000000) for e in ("edge", "exact")]
    printed = capsys.readouterr().out
    assert printed.count("latency ratio exact/edge at 1000000 passages") == 2  # the old lines, once a repeat
    assert "median and spread over 2 repeats; CPU: " in printed

    data = json.loads(record.read_text())
    assert data["bench"] == "scale" and data["repeat"] == 2
    assert data["command"] == "python -m bench.scale " + " ".join(argv)
    assert [run["p50_ms/exact_over_edge@1000"] for run in data["runs"]] == [2.5, 4.5]  # exact 5 and 9 ms
    assert data["ratios"]["p50_ms/exact_over_edge@1000000"]["median"] == 4.5  # exact 7 and 11 ms: (3.5 + 5.5) / 2
    assert {h.key for h in HEADLINES if h.bench == "scale"} <= set(data["ratios"])

    rows = json.loads(out.read_text())["rows"]
    assert [r["repeat"] for r in rows] == [0] * 4 + [1] * 4
    plotted = json.loads(out.with_suffix(".png").read_text())  # the fake plot's input: one median row per point
    assert len(plotted) == 4 and {r["p50_ms"] for r in plotted if r["engine"] == "edge"} == {2.0}
