"""Builds the demo corpus and questions that ship in the repo (a user's clone has no ../shared).

HotpotQA only: CC BY-SA 4.0, which allows redistribution with attribution under the same licence.
The first N shared hotpotqa questions and the 10 context passages of each (supporting and distractor).

    python tools/make_demo_data.py ../shared/data 80
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "services" / "demo_data"


def main(data: Path, n: int) -> None:
    questions = [json.loads(line) for line in (data / "qa" / "hotpotqa.jsonl").open()][:n]
    wanted = {d for q in questions for d in q["metadata"]["context_doc_ids"]}
    corpus = [row for line in (data / "corpus" / "hotpotqa.jsonl").open() if (row := json.loads(line))["id"] in wanted]
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / "hotpotqa_questions.jsonl").open("w") as fh:
        fh.writelines(json.dumps(q) + "\n" for q in questions)
    with (OUT / "hotpotqa_corpus.jsonl").open("w") as fh:
        fh.writelines(json.dumps(row) + "\n" for row in corpus)
    print(f"{len(questions)} questions, {len(corpus)} passages -> {OUT}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
