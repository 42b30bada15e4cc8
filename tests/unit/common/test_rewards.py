"""The training rewards: em, f1 and Search-R1's format-aware em (qa_em_format), on hand-made trajectories."""

from __future__ import annotations

import pytest

from services.common.answers import em_format_score, retrieval_contains_answer, reward_for, valid_search_r1_sequence

INFO = "\n\n<information>Doc 1(Title: Paris) Paris is the capital of France.</information>\n\n"
GOOD_ONE_SEARCH = (
    "<think> I need to search. </think>\n<search> capital of France </search>"
    + INFO
    + "<think> found it </think>\n<answer> Paris </answer>"
)
GOOD_NO_SEARCH = "<think> I know this. </think>\n<answer> Paris </answer>"


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        (GOOD_ONE_SEARCH, True),
        (GOOD_NO_SEARCH, True),
        (GOOD_ONE_SEARCH.replace("<answer> Paris </answer>", "<answer> Lyon </answer>"), True),
        ("<answer> Paris </answer>", False),  # no <think> before the answer
        ("<think> x </think>\n<search> q </search>" + INFO + "<answer> Paris </answer>", False),  # no think after info
        ("<think> x </think> stray words <answer> Paris </answer>", False),  # content between tags
        (GOOD_NO_SEARCH + " and more", False),  # content after </answer>
        ("<think> x </think>\n<search> q </search>" + INFO, False),  # never answers
        ("<think> x <think> y </think>\n<answer> Paris </answer>", False),  # unbalanced think
        ("<search> q </search>" + INFO + "<think> x </think><answer> Paris </answer>", False),  # scaffold-style start
    ],
)
def test_valid_sequence_follows_search_r1(text, valid):
    assert valid_search_r1_sequence(text) is valid


def test_em_format_scores_as_qa_em_format():
    gold = ["Paris", "Paris, France"]
    # correct answer: 1 in a well-formed trajectory, 1 - 0.2 in a malformed one
    assert em_format_score(GOOD_ONE_SEARCH, "Paris", gold) == 1.0
    assert em_format_score("<answer> Paris </answer>", "Paris", gold) == pytest.approx(0.8)
    # wrong answer: 0.2 for the format (retrieval_score is 0 in Search-R1's scripts), 0.1 when malformed
    wrong = GOOD_ONE_SEARCH.replace("<answer> Paris </answer>", "<answer> Lyon </answer>")
    assert em_format_score(wrong, "Lyon", gold) == pytest.approx(0.2)
    assert em_format_score("<answer> Lyon </answer>", "Lyon", gold) == pytest.approx(0.1)
    # no answer at all and malformed: nothing
    assert em_format_score("<think> hmm </think>", None, gold) == 0.0
    # normalisation as EM: case, punctuation, articles
    assert em_format_score(GOOD_NO_SEARCH.replace("Paris", "the PARIS."), "the PARIS.", gold) == 1.0


def test_retrieval_contains_answer_reads_information_blocks_only():
    assert retrieval_contains_answer(GOOD_ONE_SEARCH, ["paris"])
    assert not retrieval_contains_answer(GOOD_NO_SEARCH, ["paris"])  # the answer tag is not evidence


def test_reward_kinds():
    gold = ["Barack Obama"]
    text = "<think> x </think>\n<answer> Obama </answer>"
    assert reward_for("em", text, "Obama", gold) == 0.0
    assert reward_for("f1", text, "Obama", gold) == pytest.approx(2 / 3)
    assert reward_for("em-format", text, "Obama", gold) == pytest.approx(0.2)
    assert reward_for("em-format", text.replace("Obama", "Barack Obama"), "Barack Obama", gold) == 1.0
    with pytest.raises(ValueError):
        reward_for("bleu", text, "Obama", gold)
