"""The gold answer's log-probability: the context/answer construction by hand, and the batched forward against
one row at a time on the tiny prepared SmolLM2."""

from __future__ import annotations

import pytest

from services.eval.logprob import LogprobInput, answer_context, answer_logprobs, gold_continuation


def test_context_stops_at_the_last_answer_tag():
    generated = "<search> x </search><information>d</information><answer> Rome </answer>"
    assert answer_context("P:", generated) == "P:<search> x </search><information>d</information><answer>"
    assert answer_context("P:", "<answer> a </answer> then <answer> b") == "P:<answer> a </answer> then <answer>"
    assert answer_context("P:", "<search> x </search>") == "P:<search> x </search><answer>"  # never answered
    assert gold_continuation("  Paris ") == " Paris </answer>"


def test_batched_logprob_matches_one_row_at_a_time(policy_models_root):
    import torch

    from services.eval.logprob import load_policy
    from services.modeling.tokens import split_ids

    policy = load_policy(policy_models_root / "SmolLM2-135M-Instruct", device="cpu")
    rows = [
        LogprobInput(dataset="d", id="short", context="Q: France?<answer>", answer=gold_continuation("Paris")),
        LogprobInput(dataset="d", id="long", context="Q: who wrote Hamlet? <information>Doc 1: Hamlet is a play by "
                     "William Shakespeare.</information><answer>", answer=gold_continuation("William Shakespeare")),
    ]  # fmt: skip
    batched = answer_logprobs(None, rows, batch_size=2, policy=policy, progress=False)
    tokenizer, model = policy
    for row, result in zip(rows, batched, strict=True):
        context_ids, answer_ids = split_ids(tokenizer, row.context, row.answer)
        ids = torch.tensor([context_ids + answer_ids])
        with torch.no_grad():
            logps = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        expected = logps[len(context_ids) - 1 :].gather(1, ids[0, len(context_ids) :, None]).sum()
        assert (result.id, result.tokens) == (row.id, len(answer_ids))
        assert result.logprob == pytest.approx(float(expected), abs=1e-3) and result.logprob < 0
