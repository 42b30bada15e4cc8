"""Answer extraction and scoring exactly as Search-R1 / FlashRAG score them (SQuAD normalisation)."""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_ARTICLES_RE = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower case, drop punctuation, drop articles, fold white space (SQuAD's `normalize_answer`)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCT)
    text = _ARTICLES_RE.sub(" ", text)
    return " ".join(text.split())


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
