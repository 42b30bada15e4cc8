"""Builds the demo corpus and questions that ship in the repo (a user's clone has no ../shared).

HotpotQA only: CC BY-SA 4.0, which allows redistribution with attribution under the same licence. The questions
come from the training pool (after the evaluation split, services/data/split.py) and leave out those any shipped
warm-start adapter trained on (every stage of each), so the demo trains on questions the policy has not seen. The
corpus is the 10 context passages (supporting and distractor) of each, and of the first `corpus_questions` pool
questions besides, so that retrieval has distractors from other questions as well.

    python -m tools.make_demo_data ../shared/data 80 80
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from services.data.split import training_rows
from services.modeling.shipped import SHIPPED_ADAPTERS
from services.trainer.warmstart.adapter import shipped_trained_ids

OUT = Path(__file__).resolve().parents[1] / "services" / "demo_data"


def main(data: Path, n: int, corpus_questions: int) -> None:
    seen = shipped_trained_ids(list(SHIPPED_ADAPTERS)).get("hotpotqa", set())
    pool = [row for _, row in training_rows(data / "qa", "hotpotqa")]
    questions = [row for row in pool if row["id"] not in seen][:n]
    wanted = {d for q in questions + pool[:corpus_questions] for d in q["metadata"]["context_doc_ids"]}
    corpus = [row for line in (data / "corpus" / "hotpotqa.jsonl").open() if (row := json.loads(line))["id"] in wanted]
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "hotpotqa_train.jsonl").open("w") as fh:
        fh.writelines(json.dumps(q) + "\n" for q in questions)
    with (OUT / "hotpotqa_corpus.jsonl").open("w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in corpus)
    print(f"{len(questions)} questions, {len(corpus)} passages -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 0)
