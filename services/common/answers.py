"""Answer extraction and scoring exactly as Search-R1 / FlashRAG score them (SQuAD normalisation)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable, Sequence

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop articles, fold white space (SQuAD's `normalize_answer`)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


def contains_gold(golden_answers: Sequence[str], text: str) -> bool:
    """Whether `text` writes a gold alias: normalised, on word boundaries (an answer-bearing passage)."""
    body = f" {normalize_answer(text)} "
    return any((norm := normalize_answer(g)) and f" {norm} " in body for g in golden_answers)


def label_answer(golden_answers: Sequence[str]) -> bool:
    """A yes/no/maybe answer: a label no passage writes, though a passage may still make it likelier."""
    return {normalize_answer(g) for g in golden_answers} <= {"yes", "no", "maybe"}


def extract_answer(generated: str) -> str | None:
    """The LAST `<answer>…</answer>` of the generated text, or None.

    Pass only what the model generated: the prompt's own example answer must never be scored.
    """
    matches = _ANSWER_RE.findall(generated)
    return matches[-1].strip() if matches else None


def exact_match(prediction: str | None, golden_answers: Iterable[str]) -> float:
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golden_answers))


def _f1_single(prediction: str, gold: str) -> float:
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    # FlashRAG: a yes/no/noanswer prediction only scores when it is exactly right.
    special = {"yes", "no", "noanswer"}
    if (pred_norm in special or gold_norm in special) and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str | None, golden_answers: Iterable[str]) -> float:
    if prediction is None:
        return 0.0
    return max((_f1_single(prediction, g) for g in golden_answers), default=0.0)


_LETTER_RE = re.compile(r"^\(?([A-Za-z])\)?(?:[.):]\s*(.*))?$", re.DOTALL)


def choice_match(prediction: str | None, letter: str, option: str) -> float:
    """Multiple choice: right when the answer names the gold letter ("B", "(b)", "B. text") or is the gold
    option's text. The letter is read before SQuAD normalisation, which would drop "A" as an article."""
    if prediction is None:
        return 0.0
    text = prediction.strip()
    named = _LETTER_RE.match(text)
    if named:
        return float(named.group(1).upper() == letter.upper())
    return float(normalize_answer(text) == normalize_answer(option) != "")


def cover_match(generated: str | None, golden_answers: Iterable[str]) -> float:
    """FlashRAG's `acc`: some normalised gold answer occurs inside the normalised text, on word boundaries.
    A lenient score for models that know the answer but do not close an <answer> tag."""
    if not generated:
        return 0.0
    text = f" {normalize_answer(generated)} "
    return float(any((gold := normalize_answer(g)) and f" {gold} " in text for g in golden_answers))


# ------------------------------------------------------------------------------------------------- rewards
# Search-R1's format-aware reward (verl/utils/reward_score/qa_em_format.py, its v0.3 GRPO/PPO scripts'
# settings): a correct answer in a well-formed trajectory scores 1, in a malformed one 1 - 0.2; a wrong or missing
# answer scores 0.2 in a well-formed trajectory (0.2 + retrieval_score when a gold answer appears in an
# <information> block; retrieval_score is 0 there), 0.1 for a malformed one with an answer, and 0 without one.
STRUCTURE_FORMAT_SCORE = 0.2
FINAL_FORMAT_SCORE = 0.1
RETRIEVAL_SCORE = 0.0
_TAGS = ("think", "search", "information", "answer")
_TAG_SPLIT_RE = re.compile(r"(</?(?:think|search|information|answer)>)")
_INFORMATION_RE = re.compile(r"<information>(.*?)</information>", re.DOTALL)
_TRANSITIONS = {
    ("<think>", "start"): "in_think",
    ("<think>", "information"): "in_think",
    ("</think>", "in_think"): "after_think",
    ("<search>", "after_think"): "in_search",
    ("</search>", "in_search"): "after_search",
    ("<information>", "after_search"): "in_information",
    ("</information>", "in_information"): "information",
    ("<answer>", "after_think"): "in_answer",
    ("</answer>", "in_answer"): "end",
}


def valid_search_r1_sequence(text: str) -> bool:
    """Search-R1's `is_valid_sequence` on what follows the assistant marker (generated turns and the appended
    <information> blocks): balanced tags, then exactly think -> (search -> information -> think)* -> answer,
    with only white space between tags and nothing after </answer>."""
    for tag in _TAGS:
        if len(re.findall(f"<{tag}>", text)) != len(re.findall(f"</{tag}>", text)):
            return False
    state = "start"
    for part in _TAG_SPLIT_RE.split(text):
        if not part.strip():
            continue
        if _TAG_SPLIT_RE.fullmatch(part):
            state = _TRANSITIONS.get((part, state), "")
            if not state:
                return False
        elif state not in ("in_think", "in_search", "in_information", "in_answer"):
            return False  # content between tags, or after </answer>
    return state == "end"


def retrieval_contains_answer(text: str, golden_answers: Iterable[str]) -> bool:
    """Search-R1's `is_retrieval_correct`: a normalised gold answer is a substring of some <information> block."""
    blocks = [normalize_answer(b) for b in _INFORMATION_RE.findall(text)]
    return any(normalize_answer(g) in block for block in blocks for g in golden_answers)


def em_format_score(text: str, prediction: str | None, golden_answers: list[str]) -> float:
    """Search-R1's `compute_score_em` with its scripts' weights (structure 0.2, final format 0.1, retrieval 0).

    `text`: the trajectory after the prompt (generated turns + observations); `prediction`: its last <answer>
    (Search-R1 scores the whole sequence and so skips the prompt's example answer; we pass only what follows the
    prompt, so the last answer is the agent's own)."""
    valid = valid_search_r1_sequence(text)
    retrieved = valid and retrieval_contains_answer(text, golden_answers)
    if prediction is not None and exact_match(prediction, golden_answers):
        return 1.0 if valid else 1.0 - STRUCTURE_FORMAT_SCORE
    if valid:
        return STRUCTURE_FORMAT_SCORE + (RETRIEVAL_SCORE if retrieved else 0.0)
    return FINAL_FORMAT_SCORE if prediction is not None else 0.0


def trajectory_text(record, tokenizer) -> str:
    """What followed the prompt of a `TrajectoryRecord`, as text: each turn's generated tokens then its
    observation, special tokens (EOS) dropped, as the scorer reads it."""
    pieces = []
    for turn in record.turns:
        pieces.append(tokenizer.decode(turn.generated_ids, skip_special_tokens=True))
        pieces.append(tokenizer.decode(turn.observation_ids, skip_special_tokens=True))
    return "".join(pieces)


def reward_for(kind: str, text: str, prediction: str | None, golden_answers: list[str]) -> float:
    """The training reward of a trajectory: `em` (the paper's), `f1` (ReSearch / R1-Searcher) or `em-format`."""
    if kind == "em":
        return exact_match(prediction, golden_answers)
    if kind == "f1":
        return f1_score(prediction, golden_answers)
    if kind == "em-format":
        return em_format_score(text, prediction, golden_answers)
    raise ValueError(f"unknown reward kind {kind!r}")
