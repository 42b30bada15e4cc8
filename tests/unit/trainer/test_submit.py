"""Following a run from a client: progress at every look, the final state once the workers stop."""

from __future__ import annotations

import threading

from services.trainer.algo.config import AlgoConfig
from services.trainer.run_state import RunConfig, RunState
from services.trainer.settings import TrainerSettings
from services.trainer.submit import follow


def test_follow_reports_progress_until_the_run_ends(tmp_path):
    settings = TrainerSettings(data_dir=tmp_path)
    config = RunConfig(run_id="r1", dataset="hotpotqa", rounds=3, questions_per_round=2, algo=AlgoConfig())
    (settings.runs_dir / "r1").mkdir(parents=True)
    RunState(config=config, lam=1.0).save(settings.runs_dir)
    seen: list[int] = []

    def worker() -> None:  # what the Celery tasks do to the state file, a round published after each look
        for done in (1, 2, 3):
            while not seen or seen[-1] != done - 1:
                threading.Event().wait(0.005)
            current = RunState.load(settings.runs_dir, "r1")
            current.next_round = done
            current.status = "done" if done == 3 else "running"
            current.save(settings.runs_dir)

    thread = threading.Thread(target=worker)
    thread.start()
    final = follow(settings, "r1", seen.append, poll_s=0.01)
    thread.join()
    assert final.status == "done" and final.next_round == 3
    assert sorted(set(seen)) == [0, 1, 2, 3] and sorted(seen) == seen


def test_follow_returns_a_failed_run_with_its_error(tmp_path):
    settings = TrainerSettings(data_dir=tmp_path)
    config = RunConfig(run_id="r2", dataset="hotpotqa", rounds=3, questions_per_round=2, algo=AlgoConfig())
    (settings.runs_dir / "r2").mkdir(parents=True)
    RunState(config=config, lam=1.0, status="failed", next_round=1, error="boom").save(settings.runs_dir)
    seen: list[int] = []
    final = follow(settings, "r2", seen.append, poll_s=0.01)
    assert (final.status, final.error, seen) == ("failed", "boom", [1])
