"""Rollback from served traffic: a live run keeps, per policy version, the rewards users gave its answers (each
feedback entry counted once, when the run's consumer group first reads it), and once the newest accepted version
and the one before it both have `rollback.window` of them, tests whether the newest earns less: a one-sided Welch
test, at most `rollback.looks` times per version, each at alpha / looks, so that a version that serves as well as
its predecessor is rolled back with probability at most alpha over its whole watch (Bonferroni over the looks).

A significant drop activates the previous accepted pair on both services (retriever first, as publish does), moves
the run's state back to it (weights, optimizer state), pauses the run and says why (state.json `error`, the log,
`bridge-rl train`'s exit). `bridge-rl train --run-id ID --resume` goes on from the previous pair."""

from __future__ import annotations

import logging
from pathlib import Path

from pydantic import BaseModel

from services.common.checkpoints import write_json_atomic
from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.common.registry import BASE_VERSION
from services.eval.stats import welch_lower_p
from services.trainer.round_files import OPTIMIZER_DIR, round_dir
from services.trainer.run_state import HeldBack, RunState
from services.trainer.settings import TrainerSettings

log = logging.getLogger(__name__)
FEEDBACK_FILE = "feedback.json"


class VersionFeedback(BaseModel):
    n: int = 0
    total: float = 0.0
    squares: float = 0.0
    looks: int = 0

    def add(self, reward: float) -> None:
        self.n, self.total, self.squares = self.n + 1, self.total + reward, self.squares + reward * reward

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else 0.0

    def sample(self) -> tuple[int, float, float]:
        """(n, mean, variance with n - 1)."""
        variance = (self.squares - self.n * self.mean**2) / (self.n - 1) if self.n > 1 else 0.0
        return self.n, self.mean, max(variance, 0.0)


class FeedbackBook(BaseModel):
    versions: dict[str, VersionFeedback] = {}

    @classmethod
    def load(cls, run_dir: Path) -> FeedbackBook:
        path = run_dir / FEEDBACK_FILE
        return cls.model_validate_json(path.read_text()) if path.exists() else cls()

    def save(self, run_dir: Path) -> None:
        write_json_atomic(run_dir / FEEDBACK_FILE, self.model_dump(mode="json"))

    def add(self, feedback: list[tuple[str, float]]) -> None:
        for version, reward in feedback:
            self.versions.setdefault(version, VersionFeedback()).add(reward)


class Pair(BaseModel):
    """An accepted (policy, retriever) pair and the round that published it (None: what the run started from)."""

    policy: str
    retriever: str
    round: int | None


def accepted_pairs(state: RunState) -> list[Pair]:
    """The pairs the run made live, oldest first, less those rolled back."""
    undone = {r.round for r in state.rolled_back}
    pairs = [Pair(policy=state.initial_policy_version, retriever=state.initial_retriever_version, round=None)]
    for published in state.published:
        if published.round in undone:
            continue
        last = pairs[-1]
        pairs.append(Pair(policy=published.policy_version or last.policy,
                          retriever=published.retriever_version or last.retriever, round=published.round))  # fmt: skip
    return pairs


def watch(settings: TrainerSettings, state: RunState, feedback: list[tuple[str, float]]) -> str | None:
    """Count `feedback`, then test the newest accepted policy against its predecessor; on a significant drop,
    roll back and pause. Returns the reason when it rolled back."""
    config = state.config.rollback
    run_dir = settings.runs_dir / state.config.run_id
    book = FeedbackBook.load(run_dir)
    book.add(feedback)
    reason = None
    pairs = accepted_pairs(state)
    if config.window and len(pairs) > 1 and pairs[-1].policy != pairs[-2].policy:
        new, old = pairs[-1], pairs[-2]
        after, before = book.versions.get(new.policy), book.versions.get(old.policy)
        if after and before and min(after.n, before.n) >= config.window and after.looks < config.looks:
            after.looks += 1
            p = welch_lower_p(before.sample(), after.sample())
            if p < config.alpha / config.looks:
                reason = (
                    f"policy {new.policy} earned reward {after.mean:.3f} over {after.n} answers, against "
                    f"{before.mean:.3f} over {before.n} for {old.policy} (one-sided Welch p = {p:.3g} < "
                    f"{config.alpha} / {config.looks}): rolled back to {old.policy} + {old.retriever}"
                )
    book.save(run_dir)
    if reason is not None:
        roll_back(settings, state, pairs[-1], pairs[-2], reason)
    return reason


def roll_back(settings: TrainerSettings, state: RunState, bad: Pair, good: Pair, reason: str) -> None:
    token = settings.services_admin_token()
    with RetrieverClient(settings.retriever_url, admin_token=token, timeout=600) as client:
        client.activate(good.retriever)
    with PolicyClient(settings.policy_url, admin_token=token, timeout=600) as client:
        client.activate(good.policy)
    started = good.round is None
    state.policy_version = None if started else good.policy
    state.retriever_version = None if started else good.retriever
    state.policy_adapter = None if started else str(settings.checkpoint_root / good.policy)
    tower = settings.checkpoint_root / good.retriever / "query_encoder.safetensors"
    state.retriever_weights = None if good.retriever == BASE_VERSION else str(tower)
    optimizer = None if started else round_dir(settings, state.config.run_id, good.round) / OPTIMIZER_DIR
    state.optimizer_dir = str(optimizer) if optimizer is not None and optimizer.exists() else None
    assert bad.round is not None  # the run's first pair is never the newer of two
    state.rolled_back.append(HeldBack(round=bad.round, policy_version=bad.policy, retriever_version=bad.retriever,
                                        reason=reason))  # fmt: skip
    state.status, state.error = "paused", reason
    state.save(settings.runs_dir)
    log.warning("run %s paused: %s", state.config.run_id, reason)
