"""A new warm-start stage from a committed adapter (`--init-from`), run for real on SmolLM2-135M and a tiny pool:
the first stage writes an adapter, the second starts from its LoRA with another recipe (bridge variants) and its own
schedule, keeps its held-out questions, lists what both stages trained on, and is then continued as itself."""

from __future__ import annotations

import json
from contextlib import asynccontextmanager

import pytest
from safetensors.torch import load_file

from services.modeling.shipped import verify_adapter
from services.retriever.inprocess import InProcessRetriever
from services.trainer.warmstart.config import ReadingRecipe, WarmstartConfig
from services.trainer.warmstart.run import run_warmstart
from services.trainer.warmstart.stages import continuation

pytestmark = pytest.mark.slow  # two short trainings of the 135M policy (about a minute)

PASSAGES = [
    ("w", "Winner", "Winner is a South Korean boy group formed by YG Entertainment."),
    ("s", "2014 S/S", "2014 S/S is the debut album of the South Korean boy group Winner."),
    ("b", "Big Bang", "Big Bang is a South Korean boy band formed by YG Entertainment in 2006."),
    ("a", "Alive (album)", "Alive is an album by the boy band Big Bang, released in 2012."),
    ("k", "Kpop", "K-pop is popular music originating in South Korea."),
    ("m", "Music", "Music is the arrangement of sound."),
    ("l", "Label", "A record label is a brand of recordings."),
]


def _row(i: int, question: str, answer: str, support: list[str]) -> dict:
    return {"id": f"h{i}", "question": question, "golden_answers": [answer],
            "metadata": {"supporting_doc_ids": support}}  # fmt: skip


def _runner(tmp_path, policy_models_root):
    """A tiny training pool (5 questions after a 100-question evaluation split) and its corpus: `run(config, name,
    **kwargs)` trains on it with the real 135M into tmp_path/name."""
    qa = tmp_path / "qa"
    qa.mkdir()
    rows = [_row(i, f"Evaluation question {i}?", "x", ["k"]) for i in range(100)]  # the evaluation split
    rows += [_row(100 + i, q, a, s) for i, (q, a, s) in enumerate([
        ("2014 S/S is the debut album of a boy group formed by who?", "YG Entertainment", ["s", "w"]),
        ("Alive is an album by a band formed by which label?", "YG Entertainment", ["a", "b"]),
        ("What is Winner?", "boy group", ["w"]),
        ("What is K-pop?", "popular music", ["k"]),
        ("What is Big Bang?", "boy band", ["b"]),
    ])]  # fmt: skip
    (qa / "hotpotqa.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"id": i, "title": t, "text": x}) + "\n" for i, t, x in PASSAGES))

    @asynccontextmanager
    async def open_retriever():
        async with InProcessRetriever(tmp_path / "index", encoder_dir=policy_models_root / "all-MiniLM-L6-v2") as r:
            yield r

    def run(config: WarmstartConfig, name: str, **kwargs):
        return run_warmstart(config, qa_dir=qa, open_retriever=open_retriever, corpus=[corpus],
                             base_model_dir=policy_models_root / "SmolLM2-135M-Instruct", out=tmp_path / name,
                             command="bridge-rl warmstart (test)", state_dir=tmp_path / f"state-{name}",
                             device="cpu", **kwargs)  # fmt: skip

    return run


BASE = WarmstartConfig(datasets=["hotpotqa"], heldout=1, epochs=1.0, batch_size=2, warmup_steps=0, lr=1e-3,
                       lora_rank=2, lora_alpha=4, target_modules=["q_proj"], max_len=1024,
                       reading=ReadingRecipe(variants=1, gold_missing=0.0, candidates=6))  # fmt: skip


def test_a_stage_starts_from_the_adapter_with_another_recipe(tmp_path, policy_models_root):
    run = _runner(tmp_path, policy_models_root)
    first = run(BASE, "stage1")
    assert first["stage"] == 1 and first["version"] == f"warmstart-reading-0-step{first['training']['steps']}"

    bridged = BASE.model_copy(update={"reading": BASE.reading.model_copy(update={"bridge": 1.0})})
    with pytest.raises(ValueError, match="reading"):  # another recipe does not continue the run
        run(bridged, "refused", continue_from=tmp_path / "stage1")
    second = run(bridged, "stage2", init_from=tmp_path / "stage1")
    assert second["stage"] == 2 and second["version"] == f"warmstart-reading-0-stage2-step{second['training']['steps']}"
    assert second["initialised_from"]["version"] == first["version"] and "continued_from" not in second
    assert second["data"]["heldout_ids"] == first["data"]["heldout_ids"]
    assert second["data"]["earlier_trained_ids"] == first["data"]["trained_ids"]
    assert second["data"]["trained_ids"] == first["data"]["trained_ids"]  # the same pool, both stages
    assert second["training"]["steps"] == second["training"]["total_steps"]  # its own schedule, from step 0
    assert second["data"]["examples"]["hotpotqa"]["kinds"].get("reading-bridge", 0) >= 1
    # the stage trained on from the first stage's weights: they differ from them, and from a fresh LoRA's zeros
    a, b = (load_file(str(tmp_path / n / "adapter_model.safetensors")) for n in ("stage1", "stage2"))
    assert a.keys() == b.keys() and any((a[k] != b[k]).any() for k in a)

    # the stage is continued as itself (a new machine): its stage, what it came from and the earlier ids carry over
    plan = continuation(tmp_path / "stage2", bridged.model_copy(update={"epochs": 2.0}))
    assert plan.stage == 2 and plan.initialised_from == second["initialised_from"]
    assert plan.earlier_trained == first["data"]["trained_ids"] and plan.state["step"] == second["training"]["steps"]
    assert verify_adapter(tmp_path / "stage2")["stage"] == 2


def test_a_run_stopped_by_a_signal_still_writes_its_adapter(tmp_path, policy_models_root, monkeypatch):
    """Ctrl-C or SIGTERM mid-run: the checkpoint is written, then the adapter at that step (unfinished), as a
    --max-minutes stop does; --resume goes on from it. The signal is raised where it would land: in the middle of
    the second step (its first example's loss)."""
    from services.trainer.warmstart import sft

    run = _runner(tmp_path, policy_models_root)
    real, calls = sft.weighted_nll, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:  # step 1 took two examples; the signal arrives in step 2
            raise KeyboardInterrupt("signal 15")
        return real(*args, **kwargs)

    monkeypatch.setattr(sft, "weighted_nll", interrupted)
    manifest = run(BASE, "stopped")
    assert manifest["training"]["steps"] == 1 and manifest["training"]["finished"] is False
    assert manifest["training"]["steps"] < manifest["training"]["total_steps"]
    assert verify_adapter(tmp_path / "stopped")["version"] == "warmstart-reading-0-step1"
    monkeypatch.setattr(sft, "weighted_nll", real)
    resumed = run(BASE, "stopped", resume=True)  # the same state dir: it goes on from step 1 to the end
    assert resumed["training"]["steps"] == resumed["training"]["total_steps"] > 1
