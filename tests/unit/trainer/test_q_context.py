"""Q_theta scores y* where the policy's answer starts: its context is the policy's own prefix (the prompt, its search
turn with its think, the candidate as an <information> block, and what it writes before `<answer>`), for the warm
start's trajectory format, whatever thoughts that format holds (issue 39, part 1)."""

from __future__ import annotations

from services.common.schemas.policy import SearchStep
from services.modeling.prompt import format_information
from services.trainer.algo.batch import answer_prefix, build_batch
from services.trainer.algo.config import AlgoConfig
from services.trainer.warmstart.examples import PoolItem, Shown, build_record

DOCS = {
    "g1": ("Night Ferry", "Night Ferry is an orchestral piece by Anna Clyne."),
    "d1": ("Ferry", "A ferry carries passengers across water."),
}


def warm_start_record(tokenizer, group_index: int):
    item = PoolItem(id="q1", dataset="nq", position=150, question="Who composed Night Ferry?",
                    golden_answers=["Anna Clyne"], supporting_doc_ids=["g1"])  # fmt: skip
    shown = Shown("Who composed Night Ferry?", (("g1", *DOCS["g1"]),))
    record = build_record(tokenizer, item, [shown], "Anna Clyne")
    record.turns[0].search = SearchStep(
        turn=0, query=shown.query, candidates=[{"id": "g1", "score": 0.9}, {"id": "d1", "score": 0.5}],
        chosen_ids=["g1"], logprob=-0.1, mode="sample", temperature=0.05, retriever_version="base",
    )  # fmt: skip
    return record.model_copy(update={"group_index": group_index, "reward": float(group_index)})


def test_the_scored_context_is_the_policys_own_prefix(tokenizer):
    records = [warm_start_record(tokenizer, g) for g in range(2)]
    cfg = AlgoConfig(algo="retriever-only", retriever_objective="target", group_size=2, q_steps=1, q_candidates=2)
    batch = build_batch(records, cfg, tokenizer, DOCS)
    [q] = batch.q_samples
    record = batch.records[batch.searches[q.search].trajectory]
    search_turn, answer_turn = record.turns
    assert "<think>" in search_turn.text and answer_prefix(record).startswith("<think>")  # the warm start thinks
    for c, context_ids in zip(q.candidates, q.context_ids, strict=True):
        doc = batch.searches[q.search].candidate_ids[c]
        observation = format_information([DOCS[doc]])
        expected = record.prompt + search_turn.text + observation + answer_prefix(record)
        assert tokenizer.decode(context_ids) == expected
    # with the shown passage as the candidate, the context is exactly what the policy had when it answered
    shown = q.context_ids[[batch.searches[q.search].candidate_ids[c] for c in q.candidates].index("g1")]
    written = tokenizer.decode(record.token_ids)
    assert written.startswith(tokenizer.decode(shown)) and written[len(tokenizer.decode(shown)) :].startswith(" Anna")
