"""`bridge-rl ingest` on a corpus in Search-R1's wiki-18 layout (`{"id", "contents": "\"Title\"\ntext"}`): every
row is ingested by the real retriever service and found by a search, title and text apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from services.common.clients.retriever import RetrieverClient
from tests.conftest import REPO

pytestmark = pytest.mark.slow

WIKI_18_SAMPLE = [
    {"id": "0", "contents": "\"Aaron\"\nAaron is a prophet, high priest, and the brother of Moses in the "
                            "Abrahamic religions. Knowledge of Aaron comes exclusively from religious texts."},
    {"id": "1", "contents": "\"Kelvin\"\nThe kelvin is the base unit of temperature in the International System "
                            "of Units; water boils at 373.15 kelvin at sea level."},
    {"id": "2", "contents": "\"Vienna State Opera\"\nThe Vienna State Opera is an opera house in Vienna, Austria; "
                            "it opened in 1869 with Mozart's Don Giovanni."},
]  # fmt: skip


def test_search_r1_corpus_is_ingested_by_the_cli_and_found(retriever_factory, tmp_path):
    service = retriever_factory("search-r1-corpus")
    corpus = tmp_path / "wiki-18-sample.jsonl"
    corpus.write_text("".join(json.dumps(row) + "\n" for row in WIKI_18_SAMPLE))
    env = {k: v for k, v in os.environ.items() if k != "BRIDGE_ADMIN_TOKEN"}
    env["BRIDGE_DATA_DIR"] = str(tmp_path / "client-home")  # another host: no token file there
    run = subprocess.run(
        [sys.executable, "-m", "services.cli.main", "ingest", str(corpus), "--url", service.url,
         "--token", service.token],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["documents"] == 3 and report["upserted"] == 3
    with RetrieverClient(service.url, admin_token=service.token) as client:
        result = client.search(["Who was the brother of Moses?"], top_k=1).results[0]
        assert result.docs[0].id == "0" and result.docs[0].title == "Aaron"
        assert result.docs[0].text.startswith("Aaron is a prophet")
        assert client.search(["boiling point of water in kelvin"], top_k=1).results[0].docs[0].id == "1"
