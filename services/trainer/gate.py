"""The promotion gate: before a round's checkpoints are activated, the candidate pair (the round's retriever and
policy, each falling back on the serving one when the round trained none) and the serving pair (the run's last
accepted) answer the same canary questions through the services, their versions pinned, near-greedy; the rule in
the run config (`gate`) decides.

A rejected round's checkpoints stay registered on both services and are never activated. The run goes on from its
last accepted state: the next round starts from the serving weights, the optimizer state saved with them and their
lambda (the rejected round's optimizer state is left in its round folder, unused). The rejected round's
trajectories are acknowledged as used: they came from the serving pair, which goes on serving, so nothing they
stood for is lost, and the next round draws its own questions."""

from __future__ import annotations

import time
from pathlib import Path

from pydantic import BaseModel

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.schemas.policy import MAX_ROLLOUT_ITEMS, RolloutItem, RolloutRequest
from services.eval.stats import sign_test
from services.trainer.round_files import canary_questions
from services.trainer.run_state import GateConfig, RunConfig
from services.trainer.settings import TrainerSettings

# The rollouts route samples; this close to 0 every step takes the most likely token, and the seed is fixed.
CANARY_TEMPERATURE = 1e-3
CANARY_SEED = 0
GATE_FILE = "gate.json"


class GateDecision(BaseModel):
    accepted: bool
    reason: str
    serving: tuple[str, str]  # (policy, retriever)
    candidate: tuple[str, str]
    canary: int
    em_serving: float
    em_candidate: float
    logprob_serving: float | None = None
    logprob_candidate: float | None = None
    better: int
    worse: int
    p: float
    seconds: float

    def row(self) -> dict[str, float | str]:
        """The decision as a round's metrics row has it."""
        logprobs = (
            {}
            if self.logprob_serving is None
            else {"gate/logprob_serving": self.logprob_serving, "gate/logprob_candidate": self.logprob_candidate}
        )
        return {"gate/accepted": float(self.accepted), "gate/em_serving": self.em_serving,
                "gate/em_candidate": self.em_candidate, **logprobs, "gate/p": self.p, "gate/seconds": self.seconds,
                "gate/reason": self.reason}  # fmt: skip


def canary_answers(
    client: PolicyClient, config: RunConfig, items: list[dict], policy: str, retriever: str
) -> dict[str, tuple[float, str]]:
    """Each canary question's EM, answered by (policy, retriever) pinned, near-greedy, greedy retrieval (top-k of
    top-k candidates). Tagged outside the run's own tags, so the run's consumer group drops the trajectories."""
    scores: dict[str, tuple[float, str]] = {}
    for start in range(0, len(items), MAX_ROLLOUT_ITEMS):
        chunk = items[start : start + MAX_ROLLOUT_ITEMS]
        request = RolloutRequest(
            items=[RolloutItem(id=str(i["id"]), question=i["question"], golden_answers=i["golden_answers"])
                   for i in chunk],
            group_size=1, temperature=CANARY_TEMPERATURE, seed=CANARY_SEED, max_turns=config.max_turns,
            top_k=config.top_k, candidates=config.top_k, retrieval_temperature=config.retrieval_temperature,
            run_id=f"canary:{config.run_id}", initial_search=config.initial_search, reward="em",
            policy_version=policy, retriever_version=retriever,
        )  # fmt: skip
        scores.update({t.item_id: (t.em, t.trajectory_id) for t in client.rollouts(request).trajectories})
    return scores


def gold_logprob(
    client: PolicyClient, answers: dict[str, tuple[float, str]], policy: tuple[Path, Path | None]
) -> float:
    """The mean log pi(y* | the canary question, the passages its own searches showed) under `policy` (the base
    folder and its LoRA adapter, None for the base), in-process (services/eval/logprob.py)."""
    from services.eval.logprob import answer_logprobs, inputs_from_records, load_policy

    loaded = load_policy(*policy, device="cpu")
    records = [("canary", client.trajectory(tid).model_dump(mode="json")) for _, tid in answers.values()]
    scored = answer_logprobs(None, inputs_from_records(records, loaded[0]), policy=loaded, progress=False)
    return sum(s.logprob for s in scored) / len(scored)


def decide(
    serving: dict[str, float],
    candidate: dict[str, float],
    gate: GateConfig,
    logprobs: tuple[float, float] | None = None,
) -> tuple[bool, str, dict]:
    """(accepted, why, the numbers): rejected when the candidate's canary EM is more than `max_em_drop` below the
    serving pair's, when it answers worse question by question (sign test, p < `alpha`), or when its mean gold
    log-probability (`logprobs`: serving's, candidate's) is more than `max_logprob_drop` nats below."""
    ids = sorted(serving)
    before, after = [serving[i] for i in ids], [candidate[i] for i in ids]
    test = sign_test(before, after)
    em_before, em_after = sum(before) / len(before), sum(after) / len(after)
    numbers = {"em_serving": em_before, "em_candidate": em_after, "better": test.better, "worse": test.worse,
               "p": test.p}  # fmt: skip
    if logprobs is not None:
        numbers.update(logprob_serving=logprobs[0], logprob_candidate=logprobs[1])
    if em_before - em_after > gate.max_em_drop:
        return False, (f"canary EM {em_after:.3f} is {em_before - em_after:.3f} below the serving pair's "
                       f"{em_before:.3f} (max_em_drop {gate.max_em_drop})"), numbers  # fmt: skip
    if test.worse > test.better and test.p < gate.alpha:
        return False, (f"the candidate answers the canary worse: +{test.better}/-{test.worse}, sign test "
                       f"p = {test.p:.3g} < alpha {gate.alpha}"), numbers  # fmt: skip
    fell = None if logprobs is None else logprobs[0] - logprobs[1]
    if fell is not None and gate.max_logprob_drop is not None and fell > gate.max_logprob_drop:
        return False, (f"the gold answer's log-probability fell {fell:.2f} nats on the canary ({logprobs[1]:.2f} "
                       f"against {logprobs[0]:.2f}; max_logprob_drop {gate.max_logprob_drop})"), numbers  # fmt: skip
    why = f"canary EM {em_after:.3f} against the serving pair's {em_before:.3f} (+{test.better}/-{test.worse})"
    return True, why, numbers


class PairScores(BaseModel):
    em: dict[str, float]
    logprob: float | None = None


def score_pair(client: PolicyClient, config: RunConfig, items: list[dict], pair: tuple[str, str],
               weights: tuple[Path, Path | None]) -> PairScores:  # fmt: skip
    answers = canary_answers(client, config, items, *pair)
    logprob = gold_logprob(client, answers, weights) if config.gate.max_logprob_drop is not None else None
    return PairScores(em={item: em for item, (em, _) in answers.items()}, logprob=logprob)


def serving_scores(client: PolicyClient, run_dir: Path, config: RunConfig, items: list[dict],
                   serving: tuple[str, str], weights: tuple[Path, Path | None]) -> PairScores:  # fmt: skip
    """The serving pair's canary scores, measured once per pair (it stays the same across rejected rounds)."""
    path = run_dir / "canary" / f"{serving[0]}__{serving[1]}.json"
    if path.exists():
        return PairScores.model_validate_json(path.read_text())
    scores = score_pair(client, config, items, serving, weights)
    path.parent.mkdir(exist_ok=True)
    write_json_atomic(path, scores.model_dump(mode="json"))
    return scores


def judge(settings: TrainerSettings, config: RunConfig, folder: Path, serving: tuple[str, str],
          candidate: tuple[str, str], weights: dict[str, Path | None] | None = None) -> GateDecision:  # fmt: skip
    """The round's decision, once (kept in <round>/gate.json, so a redelivered publish decides the same).
    `weights`: the serving and the candidate policy's LoRA folders (None: the base), for the gold log-prob."""
    path = folder / GATE_FILE
    if path.exists():
        return GateDecision.model_validate_json(path.read_text())
    started = time.monotonic()
    items = canary_questions(settings, config)
    weights = weights or {}
    base = settings.base_policy_dir
    with PolicyClient(settings.policy_url, settings.services_admin_token(), settings.task_time_limit_s) as client:
        before = serving_scores(client, folder.parent, config, items, serving, (base, weights.get("serving")))
        after = score_pair(client, config, items, candidate, (base, weights.get("candidate")))
    logprobs = None if before.logprob is None or after.logprob is None else (before.logprob, after.logprob)
    accepted, reason, numbers = decide(before.em, after.em, config.gate, logprobs)
    decision = GateDecision(accepted=accepted, reason=reason, serving=serving, candidate=candidate,
                            canary=len(items), seconds=round(time.monotonic() - started, 2), **numbers)  # fmt: skip
    write_json_atomic(path, decision.model_dump(mode="json"))
    return decision
