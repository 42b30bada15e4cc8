"""Worker metrics: the latest published round of every run, read from the run folders at scrape time.

Celery's prefork children do the work, but only the main process serves /metrics, and several workers
(or a restarted one) share the runs folder. So the source of truth is the folder itself (`state.json`
and the last line of `metrics.jsonl`), read by a custom collector on each scrape: every worker reports
the same numbers, nothing is lost when a worker restarts, and no multiprocess directory needs cleaning.
"""

from __future__ import annotations

import errno
import json
import logging
import math
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import uvicorn
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)
LABELS = ["run_id", "algo"]
# (metric name, metrics.jsonl key, help, scale to base units)
ROUND_GAUGES: list[tuple[str, str, str, float]] = [
    ("bridge_trainer_round", "round", "Index of the run's latest published round", 1.0),
    ("bridge_trainer_reward_mean", "reward/mean", "Mean reward of the round's rollouts", 1.0),
    ("bridge_trainer_em_mean", "em/mean", "Exact match of the round's rollouts", 1.0),
    ("bridge_trainer_f1_mean", "f1/mean", "Token F1 of the round's rollouts", 1.0),
    ("bridge_trainer_recall_support", "recall/support", "Recall of supporting documents in what was shown", 1.0),
    ("bridge_trainer_kl_mean", "kl/mean", "KL of the policy to the frozen base", 1.0),
    ("bridge_trainer_lambda", "lambda", "Bilevel penalty weight lambda used by the round", 1.0),
    ("bridge_trainer_train_seconds", "time/train_s", "Wall time of the round's training", 1.0),
    ("bridge_trainer_q_share", "time/q_share", "Share of the round's time spent on Q_theta", 1.0),
    ("bridge_trainer_peak_memory_bytes", "memory/peak_mb", "Peak resident memory of the training process", 2**20),
    ("bridge_trainer_fresh_reward_mean", "fresh/reward/mean", "Mean reward of the fresh rollouts (fresh mode)", 1.0),
    ("bridge_trainer_gate_accepted", "gate/accepted", "1 when the gate let the latest round's pair go live", 1.0),
    ("bridge_trainer_gate_canary_em", "gate/em_candidate", "Canary EM of the latest round's candidate pair", 1.0),
    ("bridge_trainer_gate_serving_em", "gate/em_serving", "Canary EM of the pair serving when it was judged", 1.0),
    ("bridge_trainer_gate_seconds", "gate/seconds", "Wall time of the latest round's gate", 1.0),
]


def last_line(path: Path, block: int = 4096) -> str | None:
    """The last non-empty line of a text file, read from its end (metrics.jsonl grows for the whole run)."""
    with path.open("rb") as fh:
        end = fh.seek(0, 2)
        data = b""
        position = end
        while position > 0:
            position = max(0, position - block)
            fh.seek(position)
            data = fh.read(end - position)
            lines = data.rstrip(b"\n").split(b"\n")
            if len(lines) > 1 or position == 0:
                return lines[-1].decode() if lines[-1] else None
    return None


class RunMetricsCollector(Collector):
    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = runs_dir

    def runs(self) -> Iterator[tuple[dict, dict | None]]:
        """(state, latest metrics row or None) per run; a run being written right now is skipped this once."""
        for state_path in sorted(self.runs_dir.glob("*/state.json")):
            try:
                state = json.loads(state_path.read_text())
                metrics_path = state_path.with_name("metrics.jsonl")
                line = last_line(metrics_path) if metrics_path.exists() else None
                yield state, json.loads(line) if line else None
            except (OSError, ValueError) as exc:
                log.debug("skipping %s: %r", state_path.parent, exc)

    def collect(self) -> Iterator:
        gauges = {key: (GaugeMetricFamily(name, doc, labels=LABELS), scale) for name, key, doc, scale in ROUND_GAUGES}
        losses = GaugeMetricFamily("bridge_trainer_loss", "The round's losses by term", labels=[*LABELS, "term"])
        rounds = CounterMetricFamily("bridge_trainer_rounds_published", "Rounds published", labels=LABELS)
        rejected = CounterMetricFamily("bridge_trainer_rounds_rejected", "Rounds the promotion gate kept back",
                                       labels=LABELS)  # fmt: skip
        status = GaugeMetricFamily("bridge_trainer_run_status", "1 for the run's status", labels=[*LABELS, "status"])
        versions = InfoMetricFamily("bridge_trainer_versions", "Versions the latest round published", labels=LABELS)
        for state, row in self.runs():
            labels = [state["config"]["run_id"], state["config"]["algo"]["algo"]]
            kept_back = len(state.get("rejected", []))
            rounds.add_metric(labels, state.get("next_round", 0) - kept_back)
            rejected.add_metric(labels, kept_back)
            status.add_metric([*labels, state.get("status", "running")], 1)
            if row is None:
                continue
            for key, (family, scale) in gauges.items():
                if isinstance(row.get(key), int | float):
                    family.add_metric(labels, float(row[key]) * scale)
            for key, value in row.items():
                if key.startswith("loss/") and isinstance(value, int | float) and math.isfinite(value):
                    losses.add_metric([*labels, key.removeprefix("loss/")], float(value))
            versions.add_metric(labels, {"retriever_version": str(row.get("retriever_version")),
                                         "policy_version": str(row.get("policy_version"))})  # fmt: skip
        yield from (family for family, _ in gauges.values())
        yield from (losses, rounds, rejected, status, versions)


PORTS_TRIED = 32  # the configured port and the next ones: one each for the workers of one host


def _listen(host: str, port: int) -> socket.socket | None:
    """A socket listening on the first free port of port, port + 1, ... (PORTS_TRIED of them); None if all are
    taken. Bound here, so two workers starting together never pick the same one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for candidate in range(port, min(port + PORTS_TRIED, 65536)):
        try:
            return socket.create_server((host, candidate), family=family)
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE:
                raise
    return None


def serve_metrics(runs_dir: Path, port: int, host: str = "127.0.0.1") -> int | None:
    """Serve /metrics, and the read-only runs API (/v1/runs, services/trainer/runs_api.py), from a daemon thread
    of this process, on `port` or, when another worker of this host holds it, the next free one (logged: every
    worker reports the same numbers, read from the runs folder). Returns the port; None when off (port 0) or not
    served, which is logged too: metrics never keep a worker from training."""
    from services.trainer.runs_api import build_app

    if not port:
        return None
    try:
        sock = _listen(host, port)
    except OSError as exc:
        log.warning("worker metrics not served on %s:%d: %s", host, port, exc)
        return None
    if sock is None:
        log.warning("worker metrics not served: ports %d-%d of %s are all taken", port, port + PORTS_TRIED - 1, host)
        return None
    served = sock.getsockname()[1]
    if served != port:
        log.warning("worker metrics port %d is taken (another worker on this host?): serving on %d", port, served)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunMetricsCollector(runs_dir))
    # log_config=None: uvicorn leaves the worker's logging as Celery set it up.
    config = uvicorn.Config(build_app(runs_dir, registry), log_config=None, access_log=False, log_level="warning")
    threading.Thread(target=uvicorn.Server(config).run, kwargs={"sockets": [sock]}, daemon=True,
                     name="metrics-http").start()  # fmt: skip
    log.info("worker metrics on http://%s:%d/metrics, runs on /v1/runs", host, served)
    return served


# ----------------------------------------------------------------------------- a round's rollout metrics
def share_on_version(records, version: str | None) -> float:
    """Share of the search steps that the given retriever version served (1.0 when there were none)."""
    steps = [t.search for r in records for t in r.turns if t.search]
    return sum(s.retriever_version == version for s in steps) / len(steps) if steps else 1.0


def rollout_metrics(records, items: list[dict]) -> dict[str, float]:
    support = {str(i["id"]): set((i.get("metadata") or {}).get("supporting_doc_ids", [])) for i in items}
    recalls = []
    for r in records:
        gold = support.get(r.item_id or "", set())
        if gold:
            shown = {d for t in r.turns if t.search for d in t.search.chosen_ids}
            recalls.append(len(gold & shown) / len(gold))
    return {
        "reward/mean": float(np.mean([r.reward or 0.0 for r in records])),
        "em/mean": float(np.mean([r.em or 0.0 for r in records])),
        "f1/mean": float(np.mean([r.f1 or 0.0 for r in records])),
        "recall/support": float(np.mean(recalls)) if recalls else float("nan"),
        "searches/mean": float(np.mean([sum(1 for t in r.turns if t.search) for r in records])),
    }
