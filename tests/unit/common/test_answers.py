import pytest

from services.common.answers import exact_match, extract_answer, f1_score, normalize_answer


def test_normalize_answer_follows_squad():
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert normalize_answer("theatre") == "theatre"  # articles only as whole words


def test_extract_answer_takes_the_last_tag():
    text = "<think>hmm</think><answer>Paris</answer> wait <answer> Lyon </answer>"
    assert extract_answer(text) == "Lyon"
    assert extract_answer("no tags here") is None
    assert extract_answer("<answer>multi\nline</answer>") == "multi\nline"


def test_prompt_example_answer_is_not_scored():
    prompt = "For example, <answer> Beijing </answer>. Question: capital of France?"
    generated = "<think>I know this.</think>"
    # Only the generated part is scored: the prompt's example must not count as the model's answer.
    assert extract_answer(generated) is None
    assert exact_match(extract_answer(generated), ["Beijing"]) == 0.0
    assert extract_answer(prompt + generated) == "Beijing"  # why callers must never pass the prompt


def test_exact_match_against_any_gold():
    assert exact_match("the Animorphs", ["Animorphs", "x"]) == 1.0
    assert exact_match("Animorph", ["Animorphs"]) == 0.0
    assert exact_match(None, ["a"]) == 0.0


def test_f1_by_hand():
    # pred tokens {barack, obama}, gold {obama}: precision 1/2, recall 1 -> 2/3
    assert f1_score("Barack Obama", ["Obama"]) == pytest.approx(2 / 3)
    # best over golds
    assert f1_score("Barack Obama", ["Michelle", "Barack Obama"]) == 1.0
    assert f1_score("yes", ["no"]) == 0.0
    # FlashRAG's rule: against a yes/no gold, only the exact word scores.
    assert f1_score("no answer here", ["no"]) == 0.0
    # precision 1/3, recall 1 -> 0.5
    assert f1_score("new york city", ["York"]) == pytest.approx(0.5)
    assert f1_score("", ["x"]) == 0.0
