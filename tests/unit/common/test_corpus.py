"""Corpus files in both layouts: ours ({id, title, text}) and Search-R1's wiki-18 ({id, contents}, the title on
the first line of `contents`, usually in double quotes)."""

from __future__ import annotations

import json

import pytest

from services.common.corpus import read_documents


def write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_search_r1_contents_rows_split_into_title_and_text(tmp_path):
    corpus = write(tmp_path / "wiki-18.jsonl", [
        {"id": "0", "contents": "\"Aaron\"\nAaron is a prophet, high priest, and the brother of Moses."},
        {"id": 1, "contents": "Unquoted title\nfirst line\nsecond line"},
        {"id": "2", "contents": "\"\"Weird\" quoting\"\ntext"},
    ])  # fmt: skip
    docs = list(read_documents(corpus))
    assert [(d.id, d.title, d.text) for d in docs] == [
        ("0", "Aaron", "Aaron is a prophet, high priest, and the brother of Moses."),
        ("1", "Unquoted title", "first line\nsecond line"),
        ("2", '"Weird" quoting', "text"),
    ]


def test_our_layout_and_search_r1_rows_mix_in_one_file(tmp_path):
    corpus = write(tmp_path / "mixed.jsonl", [
        {"id": "a", "title": "Paris", "text": "Paris is the capital of France."},
        {"id": "b", "contents": "\"Lyon\"\nLyon is a city in France."},
    ])  # fmt: skip
    assert [(d.title, d.text) for d in read_documents(corpus)] == [
        ("Paris", "Paris is the capital of France."),
        ("Lyon", "Lyon is a city in France."),
    ]


def test_a_contents_row_without_a_title_line_keeps_its_text(tmp_path):
    corpus = write(tmp_path / "untitled.jsonl", [{"id": "0", "contents": "just a passage"}])
    assert [(d.title, d.text) for d in read_documents(corpus)] == [("", "just a passage")]


def test_a_row_with_neither_layout_is_refused_with_its_line(tmp_path):
    corpus = write(tmp_path / "bad.jsonl", [{"id": "0", "title": "t", "text": "x"}, {"id": "1", "body": "?"}])
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not a corpus line"):
        list(read_documents(corpus))
