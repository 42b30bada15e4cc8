"""The swap experiment's two halves: an arm's LoRA adapter exported as a checkpoint the service's encoder loads
(the merged tower encodes as the trained one does, and not as the start), and two eval runs paired per question."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from experiments.swap_em import TOWER, compare, export, markdown
from services.common.checkpoints import load_manifest
from services.eval.scoring import ItemResult
from services.modeling.encoder import SentenceEncoder
from services.trainer.models import RETRIEVER_LORA_FILE, RetrieverModel

QUERIES = ["who wrote the iliad", "capital of australia"]


def test_an_exported_lora_arm_encodes_in_the_service_as_it_trained(models_root, tmp_path):
    base = models_root / "all-MiniLM-L6-v2"
    trained = RetrieverModel(base, None, params="lora")
    with torch.no_grad():  # a trained adapter: B moved off zero
        for name, param in trained.query.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(name)))
    arm = tmp_path / "arm"
    arm.mkdir()
    trained.save_trained(arm, TOWER)
    assert (arm / RETRIEVER_LORA_FILE).exists() and not (arm / TOWER).exists()

    folder = export(arm, tmp_path / "checkpoints", "swapped", base)
    _, manifest = load_manifest(tmp_path / "checkpoints", "swapped")  # verifies every file's sha256
    assert manifest.version == "swapped" and manifest.kind == "retriever-query"
    served = SentenceEncoder.from_pretrained(base, dtype="float32")
    start = served.encode(QUERIES)
    served.load_weights(folder / TOWER)  # what the service's loader does with the active checkpoint
    np.testing.assert_allclose(served.encode(QUERIES), trained.query.encode(QUERIES), atol=1e-5)
    assert np.abs(served.encode(QUERIES) - start).max() > 1e-3


def test_an_arm_without_a_tower_is_refused(models_root, tmp_path):
    with pytest.raises(FileNotFoundError, match="run the arm first"):
        export(tmp_path, tmp_path / "checkpoints", "v", models_root / "all-MiniLM-L6-v2")


def result(dataset: str, qid: str, em: float, recall: float | None, *, mode="agent", error=None) -> ItemResult:
    return ItemResult(dataset=dataset, mode=mode, id=qid, question=qid, golden_answers=["a"], answer="a", em=em,
                      f1=em, recall=recall, retrieved_ids=[], searches=1, latency_s=0.1, error=error)  # fmt: skip


def test_compare_pairs_questions_per_dataset_and_pooled():
    before = [result("2wiki", "1", 0, 0.5), result("2wiki", "2", 1, 1.0), result("2wiki", "3", 0, 0.0),
              result("hotpot", "1", 0, None), result("hotpot", "1", 1, 0.5, mode="oracle"),
              result("hotpot", "9", 1, 1.0)]  # fmt: skip
    after = [result("2wiki", "1", 1, 1.0), result("2wiki", "2", 1, 1.0), result("2wiki", "3", 1, 0.5),
             result("hotpot", "1", 1, 0.5, error="timeout")]  # fmt: skip
    rows = compare(before, after)
    assert rows["2wiki"]["n"] == 3 and rows["hotpot"]["n"] == 1 and rows["pooled"]["n"] == 4  # hotpot 9: unpaired
    assert rows["2wiki"]["em"]["before"] == pytest.approx(1 / 3) and rows["2wiki"]["em"]["after"] == 1.0
    assert rows["2wiki"]["em"]["sign"] == {"better": 2, "worse": 0, "ties": 1, "p": 0.5}
    assert rows["2wiki"]["recall"]["after"] == pytest.approx(2.5 / 3)
    # A failed question scores 0 (as the eval counts it); the oracle row is not the agent's answer.
    assert rows["hotpot"]["em"]["before"] == 0 and rows["hotpot"]["em"]["after"] == 0
    assert rows["pooled"]["em"]["sign"]["better"] == 2
    assert "| 2wiki | 3 | 0.333 → 1.000 | +2/−0 (p = 0.5)" in markdown(rows)


def test_compare_refuses_runs_with_no_question_in_common():
    with pytest.raises(ValueError, match="share no"):
        compare([result("a", "1", 1, 1.0)], [result("a", "2", 1, 1.0)])
