"""bench.policy_step hands TRL the same trajectories: prompt up to the first generated token (left-padded), the rest
as the completion (right-padded), the retrieved tokens masked by TRL's tool_mask, each record's own advantage."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from bench.policy_step import trained_records, trl_inputs


def record(ids: list[int], generated: list[int]) -> SimpleNamespace:
    turns = [SimpleNamespace(generated_ids=[i for i, g in zip(ids, generated, strict=True) if g])]
    return SimpleNamespace(token_ids=ids, generated_mask=generated, turns=turns)


def test_trl_inputs_rebuild_each_trajectory_and_mask_what_the_policy_did_not_write():
    a = record([1, 2, 3, 4, 5, 6, 7], [0, 0, 1, 0, 0, 1, 1])  # prompt 2, then search, retrieved 2, answer 2
    b = record([8, 9, 10, 11], [0, 0, 0, 1])
    silent = record([12, 13], [0, 0])  # nothing generated: no policy gradient, as policy_step skips it
    batch = SimpleNamespace(records=[a, silent, b], advantages=torch.tensor([0.5, 0.0, -0.5]))
    assert trained_records(batch) == [a, b]
    inputs = trl_inputs(batch, pad=0)
    assert inputs["prompt_ids"].tolist() == [[0, 1, 2], [8, 9, 10]]
    assert inputs["prompt_mask"].tolist() == [[0, 1, 1], [1, 1, 1]]
    assert inputs["completion_ids"].tolist() == [[3, 4, 5, 6, 7], [11, 0, 0, 0, 0]]
    assert inputs["completion_mask"].tolist() == [[1, 1, 1, 1, 1], [1, 0, 0, 0, 0]]
    assert inputs["tool_mask"].tolist() == [[1, 0, 0, 1, 1], [1, 0, 0, 0, 0]]
    assert inputs["advantages"].tolist() == [0.5, -0.5]
    for row, r in enumerate([a, b]):  # the sequence TRL forwards is the trajectory itself
        ids = torch.cat([inputs["prompt_ids"][row], inputs["completion_ids"][row]])
        mask = torch.cat([inputs["prompt_mask"][row], inputs["completion_mask"][row]]).bool()
        assert ids[mask].tolist() == r.token_ids
