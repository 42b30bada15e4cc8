"""`bridge-rl demo`: the main job on the embedded default, end to end, in a few minutes on a laptop CPU.

Starts everything, loads the demo corpus, asks three questions over REST, runs two BRIDGE rounds on the
Celery worker (each publishes a retriever, then a policy checkpoint into the running services), asks the
same questions again, and shows the versions and answers before and after.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from services.cli.ingest import ingest_file
from services.cli.launcher import Stack
from services.common.clients.policy import PolicyClient
from services.common.clients.retriever import RetrieverClient
from services.trainer.run_state import read_metrics

DEMO = Path(__file__).resolve().parents[1] / "demo_data"


def ensure_demo_corpus(stack: Stack) -> None:
    with RetrieverClient(stack.retriever_url, admin_token=stack.settings.resolve_admin_token(), timeout=600) as c:
        ingest_file(c, DEMO / "hotpotqa_corpus.jsonl")  # unchanged passages are skipped on re-runs


def ask_all(stack: Stack, questions: list[dict]) -> list[dict]:
    out = []
    with PolicyClient(stack.policy_url) as client:
        for q in questions:
            r = client.query(q["question"], max_turns=1)
            said = " ".join(t.text for t in r.turns).strip().replace("\n", " ")
            # Where the policy closes no <answer> tag, show what it said instead of an empty cell.
            answer = r.answer or f"(no <answer>) {said[:60]}"
            out.append({"answer": answer, "policy": r.policy_version, "retriever": r.retriever_version,
                        "searched": [d["title"] for t in r.turns if t.search for d in t.search.docs]})  # fmt: skip
    return out


def run_training(stack: Stack, rounds: int, console: Console) -> str:
    from services.trainer.algo.config import AlgoConfig
    from services.trainer.round_files import start_run
    from services.trainer.run_state import RunConfig
    from services.trainer.settings import TrainerSettings
    from services.trainer.submit import enqueue, follow

    settings = TrainerSettings(data_dir=stack.settings.data_dir, redis_url=stack.redis_url,
                               policy_url=stack.policy_url, retriever_url=stack.retriever_url)  # fmt: skip
    run_id = f"demo-{int(time.time())}"
    config = RunConfig(run_id=run_id, dataset="hotpotqa", rounds=rounds, questions_per_round=4, max_turns=1,
                       algo=AlgoConfig(algo="bridge", group_size=2, seed=0))  # fmt: skip
    start_run(settings, config)
    enqueue(settings, run_id, 0)
    with console.status(f"training {run_id}: {rounds} BRIDGE rounds on the Celery worker") as status:
        state = follow(settings, run_id, lambda n: status.update(f"training {run_id}: {n}/{rounds} rounds published"))
    if state.status == "failed":
        raise RuntimeError(f"training failed: {state.error}")
    return run_id


def result_tables(questions: list[dict], before: list[dict], after: list[dict]) -> list[Table]:
    """One small table a question (what it read and said, before and after), not one wide table of six columns:
    that one wraps to a word a line in 80 columns, the width rich takes when the output is a CI log or a file."""
    tables = []
    for q, b, a in zip(questions, before, after, strict=True):
        table = Table(title=q["question"], caption=f"gold: {', '.join(q['golden_answers'])}", title_justify="left",
                      caption_justify="left", expand=False)  # fmt: skip
        table.add_column("")
        table.add_column("before", overflow="fold")
        table.add_column("after", overflow="fold")
        table.add_row("read", "; ".join(b["searched"]), "; ".join(a["searched"]))
        table.add_row("said", b["answer"], a["answer"])
        tables.append(table)
    return tables


def run_demo(stack: Stack, rounds: int = 2) -> None:
    console = Console()
    questions = [json.loads(line) for line in (DEMO / "hotpotqa_train.jsonl").open()][:3]
    ensure_demo_corpus(stack)
    before = ask_all(stack, questions)
    run_id = run_training(stack, rounds, console)
    after = ask_all(stack, questions)
    console.print(f"[bold]BRIDGE demo: before and after {rounds} rounds ({run_id})[/bold]")
    for table in result_tables(questions, before, after):
        console.print(table)
    for m in read_metrics(stack.settings.data_dir / "runs", run_id):
        console.print(f"round {m['round']}: training reward {m.get('reward/mean', 0.0):.3f} (EM, mean of its rollouts)")
    console.print(f"policy    {before[0]['policy']} -> {after[0]['policy']}")
    console.print(f"retriever {before[0]['retriever']} -> {after[0]['retriever']}")
    console.print(f"logs and runs under {stack.settings.data_dir}")
