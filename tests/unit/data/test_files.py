"""Bring your data: a Search-R1 / verl parquet file, a FlashRAG jsonl file or a folder of them reads into our
question rows; bad rows are skipped with their row number and counted, never dropped silently; the evaluation
split of our own `<dataset>.jsonl` files holds whatever path they are read from. No services start here."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from services.data.datasets import items_from_rows
from services.data.files import DataFileError, parquet_row, read_data, search_r1_question
from services.data.split import EVAL_SPLIT, evaluation_data, training_data
from services.trainer.config_file import load_run_config, to_toml
from services.trainer.rollout import round_items
from services.trainer.round_files import QUESTIONS, run_questions, write_questions
from services.trainer.run_state import RunConfig
from services.trainer.settings import TrainerSettings


def make_prefix(dp, template_type):
    """Search-R1's scripts/data_process/nq_search.py (PeterGriffinJin/Search-R1 at a14dc3a), verbatim."""
    question = dp["question"]

    # NOTE: also need to change reward_score/countdown.py
    if template_type == "base":
        """This works for any base model"""
        prefix = f"""Answer the given question. \
You must conduct reasoning inside <think> and </think> first every time you get new information. \
After reasoning, if you find you lack some knowledge, you can call a search engine by <search> query </search> and it will return the top searched results between <information> and </information>. \
You can search as many times as your want. \
If you find no further external knowledge needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"""  # noqa: E501
    else:
        raise NotImplementedError
    return prefix


def search_r1_row(example: dict, idx: int, data_source: str, split: str) -> dict:
    """One row as nq_search.py's `process_fn` makes it (HF datasets' map keeps FlashRAG's columns beside it)."""
    example = dict(example)
    example["question"] = example["question"].strip()
    if example["question"][-1] != "?":
        example["question"] += "?"
    question = make_prefix(example, template_type="base")
    solution = {"target": example["golden_answers"]}
    data = {
        "data_source": data_source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {"split": split, "index": idx},
    }
    return {**example, **data}


FLASHRAG_NQ = [
    {"id": "train_0", "question": "total number of death row inmates in the us", "golden_answers": ["2,718"]},
    {"id": "train_1", "question": "big little lies season 2 how many episodes ", "golden_answers": ["seven", "7"]},
]
FLASHRAG_HOTPOTQA = [
    {"id": "train_0", "question": "Which magazine was started first, Arthur's or First for Women?",
     "golden_answers": ["Arthur's Magazine"]},
]  # fmt: skip


def write_parquet(path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def write_jsonl(path, rows: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def test_a_search_r1_parquet_gives_back_the_question_and_answers(tmp_path):
    # qa_search_train_merge.py: nq then hotpotqa, each indexed from 0, concatenated into one train.parquet
    rows = [search_r1_row(ex, i, "nq", "train") for i, ex in enumerate(FLASHRAG_NQ)]
    rows += [search_r1_row(ex, i, "hotpotqa", "train") for i, ex in enumerate(FLASHRAG_HOTPOTQA)]
    write_parquet(tmp_path / "train.parquet", rows)
    data = read_data(tmp_path / "train.parquet")
    assert not data.skipped and data.files == [tmp_path / "train.parquet"]
    assert [(r["dataset"], r["id"], r["question"], r["golden_answers"]) for r in data.rows] == [
        ("nq", "train_0", "total number of death row inmates in the us?", ["2,718"]),
        ("nq", "train_1", "big little lies season 2 how many episodes?", ["seven", "7"]),
        ("hotpotqa", "train_0", FLASHRAG_HOTPOTQA[0]["question"], ["Arthur's Magazine"]),
    ]  # fmt: skip
    # the five columns alone (no FlashRAG ones beside them, no extra_info): the same questions, ids by row
    bare = [{k: r[k] for k in ("data_source", "prompt", "ability", "reward_model")} for r in rows]
    write_parquet(tmp_path / "bare.parquet", bare)
    again = read_data(tmp_path / "bare.parquet")
    assert [r["question"] for r in again.rows] == [r["question"] for r in data.rows]
    assert [r["id"] for r in again.rows] == ["0", "1", "2"]


def test_the_question_is_what_follows_the_last_marker():
    assert search_r1_question("Answer it. Question: Who wrote it?\n") == "Who wrote it?"
    assert search_r1_question("Question: ignore me. Question:  Where is Paris? \n") == "Where is Paris?"
    assert search_r1_question("  Who wrote Hamlet?\n") == "Who wrote Hamlet?"  # no marker: the whole message
    assert search_r1_question("Answer with context. Question: Who? Context: Doc 1(Title: X) ... \n") == "Who?"


def test_gold_answers_as_a_numpy_array_or_a_single_string():
    row = search_r1_row(FLASHRAG_NQ[1], 4, "nq", "test")
    row["reward_model"]["ground_truth"]["target"] = np.array(["seven", "7"], dtype=object)  # pandas reads lists so
    row["prompt"] = np.array(row["prompt"], dtype=object)
    assert parquet_row(row, 0, "x")["golden_answers"] == ["seven", "7"]
    row["reward_model"]["ground_truth"]["target"] = "seven"
    assert parquet_row(row, 0, "x") | {"metadata": None} == {
        "id": "test_4", "question": "big little lies season 2 how many episodes?", "golden_answers": ["seven"],
        "dataset": "nq", "metadata": None,
    }  # fmt: skip


def test_a_flashrag_jsonl_and_a_folder_of_both(tmp_path):
    write_jsonl(tmp_path / "nq" / "test.jsonl", [{**FLASHRAG_NQ[0], "metadata": {"supporting_doc_ids": ["d1"]}}])
    data = read_data(tmp_path / "nq" / "test.jsonl")  # FlashRAG's layout: <dataset>/<split>.jsonl
    assert data.rows == [
        {"id": "train_0", "question": "total number of death row inmates in the us", "golden_answers": ["2,718"],
         "dataset": "nq", "metadata": {"supporting_doc_ids": ["d1"]}},
    ]  # fmt: skip
    folder = tmp_path / "mixed"
    write_jsonl(folder / "hotpotqa.jsonl", FLASHRAG_HOTPOTQA)
    write_parquet(folder / "nq_search.parquet", [search_r1_row(e, i, "nq", "train") for i, e in enumerate(FLASHRAG_NQ)])
    write_jsonl(folder / "wiki_corpus.jsonl", [{"id": "w1", "title": "T", "text": "a passage"}])
    (folder / "README.txt").write_text("not data")
    (folder / "sub").mkdir()
    write_jsonl(folder / "sub" / "more.jsonl", FLASHRAG_NQ)  # subfolders are not read
    data = read_data(folder)
    assert data.files == [folder / "hotpotqa.jsonl", folder / "nq_search.parquet"]
    assert [(r["dataset"], r["id"]) for r in data.rows] == [
        ("hotpotqa", "train_0"), ("nq", "train_0"), ("nq", "train_1"),
    ]  # fmt: skip
    assert data.notes == [f"left out {folder / 'wiki_corpus.jsonl'}: not a question file"]
    eval_items = items_from_rows(data.rows, "all", limit=1)
    assert {d: [i.id for i in items] for d, items in eval_items.items()} == {"nq": ["train_0"], "hotpotqa": ["train_0"]}
    with pytest.raises(ValueError, match="no questions of popqa"):
        items_from_rows(data.rows, "nq,popqa", limit=None)


def test_bad_rows_are_skipped_with_their_row_number_and_counted(tmp_path):
    write_jsonl(tmp_path / "mine.jsonl", [
        {"id": "a", "question": "first?", "golden_answers": ["x"]},
        "",
        "{not json",
        {"id": "b", "question": "no answers?", "golden_answers": []},
        {"id": "c", "question": "  ", "golden_answers": ["y"]},
        ["a", "list"],
        {"id": "a", "question": "same id again?", "golden_answers": ["z"]},
        {"question": "no id?", "golden_answers": "one answer"},
    ])  # fmt: skip
    data = read_data(tmp_path / "mine.jsonl")
    assert [(r["id"], r["golden_answers"]) for r in data.rows] == [("a", ["x"]), ("6", ["one answer"])]
    assert [f"{s.row}: {s.kind}" for s in data.skipped] == [
        "line 3: not JSON", "line 4: no answers", "line 5: no question", "line 6: not a JSON object",
        "line 7: repeated id",
    ]  # fmt: skip
    assert str(data.skipped[-1]).endswith("line 7: repeated id ('a' of dataset 'mine', first at mine.jsonl line 1)")
    summary = data.summary()
    assert "2 questions (mine 2)" in summary
    assert "skipped 5 row(s): not JSON 1, no answers 1, no question 1, not a JSON object 1, repeated id 1" in summary
    assert len(data.report(limit=2)) == 4 and data.report(limit=2)[2] == "... and 3 more skipped row(s)"
    # a bad first row is counted like the others: only a first row that is a passage makes a corpus file
    write_jsonl(
        tmp_path / "first_bad.jsonl",
        ["[1, 2", {"question": "q?"}, {"id": "g", "question": "g?", "golden_answers": ["y"]}],
    )
    data = read_data(tmp_path / "first_bad.jsonl")
    assert [r["id"] for r in data.rows] == ["g"] and [s.row for s in data.skipped] == ["line 1", "line 2"]

    good = search_r1_row(FLASHRAG_NQ[0], 0, "nq", "train")
    no_target = search_r1_row(FLASHRAG_NQ[1], 1, "nq", "train")
    no_target["reward_model"]["ground_truth"]["target"] = []
    no_user = {**search_r1_row(FLASHRAG_NQ[1], 2, "nq", "train"), "prompt": [{"role": "system", "content": "hi"}]}
    no_user["question"] = ""
    write_parquet(tmp_path / "r1.parquet", [good, no_target, no_user])
    data = read_data(tmp_path / "r1.parquet")
    assert [r["id"] for r in data.rows] == ["train_0"]
    assert [str(s) for s in data.skipped] == [
        f"{tmp_path / 'r1.parquet'}: row 1: no answers (reward_model.ground_truth.target is missing or empty)",
        f"{tmp_path / 'r1.parquet'}: row 2: no question (no user message in prompt)",
    ]


def test_a_path_that_gives_no_questions_is_one_clear_error(tmp_path):
    cases = {
        tmp_path / "nope.parquet": "no such file or folder",
        tmp_path / "notes.txt": "not a .parquet or .jsonl file",
        tmp_path / "broken.parquet": "cannot be read as parquet",
        tmp_path / "corpus.jsonl": "not a question file",
        tmp_path / "bad.jsonl": "no usable questions; skipped 1 row(s), first: ",
        tmp_path / "empty": "no .parquet or .jsonl files",
    }
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 this is not parquet")
    write_jsonl(tmp_path / "corpus.jsonl", [{"id": "w1", "title": "T", "text": "a passage"}])
    write_jsonl(tmp_path / "bad.jsonl", [{"id": "b", "question": "q?", "golden_answers": []}])
    (tmp_path / "empty").mkdir()
    for path, message in cases.items():
        with pytest.raises(DataFileError, match="no usable" if "usable" in message else message) as info:
            read_data(path)
        assert "\n" not in str(info.value) and str(path) in str(info.value)


def _benchmark(path, n: int) -> None:
    write_jsonl(path, [{"id": f"q{i}", "question": f"q{i}?", "golden_answers": ["a"]} for i in range(n)])


def test_the_evaluation_split_holds_for_our_files_wherever_they_are_read_from(tmp_path):
    qa_dir, elsewhere = tmp_path / "qa", tmp_path / "elsewhere"
    _benchmark(qa_dir / "mydata.jsonl", EVAL_SPLIT + 5)  # ours: in the QA folder
    _benchmark(elsewhere / "nq.jsonl", EVAL_SPLIT + 3)  # ours: named for a benchmark (../shared/data/qa/nq.jsonl)
    _benchmark(elsewhere / "mine.jsonl", EVAL_SPLIT + 3)  # a user's own file: every row
    data = training_data(qa_dir / "mydata.jsonl", qa_dir)
    assert [r["id"] for r in data.rows] == [f"q{i}" for i in range(EVAL_SPLIT, EVAL_SPLIT + 5)]
    assert data.held_out == EVAL_SPLIT and "100 left out as the evaluation split" in data.summary()
    assert [r["id"] for r in training_data(elsewhere / "nq.jsonl", qa_dir).rows] == ["q100", "q101", "q102"]
    assert len(training_data(elsewhere / "mine.jsonl", qa_dir).rows) == EVAL_SPLIT + 3
    assert len(training_data(qa_dir, qa_dir).rows) == 5  # the QA folder itself: the split holds per file
    _benchmark(qa_dir / "popqa.jsonl", EVAL_SPLIT)
    with pytest.raises(DataFileError, match="no usable questions; 100 row"):
        training_data(qa_dir / "popqa.jsonl", qa_dir)
    # evaluation reads the split (the first rows) and never a training-only file
    assert [r["id"] for r in evaluation_data(elsewhere / "nq.jsonl", qa_dir).rows][:2] == ["q0", "q1"]
    _benchmark(qa_dir / "hotpotqa_train.jsonl", 3)
    with pytest.raises(DataFileError, match="training-only file"):
        evaluation_data(qa_dir / "hotpotqa_train.jsonl", qa_dir)
    assert any("training-only" in note for note in evaluation_data(qa_dir, qa_dir).notes)
    assert len(training_data(qa_dir / "hotpotqa_train.jsonl", qa_dir).rows) == 3  # training reads it whole


def test_a_run_on_its_own_data_trains_on_its_copy_with_unique_ids(tmp_path):
    rows = [search_r1_row(ex, i, "nq", "train") for i, ex in enumerate(FLASHRAG_NQ)]
    rows += [search_r1_row(ex, i, "hotpotqa", "train") for i, ex in enumerate(FLASHRAG_HOTPOTQA)]
    write_parquet(tmp_path / "train.parquet", rows)
    settings = TrainerSettings(data_dir=tmp_path / "data", qa_dir=tmp_path / "qa")
    config = RunConfig(run_id="mine", data=tmp_path / "train.parquet", questions_per_round=8)
    folder = settings.runs_dir / "mine"
    folder.mkdir(parents=True)
    write_questions(folder / QUESTIONS, training_data(config.data, settings.qa_dir).rows)
    questions = run_questions(settings, config)
    assert [q["id"] for q in questions] == ["nq/train_0", "nq/train_1", "hotpotqa/train_0"]  # train_0 twice, else
    assert {q["id"] for q in round_items(config, questions, 0)} == {q["id"] for q in questions}
    # the config names the file in its TOML, and reads back the same
    (tmp_path / "run.toml").write_text(to_toml(config))
    assert load_run_config(tmp_path / "run.toml").data == tmp_path / "train.parquet"
    with pytest.raises(ValueError, match="live runs train on served ones"):
        RunConfig(source="live", data=tmp_path / "train.parquet")


def test_the_commands_refuse_a_bad_data_path_in_one_line(tmp_path, monkeypatch):
    from services.cli.main import app

    monkeypatch.setenv("BRIDGE_DATA_DIR", str(tmp_path / "data"))
    missing = tmp_path / "missing.parquet"
    for command in (["train", "--data", str(missing), "--no-wait"], ["eval", "--data", str(missing)]):
        result = CliRunner().invoke(app, command, env={"COLUMNS": "200"})
        assert result.exit_code == 2, result.output + repr(result.exception)
        assert "no such file or folder" in result.output and "Traceback" not in result.output
    write_jsonl(tmp_path / "mine.jsonl", FLASHRAG_HOTPOTQA)
    result = CliRunner().invoke(app, ["eval", "--data", str(tmp_path / "mine.jsonl"), "--dataset", "nq"],
                                env={"COLUMNS": "200"})  # fmt: skip
    assert result.exit_code == 2 and "no questions of nq in the data (it holds mine)" in result.output
    result = CliRunner().invoke(app, ["train", "--data", "mine.jsonl", "--print-config"])
    assert result.exit_code == 0 and 'data = "' in result.output  # an absolute path, for the saved config
    assert "--data" in CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "200"}).output
