"""Tokenization both the trainer (Q_theta's scored answers) and the evaluation (log pi(y* | x)) rely on."""

from __future__ import annotations


def split_ids(tokenizer, context: str, answer: str) -> tuple[list[int], list[int]]:
    """Token ids of `context + answer` tokenized as ONE string, split where the answer starts, so that
    `context_ids + answer_ids == ids(context + answer)`: the tokens the policy writes, not those of the answer
    tokenized alone (ByteLevel gives `Ġ` + `Paris` for a leading-space answer alone, `ĠParis` in the whole).
    A token that straddles the boundary goes to the answer."""
    encoded = tokenizer(context + answer, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoded["input_ids"], encoded["offset_mapping"]
    cut = next((n for n, (_, end) in enumerate(offsets) if end > len(context)), len(ids))
    return list(ids[:cut]), list(ids[cut:])
