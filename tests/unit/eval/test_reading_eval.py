"""experiments.reading_eval's headroom table: one per oracle mode, each paired per question against direct and
agent."""

from __future__ import annotations

from experiments.reading_eval import by_mode, headroom_table


def _rows(mode: str, ems: list[float], dataset: str = "nq") -> list[dict]:
    return [{"mode": mode, "dataset": dataset, "id": f"q{i}", "em": em} for i, em in enumerate(ems)]


def test_headroom_table_reads_the_oracle_mode_it_is_given():
    rows = _rows("direct", [0, 0, 0, 0]) + _rows("agent", [1, 0, 0, 0])
    rows += _rows("oracle", [1, 0, 0, 0]) + _rows("oracle-search", [1, 1, 1, 0])
    modes = by_mode(rows)
    lines, scaffold = headroom_table(modes)
    search_lines, search = headroom_table(modes, "oracle-search")
    assert scaffold["nq"]["oracle"] == 0.25 and search["nq"]["oracle"] == 0.75
    assert search["nq"]["agent"] == 0.25 and search["nq"]["direct"] == 0.0
    assert search["nq"]["vs_agent"].startswith("+2/−0") and search["nq"]["vs_direct"].startswith("+3/−0")
    assert "oracle-search EM" in search_lines[0] and "| oracle EM |" in lines[0]
    # A dataset without that oracle mode's rows has no line.
    assert "popqa" not in headroom_table(by_mode(rows + _rows("oracle", [1], "popqa")), "oracle-search")[1]
