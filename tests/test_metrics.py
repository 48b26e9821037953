import pytest

from squant.eval.metrics import (
    accuracy,
    best_over_golds,
    exact_match,
    f1,
    normalize_answer,
    relative_loss,
    squad_scores,
)


def test_normalization_drops_case_punctuation_articles_and_extra_space():
    assert normalize_answer("The  Eiffel-Tower, in Paris!") == "eiffeltower in paris"
    assert normalize_answer("an apple a day") == "apple day"
    assert normalize_answer("  ") == ""


def test_exact_match_and_f1_edge_cases():
    assert exact_match("the Cat", "cat") == 1.0
    assert exact_match("cats", "cat") == 0.0
    assert f1("red big cat", "the big cat") == pytest.approx(2 * (2 / 3) * 1.0 / (2 / 3 + 1.0))
    assert f1("dog", "cat") == 0.0
    # SQuAD v2 no-answer: empty prediction matches empty gold only
    assert f1("", "") == 1.0
    assert f1("", "cat") == 0.0
    assert f1("cat", "") == 0.0
    assert f1("a the", "an") == 1.0  # both normalize to nothing


def test_multiple_gold_answers_take_the_best():
    golds = ["Denver Broncos", "the Broncos", "Broncos"]
    assert best_over_golds(exact_match, "broncos", golds) == 1.0
    assert best_over_golds(f1, "Denver", golds) == pytest.approx(2 / 3)


def test_squad_scores_handle_unanswerable_and_missing_predictions():
    golds = {"a": ["Paris"], "b": [], "c": ["blue sky"]}
    preds = {"a": "paris", "b": "", "c": "sky"}
    scores = squad_scores(preds, golds)
    assert scores["exact_match"] == pytest.approx(200 / 3)
    assert scores["f1"] == pytest.approx(100 * (1 + 1 + 2 / 3) / 3)
    assert squad_scores({}, {"x": []})["f1"] == 100.0  # no prediction = no answer


def test_accuracy_and_relative_loss():
    assert accuracy([1, 2, 0, 1], [1, 2, 1, 1]) == 75.0
    with pytest.raises(ValueError, match="equal"):
        accuracy([1], [1, 2])
    assert relative_loss(86.0, 86.5) == pytest.approx(100 * 0.5 / 86.5)


def test_paired_accuracy_delta_and_its_interval():
    import torch

    from squant.eval.probe import paired_accuracy_delta

    gold = torch.zeros(400, dtype=torch.long)
    ref = gold.clone()
    same = paired_accuracy_delta(ref, ref, gold)
    assert same == {"accuracy_delta": 0.0, "accuracy_delta_ci95": 0.0}
    worse = ref.clone()
    worse[:40] = 1  # 40 of 400 pairs now wrong: -10 points, far outside the noise
    d = paired_accuracy_delta(worse, ref, gold)
    assert d["accuracy_delta"] == pytest.approx(-10.0)
    # d is 0 or -1 with p = 0.1: std 0.3 -> 1.96 * 0.3 / 20 = 2.94 points
    assert d["accuracy_delta_ci95"] == pytest.approx(2.94, abs=0.02)
    flips = ref.clone()
    flips[:4] = 1  # 4 lost ...
    flips[4:6] = 1
    gold2 = gold.clone()
    gold2[4:6] = 1  # ... and 2 of FP32's mistakes fixed: -0.5 points, inside the noise
    r = paired_accuracy_delta(flips, ref, gold2)
    assert r["accuracy_delta"] == pytest.approx(-0.5)
    assert r["accuracy_delta_ci95"] > abs(r["accuracy_delta"])
    with pytest.raises(ValueError, match="equal shapes"):
        paired_accuracy_delta(ref[:3], ref, gold)


def test_cosine_tail_reports_the_worst_rows():
    import torch

    from squant.eval.probe import cosine_tail, mean_cosine

    a = torch.randn(50, 8)
    b = a.clone()
    b[7] = -a[7]  # one input the model gets completely wrong
    tail = cosine_tail(a, b)
    assert tail["cosine_min"] == pytest.approx(-1.0, abs=1e-5)
    assert mean_cosine(a, b) > 0.95  # the mean hides it
    assert tail["cosine_p1"] < 0.99
