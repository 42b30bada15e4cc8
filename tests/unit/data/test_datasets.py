"""`--dataset all` lists question files only: a corpus beside them (the default QA folder, services/demo_data, holds
hotpotqa_corpus.jsonl) is not a dataset."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from services.data.datasets import available, resolve
from tests.conftest import REPO

DEMO = REPO / "services" / "demo_data"


def _lines(rows: list[dict]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def test_all_lists_question_files_and_no_corpus(tmp_path):
    (tmp_path / "nq.jsonl").write_text(_lines([{"id": "1", "question": "q?", "golden_answers": ["a"]}]))
    (tmp_path / "popqa_questions.jsonl").write_text(_lines([{"id": "2", "question": "q?", "golden_answers": ["a"]}]))
    (tmp_path / "hotpotqa_corpus.jsonl").write_text((DEMO / "hotpotqa_corpus.jsonl").open().readline())
    (tmp_path / "wiki.jsonl").write_text(_lines([{"id": "w1", "title": "T", "text": "passage"}]))
    (tmp_path / "empty.jsonl").write_text("\n")
    assert available(tmp_path) == ["nq", "popqa"]
    assert resolve(DEMO, "all") == []  # the demo folder: one corpus, one training-only file


def test_eval_all_on_the_default_folder_says_there_are_no_questions():
    from services.cli.main import app

    result = CliRunner().invoke(app, ["eval", "--dataset", "all", "--qa-dir", str(DEMO)])
    assert result.exit_code == 2, result.output + repr(result.exception)
    assert "no question files" in result.output
