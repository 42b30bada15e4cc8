"""A round trains only on rollouts from the run's own versions: requested pinned, and anything else refused."""

from __future__ import annotations

import pytest

from services.common.schemas.policy import RolloutResponse, SearchStep, TrajectoryRecord, TurnRecord
from services.trainer.collect import run_versions
from services.trainer.rollout import VersionMismatch, check_versions, request_rollouts
from services.trainer.run_state import Published, RunConfig, RunState


def record(policy: str, retrievers: list[str]) -> TrajectoryRecord:
    turns = [
        TurnRecord(
            generated_ids=[1],
            generated_logprobs=[-0.1],
            text="x",
            search=SearchStep(
                turn=n,
                query="q",
                candidates=[],
                chosen_ids=[],
                mode="sample",
                temperature=0.05,
                retriever_version=version,
            ),
        )  # fmt: skip
        for n, version in enumerate(retrievers)
    ]
    return TrajectoryRecord(id=f"t-{policy}-{'-'.join(retrievers)}", question="q", prompt="p", prompt_ids=[0],
                            turns=turns, answer=None, policy_version=policy,
                            retriever_version=retrievers[-1] if retrievers else "base", created_at=0.0)  # fmt: skip


def test_records_of_other_versions_are_refused():
    check_versions([record("run-r0-policy", ["run-r0-retriever"] * 2), record("run-r0-policy", [])],
                   "run-r0-policy", "run-r0-retriever")  # fmt: skip
    for wrong in (record("base", ["run-r0-retriever"]), record("run-r0-policy", ["run-r0-retriever", "base"])):
        with pytest.raises(VersionMismatch, match="not from the run's policy"):
            check_versions([wrong], "run-r0-policy", "run-r0-retriever")


class RecordingClient:
    def __init__(self) -> None:
        self.requests = []

    def rollouts(self, request):
        self.requests.append(request)
        return RolloutResponse(trajectories=[])


def test_rollouts_are_requested_at_the_runs_versions():
    state = RunState(config=RunConfig(run_id="run"), lam=0.02)
    assert run_versions(state) == ("base", "base")
    state.published.append(Published(round=0, retriever_version="run-r0-retriever", policy_version="run-r0-policy"))
    state.policy_version, state.retriever_version = "run-r0-policy", "run-r0-retriever"
    client = RecordingClient()
    items = [{"id": "q1", "question": "q?", "golden_answers": ["a"]}]
    request_rollouts(client, state.config, items, 1, versions=run_versions(state))
    sent = client.requests[0]
    assert (sent.policy_version, sent.retriever_version) == ("run-r0-policy", "run-r0-retriever")
