"""Rollback from served traffic: the test and its false-alarm rate, the watch over a live run's feedback, and what
a rollback does to the services and the run's state."""

from __future__ import annotations

import random

import pytest

from services.eval.stats import welch_lower_p
from services.trainer import rollback
from services.trainer.rollback import FeedbackBook, VersionFeedback, accepted_pairs, watch
from services.trainer.run_state import Published, RollbackConfig, RunConfig, RunState
from services.trainer.settings import TrainerSettings


def test_welch_lower_p_is_small_only_when_the_second_sample_is_lower():
    same = (50, 0.5, 0.25)
    assert welch_lower_p(same, same) == pytest.approx(0.5)
    assert welch_lower_p((50, 0.6, 0.24), (50, 0.2, 0.16)) < 1e-4
    assert welch_lower_p((50, 0.2, 0.16), (50, 0.6, 0.24)) > 0.99
    assert welch_lower_p((10, 1.0, 0.0), (10, 0.0, 0.0)) == 0.0 and welch_lower_p((10, 0.0, 0.0), (10, 1.0, 0.0)) == 1.0


def test_a_version_as_good_as_its_predecessor_is_rolled_back_at_most_alpha_of_the_time():
    """The watch's false-alarm rate, simulated: both versions earn Bernoulli(0.3) rewards; the newer one is looked
    at 20 times (every 5 more answers from 20 on), each at alpha / 20; rolled back in at most alpha of 1,000 runs."""
    config = RollbackConfig(window=20, alpha=0.05, looks=20)
    rng = random.Random(7)
    alarms = 0
    for _ in range(1000):
        before, after = VersionFeedback(), VersionFeedback()
        for _ in range(200):
            before.add(float(rng.random() < 0.3))
        for look in range(config.looks):
            while after.n < config.window + 5 * look:
                after.add(float(rng.random() < 0.3))
            if welch_lower_p(before.sample(), after.sample()) < config.alpha / config.looks:
                alarms += 1
                break
    assert alarms <= 1000 * config.alpha


def live_state(tmp_path, **rollback_fields) -> tuple[TrainerSettings, RunState]:
    settings = TrainerSettings(data_dir=tmp_path / "data")
    config = RunConfig(run_id="live-rb", source="live", rollback=RollbackConfig(**rollback_fields), report_to=[])
    first = Published(round=0, retriever_version="r0-ret", policy_version="r0-policy")
    state = RunState(config=config, lam=0.02, next_round=1, policy_version="r0-policy", retriever_version="r0-ret",
                     published=[first])  # fmt: skip
    (settings.runs_dir / "live-rb").mkdir(parents=True)
    state.save(settings.runs_dir)
    return settings, state


def test_the_watch_rolls_back_a_version_users_reward_less(tmp_path, monkeypatch):
    settings, state = live_state(tmp_path, window=5, alpha=0.01, looks=4)
    undone = []
    monkeypatch.setattr(rollback, "roll_back", lambda settings, state, bad, good, why: undone.append((bad, good, why)))
    assert watch(settings, state, [("base", 1.0)] * 5 + [("r0-policy", 0.0)] * 4) is None  # not 5 of each yet
    why = watch(settings, state, [("r0-policy", 0.0)])
    assert why is not None and "r0-policy earned reward 0.000 over 5 answers, against 1.000" in why
    [(bad, good, _)] = undone
    assert (bad.policy, bad.round, good.policy, good.retriever, good.round) == ("r0-policy", 0, "base", "base", None)
    book = FeedbackBook.load(settings.runs_dir / "live-rb")
    assert (book.versions["base"].n, book.versions["r0-policy"].n, book.versions["r0-policy"].looks) == (5, 5, 1)


def test_a_version_that_serves_as_well_is_looked_at_looks_times_and_kept(tmp_path, monkeypatch):
    settings, state = live_state(tmp_path, window=4, alpha=0.01, looks=3)
    monkeypatch.setattr(rollback, "roll_back", lambda *a: pytest.fail("rolled back a version as good as the last"))
    watch(settings, state, [("base", r) for r in (1.0, 0.0, 1.0, 0.0)])
    for _ in range(6):
        assert watch(settings, state, [("r0-policy", 1.0), ("r0-policy", 0.0)]) is None
    assert FeedbackBook.load(settings.runs_dir / "live-rb").versions["r0-policy"].looks == 3  # then no more tests


def test_a_rollback_activates_the_previous_pair_and_pauses_the_run(tmp_path, monkeypatch):
    monkeypatch.setenv("BRIDGE_ADMIN_TOKEN", "t" * 32)
    settings, state = live_state(tmp_path, window=5)
    state.published.append(Published(round=1, retriever_version=None, policy_version="r1-policy"))
    state.policy_version, state.next_round = "r1-policy", 2
    optimizer = settings.runs_dir / "live-rb" / "round-0000" / "optimizer"
    optimizer.mkdir(parents=True)
    activated = []

    class Client:  # what the rollback asks of each service: activate the previous version
        def __init__(self, url, admin_token=None, timeout=None):
            self.url = url

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def activate(self, version):
            activated.append((self.url, version))

    monkeypatch.setattr(rollback, "RetrieverClient", Client)
    monkeypatch.setattr(rollback, "PolicyClient", Client)
    pairs = accepted_pairs(state)
    assert [(p.policy, p.retriever, p.round) for p in pairs] == [
        ("base", "base", None), ("r0-policy", "r0-ret", 0), ("r1-policy", "r0-ret", 1)]  # fmt: skip
    rollback.roll_back(settings, state, pairs[-1], pairs[-2], "served worse")
    assert activated == [(settings.retriever_url, "r0-ret"), (settings.policy_url, "r0-policy")]  # retriever first
    after = RunState.load(settings.runs_dir, "live-rb")
    assert (after.status, after.error, after.policy_version, after.retriever_version) == (
        "paused", "served worse", "r0-policy", "r0-ret")  # fmt: skip
    assert after.optimizer_dir == str(optimizer) and after.policy_adapter.endswith("r0-policy")
    assert [r.round for r in after.rolled_back] == [1]
    assert [(p.policy, p.round) for p in accepted_pairs(after)][-1] == ("r0-policy", 0)


def test_only_a_live_run_is_watched():
    with pytest.raises(ValueError, match="only a live run"):
        RunConfig(rollback=RollbackConfig(window=5))
