"""A training run's persistent state: config, progress and what was published, one JSON file per run,
replaced atomically, so any worker can pick a run up where the last one left it."""

from __future__ import annotations

import json
import logging
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from services.common.checkpoints import write_json_atomic
from services.common.schemas.retriever import DEFAULT_TOP_K, MAX_AGENT_TOP_K
from services.trainer.algo.config import PAPER_GAMMA, AlgoConfig
from services.trainer.trackers import TrackerName, default_trackers, tracker_names

log = logging.getLogger(__name__)


class GateConfig(BaseModel):
    """The promotion gate (services/trainer/gate.py): a round's checkpoints are activated only if the candidate
    pair answers a fixed canary set about as well as the serving pair."""

    model_config = ConfigDict(extra="forbid")

    canary: int = Field(
        0,
        ge=0,
        le=256,
        description="Canary questions (0: no gate): the first ones of the canary dataset's training pool, held out "
        "of the run's training draws, never the evaluation split.",
    )
    dataset: str | None = Field(
        None, description="The training pool the canary comes from; null: the run's dataset (a live run must name one)."
    )
    max_em_drop: float = Field(
        0.05, ge=0, le=1, description="Reject when the candidate's canary EM is this much below the serving pair's."
    )
    alpha: float = Field(
        0.05,
        gt=0,
        lt=1,
        description="Reject when the candidate answers worse on the canary by a sign test at this level.",
    )
    max_logprob_drop: float | None = Field(
        1.0,
        ge=0,
        description="Reject when the candidate's mean log-probability of the gold answer, after its own canary "
        "searches, is this many nats below the serving pair's (null: EM alone decides). Unlike EM it moves when "
        "neither pair answers the canary.",
    )


class RollbackConfig(BaseModel):
    """Rollback from served traffic (services/trainer/rollback.py): a live run compares the rewards users give the
    newest accepted version with those its predecessor got, and rolls both services back on a significant drop."""

    model_config = ConfigDict(extra="forbid")

    window: int = Field(
        0, ge=0, le=100_000, description="Rewarded answers each version needs before they are compared (0: no watch)."
    )
    alpha: float = Field(
        0.01, gt=0, lt=1, description="False-alarm rate of one version's watch over all its looks (alpha / looks each)."
    )
    looks: int = Field(20, ge=1, le=10_000, description="Tests of one version at most, each once more feedback came.")


class RunConfig(BaseModel):
    """Everything that shapes a training run: one TOML file (`bridge-rl train --print-config` writes the
    defaults), validated here, saved into the run folder and into every checkpoint's manifest."""

    model_config = ConfigDict(extra="forbid")

    run_id: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$", description="Name of the run (default: generated)."
    )
    dataset: str = Field(
        "hotpotqa", description="Questions: <BRIDGE_TRAINER_QA_DIR>/<dataset>.jsonl (unless data is set)."
    )
    data: Path | None = Field(
        None,
        description="Questions from your own file or folder instead of dataset: a Search-R1/verl .parquet, a "
        "FlashRAG .jsonl, or a folder of them (docs/training.md, Bring your data). Read once when the run starts, "
        "into <run>/questions.jsonl; every row is trained on, except the evaluation split of our <dataset>.jsonl.",
    )
    rounds: int = Field(2, ge=1, le=10_000, description="Rounds (each publishes retriever, then policy).")
    questions_per_round: int = Field(4, ge=1, le=64, description="Questions per round (x group_size rollouts).")
    source: Literal["dataset", "live"] = Field(
        "dataset", description="dataset: rollouts on training questions; live: served trajectories with feedback."
    )
    live_batch: int = Field(8, ge=1, le=512, description="Live: rewarded trajectories per round.")
    max_staleness: int = Field(2, ge=0, le=100, description="Live: how many policy versions old a trajectory may be.")
    baseline_decay: float = Field(0.9, ge=0, lt=1, description="Live: EMA decay of the running reward baseline.")
    max_turns: int = Field(2, ge=0, le=8, description="Searches per rollout before the final answer turn.")
    rollout_temperature: float = Field(1.0, gt=0, description="Decoding temperature of rollouts.")
    retrieval_temperature: float = Field(0.05, gt=0, description="Rollouts' retrieval: softmax(score / T) over M.")
    candidates: int = Field(20, ge=2, le=200, description="M: candidates a rollout's retrieval samples from.")
    top_k: int = Field(DEFAULT_TOP_K, ge=1, le=MAX_AGENT_TOP_K, description="Documents shown per search.")
    initial_search: bool | None = Field(
        None,
        description="Rollouts retrieve with the question before the first turn (the serving scaffold for small "
        "models); null: whatever the policy service is set to (BRIDGE_POLICY_INITIAL_SEARCH).",
    )
    reward: Literal["em", "f1", "em-format"] = Field(
        "em",
        description="Training reward of a rollout: em (exact match, the paper's), f1 (token F1, as ReSearch and "
        "R1-Searcher) or em-format (Search-R1's qa_em_format: 0.2 for a well-formed trajectory, 1 only for a "
        "correct answer). Evaluation reports EM and F1 whatever this is.",
    )
    report_to: list[TrackerName] = Field(
        default_factory=default_trackers,
        description="Experiment trackers every round's metrics also go to (TRL's report_to): tensorboard, wandb, "
        "mlflow; [] for none. Default: tensorboard where it is installed (the trackers extra), else none. Files "
        "under the run's folder (docs/training.md, Experiment trackers).",
    )
    gate: GateConfig = Field(default_factory=GateConfig)
    rollback: RollbackConfig = Field(default_factory=RollbackConfig)
    algo: AlgoConfig = Field(default_factory=AlgoConfig)

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_names(cls, value: Any) -> Any:
        """`report_to = "tensorboard,wandb"` (or `--set report_to=wandb`) as a list; `none` is no tracker."""
        return tracker_names(value) if isinstance(value, str | list | tuple) else value

    @model_validator(mode="after")
    def _fresh_needs_questions(self) -> RunConfig:
        if self.source == "live" and self.algo.policy_rollouts == "fresh":
            raise ValueError("policy_rollouts='fresh' needs questions to ask again; live runs have only served ones")
        if self.source == "live" and self.data is not None:
            raise ValueError("data gives questions to ask; live runs train on served ones")
        if self.gate.canary and self.algo.policy_rollouts == "fresh":
            raise ValueError("the gate scores a round's pair before either goes live; policy_rollouts='fresh' "
                             "activates the retriever mid-round")  # fmt: skip
        if self.gate.canary and self.source == "live" and self.gate.dataset is None:
            raise ValueError("a live run's gate needs gate.dataset: the training pool its canary comes from")
        if self.rollback.window and self.source != "live":
            raise ValueError("rollback watches served feedback: only a live run (source = 'live') has it")
        if self.gate.canary and self.data is not None and self.gate.dataset is None:
            raise ValueError("a run on its own data needs gate.dataset: the training pool its canary comes from")
        return self

    @property
    def canary_dataset(self) -> str:
        return self.gate.dataset or self.dataset


class Published(BaseModel):
    round: int
    retriever_version: str | None
    policy_version: str | None


class HeldBack(BaseModel):
    """A round whose pair does not serve: kept back by the promotion gate (registered, never activated; in
    `RunState.rejected`), or rolled back from served traffic after it went live (in `RunState.rolled_back`)."""

    round: int
    retriever_version: str | None
    policy_version: str | None
    reason: str


class RunState(BaseModel):
    config: RunConfig
    status: Literal["running", "done", "failed", "paused"] = "running"
    next_round: int = 0
    lam: float
    published: list[Published] = Field(default_factory=list)
    rejected: list[HeldBack] = Field(default_factory=list, description="Rounds the promotion gate kept back.")
    rolled_back: list[HeldBack] = Field(default_factory=list, description="Rounds rolled back from served traffic.")
    retriever_weights: str | None = Field(None, description="Last published query tower (safetensors path).")
    policy_adapter: str | None = Field(None, description="Last published LoRA adapter folder.")
    optimizer_dir: str | None = Field(None, description="The optimizers' state after the last published round.")
    retriever_version: str | None = None
    policy_version: str | None = None
    error: str | None = None
    initial_policy_version: str = Field("base", description="The policy serving when the run started.")
    initial_retriever_version: str = Field(
        "base", description="The retriever the run's first rollouts search with (live: the one serving at its start)."
    )
    reward_baseline: float | None = Field(None, description="Live: running mean reward (advantage baseline).")
    chain_id: str = Field(
        default_factory=lambda: uuid.uuid4().hex,
        description="This run's own id for its chain of tasks: a run started again under the same run id (its "
        "folder removed) is another chain.",
    )

    @staticmethod
    def path(runs_dir: Path, run_id: str) -> Path:
        return runs_dir / run_id / "state.json"

    @classmethod
    def load(cls, runs_dir: Path, run_id: str) -> RunState:
        data = json.loads(cls.path(runs_dir, run_id).read_text())
        migrate_gamma(data)
        return cls.model_validate(data)

    def save(self, runs_dir: Path) -> None:
        write_json_atomic(self.path(runs_dir, self.config.run_id), self.model_dump(mode="json"))


def migrate_gamma(data: dict[str, Any]) -> None:
    """A state saved before the bridge and drop estimators required a fixed gamma (`AlgoConfig._checks`) has gamma
    null, lambda on its schedule: refused as it is, the run could neither resume nor be marked failed. It goes on
    at the paper's gamma, lambda held there as a new run's is. Only here: a new config asking for it is refused."""
    config = data.get("config") if isinstance(data, dict) else None
    algo = config.get("algo") if isinstance(config, dict) else None
    defaults = AlgoConfig.model_fields
    if (
        not isinstance(algo, dict)  # not a state file at all: validation says what is wrong
        or "gamma" not in algo
        or algo["gamma"] is not None
        or algo.get("algo", defaults["algo"].default) != "bridge"
        or algo.get("estimator", defaults["estimator"].default) == "two-state"
    ):
        return
    log.warning(
        "run %s: saved with gamma null and estimator %r, which is measured only at a fixed gamma; it continues at "
        "the paper's fixed gamma %g (lambda was %g)",
        config.get("run_id"), algo.get("estimator", defaults["estimator"].default), PAPER_GAMMA,
        data.get("lam"),
    )  # fmt: skip
    algo["gamma"] = PAPER_GAMMA
    data["lam"] = PAPER_GAMMA


def append_metrics(runs_dir: Path, run_id: str, row: dict) -> bool:
    """Append a round's row, once: a publish redelivered after it wrote the row but before it saved the state finds
    the row there and writes nothing (False)."""
    if any(r.get("round") == row["round"] for r in read_metrics(runs_dir, run_id)):
        return False
    with (runs_dir / run_id / "metrics.jsonl").open("a") as fh:
        fh.write(json.dumps(row) + "\n")
    return True


def read_metrics(runs_dir: Path, run_id: str) -> list[dict]:
    path = runs_dir / run_id / "metrics.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []
