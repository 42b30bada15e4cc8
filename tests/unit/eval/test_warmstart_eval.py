"""experiments.warmstart_eval's reading plot: oracle EM per dataset against training tokens, from eval files."""

import gzip
import json
from pathlib import Path

import pytest
import typer

from experiments.warmstart_eval import oracle_em_by_tokens


def write(path: Path, rows: list[dict]) -> Path:
    text = "".join(json.dumps(r) + "\n" for r in rows)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


def test_oracle_em_per_dataset_and_checkpoint_sorted_by_tokens(tmp_path):
    late = write(tmp_path / "late.jsonl.gz", [
        {"mode": "oracle", "dataset": "nq", "em": 1.0}, {"mode": "oracle", "dataset": "nq", "em": 0.0},
        {"mode": "direct", "dataset": "nq", "em": 1.0},  # another mode: not an oracle point
        {"mode": "oracle", "dataset": "popqa", "em": 1.0},
    ])  # fmt: skip
    early = write(tmp_path / "early.jsonl", [{"mode": "oracle", "dataset": "nq", "em": 0.0}])
    points = oracle_em_by_tokens([f"2000000={late}", f"500000={early}"])
    assert points == {"nq": [(0.5, 0.0), (2.0, 0.5)], "popqa": [(2.0, 1.0)]}


@pytest.mark.parametrize("spec", ["results.jsonl", "many=results.jsonl"])
def test_a_spec_without_its_token_count_is_refused(spec):
    with pytest.raises(typer.BadParameter, match="TOKENS=RESULTS"):
        oracle_em_by_tokens([spec])
