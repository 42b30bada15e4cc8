"""The warm start's training loop: the answer-weighted loss (by hand, and with logits only where they are needed),
the order over variants, and resume: a run stopped and resumed ends where an unbroken run ends."""

from __future__ import annotations

import math

import pytest
import torch

from services.trainer.device import Placement
from services.trainer.warmstart.config import WarmstartConfig
from services.trainer.warmstart.examples import SFTExample
from services.trainer.warmstart.sft import (
    SFTState,
    checkpoint_folder,
    lr_factor,
    token_weights,
    train,
    training_order,
    weighted_nll,
)

CPU = Placement.resolve("cpu", cpu_bf16=False)


def _example(i: int, length: int = 12, variant: int = 0) -> SFTExample:
    g = torch.Generator().manual_seed(i)
    ids = torch.randint(0, 64, (length,), generator=g).tolist()
    loss_mask = [0] * (length // 2) + [1] * (length - length // 2)
    answer_mask = [0] * (length - 3) + [1, 1, 0]
    return SFTExample(id=f"q{i}", dataset="nq", input_ids=ids, loss_mask=loss_mask, answer_mask=answer_mask,
                      kind="reading", variant=variant, searches=["q"], answer="a", answer_shown=True)  # fmt: skip


def _tiny_model(lora_seed: int = 0):
    """The same base every time (a pretrained model loads the same weights); the LoRA's init from `lora_seed`."""
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    model = LlamaForCausalLM(config)
    torch.manual_seed(lora_seed)
    lora = LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM", init_lora_weights=False
    )
    return get_peft_model(model, lora)


def test_answer_tokens_weigh_one_and_the_template_its_weight():
    e = _example(0)
    w = token_weights(e, 0.1)
    assert w[:6] == [0.0] * 6  # the prompt and observations: never
    assert w[6:9] == pytest.approx([0.1] * 3) and w[9:11] == [1.0, 1.0] and w[11] == pytest.approx(0.1)
    assert token_weights(e, 1.0) == [float(m) for m in e.loss_mask]  # weight 1: the plain agent-token loss
    assert token_weights(e.model_copy(update={"answer_mask": None}), 0.1) == [float(m) for m in e.loss_mask]


def test_weighted_nll_equals_the_full_logits_computation():
    model = _tiny_model()
    e = _example(1)
    w = token_weights(e, 0.25)
    loss, total = weighted_nll(model, e.input_ids, w, CPU)
    ids = torch.tensor([e.input_ids])
    logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1], -1)  # (T-1, V): every position
    nll = -logps.gather(-1, ids[0, 1:, None]).squeeze(-1)
    expected = (nll * torch.tensor(w[1:])).sum()
    assert torch.isclose(loss, expected, atol=1e-5) and math.isclose(float(total), sum(w[1:]), rel_tol=1e-6)
    loss.backward()  # the gradient reaches the LoRA through the kept logits
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters() if p.requires_grad)


def test_each_epoch_visits_every_question_once_with_its_next_variant():
    groups = [[_example(i, variant=v) for v in range(2)] for i in range(5)]
    order = training_order(groups, 2, seed=0)
    assert len(order) == 10 and order == training_order(groups, 2, seed=0)
    first, second = order[:5], order[5:]
    assert sorted(e.id for e in first) == sorted(e.id for e in second) == [f"q{i}" for i in range(5)]
    assert {e.variant for e in first} == {0} and {e.variant for e in second} == {1}
    assert len(training_order(groups, 0.6, seed=0)) == 3


def test_the_schedule_warms_up_then_decays_to_a_tenth():
    assert lr_factor(0, 4, 100) == pytest.approx(0.2) and lr_factor(4, 4, 100) == pytest.approx(1.0)
    assert lr_factor(100, 4, 100) == pytest.approx(0.1) and lr_factor(500, 4, 100) == pytest.approx(0.1)


def test_a_resumed_run_ends_where_an_unbroken_run_ends(tmp_path):
    groups = [[_example(i, length=10 + i % 5)] for i in range(12)]
    heldout = [_example(99)]
    config = WarmstartConfig(epochs=1.0, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=2, seed=0)

    unbroken = _tiny_model()
    state = train(unbroken, groups, heldout, config, CPU, tmp_path / "a")
    assert state.done and state.step == 6 and len(state.sessions) == 1

    # the same run, stopped after its first step (a time budget of ~0), then resumed twice from its checkpoint
    stopped = config.model_copy(update={"max_minutes": 1e-9})
    first = train(_tiny_model(), groups, heldout, stopped, CPU, tmp_path / "b")
    assert first.step == 1 and not first.done and checkpoint_folder(tmp_path / "b") is not None
    resumed = _tiny_model(lora_seed=123)  # other random LoRA weights: the checkpoint must replace them
    second = train(resumed, groups, heldout, stopped, CPU, tmp_path / "b", resume=True)
    assert second.step == 2
    final = train(resumed, groups, heldout, config, CPU, tmp_path / "b", resume=True)
    assert final.done and final.examples_seen == state.examples_seen == 12
    assert [s["to"] for s in final.sessions] == [1, 2, 6]
    assert [c["loss"] for c in final.curve] == pytest.approx([c["loss"] for c in state.curve], rel=1e-4)
    for (name, a), b in zip(unbroken.named_parameters(), resumed.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-5), name
    saved = SFTState.model_validate_json((checkpoint_folder(tmp_path / "b") / "state.json").read_text())
    assert saved.step == 6 and saved.heldout[-1]["step"] == 6


def test_a_checkpoint_from_another_plan_is_refused(tmp_path):
    groups = [[_example(i)] for i in range(4)]
    config = WarmstartConfig(epochs=1.0, batch_size=2, heldout=0, max_minutes=1e-9)
    train(_tiny_model(), groups, [], config, CPU, tmp_path)
    with pytest.raises(ValueError, match="planned 2 steps"):
        train(_tiny_model(), groups, [], config.model_copy(update={"batch_size": 1}), CPU, tmp_path, resume=True)


def test_a_resumed_run_must_keep_its_settings(tmp_path):
    from services.trainer.warmstart.config import resumable_config
    from services.trainer.warmstart.sft import write_state_files

    config = WarmstartConfig(max_minutes=30)
    write_state_files(tmp_path, config, [_example(0)])
    resumable_config(tmp_path, config.model_copy(update={"max_minutes": 90}))  # the time budget may change
    with pytest.raises(ValueError, match="template_weight"):
        resumable_config(tmp_path, config.model_copy(update={"template_weight": 0.5}))


def test_sigterm_checkpoints_before_the_run_stops(tmp_path):
    import os
    import signal
    import threading

    groups = [[_example(i)] for i in range(2000)]
    config = WarmstartConfig(epochs=1.0, batch_size=1, heldout=0)
    model = _tiny_model()
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        train(model, groups, [], config, CPU, tmp_path, save_every_s=1e9)  # no timed save: only the signal's
    timer.join()
    saved = SFTState.model_validate_json((checkpoint_folder(tmp_path) / "state.json").read_text())
    assert 0 < saved.step < 2000
    assert signal.getsignal(signal.SIGTERM) is not None  # the previous handler is back


def test_a_restart_warms_up_again_onto_the_schedule_where_it_stands():
    assert lr_factor(40, 4, 100, restarted_at=40) == pytest.approx(lr_factor(40, 4, 100) / 5)
    assert lr_factor(43, 4, 100, restarted_at=40) == pytest.approx(lr_factor(43, 4, 100) * 4 / 5)
    assert lr_factor(44, 4, 100, restarted_at=40) == pytest.approx(lr_factor(44, 4, 100))


def test_a_run_continued_from_its_adapter_goes_on_at_its_step_in_the_same_order(tmp_path):
    from services.trainer.warmstart.sft import trainable_state

    groups = [[_example(i, length=10 + i % 5)] for i in range(12)]
    heldout = [_example(99)]
    config = WarmstartConfig(epochs=1.0, batch_size=2, lr=1e-2, warmup_steps=1, eval_every=2, seed=0)
    unbroken = train(_tiny_model(), groups, heldout, config, CPU, tmp_path / "a")

    # a session stops after one step and its machine is lost: only the adapter (the LoRA and the counts) survives
    stopped_model = _tiny_model()
    stopped = train(stopped_model, groups, heldout, config.model_copy(update={"max_minutes": 1e-9}), CPU,
                    tmp_path / "b")  # fmt: skip
    adapter = trainable_state(stopped_model)
    model = _tiny_model(lora_seed=123)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in adapter:
                p.copy_(adapter[name])
    carried = SFTState(step=stopped.step, total_steps=stopped.total_steps, examples_seen=stopped.examples_seen,
                       tokens_seen=stopped.tokens_seen, heldout=stopped.heldout, sessions=stopped.sessions)  # fmt: skip
    final = train(model, groups, heldout, config, CPU, tmp_path / "c", continued=carried)

    assert final.done and final.restarted_at == 1 and final.examples_seen == 12
    assert [s["to"] for s in final.sessions] == [1, 6]
    # the first step after the restart trains the batch an unbroken run trains there, from the same weights
    assert final.curve[0]["step"] == 2 and final.curve[0]["loss"] == pytest.approx(unbroken.curve[1]["loss"], rel=1e-5)
    assert final.tokens_seen == unbroken.tokens_seen
    with pytest.raises(ValueError, match="past this config"):
        train(_tiny_model(), groups[:2], [], config, CPU, tmp_path / "d", continued=carried.model_copy(
            update={"step": 5}))  # fmt: skip
