"""`bridge-rl train | warmstart`: training runs on the Celery workers, and the policy's cold start."""

from __future__ import annotations

import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from services.cli.app import app
from services.cli.config_options import choices, option
from services.trainer.algo.config import AlgoConfig
from services.trainer.run_state import RunConfig
from services.trainer.warmstart.config import LORA_TARGETS, WarmstartConfig

AlgoName = choices(AlgoConfig, "algo", "AlgoName")
EstimatorName = choices(AlgoConfig, "estimator", "EstimatorName")
RetrieverParams = choices(AlgoConfig, "retriever_params", "RetrieverParams")
PolicyRollouts = choices(AlgoConfig, "policy_rollouts", "PolicyRollouts")
SourceName = choices(RunConfig, "source", "SourceName")
RewardName = choices(RunConfig, "reward", "RewardName")
WarmstartRecipe = choices(WarmstartConfig, "recipe", "WarmstartRecipe")
LoraTargets = StrEnum("LoraTargets", {name.replace("-", "_"): name for name in LORA_TARGETS})


@app.command()
def train(
    config: Annotated[
        Path | None, typer.Option(help="A run config TOML (see --print-config); flags and --set override it.")
    ] = None,
    set_: Annotated[
        list[str] | None,
        typer.Option("--set", help="Override any field, repeatable: --set algo.beta=0.02 --set candidates=30."),
    ] = None,
    print_config: Annotated[
        bool, typer.Option(help="Print the resolved config as TOML (every field, with its meaning) and exit.")
    ] = False,
    algo: Annotated[AlgoName | None, option(AlgoConfig, "algo")] = None,
    estimator: Annotated[
        EstimatorName | None,
        typer.Option(help="--algo bridge: bridge (the paper's, no second retriever state), two-state or drop."),
    ] = None,
    retriever_params: Annotated[
        RetrieverParams | None, typer.Option(help="Train the whole query tower, or a query-side LoRA (the paper's).")
    ] = None,
    gamma: Annotated[
        float | None, typer.Option(help="The paper's fixed penalty (0.02); replaces the lambda schedule.")
    ] = None,
    reward: Annotated[
        RewardName | None,
        typer.Option(help="Rollout reward: em (the paper's), f1, or em-format (Search-R1's format-aware EM)."),
    ] = None,
    dataset: Annotated[str | None, typer.Option(help="Questions: <BRIDGE_TRAINER_QA_DIR>/<dataset>.jsonl.")] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Your own questions instead of --dataset: a Search-R1/verl .parquet, a FlashRAG .jsonl "
            "(question, golden_answers), or a folder of them. Every row is a training row, except in our own "
            "<dataset>.jsonl files (in BRIDGE_TRAINER_QA_DIR, or named for a benchmark: nq.jsonl, hotpotqa.jsonl, "
            "...), whose first 100 rows, the evaluation split, are never trained on. Bad rows are skipped, each "
            "named with its row number.",
        ),
    ] = None,
    rounds: Annotated[int | None, option(RunConfig, "rounds")] = None,
    questions_per_round: Annotated[int | None, option(RunConfig, "questions_per_round")] = None,
    group_size: Annotated[int | None, option(AlgoConfig, "group_size")] = None,
    seed: Annotated[int | None, typer.Option(help="The same seed gives the same run.")] = None,
    max_turns: Annotated[int | None, option(RunConfig, "max_turns")] = None,
    q_prior: Annotated[
        bool | None,
        typer.Option(
            help="Q_theta as the posterior p_deployed(d) pi(y*|x,d)^(1/beta_Q), the paper's L_RAG (default), or "
            "--no-q-prior: the policy's likelihood alone (an ablation; it unlearns with a weak policy).",
        ),
    ] = None,
    policy_rollouts: Annotated[
        PolicyRollouts | None,
        typer.Option(
            help="How the policy step sees the adapted retriever: reweighted (logged rollouts, weighted by the "
            "clipped retrieval ratio) or fresh (publish the retriever, collect again, step the policy on those; "
            "bridge and alt-rp).",
        ),
    ] = None,
    source: Annotated[
        SourceName | None,
        typer.Option(
            help="dataset (rollouts on --dataset) or live (served trajectories rewarded by POST /v1/feedback)."
        ),
    ] = None,
    live_batch: Annotated[int | None, option(RunConfig, "live_batch")] = None,
    max_staleness: Annotated[int | None, option(RunConfig, "max_staleness")] = None,
    run_id: Annotated[str | None, option(RunConfig, "run_id")] = None,
    report_to: Annotated[
        list[str] | None,
        typer.Option(
            help="Experiment trackers every round's metrics also go to (TRL's report_to), repeatable or "
            "comma-separated: tensorboard (the default where installed), wandb, mlflow; none for none. Files go "
            "under the run's folder: <run>/tensorboard, <run>/wandb (offline unless WANDB_MODE is set), "
            "<run>/mlruns (unless MLFLOW_TRACKING_URI is set).",
        ),
    ] = None,
    resume: Annotated[
        bool, typer.Option(help="Re-enqueue an existing --run-id from its last published round.")
    ] = False,
    wait: Annotated[bool, typer.Option(help="Follow progress until the run ends.")] = True,
) -> None:
    """Start (or resume) a training run on the Celery workers; each round publishes retriever, then policy.

    The run's config is one TOML file (--print-config shows every field and its default); the flags here and
    --set KEY=VALUE override it field by field. It is saved as <run>/config.toml."""
    import uuid

    from pydantic import ValidationError
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from services.data.files import DataFileError
    from services.data.split import training_data
    from services.trainer.config_file import load_run_config, parse_override, to_toml
    from services.trainer.round_files import LiveTrafficRefused, start_run
    from services.trainer.run_state import RunState, read_metrics
    from services.trainer.settings import TrainerSettings
    from services.trainer.submit import enqueue, follow
    from services.trainer.trackers import TRACKER_NAMES, tracker_names

    trackers = None if report_to is None else tracker_names(report_to)
    if unknown := [name for name in trackers or [] if name not in TRACKER_NAMES]:
        raise typer.BadParameter(f"{', '.join(unknown)}: not one of {', '.join(TRACKER_NAMES)}, none",
                                 param_hint="--report-to")  # fmt: skip
    flags = {
        "algo.algo": algo, "algo.estimator": estimator, "algo.retriever_params": retriever_params,
        "algo.gamma": gamma, "dataset": dataset, "data": data, "rounds": rounds,
        "questions_per_round": questions_per_round, "algo.group_size": group_size, "algo.seed": seed,
        "max_turns": max_turns, "algo.q_prior": q_prior,
        "algo.policy_rollouts": policy_rollouts, "source": source, "live_batch": live_batch,
        "max_staleness": max_staleness, "run_id": run_id, "reward": reward, "report_to": trackers,
    }  # fmt: skip
    overrides = [(k.split("."), v.value if isinstance(v, StrEnum) else v) for k, v in flags.items() if v is not None]
    try:
        run_config = load_run_config(config, [*overrides, *(parse_override(text) for text in set_ or [])])
    except (ValidationError, ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--config/--set") from exc
    if run_config.data is not None:  # the saved config names the file, from wherever the command ran
        run_config = run_config.model_copy(update={"data": run_config.data.expanduser().resolve()})
    if print_config:
        typer.echo(to_toml(run_config), nl=False)
        return
    settings = TrainerSettings()
    if resume:
        if not run_config.run_id:
            raise typer.BadParameter("--resume needs --run-id")
        state = RunState.load(settings.runs_dir, run_config.run_id)
        _check_trackers(state.config.report_to)
        state.status = "running"
        state.save(settings.runs_dir)
    else:
        if not run_config.run_id:
            run_config = run_config.model_copy(update={"run_id": f"{run_config.algo.algo}-{uuid.uuid4().hex[:6]}"})
        _check_trackers(run_config.report_to)  # before the data is read (start_run checks again, for its callers)
        rows = None
        if run_config.data is not None and run_config.source != "live":
            try:
                rows = training_data(run_config.data, settings.qa_dir)
            except DataFileError as exc:
                raise typer.BadParameter(str(exc), param_hint="--data") from exc
            for line in rows.report():
                typer.echo(line)
        try:
            state = start_run(settings, run_config, rows)
        except LiveTrafficRefused as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
    run_id = state.config.run_id
    enqueue(settings, run_id, state.next_round)
    typer.echo(f"run {run_id}: {settings.runs_dir / run_id}")
    if "tensorboard" in state.config.report_to:
        typer.echo(f"metrics: tensorboard --logdir {settings.runs_dir / run_id / 'tensorboard'}")
    if not wait:
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} rounds"),
                  TimeElapsedColumn()) as progress:  # fmt: skip
        task = progress.add_task(f"training {run_id}", total=state.config.rounds, completed=state.next_round)
        state = follow(settings, run_id, lambda done: progress.update(task, completed=done))
    for row in read_metrics(settings.runs_dir, run_id):
        typer.echo(
            f"round {row['round']}: reward {row['reward/mean']:.3f} em {row['em/mean']:.3f} f1 {row['f1/mean']:.3f} "
            f"recall {row['recall/support']:.3f} lambda {row['lambda']:.2f} -> {_round_outcome(row)} "
            f"({row['time/train_s']:.0f}s, {row['memory/peak_mb']:.0f} MB)"
        )
    if state.status == "failed":
        typer.echo(f"run failed: {state.error}", err=True)
        raise typer.Exit(1)
    if state.status == "paused":
        typer.echo(f"run paused: {state.error} (bridge-rl train --run-id {run_id} --resume goes on)", err=True)
        raise typer.Exit(3)


def _round_outcome(row: dict) -> str:
    """What a round did to the services, as the console says it."""
    if row.get("gate/accepted") == 0:
        return f"kept back by the gate ({row['gate/reason']})"
    if reason := row.get("retriever_unchanged"):
        return f"retriever: unchanged, {reason}, policy {row['policy_version']}"
    return f"retriever {row['retriever_version']}, policy {row['policy_version']}"


def _check_trackers(names: list[str]) -> None:
    """A tracker the run names and this install lacks: one line, exit 2, before the run starts."""
    from services.trainer.trackers import TrackerUnavailable, check_trackers

    try:
        check_trackers(names)
    except TrackerUnavailable as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc


@app.command()
def warmstart(
    qa_dir: Annotated[Path, typer.Option(help="Question files <dataset>.jsonl (e.g. ../shared/data/qa).")],
    corpus: Annotated[
        list[Path] | None,
        typer.Option(help="Corpus JSONL to ingest into the warm start's index first (repeatable; skipped if in)."),
    ] = None,
    index_dir: Annotated[
        Path | None, typer.Option(help="Data dir of the in-process retriever index (default <data_dir>/warmstart).")
    ] = None,
    datasets: Annotated[
        str | None,
        typer.Option(help="Comma-separated datasets (default: the nine with a training pool, medical ones included)."),
    ] = None,
    recipe: Annotated[
        WarmstartRecipe,
        typer.Option(help="reading: RAFT-style reading examples (the default); protocol: the first warm start's."),
    ] = WarmstartRecipe.reading,
    per_dataset: Annotated[
        int | None, typer.Option(min=1, help="Training-pool questions per dataset (default: all of them).")
    ] = None,
    variants: Annotated[int, typer.Option(min=1, max=8, help="Reading examples per question.")] = 2,
    gold_missing: Annotated[
        float, typer.Option(min=0, max=1, help="Share of reading variants whose first search misses the gold passage.")
    ] = 0.15,
    bridge: Annotated[
        float,
        typer.Option(
            min=0,
            max=1,
            help="Share of a multi-hop question's variants whose first search shows only the bridge passage (no "
            "answer, the next hop's title named): the target searches that title, then answers.",
        ),
    ] = 0.0,
    template_weight: Annotated[
        float, typer.Option(min=0, max=1, help="Loss weight of the agent's non-answer tokens (the answer's are 1).")
    ] = 0.1,
    epochs: Annotated[float, typer.Option(min=0.01, help="Passes over the training questions.")] = 1.0,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the LoRA.")] = 4e-4,
    rank: Annotated[int, typer.Option(min=1, help="LoRA rank (alpha is twice it).")] = 16,
    lora_targets: Annotated[
        LoraTargets,
        typer.Option(help="The linear layers that carry the LoRA: every one, attention (q/k/v/o) or mlp only."),
    ] = LoraTargets.all_linear,
    max_minutes: Annotated[
        float | None, typer.Option(help="Stop this session's training after this long; --resume goes on later.")
    ] = None,
    state_dir: Annotated[
        Path | None,
        typer.Option(
            help="Resumable state: examples, checkpoint (default ~/.cache/bridge-rl/warmstart/<recipe>-<seed>)."
        ),
    ] = None,
    resume: Annotated[bool, typer.Option("--resume", help="Go on from the last checkpoint in --state-dir.")] = False,
    continue_from: Annotated[
        Path | None,
        typer.Option(
            help="A committed adapter of this same run (e.g. services/modeling/adapters/reading) to go on from when "
            "--state-dir holds no checkpoint (a new machine): its LoRA and step; AdamW restarts with a warm-up."
        ),
    ] = None,
    init_from: Annotated[
        Path | None,
        typer.Option(
            help="A committed adapter to start a new stage from when --state-dir holds no checkpoint: its LoRA, then "
            "this command's settings (e.g. another recipe), order and schedule; its held-out questions stay held out."
        ),
    ] = None,
    hold_out: Annotated[
        Path | None,
        typer.Option(help="A file of 'dataset:id' lines never trained on (e.g. the questions a later measure uses)."),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seeds the question draw, the order and the LoRA init.")] = 0,
    two_search_repeat: Annotated[
        int, typer.Option(min=1, max=16, help="Times each two-search trajectory is in the training set.")
    ] = 1,
    out: Annotated[
        Path | None,
        typer.Option(help="Adapter folder (default: the recipe's shipped one, services/policy/<recipe>_adapter)."),
    ] = None,
    examples_cache: Annotated[Path | None, typer.Option(help="Reuse / keep the built trajectories here.")] = None,
    device: Annotated[
        str, typer.Option(help="auto (a CUDA GPU when torch sees one, else the CPU), cpu, cuda or cuda:N.")
    ] = "auto",
) -> None:
    """Warm-start SFT of the policy on Search-R1-format trajectories built with the real retriever: by default
    reading examples (supporting passages among hard distractors, the answer as the passage writes it, the loss
    weighted to the answer). Resumable (--resume); writes the LoRA adapter (safetensors + manifest.json) whenever a
    session stops; `bridge-rl prepare` merges the shipped one into the default policy."""
    import shlex

    from services.common.settings import CommonSettings
    from services.modeling.shipped import SHIPPED_ADAPTERS
    from services.retriever.inprocess import InProcessRetriever
    from services.trainer.warmstart.config import LORA_TARGETS, ReadingRecipe, WarmstartConfig
    from services.trainer.warmstart.run import run_warmstart

    settings = CommonSettings()
    out = out or SHIPPED_ADAPTERS[recipe.value]
    config = WarmstartConfig(
        **({"datasets": [d.strip() for d in datasets.split(",") if d.strip()]} if datasets else {}),
        recipe=recipe.value, reading=ReadingRecipe(variants=variants, gold_missing=gold_missing, bridge=bridge),
        template_weight=template_weight, per_dataset=per_dataset, epochs=epochs,
        hold_out=[line.strip() for line in hold_out.read_text().splitlines() if line.strip()] if hold_out else [],
        lr=lr, lora_rank=rank, lora_alpha=2 * rank, target_modules=list(LORA_TARGETS[lora_targets.value]),
        max_minutes=max_minutes, seed=seed,
        two_search_repeat=two_search_repeat,
    )  # fmt: skip
    try:
        manifest = run_warmstart(
            config,
            qa_dir=qa_dir,
            open_retriever=lambda: InProcessRetriever(
                index_dir or settings.data_dir / "warmstart", encoder_dir=settings.retriever_model_dir
            ),
            corpus=corpus or [],
            base_model_dir=settings.base_policy_model_dir,
            out=out,
            command="bridge-rl " + shlex.join(sys.argv[1:]),
            state_dir=state_dir or Path.home() / ".cache" / "bridge-rl" / "warmstart" / f"{recipe.value}-{seed}",
            resume=resume,
            examples_cache=examples_cache,
            device=device,
            continue_from=continue_from,
            init_from=init_from,
        )
    except ValueError as exc:  # a run that exists, or one resumed with other settings: say so, no traceback
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    training = manifest["training"]
    held = training["heldout_loss"]
    typer.echo(
        f"adapter: {out} ({training['train_examples']} examples, step {training['steps']} of "
        f"{training['total_steps']}{'' if training['finished'] else ', unfinished: --resume goes on'}, "
        f"{training['wall_s']:.0f}s, held-out loss {held[0]['loss']:.3f} -> {held[-1]['loss']:.3f})"
    )
