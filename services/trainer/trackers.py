"""Experiment trackers (TRL's `report_to`): every published round's metrics row, as `metrics.jsonl` holds it, also
goes to TensorBoard, Weights & Biases and/or MLflow through their own writers, under the row's own key names
(`reward/mean`, `loss/policy`, ...) with the round index as the step.

Files go under the run's folder unless the tracker is pointed elsewhere: TensorBoard event files in
`<run>/tensorboard/`; W&B in `<run>/wandb/`, offline unless `WANDB_MODE` says otherwise; MLflow in the file store
`<run>/mlruns/` unless `MLFLOW_TRACKING_URI` is set. A round opens each tracker, logs and closes it again: the
rounds of one run may publish from different worker processes, one after the other, and each goes on where the
last left off (the same log dir; the W&B run resumed by the run's id; the MLflow run whose id `<run>/mlflow.json`
keeps), as a resumed run does.

A tracker the run names must be importable when the run starts (`check_trackers`: one line, before any round); a
tracker that fails while logging a round is a warning, never the round's failure (the row is in `metrics.jsonl`)."""

from __future__ import annotations

import importlib
import importlib.util
import json
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

from services.common.checkpoints import write_json_atomic

log = logging.getLogger(__name__)

TrackerName = Literal["tensorboard", "wandb", "mlflow"]
TRACKER_NAMES: tuple[str, ...] = get_args(TrackerName)
# The module each tracker needs, and how to get it.
MODULES = {"tensorboard": "tensorboard", "wandb": "wandb", "mlflow": "mlflow"}
INSTALL = {
    "tensorboard": "pip install 'bridge-rl[trackers]' (or tensorboard)",
    "wandb": "pip install 'bridge-rl[trackers]' (or wandb)",
    "mlflow": "pip install 'bridge-rl[trackers]' (or mlflow)",
}
# The W&B project and the MLflow experiment, unless WANDB_PROJECT / MLFLOW_EXPERIMENT_NAME names another.
DEFAULT_PROJECT = "bridge-rl"
MLFLOW_RUNS = "mlflow.json"  # {tracking URI: MLflow run id} of this run


class TrackerUnavailable(ValueError):
    """The run names a tracker that cannot be imported here (permanent: refused when the run starts)."""


def tracker_names(values: str | Iterable[str]) -> list[str]:
    """`"tensorboard,wandb"` or `["tensorboard", "wandb,mlflow"]` -> the names, each once, in order; `none` (TRL's
    word) names no tracker. The names are not checked here (RunConfig's Literal does)."""
    items = [values] if isinstance(values, str) else list(values)
    names = [n.strip().lower() for item in items for n in str(item).split(",")]
    return list(dict.fromkeys(n for n in names if n and n != "none"))


def installed(name: str) -> bool:
    return importlib.util.find_spec(MODULES[name]) is not None


def default_trackers() -> list[str]:
    """TensorBoard where it is installed (the `trackers` extra: the trainer image and `make install` have it), else
    none: a plain install of the services must not need a tracker to train, nor refuse a run that names none."""
    return ["tensorboard"] if installed("tensorboard") else []


def check_trackers(names: Iterable[str]) -> None:
    """Raises TrackerUnavailable, in one line, naming every tracker of `names` that cannot be imported."""
    missing = []
    for name in names:
        try:
            importlib.import_module(MODULES[name])
        except ImportError:
            missing.append(name)
    if missing:
        how = "; ".join(INSTALL[name] for name in missing)
        raise TrackerUnavailable(
            f"report_to names {', '.join(missing)}, not installed here: {how}; or leave it out of report_to"
        )


def split_row(row: Mapping[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """A metrics row's numbers (scalars) and strings (versions and other tags), by the row's own keys. Nested values
    (the publish timestamps `activated_at`, `requested_at`: epoch seconds, which TensorBoard's float32 would round to
    minutes) and None stay in metrics.jsonl only."""
    scalars = {key: float(value) for key, value in row.items() if isinstance(value, int | float)}
    texts = {key: value for key, value in row.items() if isinstance(value, str)}
    return scalars, texts


class Tracker(ABC):
    """One tracker, opened on a run for one round and closed again (see the module's doc)."""

    @abstractmethod
    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None: ...

    @abstractmethod
    def close(self, finished: bool) -> None:
        """Flush and close; `finished`: the run's last round was just logged."""


class TensorBoardTracker(Tracker):
    """Event files in `<run>/tensorboard/` (a new file per round, in the same log dir), through torch's
    SummaryWriter: scalars by key, strings as text summaries."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, global_step=step)
        for key, text in texts.items():
            self.writer.add_text(key, text, global_step=step)

    def close(self, finished: bool) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """The W&B run whose id is the run's, resumed each round (`resume="allow"`), in `<run>/wandb/`; offline unless
    WANDB_MODE is set (an offline run keeps one folder per round: `wandb sync <run>/wandb/offline-run-*` uploads them
    as one run, in order)."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT, id=config["run_id"], name=config["run_id"],
            dir=run_dir, mode=os.environ.get("WANDB_MODE") or "offline", resume="allow", reinit="create_new",
            config=dict(config),
            settings=wandb.Settings(console="off", silent=True, disable_git=True, save_code=False),
        )  # fmt: skip

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        self.run.log({**scalars, **texts}, step=step)

    def close(self, finished: bool) -> None:
        self.run.finish()


class MlflowTracker(Tracker):
    """One MLflow run per run, in the experiment MLFLOW_EXPERIMENT_NAME (default bridge-rl) of MLFLOW_TRACKING_URI,
    else of a file store in `<run>/mlruns/`; its id is kept in `<run>/mlflow.json`, by tracking URI. Scalars are
    metrics at the round's step, strings are tags (the latest round's), the run config is its params."""

    def __init__(self, run_dir: Path, config: Mapping[str, Any]) -> None:
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = (run_dir / "mlruns").resolve().as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps file stores behind this switch
        self.client = MlflowClient(tracking_uri=uri)
        ids_path = run_dir / MLFLOW_RUNS
        ids = json.loads(ids_path.read_text()) if ids_path.exists() else {}
        self.run_id = ids.get(uri)
        if self.run_id is None:
            self.run_id = self.client.create_run(self._experiment_id(), run_name=config["run_id"]).info.run_id
            write_json_atomic(ids_path, {**ids, uri: self.run_id})
            self._log_params(config)

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_PROJECT
        if (experiment := self.client.get_experiment_by_name(name)) is not None:
            return experiment.experiment_id
        try:
            return self.client.create_experiment(name)
        except MlflowException:  # another run created it meanwhile
            return self.client.get_experiment_by_name(name).experiment_id

    def _log_params(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        def flat(data: dict, prefix: str = "") -> Iterable[tuple[str, Any]]:
            for key, value in data.items():
                yield from flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [(f"{prefix}{key}", value)]

        params = [Param(key, str(value)) for key, value in flat(config) if value is not None]
        self.client.log_batch(self.run_id, params=params)

    def log(self, step: int, scalars: dict[str, float], texts: dict[str, str]) -> None:
        from mlflow.entities import Metric, RunTag

        now = int(time.time() * 1000)
        metrics = [Metric(key, value, now, step) for key, value in scalars.items()]
        self.client.log_batch(self.run_id, metrics=metrics, tags=[RunTag(key, text) for key, text in texts.items()])

    def close(self, finished: bool) -> None:
        if finished:
            self.client.set_terminated(self.run_id, "FINISHED")


TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker, "mlflow": MlflowTracker}


def log_round(run_dir: Path, config: Mapping[str, Any], row: Mapping[str, Any], *, finished: bool = False) -> None:
    """Send a published round's metrics row to every tracker of `config["report_to"]`, at step `row["round"]`.
    `config`: the run config as data (`RunConfig.model_dump(mode="json")`), which W&B and MLflow record. A
    tracker that fails is a warning: the round stands, and its row is in metrics.jsonl."""
    if not config["report_to"]:
        return
    step = int(row["round"])
    scalars, texts = split_row(row)
    for name in config["report_to"]:
        try:
            tracker = TRACKERS[name](run_dir, config)
            try:
                tracker.log(step, scalars, texts)
            finally:
                tracker.close(finished)
        except Exception as exc:
            log.warning("run %s round %d: not logged to %s (%r); the row is in metrics.jsonl",
                        config["run_id"], step, name, exc)  # fmt: skip
