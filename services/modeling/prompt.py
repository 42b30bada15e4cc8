"""Search-R1's prompt, tags and <information> formatting (search_r1/llm_agent/generation.py)."""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)
# The direct-answer baseline's instruction: the same answer format, no search tool to mention.
DIRECT_INSTRUCTION = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first. Then provide the "
    "answer inside <answer> and </answer>, without detailed illustrations. For example, <answer> Beijing "
    "</answer>. Question: {question}\n"
)
SEARCH_STOP = "</search>"
ANSWER_STOP = "</answer>"
_SEARCH_RE = re.compile(r"<search>(.*?)</search>", re.DOTALL)


def build_prompt(tokenizer: PreTrainedTokenizerBase, question: str, search: bool = True) -> str:
    """Search-R1's prompt; `search=False` gives the direct-answer baseline's, which offers no tool."""
    content = (INSTRUCTION if search else DIRECT_INSTRUCTION).format(question=question.strip())
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
    return content


def parse_search(generated: str) -> str | None:
    """The query of a turn that ended on </search> (the last one, as Search-R1 takes it)."""
    if not generated.rstrip().endswith(SEARCH_STOP):
        return None
    matches = _SEARCH_RE.findall(generated)
    query = matches[-1].strip() if matches else ""
    return query or None


def format_information(docs: list[tuple[str, str]]) -> str:
    """Search-R1's `_passages2string`, wrapped the way its rollout appends it."""
    body = "".join(f"Doc {i + 1}(Title: {title}) {text}\n" for i, (title, text) in enumerate(docs))
    return f"\n\n<information>{body.strip()}</information>\n\n"
